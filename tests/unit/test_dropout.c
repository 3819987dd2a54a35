// test_dropout.c — the dropout op and masks (ops.h dropout_apply, model/dropout.h): the rate
// of dropped elements is about p, kept values are x / (1 − p) exactly, the mask depends only
// on (stream, global row, column) — a row seen through row_index or row_first, in place or
// not, gets the same bits — and outside training, or at p = 0, nothing is dropped.
// (cpu == cuda bit for bit: tests/gpu/check_elementwise.c, tolerance 0.)
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/dropout.h"
#include "ops/ops.h"
#include "testlib.h"

enum { ROWS = 300, COLS = 200 };

static DropoutShape shape_of(double p, uint64_t stream) {
    DropoutShape s = {.mask = {.stream = stream, .threshold = (uint32_t)floor(p * 4294967296.0),
                               .scale = (real)(1 / (1 - p))},
                      .rows = ROWS, .cols = COLS, .row_first = 1000};
    return s;
}

static void test_rate_and_scale(void) {
    const double ps[] = {0.1, 0.5, 0.9};
    real *x = malloc(sizeof(real) * ROWS * COLS), *y = malloc(sizeof(real) * ROWS * COLS);
    for (int i = 0; i < ROWS * COLS; i++) x[i] = (real)(1 + i % 7);
    for (int k = 0; k < 3; k++) {
        DropoutShape s = shape_of(ps[k], 42);
        dropout_apply(y, x, &s);
        long dropped = 0, wrong = 0;
        for (int i = 0; i < ROWS * COLS; i++) {
            if (y[i] == 0) dropped++;
            else wrong += y[i] != x[i] * s.mask.scale;
        }
        double rate = (double)dropped / (ROWS * COLS), sd = sqrt(ps[k] * (1 - ps[k]) / (ROWS * COLS));
        CHECK(fabs(rate - ps[k]) < 5 * sd, "p %g: dropped %.4f", ps[k], rate);
        CHECK(wrong == 0, "p %g: %ld kept values not x/(1-p)", ps[k], wrong);
    }
    free(x), free(y);
}

// The mask is a function of the coordinates: row_index naming the same rows gives the same
// bits, in place too; another stream gives another mask; the rows of one column are independent.
static void test_mask_is_a_function(void) {
    real *x = malloc(sizeof(real) * ROWS * COLS), *a = malloc(sizeof(real) * ROWS * COLS);
    real *b = malloc(sizeof(real) * ROWS * COLS), *c = malloc(sizeof(real) * ROWS * COLS);
    int32_t *index = malloc(sizeof(int32_t) * ROWS);
    for (int i = 0; i < ROWS * COLS; i++) x[i] = (real)(i % 11) - 5;
    for (int r = 0; r < ROWS; r++) index[r] = 1000 + r;
    DropoutShape s = shape_of(0.3, 7), by_index = s, other = shape_of(0.3, 8);
    by_index.row_index = index;
    dropout_apply(a, x, &s);
    dropout_apply(b, x, &by_index);
    memcpy(c, x, sizeof(real) * ROWS * COLS);
    dropout_apply(c, c, &s);
    CHECK(memcmp(a, b, sizeof(real) * ROWS * COLS) == 0, "row_index and row_first differ");
    CHECK(memcmp(a, c, sizeof(real) * ROWS * COLS) == 0, "in place differs");
    dropout_apply(b, x, &other);
    CHECK(memcmp(a, b, sizeof(real) * ROWS * COLS) != 0, "another stream, the same mask");
    // a shifted row window: row r of a window starting at 1001 is row r + 1 of the first
    s.row_first = 1001;
    s.rows = ROWS - 1;
    dropout_apply(c, x + COLS, &s);
    CHECK(memcmp(a + COLS, c, sizeof(real) * (ROWS - 1) * COLS) == 0, "the mask depends on the window");
    free(x), free(a), free(b), free(c), free(index);
}

// The model's masks: none outside training or at p = 0; distinct per layer and site; the same
// for the same micro-batch.
static void test_model_masks(void) {
    Batch train = {.training = 1, .noise_seed = 5}, eval = {.training = 0, .noise_seed = 5};
    CHECK(dropout_mask(&eval, 0, DROPOUT_FFN_OUT, 0.5).threshold == 0, "dropout in evaluation");
    CHECK(dropout_mask(&train, 0, DROPOUT_FFN_OUT, 0).threshold == 0, "dropout at p = 0");
    DropoutMask m = dropout_mask(&train, 1, DROPOUT_FFN_OUT, 0.5);
    CHECK(m.threshold == 2147483648u && m.scale == 2, "p 0.5: threshold %u scale %g", m.threshold, (double)m.scale);
    CHECK(m.stream == dropout_mask(&train, 1, DROPOUT_FFN_OUT, 0.5).stream, "not reproducible");
    CHECK(m.stream != dropout_mask(&train, 2, DROPOUT_FFN_OUT, 0.5).stream, "layers share a stream");
    CHECK(m.stream != dropout_mask(&train, 1, DROPOUT_ATTENTION_OUT, 0.5).stream, "sites share a stream");
}

int main(void) {
    RUN(test_rate_and_scale);
    RUN(test_mask_is_a_function);
    RUN(test_model_masks);
    TESTS_DONE();
}

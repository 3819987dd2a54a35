// test_tp_mappings.c — tensor parallelism on 2+ processes, run by tests/cli/test_mpi_tp_ops.sh
// under mpirun -np 2, 3 and 4: the block mappings (parallel/tp_mappings.h) and the
// vocab-parallel embedding and cross-entropy (model/vocab_parallel.h).
//
// Every rank makes the same full-size data and computes the unsharded result itself, then
// checks its own shard of the tensor-parallel computation against that result:
//   tp_block_*       a column-parallel linear then a row-parallel one, y = (x·A_rᵀ)·B_rᵀ
//                    summed over TP, against y = (x·Aᵀ)·Bᵀ; backward dx, dA_r, dB_r against
//                    the unsharded slices; without SP (separate buffers and in place) and with
//   vocab_embedding_*  forward and backward (+= into the table gradient), with and without SP
//   vocab_cross_entropy_*  losses and lse (the same bits on every rank), dlogits of the slice
//   vocab_parallel_single_rank  a group of one: the ops' bits exactly
// The padded vocabulary (V_PAD rows, divisible by 2, 3 and 4) holds every rank's range of
// used ids. Rank 0 prints "ok <check>_np<P>" when no rank failed; a failing rank prints
// "FAIL <check>_np<P>: [rank r] ...".
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "model/vocab_parallel.h"
#include "ops/ops.h"

enum {
    TOKENS = 48,      // N, divisible by every group size tested
    HIDDEN = 16,      // H
    FFN = 24,         // F of the block, divisible by every group size
    VOCAB = 21,       // ids in use
    V_PAD = 24,       // padded vocabulary, divisible by every group size
    ID_STRIDE = 5,    // token n is (n · 5) mod VOCAB: every id, some repeated (5 and 21 coprime)
    ZERO_WEIGHT_EVERY = 7,  // every 7th token has loss weight 0
};
static const double REL_TOL = 1e-5;  // largest error over the largest reference value
// One large logit per row, somewhere in the vocabulary: e^100 overflows float, so shifting
// by anything but the row's maximum over the whole vocabulary shows.
static const double LOGIT_SPIKE = 100;

#include "mpi_check.h"

// ---- data every rank makes alike -----------------------------------------------------------


// uniform in [−1, 1], the same on every rank
static real value(size_t i, int salt) {
    uint64_t h = mix64(((uint64_t)salt << 48) ^ i);
    return (real)(((double)(h % 20001) - 10000.0) / 10000.0);
}

static real *random_array(size_t n, int salt) {
    real *x = mt_malloc((n + 1) * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = value(i, salt);
    return x;
}

static real *zeros(size_t n) { return mt_calloc(n + 1, sizeof(real)); }

static real *copy_of(const real *x, size_t n) {
    real *y = mt_malloc((n + 1) * sizeof(real));
    memcpy(y, x, n * sizeof(real));
    return y;
}

static int32_t *token_ids(void) {
    int32_t *t = mt_malloc(TOKENS * sizeof(int32_t));
    for (int n = 0; n < TOKENS; n++) t[n] = n * ID_STRIDE % VOCAB;
    return t;
}

// cols (rows, count) = columns [first, first + count) of x (rows, width)
static real *columns(const real *x, int rows, int width, int first, int count) {
    real *c = mt_malloc(((size_t)rows * count + 1) * sizeof(real));
    for (int r = 0; r < rows; r++) memcpy(c + (size_t)r * count, x + (size_t)r * width + first, count * sizeof(real));
    return c;
}

// ---- comparisons ------------------------------------------------------------------------------

// got (n) against want (n): max |got − want| ≤ REL_TOL · max |want|
static void expect_close(const char *what, const real *got, const real *want, size_t n) {
    double scale = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (!(err <= worst)) {
            worst = err;
            at = i;
        }
    }
    expect(worst <= REL_TOL * scale, "%s: element %zu is %.9g, the unsharded %.9g (largest |value| %.3g)", what, at,
           n ? (double)got[at] : 0.0, n ? (double)want[at] : 0.0, scale);
}

static void expect_same_bits(const char *what, const real *got, const real *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(real))) {
            expect(0, "%s: element %zu is %.9g, the op's %.9g", what, i, (double)got[i], (double)want[i]);
            return;
        }
}

// x (n) has the same bits on every rank of the world
static void expect_same_on_every_rank(const char *what, const real *x, size_t n) {
    real *every = mt_malloc(((size_t)world.size * n + 1) * sizeof(real));
    comm_allgather(&world, x, every, n);
    for (int q = 0; q < world.size; q++)
        if (memcmp(every + (size_t)q * n, every, n * sizeof(real))) {
            expect(0, "%s differs between ranks 0 and %d", what, q);
            break;
        }
    free(every);
}

// The token rows a rank holds outside the tensor-parallel block: [first, first + count).
typedef struct {
    int first, count;
} RowRange;

static RowRange local_rows(int sequence_parallel) {
    if (!sequence_parallel) return (RowRange){0, TOKENS};
    int count = TOKENS / world.size;
    return (RowRange){world.rank * count, count};
}

static const char *named(const char *base, int sequence_parallel, int in_place) {
    static char name[96];
    snprintf(name, sizeof(name), "%s%s", base, sequence_parallel ? "_sp" : in_place ? "_in_place" : "");
    return name;
}

// ---- the tensor-parallel block ------------------------------------------------------------------

// The unsharded block and its gradients: h = x·Aᵀ (N,F), y = h·Bᵀ (N,H); dy (N,H) ->
// dx (N,H), dA (F,H), dB (H,F).
typedef struct {
    real *x, *A, *B, *dy;          // inputs
    real *h, *y, *dx, *dA, *dB;    // results
} Block;

static Block block_reference(void) {
    Block b = {.x = random_array((size_t)TOKENS * HIDDEN, 1), .A = random_array((size_t)FFN * HIDDEN, 2),
               .B = random_array((size_t)HIDDEN * FFN, 3), .dy = random_array((size_t)TOKENS * HIDDEN, 4)};
    b.h = zeros((size_t)TOKENS * FFN);
    b.y = zeros((size_t)TOKENS * HIDDEN);
    b.dx = zeros((size_t)TOKENS * HIDDEN);
    b.dA = zeros((size_t)FFN * HIDDEN);
    b.dB = zeros((size_t)HIDDEN * FFN);
    real *dh = zeros((size_t)TOKENS * FFN);
    linear_forward(b.h, b.x, b.A, TOKENS, HIDDEN, FFN);
    linear_forward(b.y, b.h, b.B, TOKENS, FFN, HIDDEN);
    linear_backward(dh, b.dB, b.dy, b.h, b.B, TOKENS, FFN, HIDDEN);
    linear_backward(b.dx, b.dA, dh, b.x, b.A, TOKENS, HIDDEN, FFN);
    free(dh);
    return b;
}

static void block_free(Block *b) {
    real *all[] = {b->x, b->A, b->B, b->dy, b->h, b->y, b->dx, b->dA, b->dB};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
}

// This rank's block: A_r = rows [r·F/P, +F/P) of A (column-parallel), B_r = the same columns
// of B (row-parallel). in_place (without SP): every mapping's output is its input buffer.
static void check_tp_block(int sequence_parallel, int in_place) {
    Block ref = block_reference();
    TpRegion region = {.tp = &world, .sequence_parallel = sequence_parallel};
    RowRange rows = local_rows(sequence_parallel);
    int f = FFN / world.size, f_first = world.rank * f;
    size_t local = (size_t)rows.count * HIDDEN, full = (size_t)TOKENS * HIDDEN;
    const real *A_r = ref.A + (size_t)f_first * HIDDEN;
    real *B_r = columns(ref.B, HIDDEN, FFN, f_first, f);
    real *x = copy_of(ref.x + (size_t)rows.first * HIDDEN, local);
    real *x_full = in_place ? x : zeros(full), *h = zeros((size_t)TOKENS * f);
    real *y_partial = zeros(full), *y = in_place ? y_partial : zeros(local);

    begin(named("tp_block_forward", sequence_parallel, in_place));
    tp_enter_forward(&region, x, x_full, TOKENS, HIDDEN);
    expect_close("entered x", x_full, ref.x, full);
    linear_forward(h, x_full, A_r, TOKENS, HIDDEN, f);
    linear_forward(y_partial, h, B_r, TOKENS, f, HIDDEN);
    tp_exit_forward(&region, y_partial, y, TOKENS, HIDDEN);
    expect_close("y", y, ref.y + (size_t)rows.first * HIDDEN, local);
    if (!sequence_parallel) expect_same_on_every_rank("y", y, local);
    end();

    begin(named("tp_block_backward", sequence_parallel, in_place));
    real *dy = copy_of(ref.dy + (size_t)rows.first * HIDDEN, local);
    real *dy_full = in_place ? dy : zeros(full), *dh = zeros((size_t)TOKENS * f), *dx_full = zeros(full);
    real *dx = in_place ? dx_full : zeros(local), *dA_r = zeros((size_t)f * HIDDEN), *dB_r = zeros((size_t)HIDDEN * f);
    tp_exit_backward(&region, dy, dy_full, TOKENS, HIDDEN);
    linear_backward(dh, dB_r, dy_full, h, B_r, TOKENS, f, HIDDEN);
    linear_backward(dx_full, dA_r, dh, x_full, A_r, TOKENS, HIDDEN, f);
    tp_enter_backward(&region, dx_full, dx, TOKENS, HIDDEN);
    expect_close("dx", dx, ref.dx + (size_t)rows.first * HIDDEN, local);
    if (!sequence_parallel) expect_same_on_every_rank("dx", dx, local);
    expect_close("dA_r", dA_r, ref.dA + (size_t)f_first * HIDDEN, (size_t)f * HIDDEN);
    real *dB_cols = columns(ref.dB, HIDDEN, FFN, f_first, f);
    expect_close("dB_r", dB_r, dB_cols, (size_t)HIDDEN * f);
    end();

    real *mine[] = {B_r, x, h, y_partial, dy, dh, dx_full, dA_r, dB_r, dB_cols};
    for (size_t i = 0; i < sizeof(mine) / sizeof(mine[0]); i++) free(mine[i]);
    if (!in_place) {
        free(x_full);
        free(y);
        free(dy_full);
        free(dx);
    }
    block_free(&ref);
}

// ---- vocab-parallel embedding and cross-entropy -------------------------------------------------

static VocabSlice world_slice(int sequence_parallel) {
    int rows = V_PAD / world.size;
    return (VocabSlice){.region = {.tp = &world, .sequence_parallel = sequence_parallel},
                        .vocab_first = world.rank * rows,
                        .vocab = rows};
}

// The vocab-parallel scratch for TOKENS tokens, in a buffer plan of its own (the model puts it
// in its activations' plan).
static BufferPlan vocab_scratch_of(VocabScratch *w) {
    BufferPlan bp;
    buffer_plan_init(&bp);
    vocab_scratch_plan(&bp, w, TOKENS, HIDDEN);
    buffer_plan_allocate(&bp);
    return bp;
}

static void check_vocab_embedding(int sequence_parallel) {
    VocabSlice s = world_slice(sequence_parallel);
    RowRange rows = local_rows(sequence_parallel);
    size_t local = (size_t)rows.count * HIDDEN, slice = (size_t)s.vocab * HIDDEN, first = (size_t)s.vocab_first * HIDDEN;
    int32_t *tokens = token_ids();
    real *table = random_array((size_t)V_PAD * HIDDEN, 10), *want = zeros((size_t)TOKENS * HIDDEN);
    real *out = zeros(local);
    VocabScratch w;
    BufferPlan scratch = vocab_scratch_of(&w);

    begin(named("vocab_embedding_forward", sequence_parallel, 0));
    embedding_forward(want, tokens, table, TOKENS, HIDDEN);
    vocab_embedding_forward(&s, &w, out, tokens, table + first, TOKENS, HIDDEN);
    expect_close("embedding rows", out, want + (size_t)rows.first * HIDDEN, local);
    end();

    begin(named("vocab_embedding_backward", sequence_parallel, 0));
    real *d_out = random_array((size_t)TOKENS * HIDDEN, 11);
    real *dtable_want = random_array((size_t)V_PAD * HIDDEN, 12);  // gradients accumulate (+=)
    real *dtable = copy_of(dtable_want + first, slice);
    embedding_backward(dtable_want, d_out, tokens, TOKENS, HIDDEN);
    vocab_embedding_backward(&s, &w, dtable, d_out + (size_t)rows.first * HIDDEN, tokens, TOKENS, HIDDEN);
    expect_close("table gradient rows", dtable, dtable_want + first, slice);
    end();

    buffer_plan_free(&scratch);
    real *mine[] = {table, want, out, d_out, dtable_want, dtable};
    for (size_t i = 0; i < sizeof(mine) / sizeof(mine[0]); i++) free(mine[i]);
    free(tokens);
}

// logits (N, V_PAD) of mixed size, each row with one large logit (at a column that moves
// across the ranks' ranges, so the row maximum comes from every rank in turn)
static real *spiky_logits(void) {
    real *logits = random_array((size_t)TOKENS * V_PAD, 20);
    for (int n = 0; n < TOKENS; n++) logits[(size_t)n * V_PAD + n * (V_PAD / 4 + 1) % V_PAD] += (real)LOGIT_SPIKE;
    return logits;
}

static real *loss_weights(void) {
    real *w = mt_malloc(TOKENS * sizeof(real));
    for (int n = 0; n < TOKENS; n++) w[n] = n % ZERO_WEIGHT_EVERY ? (real)(0.5 + 0.5 * value(n, 21)) : 0;
    return w;
}

static void check_vocab_cross_entropy(void) {
    VocabSlice s = world_slice(0);
    int32_t *targets = token_ids();
    real *logits = spiky_logits(), *weight = loss_weights();
    real *want_loss = zeros(TOKENS), *want_lse = zeros(TOKENS), *loss = zeros(TOKENS), *lse = zeros(TOKENS);
    real *mine = columns(logits, TOKENS, V_PAD, s.vocab_first, s.vocab);

    begin("vocab_cross_entropy_forward");
    cross_entropy_forward(want_loss, want_lse, logits, targets, TOKENS, V_PAD);
    vocab_cross_entropy_forward(&s, loss, lse, mine, targets, TOKENS);
    expect_close("losses", loss, want_loss, TOKENS);
    expect_close("lse", lse, want_lse, TOKENS);
    expect_same_on_every_rank("losses", loss, TOKENS);
    expect_same_on_every_rank("lse", lse, TOKENS);
    end();

    begin("vocab_cross_entropy_backward");
    real *want_d = zeros((size_t)TOKENS * V_PAD), *d = random_array((size_t)TOKENS * s.vocab, 22);  // overwritten
    VocabScratch w;
    BufferPlan scratch = vocab_scratch_of(&w);
    cross_entropy_backward(want_d, logits, want_lse, targets, weight, TOKENS, V_PAD);
    vocab_cross_entropy_backward(&s, &w, d, mine, lse, targets, weight, TOKENS);
    real *want_slice = columns(want_d, TOKENS, V_PAD, s.vocab_first, s.vocab);
    expect_close("dlogits slice", d, want_slice, (size_t)TOKENS * s.vocab);
    end();

    buffer_plan_free(&scratch);
    real *all[] = {logits, weight, want_loss, want_lse, loss, lse, mine, want_d, d, want_slice};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
    free(targets);
}

// A TP group of one: the single-process ops, bit for bit.
static void check_single_rank(void) {
    begin("vocab_parallel_single_rank");
    Comm self = comm_self("tp");
    VocabSlice s = {.region = {.tp = &self, .sequence_parallel = 1}, .vocab_first = 0, .vocab = V_PAD};
    VocabScratch w;
    BufferPlan scratch = vocab_scratch_of(&w);
    int32_t *tokens = token_ids();
    size_t rows = (size_t)TOKENS * HIDDEN, table_size = (size_t)V_PAD * HIDDEN, logit_count = (size_t)TOKENS * V_PAD;
    real *table = random_array(table_size, 30), *want = zeros(rows), *got = zeros(rows);
    embedding_forward(want, tokens, table, TOKENS, HIDDEN);
    vocab_embedding_forward(&s, &w, got, tokens, table, TOKENS, HIDDEN);
    expect_same_bits("embedding", got, want, rows);

    real *d_out = random_array(rows, 31), *dt_want = random_array(table_size, 32), *dt = copy_of(dt_want, table_size);
    embedding_backward(dt_want, d_out, tokens, TOKENS, HIDDEN);
    vocab_embedding_backward(&s, &w, dt, d_out, tokens, TOKENS, HIDDEN);
    expect_same_bits("embedding gradient", dt, dt_want, table_size);

    real *logits = spiky_logits(), *weight = loss_weights();
    real *loss_want = zeros(TOKENS), *lse_want = zeros(TOKENS), *loss = zeros(TOKENS), *lse = zeros(TOKENS);
    cross_entropy_forward(loss_want, lse_want, logits, tokens, TOKENS, V_PAD);
    vocab_cross_entropy_forward(&s, loss, lse, logits, tokens, TOKENS);
    expect_same_bits("losses", loss, loss_want, TOKENS);
    expect_same_bits("lse", lse, lse_want, TOKENS);

    real *d_want = zeros(logit_count), *d = zeros(logit_count);
    cross_entropy_backward(d_want, logits, lse_want, tokens, weight, TOKENS, V_PAD);
    vocab_cross_entropy_backward(&s, &w, d, logits, lse, tokens, weight, TOKENS);
    expect_same_bits("dlogits", d, d_want, logit_count);
    end();

    buffer_plan_free(&scratch);
    real *all[] = {table, want, got, d_out, dt_want, dt, logits, weight, loss_want, lse_want, loss, lse, d_want, d};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
    free(tokens);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    comm_world_init(&argc, &argv);
    world = comm_world();
    if (world.size < 2 || world.size > 4) mt_die("run under mpirun -np 2, 3 or 4 (this world has %d)", world.size);
    for (int sp = 0; sp <= 1; sp++) {
        check_tp_block(sp, 0);
        check_vocab_embedding(sp);
    }
    check_tp_block(0, 1);
    check_vocab_cross_entropy();
    check_single_rank();
    comm_world_finalize();
    return failed_checks ? 1 : 0;
}

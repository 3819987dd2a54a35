// test_cp_batch.c — model/cp_batch.h: the load-balanced chunks of context parallelism and
// the slicing of a micro-batch (Megatron-Core's per-sequence balancing).
#include <stdlib.h>
#include <string.h>

#include "model/cp_batch.h"
#include "testlib.h"

enum { ROWS = 2, SEQ = 24 };

// A batch whose every array tells its token apart: value = 1000·row + index (+ an offset
// per array), positions restarting at 10 (a packed document), key_start at 5 from there.
typedef struct {
    int32_t tokens[ROWS * SEQ], targets[ROWS * SEQ], positions[ROWS * SEQ], key_start[ROWS * SEQ];
    real loss_mask[ROWS * SEQ];
    Batch batch;
} FullBatch;

static void make_full(FullBatch *f, int with_positions) {
    for (int b = 0; b < ROWS; b++)
        for (int t = 0; t < SEQ; t++) {
            int n = b * SEQ + t;
            f->tokens[n] = 1000 * b + t;
            f->targets[n] = 1000 * b + t + 500;
            f->positions[n] = t < 10 ? t : t - 10;
            f->key_start[n] = t < 10 ? 0 : 10;
            f->loss_mask[n] = (real)((t % 3) != 0);
        }
    f->batch = (Batch){.B = ROWS, .T = SEQ, .tokens = f->tokens, .targets = f->targets, .loss_mask = f->loss_mask,
                       .positions = with_positions ? f->positions : NULL, .key_start = f->key_start};
}

// Megatron's example: T = 8 on CP = 2, rank 0 holds 0 1 6 7, rank 1 holds 2 3 4 5.
static void test_chunks_as_megatron(void) {
    const int want[2][4] = {{0, 1, 6, 7}, {2, 3, 4, 5}};
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 4; t++)
            CHECK(cp_token_index(8, 2, r, t) == want[r][t], "rank %d token %d: index %d, want %d", r, t,
                  cp_token_index(8, 2, r, t), want[r][t]);
    CHECK(cp_chunk(4, 1, 0) == 1 && cp_chunk(4, 1, 1) == 6, "CP=4 rank 1 holds chunks 1 and 6");
}

// Every token of every row on exactly one rank, with its own target, mask, position and
// first key; the causal work (keys seen, index + 1 per token) the same on every rank.
static void check_slices(int cp, int with_positions) {
    FullBatch f;
    make_full(&f, with_positions);
    int seen[ROWS * SEQ] = {0}, local = SEQ / cp;
    long work0 = -1;
    for (int r = 0; r < cp; r++) {
        CpBatch s;
        cp_batch_slice(&s, &f.batch, cp, r, 0);
        CHECK(s.batch.B == ROWS && s.batch.T == local, "CP=%d rank %d: shape %d x %d", cp, r, s.batch.B, s.batch.T);
        long work = 0;
        for (int b = 0; b < ROWS; b++)
            for (int t = 0; t < local; t++) {
                int n = b * local + t, index = cp_token_index(SEQ, cp, r, t), full = b * SEQ + index;
                seen[full]++;
                work += index + 1;
                CHECK(s.batch.tokens[n] == f.tokens[full] && s.batch.targets[n] == f.targets[full],
                      "CP=%d rank %d row %d token %d: token/target", cp, r, b, t);
                CHECK(s.batch.loss_mask[n] == f.loss_mask[full] && s.batch.key_start[n] == f.key_start[full],
                      "CP=%d rank %d row %d token %d: mask/key_start", cp, r, b, t);
                int want_position = with_positions ? f.positions[full] : index;
                CHECK(s.batch.positions[n] == want_position, "CP=%d rank %d row %d token %d: position %d, want %d",
                      cp, r, b, t, s.batch.positions[n], want_position);
            }
        if (work0 < 0) work0 = work;
        CHECK(work == work0, "CP=%d: rank %d's causal work %ld, rank 0's %ld", cp, r, work, work0);
        cp_batch_free(&s);
    }
    for (int n = 0; n < ROWS * SEQ; n++) CHECK(seen[n] == 1, "CP=%d: token %d held %d times", cp, n, seen[n]);
}

static void test_slices(void) {
    for (int cp = 1; cp <= 4; cp++)
        if (SEQ % (2 * cp) == 0) {
            check_slices(cp, 1);
            check_slices(cp, 0);
        }
}

// Multi-token prediction's inputs of a rank: its tokens' k+1-th successors in the whole
// sequence (across the chunk boundaries), with their targets and masks; 0 past the end.
static void test_mtp_inputs_rolled_before_slicing(void) {
    enum { DEPTHS = 2, CP = 2 };
    FullBatch f;
    make_full(&f, 0);
    int local = SEQ / CP;
    for (int r = 0; r < CP; r++) {
        CpBatch s;
        cp_batch_slice(&s, &f.batch, CP, r, DEPTHS);
        CHECK(s.batch.mtp_tokens && s.batch.mtp_targets && s.batch.mtp_loss_mask, "rank %d: MTP inputs given", r);
        for (int k = 0; k < DEPTHS; k++)
            for (int b = 0; b < ROWS; b++)
                for (int t = 0; t < local; t++) {
                    int n = k * ROWS * local + b * local + t, ahead = cp_token_index(SEQ, CP, r, t) + k + 1;
                    int inside = ahead < SEQ, full = b * SEQ + ahead;
                    CHECK(s.batch.mtp_tokens[n] == (inside ? f.tokens[full] : 0) &&
                              s.batch.mtp_targets[n] == (inside ? f.targets[full] : 0) &&
                              s.batch.mtp_loss_mask[n] == (inside ? f.loss_mask[full] : 0),
                          "rank %d depth %d row %d token %d: not the token %d ahead", r, k, b, t, k + 1);
                }
        cp_batch_free(&s);
    }
}

// Arrays the full batch lacks stay absent (positions excepted: always given).
static void test_absent_arrays(void) {
    FullBatch f;
    make_full(&f, 0);
    f.batch.targets = NULL;
    f.batch.loss_mask = NULL;
    f.batch.key_start = NULL;
    CpBatch s;
    cp_batch_slice(&s, &f.batch, 2, 1, 0);
    CHECK(!s.batch.targets && !s.batch.loss_mask && !s.batch.key_start, "absent arrays stay NULL");
    CHECK(s.batch.positions && s.batch.positions[0] == SEQ / 4, "positions given: %d",
          s.batch.positions ? s.batch.positions[0] : -1);
    cp_batch_free(&s);
}

int main(void) {
    RUN(test_chunks_as_megatron);
    RUN(test_slices);
    RUN(test_mtp_inputs_rolled_before_slicing);
    RUN(test_absent_arrays);
    return tl_failed_cases != 0;
}

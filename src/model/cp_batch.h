// cp_batch.h — the tokens a context-parallel rank holds (Megatron-Core's per-sequence
// load balancing of the causal mask).
//
// With context parallelism of size CP each sequence of T tokens is cut into 2·CP chunks
// of C = T/(2·CP); rank r holds chunks r and 2·CP−1−r, in that order, so every rank gets
// one early and one late chunk and the causal work is even. A rank's micro-batch is then
// (B, 2C) tokens: row b holds the C tokens of chunk r, then the C of chunk 2·CP−1−r, each
// keeping its global position (RoPE), target, loss mask and first visible key.
//
//   T = 8, CP = 2 (chunks of 2):  rank 0 holds tokens 0 1 6 7, rank 1 holds 2 3 4 5
#pragma once
#include "model/model.h"

// The chunk (0 .. 2·CP−1) that is the `half`-th (0: early, 1: late) of rank cp_rank.
static inline int cp_chunk(int cp_size, int cp_rank, int half) {
    return half == 0 ? cp_rank : 2 * cp_size - 1 - cp_rank;
}

// The index within its sequence of the rank's local token t (0 ≤ t < T/CP) of sequences of T.
int cp_token_index(int T, int cp_size, int cp_rank, int t);

// The rank's slice of a micro-batch: arrays of (B, T/CP) that the batch points into.
typedef struct {
    Batch batch;  // B, T/CP, and the arrays below (NULL where the full batch has none)
    int32_t *tokens, *targets, *positions, *key_start;
    real *loss_mask;
    int32_t *mtp_tokens, *mtp_targets;  // (depths, B·T/CP) with multi-token prediction and targets
    real *mtp_loss_mask;
} CpBatch;

// Slices full (B rows of T tokens, T divisible by 2·CP) for rank cp_rank. Positions are
// always given: the full batch's, or the token's index in its sequence when it has none.
// key_start stays a position in the full sequence. With mtp_depths and targets, the
// multi-token-prediction inputs rolled along the whole sequences, then sliced the same way.
// cp_batch_free releases the arrays.
void cp_batch_slice(CpBatch *s, const Batch *full, int cp_size, int cp_rank, int mtp_depths);
void cp_batch_free(CpBatch *s);

#include "model/cp_batch.h"

#include <string.h>

int cp_token_index(int T, int cp_size, int cp_rank, int t) {
    int C = T / (2 * cp_size), half = t / C;
    return cp_chunk(cp_size, cp_rank, half) * C + t % C;
}

// dst (B, T/CP) = the rank's tokens of src (B, T), elements of `size` bytes.
static void *slice_rows(const void *src, int B, int T, int cp_size, int cp_rank, size_t size) {
    if (!src) return NULL;
    int local = T / cp_size, C = T / (2 * cp_size);
    char *dst = mt_malloc((size_t)B * local * size);
    for (int b = 0; b < B; b++)
        for (int half = 0; half < 2; half++) {
            size_t from = (size_t)b * T + (size_t)cp_chunk(cp_size, cp_rank, half) * C;
            size_t to = (size_t)b * local + (size_t)half * C;
            memcpy(dst + to * size, (const char *)src + from * size, (size_t)C * size);
        }
    return dst;
}

// The multi-token-prediction inputs of full, rolled along its sequences, each depth's
// (B, T) sliced for the rank.
static void slice_mtp_inputs(CpBatch *s, const Batch *full, int cp_size, int cp_rank, int depths) {
    int B = full->B, T = full->T;
    size_t n = (size_t)B * T, local = n / cp_size;
    int32_t *tokens = mt_malloc(depths * n * sizeof(int32_t)), *targets = mt_malloc(depths * n * sizeof(int32_t));
    real *mask = mt_malloc(depths * n * sizeof(real));
    mtp_roll_inputs(full, depths, tokens, targets, mask);
    s->mtp_tokens = mt_malloc(depths * local * sizeof(int32_t));
    s->mtp_targets = mt_malloc(depths * local * sizeof(int32_t));
    s->mtp_loss_mask = mt_malloc(depths * local * sizeof(real));
    struct {
        void *dst;
        const void *src;
        size_t size;
    } arrays[] = {{s->mtp_tokens, tokens, sizeof(int32_t)}, {s->mtp_targets, targets, sizeof(int32_t)},
                  {s->mtp_loss_mask, mask, sizeof(real)}};
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++)
        for (int k = 0; k < depths; k++) {
            void *piece = slice_rows((const char *)arrays[i].src + k * n * arrays[i].size, B, T, cp_size, cp_rank,
                                     arrays[i].size);
            memcpy((char *)arrays[i].dst + k * local * arrays[i].size, piece, local * arrays[i].size);
            free(piece);
        }
    free(tokens);
    free(targets);
    free(mask);
}

void cp_batch_slice(CpBatch *s, const Batch *full, int cp_size, int cp_rank, int mtp_depths) {
    int B = full->B, T = full->T, local = T / cp_size;
    MT_ASSERT(cp_size >= 1 && cp_rank >= 0 && cp_rank < cp_size && T % (2 * cp_size) == 0);
    memset(s, 0, sizeof(*s));
    s->tokens = slice_rows(full->tokens, B, T, cp_size, cp_rank, sizeof(int32_t));
    s->targets = slice_rows(full->targets, B, T, cp_size, cp_rank, sizeof(int32_t));
    s->loss_mask = slice_rows(full->loss_mask, B, T, cp_size, cp_rank, sizeof(real));
    s->key_start = slice_rows(full->key_start, B, T, cp_size, cp_rank, sizeof(int32_t));
    s->positions = slice_rows(full->positions, B, T, cp_size, cp_rank, sizeof(int32_t));
    if (!s->positions) {  // the index in the sequence
        s->positions = mt_malloc((size_t)B * local * sizeof(int32_t));
        for (int b = 0; b < B; b++)
            for (int t = 0; t < local; t++) s->positions[(size_t)b * local + t] = cp_token_index(T, cp_size, cp_rank, t);
    }
    s->batch = *full;
    s->batch.T = local;
    s->batch.tokens = s->tokens;
    s->batch.targets = s->targets;
    s->batch.loss_mask = s->loss_mask;
    s->batch.positions = s->positions;
    s->batch.key_start = s->key_start;
    if (!mtp_depths || !full->targets) return;
    slice_mtp_inputs(s, full, cp_size, cp_rank, mtp_depths);
    s->batch.mtp_tokens = s->mtp_tokens;
    s->batch.mtp_targets = s->mtp_targets;
    s->batch.mtp_loss_mask = s->mtp_loss_mask;
}

void cp_batch_free(CpBatch *s) {
    free(s->tokens);
    free(s->targets);
    free(s->positions);
    free(s->key_start);
    free(s->loss_mask);
    free(s->mtp_tokens);
    free(s->mtp_targets);
    free(s->mtp_loss_mask);
    memset(s, 0, sizeof(*s));
}

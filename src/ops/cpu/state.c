// state.c — the cpu backend's state ops (contracts in ops_state.h): sampling generation's
// next token, with the arithmetic of ops/sample_token.h (shared with the cuda kernel).
#include "ops/cpu/cpu_ops.h"
#include "ops/sample_token.h"

void cpu_sample_next_token(int32_t *token, const real *logits, int vocab, const SampleParams *p, double *work,
                           int32_t *order) {
    token[0] = sample_token(logits, vocab, p, work, order);
}

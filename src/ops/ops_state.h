// ops_state.h — the ops of checkpoint staging, generation (KV cache, sampling) and optimizer bookkeeping: their types and
// contracts (shapes, overwrite vs +=, reduction order); listed in op_list.h (MT_OPS_STATE).
#pragma once
#include "ops/ops.h"

// ---- generation: sampling the next token ------------------------------------------------------

// How one generated token is chosen (generate.c; temperature <= 0 is greedy). u is the uniform
// draw in [0, 1) the host took for this token (only when temperature > 0: the same draws as
// ever); top_k 0 or >= vocab and top_p >= 1 turn those filters off.
typedef struct {
    double temperature;
    int top_k;
    double top_p;
    double u;
} SampleParams;

// sample_next_token: token[0] (overwritten) is the next token of one position's logits (vocab):
//   best = the largest logit, the first of equal ones; with temperature <= 0 that is the token.
//   Else w_v = exp((l_v − l_best) / temperature) (the difference in real, then double) for
//   the tokens at or above the top_k-th largest logit (0 for the others); then with top_p < 1
//   nucleus filtering (transformers' TopPLogitsWarper): in order of descending w (equal
//   weights in token order), a token after the first is dropped (w = 0) once the weights
//   before it hold top_p·Σw or more; then r = u·Σw (Σ in token order) and the token is the
//   first v in token order with w_v > 0 at which r −= w_v reaches r <= 0 (best when none).
// work (2·vocab doubles) and order (vocab) are scratch tensors, overwritten. All arithmetic in
// one fixed order: the result is exact, bit for bit, between runs.
void sample_next_token(int32_t *token, const real *logits, int vocab, const SampleParams *p, double *work,
                       int32_t *order);

// cuda_moe.h — the cuda backend's MoE ops (src/ops/cuda/moe.cu): each cuda_X has the
// signature and contract of X in ops.h, over device (or managed) memory, queued on
// cuda_stream() like the other ops (cuda_ops.h). No atomics: every output element has one
// owning thread (or warp), which computes it in the cpu backend's order.
#pragma once
#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

void cuda_moe_router_logits(real *logits, const real *x, const real *W, int N, int H, int E);
void cuda_moe_route_tokens(real *scores, real *aux_scores, int32_t *topk_idx, real *topk_probs, const real *logits,
                           const real *expert_bias, int N, const RouteShape *r);
void cuda_moe_permute(real *rows, real *row_values, const real *x, const real *choice_values,
                      const int32_t *token_of_row, const int32_t *row_of_choice, int R, int k, int H);
void cuda_moe_unpermute(real *out, real *choice_values, const real *rows, const real *row_values,
                        const int32_t *row_of_choice, int N, int k, int H, int accumulate);

#ifdef __cplusplus
}
#endif

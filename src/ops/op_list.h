// op_list.h — every operation a compute backend provides, declared once.
//
// MT_OPS(OP) expands OP(ret, api, name, params, args) for each op, in one fixed order:
//   ret     the result type (void, or double for the one op that returns a scalar)
//   api     the function the model calls (ops.h / gemm.h, which document its contract)
//   name    the op's name: the backend table's field (backend.h), the backends'
//           functions cpu_<name> / cuda_<name>, the op checks' and the profile's key
//   params  the parenthesised parameter list, args the same names as arguments
// From this list come the backend table (backend.h), the dispatch wrappers
// (dispatch.c), the backends' prototypes and tables (cpu_ops.h, backend_cpu.c,
// cuda_ops.h, backend_cuda.c), the op ids and names below, and the op checks' table
// (tests/gpu/): a backend that lacks an op does not link, and an op without a check
// fails the check program.
#pragma once
#include "ops/ops.h"
#include "ops/ops_dispatch.h"
#include "ops/ops_loss.h"
#include "ops/ops_parallel.h"
#include "ops/ops_quantize.h"
#include "ops/ops_router.h"
#include "ops/ops_state.h"

// The whole list: the core ops below, then each area's ops (declared in ops_<area>.h).
#define MT_OPS(OP) MT_OPS_CORE(OP) MT_OPS_LOSS(OP) MT_OPS_ROUTER(OP) MT_OPS_DISPATCH(OP) MT_OPS_PARALLEL(OP) MT_OPS_STATE(OP) \
    MT_OPS_QUANTIZE(OP)

// Core: GEMMs, vectors, norms, attention, activations, optimizer, per-token routing.
#define MT_OPS_CORE(OP)                                                                                                    \
    OP(void, mt_gemm, gemm,                                                                                          \
       (int trans_a, int trans_b, int M, int N, int K, real alpha, const real *A, int lda, const real *B, int ldb,  \
        real beta, real *C, int ldc),                                                                                \
       (trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))                                             \
    OP(void, mt_gemm_stored, gemm_stored,                                                                            \
       (int trans_a, int trans_b, int M, int N, int K, real alpha, const void *A, Storage a_store, int lda,         \
        const void *B, Storage b_store, int ldb, real beta, void *C, Storage c_store, int ldc),                     \
       (trans_a, trans_b, M, N, K, alpha, A, a_store, lda, B, b_store, ldb, beta, C, c_store, ldc))                  \
    OP(void, mt_gemm_grouped, gemm_grouped,                                                                          \
       (int trans_a, int trans_b, int groups, const int32_t *counts, const int32_t *host_counts, int N, int K,      \
        real alpha, const void *A, Storage a_store, int lda, const real *B, size_t b_stride, int ldb, real beta,    \
        void *C, Storage c_store, int ldc),                                                                          \
       (trans_a, trans_b, groups, counts, host_counts, N, K, alpha, A, a_store, lda, B, b_stride, ldb, beta, C,     \
        c_store, ldc))                                                                                               \
    OP(void, mt_gemm_grouped_wgrad, gemm_grouped_wgrad,                                                              \
       (int groups, const int32_t *counts, const int32_t *host_counts, int out, int in, real alpha, const void *dY, \
        Storage dy_store, const void *X, Storage x_store, real *W, size_t w_stride),                                 \
       (groups, counts, host_counts, out, in, alpha, dY, dy_store, X, x_store, W, w_stride))                         \
    OP(void, linear_forward, linear_forward, (real *y, const real *x, const real *W, int N, int in, int out),      \
       (y, x, W, N, in, out))                                                                                        \
    OP(void, linear_backward, linear_backward,                                                                       \
       (real *dx, real *dW, const real *dy, const real *x, const real *W, int N, int in, int out),                \
       (dx, dW, dy, x, W, N, in, out))                                                                               \
    OP(void, vec_copy, vec_copy, (real *dst, const real *src, size_t n), (dst, src, n))                             \
    OP(void, vec_zero, vec_zero, (real *x, size_t n), (x, n))                                                       \
    OP(void, vec_add, vec_add, (real *y, const real *x, size_t n), (y, x, n))                                       \
    OP(void, vec_scale, vec_scale, (real *x, real s, size_t n), (x, s, n))                                          \
    OP(double, vec_sum_squares, vec_sum_squares, (const real *x, size_t n), (x, n))                                  \
    OP(void, vec_sum_squares_to, vec_sum_squares_to, (double *sum, const real *x, size_t n), (sum, x, n))          \
    OP(void, vec_count_zeros_to, vec_count_zeros_to, (double *count, const real *x, size_t n), (count, x, n))      \
    OP(void, bf16_pack, bf16_pack, (real *packed, const real *x, size_t n), (packed, x, n))                          \
    OP(void, bf16_unpack, bf16_unpack, (real *x, const real *packed, size_t n), (x, packed, n))                      \
    OP(void, embedding_forward, embedding_forward,                                                                   \
       (real *out, const int32_t *tokens, const real *table, int N, int C), (out, tokens, table, N, C))            \
    OP(void, embedding_backward, embedding_backward,                                                                 \
       (real *dtable, const real *dout, const int32_t *tokens, int N, int C), (dtable, dout, tokens, N, C))        \
    OP(void, rmsnorm_forward, rmsnorm_forward,                                                                       \
       (void *y, Storage y_store, real *rstd, const void *x, Storage x_store, const real *w, int N, int C,         \
        real eps),                                                                                                   \
       (y, y_store, rstd, x, x_store, w, N, C, eps))                                                                 \
    OP(void, rmsnorm_backward, rmsnorm_backward,                                                                     \
       (real *dx, real *dw, const real *dy, const void *x, Storage x_store, const real *w, const real *rstd, int N, \
        int C),                                                                                                      \
       (dx, dw, dy, x, x_store, w, rstd, N, C))                                                                      \
    OP(void, residual_add, residual_add,                                                                             \
       (void *y, Storage y_store, const void *x, Storage x_store, const real *branch, size_t n),                    \
       (y, y_store, x, x_store, branch, n))                                                                          \
    OP(void, rope_forward, rope_forward, (real *x, const real *cos_sin, const TokenLayout *t, const RopeLayout *l), \
       (x, cos_sin, t, l))                                                                                           \
    OP(void, rope_backward, rope_backward,                                                                           \
       (real *dx, const real *cos_sin, const TokenLayout *t, const RopeLayout *l), (dx, cos_sin, t, l))            \
    OP(void, clamp_forward, clamp_forward, (real *y, const real *x, size_t n, real limit), (y, x, n, limit))       \
    OP(void, clamp_backward, clamp_backward, (real *d, const real *x, size_t n, real limit), (d, x, n, limit))     \
    OP(void, dropout_apply, dropout_apply, (real *y, const real *x, const DropoutShape *s), (y, x, s))             \
    OP(void, attention_forward, attention_forward,                                                                   \
       (void *out, real *lse, const void *q, const void *k, const void *v, const AttentionShape *s),             \
       (out, lse, q, k, v, s))                                                                                       \
    OP(void, attention_backward, attention_backward,                                                                 \
       (real *dq, real *dk, real *dv, const real *dout, const void *out, const real *lse, const void *q,        \
        const void *k, const void *v, const AttentionShape *s),                                                      \
       (dq, dk, dv, dout, out, lse, q, k, v, s))                                                                     \
    OP(void, attention_merge, attention_merge,                                                                       \
       (real *out, real *lse, const real *out_block, const real *lse_block, const AttentionShape *s),            \
       (out, lse, out_block, lse_block, s))                                                                          \
    OP(void, swiglu_forward, swiglu_forward,                                                                         \
       (void *act, Storage act_store, const void *gate, const void *up, Storage gu_store, const real *row_scale,    \
        int M, int I),                                                                                               \
       (act, act_store, gate, up, gu_store, row_scale, M, I))                                                        \
    OP(void, swiglu_backward, swiglu_backward,                                                                       \
       (void *dgate, void *dup, Storage d_store, real *drow_scale, const real *dact, const void *gate,             \
        const void *up, Storage gu_store, const real *row_scale, int M, int I),                                      \
       (dgate, dup, d_store, drow_scale, dact, gate, up, gu_store, row_scale, M, I))                                 \
    OP(void, softmax_forward, softmax_forward, (real *y, const real *x, int N, int C), (y, x, N, C))               \
    OP(void, softmax_backward, softmax_backward, (real *dx, const real *y, const real *dy, int N, int C),          \
       (dx, y, dy, N, C))                                                                                            \
    OP(void, cross_entropy_forward, cross_entropy_forward,                                                           \
       (real *losses, real *lse, const real *logits, const int32_t *targets, int N, int V),                      \
       (losses, lse, logits, targets, N, V))                                                                         \
    OP(void, cross_entropy_backward, cross_entropy_backward,                                                         \
       (real *dlogits, const real *logits, const real *lse, const int32_t *targets, const real *weight, int N,    \
        int V),                                                                                                      \
       (dlogits, logits, lse, targets, weight, N, V))                                                                \
    OP(void, adamw_update, adamw_update,                                                                             \
       (real *p, const real *g, real *m, real *v, size_t n, int decay, const AdamWStep *h),                       \
       (p, g, m, v, n, decay, h))                                                                                    \
    OP(void, adamw_update_scaled, adamw_update_scaled,                                                               \
       (real *p, const real *g, void *m, void *v, MomentScales *s, size_t n, int decay, const AdamWStep *h,         \
        const MomentDtype dtype[ADAMW_MOMENTS]),                                                                     \
       (p, g, m, v, s, n, decay, h, dtype))                                                                          \
    OP(void, moe_router_logits, moe_router_logits, (real *logits, const real *x, const real *W, int N, int H, int E), \
       (logits, x, W, N, H, E))                                                                                      \
    OP(void, moe_route_tokens, moe_route_tokens,                                                                     \
       (real *scores, real *aux_scores, int32_t *topk_idx, real *topk_probs, const real *logits,               \
        const real *expert_bias, int N, const RouteShape *r),                                                        \
       (scores, aux_scores, topk_idx, topk_probs, logits, expert_bias, N, r))                                        \
    OP(void, moe_permute, moe_permute,                                                                               \
       (void *rows, Storage rows_store, real *row_values, const void *x, Storage x_store,                         \
        const real *choice_values, const int32_t *token_of_row, const int32_t *row_of_choice, int R, int k, int H),  \
       (rows, rows_store, row_values, x, x_store, choice_values, token_of_row, row_of_choice, R, k, H))              \
    OP(void, moe_unpermute, moe_unpermute,                                                                           \
       (real *out, real *choice_values, const real *rows, const real *row_values, const int32_t *row_of_choice,  \
        int N, int k, int H, int accumulate),                                                                        \
       (out, choice_values, rows, row_values, row_of_choice, N, k, H, accumulate))

// Loss: the LM head's loss sums and weights, vocab-parallel cross-entropy (ops_loss.h).
#define MT_OPS_LOSS(OP)                                                                                                    \
    OP(void, lm_loss_sums, lm_loss_sums, (double *sums, const real *token_loss, const real *loss_mask, int N),     \
       (sums, token_loss, loss_mask, N))                                                                             \
    OP(void, lm_loss_weights, lm_loss_weights, (real *weight, const real *loss_mask, double counted, int N),      \
       (weight, loss_mask, counted, N))                                                                              \
    OP(void, vec_scale_double, vec_scale_double, (real *dst, const real *src, double scale, size_t n),            \
       (dst, src, scale, n))                                                                                         \
    OP(void, vocab_slice_rows, vocab_slice_rows,                                                                     \
       (int32_t *rows, const int32_t *tokens, int first, int vocab, int32_t missing, int N),                      \
       (rows, tokens, first, vocab, missing, N))                                                                     \
    OP(void, vocab_embedding_grad, vocab_embedding_grad,                                                             \
       (real *dtable, const real *dout, const int32_t *rows, int N, int C), (dtable, dout, rows, N, C))            \
    OP(void, vocab_row_max, vocab_row_max, (real *maxima, const real *logits, int N, int V), (maxima, logits, N, V)) \
    OP(void, vocab_row_stats, vocab_row_stats,                                                                       \
       (double *stats, real *maxima, const real *every, const real *logits, const int32_t *targets, int first,    \
        int P, int N, int V),                                                                                        \
       (stats, maxima, every, logits, targets, first, P, N, V))                                                      \
    OP(void, vocab_ce_finish, vocab_ce_finish,                                                                       \
       (real *losses, real *lse, const real *maxima, const double *stats, int N), (losses, lse, maxima, stats, N)) \
    OP(void, vocab_ce_foreign_targets, vocab_ce_foreign_targets,                                                     \
       (real *dlogits, const real *logits, const real *lse, const int32_t *targets, const real *weight, int first, \
        int N, int V),                                                                                               \
       (dlogits, logits, lse, targets, weight, first, N, V))

// Router: capacity, counts, balancing statistics and losses, router backward (ops_router.h).
#define MT_OPS_ROUTER(OP)                                                                                                  \
    OP(void, moe_router_backward, moe_router_backward,                                                               \
       (real *dlogits, const real *dprobs, const real *logits, const int32_t *topk_idx, const int32_t *kept,       \
        const int32_t *aux_counts, const double *global_counts, const int32_t *seq_counts,                         \
        const int32_t *token_index, int N, const RouterGradShape *g),                                               \
       (dlogits, dprobs, logits, topk_idx, kept, aux_counts, global_counts, seq_counts, token_index, N, g))         \
    OP(void, moe_router_sinkhorn, moe_router_sinkhorn,                                                               \
       (int32_t *topk_idx, double *work, const real *logits, int N, int E, int k), (topk_idx, work, logits, N, E, k)) \
    OP(void, moe_router_quantile, moe_router_quantile,                                                               \
       (int32_t *topk_idx, real *quantile, double *work, const real *logits, const real *beta, int N, int E, int k),\
       (topk_idx, quantile, work, logits, beta, N, E, k))                                                            \
    OP(void, moe_router_capacity, moe_router_capacity,                                                               \
       (real *topk_probs, int32_t *kept, const int32_t *topk_idx, int choices, int E, int capacity, int by_position), \
       (topk_probs, kept, topk_idx, choices, E, capacity, by_position))                                              \
    OP(void, moe_router_statistics, moe_router_statistics,                                                           \
       (double *z, int64_t *counts, double *columns, int32_t *tokens_per_expert, int64_t *dropped,                  \
        const real *logits, const real *aux_scores, const int32_t *topk_idx, const int32_t *kept,                  \
        const int32_t *token_index, int N, const RouterStatShape *s),                                               \
       (z, counts, columns, tokens_per_expert, dropped, logits, aux_scores, topk_idx, kept, token_index, N, s))      \
    OP(void, moe_router_count_totals, moe_router_count_totals,                                                       \
       (int32_t *seq_counts, int32_t *aux_counts, int32_t *group_tokens_per_expert, int64_t *group_counts64,        \
        const int64_t *counts, int sequences, int E),                                                                \
       (seq_counts, aux_counts, group_tokens_per_expert, group_counts64, counts, sequences, E))                      \
    OP(void, moe_router_losses, moe_router_losses,                                                                   \
       (double *report, double *group_counts, double *global_counts, const int64_t *group_counts64,                \
        const double *before, const double *columns, const int32_t *seq_counts, const int32_t *aux_counts,         \
        const double *z, const int64_t *dropped, const int32_t *tokens_per_expert,                                 \
        const int32_t *group_tokens_per_expert, const RouterLossShape *s),                                          \
       (report, group_counts, global_counts, group_counts64, before, columns, seq_counts, aux_counts, z, dropped,   \
        tokens_per_expert, group_tokens_per_expert, s))                                                             \
    OP(void, moe_scale_by, moe_scale_by, (real *y, const real *x, const real *scale, size_t n), (y, x, scale, n))  \
    OP(void, moe_gate_sigmoid, moe_gate_sigmoid, (real *gate, size_t n), (gate, n))                                \
    OP(void, moe_gate_sigmoid_backward, moe_gate_sigmoid_backward, (real *dgate, const real *gate, size_t n),      \
       (dgate, gate, n))                                                                                             \
    OP(void, moe_expert_bias_update, moe_expert_bias_update, (real *bias, const double *counts, int E, double rate), \
       (bias, counts, E, rate))

// Dispatch: the dispatch plan, expert row grouping, EP exchange layouts (ops_dispatch.h).
#define MT_OPS_DISPATCH(OP)                                                                                              \
    OP(void, moe_dispatch_plan, moe_dispatch_plan,                                                                   \
       (int32_t *rows_per_expert, int32_t *expert_offsets, int32_t *row_of_choice, int32_t *token_of_row,            \
        const int32_t *topk_idx, const int32_t *kept, int N, int k, int E, int capacity, int align),                 \
       (rows_per_expert, expert_offsets, row_of_choice, token_of_row, topk_idx, kept, N, k, E, capacity, align))     \
    OP(void, moe_keep_local_choices, moe_keep_local_choices,                                                         \
       (int32_t *kept, const int32_t *topk_idx, size_t n, int first, int local), (kept, topk_idx, n, first, local)) \
    OP(void, moe_ep_layout, moe_ep_layout,                                                                           \
       (int32_t *counts, int32_t *offsets, int32_t *sizes, const int32_t *own_counts, const int32_t *recv_counts,    \
        const int32_t *expert_offsets, int P, int L, int S),                                                         \
       (counts, offsets, sizes, own_counts, recv_counts, expert_offsets, P, L, S))                                   \
    OP(void, moe_sort_segments, moe_sort_segments,                                                                   \
       (real *dst, const real *src, const int32_t *recv_counts, const int32_t *offsets, int S, int L, int width,    \
        int to_expert_major),                                                                                        \
       (dst, src, recv_counts, offsets, S, L, width, to_expert_major))

// Parallel: tensor/context-parallel gathers, slices and sums (ops_parallel.h).
#define MT_OPS_PARALLEL(OP)                                                                                                \
    OP(void, rows_copy_strided, rows_copy_strided,                                                                   \
       (void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width, int rows),                     \
       (dst, dst_pitch, src, src_pitch, width, rows))                                                                \
    OP(void, rows_gather, rows_gather, (void *dst, const void *src, const int32_t *index, int rows, size_t width),   \
       (dst, src, index, rows, width))                                                                               \
    OP(void, rows_scatter, rows_scatter, (void *dst, const void *src, const int32_t *index, int rows, size_t width), \
       (dst, src, index, rows, width))                                                                               \
    OP(void, lse_reset, lse_reset, (real *lse, size_t n), (lse, n))                                                \
    OP(void, batched_transpose, batched_transpose, (real *dst, const real *src, int batch, int rows, int cols),      \
       (dst, src, batch, rows, cols))                                                                                \
    OP(void, heads_sum, heads_sum, (real *dst, const real *src, int rows, int heads, size_t head_pitch, int width),   \
       (dst, src, rows, heads, head_pitch, width))

// State: checkpoints, generation (KV cache, sampling), optimizer bookkeeping (ops_state.h).
#define MT_OPS_STATE(OP)                                                                                             \
    OP(void, sample_next_token, sample_next_token,                                                                   \
       (int32_t *token, const real *logits, int vocab, const SampleParams *p, double *work, int32_t *order),       \
       (token, logits, vocab, p, work, order))

// Quantize: FP8 per tensor and in tiles, MXFP8, NVFP4, the random Hadamard transform (ops_quantize.h).
#define MT_OPS_QUANTIZE(OP)                                                                                          \
    OP(void, quant_amax, quant_amax, (float *amax, const float *x, size_t n, AmaxNan nan), (amax, x, n, nan))     \
    OP(void, fp8_scale_from_amax, fp8_scale_from_amax,                                                               \
       (float *scale, float *scale_inv, const float *amax, const Fp8ScaleParams *p), (scale, scale_inv, amax, p))  \
    OP(void, fp8_delayed_scale, fp8_delayed_scale,                                                                   \
       (float *scale, float *scale_inv, const float *history, const float *prev, const Fp8DelayedParams *p),      \
       (scale, scale_inv, history, prev, p))                                                                         \
    OP(void, fp8_quantize_tensor, fp8_quantize_tensor,                                                               \
       (uint8_t *codes, const float *x, const float *scale, size_t n, Fp8Format f), (codes, x, scale, n, f))       \
    OP(void, fp8_dequantize_tensor, fp8_dequantize_tensor,                                                           \
       (float *y, const uint8_t *codes, const float *scale_inv, size_t n, Fp8Format f), (y, codes, scale_inv, n, f)) \
    OP(void, fp8_transpose, fp8_transpose, (uint8_t *t, const uint8_t *codes, int rows, int cols),                  \
       (t, codes, rows, cols))                                                                                       \
    OP(void, fp8_gemm, fp8_gemm,                                                                                     \
       (float *C, const uint8_t *A, Fp8Format fa, const float *a_scale_inv, const uint8_t *B, Fp8Format fb,       \
        const float *b_scale_inv, int M, int N, int K, float beta, float *work),                                   \
       (C, A, fa, a_scale_inv, B, fb, b_scale_inv, M, N, K, beta, work))                                             \
    OP(void, fp8_block_quantize, fp8_block_quantize,                                                                 \
       (uint8_t *codes, float *scale_inv, const float *x, int rows, int cols, const Fp8BlockParams *p),           \
       (codes, scale_inv, x, rows, cols, p))                                                                         \
    OP(void, fp8_block_dequantize, fp8_block_dequantize,                                                             \
       (float *y, const uint8_t *codes, const float *scale_inv, int rows, int cols, const Fp8BlockParams *p),     \
       (y, codes, scale_inv, rows, cols, p))                                                                         \
    OP(void, mxfp8_quantize, mxfp8_quantize,                                                                         \
       (uint8_t *codes, uint8_t *scales, const float *x, int rows, int cols, Fp8Format f, MxScaleMode mode),      \
       (codes, scales, x, rows, cols, f, mode))                                                                      \
    OP(void, mxfp8_dequantize, mxfp8_dequantize,                                                                     \
       (float *y, const uint8_t *codes, const uint8_t *scales, int rows, int cols, Fp8Format f),                  \
       (y, codes, scales, rows, cols, f))                                                                            \
    OP(void, nvfp4_quantize, nvfp4_quantize,                                                                         \
       (uint8_t *codes, uint8_t *scales, const float *x, const float *amax, int rows, int cols,                  \
        const Nvfp4Params *p),                                                                                       \
       (codes, scales, x, amax, rows, cols, p))                                                                      \
    OP(void, nvfp4_dequantize, nvfp4_dequantize,                                                                     \
       (float *y, const uint8_t *codes, const uint8_t *scales, const float *amax, int rows, int cols),           \
       (y, codes, scales, amax, rows, cols))                                                                         \
    OP(void, hadamard16, hadamard16, (float *y, const float *x, size_t n, uint32_t sign_mask),                     \
       (y, x, n, sign_mask))

// OP_<name>: the op's index in the list; OPS_COUNT of them.
#define MT_OP_ID(ret, api, name, params, args) OP_##name,
typedef enum { MT_OPS(MT_OP_ID) OPS_COUNT } OpId;
#undef MT_OP_ID

// "gemm", "vec_copy", ...: the op's name (its index in the list).
const char *op_name(OpId op);

// A backend's prototypes and table entries: each backend file expands MT_OPS with these.
#define MT_OP_PROTO_CPU(ret, api, name, params, args) ret cpu_##name params;
#define MT_OP_ENTRY_CPU(ret, api, name, params, args) .name = cpu_##name,
#define MT_OP_PROTO_CUDA(ret, api, name, params, args) ret cuda_##name params;
#define MT_OP_ENTRY_CUDA(ret, api, name, params, args) .name = cuda_##name,

// cpu_ops.h — the cpu backend: each cpu_X implements X of ops.h / gemm.h on host memory
// with OpenMP (contracts there). The model reaches them through src/ops/dispatch.c;
// tests and the cuda op checks may call them directly.
#pragma once
#include "ops/ops.h"

// gemm.c
void cpu_gemm(int trans_a, int trans_b, int M, int N, int K, real alpha, const real *A, int lda, const real *B,
              int ldb, real beta, real *C, int ldc);
void cpu_gemm_grouped(int trans_a, int trans_b, int groups, const int *rows, int N, int K, real alpha,
                      const real *A, const size_t *a_offsets, int lda, const real *const *B_ptrs, int ldb,
                      real beta, real *C, const size_t *c_offsets, int ldc);
void cpu_gemm_grouped_wgrad(int groups, const int *rows, int out, int in, real alpha, const real *dY,
                            const size_t *dy_offsets, const real *X, const size_t *x_offsets, real *const *W_ptrs);
// linear.c
void cpu_linear_forward(real *y, const real *x, const real *W, int N, int in, int out);
void cpu_linear_backward(real *dx, real *dW, const real *dy, const real *x, const real *W, int N, int in, int out);
// elementwise.c
void cpu_vec_copy(real *dst, const real *src, size_t n);
void cpu_vec_zero(real *x, size_t n);
void cpu_vec_add(real *y, const real *x, size_t n);
void cpu_vec_scale(real *x, real s, size_t n);
double cpu_vec_sum_squares(const real *x, size_t n);
void cpu_embedding_forward(real *out, const int32_t *tokens, const real *table, int N, int C);
void cpu_embedding_backward(real *dtable, const real *dout, const int32_t *tokens, int N, int C);
void cpu_rmsnorm_forward(real *y, real *rstd, const real *x, const real *w, int N, int C, real eps);
void cpu_rmsnorm_backward(real *dx, real *dw, const real *dy, const real *x, const real *w, const real *rstd, int N,
                          int C);
void cpu_rope_forward(real *x, const real *cos_sin, const TokenLayout *t, const RopeLayout *l);
void cpu_rope_backward(real *dx, const real *cos_sin, const TokenLayout *t, const RopeLayout *l);
void cpu_clamp_forward(real *y, const real *x, size_t n, real limit);
void cpu_clamp_backward(real *d, const real *x, size_t n, real limit);
void cpu_swiglu_forward(real *act, const real *gate, const real *up, const real *row_scale, int M, int I);
void cpu_swiglu_backward(real *dgate, real *dup, real *drow_scale, const real *dact, const real *gate,
                         const real *up, const real *row_scale, int M, int I);
void cpu_softmax_forward(real *y, const real *x, int N, int C);
void cpu_softmax_backward(real *dx, const real *y, const real *dy, int N, int C);
void cpu_cross_entropy_forward(real *losses, real *lse, const real *logits, const int32_t *targets, int N, int V);
void cpu_cross_entropy_backward(real *dlogits, const real *logits, const real *lse, const int32_t *targets,
                                const real *weight, int N, int V);
void cpu_adamw_update(real *p, const real *g, real *m, real *v, size_t n, int decay, const AdamWStep *h);
// attention.c
void cpu_attention_forward(real *out, real *lse, const real *q, const real *k, const real *v,
                           const AttentionShape *s);
void cpu_attention_backward(real *dq, real *dk, real *dv, const real *dout, const real *out, const real *lse,
                            const real *q, const real *k, const real *v, const AttentionShape *s);
// attention_merge.c
void cpu_attention_merge(real *out, real *lse, const real *out_block, const real *lse_block,
                         const AttentionShape *s);
// moe.c
void cpu_moe_router_logits(real *logits, const real *x, const real *W, int N, int H, int E);
void cpu_moe_route_tokens(real *scores, real *aux_scores, int32_t *topk_idx, real *topk_probs, const real *logits,
                          const real *expert_bias, int N, const RouteShape *r);
void cpu_moe_permute(real *rows, real *row_values, const real *x, const real *choice_values,
                     const int32_t *token_of_row, const int32_t *row_of_choice, int R, int k, int H);
void cpu_moe_unpermute(real *out, real *choice_values, const real *rows, const real *row_values,
                       const int32_t *row_of_choice, int N, int k, int H, int accumulate);

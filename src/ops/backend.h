// backend.h — the table of operations a compute backend provides.
//
// The model calls the functions of ops.h and gemm.h; src/ops/dispatch.c forwards each
// call to the active backend's entry here. The cpu backend (src/ops/cpu/, functions
// named cpu_*) is always built; the cuda backend (src/ops/cuda/, cuda_*) when the
// build found the CUDA toolkit (MT_HAVE_CUDA, float builds only). Every entry has the
// signature and the contract of the ops.h / gemm.h function of the same name; pointers
// are to memory the backend can read (host memory for cpu, device or managed memory
// for cuda — src/core/device.h allocates the right kind), except the small per-group
// descriptions of the grouped GEMMs (rows, offsets, pointer arrays), which are host
// arrays in every backend.
#pragma once
#include "ops/ops.h"

typedef struct OpsBackend {
    const char *name;
    // ---- gemm.h
    void (*gemm)(int trans_a, int trans_b, int M, int N, int K, real alpha, const real *A, int lda,
                 const real *B, int ldb, real beta, real *C, int ldc);
    void (*gemm_grouped)(int trans_a, int trans_b, int groups, const int *rows, int N, int K, real alpha,
                         const real *A, const size_t *a_offsets, int lda, const real *const *B_ptrs, int ldb,
                         real beta, real *C, const size_t *c_offsets, int ldc);
    void (*gemm_grouped_wgrad)(int groups, const int *rows, int out, int in, real alpha, const real *dY,
                               const size_t *dy_offsets, const real *X, const size_t *x_offsets,
                               real *const *W_ptrs);
    // ---- ops.h
    void (*linear_forward)(real *y, const real *x, const real *W, int N, int in, int out);
    void (*linear_backward)(real *dx, real *dW, const real *dy, const real *x, const real *W, int N, int in,
                            int out);
    void (*vec_copy)(real *dst, const real *src, size_t n);
    void (*vec_zero)(real *x, size_t n);
    void (*vec_add)(real *y, const real *x, size_t n);
    void (*vec_scale)(real *x, real s, size_t n);
    double (*vec_sum_squares)(const real *x, size_t n);
    void (*embedding_forward)(real *out, const int32_t *tokens, const real *table, int N, int C);
    void (*embedding_backward)(real *dtable, const real *dout, const int32_t *tokens, int N, int C);
    void (*rmsnorm_forward)(real *y, real *rstd, const real *x, const real *w, int N, int C, real eps);
    void (*rmsnorm_backward)(real *dx, real *dw, const real *dy, const real *x, const real *w, const real *rstd,
                             int N, int C);
    void (*rope_forward)(real *x, const real *cos_sin, const TokenLayout *t, const RopeLayout *l);
    void (*rope_backward)(real *dx, const real *cos_sin, const TokenLayout *t, const RopeLayout *l);
    void (*clamp_forward)(real *y, const real *x, size_t n, real limit);
    void (*clamp_backward)(real *d, const real *x, size_t n, real limit);
    void (*attention_forward)(real *out, real *lse, const real *q, const real *k, const real *v,
                              const AttentionShape *s);
    void (*attention_backward)(real *dq, real *dk, real *dv, const real *dout, const real *out, const real *lse,
                               const real *q, const real *k, const real *v, const AttentionShape *s);
    void (*attention_merge)(real *out, real *lse, const real *out_block, const real *lse_block,
                            const AttentionShape *s);
    void (*swiglu_forward)(real *act, const real *gate, const real *up, const real *row_scale, int M, int I);
    void (*swiglu_backward)(real *dgate, real *dup, real *drow_scale, const real *dact, const real *gate,
                            const real *up, const real *row_scale, int M, int I);
    void (*softmax_forward)(real *y, const real *x, int N, int C);
    void (*softmax_backward)(real *dx, const real *y, const real *dy, int N, int C);
    void (*cross_entropy_forward)(real *losses, real *lse, const real *logits, const int32_t *targets, int N,
                                  int V);
    void (*cross_entropy_backward)(real *dlogits, const real *logits, const real *lse, const int32_t *targets,
                                   const real *weight, int N, int V);
    void (*adamw_update)(real *p, const real *g, real *m, real *v, size_t n, int decay, const AdamWStep *h);
    void (*moe_router_logits)(real *logits, const real *x, const real *W, int N, int H, int E);
    void (*moe_route_tokens)(real *scores, real *aux_scores, int32_t *topk_idx, real *topk_probs,
                             const real *logits, const real *expert_bias, int N, const RouteShape *r);
    void (*moe_permute)(real *rows, real *row_values, const real *x, const real *choice_values,
                        const int32_t *token_of_row, const int32_t *row_of_choice, int R, int k, int H);
    void (*moe_unpermute)(real *out, real *choice_values, const real *rows, const real *row_values,
                          const int32_t *row_of_choice, int N, int k, int H, int accumulate);
    // ---- after an op: make its results visible to host code (NULL: nothing to do).
    // The model's own loops (router statistics, dispatch plan) read op outputs directly,
    // so the dispatcher finishes every op before returning.
    void (*finish)(void);
} OpsBackend;

extern const OpsBackend ops_cpu_backend;
#if defined(MT_HAVE_CUDA) && !defined(MT_DOUBLE)
extern const OpsBackend ops_cuda_backend;
#endif

// The backend every ops.h / gemm.h call goes to from now on (cpu until set).
void ops_select(const OpsBackend *b);
// fn (or NULL) runs after each op, on the calling thread: the trainer lets communication in
// flight progress there (comm_progress).
void ops_set_between_ops(void (*fn)(void));

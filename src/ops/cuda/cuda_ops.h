// cuda_ops.h — the cuda backend: every op of ops.h / gemm.h over device (or managed)
// memory, float storage. Each cuda_X has the signature and contract of X in ops.h or
// gemm.h (src/ops/backend.h lists them); the differences a caller sees:
//   * pointers are device-accessible (src/core/device.h allocates managed memory for the
//     model), except the grouped GEMMs' per-group rows/offsets/pointer arrays (host);
//   * ops are queued on the backend's stream (cuda_stream()); cuda_finish() waits for
//     them. Results are deterministic: no atomics feed a result, every reduction runs in
//     a fixed order, so two runs give the same bits;
//   * GEMMs compute in fp32, or with bf16 inputs and fp32 accumulation after
//     cuda_set_gemm_bf16(1) (--bf16).
// Compiled by nvcc (src/ops/cuda/*.cu) when the Makefile finds the toolkit.
#pragma once
#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- context (context.cu) ------------------------------------------------------------
// 1 when a CUDA device can be used (the driver answers and has at least one device).
int cuda_device_count(void);
// Selects device `index` (a rank's local GPU), creates the stream and cuBLAS handle.
void cuda_init(int index);
void cuda_finish(void);                  // waits for the stream
void cuda_set_gemm_bf16(int on);         // GEMM inputs rounded to bf16, fp32 accumulation
const char *cuda_device_name(void);      // after cuda_init
double cuda_memory_free_bytes(void);     // free memory of the device, after cuda_init
// Device memory: cuda_malloc_managed returns zeroed managed memory (host code can read
// and write it after cuda_finish); cuda_free releases it (NULL is ignored).
void *cuda_malloc_managed(size_t bytes);
void cuda_free(void *p);
// Plain device memory and copies, for the op checks and the backend's own scratch.
void *cuda_malloc(size_t bytes);
void cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
void cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);
void cuda_memset(void *dst, int byte, size_t bytes);

// ---- gemm.cu -------------------------------------------------------------------------
void cuda_gemm(int trans_a, int trans_b, int M, int N, int K, real alpha, const real *A, int lda,
               const real *B, int ldb, real beta, real *C, int ldc);
void cuda_gemm_grouped(int trans_a, int trans_b, int groups, const int *rows, int N, int K, real alpha,
                       const real *A, const size_t *a_offsets, int lda, const real *const *B_ptrs, int ldb,
                       real beta, real *C, const size_t *c_offsets, int ldc);
void cuda_gemm_grouped_wgrad(int groups, const int *rows, int out, int in, real alpha, const real *dY,
                             const size_t *dy_offsets, const real *X, const size_t *x_offsets, real *const *W_ptrs);
void cuda_linear_forward(real *y, const real *x, const real *W, int N, int in, int out);
void cuda_linear_backward(real *dx, real *dW, const real *dy, const real *x, const real *W, int N, int in,
                          int out);

// ---- elementwise.cu, norm.cu, loss.cu, optimizer.cu ------------------------------------
void cuda_vec_copy(real *dst, const real *src, size_t n);
void cuda_vec_zero(real *x, size_t n);
void cuda_vec_add(real *y, const real *x, size_t n);
void cuda_vec_scale(real *x, real s, size_t n);
double cuda_vec_sum_squares(const real *x, size_t n);
void cuda_embedding_forward(real *out, const int32_t *tokens, const real *table, int N, int C);
void cuda_embedding_backward(real *dtable, const real *dout, const int32_t *tokens, int N, int C);
void cuda_rmsnorm_forward(real *y, real *rstd, const real *x, const real *w, int N, int C, real eps);
void cuda_rmsnorm_backward(real *dx, real *dw, const real *dy, const real *x, const real *w, const real *rstd,
                           int N, int C);
void cuda_rope_forward(real *x, const real *cos_sin, const TokenLayout *t, const RopeLayout *l);
void cuda_rope_backward(real *dx, const real *cos_sin, const TokenLayout *t, const RopeLayout *l);
void cuda_clamp_forward(real *y, const real *x, size_t n, real limit);
void cuda_clamp_backward(real *d, const real *x, size_t n, real limit);
void cuda_swiglu_forward(real *act, const real *gate, const real *up, const real *row_scale, int M, int I);
void cuda_swiglu_backward(real *dgate, real *dup, real *drow_scale, const real *dact, const real *gate,
                          const real *up, const real *row_scale, int M, int I);
void cuda_softmax_forward(real *y, const real *x, int N, int C);
void cuda_softmax_backward(real *dx, const real *y, const real *dy, int N, int C);
void cuda_cross_entropy_forward(real *losses, real *lse, const real *logits, const int32_t *targets, int N,
                                int V);
void cuda_cross_entropy_backward(real *dlogits, const real *logits, const real *lse, const int32_t *targets,
                                 const real *weight, int N, int V);
void cuda_adamw_update(real *p, const real *g, real *m, real *v, size_t n, int decay, const AdamWStep *h);

// ---- attention.cu ----------------------------------------------------------------------
void cuda_attention_forward(real *out, real *lse, const real *q, const real *k, const real *v,
                            const AttentionShape *s);
void cuda_attention_backward(real *dq, real *dk, real *dv, const real *dout, const real *out, const real *lse,
                             const real *q, const real *k, const real *v, const AttentionShape *s);
// ---- attention_merge.cu ----------------------------------------------------------------
void cuda_attention_merge(real *out, real *lse, const real *out_block, const real *lse_block,
                          const AttentionShape *s);

// ---- the plugin (backend_cuda.c) ------------------------------------------------------
// The cuda backend is built as $(BUILD)/libmoetron_cuda.so; src/core/device.c loads it for
// --device cuda and finds everything through this one symbol, so cpu runs never load the
// CUDA libraries.
typedef struct OpsBackend OpsBackend;
typedef struct CudaPlugin {
    int (*device_count)(void);
    void (*init)(int index);
    void (*finish)(void);
    void (*set_gemm_bf16)(int on);
    const char *(*device_name)(void);
    double (*memory_free_bytes)(void);
    void *(*malloc_managed)(size_t bytes);
    void (*free)(void *p);
    const OpsBackend *ops;
} CudaPlugin;
#define CUDA_PLUGIN_SYMBOL "moetron_cuda_plugin"
extern const CudaPlugin moetron_cuda_plugin;

#ifdef __cplusplus
}
#endif

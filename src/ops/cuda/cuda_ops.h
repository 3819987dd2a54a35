// cuda_ops.h — the cuda backend: every op of ops.h / gemm.h over device (or managed)
// memory, float storage. Each cuda_X has the signature and contract of X in ops.h or
// gemm.h (src/ops/backend.h lists them); the differences a caller sees:
//   * pointers are device memory (src/core/device.h allocates it through the plugin);
//     host-side parameters come by value or in small structs read at launch;
//   * ops are queued on the backend's stream (cuda_stream()) and return at once; a
//     download (cuda_download) or cuda_finish() waits for them. Results are deterministic: no atomics feed a result, every reduction runs in
//     a fixed order, so two runs give the same bits;
//   * GEMMs compute in fp32, or with bf16 inputs and fp32 accumulation after
//     cuda_set_gemm_inputs(GEMM_INPUTS_BF16) (--bf16), or fp16 inputs (--fp16).
// Compiled by nvcc (src/ops/cuda/*.cu) when the Makefile finds the toolkit.
#pragma once
#include "ops/op_list.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- context (context.cu) ------------------------------------------------------------
// 1 when a CUDA device can be used (the driver answers and has at least one device).
int cuda_device_count(void);
// Selects device `index` (a rank's local GPU), creates the stream and cuBLAS handle.
void cuda_init(int index);
void cuda_finish(void);                  // waits for the stream
void cuda_set_gemm_inputs(int inputs);   // a GemmInputs: GEMM inputs rounded to bf16 / fp16, fp32 accumulation
const char *cuda_device_name(void);      // after cuda_init
double cuda_memory_free_bytes(void);     // free memory of the device, after cuda_init
// Device memory (never managed memory), from a stream-ordered pool: cuda_malloc's bytes
// are unset, cuda_malloc_zeroed's zero in stream order; cuda_free returns a block in
// stream order (NULL is ignored). Host code cannot address it: it goes through copies.
void *cuda_malloc(size_t bytes);
void *cuda_malloc_zeroed(size_t bytes);
void cuda_free(void *p);
// Zeroed page-locked host memory (the GPU copies to and from it at full speed), and its release.
void *cuda_host_calloc(size_t bytes);
void cuda_host_free(void *p);
// The model's copies, through pinned staging (context.cu): cuda_upload returns once the
// host bytes are staged (the device gets them in stream order), cuda_download once the
// bytes are in host memory — it waits for the ops queued before it (a sync point).
void cuda_upload(void *dst, const void *host, size_t bytes);
void cuda_download(void *host, const void *src, size_t bytes);
// Events on the stream for --profile: a mark's index (-1 when all are in use), the
// seconds between two marks (waits for the later), and all marks free again.
int cuda_timer_mark(void);
double cuda_timer_seconds(int from, int to);
void cuda_timer_reset(void);
// Blocking copies and fills for the op checks and the backend's own scratch.
void cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
void cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);
void cuda_memset(void *dst, int byte, size_t bytes);
// device_copy (core/device.h): device or host memory on either side, queued on the compute
// stream; waits for it when either side is host memory.
void cuda_copy(void *dst, const void *src, size_t bytes);

// ---- every op of src/ops/op_list.h as cuda_<name> (gemm.cu, elementwise.cu, norm.cu,
// loss.cu, optimizer.cu, attention.cu, attention_merge.cu, moe.cu). The MoE ops: no
// atomics, every output element has one owning thread (or warp), which computes it in
// the cpu backend's order.
MT_OPS(MT_OP_PROTO_CUDA)

// ---- the plugin (backend_cuda.c) ------------------------------------------------------
// The cuda backend is built as $(BUILD)/libmoetron_cuda.so; src/core/device.c loads it for
// --device cuda and finds everything through this one symbol, so cpu runs never load the
// CUDA libraries.
typedef struct OpsBackend OpsBackend;
typedef struct CudaPlugin {
    int (*device_count)(void);
    void (*init)(int index);
    void (*finish)(void);
    void (*set_gemm_inputs)(int inputs);
    const char *(*device_name)(void);
    double (*memory_free_bytes)(void);
    void *(*malloc_zeroed)(size_t bytes);
    void (*free)(void *p);
    void *(*host_calloc)(size_t bytes);
    void (*host_free)(void *p);
    void (*upload)(void *dst, const void *host, size_t bytes);
    void (*download)(void *host, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    const OpsBackend *ops;
} CudaPlugin;
#define CUDA_PLUGIN_SYMBOL "moetron_cuda_plugin"
extern const CudaPlugin moetron_cuda_plugin;

#ifdef __cplusplus
}
#endif

// backend_cuda.c — the cuda backend's op table (src/ops/backend.h) and the plugin entry
// point src/core/device.c looks up; part of libmoetron_cuda.so (MT_HAVE_CUDA builds).
#if defined(MT_HAVE_CUDA) && !defined(MT_DOUBLE)
#include "ops/backend.h"
#include "ops/cuda/cuda_ops.h"

static const BackendTimer cuda_timer = {
    .mark = cuda_timer_mark, .seconds = cuda_timer_seconds, .reset = cuda_timer_reset};

const OpsBackend ops_cuda_backend = {
    .name = "cuda",
    MT_OPS(MT_OP_ENTRY_CUDA)  // .gemm = cuda_gemm, ... for every op of op_list.h
    .finish = cuda_finish,
    .timer = &cuda_timer,
};

const CudaPlugin moetron_cuda_plugin = {
    .device_count = cuda_device_count,
    .init = cuda_init,
    .finish = cuda_finish,
    .set_gemm_inputs = cuda_set_gemm_inputs,
    .device_name = cuda_device_name,
    .memory_free_bytes = cuda_memory_free_bytes,
    .malloc_zeroed = cuda_malloc_zeroed,
    .free = cuda_free,
    .host_calloc = cuda_host_calloc,
    .host_free = cuda_host_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .ops = &ops_cuda_backend,
};
#endif

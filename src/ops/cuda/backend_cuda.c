// backend_cuda.c — the cuda backend's op table (src/ops/backend.h) and the plugin entry
// point src/core/device.c looks up; part of libmoetron_cuda.so (MT_HAVE_CUDA builds).
#if defined(MT_HAVE_CUDA) && !defined(MT_DOUBLE)
#include "ops/backend.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_moe.h"

const OpsBackend ops_cuda_backend = {
    .name = "cuda",
    .gemm = cuda_gemm,
    .gemm_grouped = cuda_gemm_grouped,
    .gemm_grouped_wgrad = cuda_gemm_grouped_wgrad,
    .linear_forward = cuda_linear_forward,
    .linear_backward = cuda_linear_backward,
    .vec_copy = cuda_vec_copy,
    .vec_zero = cuda_vec_zero,
    .vec_add = cuda_vec_add,
    .vec_scale = cuda_vec_scale,
    .vec_sum_squares = cuda_vec_sum_squares,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .clamp_forward = cuda_clamp_forward,
    .clamp_backward = cuda_clamp_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_merge = cuda_attention_merge,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .softmax_forward = cuda_softmax_forward,
    .softmax_backward = cuda_softmax_backward,
    .cross_entropy_forward = cuda_cross_entropy_forward,
    .cross_entropy_backward = cuda_cross_entropy_backward,
    .adamw_update = cuda_adamw_update,
    .moe_router_logits = cuda_moe_router_logits,
    .moe_route_tokens = cuda_moe_route_tokens,
    .moe_permute = cuda_moe_permute,
    .moe_unpermute = cuda_moe_unpermute,
    .finish = cuda_finish,
};

const CudaPlugin moetron_cuda_plugin = {
    .device_count = cuda_device_count,
    .init = cuda_init,
    .finish = cuda_finish,
    .set_gemm_bf16 = cuda_set_gemm_bf16,
    .device_name = cuda_device_name,
    .memory_free_bytes = cuda_memory_free_bytes,
    .malloc_managed = cuda_malloc_managed,
    .free = cuda_free,
    .ops = &ops_cuda_backend,
};
#endif

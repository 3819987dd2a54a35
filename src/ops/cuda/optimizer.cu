// optimizer.cu — AdamW for the cuda backend, with the contract of ops.h and the
// arithmetic of ops/adamw_math.h (shared with the cpu): the step's constants are folded
// in double on the host and rounded to float, the per-element update runs in float.
#include "ops/adamw_math.h"
#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/cuda_internal.h"

#include <math.h>

constexpr int ADAMW_THREADS = 256;

// p, m, v (n) updated in place from g (n); thread → elements i, i + stride, ...
__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, AdamWConstants k) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float mi, vi;
        adamw_moments(&mi, &vi, g[i], m[i], v[i], &k);
        m[i] = mi;
        v[i] = vi;
        p[i] = adamw_param(p[i], mi, vi, &k);
    }
}

void cuda_adamw_update(real *p, const real *g, real *m, real *v, size_t n, int decay, const AdamWStep *h) {
    if (n == 0) return;
    AdamWConstants k = adamw_constants(decay, h);
    adamw_kernel<<<cuda_blocks(n, ADAMW_THREADS), ADAMW_THREADS, 0, cuda_stream()>>>(p, g, m, v, n, k);
    CUDA_CHECK_LAUNCH();
}

// ---- moments in narrower types (adamw_update_scaled) ---------------------------------------

// The new moments of element i, decoded with the scales the step starts from.
__device__ static void scaled_moments(float *mi, float *vi, const float *g, const void *m, const void *v, size_t i,
                                      const MomentScales *s, MomentDtype dm, MomentDtype dv, const AdamWConstants *k) {
    float m_old = moment_load(m, i, dm, moment_factors(dm, s->scale[0]));
    float v_old = moment_load(v, i, dv, moment_factors(dv, s->scale[1]));
    adamw_moments(mi, vi, g[i], m_old, v_old, k);
}

// s->absmax = the new moments' largest magnitudes: each block's maxima in a fixed tree,
// then an atomic maximum on the bits (non-negative floats order as their bits do).
__global__ void adamw_absmax_kernel(const float *g, const void *m, const void *v, MomentScales *s, size_t n,
                                    MomentDtype dm, MomentDtype dv, AdamWConstants k) {
    float max_m = 0, max_v = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float mi, vi;
        scaled_moments(&mi, &vi, g, m, v, i, s, dm, dv, &k);
        max_m = fmaxf(max_m, fabsf(mi));
        max_v = fmaxf(max_v, fabsf(vi));
    }
    max_m = block_max(max_m);
    max_v = block_max(max_v);
    if (threadIdx.x == 0) {
        atomicMax((unsigned *)&s->absmax[0], __float_as_uint(max_m));
        atomicMax((unsigned *)&s->absmax[1], __float_as_uint(max_v));
    }
}

// The same new moments, stored with the scales of s->absmax, and the parameters.
__global__ void adamw_store_kernel(float *p, const float *g, void *m, void *v, MomentScales *s, size_t n,
                                   MomentDtype dm, MomentDtype dv, AdamWConstants k) {
    MomentFactors new_m = moment_factors(dm, moment_scale(dm, s->absmax[0]));
    MomentFactors new_v = moment_factors(dv, moment_scale(dv, s->absmax[1]));
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float mi, vi;
        scaled_moments(&mi, &vi, g, m, v, i, s, dm, dv, &k);
        moment_store(m, i, dm, new_m, mi);
        moment_store(v, i, dv, new_v, vi);
        p[i] = adamw_param(p[i], mi, vi, &k);
    }
}

// Last, once every element was stored with the old scales' decoding: the new scales.
__global__ void adamw_scales_kernel(MomentScales *s, MomentDtype dm, MomentDtype dv) {
    s->scale[0] = moment_scale(dm, s->absmax[0]);
    s->scale[1] = moment_scale(dv, s->absmax[1]);
}

void cuda_adamw_update_scaled(real *p, const real *g, void *m, void *v, MomentScales *s, size_t n, int decay,
                              const AdamWStep *h, const MomentDtype dtype[ADAMW_MOMENTS]) {
    AdamWConstants k = adamw_constants(decay, h);
    unsigned blocks = cuda_blocks(n ? n : 1, ADAMW_THREADS);
    CUDA_CHECK(cudaMemsetAsync(s->absmax, 0, sizeof(s->absmax), cuda_stream()));
    if (n) {
        adamw_absmax_kernel<<<blocks, ADAMW_THREADS, 0, cuda_stream()>>>(g, m, v, s, n, dtype[0], dtype[1], k);
        CUDA_CHECK_LAUNCH();
        adamw_store_kernel<<<blocks, ADAMW_THREADS, 0, cuda_stream()>>>(p, g, m, v, s, n, dtype[0], dtype[1], k);
        CUDA_CHECK_LAUNCH();
    }
    adamw_scales_kernel<<<1, 1, 0, cuda_stream()>>>(s, dtype[0], dtype[1]);
    CUDA_CHECK_LAUNCH();
}

// parallel.cu — cuda ops of ops_parallel.h (tensor/context-parallel gathers, slices, partial sums).
#include "ops/cuda/cuda_internal.h"

constexpr int FLAT_THREADS = 256;

void cuda_rows_copy_strided(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width, int rows) {
    if (rows <= 0 || width == 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, (size_t)rows, cudaMemcpyDefault, cuda_stream()));
}

__global__ void lse_reset_kernel(float *lse, size_t n) {
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) lse[j] = -INFINITY;
}

void cuda_lse_reset(real *lse, size_t n) {
    if (n == 0) return;
    lse_reset_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(lse, n);
    CUDA_CHECK_LAUNCH();
}

// One thread per (row, column): the heads summed in order from 0.
__global__ void heads_sum_kernel(float *dst, const float *src, int rows, int heads, size_t head_pitch, int width) {
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= (size_t)rows * width) return;
    size_t n = j / width, i = j % width;
    float sum = 0.0f;
    for (int h = 0; h < heads; h++) sum += src[(n * heads + h) * head_pitch + i];
    dst[j] = sum;
}

void cuda_heads_sum(real *dst, const real *src, int rows, int heads, size_t head_pitch, int width) {
    size_t n = (size_t)rows * width;
    if (n == 0) return;
    heads_sum_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(dst, src, rows, heads,
                                                                                         head_pitch, width);
    CUDA_CHECK(cudaGetLastError());
}

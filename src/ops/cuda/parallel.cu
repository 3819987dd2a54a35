// parallel.cu — cuda ops of ops_parallel.h (tensor/context-parallel gathers, slices, partial sums).
#include "ops/cuda/cuda_internal.h"

constexpr int FLAT_THREADS = 256;

void cuda_rows_copy_strided(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width, int rows) {
    if (rows <= 0 || width == 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, (size_t)rows, cudaMemcpyDefault, cuda_stream()));
}

// A thread per 4-byte word of the moved rows when the rows are whole words (the per-choice
// int32 and fp32 values), else per byte, striding over the grid (cuda_blocks caps it);
// `scatter` says which side the index names.
template <typename Word>
__global__ void rows_indexed_kernel(Word *dst, const Word *src, const int32_t *index, int rows, size_t words,
                                    int scatter) {
    size_t n = (size_t)rows * words;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x) {
        size_t i = j / words, w = j % words, named = (size_t)index[i];
        if (scatter) dst[named * words + w] = src[i * words + w];
        else dst[i * words + w] = src[named * words + w];
    }
}

static void rows_indexed(void *dst, const void *src, const int32_t *index, int rows, size_t width, int scatter) {
    if (rows <= 0 || width == 0) return;
    int whole_words = width % 4 == 0 && (uintptr_t)dst % 4 == 0 && (uintptr_t)src % 4 == 0;
    size_t words = whole_words ? width / 4 : width, n = (size_t)rows * words;
    if (whole_words)
        rows_indexed_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(
            (uint32_t *)dst, (const uint32_t *)src, index, rows, words, scatter);
    else
        rows_indexed_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(
            (uint8_t *)dst, (const uint8_t *)src, index, rows, words, scatter);
    CUDA_CHECK_LAUNCH();
}

void cuda_rows_gather(void *dst, const void *src, const int32_t *index, int rows, size_t width) {
    rows_indexed(dst, src, index, rows, width, 0);
}

void cuda_rows_scatter(void *dst, const void *src, const int32_t *index, int rows, size_t width) {
    rows_indexed(dst, src, index, rows, width, 1);
}

__global__ void lse_reset_kernel(float *lse, size_t n) {
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
        lse[j] = -INFINITY;
}

void cuda_lse_reset(real *lse, size_t n) {
    if (n == 0) return;
    lse_reset_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(lse, n);
    CUDA_CHECK_LAUNCH();
}

// A thread per element of dst (batch, cols, rows), striding over the grid.
__global__ void batched_transpose_kernel(float *dst, const float *src, int batch, int rows, int cols) {
    size_t plane = (size_t)rows * cols, n = (size_t)batch * plane;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x) {
        size_t b = j / plane, c = j % plane / rows, r = j % rows;
        dst[j] = src[b * plane + r * cols + c];
    }
}

void cuda_batched_transpose(real *dst, const real *src, int batch, int rows, int cols) {
    size_t n = (size_t)batch * rows * cols;
    if (n == 0) return;
    batched_transpose_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(dst, src, batch, rows,
                                                                                                 cols);
    CUDA_CHECK_LAUNCH();
}

// A thread per (row, column), striding over the grid: the heads summed in order from 0.
__global__ void heads_sum_kernel(float *dst, const float *src, int rows, int heads, size_t head_pitch, int width) {
    size_t count = (size_t)rows * width;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < count; j += (size_t)gridDim.x * blockDim.x) {
        size_t n = j / width, i = j % width;
        float sum = 0.0f;
        for (int h = 0; h < heads; h++) sum += src[(n * heads + h) * head_pitch + i];
        dst[j] = sum;
    }
}

void cuda_heads_sum(real *dst, const real *src, int rows, int heads, size_t head_pitch, int width) {
    size_t n = (size_t)rows * width;
    if (n == 0) return;
    heads_sum_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(dst, src, rows, heads,
                                                                                         head_pitch, width);
    CUDA_CHECK(cudaGetLastError());
}

// block_reduce.cuh — what the row kernels of elementwise.cu, norm.cu and loss.cu share:
// block-wide sum and max in a fixed tree order, the launch shapes of row kernels, and a
// kept device scratch buffer.
//
// Determinism: a reduction's order depends only on blockDim (always a multiple of 32,
// chosen from the sizes of the op, never from the device or timing): each warp folds
// its lanes with shuffles in a fixed butterfly order, then warp 0 folds the per-warp
// results the same way. Two runs of the same op give the same bits.
#pragma once
#include "ops/cuda/cuda_internal.h"

static_assert(sizeof(real) == sizeof(float), "the cuda backend stores float");

constexpr int CUDA_WARP = 32;
constexpr int CUDA_MAX_ROWS_Y = 65535;

struct SumOp {
    __device__ double operator()(double a, double b) const { return a + b; }
};
struct MaxOp {  // NaN-oblivious like row_max on the cpu: keeps a unless b is larger
    __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};

// After it, lane 0 holds the fold of the warp's 32 values (lane i + offset into lane i).
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
    for (int offset = CUDA_WARP / 2; offset > 0; offset >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
    return v;
}

// The fold of one value per thread over the whole block, returned to every thread.
// blockDim.x must be a multiple of 32; every thread of the block must call it.
// `identity` fills the lanes of warp 0 beyond the number of warps.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity) {
    __shared__ T warp_result[CUDA_WARP];
    int lane = threadIdx.x % CUDA_WARP, warp = threadIdx.x / CUDA_WARP, warps = blockDim.x / CUDA_WARP;
    v = warp_reduce(v, op);
    if (lane == 0) warp_result[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = warp_reduce(lane < warps ? warp_result[lane] : identity, op);
        if (lane == 0) warp_result[0] = v;
    }
    __syncthreads();
    T result = warp_result[0];
    __syncthreads();  // the next call may overwrite warp_result
    return result;
}

__device__ __forceinline__ double block_sum(double v) { return block_reduce(v, SumOp(), 0.0); }
__device__ __forceinline__ float block_max(float v) { return block_reduce(v, MaxOp(), v); }

// Threads of a block that walks a row of `width` elements: width rounded up to whole
// warps, at most `max_threads` (a multiple of 32).
static inline unsigned row_threads(long width, unsigned max_threads) {
    long t = (width + CUDA_WARP - 1) / CUDA_WARP * CUDA_WARP;
    return (unsigned)(t < CUDA_WARP ? CUDA_WARP : t > (long)max_threads ? (long)max_threads : t);
}

// The grid of a "column tiles × rows" kernel: x covers `cols` in tiles of `threads`,
// y walks the `rows` (grid-stride past 65535).
static inline dim3 tile_rows_grid(long rows, long cols, unsigned threads) {
    long tiles = (cols + threads - 1) / threads;
    long y = rows < CUDA_MAX_ROWS_Y ? rows : CUDA_MAX_ROWS_Y;
    return dim3((unsigned)(tiles ? tiles : 1), (unsigned)(y ? y : 1));
}

// A device buffer kept between calls and grown to the largest request (never shrunk).
// The ops of the backend run in order on cuda_stream(), so one buffer per file serves
// all of its ops; growing frees the old one with cudaFree, which waits for the device.
struct CudaScratch {
    void *ptr;
    size_t bytes;
};
static inline void *scratch_reserve(CudaScratch *s, size_t bytes) {
    if (bytes > s->bytes) {
        cuda_free(s->ptr);
        s->ptr = cuda_malloc(bytes);
        s->bytes = bytes;
    }
    return s->ptr;
}
// The n elements at x, stored as `store` (gemm.h), as fp32 in device memory: x itself, or
// widened (exactly) into *s when bf16.
static inline const float *scratch_widened(CudaScratch *s, const void *x, Storage store, size_t n) {
    if (store == STORE_FP32) return (const float *)x;
    float *widened = (float *)scratch_reserve(s, (n ? n : 1) * sizeof(float));
    cuda_bf16_unpack(widened, (const float *)x, n);
    return widened;
}
// Offsets into a scratch block, each part aligned to 256 bytes.
static inline size_t scratch_align(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

// quantize.cu — the cuda backend's quantizer ops (contracts in ops_quantize.h), with the
// arithmetic of ops/quantize_math.h, the cpu backend's own: the same bits. A tensor's amax
// is a fold of exact maxima (its order cannot change the result), its last step an atomic
// maximum on the bits, which order as non-negative floats (and NaN above infinity) do.
// Tiled quantizers run one warp per tile: the lanes fold the tile's amax, exchange it with
// shuffles, and each encodes its share of the tile's elements.
#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/cuda_internal.h"
#include "ops/quantize_math.h"

constexpr int QUANT_THREADS = 256;

// The max of two amaxes, NaN when either is (a skipped NaN never reaches it).
struct AmaxOp {
    __device__ float operator()(float a, float b) const {
        return quant_isnan(a) || quant_isnan(b) ? quant_nan() : (a >= b ? a : b);
    }
};

// Every lane's amax folded over the warp, returned to every lane.
__device__ __forceinline__ float warp_amax(float v) {
    for (int offset = CUDA_WARP / 2; offset > 0; offset >>= 1) v = AmaxOp()(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// The amax of tile q (row pitch cols) on every lane of the warp.
__device__ float tile_amax(const float *x, int cols, QuantTile q, AmaxNan nan, int lane) {
    int width = q.c1 - q.c0, count = (q.r1 - q.r0) * width;
    float amax = 0.0f;
    for (int k = lane; k < count; k += CUDA_WARP)
        amax = quant_amax_fold(amax, x[(size_t)(q.r0 + k / width) * cols + q.c0 + k % width], nan);
    return warp_amax(amax);
}

static unsigned tile_blocks(long tiles) { return cuda_blocks((size_t)tiles * CUDA_WARP, QUANT_THREADS); }

static long tile_count(int rows, int cols, int tile_rows, int tile_cols) {
    return (long)quant_blocks(rows, tile_rows) * quant_blocks(cols, tile_cols);
}

#define FOR_EACH_INDEX(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
// The warp's tiles t of `tiles`, one warp each, and the lane within it.
#define FOR_EACH_TILE(t, tiles, lane)                                                                    \
    int lane = threadIdx.x % CUDA_WARP;                                                                  \
    for (long t = (blockIdx.x * (long)blockDim.x + threadIdx.x) / CUDA_WARP; t < (tiles);               \
         t += (long)gridDim.x * blockDim.x / CUDA_WARP)

// ---- FP8 per tensor ---------------------------------------------------------------------------

__global__ void amax_kernel(float *amax, const float *x, size_t n, AmaxNan nan) {
    float m = 0.0f;
    FOR_EACH_INDEX(i, n) m = quant_amax_fold(m, x[i], nan);
    m = block_reduce(m, AmaxOp(), 0.0f);
    if (threadIdx.x == 0) atomicMax((unsigned *)amax, float_bits(m));
}

void cuda_quant_amax(float *amax, const float *x, size_t n, AmaxNan nan) {
    CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), cuda_stream()));
    if (n == 0) return;
    amax_kernel<<<cuda_blocks(n, QUANT_THREADS), QUANT_THREADS, 0, cuda_stream()>>>(amax, x, n, nan);
    CUDA_CHECK_LAUNCH();
}

__global__ void scale_from_amax_kernel(float *scale, float *scale_inv, const float *amax, Fp8ScaleParams p) {
    float s = fp8_amax_scale(amax[0], fp8_max(p.format), p.pow2_scales, p.amax_epsilon, QUANT_F32_MAX);
    scale[0] = s;
    scale_inv[0] = fp8_scale_inv(s);
}

void cuda_fp8_scale_from_amax(float *scale, float *scale_inv, const float *amax, const Fp8ScaleParams *p) {
    scale_from_amax_kernel<<<1, 1, 0, cuda_stream()>>>(scale, scale_inv, amax, *p);
    CUDA_CHECK_LAUNCH();
}

__global__ void delayed_scale_kernel(float *scale, float *scale_inv, const float *history, const float *prev,
                                     Fp8DelayedParams p) {
    float s = fp8_history_scale(history, p.history_len, &p, prev[0]);
    scale[0] = s;
    scale_inv[0] = fp8_scale_inv(s);
}

void cuda_fp8_delayed_scale(float *scale, float *scale_inv, const float *history, const float *prev,
                            const Fp8DelayedParams *p) {
    quant_check_history("fp8_delayed_scale", p->history_len);
    delayed_scale_kernel<<<1, 1, 0, cuda_stream()>>>(scale, scale_inv, history, prev, *p);
    CUDA_CHECK_LAUNCH();
}

__global__ void fp8_quantize_kernel(uint8_t *codes, const float *x, const float *scale, size_t n, Fp8Format f) {
    float s = scale[0];
    FOR_EACH_INDEX(i, n) codes[i] = fp8_code(f, x[i], s);
}

void cuda_fp8_quantize_tensor(uint8_t *codes, const float *x, const float *scale, size_t n, Fp8Format f) {
    if (n == 0) return;
    fp8_quantize_kernel<<<cuda_blocks(n, QUANT_THREADS), QUANT_THREADS, 0, cuda_stream()>>>(codes, x, scale, n, f);
    CUDA_CHECK_LAUNCH();
}

__global__ void fp8_dequantize_kernel(float *y, const uint8_t *codes, const float *scale_inv, size_t n, Fp8Format f) {
    float s = scale_inv[0];
    FOR_EACH_INDEX(i, n) y[i] = fp8_value(f, codes[i], s);
}

void cuda_fp8_dequantize_tensor(float *y, const uint8_t *codes, const float *scale_inv, size_t n, Fp8Format f) {
    if (n == 0) return;
    fp8_dequantize_kernel<<<cuda_blocks(n, QUANT_THREADS), QUANT_THREADS, 0, cuda_stream()>>>(y, codes, scale_inv, n, f);
    CUDA_CHECK_LAUNCH();
}

// A 32×32 tile of codes per block, staged in shared memory so that both the reads (along
// a row of codes) and the writes (along a row of t) are coalesced; threads (32, 8), each
// moving 4 elements of its column of the tile.
constexpr int TRANSPOSE_TILE = 32, TRANSPOSE_ROWS = 8;

__global__ void fp8_transpose_kernel(uint8_t *t, const uint8_t *codes, int rows, int cols) {
    __shared__ uint8_t tile[TRANSPOSE_TILE][TRANSPOSE_TILE + 1];
    int c0 = blockIdx.x * TRANSPOSE_TILE;
    for (long r0 = blockIdx.y * (long)TRANSPOSE_TILE; r0 < rows; r0 += gridDim.y * (long)TRANSPOSE_TILE) {
        for (int i = threadIdx.y; i < TRANSPOSE_TILE; i += TRANSPOSE_ROWS) {
            long r = r0 + i;
            int c = c0 + threadIdx.x;
            if (r < rows && c < cols) tile[i][threadIdx.x] = codes[(size_t)r * cols + c];
        }
        __syncthreads();
        for (int i = threadIdx.y; i < TRANSPOSE_TILE; i += TRANSPOSE_ROWS) {
            long r = r0 + threadIdx.x;
            int c = c0 + i;
            if (r < rows && c < cols) t[(size_t)c * rows + r] = tile[threadIdx.x][i];
        }
        __syncthreads();
    }
}

void cuda_fp8_transpose(uint8_t *t, const uint8_t *codes, int rows, int cols) {
    quant_check_shape("fp8_transpose", rows, cols, 0);
    if (rows == 0 || cols == 0) return;
    int row_tiles = quant_blocks(rows, TRANSPOSE_TILE);
    dim3 grid((unsigned)quant_blocks(cols, TRANSPOSE_TILE), (unsigned)(row_tiles < CUDA_MAX_ROWS_Y ? row_tiles : CUDA_MAX_ROWS_Y));
    fp8_transpose_kernel<<<grid, dim3(TRANSPOSE_TILE, TRANSPOSE_ROWS), 0, cuda_stream()>>>(t, codes, rows, cols);
    CUDA_CHECK_LAUNCH();
}

// ---- FP8 in tiles -------------------------------------------------------------------------------

__global__ void fp8_block_quantize_kernel(uint8_t *codes, float *scale_inv, const float *x, int rows, int cols,
                                          long tiles, Fp8BlockParams p) {
    FOR_EACH_TILE(t, tiles, lane) {
        QuantTile q = quant_tile(t, rows, cols, p.tile_rows, FP8_BLOCK);
        float scale = fp8_block_scale(tile_amax(x, cols, q, AMAX_IGNORE_NAN, lane), &p);
        if (lane == 0) scale_inv[t] = fp8_scale_inv(scale);
        int width = q.c1 - q.c0, count = (q.r1 - q.r0) * width;
        for (int k = lane; k < count; k += CUDA_WARP) {
            size_t i = (size_t)(q.r0 + k / width) * cols + q.c0 + k % width;
            codes[i] = fp8_code(p.format, x[i], scale);
        }
    }
}

void cuda_fp8_block_quantize(uint8_t *codes, float *scale_inv, const float *x, int rows, int cols,
                             const Fp8BlockParams *p) {
    quant_check_shape("fp8_block_quantize", rows, cols, 0);
    quant_check_tile_rows("fp8_block_quantize", p->tile_rows, 1, FP8_BLOCK);
    long tiles = tile_count(rows, cols, p->tile_rows, FP8_BLOCK);
    if (tiles == 0) return;
    fp8_block_quantize_kernel<<<tile_blocks(tiles), QUANT_THREADS, 0, cuda_stream()>>>(codes, scale_inv, x, rows,
                                                                                        cols, tiles, *p);
    CUDA_CHECK_LAUNCH();
}

__global__ void fp8_block_dequantize_kernel(float *y, const uint8_t *codes, const float *scale_inv, int rows,
                                            int cols, Fp8BlockParams p) {
    int per_row = quant_blocks(cols, FP8_BLOCK);
    FOR_EACH_INDEX(i, (size_t)rows * cols) {
        size_t r = i / cols, c = i % cols;
        y[i] = fp8_value(p.format, codes[i], scale_inv[(r / p.tile_rows) * per_row + c / FP8_BLOCK]);
    }
}

void cuda_fp8_block_dequantize(float *y, const uint8_t *codes, const float *scale_inv, int rows, int cols,
                               const Fp8BlockParams *p) {
    quant_check_shape("fp8_block_dequantize", rows, cols, 0);
    quant_check_tile_rows("fp8_block_dequantize", p->tile_rows, 1, FP8_BLOCK);
    size_t n = (size_t)rows * cols;
    if (n == 0) return;
    fp8_block_dequantize_kernel<<<cuda_blocks(n, QUANT_THREADS), QUANT_THREADS, 0, cuda_stream()>>>(
        y, codes, scale_inv, rows, cols, *p);
    CUDA_CHECK_LAUNCH();
}

// ---- MXFP8 --------------------------------------------------------------------------------------

__global__ void mxfp8_quantize_kernel(uint8_t *codes, uint8_t *scales, const float *x, int rows, int cols,
                                      long blocks, Fp8Format f, MxScaleMode mode) {
    FOR_EACH_TILE(t, blocks, lane) {
        QuantTile q = quant_tile(t, rows, cols, 1, MX_BLOCK);
        uint8_t e = mx_scale(tile_amax(x, cols, q, AMAX_PROPAGATE_NAN, lane), f, mode);
        if (lane == 0) scales[t] = e;
        int c = q.c0 + lane;  // MX_BLOCK == CUDA_WARP: one element per lane
        if (c < q.c1) codes[(size_t)q.r0 * cols + c] = mx_code(x[(size_t)q.r0 * cols + c], e, f, mode);
    }
}

void cuda_mxfp8_quantize(uint8_t *codes, uint8_t *scales, const float *x, int rows, int cols, Fp8Format f,
                         MxScaleMode mode) {
    static_assert(MX_BLOCK == CUDA_WARP, "one MX block per warp, one element per lane");
    quant_check_shape("mxfp8_quantize", rows, cols, 0);
    long blocks = tile_count(rows, cols, 1, MX_BLOCK);
    if (blocks == 0) return;
    mxfp8_quantize_kernel<<<tile_blocks(blocks), QUANT_THREADS, 0, cuda_stream()>>>(codes, scales, x, rows, cols,
                                                                                     blocks, f, mode);
    CUDA_CHECK_LAUNCH();
}

__global__ void mxfp8_dequantize_kernel(float *y, const uint8_t *codes, const uint8_t *scales, int rows, int cols,
                                        Fp8Format f) {
    int per_row = quant_blocks(cols, MX_BLOCK);
    FOR_EACH_INDEX(i, (size_t)rows * cols) {
        size_t r = i / cols, c = i % cols;
        y[i] = mx_value(codes[i], scales[r * per_row + c / MX_BLOCK], f);
    }
}

void cuda_mxfp8_dequantize(float *y, const uint8_t *codes, const uint8_t *scales, int rows, int cols, Fp8Format f) {
    quant_check_shape("mxfp8_dequantize", rows, cols, 0);
    size_t n = (size_t)rows * cols;
    if (n == 0) return;
    mxfp8_dequantize_kernel<<<cuda_blocks(n, QUANT_THREADS), QUANT_THREADS, 0, cuda_stream()>>>(y, codes, scales,
                                                                                                 rows, cols, f);
    CUDA_CHECK_LAUNCH();
}

// ---- NVFP4 ---------------------------------------------------------------------------------------

__global__ void nvfp4_quantize_kernel(uint8_t *codes, uint8_t *scales, const float *x, const float *amax, int rows,
                                      int cols, long tiles, Nvfp4Params p) {
    float tensor_scale = nvfp4_tensor_scale(amax[0]);
    int per_row = quant_blocks(cols, NVFP4_BLOCK);
    FOR_EACH_TILE(t, tiles, lane) {
        QuantTile q = quant_tile(t, rows, cols, p.tile_rows, NVFP4_BLOCK);
        uint8_t s = nvfp4_block_scale(tile_amax(x, cols, q, AMAX_PROPAGATE_NAN, lane), tensor_scale);
        float m = nvfp4_multiplier(tensor_scale, s);
        int pairs = (q.c1 - q.c0) / 2, count = (q.r1 - q.r0) * pairs;
        for (int r = q.r0 + lane; r < q.r1; r += CUDA_WARP) scales[(size_t)r * per_row + q.c0 / NVFP4_BLOCK] = s;
        for (int k = lane; k < count; k += CUDA_WARP) {
            size_t i = (size_t)(q.r0 + k / pairs) * cols + q.c0 + 2 * (k % pairs);
            uint8_t lo = nvfp4_element(x[i], m, &p, i), hi = nvfp4_element(x[i + 1], m, &p, i + 1);
            codes[i / 2] = (uint8_t)(lo | hi << 4);
        }
    }
}

void cuda_nvfp4_quantize(uint8_t *codes, uint8_t *scales, const float *x, const float *amax, int rows, int cols,
                         const Nvfp4Params *p) {
    quant_check_shape("nvfp4_quantize", rows, cols, 1);
    quant_check_tile_rows("nvfp4_quantize", p->tile_rows, 1, NVFP4_BLOCK);
    long tiles = tile_count(rows, cols, p->tile_rows, NVFP4_BLOCK);
    if (tiles == 0) return;
    nvfp4_quantize_kernel<<<tile_blocks(tiles), QUANT_THREADS, 0, cuda_stream()>>>(codes, scales, x, amax, rows, cols,
                                                                                    tiles, *p);
    CUDA_CHECK_LAUNCH();
}

__global__ void nvfp4_dequantize_kernel(float *y, const uint8_t *codes, const uint8_t *scales, const float *amax,
                                        int rows, int cols) {
    float tensor_scale = nvfp4_tensor_scale(amax[0]);
    int per_row = quant_blocks(cols, NVFP4_BLOCK);
    FOR_EACH_INDEX(i, (size_t)rows * cols) {
        size_t r = i / cols, c = i % cols;
        y[i] = nvfp4_value(nvfp4_unpack(codes, i), scales[r * per_row + c / NVFP4_BLOCK], tensor_scale);
    }
}

void cuda_nvfp4_dequantize(float *y, const uint8_t *codes, const uint8_t *scales, const float *amax, int rows,
                           int cols) {
    quant_check_shape("nvfp4_dequantize", rows, cols, 1);
    size_t n = (size_t)rows * cols;
    if (n == 0) return;
    nvfp4_dequantize_kernel<<<cuda_blocks(n, QUANT_THREADS), QUANT_THREADS, 0, cuda_stream()>>>(y, codes, scales,
                                                                                                 amax, rows, cols);
    CUDA_CHECK_LAUNCH();
}

// ---- the random Hadamard transform ---------------------------------------------------------------

__global__ void hadamard16_kernel(float *y, const float *x, size_t groups, uint32_t sign_mask) {
    FOR_EACH_INDEX(g, groups) hadamard16_group(y + g * HADAMARD_DIM, x + g * HADAMARD_DIM, sign_mask);
}

void cuda_hadamard16(float *y, const float *x, size_t n, uint32_t sign_mask) {
    quant_check_hadamard("hadamard16", n);
    size_t groups = n / HADAMARD_DIM;
    if (groups == 0) return;
    hadamard16_kernel<<<cuda_blocks(groups, QUANT_THREADS), QUANT_THREADS, 0, cuda_stream()>>>(y, x, groups, sign_mask);
    CUDA_CHECK_LAUNCH();
}

// elementwise.cu — the cuda backend's vector helpers, clamp, SwiGLU, embedding and RoPE.
// Each op has the contract of its ops.h namesake and mirrors src/ops/cpu/elementwise.c:
// the same formulas in the same float / double types, outputs overwritten or accumulated
// (+=) the same way. Everything is queued on cuda_stream(); vec_sum_squares alone waits,
// to hand its scalar back.
//
// Launch shapes used below:
//   * flat ops (vec_*, clamp): a grid-stride loop, thread → element i;
//   * "column tiles × rows" ops (embedding_forward, swiglu_forward, rope): blockIdx.x and
//     threadIdx.x pick the column (or rotation pair), blockIdx.y walks the rows;
//   * swiglu_backward: one block per row (its drow_scale is a row reduction).
#include <cub/device/device_radix_sort.cuh>

#include "core/float_formats.h"
#include "ops/cuda/block_reduce.cuh"

constexpr int FLAT_THREADS = 256;
constexpr int ROW_MAX_THREADS = 256;

// ---- vectors ---------------------------------------------------------------------------

void cuda_vec_copy(real *dst, const real *src, size_t n) {
    if (n == 0 || dst == src) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(real), cudaMemcpyDefault, cuda_stream()));
}

void cuda_vec_zero(real *x, size_t n) {
    if (n == 0) return;
    CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(real), cuda_stream()));
}

// y (n) += x (n); thread → elements i, i + stride, ...
__global__ void vec_add_kernel(float *y, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

void cuda_vec_add(real *y, const real *x, size_t n) {
    if (n == 0) return;
    vec_add_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(y, x, n);
    CUDA_CHECK_LAUNCH();
}

// y (n) = x + branch, x fp32 (x32) or bf16 (x16: widened), y fp32 (y32) or bf16 (y16: rounded once)
__global__ void residual_add_kernel(float *y32, uint16_t *y16, const float *x32, const uint16_t *x16,
                                    const float *branch, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = (x32 ? x32[i] : bf16_to_float(x16[i])) + branch[i];
        if (y32) y32[i] = v;
        else y16[i] = bf16_from_float_flushed(v);
    }
}

void cuda_residual_add(void *y, Storage y_store, const void *x, Storage x_store, const real *branch, size_t n) {
    if (n == 0) return;
    float *y32 = y_store == STORE_FP32 ? (float *)y : NULL;
    const float *x32 = x_store == STORE_FP32 ? (const float *)x : NULL;
    residual_add_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(
        y32, (uint16_t *)y, x32, (const uint16_t *)x, branch, n);
    CUDA_CHECK_LAUNCH();
}

// x (n) *= s
__global__ void vec_scale_kernel(float *x, float s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

void cuda_vec_scale(real *x, real s, size_t n) {
    if (n == 0) return;
    vec_scale_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(x, s, n);
    CUDA_CHECK_LAUNCH();
}

// ---- Σ x², deterministic ----------------------------------------------------------------
// Stage 1: `blocks` blocks (a function of n only, at most SUMSQ_BLOCKS), thread t of the
// grid sums x[t], x[t + grid], ... in double in index order; the block folds its threads
// (block_sum) into partial[block]. Stage 2: one block folds the partials the same way.
constexpr int SUMSQ_THREADS = 256;
constexpr int SUMSQ_BLOCKS = 1024;

__global__ void sum_squares_partial_kernel(const float *x, size_t n, double *partial) {
    double s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)x[i] * x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// partial (count) -> *total; one block of SUMSQ_BLOCKS threads, thread t reads partial[t]
__global__ void sum_partials_kernel(const double *partial, unsigned count, double *total) {
    double s = threadIdx.x < count ? partial[threadIdx.x] : 0.0;
    s = block_sum(s);
    if (threadIdx.x == 0) *total = s;
}

__global__ void count_zeros_partial_kernel(const float *x, size_t n, double *partial) {
    double zeros = 0;  // exact: a thread's count and the block's sum stay far below 2^53
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        zeros += x[i] == 0.0f;
    zeros = block_sum(zeros);
    if (threadIdx.x == 0) partial[blockIdx.x] = zeros;
}

typedef void (*PartialKernel)(const float *x, size_t n, double *partial);

static CudaScratch sum_squares_scratch;

// out[0] (device) = the sum over x of what partial_kernel sums per block, queued: the partials
// in the shared scratch (stream order keeps successive calls apart), then their ordered sum.
static void reduce_to(double *out, const real *x, size_t n, PartialKernel partial_kernel) {
    if (n == 0) {
        CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), cuda_stream()));
        return;
    }
    size_t want = (n + SUMSQ_THREADS - 1) / SUMSQ_THREADS;
    unsigned blocks = (unsigned)(want < SUMSQ_BLOCKS ? want : SUMSQ_BLOCKS);
    double *partial = (double *)scratch_reserve(&sum_squares_scratch, (SUMSQ_BLOCKS + 1) * sizeof(double));
    partial_kernel<<<blocks, SUMSQ_THREADS, 0, cuda_stream()>>>(x, n, partial);
    CUDA_CHECK_LAUNCH();
    sum_partials_kernel<<<1, SUMSQ_BLOCKS, 0, cuda_stream()>>>(partial, blocks, out);
    CUDA_CHECK_LAUNCH();
}

// sum[0] (device) = Σ x², queued
void cuda_vec_sum_squares_to(double *sum, const real *x, size_t n) { reduce_to(sum, x, n, sum_squares_partial_kernel); }

// count[0] (device) = the zeros of x, queued
void cuda_vec_count_zeros_to(double *count, const real *x, size_t n) {
    reduce_to(count, x, n, count_zeros_partial_kernel);
}

double cuda_vec_sum_squares(const real *x, size_t n) {
    if (n == 0) return 0;
    double *partial = (double *)scratch_reserve(&sum_squares_scratch, (SUMSQ_BLOCKS + 1) * sizeof(double));
    double *total = partial + SUMSQ_BLOCKS;
    cuda_vec_sum_squares_to(total, x, n);
    double result = 0;
    cuda_memcpy_d2h(&result, total, sizeof(result));  // waits for the stream
    return result;
}

// ---- bf16 transport -------------------------------------------------------------------------

__global__ void bf16_pack_kernel(uint16_t *packed, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        packed[i] = bf16_from_float_flushed(x[i]);
}

__global__ void bf16_unpack_kernel(float *x, const uint16_t *packed, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = bf16_to_float(packed[i]);
}

void cuda_bf16_pack(real *packed, const real *x, size_t n) {
    if (n == 0) return;
    bf16_pack_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>((uint16_t *)packed, x, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_bf16_unpack(real *x, const real *packed, size_t n) {
    if (n == 0) return;
    bf16_unpack_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(x, (const uint16_t *)packed, n);
    CUDA_CHECK_LAUNCH();
}

// ---- clamp ---------------------------------------------------------------------------------

// y (n) = clamp(x, ±limit); y may be x
__global__ void clamp_forward_kernel(float *y, const float *x, size_t n, float limit) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        y[i] = v < -limit ? -limit : v > limit ? limit : v;
    }
}

// d (n) zeroed where x is outside [−limit, limit], kept elsewhere
__global__ void clamp_backward_kernel(float *d, const float *x, size_t n, float limit) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (x[i] < -limit || x[i] > limit) d[i] = 0;
}

void cuda_clamp_forward(real *y, const real *x, size_t n, real limit) {
    if (n == 0) return;
    clamp_forward_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(y, x, n, limit);
    CUDA_CHECK_LAUNCH();
}

void cuda_clamp_backward(real *d, const real *x, size_t n, real limit) {
    if (n == 0) return;
    clamp_backward_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(d, x, n, limit);
    CUDA_CHECK_LAUNCH();
}

// ---- SwiGLU ------------------------------------------------------------------------------

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// gate, up (M,I), row_scale (M) or NULL -> act (M,I); column tiles × rows
// act stored as fp32 (act32) or, when act32 is NULL, as bf16 (act16)
__global__ void swiglu_forward_kernel(float *act32, uint16_t *act16, const float *gate, const float *up,
                                      const float *row_scale, int M, int I) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= I) return;
    for (int m = blockIdx.y; m < M; m += gridDim.y) {
        size_t at = (size_t)m * I + i;
        float scale = row_scale ? row_scale[m] : 1.0f, g = gate[at], a = g * sigmoid(g) * up[at] * scale;
        if (act32) act32[at] = a;
        else act16[at] = bf16_from_float_flushed(a);
    }
}

// gate and up stored as bf16 (gemm.h Storage) are widened, exactly, into these first.
static CudaScratch widened_gate, widened_up;

void cuda_swiglu_forward(void *act, Storage act_store, const void *gate_stored, const void *up_stored,
                         Storage gu_store, const real *row_scale, int M, int I) {
    if (M <= 0 || I <= 0) return;
    const float *gate = scratch_widened(&widened_gate, gate_stored, gu_store, (size_t)M * I);
    const float *up = scratch_widened(&widened_up, up_stored, gu_store, (size_t)M * I);
    unsigned threads = row_threads(I, ROW_MAX_THREADS);
    float *act32 = act_store == STORE_FP32 ? (float *)act : NULL;
    swiglu_forward_kernel<<<tile_rows_grid(M, I, threads), threads, 0, cuda_stream()>>>(act32, (uint16_t *)act, gate,
                                                                                      up, row_scale, M, I);
    CUDA_CHECK_LAUNCH();
}

// One block per row m, thread → columns i = tid, tid + blockDim, ... Writes dgate and dup;
// with drow_scale, also drow_scale[m] = Σ_i (dact·silu(g))·up in double (block_sum), from
// the float product before it is scaled, as the cpu does.
__global__ void swiglu_backward_kernel(float *dgate, float *dup, float *drow_scale, const float *dact,
                                       const float *gate, const float *up, const float *row_scale, int I) {
    size_t row = (size_t)blockIdx.x * I;
    float scale = row_scale ? row_scale[blockIdx.x] : 1.0f;
    double dot = 0;
    for (int i = threadIdx.x; i < I; i += blockDim.x) {
        float g = gate[row + i], u = up[row + i], da = dact[row + i];
        float sg = sigmoid(g), silu = g * sg;
        dgate[row + i] = da * u * scale * sg * (1.0f + g * (1.0f - sg));
        float du = da * silu;
        dot += (double)du * u;
        dup[row + i] = du * scale;
    }
    if (drow_scale) {  // the same for the whole block: every thread takes part in block_sum
        dot = block_sum(dot);
        if (threadIdx.x == 0) drow_scale[blockIdx.x] = (float)dot;
    }
}

// dgate and dup stored as bf16 are made in fp32 here first, then rounded into place.
static CudaScratch staged_dgate, staged_dup;

void cuda_swiglu_backward(void *dgate_stored, void *dup_stored, Storage d_store, real *drow_scale, const real *dact,
                          const void *gate_stored, const void *up_stored, Storage gu_store, const real *row_scale,
                          int M, int I) {
    if (M <= 0) return;
    if (I <= 0) {  // an empty row still has its (zero) row-scale gradient
        if (drow_scale) cuda_vec_zero(drow_scale, (size_t)M);
        return;
    }
    size_t n = (size_t)M * I;
    const float *gate = scratch_widened(&widened_gate, gate_stored, gu_store, n);
    const float *up = scratch_widened(&widened_up, up_stored, gu_store, n);
    int own = d_store == STORE_FP32;
    float *dgate = own ? (float *)dgate_stored : (float *)scratch_reserve(&staged_dgate, n * sizeof(float));
    float *dup = own ? (float *)dup_stored : (float *)scratch_reserve(&staged_dup, n * sizeof(float));
    unsigned threads = row_threads(I, ROW_MAX_THREADS);
    swiglu_backward_kernel<<<M, threads, 0, cuda_stream()>>>(dgate, dup, drow_scale, dact, gate, up, row_scale,
                                                             I);
    CUDA_CHECK_LAUNCH();
    if (own) return;
    cuda_bf16_pack((float *)dgate_stored, dgate, n);
    cuda_bf16_pack((float *)dup_stored, dup, n);
}

// ---- embedding ---------------------------------------------------------------------------

// tokens (N), table (V,C) -> out (N,C); column tiles × rows
__global__ void embedding_forward_kernel(float *out, const int32_t *tokens, const float *table, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int n = blockIdx.y; n < N; n += gridDim.y) out[(size_t)n * C + c] = table[(size_t)tokens[n] * C + c];
}

void cuda_embedding_forward(real *out, const int32_t *tokens, const real *table, int N, int C) {
    if (N <= 0 || C <= 0) return;
    unsigned threads = row_threads(C, ROW_MAX_THREADS);
    embedding_forward_kernel<<<tile_rows_grid(N, C, threads), threads, 0, cuda_stream()>>>(out, tokens, table, N,
                                                                                         C);
    CUDA_CHECK_LAUNCH();
}

// Backward, deterministic and without atomics. The token ids are sorted with a stable
// radix sort (cub), carrying each token's index n: equal ids form a run whose indices
// increase, i.e. the tokens of one id in token order. Then one thread per (run, column)
// owns dtable[id, c] alone: it loads it once, adds the dout[n, c] of the run in order —
// the cpu's float additions in the cpu's order — and stores it once.
//
// Grid: x tiles the columns (threads across c, so each dout row read is coalesced), y
// walks the sorted positions; a position that does not start a run is skipped, one that
// does finds the run's end by binary search over the sorted ids. Work is O(N·C) reads
// plus the sort; a long run (a frequent token) is a serial chain per column, so its dout
// rows are loaded 8 at a time ahead of the in-order additions.
constexpr int EMBED_UNROLL = 8;
constexpr int EMBED_RUNS_Y = 4096;

__global__ void iota_kernel(int32_t *x, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = i;
}

// The first index after `begin` whose id differs from ids[begin] (ids sorted ascending).
__device__ int run_end(const int32_t *ids, int begin, int N) {
    int32_t id = ids[begin];
    int lo = begin + 1, hi = N;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (ids[mid] == id) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// dtable[id, c] += Σ dout[order[j], c] for j in [begin, end), in j order
__device__ void add_run(float *dtable, const float *dout, const int32_t *order, int32_t id, int begin, int end,
                        int c, int C) {
    float *dst = dtable + (size_t)id * C + c;
    float acc = *dst;
    int j = begin;
    for (; j + EMBED_UNROLL <= end; j += EMBED_UNROLL) {
        float d[EMBED_UNROLL];
#pragma unroll
        for (int k = 0; k < EMBED_UNROLL; k++) d[k] = dout[(size_t)order[j + k] * C + c];
#pragma unroll
        for (int k = 0; k < EMBED_UNROLL; k++) acc += d[k];
    }
    for (; j < end; j++) acc += dout[(size_t)order[j] * C + c];
    *dst = acc;
}

// ids (N) sorted token ids, order (N) their token indices -> dtable (V,C) +=
__global__ void embedding_backward_runs_kernel(float *dtable, const float *dout, const int32_t *ids,
                                               const int32_t *order, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int i = blockIdx.y; i < N; i += gridDim.y) {
        if (i > 0 && ids[i - 1] == ids[i]) continue;  // inside a run: its first position owns it
        add_run(dtable, dout, order, ids[i], i, run_end(ids, i, N), c, C);
    }
}

static CudaScratch embedding_scratch;

void cuda_embedding_backward(real *dtable, const real *dout, const int32_t *tokens, int N, int C) {
    if (N <= 0 || C <= 0) return;
    cudaStream_t stream = cuda_stream();
    size_t sort_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, tokens, (int32_t *)nullptr,
                                               (const int32_t *)nullptr, (int32_t *)nullptr, N, 0, 32, stream));
    // scratch: ids (N) | index (N) | order (N) | the sort's temporary storage
    size_t part = scratch_align((size_t)N * sizeof(int32_t));
    char *base = (char *)scratch_reserve(&embedding_scratch, 3 * part + sort_bytes);
    int32_t *ids = (int32_t *)base, *index = (int32_t *)(base + part), *order = (int32_t *)(base + 2 * part);
    iota_kernel<<<cuda_blocks((size_t)N, FLAT_THREADS), FLAT_THREADS, 0, stream>>>(index, N);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 3 * part, sort_bytes, tokens, ids, index, order, N, 0, 32,
                                               stream));
    unsigned threads = row_threads(C, ROW_MAX_THREADS);
    dim3 grid = tile_rows_grid(N < EMBED_RUNS_Y ? N : EMBED_RUNS_Y, C, threads);
    embedding_backward_runs_kernel<<<grid, threads, 0, stream>>>(dtable, dout, ids, order, N, C);
    CUDA_CHECK_LAUNCH();
}

// ---- RoPE ----------------------------------------------------------------------------------

// The rotation of one call, by value: pair i of head h of token row n is the elements
// i·step and i·step + second of the head (rotate-half: step 1, second dim/2;
// interleaved: step 2, second 1), rotated by sign·angle(position(n), i).
struct RopeArgs {
    int heads, half, head_stride, row_stride, step, second;
    int T, pos0;
    const int32_t *positions;  // device-accessible, or NULL: pos0 + n % T
    float sign;                // +1 forward, −1 backward (the transpose)
};

// x rotated in place; column tiles over the heads·half pairs j = h·half + i, rows n on y
__global__ void rope_kernel(float *x, const float *cos_sin, int N, RopeArgs a) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= a.heads * a.half) return;
    int h = j / a.half, i = j % a.half;
    for (int n = blockIdx.y; n < N; n += gridDim.y) {
        int position = a.positions ? a.positions[n] : a.pos0 + n % a.T;
        const float *cs = cos_sin + ((size_t)position * a.half + i) * 2;
        float c = cs[0], s = a.sign * cs[1];
        float *first = x + (size_t)n * a.row_stride + (size_t)h * a.head_stride + (size_t)i * a.step;
        float p = first[0], q = first[a.second];
        first[0] = p * c - q * s;
        first[a.second] = q * c + p * s;
    }
}

static void rope_rotate(real *x, const real *cos_sin, const TokenLayout *t, const RopeLayout *l, float sign) {
    int N = t->B * t->T, half = l->dim / 2;
    if (N <= 0 || half <= 0 || l->heads <= 0) return;
    RopeArgs a = {l->heads, half, l->head_stride, l->row_stride, l->interleaved ? 2 : 1, l->interleaved ? 1 : half,
                  t->T, t->pos0, t->positions, sign};
    unsigned threads = row_threads((long)l->heads * half, ROW_MAX_THREADS);
    rope_kernel<<<tile_rows_grid(N, (long)l->heads * half, threads), threads, 0, cuda_stream()>>>(x, cos_sin, N, a);
    CUDA_CHECK_LAUNCH();
}

void cuda_rope_forward(real *x, const real *cos_sin, const TokenLayout *t, const RopeLayout *l) {
    rope_rotate(x, cos_sin, t, l, +1.0f);
}

void cuda_rope_backward(real *dx, const real *cos_sin, const TokenLayout *t, const RopeLayout *l) {
    rope_rotate(dx, cos_sin, t, l, -1.0f);
}

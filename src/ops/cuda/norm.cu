// norm.cu — RMSNorm and softmax for the cuda backend, with the contracts of ops.h and the
// arithmetic of src/ops/cpu/elementwise.c: row statistics in double, outputs in float;
// forward outputs overwritten, backward gradients accumulated (+=).
//
// Row kernels run one block per row (blockIdx.x = row n, threads stride over its columns
// c = tid, tid + blockDim, ...) and fold their per-thread partial sums with block_sum /
// block_max (block_reduce.cuh): a fixed order for a given C, so the bits repeat.
#include "core/float_formats.h"
#include "ops/cuda/block_reduce.cuh"

constexpr int ROW_MAX_THREADS = 256;

// ---- RMSNorm -----------------------------------------------------------------------------

// x (N,C), w (C) -> y (N,C), rstd (N); one block per row. y32 when y is stored fp32, else y16
// (bf16, each value rounded once as bf16_pack rounds).
__global__ void rmsnorm_forward_kernel(float *y32, uint16_t *y16, float *rstd, const float *x, const float *w, int C,
                                       float eps) {
    size_t row = (size_t)blockIdx.x * C;
    const float *xr = x + row;
    double ss = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += (double)xr[c] * xr[c];
    ss = block_sum(ss);
    float r = (float)(1.0 / sqrt(ss / C + (double)eps));
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = xr[c] * r * w[c];
        if (y32) y32[row + c] = v;
        else y16[row + c] = bf16_from_float_flushed(v);
    }
}

// x stored as bf16 (the residual stream under --bf16) is widened, exactly, into this first.
static CudaScratch widened_x;

void cuda_rmsnorm_forward(void *y, Storage y_store, real *rstd, const void *x_stored, Storage x_store, const real *w,
                          int N, int C, real eps) {
    if (N <= 0) return;
    const float *x = scratch_widened(&widened_x, x_stored, x_store, (size_t)N * C);
    float *y32 = y_store == STORE_FP32 ? (float *)y : NULL;
    rmsnorm_forward_kernel<<<N, row_threads(C, ROW_MAX_THREADS), 0, cuda_stream()>>>(y32, (uint16_t *)y, rstd, x, w,
                                                                                     C, eps);
    CUDA_CHECK_LAUNCH();
}

// dx (N,C) += r·dy·w − x·r³/C·Σ_c dy·w·x, in double like the cpu; one block per row
__global__ void rmsnorm_backward_dx_kernel(float *dx, const float *dy, const float *x, const float *w,
                                           const float *rstd, int C) {
    size_t row = (size_t)blockIdx.x * C;
    double dot = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += (double)dy[row + c] * w[c] * x[row + c];
    dot = block_sum(dot);
    double r = rstd[blockIdx.x], k = dot * r * r * r / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dx[row + c] += (float)(r * dy[row + c] * w[c] - k * x[row + c]);
}

// dw_c += Σ_n dy·x·r, deterministic without atomics, in two stages over fixed row chunks
// (their size a function of N only):
//   1. grid (column tiles, chunks): thread (c, k) sums rows [k·rows, (k+1)·rows) of
//      column c in row order, in double, into partial (chunks, C);
//   2. thread c sums partial[0..chunks) of column c in chunk order, adds it to dw[c].
constexpr int DW_MIN_ROWS = 32;
constexpr int DW_MAX_CHUNKS = 128;

__global__ void rmsnorm_dw_partial_kernel(double *partial, const float *dy, const float *x, const float *rstd,
                                          int N, int C, int rows) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int begin = blockIdx.y * rows, end = begin + rows < N ? begin + rows : N;
    double s = 0;
    for (int n = begin; n < end; n++) s += (double)dy[(size_t)n * C + c] * x[(size_t)n * C + c] * rstd[n];
    partial[(size_t)blockIdx.y * C + c] = s;
}

__global__ void rmsnorm_dw_sum_kernel(float *dw, const double *partial, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double s = 0;
    for (int k = 0; k < chunks; k++) s += partial[(size_t)k * C + c];
    dw[c] += (float)s;
}

static CudaScratch dw_scratch;

static void rmsnorm_backward_dw(real *dw, const real *dy, const real *x, const real *rstd, int N, int C) {
    int rows = (N + DW_MAX_CHUNKS - 1) / DW_MAX_CHUNKS;
    rows = rows > DW_MIN_ROWS ? rows : DW_MIN_ROWS;
    int chunks = (N + rows - 1) / rows;
    double *partial = (double *)scratch_reserve(&dw_scratch, (size_t)chunks * C * sizeof(double));
    unsigned threads = row_threads(C, ROW_MAX_THREADS), tiles = (unsigned)((C + threads - 1) / threads);
    rmsnorm_dw_partial_kernel<<<dim3(tiles, chunks), threads, 0, cuda_stream()>>>(partial, dy, x, rstd, N, C, rows);
    CUDA_CHECK_LAUNCH();
    rmsnorm_dw_sum_kernel<<<tiles, threads, 0, cuda_stream()>>>(dw, partial, chunks, C);
    CUDA_CHECK_LAUNCH();
}

void cuda_rmsnorm_backward(real *dx, real *dw, const real *dy, const void *x_stored, Storage x_store, const real *w,
                           const real *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    const float *x = scratch_widened(&widened_x, x_stored, x_store, (size_t)N * C);
    rmsnorm_backward_dx_kernel<<<N, row_threads(C, ROW_MAX_THREADS), 0, cuda_stream()>>>(dx, dy, x, w, rstd, C);
    CUDA_CHECK_LAUNCH();
    rmsnorm_backward_dw(dw, dy, x, rstd, N, C);
}

// ---- softmax -------------------------------------------------------------------------------

// x (N,C) -> y (N,C); one block per row: float max, Σ e^(x − max) in double, y = e^(x − max)/Σ
__global__ void softmax_forward_kernel(float *y, const float *x, int C) {
    const float *xr = x + (size_t)blockIdx.x * C;
    float *yr = y + (size_t)blockIdx.x * C;
    float mx = -INFINITY;
    for (int c = threadIdx.x; c < C; c += blockDim.x) mx = xr[c] > mx ? xr[c] : mx;
    mx = block_max(mx);
    double sum = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sum += exp((double)xr[c] - mx);
    sum = block_sum(sum);
    for (int c = threadIdx.x; c < C; c += blockDim.x) yr[c] = (float)(exp((double)xr[c] - mx) / sum);
}

void cuda_softmax_forward(real *y, const real *x, int N, int C) {
    if (N <= 0 || C <= 0) return;
    softmax_forward_kernel<<<N, row_threads(C, ROW_MAX_THREADS), 0, cuda_stream()>>>(y, x, C);
    CUDA_CHECK_LAUNCH();
}

// dx (N,C) += y ⊙ (dy − Σ y·dy), the dot in double; one block per row
__global__ void softmax_backward_kernel(float *dx, const float *y, const float *dy, int C) {
    size_t row = (size_t)blockIdx.x * C;
    double dot = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += (double)y[row + c] * dy[row + c];
    dot = block_sum(dot);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dx[row + c] += (float)(y[row + c] * (dy[row + c] - dot));
}

void cuda_softmax_backward(real *dx, const real *y, const real *dy, int N, int C) {
    if (N <= 0 || C <= 0) return;
    softmax_backward_kernel<<<N, row_threads(C, ROW_MAX_THREADS), 0, cuda_stream()>>>(dx, y, dy, C);
    CUDA_CHECK_LAUNCH();
}

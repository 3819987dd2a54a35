// loss.cu — cross-entropy for the cuda backend, with the contract of ops.h and the
// arithmetic of src/ops/cpu/elementwise.c: the row max in float, Σ e^(x − max) of float
// exponentials accumulated in double, lse = max + log Σ in double, rounded to float on
// store; the loss is lse − logit[target] in double, rounded once.
#include "ops/cuda/block_reduce.cuh"

constexpr int CE_MAX_THREADS = 512;
constexpr int CE_BACKWARD_THREADS = 256;

// logits (N,V), targets (N) -> lse (N), losses (N); one block per row n, threads stride
// over the vocabulary v = tid, tid + blockDim, ... (two passes: max, then Σ e^(x − max))
__global__ void cross_entropy_forward_kernel(float *losses, float *lse, const float *logits, const int32_t *targets,
                                             int V) {
    const float *row = logits + (size_t)blockIdx.x * V;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) mx = row[v] > mx ? row[v] : mx;
    mx = block_max(mx);
    double sum = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(row[v] - mx);
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        double row_lse = mx + log(sum);
        lse[blockIdx.x] = (float)row_lse;
        losses[blockIdx.x] = (float)(row_lse - row[targets[blockIdx.x]]);
    }
}

void cuda_cross_entropy_forward(real *losses, real *lse, const real *logits, const int32_t *targets, int N, int V) {
    if (N <= 0) return;
    unsigned threads = row_threads(V, CE_MAX_THREADS);
    cross_entropy_forward_kernel<<<N, threads, 0, cuda_stream()>>>(losses, lse, logits, targets, V);
    CUDA_CHECK_LAUNCH();
}

// dlogits (N,V) = (e^(logit − lse) − onehot(target))·weight, overwritten; 0 where weight
// is 0. Column tiles × rows: thread → vocabulary entry v, blockIdx.y walks the rows. The
// product is rounded before the target's −weight (__fmul_rn: no fused multiply-add), as
// the cpu computes it in two steps.
__global__ void cross_entropy_backward_kernel(float *dlogits, const float *logits, const float *lse,
                                              const int32_t *targets, const float *weight, int N, int V) {
    int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= V) return;
    for (int n = blockIdx.y; n < N; n += gridDim.y) {
        size_t at = (size_t)n * V + v;
        float w = weight[n], d = 0;
        if (w != 0) {
            d = __fmul_rn(expf(logits[at] - lse[n]), w);
            if (v == targets[n]) d -= w;
        }
        dlogits[at] = d;
    }
}

void cuda_cross_entropy_backward(real *dlogits, const real *logits, const real *lse, const int32_t *targets,
                                 const real *weight, int N, int V) {
    if (N <= 0 || V <= 0) return;
    dim3 grid = tile_rows_grid(N, V, CE_BACKWARD_THREADS);
    cross_entropy_backward_kernel<<<grid, CE_BACKWARD_THREADS, 0, cuda_stream()>>>(dlogits, logits, lse, targets,
                                                                                   weight, N, V);
    CUDA_CHECK_LAUNCH();
}

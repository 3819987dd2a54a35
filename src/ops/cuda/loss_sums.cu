// loss_sums.cu — the LM head loss ops of ops_loss.h for the cuda backend: masked loss
// sums in one block (double, fixed tree order), loss weights and the double-scaled copy
// elementwise, with the arithmetic of src/ops/cpu/loss.c.
#include "ops/cuda/block_reduce.cuh"

constexpr int LOSS_SUM_THREADS = 256;
constexpr int LOSS_ELEM_THREADS = 256;

// one block: thread t sums n = t, t + blockDim, ... in order, then the block's fixed tree
__global__ void lm_loss_sums_kernel(double *sums, const float *token_loss, const float *loss_mask, int N) {
    double counted = 0, total = 0;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        double w = loss_mask ? (double)loss_mask[n] : 1.0;
        counted += w;
        total += w * (double)token_loss[n];
    }
    counted = block_sum(counted);
    total = block_sum(total);
    if (threadIdx.x == 0) {
        sums[0] = counted;
        sums[1] = total;
    }
}

void cuda_lm_loss_sums(double *sums, const real *token_loss, const real *loss_mask, int N) {
    lm_loss_sums_kernel<<<1, LOSS_SUM_THREADS, 0, cuda_stream()>>>(sums, token_loss, loss_mask, N < 0 ? 0 : N);
    CUDA_CHECK_LAUNCH();
}

__global__ void lm_loss_weights_kernel(float *weight, const float *loss_mask, double counted, int N) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    weight[n] = counted > 0 ? (float)((loss_mask ? (double)loss_mask[n] : 1.0) / counted) : 0.0f;
}

void cuda_lm_loss_weights(real *weight, const real *loss_mask, double counted, int N) {
    if (N <= 0) return;
    unsigned blocks = (unsigned)((N + LOSS_ELEM_THREADS - 1) / LOSS_ELEM_THREADS);
    lm_loss_weights_kernel<<<blocks, LOSS_ELEM_THREADS, 0, cuda_stream()>>>(weight, loss_mask, counted, N);
    CUDA_CHECK_LAUNCH();
}

__global__ void vec_scale_double_kernel(float *dst, const float *src, double scale, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = (float)((double)src[i] * scale);
}

void cuda_vec_scale_double(real *dst, const real *src, double scale, size_t n) {
    if (n == 0) return;
    unsigned blocks = (unsigned)((n + LOSS_ELEM_THREADS - 1) / LOSS_ELEM_THREADS);
    vec_scale_double_kernel<<<blocks, LOSS_ELEM_THREADS, 0, cuda_stream()>>>(dst, src, scale, n);
    CUDA_CHECK_LAUNCH();
}

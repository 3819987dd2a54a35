// router_gate.cu — the cuda backend's elementwise router ops (contracts in ops_router.h, cpu
// twins in src/ops/cpu/router.c): the router input's jitter product, the shared expert's gate
// σ and its gradient. One thread per element (grid-stride); σ with expf (the cpu: its fast e^x).
#include "ops/cuda/cuda_internal.h"

constexpr unsigned GATE_THREADS = 256;

__global__ void scale_by_kernel(float *y, const float *x, const float *scale, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = x[i] * scale[i];
}

__global__ void gate_sigmoid_kernel(float *gate, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        gate[i] = 1.0f / (1.0f + expf(-gate[i]));
}

__global__ void gate_sigmoid_backward_kernel(float *dgate, const float *gate, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dgate[i] *= gate[i] * (1.0f - gate[i]);
}

void cuda_moe_scale_by(real *y, const real *x, const real *scale, size_t n) {
    if (!n) return;
    scale_by_kernel<<<cuda_blocks(n, GATE_THREADS), GATE_THREADS, 0, cuda_stream()>>>(y, x, scale, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_moe_gate_sigmoid(real *gate, size_t n) {
    if (!n) return;
    gate_sigmoid_kernel<<<cuda_blocks(n, GATE_THREADS), GATE_THREADS, 0, cuda_stream()>>>(gate, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_moe_gate_sigmoid_backward(real *dgate, const real *gate, size_t n) {
    if (!n) return;
    gate_sigmoid_backward_kernel<<<cuda_blocks(n, GATE_THREADS), GATE_THREADS, 0, cuda_stream()>>>(dgate, gate, n);
    CUDA_CHECK_LAUNCH();
}

// bias += rate · sign(mean − counts): one thread per expert, each summing the mean in expert order
__global__ void expert_bias_kernel(float *bias, const double *counts, int E, double rate) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    double mean = 0;
    for (int i = 0; i < E; i++) mean += counts[i];
    mean /= E;
    double offset = mean - counts[e];
    bias[e] += (float)(rate * ((offset > 0) - (offset < 0)));
}

void cuda_moe_expert_bias_update(real *bias, const double *counts, int E, double rate) {
    if (E <= 0) return;
    expert_bias_kernel<<<(unsigned)((E + 127) / 128), 128, 0, cuda_stream()>>>(bias, counts, E, rate);
    CUDA_CHECK_LAUNCH();
}

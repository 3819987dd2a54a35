// optimizer.cu — AdamW for the cuda backend, with the contract of ops.h and the
// arithmetic of src/ops/cpu/elementwise.c: the step's constants (bias corrections, decay
// factor) are folded in double on the host and rounded to float, the per-element update
// runs in float.
#include "ops/cuda/cuda_internal.h"

#include <math.h>

constexpr int ADAMW_THREADS = 256;

// The float constants of one step, folded on the host exactly as the cpu folds them.
struct AdamWConstants {
    float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, lr, inv_bias1, inv_sqrt_bias2, decay_factor;
};

static AdamWConstants adamw_constants(int decay, const AdamWStep *h) {
    AdamWConstants k;
    k.beta1 = (float)h->beta1;
    k.beta2 = (float)h->beta2;
    k.one_minus_beta1 = (float)(1.0 - h->beta1);
    k.one_minus_beta2 = (float)(1.0 - h->beta2);
    k.eps = (float)h->eps;
    k.lr = (float)h->lr;
    k.inv_bias1 = (float)(1.0 / (1.0 - pow(h->beta1, (double)h->step)));
    k.inv_sqrt_bias2 = (float)(1.0 / sqrt(1.0 - pow(h->beta2, (double)h->step)));
    k.decay_factor = decay ? (float)(1.0 - h->lr * h->weight_decay) : 1.0f;
    return k;
}

// p, m, v (n) updated in place from g (n); thread → elements i, i + stride, ...
__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, AdamWConstants k) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        float mi = k.beta1 * m[i] + k.one_minus_beta1 * gi;
        float vi = k.beta2 * v[i] + k.one_minus_beta2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float update = (mi * k.inv_bias1) / (sqrtf(vi) * k.inv_sqrt_bias2 + k.eps);
        p[i] = p[i] * k.decay_factor - k.lr * update;
    }
}

void cuda_adamw_update(real *p, const real *g, real *m, real *v, size_t n, int decay, const AdamWStep *h) {
    if (n == 0) return;
    AdamWConstants k = adamw_constants(decay, h);
    adamw_kernel<<<cuda_blocks(n, ADAMW_THREADS), ADAMW_THREADS, 0, cuda_stream()>>>(p, g, m, v, n, k);
    CUDA_CHECK_LAUNCH();
}

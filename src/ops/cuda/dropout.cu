// dropout.cu — the cuda backend's dropout_apply (contract in ops.h): one thread per element,
// the mask from ops/dropout_math.h, so the bits equal the cpu backend's.
#include "ops/cuda/cuda_internal.h"
#include "ops/dropout_math.h"

enum { DROPOUT_THREADS = 256 };

__global__ void dropout_apply_kernel(float *y, const float *x, DropoutShape s) {
    size_t n = (size_t)s.rows * s.cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / s.cols), c = (int)(i % s.cols);
        int row = s.row_index ? s.row_index[r] : s.row_first + r;
        uint64_t key = dropout_row_key(s.mask.stream, (uint64_t)row);
        y[i] = dropout_kept(key, (uint64_t)c, s.mask.threshold) ? x[i] * s.mask.scale : 0.0f;
    }
}

void cuda_dropout_apply(real *y, const real *x, const DropoutShape *s) {
    size_t n = (size_t)s->rows * s->cols;
    if (n == 0) return;
    dropout_apply_kernel<<<cuda_blocks(n, DROPOUT_THREADS), DROPOUT_THREADS, 0, cuda_stream()>>>(y, x, *s);
    CUDA_CHECK_LAUNCH();
}

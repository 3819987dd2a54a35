// linear.c — bias-free linear layers on top of mt_gemm (cpu backend).
#include "ops/ops.h"

// x (N,in), W (out,in) -> y (N,out) = x·Wᵀ
void linear_forward(real *y, const real *x, const real *W, int N, int in, int out) {
    mt_gemm(0, 1, N, out, in, 1, x, in, W, in, 0, y, out);
}

// dx (N,in) += dy (N,out)·W (out,in);  dW (out,in) += dyᵀ (out,N)·x (N,in)
void linear_backward(real *dx, real *dW, const real *dy, const real *x, const real *W, int N,
                     int in, int out) {
    if (dx) mt_gemm(0, 0, N, in, out, 1, dy, out, W, in, 1, dx, in);
    if (dW) mt_gemm(1, 0, out, in, N, 1, dy, out, x, in, 1, dW, in);
}

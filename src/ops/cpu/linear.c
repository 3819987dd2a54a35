// linear.c — bias-free linear layers on top of mt_gemm (cpu backend).
#include "ops/cpu/cpu_ops.h"

// x (N,in), W (out,in) -> y (N,out) = x·Wᵀ
void cpu_linear_forward(real *y, const real *x, const real *W, int N, int in, int out) {
    cpu_gemm(0, 1, N, out, in, 1, x, in, W, in, 0, y, out);
}

// dx (N,in) += dy (N,out)·W (out,in);  dW (out,in) += dyᵀ (out,N)·x (N,in)
void cpu_linear_backward(real *dx, real *dW, const real *dy, const real *x, const real *W, int N,
                     int in, int out) {
    if (dx) cpu_gemm(0, 0, N, in, out, 1, dy, out, W, in, 1, dx, in);
    if (dW) cpu_gemm(1, 0, out, in, N, 1, dy, out, x, in, 1, dW, in);
}

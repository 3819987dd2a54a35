// gemm_fma512.h — the cpu GEMM's fp32 micro-kernel on AVX-512 (gemm.c's KERNEL_FP32_AVX512 and,
// under flush-to-zero, its emulations of 16-bit inputs): a tile of FMA512_MR x FMA512_NR floats
// in 512-bit registers. Each element is summed by one fused multiply-add per depth in order, as
// the portable kernel's 256-bit vectors sum it, so the two give the same bits; only the tile
// (and so the panels' width) is larger.
#pragma once
#include "core/common.h"

#define FMA512_MR 6   // rows of the tile: 6 x 2 accumulators
#define FMA512_NR 32  // columns: two vectors of 16 floats

// Whether this build (x86, fp32 reals) and the CPU (AVX-512 F) can run fma512_micro (asked once).
int fma512_available(void);

// acc[FMA512_MR][FMA512_NR] = Σ_k a[k][i]·b[k][j], k = 0..kc-1 in order, for packed panels
// a [kc][FMA512_MR] and b [kc][FMA512_NR]: each product added by one fused multiply-add, in the
// caller's floating-point mode. Only call when fma512_available().
void fma512_micro(int kc, const real *a, const real *b, real *acc);

// gemm_fma.h — the cpu GEMM's fp32 micro-kernels written with fused multiply-add instructions
// (gemm.c's fp32 kernels and, under flush-to-zero, its emulations of 16-bit inputs): AVX2's
// FMA_MR x FMA_NR tile (gemm.c's portable tile, where the CPU has FMA) and AVX-512's
// FMA512_MR x FMA512_NR. Each sums an element by one fused multiply-add per depth in order,
// written out so that any build fuses them (GCC contracts a*b+c only at -O2 and with FMA in
// its target), so the two tiles give the same bits; only the tile (the panels' width) differs.
#pragma once
#include "core/common.h"

#define FMA_MR 6      // AVX2's tile: 6 x 2 accumulators of 8 floats (gemm.c's MR x NR)
#define FMA_NR 16
#define FMA512_MR 6   // AVX-512's: 6 x 2 accumulators of 16 floats
#define FMA512_NR 32

// Whether this build (x86, fp32 reals) and the CPU (AVX2 and FMA; AVX-512 F) can run the
// kernel below (asked once).
int fma_have_avx2(void);
int fma_have_avx512(void);

// acc[MR][NR] = Σ_k a[k][i]·b[k][j], k = 0..kc-1 in order, for packed panels a [kc][MR] and
// b [kc][NR] of the kernel's tile: each product added by one fused multiply-add, in the
// caller's floating-point mode. Only call when the matching fma_have_* says so.
void fma_micro_avx2(int kc, const real *a, const real *b, real *acc);
void fma_micro_avx512(int kc, const real *a, const real *b, real *acc);

// gemm_lowp.h — the pieces of the cpu GEMM that round its inputs to 16 bits (--bf16,
// --fp16; gemm.h has the contract): rounding packed fp32 panels in place (the emulation,
// which then runs the fp32 micro-kernel), packing bf16 pairs for the AVX-512 BF16
// micro-kernel, that kernel, and whether the CPU has it. gemm.c owns the blocking and
// the threads; the emulation's tile is gemm.c's MR x NR (6 x 16 fp32) or, where the CPU has
// AVX-512, gemm_fma.h's (6 x 32); the AVX-512 BF16 kernel's LOWP_MR x LOWP_BF16_NR (6 x 32).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/common.h"
#include "ops/gemm.h"

#define LOWP_MR 6   // rows of a micro-tile (gemm.c's MR)
#define LOWP_NR 16  // columns of a micro-tile (gemm.c's NR for float): one 512-bit vector
// Columns of the AVX-512 BF16 kernel's tile: two vectors, so that its 6 x 2 accumulators
// (independent dot-product chains) cover the instruction's latency, and each broadcast of
// A's pair feeds two of them.
#define LOWP_BF16_NR (2 * LOWP_NR)

// x[0, n) rounded in place to the values of `inputs` (kept as floats): bf16 with fp32
// subnormals first made ±0, or IEEE half. The emulation's packed panels.
void lowp_round_panel(real *x, size_t n, GemmInputs inputs);

// dst[i] = bf16_from_float_flushed(src[i]) for i < n (nearest even, fp32 subnormals ±0, NaN
// kept quiet): with VCVTNE2PS2BF16, which rounds so, where the CPU has AVX-512 BF16, else one
// element at a time. The bf16 ops' stores of rounded runs (cpu_ops.h cpu_bf16_round_run).
void lowp_bf16_round_run(uint16_t *dst, const real *src, size_t n);

// Depth kc of a bf16 pair panel: kc rounded up to whole pairs.
static inline int lowp_pairs(int kc) { return (kc + 1) / 2; }

// dst[ceil(w/W) panels][pairs(kc)][W][2] <- the w x kc block at src (lane j, depth k at
// src[j*s_w + k*s_k]) as bf16, subnormals ±0. Within a pair the element of depth 2q sits in
// the high half and 2q+1 in the low half, because the dot-product instruction adds the
// high half's product first: each lane then sums depth 2q before 2q+1, in order, as the
// emulation's fused multiply-adds do. Lanes past w are zero; the depth past an odd kc is
// `pad`: LOWP_PAD_A (-0) in A's panels and LOWP_PAD_B (+0) in B's, so the padded product
// is -0, which leaves every sum as it was (a sum flushed to -0 included).
// src stored as `store` (gemm.h): fp32 values are rounded, bf16 ones (already rounded so) copied.
enum { LOWP_PAD_A = 0x8000, LOWP_PAD_B = 0 };
void lowp_pack_bf16_pairs(uint16_t *dst, const void *src, Storage store, int w, int W, int kc, size_t s_w,
                          size_t s_k, uint16_t pad);

// acc[LOWP_MR][LOWP_BF16_NR] = sum over depth k < kc, in order, of a[k][i] * b[k][j] for the
// bf16 pair panels a ([pairs][LOWP_MR][2]) and b ([pairs][LOWP_BF16_NR][2], 64-byte aligned;
// lowp_pack_bf16_pairs with W = LOWP_BF16_NR); each product added
// with one rounding (flush-to-zero), as VDPBF16PS does. Only call when lowp_have_avx512bf16().
void lowp_micro_avx512bf16(int kc, const uint16_t *a, const uint16_t *b, real *acc);
int lowp_have_avx512bf16(void);

// The bf16 emulation's micro-kernel on fp32 panels (gemm.c's layout: a [kc][MR], b [kc][NR]):
// acc[MR][NR] = Σ_k a[k][i]·b[k][j] in order, each product added by one fused multiply-add
// (explicitly: whatever the compiler's contraction or optimisation level) with subnormal
// results flushed to zero and subnormal operands read as zero, as the bf16 dot product
// rounds; the caller's floating-point mode is restored. On CPUs without such a mode (not
// x86) it runs unflushed.
void lowp_micro_fma_flushed(int kc, const real *a, const real *b, real *acc);
// The same sums on gemm_fma.h's AVX-512 tile (panels [kc][FMA512_MR] and [kc][FMA512_NR]),
// flushed alike. Only call when fma_have_avx512().
void lowp_micro_fma512_flushed(int kc, const real *a, const real *b, real *acc);

// ---- AMX-BF16 (tile matrix multiply) --------------------------------------------------------
// A micro-tile of 32 x 32 (2 x 2 hardware tiles of 16 x 16 fp32), depth in steps of 32.
// TDPBF16PS sums its 32 products per element at a precision of its own (not one fused
// multiply-add each: measured), so this kernel's results differ from the emulation's in the
// last bits, as a different summation order would; its inputs are rounded the same way.
#define LOWP_AMX_TILE 32   // rows of A's panels and columns of B's
#define LOWP_AMX_DEPTH 32  // depth of one tile product

// Whether the CPU has AMX-BF16 and the kernel lets this process use the tile registers
// (asked once; Linux's ARCH_REQ_XCOMP_PERM).
int lowp_have_amx(void);
// dst[ceil(w/32) panels][ceil(kc/32) steps][32 lanes][32 depths] <- A's w x kc block (lane j
// = row, subnormals ±0, zero padding): each step of a panel is two A tiles (16 rows each).
// src stored as `store` (gemm.h): fp32 values are rounded, bf16 ones (already rounded so) copied.
void lowp_pack_amx_a(uint16_t *dst, const void *src, Storage store, int w, int kc, size_t s_w, size_t s_k);
// dst[ceil(w/32) panels][ceil(kc/32) steps][16 depth pairs][32 lanes][2] <- B's w x kc block
// (lane j = column), the pairs in depth order: two B tiles (16 columns each) per step; src as above.
void lowp_pack_amx_b(uint16_t *dst, const void *src, Storage store, int w, int kc, size_t s_w, size_t s_k);
// C[32][32] (rows ldc apart) = a · b over depth kc for one packed A and B panel (64-byte
// aligned), plus C's own values when accumulate: the tile accumulators start from C (or 0)
// and the products are summed onto them, then stored back to C.
void lowp_micro_amx(int kc, const uint16_t *a, const uint16_t *b, real *C, size_t ldc, int accumulate);

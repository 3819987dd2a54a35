// gemm.h — dense matrix multiply for moetron: one BLAS-style GEMM and two grouped
// variants for Mixture-of-Experts layers (one weight matrix per expert).
//
// All matrices are row-major. Results are deterministic: every element of C is
// summed over K by a single thread in a fixed order, so the portable backend gives
// bitwise-identical results for any OpenMP thread count. The OpenBLAS backend is
// deterministic only for a fixed OpenBLAS thread count.
//
// Backend: OpenBLAS (cblas_sgemm / cblas_dgemm) when built with MT_HAVE_CBLAS,
// unless the environment variable MOETRON_GEMM=portable is set (read once, on the
// first call) or mt_gemm_force_portable(1) was called; the portable blocked GEMM
// otherwise.
#pragma once
#include "core/common.h"

// C[M,N] = alpha * op(A)[M,K] · op(B)[K,N] + beta * C
//   op(A) = A   when !trans_a: A is [M,K], lda >= K
//   op(A) = A^T when  trans_a: A is [K,M], lda >= M
//   op(B) = B   when !trans_b: B is [K,N], ldb >= N
//   op(B) = B^T when  trans_b: B is [N,K], ldb >= K
//   C is [M,N], ldc >= N.
// beta == 0 overwrites C (NaN/Inf already in C do not propagate). When K == 0 or
// alpha == 0, A and B are not read and C = beta * C. M == 0 or N == 0: no-op.
void mt_gemm(int trans_a, int trans_b, int M, int N, int K, real alpha, const real *A, int lda,
             const real *B, int ldb, real beta, real *C, int ldc);

// The backend the next mt_gemm call will use: "openblas" or "portable".
const char *mt_gemm_backend(void);

// What a GEMM's inputs are rounded to before they are multiplied (--bf16, --fp16): every
// element of op(A) and op(B) is rounded to that type (nearest, ties to even), the products
// (exact in fp32) are summed in fp32, and C stays fp32. Process-wide, set between GEMMs by
// the thread that runs them (device_set_gemm_inputs); the cpu backend's (cuda has its own).
//   GEMM_INPUTS_BF16: fp32 subnormal inputs become ±0 and every partial sum is flushed to ±0
//     when subnormal, as AVX-512 BF16's dot product does, so the hardware kernel and the
//     emulation of a CPU without it give the same bits.
//   GEMM_INPUTS_FP16: IEEE half (overflow to infinity, half subnormals kept); no flushing.
// Sums run over K in blocks of MT_GEMM_K_BLOCK in order, as in fp32: each block's sum starts
// at 0, C = alpha·sum + beta·C after the first block, C = alpha·sum + C after the others.
// A double-precision build has fp32 only.
#define MT_GEMM_K_BLOCK 256
typedef enum { GEMM_INPUTS_FP32, GEMM_INPUTS_BF16, GEMM_INPUTS_FP16 } GemmInputs;
void mt_gemm_set_inputs(GemmInputs inputs);
GemmInputs mt_gemm_inputs(void);

// The kernel the next mt_gemm uses, for the banner: "avx512 fp32" or "portable fp32" (or
// "openblas fp32"), "bf16 amx", "bf16 avx512-bf16", "bf16 emulated", "fp16 emulated". fp32 and
// the 16-bit emulations run on an AVX-512 tile where the CPU has AVX-512 F, else on the
// portable one; MOETRON_GEMM_FP32 (read at the first kernel choice: the first
// mt_gemm_set_inputs or GEMM, and again after mt_gemm_use_fp32_kernel) or
// mt_gemm_use_fp32_kernel asks for "avx512" or "portable" (NULL: the default): the same bits
// either way. bf16 runs on AMX-BF16
// where the CPU has it; else each orientation (trans_a, trans_b) on whichever of AVX-512 BF16
// and the emulation ran a GEMM of it faster when the choice was made (measured at the first
// mt_gemm_set_inputs of bf16; where the CPU lacks AVX-512 BF16, the emulation);
// MOETRON_GEMM_BF16 (read then) or mt_gemm_use_bf16_kernel asks for one of "amx", "portable"
// (the measured choice, never AMX), "avx512-bf16" or "emulated" (falling back the same way
// when the CPU lacks it; NULL: the default). When the orientations' kernels differ the name
// lists them: "bf16 NN emulated, NT avx512-bf16, TN emulated, TT emulated". The
// AVX-512 BF16 kernel and the emulation give the same bits; AMX sums each block of 32
// products at a precision of its own, and (alpha 1, beta 0 or 1) onto C's value in its tile
// accumulators rather than adding each K block's sum to C after it, so it differs from them
// in the last bits. Every kernel gives an element the same bits whatever the thread count
// and wherever its tile lies (M, N, the offset of a sub-block).
const char *mt_gemm_kernel(void);
void mt_gemm_use_bf16_kernel(const char *name);
void mt_gemm_use_fp32_kernel(const char *name);

// on != 0: use the portable backend from now on, even when OpenBLAS is linked.
// on == 0: go back to the default choice (OpenBLAS if linked and MOETRON_GEMM is
// not "portable"). Call it before spawning threads that use mt_gemm; it is meant
// for tests and benchmarks.
void mt_gemm_force_portable(int on);

// How an activation operand of the grouped GEMMs is stored. STORE_FP32: real elements.
// STORE_BF16: bf16 values, the uint16_t array at the operand's address holding element i at
// index i (lda / ld and offsets count these elements): what `--bf16` keeps of a tensor that only
// bf16-input GEMMs read (ops.h bf16_pack's rounding). The GEMM reads each element widened to
// fp32, exactly, and then rounds its inputs as for fp32 storage: with bf16 inputs the product is
// that of the fp32 tensor the bf16 values were rounded from, bit for bit, at half the memory.
typedef enum { STORE_FP32, STORE_BF16 } Storage;

// Bytes of one element stored as s.
static inline size_t storage_bytes(Storage s) { return s == STORE_BF16 ? sizeof(uint16_t) : sizeof(real); }
// The reals that hold n elements stored as s (a buffer's size in reals).
static inline size_t storage_reals(size_t n, Storage s) { return (n * storage_bytes(s) + sizeof(real) - 1) / sizeof(real); }
// The address of element i of a tensor at x stored as s.
static inline void *storage_at(void *x, Storage s, size_t i) { return (char *)x + i * storage_bytes(s); }
static inline const void *storage_at_const(const void *x, Storage s, size_t i) {
    return (const char *)x + i * storage_bytes(s);
}

// A GEMM's C stored as STORE_BF16 (mt_gemm_stored, mt_gemm_grouped; what --bf16 keeps of the
// FFNs' gate and up projections, as Megatron's bf16 GEMMs return them): the sums run in fp32
// exactly as for an fp32 C, and each element of the result is then rounded once as bf16_pack
// rounds. It needs beta 0 (C is overwritten) and ldc == N (C one dense block).

// mt_gemm with A and B stored as a_store and b_store (lda, ldb and the layouts in elements of
// that storage) and C as c_store: the dense FFNs' GEMMs under --bf16.
void mt_gemm_stored(int trans_a, int trans_b, int M, int N, int K, real alpha, const void *A, Storage a_store, int lda,
                    const void *B, Storage b_store, int ldb, real beta, void *C, Storage c_store, int ldc);

// Grouped GEMM, one group per expert, the groups' rows back to back: group g has
// M_g = counts[g] rows, starting at row r_g = counts[0] + … + counts[g−1]. For g with M_g > 0:
//   C_g[M_g, N] = alpha * op(A_g) · op(B_g) + beta * C_g
// where A_g = A + r_g·lda (A_g [M_g, K]), or with trans_a A + r_g (A_g [K, M_g], columns
// r_g.. of A), A stored as a_store (elements of that storage); B_g = B + g·b_stride, the expert's
// own [K,N] (or, with trans_b, [N,K]) weight, the experts' weights of one kind being one block;
// C_g = C + r_g·ldc, C stored as c_store (elements of that storage); lda/ldb/ldc
// as in mt_gemm with M = M_g. counts (groups, each ≥ 0) is tensor memory, read inside the
// op. Groups with M_g == 0 are skipped (their B_g is not read, their C_g not touched).
// host_counts: NULL, or host memory holding the same values as counts (the copy the caller
// downloaded with its layer pass's sizes): a backend that sets up its problems on the host
// (cuBLAS) reads it instead of copying counts back and waiting for them.
void mt_gemm_grouped(int trans_a, int trans_b, int groups, const int32_t *counts, const int32_t *host_counts, int N,
                     int K, real alpha, const void *A, Storage a_store, int lda, const real *B, size_t b_stride,
                     int ldb, real beta, void *C, Storage c_store, int ldc);

// Grouped weight gradient, the groups' rows back to back as in mt_gemm_grouped. For g with M_g > 0:
//   W_g[out, in] += alpha * dY_g^T[out, M_g] · X_g[M_g, in]
// where dY_g = dY + r_g·out is [M_g, out] (ld = out; stored as dy_store), X_g = X + r_g·in is
// [M_g, in] (ld = in; stored as x_store) and W_g = W + g·w_stride is [out, in] (ld = in), the W_g
// of different groups disjoint (w_stride >= out·in: the groups may run at once). counts (groups):
// tensor memory; host_counts as in mt_gemm_grouped.
void mt_gemm_grouped_wgrad(int groups, const int32_t *counts, const int32_t *host_counts, int out, int in, real alpha,
                           const void *dY, Storage dy_store, const void *X, Storage x_store, real *W,
                           size_t w_stride);

// ops_quantize.h — the quantizer ops: FP8 per tensor (current and delayed scaling), FP8 in
// 1×128 / 128×128 tiles, MXFP8, NVFP4 and the 16-point random Hadamard transform; their
// types and contracts (shapes, layouts, what NaN, infinity and zero blocks give); listed in
// op_list.h (MT_OPS_QUANTIZE). The arithmetic is ops/quantize_math.h's, the formulas and the
// references they match bit for bit are in docs/precision.md ("Quantizers").
//
// Conventions: x is fp32, row-major (rows, cols); every output is overwritten; codes are one
// byte per element (FP8) or two E2M1 codes per byte (NVFP4: element 2i in the low nibble,
// 2i + 1 in the high one, as torchao's pack_uint4); a last tile or block that the shape cuts
// short holds the elements that exist (the missing ones count as zeros, as padding would).
// Scalars a later op needs (amax, scale, scale_inv) live in tensor memory, so a step never
// waits for the device to pick a scale. Every op is elementwise or a max: deterministic.
#pragma once
#include "ops/ops.h"

enum {
    FP8_BLOCK = 128,      // the side of Float8BlockScaling's tiles (1×128 and 128×128)
    MX_BLOCK = 32,        // elements of an MX block, along a row
    NVFP4_BLOCK = 16,     // elements of an NVFP4 block, along a row (and rows of a 2-D tile)
    HADAMARD_DIM = 16,    // the random Hadamard transform's size
    HADAMARD_TE_WGRAD_SIGNS = 0xD7E8,  // TE's fixed wgrad sign vector (bit i set: sign −1)
};

typedef enum { FP8_E4M3, FP8_E5M2 } Fp8Format;
// How an amax treats NaN: skipped (Transformer Engine's fmaxf) or NaN (torch.amax).
typedef enum { AMAX_IGNORE_NAN, AMAX_PROPAGATE_NAN } AmaxNan;
typedef enum { AMAX_HISTORY_MOST_RECENT, AMAX_HISTORY_MAX } AmaxHistoryAlgo;
// MX block scales: torchao's default FLOOR, or RCEIL (cuBLAS's / TE's MXFP8 rule).
typedef enum { MX_SCALE_FLOOR, MX_SCALE_RCEIL } MxScaleMode;

// Transformer Engine's Float8CurrentScaling: amax_epsilon 0, no power-of-2 scales.
typedef struct {
    Fp8Format format;
    int pow2_scales;     // round the scale down to a power of 2
    float amax_epsilon;  // the amax is taken as at least this
} Fp8ScaleParams;

// DelayedScaling's scale from an amax history the trainer keeps (history[0] the newest).
typedef struct {
    Fp8Format format;
    int history_len;       // entries of the history that count (>= 1)
    AmaxHistoryAlgo algo;  // max over them, or the newest
    int margin;            // the scale is divided by 2^margin
} Fp8DelayedParams;

// Float8BlockScaling: tile_rows 1 (activations, gradients: 1×128) or 128 (weights: 128×128);
// the recipe's default is E4M3 with power-of-2 scales and amax_epsilon 0.
typedef struct {
    Fp8Format format;
    int tile_rows;
    int pow2_scales;
    float amax_epsilon;
} Fp8BlockParams;

// NVFP4: tile_rows 1 (1×16 blocks) or 16 (16×16 weight tiles: one scale per tile, written
// to each of its rows); stochastic: round the elements stochastically with the draws of
// seed (quant_uniform: a counter per element, so any thread order gives the same codes).
typedef struct {
    int tile_rows;
    int stochastic;
    uint64_t seed;  // drawn by the caller from its Rng (core/rng.h) for each quantization
} Nvfp4Params;

// ---- FP8 per tensor ------------------------------------------------------------------------
// quant_amax: amax[0] = max |x_i| over n (0 when n = 0), NaN treated as `nan` says.
void quant_amax(float *amax, const float *x, size_t n, AmaxNan nan);
// fp8_scale_from_amax: scale[0], scale_inv[0] = 1 / scale from amax[0] (TE's
// compute_scale_from_amax with value_for_inf = FLT_MAX).
void fp8_scale_from_amax(float *scale, float *scale_inv, const float *amax, const Fp8ScaleParams *p);
// fp8_delayed_scale: scale[0], scale_inv[0] from history (history_len) and the previous
// scale prev[0] (kept when the history's amax is 0, infinite or NaN); scale may be prev.
void fp8_delayed_scale(float *scale, float *scale_inv, const float *history, const float *prev,
                       const Fp8DelayedParams *p);
// codes (n) = saturating FP8 of x·scale[0]; y (n) = code · scale_inv[0].
void fp8_quantize_tensor(uint8_t *codes, const float *x, const float *scale, size_t n, Fp8Format f);
void fp8_dequantize_tensor(float *y, const uint8_t *codes, const float *scale_inv, size_t n, Fp8Format f);

// fp8_transpose: t (cols, rows) = codes (rows, cols) transposed, one byte per element: the
// columnwise copy of a per-tensor FP8 operand (its one scale is the rowwise copy's).
void fp8_transpose(uint8_t *t, const uint8_t *codes, int rows, int cols);
// fp8_gemm: C (M, N) = (a_scale_inv[0]·A)·(b_scale_inv[0]·B)ᵀ + beta·C, A (M, K) FP8 codes of
// format fa and B (N, K) of format fb, row-major, both along K (the "TN" layout FP8 tensor
// cores take); beta 0 (C overwritten: NaN in it does not survive) or 1 (+=). Sums are fp32
// whatever --bf16 / --fp16 set. work: (M + N)·K floats of tensor memory that a backend without
// FP8 GEMMs dequantizes A and B into (fp8_dequantize_tensor) before an fp32 mt_gemm: the cpu
// backend, and the cuda one where cuBLASLt cannot take the call (docs/precision.md); left
// alone otherwise. Backends agree closely, not bit for bit: the products of the codes are
// exact, but cuBLASLt scales each sum where the emulation scales each element, the summation
// orders differ, and FP8 tensor cores sum at reduced precision between their periodic
// promotions to fp32 (cuda/gemm_fp8.cu).
void fp8_gemm(float *C, const uint8_t *A, Fp8Format fa, const float *a_scale_inv, const uint8_t *B, Fp8Format fb,
              const float *b_scale_inv, int M, int N, int K, float beta, float *work);

// ---- FP8 in tiles ------------------------------------------------------------------------------
// codes (rows, cols); scale_inv (ceil(rows / tile_rows), ceil(cols / 128)) row-major, each
// tile's 1 / scale with its amax over the tile (NaN skipped) and value_for_inf = FLT_MAX.
void fp8_block_quantize(uint8_t *codes, float *scale_inv, const float *x, int rows, int cols,
                        const Fp8BlockParams *p);
void fp8_block_dequantize(float *y, const uint8_t *codes, const float *scale_inv, int rows, int cols,
                          const Fp8BlockParams *p);

// ---- MXFP8 ---------------------------------------------------------------------------------
// codes (rows, cols) E4M3 or E5M2; scales (rows, ceil(cols / 32)) E8M0, each block's from its
// amax (NaN propagates: a block with a NaN has scale 0xFF and dequantizes to NaN).
void mxfp8_quantize(uint8_t *codes, uint8_t *scales, const float *x, int rows, int cols, Fp8Format f,
                    MxScaleMode mode);
void mxfp8_dequantize(float *y, const uint8_t *codes, const uint8_t *scales, int rows, int cols, Fp8Format f);

// ---- NVFP4 ---------------------------------------------------------------------------------
// cols even; codes (rows, cols / 2) packed E2M1; scales (rows, ceil(cols / 16)) E4M3; amax[0]
// the tensor's amax (quant_amax with AMAX_PROPAGATE_NAN, as torchao's torch.max): the
// per-tensor scale is amax / 2688. A block whose scale is NaN dequantizes to NaN.
void nvfp4_quantize(uint8_t *codes, uint8_t *scales, const float *x, const float *amax, int rows, int cols,
                    const Nvfp4Params *p);
void nvfp4_dequantize(float *y, const uint8_t *codes, const uint8_t *scales, const float *amax, int rows,
                      int cols);
// hadamard16: y (n) = each group of 16 consecutive elements of x (n, a multiple of 16) times
// diag(signs)·H16/4 (orthogonal), signs from sign_mask (HADAMARD_TE_WGRAD_SIGNS: TE's). y and
// x do not overlap.
void hadamard16(float *y, const float *x, size_t n, uint32_t sign_mask);

// ---- shapes (host): one line and exit on a shape the ops cannot take -------------------------
static inline void quant_check_shape(const char *op, int rows, int cols, int even_cols) {
    if (rows < 0 || cols < 0) mt_die("%s: shape (%d, %d) is negative", op, rows, cols);
    if (even_cols && cols % 2) mt_die("%s: %d columns; NVFP4 packs two codes per byte and needs an even count", op, cols);
}

static inline void quant_check_gemm(const char *op, int M, int N, int K, float beta) {
    if (M < 0 || N < 0 || K < 0) mt_die("%s: shape (%d, %d, %d) is negative", op, M, N, K);
    if (beta != 0.0f && beta != 1.0f) mt_die("%s: beta %g; the op overwrites (0) or accumulates (1)", op, beta);
}

static inline void quant_check_tile_rows(const char *op, int tile_rows, int one, int square) {
    if (tile_rows != one && tile_rows != square)
        mt_die("%s: tile_rows %d; use %d (1-D blocks) or %d (square tiles)", op, tile_rows, one, square);
}

static inline void quant_check_history(const char *op, int history_len) {
    if (history_len < 1) mt_die("%s: history_len %d; the scale needs at least one amax", op, history_len);
}

static inline void quant_check_hadamard(const char *op, size_t n) {
    if (n % HADAMARD_DIM) mt_die("%s: %zu elements; the transform takes whole groups of %d", op, n, HADAMARD_DIM);
}

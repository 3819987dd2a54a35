// quantize_math.h — the one source of the quantizers' arithmetic (ops_quantize.h) for the
// cpu backend and the cuda kernels alike: amax folds, the scale of a tensor or a block
// from its amax, and the code of one element under that scale, for
//   * FP8 per tensor (Transformer Engine's Float8CurrentScaling and DelayedScaling),
//   * FP8 in 1×128 / 128×128 tiles (Transformer Engine's Float8BlockScaling, DeepSeek-V3),
//   * MXFP8 (torchao's to_mx: 32-element blocks, an E8M0 scale, FLOOR or RCEIL),
//   * NVFP4 (torchao's nvfp4_quantize with a per-tensor scale: 16-element blocks, E4M3
//     block scales, E2M1 elements; stochastic rounding; the 16-point random Hadamard
//     transform of Transformer Engine's NVFP4 recipe).
// docs/precision.md has the formulas and the references. Every function is plain float
// arithmetic in one fixed order (no fused multiply-add can change a result: each product
// is rounded before it is used), so the cpu and the cuda backend give the same bits; where
// the reference's result would depend on which NaN the hardware propagates, the NaN is
// made explicit here.
#pragma once
#include <math.h>
#include <stdint.h>

#include "core/float_formats.h"
#include "ops/ops_quantize.h"

#ifdef __CUDACC__
#define QUANT_FN static inline __host__ __device__
#else
#define QUANT_FN static inline
#endif

#define QUANT_F32_MAX 3.40282346638528859812e+38f  // FLT_MAX: TE's scale when max / amax overflows
#define QUANT_F32_MIN_NORMAL 1.17549435082228750797e-38f  // 2^-126
#define QUANT_E4M3_MIN_NORMAL 0.015625f                   // 2^-6, torchao's E4M3_EPS
#define NVFP4_TENSOR_RANGE (E4M3_MAX * E2M1_MAX)          // 2688: amax / this is the per-tensor scale
#define HADAMARD_NORM 0.25                                // 1 / sqrt(HADAMARD_DIM)

enum {
    F32_MANTISSA_BITS = 23,
    F32_EXPONENT_MASK = 0xFF,
    F32_EXPONENT_BIAS = 127,
    F32_MANTISSA_MASK = 0x7FFFFF,
    F32_POW2_MASK = 0xFF800000u,     // sign and exponent: a float rounded down to a power of 2
    F32_HALF_SUBNORMAL = 0x400000,   // 2^-127: the largest float that E8M0's 0 covers
    F32_QUIET_NAN = 0x7FC00000u,
    MX_E4M3_MAX_POW2 = 8,            // the largest power of two of E4M3 (256) and E5M2 (32768)
    MX_E5M2_MAX_POW2 = 15,
    E8M0_INF = 0xFE,                 // RCEIL's scale of an infinite amax (TE's satfinite)
    E8M0_MAX_UNBIASED = 127,
    E8M0_MIN_UNBIASED = -127,
    QUANT_RANDOM_BITS = 24,          // bits of one stochastic-rounding draw
};
#define QUANT_RANDOM_UNIT 5.9604644775390625e-08f  // 2^-24
#define QUANT_RANDOM_GOLDEN 0x9E3779B97F4A7C15ull  // splitmix64's increment

// The NaN every quantizer writes where its reference gives "some NaN".
QUANT_FN float quant_nan(void) { return bits_float(F32_QUIET_NAN); }
QUANT_FN int quant_isnan(float v) { return (float_bits(v) & ~F32_SIGN) > F32_INF; }
// v with any NaN made the one quiet NaN.
QUANT_FN float quant_canonical(float v) { return quant_isnan(v) ? quant_nan() : v; }

// ---- amax ---------------------------------------------------------------------------------

// The running max |v| of m: AMAX_IGNORE_NAN skips NaN (Transformer Engine's fmaxf);
// AMAX_PROPAGATE_NAN makes the result NaN (torch.amax). Max is exact: any order, same bits.
QUANT_FN float quant_amax_fold(float m, float v, AmaxNan nan) {
    if (quant_isnan(v)) return nan == AMAX_PROPAGATE_NAN ? quant_nan() : m;
    float a = fabsf(v);
    return quant_isnan(m) || m >= a ? m : a;
}

// ---- FP8 elements ---------------------------------------------------------------------------

QUANT_FN float fp8_max(Fp8Format f) { return f == FP8_E5M2 ? E5M2_MAX : E4M3_MAX; }
QUANT_FN uint8_t fp8_encode(Fp8Format f, float v) { return f == FP8_E5M2 ? e5m2_from_float(v) : e4m3_from_float(v); }
QUANT_FN float fp8_decode(Fp8Format f, uint8_t c) { return f == FP8_E5M2 ? e5m2_to_float(c) : e4m3_to_float(c); }
// Saturating code of x·scale; a NaN x keeps its sign (as x86's product keeps the operand).
QUANT_FN uint8_t fp8_code(Fp8Format f, float x, float scale) { return fp8_encode(f, quant_isnan(x) ? x : x * scale); }
// code · scale_inv, the dequantized value (Transformer Engine multiplies by scale_inv).
QUANT_FN float fp8_value(Fp8Format f, uint8_t c, float scale_inv) {
    return quant_canonical(fp8_decode(f, c) * scale_inv);
}

// ---- FP8 scales (Transformer Engine's compute_scale_from_amax) ------------------------------

// The quantizing scale of a tensor or tile whose amax is `amax`:
//   amax < epsilon: amax = epsilon; amax 0, infinite or NaN: 1;
//   else max / amax, value_for_inf where that overflows; pow2: rounded down to a power of 2.
QUANT_FN float fp8_amax_scale(float amax, float max, int pow2, float epsilon, float value_for_inf) {
    if (amax < epsilon) amax = epsilon;
    if (amax == 0.0f || quant_isnan(amax) || (float_bits(amax) & ~F32_SIGN) == F32_INF) return 1.0f;
    float scale = max / amax;
    if ((float_bits(scale) & ~F32_SIGN) == F32_INF) scale = value_for_inf;
    if (pow2) scale = bits_float(float_bits(scale) & F32_POW2_MASK);
    return scale;
}

QUANT_FN float fp8_scale_inv(float scale) { return 1.0f / scale; }

// DelayedScaling's new scale from an amax history (history[0] the most recent amax, `length`
// entries): amax = history[0] (most_recent) or the max of all (max, NaN skipped as fmaxf);
// scale = (max · 2^-margin) / amax when amax is finite and positive, else the previous
// scale; FLT_MAX where the quotient overflows.
QUANT_FN float fp8_history_scale(const float *history, int length, const Fp8DelayedParams *p, float previous) {
    float amax = history[0];
    if (p->algo == AMAX_HISTORY_MAX) {
        amax = 0.0f;
        for (int i = 0; i < length; i++) amax = quant_amax_fold(amax, history[i], AMAX_IGNORE_NAN);
    }
    float scaled_max = fp8_max(p->format) * (float)ldexp(1.0, -p->margin);
    int usable = !quant_isnan(amax) && (float_bits(amax) & ~F32_SIGN) != F32_INF && amax > 0.0f;
    float scale = usable ? scaled_max / amax : previous;
    return (float_bits(scale) & ~F32_SIGN) == F32_INF ? QUANT_F32_MAX : scale;
}

// ---- MXFP8: E8M0 block scales (torchao to_mx) -------------------------------------------------

QUANT_FN int mx_max_pow2(Fp8Format f) { return f == FP8_E5M2 ? MX_E5M2_MAX_POW2 : MX_E4M3_MAX_POW2; }

QUANT_FN int quant_clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// FLOOR: the biased exponent of amax minus the element format's largest power of two,
// clamped to [-127, 128] and biased; NaN amax: 0xFF.
QUANT_FN uint8_t mx_scale_floor(float amax, Fp8Format f) {
    if (quant_isnan(amax)) return E8M0_NAN;
    int exponent = (int)((float_bits(amax) >> F32_MANTISSA_BITS) & F32_EXPONENT_MASK) - F32_EXPONENT_BIAS;
    int unbiased = quant_clamp_int(exponent - mx_max_pow2(f), E8M0_MIN_UNBIASED, E8M0_MAX_UNBIASED + 1);
    return (uint8_t)(unbiased + E8M0_BIAS);
}

// RCEIL: amax / max rounded up to a power of two (the cvt.rp.satfinite.ue8m0 rule):
// NaN: 0xFF, infinity: 0xFE, else the exponent plus one when any mantissa bit is set,
// a float subnormal above 2^-127 to 2^-126, saturating at 0xFE.
QUANT_FN uint8_t mx_scale_rceil(float amax, Fp8Format f) {
    float descale = amax / fp8_max(f);
    if (quant_isnan(descale)) return E8M0_NAN;
    uint32_t b = float_bits(descale), exponent = b >> F32_MANTISSA_BITS, mantissa = b & F32_MANTISSA_MASK;
    if (exponent >= E8M0_INF) return E8M0_INF;
    int round_up = exponent == 0 ? mantissa > F32_HALF_SUBNORMAL : mantissa > 0;
    return (uint8_t)(exponent + (uint32_t)round_up);
}

QUANT_FN uint8_t mx_scale(float amax, Fp8Format f, MxScaleMode mode) {
    return mode == MX_SCALE_RCEIL ? mx_scale_rceil(amax, f) : mx_scale_floor(amax, f);
}

QUANT_FN float quant_clamp(float v, float limit) { return v < -limit ? -limit : v > limit ? limit : v; }

// The code of x in a block of scale e: FLOOR divides by max(2^(e-127), 2^-126) (0xFF:
// infinity), RCEIL multiplies by 2^(127-e) (0: by 1, 0xFE: by 2^-127, 0xFF: NaN); then
// clamped to ±max and encoded. A NaN x keeps its sign.
QUANT_FN uint8_t mx_code(float x, uint8_t e, Fp8Format f, MxScaleMode mode) {
    if (quant_isnan(x)) return fp8_encode(f, x);
    float y;
    if (mode == MX_SCALE_RCEIL) {
        if (e == E8M0_NAN) return fp8_encode(f, quant_nan());
        float factor = e == 0 ? 1.0f : e == E8M0_INF ? bits_float(F32_HALF_SUBNORMAL)
                                                     : bits_float((uint32_t)(2 * E8M0_BIAS - e) << F32_MANTISSA_BITS);
        y = x * factor;
    } else {
        float divisor = fmaxf(bits_float((uint32_t)e << F32_MANTISSA_BITS), QUANT_F32_MIN_NORMAL);
        y = quant_canonical(x / divisor);  // ±inf / inf in a NaN block
    }
    return fp8_encode(f, quant_clamp(y, fp8_max(f)));
}

// code · 2^(e-127); NaN where either is NaN.
QUANT_FN float mx_value(uint8_t c, uint8_t e, Fp8Format f) { return quant_canonical(fp8_decode(f, c) * e8m0_to_float(e)); }

// ---- NVFP4 (torchao nvfp4_quantize with a per-tensor scale) ---------------------------------

QUANT_FN float nvfp4_tensor_scale(float amax) { return amax / NVFP4_TENSOR_RANGE; }

// The E4M3 code of a block's scale: (amax / 6) / tensor_scale clamped to [2^-6, 448]
// (a NaN stays NaN).
QUANT_FN uint8_t nvfp4_block_scale(float block_amax, float tensor_scale) {
    float s = quant_canonical((block_amax / E2M1_MAX) / tensor_scale);
    s = s < QUANT_E4M3_MIN_NORMAL ? QUANT_E4M3_MIN_NORMAL : s > E4M3_MAX ? E4M3_MAX : s;
    return e4m3_from_float(s);
}

// What a block's elements are multiplied by: (1 / tensor_scale) / block_scale.
QUANT_FN float nvfp4_multiplier(float tensor_scale, uint8_t block_scale) {
    return (1.0f / tensor_scale) / e4m3_to_float(block_scale);
}

// The 24-bit uniform draw of element `index` under `seed` (splitmix64 of seed + (index+1)·φ):
// a counter-based stream, so the draw does not depend on which thread quantizes the element.
QUANT_FN float quant_uniform(uint64_t seed, uint64_t index) {
    uint64_t z = seed + (index + 1) * QUANT_RANDOM_GOLDEN;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> (64 - QUANT_RANDOM_BITS)) * QUANT_RANDOM_UNIT;
}

// E2M1 of y (|y| <= 6) rounded stochastically: up to the next representable magnitude with
// probability (|y| − lo) / (hi − lo) (exact in float), i.e. when u < that; a NaN saturates.
QUANT_FN uint8_t e2m1_stochastic(float y, float u) {
    if (quant_isnan(y)) return e2m1_from_float(y);
    uint8_t sign = (uint8_t)((float_bits(y) & F32_SIGN) >> 28), lo = 0;
    float magnitude = fabsf(y);
    while (lo < E2M1_MAX_BITS && e2m1_to_float((uint8_t)(lo + 1)) <= magnitude) lo++;
    if (lo == E2M1_MAX_BITS) return (uint8_t)(sign | lo);
    float low = e2m1_to_float(lo), high = e2m1_to_float((uint8_t)(lo + 1));
    return (uint8_t)(sign | (lo + (u < (magnitude - low) / (high - low))));
}

// The E2M1 code of x in a block with multiplier m: x·m clamped to ±6, rounded to nearest
// even, or stochastically with the draw u when stochastic.
QUANT_FN uint8_t nvfp4_code(float x, float m, int stochastic, float u) {
    float y = quant_clamp(quant_canonical(x * m), E2M1_MAX);
    return stochastic ? e2m1_stochastic(y, u) : e2m1_from_float(y);
}

// code · (tensor_scale · block scale), NaN where the block scale is NaN.
QUANT_FN float nvfp4_value(uint8_t c, uint8_t block_scale, float tensor_scale) {
    return quant_canonical(e2m1_to_float(c) * (tensor_scale * e4m3_to_float(block_scale)));
}

// ---- the 16-point random Hadamard transform -------------------------------------------------

QUANT_FN uint32_t quant_parity(uint32_t v) {
    v ^= v >> 8;
    v ^= v >> 4;
    v ^= v >> 2;
    v ^= v >> 1;
    return v & 1;
}

// y = x · diag(s) · H16 / 4 for one group of 16: y_j = ¼ Σ_i s_i·(−1)^popcount(i&j)·x_i, summed in
// double over i = 0..15 in order and rounded once; s_i = −1 where bit i of sign_mask is set.
QUANT_FN void hadamard16_group(float *y, const float *x, uint32_t sign_mask) {
    for (int j = 0; j < HADAMARD_DIM; j++) {
        double sum = 0;
        for (int i = 0; i < HADAMARD_DIM; i++) {
            uint32_t negative = ((sign_mask >> i) ^ quant_parity((uint32_t)(i & j))) & 1;
            sum += negative ? -(double)x[i] : (double)x[i];
        }
        y[j] = (float)(sum * HADAMARD_NORM);
    }
}

// ---- tiles ------------------------------------------------------------------------------------

// Blocks of `block` covering `extent` (the last one cut short).
QUANT_FN int quant_blocks(int extent, int block) { return (extent + block - 1) / block; }

// Tile t of a (rows, cols) tensor cut into tile_rows × tile_cols tiles, row-major over the
// tiles: rows [r0, r1), columns [c0, c1) (the last ones cut short by the shape).
typedef struct {
    int r0, r1, c0, c1;
} QuantTile;

QUANT_FN QuantTile quant_tile(long t, int rows, int cols, int tile_rows, int tile_cols) {
    long per_row = (cols + tile_cols - 1) / tile_cols;
    QuantTile q;
    q.r0 = (int)(t / per_row) * tile_rows;
    q.c0 = (int)(t % per_row) * tile_cols;
    q.r1 = q.r0 + tile_rows < rows ? q.r0 + tile_rows : rows;
    q.c1 = q.c0 + tile_cols < cols ? q.c0 + tile_cols : cols;
    return q;
}

// The scale of an FP8 tile from its amax (value_for_inf: fp32's largest, the input type's).
QUANT_FN float fp8_block_scale(float amax, const Fp8BlockParams *p) {
    return fp8_amax_scale(amax, fp8_max(p->format), p->pow2_scales, p->amax_epsilon, QUANT_F32_MAX);
}

// The E2M1 code of element i (the flat index row·cols + col) of an NVFP4 block.
QUANT_FN uint8_t nvfp4_element(float x, float multiplier, const Nvfp4Params *p, uint64_t i) {
    return nvfp4_code(x, multiplier, p->stochastic, p->stochastic ? quant_uniform(p->seed, i) : 0.0f);
}

// The E2M1 code of element i (flat) of a packed NVFP4 tensor: the low nibble for even i.
QUANT_FN uint8_t nvfp4_unpack(const uint8_t *codes, size_t i) {
    return (uint8_t)((codes[i / 2] >> (4 * (i & 1))) & 0xF);
}

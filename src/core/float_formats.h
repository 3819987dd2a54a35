// float_formats.h — the narrow floating-point formats moetron stores, converted to and from
// float bit by bit: bfloat16, IEEE half, FP8 E4M3 ("fn": no infinities) and FP8 E5M2, and
// the two formats of the block quantizers (ops/quantize_math.h): E8M0 (a power of two, the
// MX block scale) and FP4 E2M1 (NVFP4's elements).
// One source for the host (safetensors files, the cpu backend) and the cuda kernels.
// Every encoder rounds to nearest, ties to even, as torch's casts do; NaN stays NaN.
#pragma once
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FLOAT_FMT_FN static inline __host__ __device__
#else
#define FLOAT_FMT_FN static inline
#endif

enum {
    F32_SIGN = 0x80000000u,
    F32_INF = 0x7F800000u,
    F16_INF = 0x7C00u,
    F16_QUIET_NAN = 0x7E00u,
    E4M3_NAN = 0x7Fu,
    E4M3_MAX_BITS = 0x7Eu,  // 448
};
#define E4M3_MAX 448.0f
#define E5M2_MAX 57344.0f
#define E2M1_MAX 6.0f

enum {
    E5M2_NAN = 0x7Fu,       // S.11111.11, torch's NaN
    E5M2_MAX_BITS = 0x7Bu,  // 57344
    E8M0_BIAS = 127,
    E8M0_NAN = 0xFFu,
    E2M1_SIGN = 0x8u,
    E2M1_MAX_BITS = 0x7u,  // 6
};

FLOAT_FMT_FN uint32_t float_bits(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

FLOAT_FMT_FN float bits_float(uint32_t b) {
    float v;
    memcpy(&v, &b, sizeof v);
    return v;
}

// ---- bfloat16: the top half of a float -----------------------------------------------------
// Overflow rounds to infinity.
FLOAT_FMT_FN uint16_t bf16_from_float(float v) {
    uint32_t b = float_bits(v);
    if ((b & ~F32_SIGN) > F32_INF) return (uint16_t)((b >> 16) | 0x0040);  // NaN: keep it quiet
    return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1)) >> 16);
}

FLOAT_FMT_FN float bf16_to_float(uint16_t h) { return bits_float((uint32_t)h << 16); }

// bf16 of v with an fp32 subnormal read as ±0, else bf16_from_float: how the cpu GEMM rounds
// its bf16 inputs (ops/gemm.h; AVX-512 BF16's dot product never sees a subnormal operand).
FLOAT_FMT_FN uint16_t bf16_from_float_flushed(float v) {
    uint32_t b = float_bits(v);
    if ((b & F32_INF) == 0) return (uint16_t)((b & F32_SIGN) >> 16);
    return bf16_from_float(v);
}

// ---- IEEE half: 1 sign, 5 exponent (bias 15), 10 mantissa bits -------------------------------
// From 65520 up (the midpoint between 65504 and 2^16) the result is infinite.
FLOAT_FMT_FN uint16_t f16_from_float(float v) {
    uint32_t b = float_bits(v), sign = (b & F32_SIGN) >> 16, a = b & ~F32_SIGN;
    if (a > F32_INF) return (uint16_t)(sign | F16_QUIET_NAN);
    if (a >= 0x47800000u) return (uint16_t)(sign | F16_INF);  // 2^16 and above, infinity
    if (a < 0x38800000u) {
        // below 2^-14, a subnormal half: adding 0.5 puts the 10 result bits at the bottom of
        // the float's mantissa, rounded by the float addition itself (to nearest even)
        float aligned = bits_float(a) + 0.5f;
        return (uint16_t)(sign | (float_bits(aligned) - float_bits(0.5f)));
    }
    // rebias the exponent (127 -> 15) and round away the low 13 mantissa bits; a carry out
    // of the mantissa moves to the exponent, up to infinity
    uint32_t odd = (a >> 13) & 1;
    a += 0xC8000FFFu + odd;  // (15 - 127) << 23, plus just under half of the dropped bits
    return (uint16_t)(sign | (a >> 13));
}

FLOAT_FMT_FN float f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    if (exponent == 0x1F) return bits_float(sign | F32_INF | (mantissa << 13));  // inf / NaN
    if (exponent != 0) return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
    float subnormal = (float)mantissa * 5.9604644775390625e-08f;  // mantissa * 2^-24
    return sign ? -subnormal : subnormal;
}

// ---- FP8 E4M3 ("fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN ------
// Saturating, as Transformer Engine's casts: everything above 448 (infinity included)
// becomes ±448. (torch's float8_e4m3fn cast turns values from 464 up into NaN instead.)
FLOAT_FMT_FN uint8_t e4m3_from_float(float v) {
    uint32_t b = float_bits(v), a = b & ~F32_SIGN;
    uint8_t sign = (uint8_t)((b & F32_SIGN) >> 24);
    if (a > F32_INF) return (uint8_t)(sign | E4M3_NAN);
    float magnitude = bits_float(a);
    if (magnitude > E4M3_MAX) return (uint8_t)(sign | E4M3_MAX_BITS);
    if (magnitude < 0.015625f) {
        // below 2^-6, a subnormal: the float addition rounds to a multiple of 2^-9 (the ulp
        // of 2^14), to nearest even; a result of 8 × 2^-9 is the smallest normal, 0x08
        float rounded = (magnitude + 16384.0f) - 16384.0f;
        return (uint8_t)(sign | (uint8_t)(rounded * 512.0f));
    }
    uint32_t odd = (a >> 20) & 1;
    a += 0x7FFFFu + odd;  // round away the low 20 mantissa bits
    uint32_t exponent = (a >> 23) - 127 + 7, bits = (exponent << 3) | ((a >> 20) & 7);
    return (uint8_t)(sign | (bits > E4M3_MAX_BITS ? E4M3_MAX_BITS : bits));
}

FLOAT_FMT_FN float e4m3_to_float(uint8_t b) {
    uint32_t exponent = (b >> 3) & 0xF, mantissa = b & 0x7, sign = (uint32_t)(b & 0x80) << 24;
    if (exponent == 0xF && mantissa == 0x7) return bits_float(sign | F32_INF | 0x400000u);  // NaN
    if (exponent == 0) {
        float subnormal = (float)mantissa * 0.001953125f;  // (m/8) * 2^-6
        return sign ? -subnormal : subnormal;
    }
    return bits_float(sign | ((exponent + 120) << 23) | (mantissa << 20));
}

// ---- FP8 E5M2: the top byte of an IEEE half ---------------------------------------------------
FLOAT_FMT_FN float e5m2_to_float(uint8_t b) { return f16_to_float((uint16_t)(b << 8)); }

// Saturating as e4m3_from_float: above 57344 (infinity included) ±57344; NaN is S.11111.11.
// (torch's float8_e5m2 cast gives infinity from 61440 up instead.)
FLOAT_FMT_FN uint8_t e5m2_from_float(float v) {
    uint32_t b = float_bits(v), a = b & ~F32_SIGN;
    uint8_t sign = (uint8_t)((b & F32_SIGN) >> 24);
    if (a > F32_INF) return (uint8_t)(sign | E5M2_NAN);
    float magnitude = bits_float(a);
    if (magnitude > E5M2_MAX) return (uint8_t)(sign | E5M2_MAX_BITS);
    if (magnitude < 6.103515625e-05f) {
        // below 2^-14, a subnormal: the float addition rounds to a multiple of 2^-16 (the ulp
        // of 2^7), to nearest even; a result of 4 × 2^-16 is the smallest normal, 0x04
        float rounded = (magnitude + 128.0f) - 128.0f;
        return (uint8_t)(sign | (uint8_t)(rounded * 65536.0f));
    }
    uint32_t odd = (a >> 21) & 1;
    a += 0xFFFFFu + odd;  // round away the low 21 mantissa bits
    uint32_t exponent = (a >> 23) - 127 + 15, bits = (exponent << 2) | ((a >> 21) & 3);
    return (uint8_t)(sign | (bits > E5M2_MAX_BITS ? E5M2_MAX_BITS : bits));
}

// ---- E8M0: an unsigned biased exponent, 2^(e - 127); 0xFF is NaN ------------------------------
// 0 is 2^-127 (a float subnormal), as torchao's get_fp_scale.
FLOAT_FMT_FN float e8m0_to_float(uint8_t e) {
    if (e == E8M0_NAN) return bits_float(F32_INF | 0x400000u);
    return e ? bits_float((uint32_t)e << 23) : bits_float(0x400000u);
}

// ---- FP4 E2M1: 1 sign, 2 exponent (bias 1), 1 mantissa bit: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} ---
// No infinities or NaN: rounds to nearest even and saturates at ±6 (infinity included), as
// torchao's f32_to_f4_unpacked; a NaN becomes ±6 (a block quantizer marks its NaN blocks in
// the block's scale instead).
FLOAT_FMT_FN uint8_t e2m1_from_float(float v) {
    uint32_t b = float_bits(v), a = b & ~F32_SIGN;
    uint8_t sign = (uint8_t)((b & F32_SIGN) >> 28);
    float magnitude = bits_float(a);
    if (a > F32_INF || magnitude >= E2M1_MAX) return (uint8_t)(sign | E2M1_MAX_BITS);
    if (magnitude < 1.0f) {
        // below 1, a subnormal: the float addition rounds to a multiple of 0.5 (the ulp of
        // 2^22), to nearest even; a result of 1 is the smallest normal, 0x2
        float rounded = (magnitude + 4194304.0f) - 4194304.0f;
        return (uint8_t)(sign | (uint8_t)(rounded * 2.0f));
    }
    uint32_t odd = (a >> 22) & 1;
    a += 0x1FFFFFu + odd;  // round away the low 22 mantissa bits
    uint32_t exponent = (a >> 23) - 127 + 1, bits = (exponent << 1) | ((a >> 22) & 1);
    return (uint8_t)(sign | (bits > E2M1_MAX_BITS ? E2M1_MAX_BITS : bits));
}

FLOAT_FMT_FN float e2m1_to_float(uint8_t c) {
    uint32_t magnitude = c & E2M1_MAX_BITS, exponent = magnitude >> 1, mantissa = magnitude & 1;
    float value = exponent ? bits_float(((exponent + 126) << 23) | (mantissa << 22)) : 0.5f * (float)mantissa;
    return (c & E2M1_SIGN) ? -value : value;
}

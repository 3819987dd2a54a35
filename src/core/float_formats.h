// float_formats.h — the narrow floating-point formats moetron stores, converted to and from
// float bit by bit: bfloat16, IEEE half, FP8 E4M3 ("fn": no infinities) and FP8 E5M2.
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

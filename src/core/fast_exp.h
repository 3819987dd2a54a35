// fast_exp.h — e^x for float that the compiler vectorizes (libm's expf is a call per
// element). Range reduction x = n·ln2 + r, |r| <= ln2/2 (ln2 split in two parts, so r is
// exact to float rounding), e^r by its degree-6 Taylor polynomial, 2^n written into the
// exponent bits. Relative error below 3e-7 (about 2 ulp) for x in [-87.3, 88.3]; inputs
// are clamped to that range (e^-87.3 = 1.2e-38, the smallest normal float: the softmax
// terms it stands for are negligible against the sum's largest term, 1). Vectorizes with
// -O3 when trapping math is off (the Makefile's -fno-trapping-math; -fno-math-errno lets sqrt
// vectorize too).
#pragma once
#include <stdint.h>
#include <string.h>

static inline float fast_expf(float x) {
    x = x > -87.33654f ? x : -87.33654f;
    x = x < 88.3f ? x : 88.3f;  // n <= 127: 2^n stays a finite float
    const float round_shift = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer
    float shifted = x * 1.44269504088896341f + round_shift;
    float n = shifted - round_shift;
    float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.16666667f + r * (0.041666668f + r * (0.008333334f +
                                                                                        r * 0.0013888889f)))));
    int32_t shifted_bits;
    memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
    int32_t exponent_bits = (shifted_bits - 0x4B400000 + 127) << 23;  // n sits in the low mantissa bits
    float two_to_n;
    memcpy(&two_to_n, &exponent_bits, sizeof(two_to_n));
    return p * two_to_n;
}

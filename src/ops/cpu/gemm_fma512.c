// gemm_fma512.c — the fp32 micro-kernel on AVX-512 F (gemm_fma512.h).
#include "ops/cpu/gemm_fma512.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(MT_DOUBLE)
#include <immintrin.h>

enum { FLOATS = 16 };  // floats in a 512-bit register

int fma512_available(void) {
    static int known = -1;  // asked once; racing first calls compute the same
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f");
    }
    return known;
}

__attribute__((target("avx512f"))) void fma512_micro(int kc, const real *a, const real *b, real *acc) {
    __m512 c[FMA512_MR][2];
    for (int i = 0; i < FMA512_MR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++, a += FMA512_MR, b += FMA512_NR) {
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + FLOATS);
        for (int i = 0; i < FMA512_MR; i++) {
            __m512 ai = _mm512_set1_ps(a[i]);
            c[i][0] = _mm512_fmadd_ps(ai, b0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(ai, b1, c[i][1]);
        }
    }
    for (int i = 0; i < FMA512_MR; i++) {
        _mm512_storeu_ps(acc + i * FMA512_NR, c[i][0]);
        _mm512_storeu_ps(acc + i * FMA512_NR + FLOATS, c[i][1]);
    }
}
#else
int fma512_available(void) { return 0; }

void fma512_micro(int kc, const real *a, const real *b, real *acc) {
    (void)kc, (void)a, (void)b, (void)acc;
    mt_die("internal error: the AVX-512 fp32 GEMM kernel called on a CPU or build without it (please report)");
}
#endif

// gemm_fma.c — the fp32 micro-kernels on AVX2 FMA and AVX-512 F (gemm_fma.h).
#include "ops/cpu/gemm_fma.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(MT_DOUBLE)
#include <immintrin.h>

enum {
    FLOATS_256 = 8,   // floats in a 256-bit register
    FLOATS_512 = 16,  // in a 512-bit one
};

int fma_have_avx2(void) {
    static int known = -1;  // asked once; racing first calls compute the same
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return known;
}

int fma_have_avx512(void) {
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f");
    }
    return known;
}

// Two vectors per row of the tile at each width; the same loop, written per instruction set.
__attribute__((target("avx2,fma"))) void fma_micro_avx2(int kc, const real *a, const real *b, real *acc) {
    __m256 c[FMA_MR][2];
    for (int i = 0; i < FMA_MR; i++) c[i][0] = c[i][1] = _mm256_setzero_ps();
#pragma GCC unroll 2
    for (int k = 0; k < kc; k++, a += FMA_MR, b += FMA_NR) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + FLOATS_256);
        for (int i = 0; i < FMA_MR; i++) {
            __m256 ai = _mm256_set1_ps(a[i]);
            c[i][0] = _mm256_fmadd_ps(ai, b0, c[i][0]);
            c[i][1] = _mm256_fmadd_ps(ai, b1, c[i][1]);
        }
    }
    for (int i = 0; i < FMA_MR; i++) {
        _mm256_storeu_ps(acc + i * FMA_NR, c[i][0]);
        _mm256_storeu_ps(acc + i * FMA_NR + FLOATS_256, c[i][1]);
    }
}

__attribute__((target("avx512f"))) void fma_micro_avx512(int kc, const real *a, const real *b, real *acc) {
    __m512 c[FMA512_MR][2];
    for (int i = 0; i < FMA512_MR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++, a += FMA512_MR, b += FMA512_NR) {
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + FLOATS_512);
        for (int i = 0; i < FMA512_MR; i++) {
            __m512 ai = _mm512_set1_ps(a[i]);
            c[i][0] = _mm512_fmadd_ps(ai, b0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(ai, b1, c[i][1]);
        }
    }
    for (int i = 0; i < FMA512_MR; i++) {
        _mm512_storeu_ps(acc + i * FMA512_NR, c[i][0]);
        _mm512_storeu_ps(acc + i * FMA512_NR + FLOATS_512, c[i][1]);
    }
}
#else
int fma_have_avx2(void) { return 0; }
int fma_have_avx512(void) { return 0; }

static _Noreturn void not_here(void) {
    mt_die("internal error: an FMA GEMM kernel called on a CPU or build without it (please report)");
}

void fma_micro_avx2(int kc, const real *a, const real *b, real *acc) {
    (void)kc, (void)a, (void)b, (void)acc;
    not_here();
}

void fma_micro_avx512(int kc, const real *a, const real *b, real *acc) {
    (void)kc, (void)a, (void)b, (void)acc;
    not_here();
}
#endif

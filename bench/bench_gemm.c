// bench_gemm.c — GFLOP/s of mt_gemm, portable backend and (when linked) OpenBLAS,
// on the shapes moetron cares about. Built by `make bench` (or by hand:
//
//   gcc -std=c11 -D_GNU_SOURCE -O3 -march=native -fopenmp -Isrc -DMT_HAVE_CBLAS
//       bench/bench_gemm.c src/ops/cpu/gemm.c src/core/common.c -o build/bench_gemm
//       -lopenblas -lm
// one line; drop -DMT_HAVE_CBLAS and -lopenblas to measure the portable path alone)
//
// Usage: build/bench_gemm [M N K [ta tb]]   (no arguments: the standard table)
// Each line: fp32 GFLOP/s, then the 16-bit-input modes (gemm.h: each bf16 kernel this CPU
// has — amx, avx512-bf16, emulated — and fp16, emulated), in GFLOP/s of the same arithmetic.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/gemm.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// A freshly allocated [n] array of uniform values in [-1, 1).
static real *random_array(size_t n, unsigned seed) {
    real *x = mt_malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (real)((seed >> 8) * (1.0 / 8388608.0) - 1.0);
    }
    return x;
}

// Best GFLOP/s over repeated runs of C[M,N] = op(A) op(B) for about 0.6 s.
static double time_gemm(int ta, int tb, int M, int N, int K) {
    real *A = random_array((size_t)M * K, 1), *B = random_array((size_t)K * N, 2);
    real *C = random_array((size_t)M * N, 3);
    int lda = ta ? M : K, ldb = tb ? K : N;
    mt_gemm(ta, tb, M, N, K, 1, A, lda, B, ldb, 0, C, N);  // warm-up
    double best = 1e30, start = now_s();
    int reps = 0;
    while (reps < 3 || now_s() - start < 0.6) {
        double t0 = now_s();
        mt_gemm(ta, tb, M, N, K, 1, A, lda, B, ldb, 0, C, N);
        double dt = now_s() - t0;
        if (dt < best) best = dt;
        reps++;
    }
    free(A);
    free(B);
    free(C);
    return 2.0 * M * N * K / best * 1e-9;
}

// One line of the table: the shape, then GFLOP/s for each backend.
static void bench_shape(int ta, int tb, int M, int N, int K) {
    printf("%5d x %5d x %5d  %c%c ", M, N, K, ta ? 'T' : 'N', tb ? 'T' : 'N');
    mt_gemm_force_portable(1);
    printf("  portable %7.1f GFLOP/s", time_gemm(ta, tb, M, N, K));
    mt_gemm_force_portable(0);
    if (mt_gemm_backend()[0] == 'o') printf("  openblas %7.1f GFLOP/s", time_gemm(ta, tb, M, N, K));
#ifndef MT_DOUBLE
    static const GemmInputs lowp[] = {GEMM_INPUTS_BF16, GEMM_INPUTS_BF16, GEMM_INPUTS_BF16, GEMM_INPUTS_FP16};
    static const char *const kernels[] = {"amx", "avx512-bf16", "emulated", NULL};
    const char *shown[4];
    int n_shown = 0;
    for (int m = 0; m < 4; m++) {  // each bf16 kernel this CPU has (once), then fp16 (emulated)
        mt_gemm_set_inputs(lowp[m]);
        mt_gemm_use_bf16_kernel(kernels[m]);
        int seen = 0;
        for (int i = 0; i < n_shown; i++) seen |= !strcmp(shown[i], mt_gemm_kernel());
        if (seen) continue;  // the CPU lacks the kernel asked for: it fell back to one shown
        shown[n_shown++] = mt_gemm_kernel();
        printf("  %s %7.1f", mt_gemm_kernel(), time_gemm(ta, tb, M, N, K));
    }
    mt_gemm_use_bf16_kernel(NULL);
    mt_gemm_set_inputs(GEMM_INPUTS_FP32);
#endif
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    printf("real = %s\n", sizeof(real) == 4 ? "float" : "double");
    if (argc >= 4) {
        int ta = argc > 4 ? atoi(argv[4]) : 0, tb = argc > 5 ? atoi(argv[5]) : 0;
        bench_shape(ta, tb, atoi(argv[1]), atoi(argv[2]), atoi(argv[3]));
        return 0;
    }
    static const int shapes[][3] = {{256, 256, 256}, {512, 512, 512}, {1024, 1024, 1024},
                                    {4096, 128, 512}, {128, 4096, 512}, {64, 512, 512}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        bench_shape(0, 0, shapes[s][0], shapes[s][1], shapes[s][2]);
    for (int t = 1; t < 4; t++) bench_shape(t >> 1, t & 1, 512, 512, 512);
    return 0;
}

// test_gemm.c — mt_gemm and the grouped variants against a naive double-precision
// reference: every transpose combination, odd and block-crossing sizes, alpha/beta,
// padded leading dimensions, beta == 0 over NaN, zero sizes, bitwise determinism
// across OpenMP thread counts, OpenBLAS vs portable when both are built in, and all of it on
// each fp32 tile the CPU runs (AVX-512's and the portable one), which agree bit for bit.
#include <math.h>
#include <string.h>

#include "ops/gemm.h"
#include "testlib.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef MT_DOUBLE
#define RTOL 1e-12
#else
#define RTOL 1e-5
#endif

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

// Deterministic uniform values in [-1, 1) from a caller-owned LCG state.
static double lcg_uniform(unsigned long long *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) * (1.0 / 4503599627370496.0) - 1.0;
}

// x[n] <- uniform [-1, 1)
static void fill_random(real *x, size_t n, unsigned long long seed) {
    unsigned long long s = seed * 2654435761ULL + 1;
    for (size_t i = 0; i < n; i++) x[i] = (real)lcg_uniform(&s);
}

// x[n] <- v
static void fill_value(real *x, size_t n, real v) {
    for (size_t i = 0; i < n; i++) x[i] = v;
}

// op(A)[i,k] for A stored [M,K] (lda) or, with trans, [K,M] (lda).
static double op_at(const real *A, int lda, int trans, int i, int k) {
    return trans ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
}

// ref[M,N] = alpha * op(A) op(B) + beta * C0 in double, and scale[M,N] = the same
// sum over absolute values (the error bound's magnitude). C0 is [M,N] with ldc.
static void ref_gemm(int ta, int tb, int M, int N, int K, double alpha, const real *A, int lda,
                     const real *B, int ldb, double beta, const real *C0, int ldc, double *ref,
                     double *scale) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                double p = op_at(A, lda, ta, i, k) * op_at(B, ldb, !tb, j, k);
                s += p;
                a += fabs(p);
            }
            double c0 = beta == 0 ? 0 : beta * C0[(size_t)i * ldc + j];
            ref[(size_t)i * N + j] = alpha * s + c0;
            scale[(size_t)i * N + j] = fabs(alpha) * a + fabs(c0);
        }
}

// Number of elements of C[M,N] (ldc) outside RTOL of ref; reports the first one.
static int count_bad(const real *C, int ldc, const double *ref, const double *scale, int M, int N,
                     const char *what) {
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double got = C[(size_t)i * ldc + j], want = ref[(size_t)i * N + j];
            double tol = RTOL * scale[(size_t)i * N + j] + 1e-30;
            if (!(fabs(got - want) <= tol)) {
                if (!bad) CHECK(0, "%s: C[%d,%d] = %.9g, expected %.9g", what, i, j, got, want);
                bad++;
            }
        }
    return bad;
}

// Run one mt_gemm with the given shape / transposes / padding and compare it to the
// reference; C starts random (or NaN when c_nan). Padding of C must stay untouched.
static int check_case(int ta, int tb, int M, int N, int K, real alpha, real beta, int pad,
                      int c_nan, unsigned long long seed) {
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    size_t a_n = (size_t)(ta ? K : M) * lda, b_n = (size_t)(tb ? N : K) * ldb,
           c_n = (size_t)M * ldc;
    real *A = mt_malloc((a_n + 1) * sizeof(real)), *B = mt_malloc((b_n + 1) * sizeof(real));
    real *C = mt_malloc((c_n + 1) * sizeof(real)), *C0 = mt_malloc((c_n + 1) * sizeof(real));
    double *ref = mt_malloc(((size_t)M * N + 1) * sizeof(double));
    double *scale = mt_malloc(((size_t)M * N + 1) * sizeof(double));
    fill_random(A, a_n, seed);
    fill_random(B, b_n, seed + 1);
    if (c_nan) fill_value(C, c_n, (real)NAN);
    else fill_random(C, c_n, seed + 2);
    memcpy(C0, C, c_n * sizeof(real));
    ref_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, ref, scale);
    mt_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    char what[160];
    snprintf(what, sizeof what, "%s ta=%d tb=%d M=%d N=%d K=%d alpha=%g beta=%g pad=%d",
             mt_gemm_backend(), ta, tb, M, N, K, (double)alpha, (double)beta, pad);
    int bad = count_bad(C, ldc, ref, scale, M, N, what);
    for (int i = 0; i < M && pad; i++)
        for (int j = N; j < ldc; j++)
            if (memcmp(&C[(size_t)i * ldc + j], &C0[(size_t)i * ldc + j], sizeof(real))) {
                if (!bad) CHECK(0, "%s: padding C[%d,%d] was written", what, i, j);
                bad++;
            }
    free(A), free(B), free(C), free(C0), free(ref), free(scale);
    return bad;
}

// How many backends this build can exercise: 2 with OpenBLAS (default, then
// portable), 1 without. select_backend(b) switches to backend b.
static int backend_count(void) {
    mt_gemm_force_portable(0);
    return strcmp(mt_gemm_backend(), "openblas") == 0 ? 2 : 1;
}
static void select_backend(int b) { mt_gemm_force_portable(b == 1); }

// ---------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------

// Every size 1..67 (cubes and mixed shapes), all four transpose combinations.
static void test_odd_sizes_all_transposes(void) {
    for (int b = 0; b < backend_count(); b++) {
        select_backend(b);
        int bad = 0;
        for (int s = 1; s <= 67 && !bad; s++)
            for (int t = 0; t < 4 && !bad; t++) {
                bad += check_case(t >> 1, t & 1, s, s, s, 1, 0, 0, 0, 100 + s);
                bad += check_case(t >> 1, t & 1, s, s % 23 + 1, (s * 7) % 67 + 1, 1, 0, 0, 0, s);
                bad += check_case(t >> 1, t & 1, (s * 13) % 67 + 1, s, s % 5 + 1, 1, 0, 0, 0, s);
            }
    }
    mt_gemm_force_portable(0);
}

// Shapes that cross the KC, MC and NC block edges and the thread grid.
static void test_large_shapes(void) {
    static const int shapes[][3] = {{130, 257, 129}, {300, 40, 600}, {7, 1100, 300},
                                    {1000, 17, 513}, {145, 513, 257}, {66, 70, 1030}};
    for (int b = 0; b < backend_count(); b++) {
        select_backend(b);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int t = 0; t < 4; t++)
                check_case(t >> 1, t & 1, shapes[s][0], shapes[s][1], shapes[s][2], (real)0.75,
                           (real)0.5, 3, 0, 7 * s + t);
    }
    mt_gemm_force_portable(0);
}

// alpha / beta combinations, including negative and fractional values.
static void test_alpha_beta(void) {
    static const real alphas[] = {1, -1, (real)0.5, (real)2.5};
    static const real betas[] = {0, 1, -1, (real)0.25, (real)-1.5};
    for (int b = 0; b < backend_count(); b++) {
        select_backend(b);
        for (int ai = 0; ai < 4; ai++)
            for (int bi = 0; bi < 5; bi++)
                for (int t = 0; t < 4; t++) {
                    check_case(t >> 1, t & 1, 13, 29, 41, alphas[ai], betas[bi], 0, 0, ai * 5 + bi);
                    check_case(t >> 1, t & 1, 70, 90, 300, alphas[ai], betas[bi], 0, 0, ai + bi);
                }
    }
    mt_gemm_force_portable(0);
}

// Leading dimensions larger than the widths; padding of C must be left alone.
static void test_leading_dims(void) {
    for (int b = 0; b < backend_count(); b++) {
        select_backend(b);
        for (int t = 0; t < 4; t++) {
            check_case(t >> 1, t & 1, 9, 21, 17, 1, 0, 5, 0, 1 + t);
            check_case(t >> 1, t & 1, 33, 47, 65, (real)1.5, (real)-0.5, 11, 0, 2 + t);
            check_case(t >> 1, t & 1, 100, 200, 300, 1, 1, 1, 0, 3 + t);
        }
    }
    mt_gemm_force_portable(0);
}

// beta == 0 overwrites C even when it holds NaN, on both backends and edge tiles.
static void test_beta_zero_overwrites_nan(void) {
    for (int b = 0; b < backend_count(); b++) {
        select_backend(b);
        for (int t = 0; t < 4; t++) {
            check_case(t >> 1, t & 1, 7, 19, 5, 1, 0, 2, 1, 10 + t);
            check_case(t >> 1, t & 1, 150, 70, 260, -2, 0, 0, 1, 20 + t);
        }
    }
    mt_gemm_force_portable(0);
}

// M or N == 0: nothing is touched; K == 0 or alpha == 0: C = beta * C, A/B unread.
static void test_zero_sizes(void) {
    for (int b = 0; b < backend_count(); b++) {
        select_backend(b);
        real C[12], A[12], B[12];
        fill_value(C, 12, 3);
        mt_gemm(0, 0, 0, 4, 3, 1, NULL, 3, NULL, 4, 0, C, 4);
        mt_gemm(1, 1, 3, 0, 3, 1, NULL, 3, NULL, 3, 0, C, 4);
        CHECK(C[0] == 3 && C[11] == 3, "M or N == 0 changed C");
        mt_gemm(0, 0, 3, 4, 0, 1, NULL, 1, NULL, 4, 2, C, 4);
        CHECK(C[0] == 6 && C[11] == 6, "K == 0, beta == 2: got %g", (double)C[0]);
        fill_value(C, 12, (real)NAN);
        mt_gemm(1, 0, 3, 4, 0, 1, NULL, 3, NULL, 4, 0, C, 4);
        CHECK(C[0] == 0 && C[11] == 0, "K == 0, beta == 0 over NaN: got %g", (double)C[0]);
        fill_value(A, 12, (real)NAN);
        fill_value(B, 12, 1);
        fill_value(C, 12, 1);
        mt_gemm(0, 0, 3, 4, 3, 0, A, 3, B, 4, (real)0.5, C, 4);
        CHECK(C[0] == (real)0.5 && C[11] == (real)0.5, "alpha == 0 read A: got %g", (double)C[0]);
        check_case(0, 0, 1, 1, 1, 1, 0, 0, 0, 5);
        check_case(1, 1, 1, 1, 1, 1, 1, 0, 0, 6);
    }
    mt_gemm_force_portable(0);
}

// The portable path gives bitwise-identical C for 1, 2, 3 and 4 OpenMP threads.
static void test_deterministic_across_threads(void) {
#ifdef _OPENMP
    static const int shapes[][3] = {{200, 300, 517}, {4096, 128, 300}, {37, 1000, 700},
                                    {512, 512, 512}, {65, 67, 1000}};
    int saved = omp_get_max_threads();
    mt_gemm_force_portable(1);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            real *A = mt_malloc((size_t)M * K * sizeof(real));
            real *B = mt_malloc((size_t)K * N * sizeof(real));
            real *C1 = mt_malloc((size_t)M * N * sizeof(real));
            real *Cn = mt_malloc((size_t)M * N * sizeof(real));
            fill_random(A, (size_t)M * K, 50 + s);
            fill_random(B, (size_t)K * N, 60 + s);
            fill_random(C1, (size_t)M * N, 70 + s);
            memcpy(Cn, C1, (size_t)M * N * sizeof(real));
            int lda = (t >> 1) ? M : K, ldb = (t & 1) ? K : N;
            omp_set_num_threads(1);
            mt_gemm(t >> 1, t & 1, M, N, K, (real)0.5, A, lda, B, ldb, (real)0.25, C1, N);
            for (int nth = 2; nth <= 4; nth++) {
                real *Ct = mt_malloc((size_t)M * N * sizeof(real));
                memcpy(Ct, Cn, (size_t)M * N * sizeof(real));
                omp_set_num_threads(nth);
                mt_gemm(t >> 1, t & 1, M, N, K, (real)0.5, A, lda, B, ldb, (real)0.25, Ct, N);
                CHECK(memcmp(C1, Ct, (size_t)M * N * sizeof(real)) == 0,
                      "%dx%dx%d ta=%d tb=%d: %d threads differ from 1 thread", M, N, K, t >> 1,
                      t & 1, nth);
                free(Ct);
            }
            free(A), free(B), free(C1), free(Cn);
        }
    omp_set_num_threads(saved);
    mt_gemm_force_portable(0);
#endif
}

// OpenBLAS (when built in) and the portable path agree to within RTOL * scale.
static void test_backends_agree(void) {
    if (backend_count() < 2) return;
    const int M = 123, N = 301, K = 777;
    real *A = mt_malloc((size_t)M * K * sizeof(real));
    real *B = mt_malloc((size_t)K * N * sizeof(real));
    real *C1 = mt_malloc((size_t)M * N * sizeof(real));
    real *C2 = mt_malloc((size_t)M * N * sizeof(real));
    fill_random(A, (size_t)M * K, 1);
    fill_random(B, (size_t)K * N, 2);
    mt_gemm_force_portable(0);
    mt_gemm(0, 1, M, N, K, 1, A, K, B, K, 0, C1, N);
    mt_gemm_force_portable(1);
    mt_gemm(0, 1, M, N, K, 1, A, K, B, K, 0, C2, N);
    mt_gemm_force_portable(0);
    int bad = 0;
    for (size_t i = 0; i < (size_t)M * N; i++)
        if (!(fabs((double)C1[i] - C2[i]) <= RTOL * K)) bad++;
    CHECK(bad == 0, "openblas and portable differ in %d elements", bad);
    free(A), free(B), free(C1), free(C2);
}

// mt_gemm_grouped: the experts' weights one block, groups back to back in A and C, an empty
// group; the rows of C past the groups stay untouched.
static void test_grouped(void) {
    enum { G = 5, N = 37, K = 70, TAIL = 2 };
    const int32_t rows[G] = {5, 0, 17, 1, 40};
    for (int b = 0; b < backend_count(); b++) {
        select_backend(b);
        for (int tb = 0; tb < 2; tb++) {
            size_t first[G], total = 0, stride = (size_t)K * N;
            for (int g = 0; g < G; g++) {
                first[g] = total;
                total += rows[g];
            }
            real *A = mt_malloc(total * K * sizeof(real));
            real *C = mt_malloc((total + TAIL) * N * sizeof(real));
            real *C0 = mt_malloc((total + TAIL) * N * sizeof(real)), *W = mt_malloc(G * stride * sizeof(real));
            fill_random(A, total * K, 9);
            fill_random(C, (total + TAIL) * N, 10);
            memcpy(C0, C, (total + TAIL) * N * sizeof(real));
            for (int g = 0; g < G; g++) fill_random(W + g * stride, stride, 20 + g);
            int ldb = tb ? K : N;
            mt_gemm_grouped(0, tb, G, rows, NULL, N, K, (real)1.5, A, STORE_FP32, K, W, stride, ldb, (real)0.5, C,
                            STORE_FP32, N);
            double *ref = mt_malloc((size_t)40 * N * sizeof(double));
            double *scale = mt_malloc((size_t)40 * N * sizeof(double));
            for (int g = 0; g < G; g++) {
                ref_gemm(0, tb, rows[g], N, K, 1.5, A + first[g] * K, K, W + g * stride, ldb, 0.5,
                         C0 + first[g] * N, N, ref, scale);
                count_bad(C + first[g] * N, N, ref, scale, rows[g], N, "grouped");
            }
            CHECK(memcmp(C + total * N, C0 + total * N, TAIL * N * sizeof(real)) == 0,
                  "grouped wrote rows past the groups");
            free(W), free(A), free(C), free(C0), free(ref), free(scale);
        }
    }
    mt_gemm_force_portable(0);
}

// mt_gemm_grouped_wgrad: W_g[out, in] += alpha * dY_g^T X_g per group, the W_g one block.
static void test_grouped_wgrad(void) {
    enum { G = 4, OUT = 24, IN = 53 };
    const int32_t rows[G] = {3, 0, 300, 31};
    for (int b = 0; b < backend_count(); b++) {
        select_backend(b);
        size_t first[G], total = 0, stride = OUT * IN;
        for (int g = 0; g < G; g++) {
            first[g] = total;
            total += rows[g];
        }
        real *dY = mt_malloc(total * OUT * sizeof(real)), *X = mt_malloc(total * IN * sizeof(real));
        real *W = mt_malloc(G * stride * sizeof(real)), *W0 = mt_malloc(G * stride * sizeof(real));
        fill_random(dY, total * OUT, 31);
        fill_random(X, total * IN, 32);
        for (int g = 0; g < G; g++) fill_random(W + g * stride, stride, 40 + g);
        memcpy(W0, W, G * stride * sizeof(real));
        mt_gemm_grouped_wgrad(G, rows, NULL, OUT, IN, (real)-0.5, dY, STORE_FP32, X, STORE_FP32, W, stride);
        double ref[OUT * IN], scale[OUT * IN];
        for (int g = 0; g < G; g++) {
            ref_gemm(1, 0, OUT, IN, rows[g], -0.5, dY + first[g] * OUT, OUT, X + first[g] * IN, IN, 1,
                     W0 + g * stride, IN, ref, scale);
            count_bad(W + g * stride, IN, ref, scale, OUT, IN, "grouped_wgrad");
            if (rows[g] == 0)
                CHECK(memcmp(W + g * stride, W0 + g * stride, OUT * IN * sizeof(real)) == 0, "empty group changed W");
        }
        free(W), free(W0), free(dY), free(X);
    }
    mt_gemm_force_portable(0);
}

// C of every transpose combination, block-crossing and edge shapes, alpha/beta, on the fp32 tile
// `kernel` (mt_gemm_use_fp32_kernel) of the portable backend, into Cs (one after the other).
enum {
    SAME_BITS_SHAPE_COUNT = 5,
    TRANSPOSES = 4,                        // (ta, tb) = (t >> 1, t & 1)
    CASES_PER_SHAPE = TRANSPOSES * 2,      // beta 0 and 1
    SAME_BITS_CASES = SAME_BITS_SHAPE_COUNT * CASES_PER_SHAPE,
};
static const int SAME_BITS_SHAPES[SAME_BITS_SHAPE_COUNT][3] = {
    {1, 1, 1}, {7, 33, 5}, {37, 100, 300}, {200, 67, 517}, {300, 300, 256}};

static void same_bits_run(const char *kernel, real **Cs) {
    mt_gemm_force_portable(1);
    mt_gemm_use_fp32_kernel(kernel);
    int n = 0;
    for (int s = 0; s < SAME_BITS_SHAPE_COUNT; s++)
        for (int t = 0; t < TRANSPOSES; t++)
            for (int accumulate = 0; accumulate < 2; accumulate++, n++) {
                int M = SAME_BITS_SHAPES[s][0], N = SAME_BITS_SHAPES[s][1], K = SAME_BITS_SHAPES[s][2];
                real *A = mt_malloc((size_t)M * K * sizeof(real)), *B = mt_malloc((size_t)K * N * sizeof(real));
                Cs[n] = mt_malloc((size_t)M * N * sizeof(real));
                fill_random(A, (size_t)M * K, 80 + s);
                fill_random(B, (size_t)K * N, 90 + s);
                fill_random(Cs[n], (size_t)M * N, 100 + s);
                mt_gemm(t >> 1, t & 1, M, N, K, (real)0.75, A, (t >> 1) ? M : K, B, (t & 1) ? K : N,
                        accumulate ? (real)1 : (real)0, Cs[n], N);
                free(A), free(B);
            }
    mt_gemm_use_fp32_kernel(NULL);
    mt_gemm_force_portable(0);
}

// The AVX-512 tile and the portable one sum each element by the same fused multiply-adds in the
// same order: the same bits.
static void test_fp32_tiles_same_bits(void) {
    mt_gemm_use_fp32_kernel("avx512");
    if (strcmp(mt_gemm_kernel(), "avx512 fp32") && strcmp(mt_gemm_kernel(), "openblas fp32"))
        printf("     (no AVX-512 on this CPU: one fp32 tile, compared with itself)\n");
    mt_gemm_use_fp32_kernel(NULL);
    real *wide[SAME_BITS_CASES], *portable[SAME_BITS_CASES];
    same_bits_run("avx512", wide);
    same_bits_run("portable", portable);
    for (int n = 0; n < SAME_BITS_CASES; n++) {
        int s = n / CASES_PER_SHAPE, M = SAME_BITS_SHAPES[s][0], N = SAME_BITS_SHAPES[s][1];
        CHECK(memcmp(wide[n], portable[n], (size_t)M * N * sizeof(real)) == 0, "case %d (%dx%dx%d): tiles differ", n,
              M, N, SAME_BITS_SHAPES[s][2]);
        free(wide[n]), free(portable[n]);
    }
}

// The suite on one fp32 tile.
static void run_all(const char *kernel) {
    mt_gemm_use_fp32_kernel(kernel);
    mt_gemm_force_portable(1);
    printf("gemm backend: %s; portable kernel: %s\n", mt_gemm_backend(), mt_gemm_kernel());
    mt_gemm_force_portable(0);
    RUN(test_odd_sizes_all_transposes);
    RUN(test_large_shapes);
    RUN(test_alpha_beta);
    RUN(test_leading_dims);
    RUN(test_beta_zero_overwrites_nan);
    RUN(test_zero_sizes);
    RUN(test_deterministic_across_threads);
    RUN(test_backends_agree);
    RUN(test_grouped);
    RUN(test_grouped_wgrad);
}

int main(void) {
    run_all("portable");
    run_all("avx512");  // the portable tile again where the CPU lacks AVX-512
    RUN(test_fp32_tiles_same_bits);
    TESTS_DONE();
}

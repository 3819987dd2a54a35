// test_gemm_lowp.c — the cpu GEMM with 16-bit inputs (mt_gemm_set_inputs): bf16 and fp16
// against a scalar reference of the contract in gemm.h bit for bit (inputs rounded, each
// product added by one fused multiply-add in order over blocks of MT_GEMM_K_BLOCK, bf16
// flushing subnormals), on random and adversarial values (rounding ties, subnormals,
// overflow, NaN) and every transpose; the AVX-512 BF16 kernel against the emulation bit
// for bit where the CPU has it, and so the measured choice between them ("portable"); the
// same bits on 1 and 2 threads and wherever an element's tile lies; fp32's bits again after
// switching back.
#include <string.h>

#include "core/float_formats.h"
#include "ops/cpu/gemm_lowp.h"
#include "ops/gemm.h"
#include "testlib.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

enum { VALUES_RANDOM, VALUES_ADVERSARIAL, VALUES_TINY };

// A value near 2^-63 (either sign): products near 2^-126, so that partial sums go
// subnormal and the flushing shows.
static float tiny(unsigned long long r) {
    int exponent = 127 - 63 + (int)(r % 6) - 3;
    return bits_float(((uint32_t)((r >> 8) & 1) << 31) | ((uint32_t)exponent << 23) | ((uint32_t)(r >> 16) & 0x7FFFFFu));
}

static unsigned long long lcg(unsigned long long *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 11;
}

// One value of the adversarial mix: ordinary, a bf16 / fp16 rounding tie, fp32 and bf16
// subnormals, values whose products fall near the subnormal range, huge (overflowing fp16),
// zeros of both signs, rarely NaN or infinity.
static float adversarial(unsigned long long *s) {
    unsigned long long r = lcg(s);
    float u = (float)((double)(r >> 11) / 2251799813685248.0 - 1.0);
    switch (r % 11) {
    case 0: return bits_float((float_bits(u) & 0xFFFF0000u) | 0x8000u);          // bf16 tie
    case 1: return bits_float((float_bits(u) & 0xFFFFE000u) | 0x1000u);          // fp16 tie
    case 2: return bits_float((uint32_t)(r >> 20) & 0x807FFFFFu);                 // fp32 subnormal
    case 3: return u * 1e-19f;                                                     // products ~1e-38
    case 4: return u * 7e4f;                                                       // past fp16's max
    case 5: return (r >> 30) & 1 ? 0.0f : -0.0f;
    case 6: return (r >> 40) % 64 == 0 ? ((r >> 50) & 1 ? NAN : INFINITY) : u;
    default: return u;
    }
}

static void fill(real *x, size_t n, int kind, unsigned long long seed) {
    unsigned long long s = seed * 2654435761ULL + 7;
    for (size_t i = 0; i < n; i++)
        x[i] = kind == VALUES_ADVERSARIAL ? adversarial(&s)
               : kind == VALUES_TINY    ? tiny(lcg(&s))
                                        : (float)((double)lcg(&s) / 4503599627370496.0 - 1.0);
}

// The contract's rounding of one operand, from float_formats.h (not the code under test):
// bf16 with an fp32 subnormal first made ±0, or IEEE half.
static float rounded(float v, GemmInputs inputs) {
    if (inputs == GEMM_INPUTS_FP16) return f16_to_float(f16_from_float(v));
    if ((float_bits(v) & 0x7F800000u) == 0) return bits_float(float_bits(v) & F32_SIGN);
    return bf16_to_float(bf16_from_float(v));
}

static float op_at(const real *A, int ld, int trans, int i, int k) {
    return trans ? A[(size_t)k * ld + i] : A[(size_t)i * ld + k];
}

// The contract's sum of one block, depths [k0, k1): fused multiply-adds in order, under
// flush-to-zero for bf16.
static float block_sum(int ta, int tb, const real *A, int lda, const real *B, int ldb, int i, int j, int k0, int k1,
                       GemmInputs inputs) {
    float acc = 0;
#if defined(__x86_64__)
    unsigned saved = _mm_getcsr();
    if (inputs == GEMM_INPUTS_BF16) _mm_setcsr(saved | 0x8040u);
#endif
    for (int k = k0; k < k1; k++)
        acc = __builtin_fmaf(rounded(op_at(A, lda, ta, i, k), inputs), rounded(op_at(B, ldb, !tb, j, k), inputs), acc);
#if defined(__x86_64__)
    _mm_setcsr(saved);
#endif
    return acc;
}

// C[M,N] (ldc) by the contract, from C as given; scale[M,N] (ldc; NULL: not wanted) the sum
// of the magnitudes behind each element, for the tolerance of the AMX kernel.
static void reference(int ta, int tb, int M, int N, int K, float alpha, const real *A, int lda, const real *B,
                      int ldb, float beta, real *C, int ldc, GemmInputs inputs, real *scale) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            real *c = &C[(size_t)i * ldc + j];
            if (scale) {
                double sum = fabs(beta * *c);
                for (int k = 0; k < K; k++)
                    sum += fabs(alpha * (double)rounded(op_at(A, lda, ta, i, k), inputs) *
                                rounded(op_at(B, ldb, !tb, j, k), inputs));
                scale[(size_t)i * ldc + j] = (real)sum;
            }
            for (int k0 = 0; k0 < K; k0 += MT_GEMM_K_BLOCK) {
                float sum = block_sum(ta, tb, A, lda, B, ldb, i, j, k0, MT_MIN(K, k0 + MT_GEMM_K_BLOCK), inputs);
                float b = k0 == 0 ? beta : 1.0f;
                volatile float scaled = alpha * sum;  // two roundings, no fused multiply-add
                *c = b == 0 ? (float)scaled : (float)scaled + b * *c;
            }
        }
}

// The AMX kernel's sums of 32 products are not fused multiply-adds: measured against the
// contract on this test's values, within 2.5e-6 of the magnitudes summed (AMX_TOL has 4x
// room), plus, where partial sums go subnormal, flushing of its own (below K·2^-126).
#define AMX_TOL 1e-5
#define AMX_FLUSH_ABS 1e-34

// Same bits (NaN matching any NaN), or with tol > 0 within tol·scale[i] (infinities and NaN
// still exactly); reports the first difference.
static int count_diff_tol(const real *got, const real *want, const real *scale, double tol, size_t n,
                          const char *what) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        int same = isnan(got[i])    ? isnan(want[i])
                   : tol == 0 || !isfinite(want[i]) ? memcmp(&got[i], &want[i], sizeof(real)) == 0
                                                    : fabs((double)got[i] - want[i]) <= tol * scale[i] + AMX_FLUSH_ABS;
        if (!same && !bad++) CHECK(0, "%s: element %zu is %.9g (0x%08x), expected %.9g (0x%08x)", what, i,
                                   (double)got[i], float_bits(got[i]), (double)want[i], float_bits(want[i]));
    }
    return bad;
}

static int count_diff(const real *got, const real *want, size_t n, const char *what) {
    return count_diff_tol(got, want, NULL, 0, n, what);
}

typedef struct {
    int ta, tb, M, N, K, pad;
    float alpha, beta;
} Case;

// mt_gemm on the case into C (fresh copy of C0), in the current mode.
static void run_case(const Case *c, const real *A, const real *B, const real *C0, real *C) {
    int lda = (c->ta ? c->M : c->K) + c->pad, ldb = (c->tb ? c->K : c->N) + c->pad, ldc = c->N + c->pad;
    memcpy(C, C0, (size_t)c->M * ldc * sizeof(real));
    mt_gemm(c->ta, c->tb, c->M, c->N, c->K, c->alpha, A, lda, B, ldb, c->beta, C, ldc);
}

// Buffers of one case with values of `kind`.
typedef struct {
    real *A, *B, *C0, *C, *want, *scale;
    size_t c_n;
} CaseData;

static CaseData case_data(const Case *c, int kind, unsigned long long seed) {
    int lda = (c->ta ? c->M : c->K) + c->pad, ldb = (c->tb ? c->K : c->N) + c->pad, ldc = c->N + c->pad;
    size_t a_n = (size_t)(c->ta ? c->K : c->M) * lda, b_n = (size_t)(c->tb ? c->N : c->K) * ldb;
    CaseData d = {mt_malloc(a_n * sizeof(real)), mt_malloc(b_n * sizeof(real)), NULL, NULL, NULL, NULL,
                  (size_t)c->M * ldc};
    d.C0 = mt_malloc(d.c_n * sizeof(real)), d.C = mt_malloc(d.c_n * sizeof(real));
    d.want = mt_malloc(d.c_n * sizeof(real)), d.scale = mt_calloc(d.c_n, sizeof(real));
    fill(d.A, a_n, kind, seed), fill(d.B, b_n, kind, seed + 1), fill(d.C0, d.c_n, VALUES_RANDOM, seed + 2);
    return d;
}

static void case_free(CaseData *d) {
    free(d->A), free(d->B), free(d->C0), free(d->C), free(d->want), free(d->scale);
}

static const Case CASES[] = {
    {0, 0, 1, 1, 1, 0, 1, 0},        {0, 1, 7, 19, 5, 2, 1, 0},         {1, 0, 13, 29, 41, 0, -1, 0.5f},
    {1, 1, 33, 47, 65, 3, 1.5f, -1}, {0, 1, 70, 90, 300, 0, 0.75f, 1},  {1, 0, 130, 257, 129, 1, 1, 0.25f},
    {0, 0, 66, 70, 1030, 0, 1, 0},   {1, 1, 145, 33, 257, 5, -2, 1},    {0, 1, 6, 16, 256, 0, 1, 1},
    {0, 0, 300, 40, 513, 0, 0.5f, 0},
};
#define CASE_COUNT (sizeof CASES / sizeof CASES[0])

// Every case with `kernel` (a mt_gemm_use_bf16_kernel name) against the contract: bit for bit,
// or with tol > 0 within tol of each element's magnitudes.
static void check_against_reference(GemmInputs inputs, const char *kernel, int kind, double tol) {
    mt_gemm_set_inputs(inputs);
    mt_gemm_use_bf16_kernel(kernel);
    for (size_t n = 0; n < CASE_COUNT; n++) {
        const Case *c = &CASES[n];
        CaseData d = case_data(c, kind, 40 + n);
        int lda = (c->ta ? c->M : c->K) + c->pad, ldb = (c->tb ? c->K : c->N) + c->pad, ldc = c->N + c->pad;
        memcpy(d.want, d.C0, d.c_n * sizeof(real));
        reference(c->ta, c->tb, c->M, c->N, c->K, c->alpha, d.A, lda, d.B, ldb, c->beta, d.want, ldc, inputs, d.scale);
        run_case(c, d.A, d.B, d.C0, d.C);
        char what[160];
        snprintf(what, sizeof what, "%s %s ta=%d tb=%d %dx%dx%d", mt_gemm_kernel(),
                 kind == VALUES_RANDOM ? "random" : kind == VALUES_TINY ? "tiny" : "adversarial", c->ta, c->tb, c->M, c->N, c->K);
        count_diff_tol(d.C, d.want, d.scale, tol, d.c_n, what);
        case_free(&d);
    }
    mt_gemm_use_bf16_kernel(NULL);
    mt_gemm_set_inputs(GEMM_INPUTS_FP32);
}


static void check_kernel(GemmInputs inputs, const char *kernel, double tol) {
    check_against_reference(inputs, kernel, VALUES_RANDOM, tol);
    check_against_reference(inputs, kernel, VALUES_ADVERSARIAL, tol);
    check_against_reference(inputs, kernel, VALUES_TINY, tol);
}

// The kernel name mt_gemm_kernel gives under bf16 for `kernel`.
static const char *bf16_kernel_chosen(const char *kernel) {
    mt_gemm_set_inputs(GEMM_INPUTS_BF16);
    mt_gemm_use_bf16_kernel(kernel);
    const char *name = mt_gemm_kernel();
    mt_gemm_use_bf16_kernel(NULL);
    mt_gemm_set_inputs(GEMM_INPUTS_FP32);
    return name;
}

static void test_bf16_emulation_is_the_contract(void) {
    CHECK(!strcmp(bf16_kernel_chosen("emulated"), "bf16 emulated"), "emulated: got %s", bf16_kernel_chosen("emulated"));
    check_kernel(GEMM_INPUTS_BF16, "emulated", 0);
}

static void test_bf16_avx512_is_the_contract(void) {
    if (!lowp_have_avx512bf16()) {
        printf("     (no AVX-512 BF16 on this CPU: the emulation is the bf16 kernel here)\n");
        return;
    }
    CHECK(!strcmp(bf16_kernel_chosen("avx512-bf16"), "bf16 avx512-bf16"), "got %s", bf16_kernel_chosen("avx512-bf16"));
    check_kernel(GEMM_INPUTS_BF16, "avx512-bf16", 0);
}

static void test_bf16_amx_near_the_contract(void) {
    if (!lowp_have_amx()) {
        printf("     (no AMX-BF16 usable here: skipped)\n");
        return;
    }
    CHECK(!strcmp(bf16_kernel_chosen(NULL), "bf16 amx"), "the default bf16 kernel is %s, expected amx",
          bf16_kernel_chosen(NULL));
    check_kernel(GEMM_INPUTS_BF16, "amx", AMX_TOL);
}

// Whether name is what "portable" may choose: one of the two same-bit kernels for every
// orientation ("bf16 emulated", "bf16 avx512-bf16"), or each orientation's when they differ
// ("bf16 NN emulated, NT avx512-bf16, TN emulated, TT emulated").
static int is_portable_choice(const char *name, int have_avx512bf16) {
    if (!strcmp(name, "bf16 emulated")) return 1;
    if (!have_avx512bf16) return 0;
    if (!strcmp(name, "bf16 avx512-bf16")) return 1;
    const char *at = name + strlen("bf16 ");
    if (strncmp(name, "bf16 ", strlen("bf16 "))) return 0;
    for (int o = 0; o < 4; o++) {
        char orientation[4];
        snprintf(orientation, sizeof orientation, "%c%c ", "NT"[o / 2], "NT"[o % 2]);
        if (strncmp(at, orientation, 3)) return 0;
        at += 3;
        const char *kernels[] = {"emulated", "avx512-bf16"};
        size_t len = 0;
        for (int k = 0; k < 2 && !len; k++)
            if (!strncmp(at, kernels[k], strlen(kernels[k]))) len = strlen(kernels[k]);
        if (!len) return 0;
        at += len;
        if (o < 3 && strncmp(at, ", ", 2)) return 0;
        at += o < 3 ? 2 : 0;
    }
    return *at == 0;
}

// "portable": each orientation on the faster (measured) of AVX-512 BF16 and the emulation,
// never AMX: the contract's bits whatever it picked. Where AMX is missing it is the default.
static void test_bf16_portable_is_the_contract(void) {
    const char *name = bf16_kernel_chosen("portable");
    CHECK(is_portable_choice(name, lowp_have_avx512bf16()), "portable chose %s", name);
    check_kernel(GEMM_INPUTS_BF16, "portable", 0);
    if (!lowp_have_amx()) {
        name = bf16_kernel_chosen(NULL);
        CHECK(is_portable_choice(name, lowp_have_avx512bf16()), "the default (no AMX here) chose %s", name);
    }
    CHECK(!is_portable_choice("bf16 amx", 1) && !is_portable_choice("bf16 NN emulated, NT amx, TN emulated", 1) &&
              is_portable_choice("bf16 NN emulated, NT avx512-bf16, TN emulated, TT emulated", 1) &&
              !is_portable_choice("bf16 NN emulated, NT avx512-bf16, TN emulated, TT emulated", 0),
          "is_portable_choice itself");
}

static void test_fp16_emulation_is_the_contract(void) { check_kernel(GEMM_INPUTS_FP16, NULL, 0); }

// The emulations on the portable fp32 tile as well as on AVX-512's (the default where the CPU has it).
static void test_emulations_on_the_portable_tile(void) {
    mt_gemm_use_fp32_kernel("portable");
    check_kernel(GEMM_INPUTS_BF16, "emulated", 0);
    check_kernel(GEMM_INPUTS_FP16, NULL, 0);
    mt_gemm_use_fp32_kernel(NULL);
}

// The rounding itself: ties to even, subnormals, overflow.
static void test_input_rounding(void) {
    CHECK(rounded(bits_float(0x3F808000u), GEMM_INPUTS_BF16) == bits_float(0x3F800000u), "bf16 tie to even (down)");
    CHECK(rounded(bits_float(0x3F818000u), GEMM_INPUTS_BF16) == bits_float(0x3F820000u), "bf16 tie to even (up)");
    CHECK(float_bits(rounded(bits_float(0x807FFFFFu), GEMM_INPUTS_BF16)) == F32_SIGN, "bf16: subnormal to -0");
    CHECK(rounded(1e-7f, GEMM_INPUTS_FP16) == f16_to_float(f16_from_float(1e-7f)), "fp16 keeps its subnormals");
    CHECK(isinf(rounded(70000.0f, GEMM_INPUTS_FP16)), "fp16 overflows to infinity");
    CHECK(rounded(70000.0f, GEMM_INPUTS_BF16) == 70144.0f, "bf16 keeps 70000 finite (70144)");
}

// lowp_bf16_round_run (VCVTNE2PS2BF16 where the CPU has AVX-512 BF16) rounds every element as
// bf16_from_float_flushed does: random bit patterns (NaNs, infinities, subnormals of both
// signs included) and the adversarial mix, at every length up to 70 and at unaligned starts.
static void test_bf16_round_run(void) {
    enum { LONGEST = 70, VALUES = 4096 };
    static real src[VALUES];
    static uint16_t got[VALUES + 1];
    unsigned long long s = 11;
    for (int i = 0; i < VALUES; i++) src[i] = i % 2 ? adversarial(&s) : bits_float((uint32_t)lcg(&s));
    int bad = 0;
    for (int n = 0; n <= LONGEST; n++)
        for (int start = 0; start + n <= VALUES; start += 97) {
            got[n] = 0xABCD;  // just past the run: must stay as it is
            lowp_bf16_round_run(got, src + start, (size_t)n);
            for (int i = 0; i < n; i++) bad += got[i] != bf16_from_float_flushed(src[start + i]);
            bad += got[n] != 0xABCD;
        }
    CHECK(bad == 0, "%d elements rounded unlike bf16_from_float_flushed (or written past the run)", bad);
}

// 1 and 2 threads give the same bits in each mode.
static void test_thread_counts_agree(void) {
#ifdef _OPENMP
    static const GemmInputs modes[] = {GEMM_INPUTS_BF16, GEMM_INPUTS_FP16};
    Case c = {0, 1, 300, 200, 700, 0, 1, 0};
    CaseData d = case_data(&c, VALUES_RANDOM, 9);
    int threads = omp_get_max_threads();
    for (int m = 0; m < 2; m++) {
        mt_gemm_set_inputs(modes[m]);
        omp_set_num_threads(1);
        run_case(&c, d.A, d.B, d.C0, d.want);
        omp_set_num_threads(2);
        run_case(&c, d.A, d.B, d.C0, d.C);
        count_diff(d.C, d.want, d.c_n, mt_gemm_kernel());
    }
    omp_set_num_threads(threads);
    mt_gemm_set_inputs(GEMM_INPUTS_FP32);
    case_free(&d);
#endif
}

// An element's bits do not depend on where its tile lies: a sub-block of C computed on its
// own (rows and columns shifted off the kernel's tile grid, as an expert's rows are under
// expert parallelism) equals the same elements of the whole GEMM, for each bf16 kernel this
// CPU has, overwriting and accumulating, over several K blocks.
static void test_elements_whatever_their_tile(void) {
    static const char *const kernels[] = {"amx", "avx512-bf16", "emulated"};
    enum { ROW0 = 7, ROWS = 61, COL0 = 3, COLS = 50 };
    for (int beta = 0; beta <= 1; beta++) {
        Case c = {0, 1, 100, 70, 700, 0, 1, (float)beta};
        CaseData d = case_data(&c, VALUES_RANDOM, 11 + beta);
        for (int n = 0; n < 3; n++) {
            mt_gemm_set_inputs(GEMM_INPUTS_BF16);
            mt_gemm_use_bf16_kernel(kernels[n]);
            run_case(&c, d.A, d.B, d.C0, d.want);
            memcpy(d.C, d.C0, d.c_n * sizeof(real));
            mt_gemm(0, 1, ROWS, COLS, c.K, 1, d.A + (size_t)ROW0 * c.K, c.K, d.B + (size_t)COL0 * c.K, c.K, c.beta,
                    d.C + (size_t)ROW0 * c.N + COL0, c.N);
            for (int i = ROW0; i < ROW0 + ROWS; i++) {
                char what[96];
                snprintf(what, sizeof what, "%s beta %d, row %d of the sub-block", mt_gemm_kernel(), beta, i);
                count_diff(d.C + (size_t)i * c.N + COL0, d.want + (size_t)i * c.N + COL0, COLS, what);
            }
        }
        mt_gemm_use_bf16_kernel(NULL);
        mt_gemm_set_inputs(GEMM_INPUTS_FP32);
        case_free(&d);
    }
}

// Where a C's sums sit between K blocks does not change its bits: under AMX, overwriting C
// (beta 0: summed in gemm.c's staging block, with two K blocks, and with all of K's packed B
// past the B group) gives the bits of adding to a C of zeros (beta 1: summed in C itself, too
// few K blocks, or too much B for the staging block to pay: 5 K blocks of 512 columns a
// thread), on one or two threads, edge tiles and a padded ldc included.
static void test_staged_c_same_bits(void) {
    static const Case cases[] = {{0, 1, 100, 70, 500, 3, 1, 0}, {0, 0, 70, 1100, 1100, 0, 1, 0}};
    for (int i = 0; i < 2; i++) {
        Case c = cases[i];
        CaseData d = case_data(&c, VALUES_ADVERSARIAL, 21 + i);
        mt_gemm_set_inputs(GEMM_INPUTS_BF16);
        mt_gemm_use_bf16_kernel("amx");
        run_case(&c, d.A, d.B, d.C0, d.C);  // beta 0: C0's values are not read
        memset(d.C0, 0, d.c_n * sizeof(real));
        c.beta = 1;
        run_case(&c, d.A, d.B, d.C0, d.want);
        size_t ldc = (size_t)c.N + c.pad;
        for (int r = 0; r < c.M; r++) {
            char what[96];
            snprintf(what, sizeof what, "%s, %dx%dx%d, row %d: beta 0 against beta 1 on zeros", mt_gemm_kernel(), c.M,
                     c.N, c.K, r);
            count_diff(d.C + r * ldc, d.want + r * ldc, (size_t)c.N, what);
        }
        mt_gemm_use_bf16_kernel(NULL);
        mt_gemm_set_inputs(GEMM_INPUTS_FP32);
        case_free(&d);
    }
}

// Each operand packs to the same panels whichever way it is stored: a GEMM on transposed
// copies of A and B (op(A) = A, Aᵀ; op(B) = B, Bᵀ) gives the bits of the one on plain copies,
// for every 16-bit kernel (the packers for rows and for columns, edge panels included).
static void test_transposes_agree(void) {
    static const GemmInputs modes[] = {GEMM_INPUTS_BF16, GEMM_INPUTS_BF16, GEMM_INPUTS_BF16, GEMM_INPUTS_FP16};
    static const char *const kernels[] = {"amx", "avx512-bf16", "emulated", NULL};
    enum { M = 70, N = 45, K = 300 };
    real *A = mt_malloc(M * K * sizeof(real)), *At = mt_malloc(M * K * sizeof(real));
    real *B = mt_malloc(K * N * sizeof(real)), *Bt = mt_malloc(K * N * sizeof(real));
    real *want = mt_malloc(M * N * sizeof(real)), *C = mt_malloc(M * N * sizeof(real));
    fill(A, M * K, VALUES_RANDOM, 31);
    fill(B, K * N, VALUES_RANDOM, 32);
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) At[k * M + i] = A[i * K + k];
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) Bt[j * K + k] = B[k * N + j];
    for (int m = 0; m < 4; m++) {
        mt_gemm_set_inputs(modes[m]);
        mt_gemm_use_bf16_kernel(kernels[m]);
        mt_gemm(0, 0, M, N, K, 1, A, K, B, N, 0, want, N);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                mt_gemm(ta, tb, M, N, K, 1, ta ? At : A, ta ? M : K, tb ? Bt : B, tb ? K : N, 0, C, N);
                char what[64];
                snprintf(what, sizeof what, "%s, %c%c", mt_gemm_kernel(), ta ? 'T' : 'N', tb ? 'T' : 'N');
                count_diff(C, want, M * N, what);
            }
    }
    mt_gemm_use_bf16_kernel(NULL);
    mt_gemm_set_inputs(GEMM_INPUTS_FP32);
    free(A), free(At), free(B), free(Bt), free(want), free(C);
}

// The grouped GEMMs (all groups' problems cut into cells on all threads at once) give each
// group the bits of mt_gemm on that group alone on one thread, for fp32 and every 16-bit
// kernel: uneven groups (one large enough to be cut, an empty one, one row), two K blocks.
static void test_grouped_equals_one_by_one(void) {
#ifdef _OPENMP
    static const GemmInputs modes[] = {GEMM_INPUTS_FP32, GEMM_INPUTS_BF16, GEMM_INPUTS_BF16, GEMM_INPUTS_BF16,
                                       GEMM_INPUTS_FP16};
    static const char *const kernels[] = {NULL, "amx", "avx512-bf16", "emulated", NULL};
    enum { G = 6, N = 70, K = 300 };
    const int32_t rows[G] = {300, 0, 7, 61, 129, 1};
    size_t total = 0, first[G], stride = (size_t)N * K;
    for (int g = 0; g < G; g++) first[g] = total, total += (size_t)rows[g];
    real *A = mt_malloc(total * K * sizeof(real)), *W = mt_malloc(G * stride * sizeof(real));
    real *C0 = mt_malloc(total * N * sizeof(real)), *C = mt_malloc(total * N * sizeof(real));
    real *want = mt_malloc(total * N * sizeof(real));
    real *dW0 = mt_malloc(G * stride * sizeof(real)), *dW = mt_malloc(G * stride * sizeof(real));
    real *dW_want = mt_malloc(G * stride * sizeof(real));
    fill(A, total * K, VALUES_RANDOM, 21);
    fill(W, G * stride, VALUES_RANDOM, 22);
    fill(C0, total * N, VALUES_RANDOM, 23);
    fill(dW0, G * stride, VALUES_RANDOM, 24);
    int threads = omp_get_max_threads();
    for (int m = 0; m < 5; m++) {
        mt_gemm_set_inputs(modes[m]);
        mt_gemm_use_bf16_kernel(kernels[m]);
        for (int alpha_one = 0; alpha_one <= 1; alpha_one++) {
            real alpha = alpha_one ? 1 : (real)1.5, beta = alpha_one ? 1 : (real)0.5;
            memcpy(want, C0, total * N * sizeof(real));
            memcpy(dW_want, dW0, G * stride * sizeof(real));
            omp_set_num_threads(1);
            for (int g = 0; g < G; g++) {
                if (!rows[g]) continue;
                mt_gemm(0, 1, rows[g], N, K, alpha, A + first[g] * K, K, W + g * stride, K, beta, want + first[g] * N, N);
                // W_g[N, K] += alpha · C0_g[rows, N]ᵀ · A_g[rows, K]
                mt_gemm(1, 0, N, K, rows[g], alpha, C0 + first[g] * N, N, A + first[g] * K, K, 1, dW_want + g * stride, K);
            }
            omp_set_num_threads(2);
            memcpy(C, C0, total * N * sizeof(real));
            memcpy(dW, dW0, G * stride * sizeof(real));
            mt_gemm_grouped(0, 1, G, rows, NULL, N, K, alpha, A, STORE_FP32, K, W, stride, K, beta, C, STORE_FP32, N);
            mt_gemm_grouped_wgrad(G, rows, NULL, N, K, alpha, C0, STORE_FP32, A, STORE_FP32, dW, stride);
            char what[96];
            snprintf(what, sizeof what, "grouped, %s, alpha %g", mt_gemm_kernel(), (double)alpha);
            count_diff(C, want, total * N, what);
            snprintf(what, sizeof what, "grouped wgrad, %s, alpha %g", mt_gemm_kernel(), (double)alpha);
            count_diff(dW, dW_want, G * stride, what);
        }
    }
    omp_set_num_threads(threads);
    mt_gemm_use_bf16_kernel(NULL);
    mt_gemm_set_inputs(GEMM_INPUTS_FP32);
    free(A), free(W), free(C0), free(C), free(want), free(dW0), free(dW), free(dW_want);
#endif
}

// An operand stored as bf16 (gemm.h STORE_BF16: the experts' SwiGLU output under --bf16) gives
// the bits of the fp32 tensor it was rounded from, for every bf16 kernel, in the forward (A,
// both transposes) and the weight gradient (X), on two threads; values random, adversarial
// (NaN, infinities, ties) and tiny (fp32 subnormals, flushed by both). With fp32 inputs the
// storage does change the result (so the check would see a storage that is not read).
static void test_bf16_storage_gives_fp32_bits(void) {
    static const char *const kernels[] = {"amx", "avx512-bf16", "emulated"};
    enum { G = 4, N = 70, K = 300 };
    const int32_t rows[G] = {130, 0, 7, 300};
    size_t total = 437, stride = (size_t)N * K, n_a = total * K;
    real *A = mt_malloc(n_a * sizeof(real)), *W = mt_malloc(G * stride * sizeof(real));
    uint16_t *A16 = mt_malloc(n_a * sizeof(uint16_t));
    real *C0 = mt_malloc(total * N * sizeof(real)), *want = mt_malloc(total * N * sizeof(real));
    real *C = mt_malloc(total * N * sizeof(real));
    real *dW_want = mt_malloc(G * stride * sizeof(real)), *dW = mt_malloc(G * stride * sizeof(real));
    fill(W, G * stride, VALUES_RANDOM, 32);
    fill(C0, total * N, VALUES_RANDOM, 33);
    for (int kind = VALUES_RANDOM; kind <= VALUES_TINY; kind++) {
        fill(A, n_a, kind, 31 + kind);
        for (size_t i = 0; i < n_a; i++) A16[i] = bf16_from_float_flushed(A[i]);
        for (int k = 0; k < 3; k++) {
            mt_gemm_set_inputs(GEMM_INPUTS_BF16);
            mt_gemm_use_bf16_kernel(kernels[k]);
            for (int trans_a = 0; trans_a <= 1; trans_a++) {
                // trans_a: A read as [K, total] (ld total) — the same memory, another operand
                int lda = trans_a ? (int)total : K;
                memcpy(want, C0, total * N * sizeof(real));
                memcpy(C, C0, total * N * sizeof(real));
                if (trans_a) {
                    int32_t one[1] = {(int32_t)total};  // one group: A_g is all of A
                    mt_gemm_grouped(1, 1, 1, one, NULL, N, K, (real)1.5, A, STORE_FP32, lda, W, stride, K, (real)0.5,
                                    want, STORE_FP32, N);
                    mt_gemm_grouped(1, 1, 1, one, NULL, N, K, (real)1.5, A16, STORE_BF16, lda, W, stride, K, (real)0.5,
                                    C, STORE_FP32, N);
                } else {
                    mt_gemm_grouped(0, 1, G, rows, NULL, N, K, 1, A, STORE_FP32, lda, W, stride, K, 0, want,
                                    STORE_FP32, N);
                    mt_gemm_grouped(0, 1, G, rows, NULL, N, K, 1, A16, STORE_BF16, lda, W, stride, K, 0, C,
                                    STORE_FP32, N);
                }
                char what[96];
                snprintf(what, sizeof what, "bf16-stored A, %s, trans_a %d, values %d", mt_gemm_kernel(), trans_a, kind);
                count_diff(C, want, total * N, what);
            }
            memset(dW_want, 0, G * stride * sizeof(real));
            memset(dW, 0, G * stride * sizeof(real));
            // W_g[N, K] += C0_g[rows, N]ᵀ · A_g[rows, K]
            mt_gemm_grouped_wgrad(G, rows, NULL, N, K, 1, C0, STORE_FP32, A, STORE_FP32, dW_want, stride);
            mt_gemm_grouped_wgrad(G, rows, NULL, N, K, 1, C0, STORE_FP32, A16, STORE_BF16, dW, stride);
            char what[96];
            snprintf(what, sizeof what, "bf16-stored X, %s, values %d", mt_gemm_kernel(), kind);
            count_diff(dW, dW_want, G * stride, what);
            // dY stored as bf16 (the gate and up gradients): A read as [total, K] is dY_g [rows, K]
            memset(dW_want, 0, G * stride * sizeof(real));
            memset(dW, 0, G * stride * sizeof(real));
            mt_gemm_grouped_wgrad(G, rows, NULL, K, N, 1, A, STORE_FP32, C0, STORE_FP32, dW_want, stride);
            mt_gemm_grouped_wgrad(G, rows, NULL, K, N, 1, A16, STORE_BF16, C0, STORE_FP32, dW, stride);
            snprintf(what, sizeof what, "bf16-stored dY, %s, values %d", mt_gemm_kernel(), kind);
            count_diff(dW, dW_want, G * stride, what);
        }
    }
    mt_gemm_use_bf16_kernel(NULL);
    mt_gemm_set_inputs(GEMM_INPUTS_FP32);
    fill(A, n_a, VALUES_RANDOM, 31);
    for (size_t i = 0; i < n_a; i++) A16[i] = bf16_from_float_flushed(A[i]);
    mt_gemm_grouped(0, 1, G, rows, NULL, N, K, 1, A, STORE_FP32, K, W, stride, K, 0, want, STORE_FP32, N);
    mt_gemm_grouped(0, 1, G, rows, NULL, N, K, 1, A16, STORE_BF16, K, W, stride, K, 0, C, STORE_FP32, N);
    CHECK(memcmp(C, want, total * N * sizeof(real)) != 0, "fp32 GEMM inputs: bf16 storage changed nothing");
    free(A), free(W), free(A16), free(C0), free(want), free(C), free(dW_want), free(dW);
}

// A C stored as bf16 (gemm.h: the FFNs' gate and up under --bf16) holds each element of the fp32
// C rounded once (bf16_from_float_flushed), bit for bit, on every kernel (fp32 inputs too: the
// portable kernel, as the bf16 C's), for mt_gemm_stored in each transpose (several K blocks, more
// rows than a row block, more columns than a column block) and mt_gemm_grouped; every element
// written. On one thread as well: a thread's cell then spans K blocks of B beyond what one pass
// keeps for an fp32 C (the staging takes them all at once).
static void check_bf16_output_is_rounded_fp32(void) {
    static const char *const kernels[] = {"amx", "avx512-bf16", "emulated", NULL};  // NULL: fp32 inputs
    enum { M = 300, N = 600, K = 600, G = 3 };
    const int32_t rows[G] = {130, 0, 170};
    real *A = mt_malloc((size_t)M * K * sizeof(real)), *B = mt_malloc((size_t)G * K * N * sizeof(real));
    real *want = mt_malloc((size_t)M * N * sizeof(real));
    uint16_t *C16 = mt_malloc((size_t)M * N * sizeof(uint16_t));
    fill(A, (size_t)M * K, VALUES_RANDOM, 51), fill(B, (size_t)G * K * N, VALUES_RANDOM, 52);
    for (int k = 0; k < 4; k++) {
        mt_gemm_set_inputs(kernels[k] ? GEMM_INPUTS_BF16 : GEMM_INPUTS_FP32);
        if (kernels[k]) mt_gemm_use_bf16_kernel(kernels[k]);
        for (int t = 0; t <= 4; t++) {  // t < 4: mt_gemm_stored with trans_a = t >> 1, trans_b = t & 1
            int ta = t >> 1, tb = t & 1, grouped = t == 4;
            if (grouped) {
                mt_gemm_grouped(0, 1, G, rows, NULL, N, K, 1, A, STORE_FP32, K, B, (size_t)K * N, K, 0, want,
                                STORE_FP32, N);
                memset(C16, 0xff, (size_t)M * N * sizeof(uint16_t));
                mt_gemm_grouped(0, 1, G, rows, NULL, N, K, 1, A, STORE_FP32, K, B, (size_t)K * N, K, 0, C16,
                                STORE_BF16, N);
            } else {
                int lda = ta ? M : K, ldb = tb ? K : N;
                mt_gemm(ta, tb, M, N, K, (real)0.75, A, lda, B, ldb, 0, want, N);
                memset(C16, 0xff, (size_t)M * N * sizeof(uint16_t));
                mt_gemm_stored(ta, tb, M, N, K, (real)0.75, A, STORE_FP32, lda, B, STORE_FP32, ldb, 0, C16, STORE_BF16,
                               N);
            }
            int bad = 0;
            for (size_t i = 0; i < (size_t)M * N && !bad; i++) {
                if (C16[i] == bf16_from_float_flushed(want[i])) continue;
                CHECK(0, "C stored bf16, %s, %s: element %zu is 0x%04x, expected 0x%04x from %.9g", mt_gemm_kernel(),
                      grouped ? "grouped" : ta ? (tb ? "TT" : "TN") : (tb ? "NT" : "NN"), i, C16[i],
                      bf16_from_float_flushed(want[i]), (double)want[i]);
                bad = 1;
            }
        }
    }
    mt_gemm_use_bf16_kernel(NULL);
    mt_gemm_set_inputs(GEMM_INPUTS_FP32);
    free(A), free(B), free(want), free(C16);
}

static void test_bf16_output_is_rounded_fp32(void) {
    mt_gemm_force_portable(1);
    check_bf16_output_is_rounded_fp32();
#ifdef _OPENMP
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    check_bf16_output_is_rounded_fp32();
    omp_set_num_threads(threads);
#endif
    mt_gemm_force_portable(0);
}

// Switching to bf16 and back (as the router does around its GEMMs) gives fp32's bits again,
// and bf16 really changes them.
static void test_switching_back_to_fp32(void) {
    Case c = {0, 1, 40, 50, 60, 0, 1, 0};
    CaseData d = case_data(&c, VALUES_RANDOM, 3);
    run_case(&c, d.A, d.B, d.C0, d.want);
    mt_gemm_set_inputs(GEMM_INPUTS_BF16);
    run_case(&c, d.A, d.B, d.C0, d.C);
    CHECK(memcmp(d.C, d.want, d.c_n * sizeof(real)) != 0, "mt_gemm under bf16 gave the fp32 result");
    mt_gemm_set_inputs(GEMM_INPUTS_FP32);
    run_case(&c, d.A, d.B, d.C0, d.C);
    count_diff(d.C, d.want, d.c_n, "fp32 after bf16");
    case_free(&d);
}

int main(void) {
    RUN(test_input_rounding);
    RUN(test_bf16_round_run);
    RUN(test_bf16_emulation_is_the_contract);
    RUN(test_bf16_avx512_is_the_contract);
    RUN(test_bf16_amx_near_the_contract);
    RUN(test_bf16_portable_is_the_contract);
    RUN(test_fp16_emulation_is_the_contract);
    RUN(test_emulations_on_the_portable_tile);
    RUN(test_thread_counts_agree);
    RUN(test_elements_whatever_their_tile);
    RUN(test_staged_c_same_bits);
    RUN(test_transposes_agree);
    RUN(test_grouped_equals_one_by_one);
    RUN(test_bf16_storage_gives_fp32_bits);
    RUN(test_bf16_output_is_rounded_fp32);
    RUN(test_switching_back_to_fp32);
    return tl_failed_cases != 0;
}

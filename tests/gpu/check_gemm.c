// check_gemm.c — the op checks of the GEMMs (tests/gpu/op_check.h): gemm, gemm_grouped,
// gemm_grouped_wgrad and linear_forward / _backward of the backend under test against
// the cpu backend, first in fp32 (TOL_FP32), then, where the backend has them, with bf16 and
// fp16 GEMM inputs (check_set_gemm_inputs, TOL_BF16 / TOL_FP16).
//
// What the cases cover (gemm.h / ops.h contracts):
//   * all four trans_a / trans_b combinations, odd sizes (1, 7, 33, 130), tight and padded
//     leading dimensions; the padding columns of C hold random values on both sides, so a
//     write past N shows up;
//   * beta == 0 with NaN in the written block of C (it must be overwritten), beta == 1 and
//     other alpha / beta values on random C;
//   * K == 0 (A and B are NULL: C = beta·C), alpha == 0 with NaN in A and B (not read),
//     M == 0 and N == 0 (C untouched);
//   * grouped GEMM with empty experts (their B pointer is NULL: not read) and a tail of C
//     past the last group that must stay as it was; grouped K == 0 and alpha == 0;
//   * grouped wgrad with empty experts, whose W must stay as it was;
//   * linear forward (y starts NaN) and backward (dx and dW accumulate; dx NULL skipped);
//   * that --bf16 and --fp16 really change the arithmetic, and that repeated calls give the same bits.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/float_formats.h"
#include "op_check.h"

// The precision pass the checks run in: its name for the check lines and its tolerance.
typedef struct {
    const char *name;
    double tol;
} Pass;

static const char *trans_name(int trans_a, int trans_b) {
    static const char *names[2][2] = {{"NN", "NT"}, {"TN", "TT"}};
    return names[trans_a != 0][trans_b != 0];
}

// ---- host matrices ----------------------------------------------------------------------------

// A host matrix [rows, ld] of values in [-1, 1) (at least one element, so that an empty one
// is still a valid pointer).
static float *random_matrix(int rows, int ld) {
    size_t n = (size_t)rows * ld;
    return check_random(n ? n : 1, -1.0f, 1.0f);
}

// The [rows, cols] block of a [rows, ld] matrix set to NaN: an output the op overwrites.
static void fill_nan(float *m, int rows, int cols, int ld) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) m[(size_t)r * ld + c] = NAN;
}

// A host matrix [rows, ld] all NaN: an input the op must not read.
static float *nan_matrix(int rows, int ld) {
    float *m = random_matrix(rows, ld);
    fill_nan(m, rows, ld, ld);
    return m;
}

static float *to_device(const float *host, int rows, int ld) {
    size_t n = (size_t)rows * ld;
    return check_to_device(host, n ? n : 1);
}

// ---- one GEMM -----------------------------------------------------------------------------------

typedef struct {
    int trans_a, trans_b, M, N, K;
    int pad;  // added to every leading dimension
    float alpha, beta;
} GemmCase;

// Leading dimensions and stored rows of op(A) [M,K] and op(B) [K,N] as gemm.h lays them out.
static int a_ld(const GemmCase *c) { return (c->trans_a ? c->M : c->K) + c->pad; }
static int a_rows(const GemmCase *c) { return c->trans_a ? c->K : c->M; }
static int b_ld(const GemmCase *c) { return (c->trans_b ? c->K : c->N) + c->pad; }
static int b_rows(const GemmCase *c) { return c->trans_b ? c->N : c->K; }

static void gemm_case_name(char *buf, size_t size, const char *what, const GemmCase *c, const Pass *p) {
    snprintf(buf, size, "%s %s %dx%dx%d ld+%d alpha=%g beta=%g [%s]", what, trans_name(c->trans_a, c->trans_b), c->M,
             c->N, c->K, c->pad, c->alpha, c->beta, p->name);
}

// An input of a case: random, or NaN when gemm.h says it is not read (K == 0 or alpha == 0),
// NULL when it has no element at all (K == 0).
static float *gemm_input(int rows, int ld, int unread, int K) {
    if (!unread) return random_matrix(rows, ld);
    return K == 0 ? NULL : nan_matrix(rows, ld);
}

static float *to_device_or_null(const float *host, int rows, int ld) {
    return host ? to_device(host, rows, ld) : NULL;
}

// C = alpha·op(A)·op(B) + beta·C. C is random, NaN in its [M,N] block when beta == 0 (it must
// be overwritten). When K == 0 or alpha == 0, A and B are NaN or NULL: C = beta·C.
static void check_gemm_case(const GemmCase *c, const Pass *p) {
    int lda = a_ld(c), ldb = b_ld(c), ldc = c->N + c->pad, unread = c->K == 0 || c->alpha == 0;
    float *A = gemm_input(a_rows(c), lda, unread, c->K), *B = gemm_input(b_rows(c), ldb, unread, c->K);
    float *dA = to_device_or_null(A, a_rows(c), lda), *dB = to_device_or_null(B, b_rows(c), ldb);
    float *C = random_matrix(c->M, ldc);
    if (c->beta == 0) fill_nan(C, c->M, c->N, ldc);
    float *dC = to_device(C, c->M, ldc);
    ops_cpu_backend.gemm(c->trans_a, c->trans_b, c->M, c->N, c->K, c->alpha, A, lda, B, ldb, c->beta, C, ldc);
    under()->gemm(c->trans_a, c->trans_b, c->M, c->N, c->K, c->alpha, dA, lda, dB, ldb, c->beta, dC, ldc);
    check_finish();
    char name[128];
    gemm_case_name(name, sizeof(name), unread ? "gemm (A, B unread)" : "gemm", c, p);
    check_compare(name, "C", C, dC, (size_t)c->M * ldc, p->tol);
    check_free_all();
}

// gemm_stored: the backend under test gets A and B stored as a_store and b_store, the cpu
// reference fp32 copies of the same values (check_stored_to_device rounds the host values first).
static void check_gemm_stored_case(const GemmCase *c, Storage a_store, Storage b_store, const Pass *p) {
    int lda = a_ld(c), ldb = b_ld(c), ldc = c->N + c->pad;
    float *A = random_matrix(a_rows(c), lda), *B = random_matrix(b_rows(c), ldb);
    void *dA = check_stored_to_device(A, (size_t)a_rows(c) * lda, a_store);
    void *dB = check_stored_to_device(B, (size_t)b_rows(c) * ldb, b_store);
    float *C = random_matrix(c->M, ldc);
    if (c->beta == 0) fill_nan(C, c->M, c->N, ldc);
    float *dC = to_device(C, c->M, ldc);
    ops_cpu_backend.gemm(c->trans_a, c->trans_b, c->M, c->N, c->K, c->alpha, A, lda, B, ldb, c->beta, C, ldc);
    under()->gemm_stored(c->trans_a, c->trans_b, c->M, c->N, c->K, c->alpha, dA, a_store, lda, dB, b_store, ldb,
                         c->beta, dC, STORE_FP32, ldc);
    check_finish();
    char what[48], name[160];
    snprintf(what, sizeof(what), "gemm_stored A %s B %s", a_store == STORE_BF16 ? "bf16" : "fp32",
             b_store == STORE_BF16 ? "bf16" : "fp32");
    gemm_case_name(name, sizeof(name), what, c, p);
    check_compare(name, "C", C, dC, (size_t)c->M * ldc, p->tol);
    check_free_all();
}

// The reference's fp32 C rounded as a C stored bf16 keeps it (gemm.h), and how close the backend
// under test's widened C must come: the same bits on the cpu (the same sums, rounded once; not when
// OpenBLAS makes the fp32 reference), a bf16 step where other sums differ in the last bits.
static void round_as_bf16(float *C, size_t n) {
    for (size_t i = 0; i < n; i++) C[i] = bf16_to_float(bf16_from_float_flushed(C[i]));
}
static double c_bf16_tol(void) {
    int same_sums = check_backend() == &check_backend_cpu && strcmp(mt_gemm_kernel(), "openblas fp32") != 0;
    return same_sums ? 0 : TOL_BF16;
}

// gemm_stored with C stored as bf16 (beta 0, ldc == N: the case's pad must be 0) and A as a_store.
static void check_gemm_c_bf16_case(const GemmCase *c, Storage a_store, const Pass *p) {
    int lda = a_ld(c), ldb = b_ld(c);
    size_t mn = (size_t)c->M * c->N;
    float *A = random_matrix(a_rows(c), lda), *B = random_matrix(b_rows(c), ldb), *C = random_matrix(c->M, c->N);
    void *dA = check_stored_to_device(A, (size_t)a_rows(c) * lda, a_store);
    float *dB = to_device(B, b_rows(c), ldb), *dC16 = check_device_nan((mn + 1) / 2);
    ops_cpu_backend.gemm(c->trans_a, c->trans_b, c->M, c->N, c->K, c->alpha, A, lda, B, ldb, 0, C, c->N);
    under()->gemm_stored(c->trans_a, c->trans_b, c->M, c->N, c->K, c->alpha, dA, a_store, lda, dB, STORE_FP32, ldb, 0,
                         dC16, STORE_BF16, c->N);
    float *got = check_widened_from_device(dC16, mn, STORE_BF16);
    check_finish();
    round_as_bf16(C, mn);
    char what[48], name[160];
    snprintf(what, sizeof(what), "gemm_stored A %s C bf16", a_store == STORE_BF16 ? "bf16" : "fp32");
    gemm_case_name(name, sizeof(name), what, c, p);
    check_compare(name, "C", C, got, mn, c_bf16_tol());
    check_free_all();
}

static void check_gemm_stored_all(const Pass *p) {
    // C stored bf16: several K blocks summed before the rounding (K 300, 600), more rows than a
    // row block (130), K == 0 (zeros)
    static const GemmCase c_bf16[] = {
        {0, 1, 33, 130, 7, 0, 1.0f, 0.0f}, {1, 1, 33, 7, 300, 0, 0.75f, 0.0f}, {0, 0, 130, 33, 600, 0, 1.0f, 0.0f},
        {0, 1, 7, 33, 0, 0, 1.0f, 0.0f},
    };
    for (size_t i = 0; i < sizeof(c_bf16) / sizeof(c_bf16[0]); i++) {
        check_gemm_c_bf16_case(&c_bf16[i], STORE_FP32, p);
        check_gemm_c_bf16_case(&c_bf16[i], STORE_BF16, p);
    }
    static const GemmCase cases[] = {
        {0, 1, 33, 130, 7, 0, 1.0f, 0.0f}, {1, 0, 130, 7, 33, 3, 1.0f, 1.0f}, {0, 0, 7, 33, 130, 1, -0.5f, 0.25f},
        {1, 1, 33, 7, 130, 2, 0.75f, 0.0f},
    };
    static const Storage stores[][2] = {{STORE_BF16, STORE_FP32}, {STORE_FP32, STORE_BF16}, {STORE_BF16, STORE_BF16},
                                        {STORE_FP32, STORE_FP32}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        for (size_t s = 0; s < sizeof(stores) / sizeof(stores[0]); s++)
            check_gemm_stored_case(&cases[i], stores[s][0], stores[s][1], p);
}

// M == 0 or N == 0: a no-op. C is a real 7 x 33 buffer that must come back as it was.
static void check_gemm_empty(int M, int N, const Pass *p) {
    float *C = random_matrix(7, 33), *dC = to_device(C, 7, 33);
    ops_cpu_backend.gemm(0, 0, M, N, 5, 1.0f, NULL, 5, NULL, 33, 0.0f, C, 33);
    under()->gemm(0, 0, M, N, 5, 1.0f, NULL, 5, NULL, 33, 0.0f, dC, 33);
    check_finish();
    char name[96];
    snprintf(name, sizeof(name), "gemm M=%d N=%d (no-op) [%s]", M, N, p->name);
    check_compare(name, "C", C, dC, 7 * 33, p->tol);
    check_free_all();
}

static void check_gemm_all(const Pass *p) {
    static const int shapes[][3] = {{1, 1, 1},    {1, 33, 1},   {33, 1, 7},
                                    {7, 33, 130}, {130, 7, 33}, {33, 130, 7}, {130, 130, 130}};
    // (pad, alpha, beta): tight and overwriting, padded and accumulating, padded and
    // overwriting with a negative alpha, tight with general scalars.
    static const struct {
        int pad;
        float alpha, beta;
    } variants[] = {{0, 1.0f, 0.0f}, {3, 1.0f, 1.0f}, {5, -0.5f, 0.0f}, {0, 0.75f, 0.5f}};
    for (int t = 0; t < 4; t++)
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
            for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
                GemmCase c = {t >> 1, t & 1, shapes[s][0], shapes[s][1], shapes[s][2],
                              variants[v].pad, variants[v].alpha, variants[v].beta};
                // A 1 x 1 C that adds beta·C to a product can cancel to almost nothing, and
                // the normwise error of one element is then its relative error: not a fair test.
                if (c.M * c.N == 1 && c.beta != 0) continue;
                check_gemm_case(&c, p);
            }
    static const GemmCase unread[] = {
        {0, 0, 7, 33, 0, 0, 1.0f, 0.0f},   {1, 1, 7, 33, 0, 2, 1.0f, 0.5f},
        {0, 1, 7, 33, 0, 0, 1.0f, 1.0f},   {0, 1, 33, 7, 130, 3, 0.0f, 0.0f},
        {1, 0, 33, 7, 130, 0, 0.0f, 0.25f},
    };
    for (size_t i = 0; i < sizeof(unread) / sizeof(unread[0]); i++) check_gemm_case(&unread[i], p);
    check_gemm_empty(0, 33, p);
    check_gemm_empty(7, 0, p);
    check_gemm_stored_all(p);
}

// ---- grouped GEMM ---------------------------------------------------------------------------------

enum { MAX_EXPERTS = 160, TAIL_ROWS = 2 };

// The experts of a grouped call: their rows and where each starts in the stacked activations.
typedef struct {
    int count, total;
    int32_t rows[MAX_EXPERTS];
    int start[MAX_EXPERTS];
} Experts;

static Experts experts_from(const int *rows, int count) {
    Experts e = {count, 0, {0}, {0}};
    for (int g = 0; g < count; g++) {
        e.rows[g] = rows[g];
        e.start[g] = e.total;
        e.total += rows[g];
    }
    return e;
}

// Six experts, two of them empty; 171 rows in all.
static Experts experts_few(void) {
    static const int rows[] = {7, 0, 1, 33, 0, 130};
    return experts_from(rows, 6);
}

// 150 experts of 0 to 3 rows: 112 problems, more than the backend's first pointer scratch.
static Experts experts_many(void) {
    int rows[150];
    for (int g = 0; g < 150; g++) rows[g] = g % 4;
    return experts_from(rows, 150);
}

typedef struct {
    int trans_a, trans_b, N, K, pad;
    float alpha, beta;
    const Experts *e;
    Storage a_store;  // how the backend under test gets A (the cpu reference: fp32 of the same values)
} GroupedCase;

// The stacked A of a grouped GEMM: without trans_a [total, K] (expert g's rows from row
// start[g]), with trans_a [K, total] (expert g's A_g [K, rows[g]] from column start[g]).
// Every ld gets the case's padding. `unread`: A is all NaN.
static float *grouped_a(const GroupedCase *c, int unread, int *lda) {
    const Experts *e = c->e;
    *lda = (c->trans_a ? e->total : c->K) + c->pad;
    int rows = c->trans_a ? c->K : e->total;
    return unread ? nan_matrix(MT_MAX(rows, 1), *lda) : random_matrix(rows, *lda);
}

// The experts' B_g ([K,N] or, with trans_b, [N,K]) as one block of count·stride, on the host
// and the device; empty experts' (and every expert's when K == 0) are NaN, which must not be read.
static int grouped_b(const GroupedCase *c, int unread, size_t *stride, float **B, float **dB) {
    int ld = (c->trans_b ? c->K : c->N) + c->pad, rows = c->trans_b ? c->N : c->K, n = c->e->count;
    *stride = (size_t)rows * ld;
    *B = random_matrix(MT_MAX(n * rows, 1), ld);
    for (int g = 0; g < n; g++)
        if (unread || c->e->rows[g] == 0) fill_nan(*B + g * *stride, rows, ld, ld);
    *dB = to_device(*B, MT_MAX(n * rows, 1), ld);
    return ld;
}

// C_g = alpha·op(A_g)·op(B_g) + beta·C_g for every expert; C is [total + TAIL_ROWS, N + pad],
// random, with NaN in the experts' [total, N] block when beta == 0.
static void check_grouped_case(const GroupedCase *c, const Pass *p) {
    const Experts *e = c->e;
    int lda, ldc = c->N + c->pad, unread = c->K == 0 || c->alpha == 0;
    size_t stride;
    float *B, *dB;
    float *A = grouped_a(c, unread, &lda);
    void *dA = check_stored_to_device(A, (size_t)MT_MAX(c->trans_a ? c->K : e->total, 1) * lda, c->a_store);
    int ldb = grouped_b(c, unread, &stride, &B, &dB);
    int32_t *d_counts = check_ints_to_device(e->rows, (size_t)e->count);
    float *C = random_matrix(e->total + TAIL_ROWS, ldc);
    if (c->beta == 0) fill_nan(C, e->total, c->N, ldc);
    float *dC = to_device(C, e->total + TAIL_ROWS, ldc);
    ops_cpu_backend.gemm_grouped(c->trans_a, c->trans_b, e->count, e->rows, NULL, c->N, c->K, c->alpha, A, STORE_FP32,
                                 lda, B, stride, ldb, c->beta, C, STORE_FP32, ldc);
    // the caller's host copy of the counts (as the experts pass it)
    under()->gemm_grouped(c->trans_a, c->trans_b, e->count, d_counts, e->rows, c->N, c->K, c->alpha, dA, c->a_store,
                          lda, dB, stride, ldb, c->beta, dC, STORE_FP32, ldc);
    check_finish();
    char name[160];
    snprintf(name, sizeof(name), "gemm_grouped %s %d experts N=%d K=%d ld+%d alpha=%g beta=%g%s [%s]",
             trans_name(c->trans_a, c->trans_b), e->count, c->N, c->K, c->pad, c->alpha, c->beta,
             c->a_store == STORE_BF16 ? " A bf16-stored" : "", p->name);
    check_compare(name, "C", C, dC, (size_t)(e->total + TAIL_ROWS) * ldc, p->tol);
    check_free_all();
}

// gemm_grouped with C stored as bf16 (beta 0, ldc == N: pad 0), as check_grouped_case otherwise.
static void check_grouped_c_bf16_case(const GroupedCase *c, const Pass *p) {
    const Experts *e = c->e;
    int lda, unread = c->K == 0 || c->alpha == 0;
    size_t stride, n = (size_t)e->total * c->N;
    float *B, *dB;
    float *A = grouped_a(c, unread, &lda);
    void *dA = check_stored_to_device(A, (size_t)MT_MAX(c->trans_a ? c->K : e->total, 1) * lda, c->a_store);
    int ldb = grouped_b(c, unread, &stride, &B, &dB);
    int32_t *d_counts = check_ints_to_device(e->rows, (size_t)e->count);
    float *C = random_matrix(e->total, c->N), *dC16 = check_device_nan((n + 1) / 2);
    ops_cpu_backend.gemm_grouped(c->trans_a, c->trans_b, e->count, e->rows, NULL, c->N, c->K, c->alpha, A, STORE_FP32,
                                 lda, B, stride, ldb, 0, C, STORE_FP32, c->N);
    under()->gemm_grouped(c->trans_a, c->trans_b, e->count, d_counts, e->rows, c->N, c->K, c->alpha, dA, c->a_store,
                          lda, dB, stride, ldb, 0, dC16, STORE_BF16, c->N);
    float *got = check_widened_from_device(dC16, n, STORE_BF16);
    check_finish();
    round_as_bf16(C, n);
    char name[160];
    snprintf(name, sizeof(name), "gemm_grouped %s %d experts N=%d K=%d alpha=%g C bf16%s [%s]",
             trans_name(c->trans_a, c->trans_b), e->count, c->N, c->K, c->alpha,
             c->a_store == STORE_BF16 ? " A bf16-stored" : "", p->name);
    check_compare(name, "C", C, got, n, c_bf16_tol());
    check_free_all();
}

static void check_grouped_all(const Pass *p) {
    Experts few = experts_few(), many = experts_many();
    for (int t = 0; t < 4; t++) {
        GroupedCase tight = {t >> 1, t & 1, 33, 130, 0, 1.0f, 0.0f, &few, STORE_FP32};
        GroupedCase padded = {t >> 1, t & 1, 130, 7, 3, 1.0f, 1.0f, &few, STORE_FP32};
        GroupedCase scaled = {t >> 1, t & 1, 1, 33, 1, -0.5f, 0.25f, &few, STORE_FP32};
        check_grouped_case(&tight, p);
        check_grouped_case(&padded, p);
        check_grouped_case(&scaled, p);
    }
    const GroupedCase more[] = {
        {0, 1, 33, 0, 0, 1.0f, 0.0f, &few, STORE_FP32},     // K == 0, C overwritten with zeros
        {1, 0, 7, 0, 2, 1.0f, 0.5f, &few, STORE_FP32},      // K == 0, C scaled
        {0, 1, 33, 130, 0, 0.0f, 0.0f, &few, STORE_FP32},   // alpha == 0, A and B NaN
        {1, 1, 7, 33, 3, 0.0f, 2.0f, &few, STORE_FP32},     // alpha == 0, C scaled
        {0, 1, 7, 33, 0, 1.0f, 0.0f, &many, STORE_FP32},    // more problems than the first pointer scratch
        {1, 0, 33, 7, 1, 1.0f, 1.0f, &many, STORE_FP32},
        // A stored as bf16 (the experts' SwiGLU output under --bf16), each transpose, padded lds
        {0, 1, 33, 130, 0, 1.0f, 0.0f, &few, STORE_BF16},
        {0, 0, 130, 7, 3, 1.0f, 1.0f, &few, STORE_BF16},
        {1, 1, 7, 33, 1, -0.5f, 0.25f, &few, STORE_BF16},
        {1, 0, 33, 0, 2, 1.0f, 0.5f, &few, STORE_BF16},  // K == 0: A unread
    };
    for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++) check_grouped_case(&more[i], p);
    // C stored as bf16 (the experts' gate and up under --bf16): the forward's NT with A fp32 and
    // bf16, several K blocks (K 600), every transpose, K == 0 (zeros)
    const GroupedCase c_bf16[] = {
        {0, 1, 33, 130, 0, 1.0f, 0.0f, &few, STORE_FP32}, {0, 1, 130, 600, 0, 1.0f, 0.0f, &few, STORE_BF16},
        {0, 0, 7, 33, 0, -0.5f, 0.0f, &few, STORE_FP32},   {1, 1, 33, 7, 0, 1.0f, 0.0f, &many, STORE_FP32},
        {1, 0, 33, 0, 0, 1.0f, 0.0f, &few, STORE_BF16},
    };
    for (size_t i = 0; i < sizeof(c_bf16) / sizeof(c_bf16[0]); i++) check_grouped_c_bf16_case(&c_bf16[i], p);
}

static float *from_device(const float *dev, size_t n);

// ---- grouped weight gradient -------------------------------------------------------------------------

// W_g[out,in] += alpha·dY_gᵀ·X_g for every expert, K = rows[g] differing between experts;
// dY [total, out], X [total, in] stacked by expert; the W_g one block (the empty experts' too,
// which must not change) start from the same random values on both sides.
// dY and X go to the backend under test stored as dy_store and x_store (the cpu reference: fp32 of the
// same values).
static void check_wgrad_case(int out, int in, float alpha, Storage dy_store, Storage x_store, const Pass *p) {
    Experts e = experts_few();
    size_t stride = (size_t)out * in;
    float *W = random_matrix(e.count * out, in), *dW = to_device(W, e.count * out, in);
    float *dY = random_matrix(e.total, out), *X = random_matrix(e.total, in);
    void *d_dY = check_stored_to_device(dY, (size_t)e.total * out, dy_store);
    void *d_X = check_stored_to_device(X, (size_t)e.total * in, x_store);
    int32_t *d_counts = check_ints_to_device(e.rows, (size_t)e.count);
    ops_cpu_backend.gemm_grouped_wgrad(e.count, e.rows, NULL, out, in, alpha, dY, STORE_FP32, X, STORE_FP32, W, stride);
    // the counts read by the backend from tensor memory
    under()->gemm_grouped_wgrad(e.count, d_counts, NULL, out, in, alpha, d_dY, dy_store, d_X, x_store, dW, stride);
    check_finish();
    float *got = from_device(dW, (size_t)e.count * stride);
    for (int g = 0; g < e.count; g++) {
        char name[128], output[32];
        snprintf(name, sizeof(name), "gemm_grouped_wgrad out=%d in=%d alpha=%g%s%s [%s]", out, in, alpha,
                 dy_store == STORE_BF16 ? " dY bf16-stored" : "", x_store == STORE_BF16 ? " X bf16-stored" : "",
                 p->name);
        snprintf(output, sizeof(output), "W[%d] (rows %d)", g, e.rows[g]);
        check_compare(name, output, W + g * stride, got + g * stride, stride, p->tol);
    }
    check_free_all();
}

static void check_wgrad_all(const Pass *p) {
    check_wgrad_case(33, 7, 1.0f, STORE_FP32, STORE_FP32, p);
    check_wgrad_case(130, 33, 0.5f, STORE_FP32, STORE_FP32, p);
    check_wgrad_case(1, 130, -1.0f, STORE_FP32, STORE_FP32, p);
    check_wgrad_case(7, 1, 0.0f, STORE_FP32, STORE_FP32, p);  // alpha == 0: nothing changes
    check_wgrad_case(33, 130, 1.0f, STORE_FP32, STORE_BF16, p);  // X stored as bf16 (the experts' SwiGLU output)
    check_wgrad_case(130, 7, -0.5f, STORE_FP32, STORE_BF16, p);
    // dY stored as bf16 too (the gate and up gradients; their X, the input rows)
    check_wgrad_case(33, 130, 1.0f, STORE_BF16, STORE_BF16, p);
    check_wgrad_case(130, 7, 0.5f, STORE_BF16, STORE_FP32, p);
}

// ---- linear layers --------------------------------------------------------------------------------------

// y (N,out) = x·Wᵀ; y starts NaN on the device.
static void check_linear_forward(int N, int in, int out, const Pass *p) {
    float *x = random_matrix(N, in), *W = random_matrix(out, in), *y = random_matrix(N, out);
    float *dx = to_device(x, N, in), *dW = to_device(W, out, in), *dy = check_device_nan((size_t)N * out);
    ops_cpu_backend.linear_forward(y, x, W, N, in, out);
    under()->linear_forward(dy, dx, dW, N, in, out);
    check_finish();
    char name[96];
    snprintf(name, sizeof(name), "linear_forward N=%d in=%d out=%d [%s]", N, in, out, p->name);
    check_compare(name, "y", y, dy, (size_t)N * out, p->tol);
    check_free_all();
}

// dx (N,in) += dy·W (skipped when with_dx is 0), dW (out,in) += dyᵀ·x, from random dx, dW.
static void check_linear_backward(int N, int in, int out, int with_dx, const Pass *p) {
    float *x = random_matrix(N, in), *W = random_matrix(out, in), *dy = random_matrix(N, out);
    float *gx = random_matrix(N, in), *gW = random_matrix(out, in);
    float *d_x = to_device(x, N, in), *d_W = to_device(W, out, in), *d_dy = to_device(dy, N, out);
    float *d_gx = to_device(gx, N, in), *d_gW = to_device(gW, out, in);
    ops_cpu_backend.linear_backward(with_dx ? gx : NULL, gW, dy, x, W, N, in, out);
    under()->linear_backward(with_dx ? d_gx : NULL, d_gW, d_dy, d_x, d_W, N, in, out);
    check_finish();
    char name[96];
    snprintf(name, sizeof(name), "linear_backward N=%d in=%d out=%d%s [%s]", N, in, out, with_dx ? "" : " dx=NULL",
             p->name);
    check_compare(name, "dx", gx, d_gx, (size_t)N * in, p->tol);  // unchanged when skipped
    check_compare(name, "dW", gW, d_gW, (size_t)out * in, p->tol);
    check_free_all();
}

static void check_linear_all(const Pass *p) {
    static const int shapes[][3] = {{1, 33, 7}, {7, 33, 130}, {130, 130, 33}};  // one token, odd widths
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        check_linear_forward(shapes[s][0], shapes[s][1], shapes[s][2], p);
        check_linear_backward(shapes[s][0], shapes[s][1], shapes[s][2], 1, p);
    }
    check_linear_backward(33, 7, 130, 0, p);
}

// ---- bf16 in effect, repeatability -----------------------------------------------------------------------

// A device result copied into a host buffer (freed by check_free_all).
static float *from_device(const float *dev, size_t n) {
    float *h = check_random(n, 0.0f, 1.0f);
    check_download(h, dev, n * sizeof(float));
    return h;
}

// max |a − b| / max |b|
static double normwise_diff(const float *a, const float *b, size_t n) {
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return diff / scale;
}

// C = A·B (256 x 256 x 256) in fp32 and with 16-bit inputs (p): the two must differ by more
// than fp32 rounding, or the flag did not reach the tensor cores (e.g. a math mode overriding
// the compute type). Reported as 1 (differs) against an expected 1.
static void check_16bit_in_effect(const Pass *p, int inputs) {
    enum { S = 256 };
    float *A = random_matrix(S, S), *B = random_matrix(S, S);
    float *dA = to_device(A, S, S), *dB = to_device(B, S, S);
    float *d32 = check_device_nan(S * S), *d16 = check_device_nan(S * S);
    under()->gemm(0, 0, S, S, S, 1.0f, dA, S, dB, S, 0.0f, d32, S);
    check_set_gemm_inputs(inputs);
    under()->gemm(0, 0, S, S, S, 1.0f, dA, S, dB, S, 0.0f, d16, S);
    check_set_gemm_inputs(GEMM_INPUTS_FP32);
    check_finish();
    double diff = normwise_diff(from_device(d16, S * S), from_device(d32, S * S), S * S);
    char name[96];
    snprintf(name, sizeof(name), "gemm %s differs from fp32 (normwise %.2e > %.0e)", p->name, diff, TOL_FP32);
    check_compare_double(name, "16-bit inputs in effect", 1.0, diff > TOL_FP32 ? 1.0 : 0.0, 0.5);
    check_free_all();
}

// Two identical calls give the same bits: a deep-K GEMM (where cuBLAS may split K) and a
// grouped GEMM. Reported as 1 (bitwise equal) against an expected 1.
static void check_repeatable(const Pass *p) {
    enum { M = 256, N = 256, K = 8192 };
    float *A = random_matrix(M, K), *B = random_matrix(N, K);
    float *dA = to_device(A, M, K), *dB = to_device(B, N, K);
    float *c1 = check_device_nan(M * N), *c2 = check_device_nan(M * N);
    under()->gemm(0, 1, M, N, K, 1.0f, dA, K, dB, K, 0.0f, c1, N);
    under()->gemm(0, 1, M, N, K, 1.0f, dA, K, dB, K, 0.0f, c2, N);
    Experts e = experts_few();  // A as [total, K] (total < M rows), every expert B
    int32_t *d_counts = check_ints_to_device(e.rows, (size_t)e.count);
    size_t ng = (size_t)e.total * N;
    float *g1 = check_device_nan(ng), *g2 = check_device_nan(ng);
    // once reading the counts from tensor memory, once from the host copy: the same bits
    under()->gemm_grouped(0, 1, e.count, d_counts, NULL, N, K, 1.0f, dA, STORE_FP32, K, dB, 0, K, 0.0f, g1, STORE_FP32,
                          N);
    under()->gemm_grouped(0, 1, e.count, d_counts, e.rows, N, K, 1.0f, dA, STORE_FP32, K, dB, 0, K, 0.0f, g2,
                          STORE_FP32, N);
    check_finish();
    int same_gemm = memcmp(from_device(c1, M * N), from_device(c2, M * N), sizeof(float) * M * N) == 0;
    int same_grouped = memcmp(from_device(g1, ng), from_device(g2, ng), sizeof(float) * ng) == 0;
    char name[96];
    snprintf(name, sizeof(name), "gemm 256x256x8192 twice [%s]", p->name);
    check_compare_double(name, "bitwise equal", 1.0, same_gemm, 0.5);
    snprintf(name, sizeof(name), "gemm_grouped K=8192 twice [%s]", p->name);
    check_compare_double(name, "bitwise equal", 1.0, same_grouped, 0.5);
    check_free_all();
}

// ---- the family ---------------------------------------------------------------------------------------

static void check_pass(const Pass *p) {
    check_gemm_all(p);
    check_grouped_all(p);
    check_wgrad_all(p);
    check_linear_all(p);
    check_repeatable(p);
}

void check_gemm_ops(void) {
    const Pass fp32 = {"fp32", TOL_FP32};
    const Pass lowp[] = {{"bf16", TOL_BF16}, {"fp16", TOL_FP16}};
    const int inputs[] = {GEMM_INPUTS_BF16, GEMM_INPUTS_FP16};
    check_pass(&fp32);
    if (!check_has_16bit_gemms()) return;
    for (int k = 0; k < 2; k++) {
        check_set_gemm_inputs(inputs[k]);
        check_pass(&lowp[k]);
        check_set_gemm_inputs(GEMM_INPUTS_FP32);
        check_16bit_in_effect(&lowp[k], inputs[k]);
    }
}

// test_attention_storage.c — the attention ops with q, k, v and out stored as bf16 (ops.h
// AttentionShape q_store, kv_store, out_store: what --bf16 keeps on the cpu): bit for bit the
// results of fp32 storage holding the same values, i.e. of the fp32 tensors the bf16 ones were
// rounded from as bf16-input GEMMs read them. Forward: lse equal, a bf16 out equal to the fp32
// out rounded once; backward: dq, dk, dv equal, with D read from the bf16 out as from its
// widened copy. With grouped-query heads, a document mask, attention dropout, queries that see
// no key, under bf16 GEMM inputs (every kernel this CPU has) and fp32 ones.
#include <math.h>
#include <string.h>

#include "core/float_formats.h"
#include "ops/gemm.h"
#include "ops/ops.h"
#include "testlib.h"

enum { B = 2, T = 80, HEADS = 4, KV_HEADS = 2, D = 16, DV = 12 };

static unsigned long long lcg(unsigned long long *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 11;
}

static void fill(real *x, size_t n, unsigned long long seed) {
    for (size_t i = 0; i < n; i++) x[i] = (real)((double)lcg(&seed) / (double)(1ULL << 53) * 4 - 2);
}

// x16 <- x rounded as bf16_pack rounds; x <- those values widened (what fp32 storage holds).
static void round_both(uint16_t *x16, real *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        x16[i] = bf16_from_float_flushed((float)x[i]);
        x[i] = (real)bf16_to_float(x16[i]);
    }
}

static int differing(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) != 0; }

typedef struct {
    real *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
} Tensors;

static Tensors tensors_new(void) {
    size_t nq = (size_t)B * T * HEADS * D, nk = (size_t)B * T * KV_HEADS * D, nv = (size_t)B * T * KV_HEADS * DV;
    size_t no = (size_t)B * T * HEADS * DV;
    Tensors t = {mt_malloc(nq * sizeof(real)), mt_malloc(nk * sizeof(real)), mt_malloc(nv * sizeof(real)),
                 mt_malloc(no * sizeof(real)), mt_malloc(no * sizeof(real)),
                 mt_malloc((size_t)B * HEADS * T * sizeof(real)), mt_calloc(nq, sizeof(real)),
                 mt_calloc(nk, sizeof(real)), mt_calloc(nv, sizeof(real))};
    return t;
}

static void tensors_free(Tensors *t) {
    real *all[] = {t->q, t->k, t->v, t->dout, t->out, t->lse, t->dq, t->dk, t->dv};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
}

static void check_case(const char *kernel, int dropout, int masked) {
    size_t nq = (size_t)B * T * HEADS * D, nk = (size_t)B * T * KV_HEADS * D, nv = (size_t)B * T * KV_HEADS * DV;
    size_t no = (size_t)B * T * HEADS * DV, nl = (size_t)B * HEADS * T;
    int32_t key_start[B * T];
    for (int i = 0; i < B * T; i++) key_start[i] = masked ? (i % T) / 24 * 24 + (i % T >= 70 ? 90 : 0) : 0;
    AttentionShape s = {.B = B, .Tq = T, .Tk = T, .heads = HEADS, .kv_heads = KV_HEADS, .head_dim = D,
                        .v_head_dim = DV, .kv_row_stride = T, .scale = (real)0.25, .key_start = key_start};
    if (dropout)  // p = 0.2
        s.dropout = (DropoutMask){.stream = 7, .threshold = (uint32_t)(0.2 * 4294967296.0), .scale = (real)(1 / 0.8)};
    Tensors f = tensors_new(), h = tensors_new();  // fp32 storage; bf16 storage (f's fp32 values)
    fill(f.q, nq, 1), fill(f.k, nk, 2), fill(f.v, nv, 3), fill(f.dout, no, 4);
    uint16_t *q16 = mt_malloc(nq * 2), *k16 = mt_malloc(nk * 2), *v16 = mt_malloc(nv * 2), *out16 = mt_malloc(no * 2);
    round_both(q16, f.q, nq), round_both(k16, f.k, nk), round_both(v16, f.v, nv);
    memcpy(h.dout, f.dout, no * sizeof(real));

    attention_forward(f.out, f.lse, f.q, f.k, f.v, &s);
    AttentionShape s16 = s;
    s16.q_store = s16.kv_store = s16.out_store = STORE_BF16;
    attention_forward(out16, h.lse, q16, k16, v16, &s16);
    char what[128];
    snprintf(what, sizeof what, "%s, dropout %d, masked %d", kernel, dropout, masked);
    CHECK(!differing(f.lse, h.lse, nl * sizeof(real)), "lse of bf16-stored q, k, v differs (%s)", what);
    uint16_t *rounded = mt_malloc(no * 2);
    for (size_t i = 0; i < no; i++) rounded[i] = bf16_from_float_flushed((float)f.out[i]);
    CHECK(!differing(rounded, out16, no * 2), "a bf16 out is not the fp32 out rounded once (%s)", what);

    for (size_t i = 0; i < no; i++) f.out[i] = (real)bf16_to_float(out16[i]);  // D from the kept values
    attention_backward(f.dq, f.dk, f.dv, f.dout, f.out, f.lse, f.q, f.k, f.v, &s);
    attention_backward(h.dq, h.dk, h.dv, h.dout, out16, h.lse, q16, k16, v16, &s16);
    CHECK(!differing(f.dq, h.dq, nq * sizeof(real)), "dq of bf16 storage differs (%s)", what);
    CHECK(!differing(f.dk, h.dk, nk * sizeof(real)), "dk of bf16 storage differs (%s)", what);
    CHECK(!differing(f.dv, h.dv, nv * sizeof(real)), "dv of bf16 storage differs (%s)", what);
    real norm = 0;
    for (size_t i = 0; i < nq; i++) norm += f.dq[i] * f.dq[i];
    CHECK(norm > 0 && isfinite(norm), "the backward gave no gradient (%s)", what);
    free(q16), free(k16), free(v16), free(out16), free(rounded);
    tensors_free(&f), tensors_free(&h);
}

static void check_every_case(const char *kernel) {
    for (int dropout = 0; dropout <= 1; dropout++)
        for (int masked = 0; masked <= 1; masked++) check_case(kernel, dropout, masked);
}

static void test_bf16_inputs_every_kernel(void) {
    static const char *const kernels[] = {"amx", "avx512-bf16", "emulated"};
    mt_gemm_set_inputs(GEMM_INPUTS_BF16);
    for (int k = 0; k < 3; k++) {
        mt_gemm_use_bf16_kernel(kernels[k]);
        check_every_case(mt_gemm_kernel());
    }
    mt_gemm_use_bf16_kernel(NULL);
    mt_gemm_set_inputs(GEMM_INPUTS_FP32);
}

static void test_fp32_inputs(void) { check_every_case(mt_gemm_kernel()); }

int main(void) {
    RUN(test_bf16_inputs_every_kernel);
    RUN(test_fp32_inputs);
    TESTS_DONE();
}

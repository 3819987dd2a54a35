// check_attention.c — the attention ops of the backend under test against the cpu
// reference (op_check.h), forward and backward, on the shapes the model uses: multi-head and grouped
// (8 query heads on 2 kv heads), head widths 1 to 256, MLA's wider queries than values
// (192 / 128), sequence lengths around the 64-token tiles (1, 17, 64, 65, 130, 200),
// document masks (key_start), attention dropout (the same mask on both: the hash), decoding against a KV cache (Tq = 1, q_pos0 = Tk − 1,
// kv_row_stride > Tk), a prefill chunk after a cached prefix (q_pos0 > 0), and the key
// blocks of a context-parallel ring (k_pos0 > 0): a diagonal block, an earlier block some of
// whose queries' documents start after it (out = 0, lse = −∞ there), keys after some queries.
// attention_merge on random partial results with −∞ rows on either side. Three of the shapes again
// with q, k, v and out stored as bf16.
//
// Per case: random q, k, v, dout; forward on both backends (the device's out and lse start
// as NaN); backward on both from the cpu's out and lse, with dq, dk, dv starting from the
// same random values (backward accumulates; the kv-cache rows past Tk must stay as they
// were). Two cases also run the ops under test twice and require the same bits.
#include <math.h>
#include <string.h>

#include "core/float_formats.h"
#include "op_check.h"

typedef struct {
    const char *name;
    int B, Tq, Tk, q_pos0, k_pos0, kv_row_stride;  // k_pos0: 0 but for a ring's key blocks
    int heads, kv_heads, head_dim, v_head_dim;
    int documents;  // key_start from random document restarts (else NULL)
    int repeat;     // also check that a second run gives the same bits
    double dropout; // attention dropout probability (heads hashed from head_first = heads)
} AttentionCase;

static const AttentionCase attention_cases[] = {
    // name                                        B   Tq   Tk pos0 kpos0 stride  h kv    d   dv doc rep drop
    {"attention mha d64 T64",                      2,  64,  64,   0,    0,    64,  4, 4,  64,  64, 0, 0, 0},
    {"attention gqa d64 T200",                     2, 200, 200,   0,    0,   200,  8, 2,  64,  64, 0, 1, 0},
    {"attention mha d8 T17",                       2,  17,  17,   0,    0,    17,  4, 4,   8,   8, 0, 0, 0},
    {"attention gqa d8 T200",                      2, 200, 200,   0,    0,   200,  8, 2,   8,   8, 0, 0, 0},
    {"attention gqa d128 T1",                      2,   1,   1,   0,    0,     1,  8, 2, 128, 128, 0, 0, 0},
    {"attention gqa d128 T17",                     2,  17,  17,   0,    0,    17,  8, 2, 128, 128, 0, 0, 0},
    {"attention mha d128 T64",                     2,  64,  64,   0,    0,    64,  4, 4, 128, 128, 0, 0, 0},
    {"attention mla d192/v128 T200",               2, 200, 200,   0,    0,   200,  4, 4, 192, 128, 0, 0, 0},
    {"attention mla gqa d192/v128 T17",            2,  17,  17,   0,    0,    17,  8, 2, 192, 128, 0, 0, 0},
    {"attention gqa d64 T200 documents",           2, 200, 200,   0,    0,   200,  8, 2,  64,  64, 1, 1, 0},
    {"attention mha d8 T64 documents",             2,  64,  64,   0,    0,    64,  4, 4,   8,   8, 1, 0, 0},
    {"attention mla d192/v128 T64 documents",      2,  64,  64,   0,    0,    64,  4, 4, 192, 128, 1, 0, 0},
    {"attention gqa d128 decode",                  2,   1, 200, 199,    0,   256,  8, 2, 128, 128, 0, 0, 0},
    {"attention gqa d64 decode documents",         2,   1,  77,  76,    0,   128,  8, 2,  64,  64, 1, 0, 0},
    {"attention mla d192/v128 decode",             2,   1,  64,  63,    0,    96,  4, 4, 192, 128, 0, 0, 0},
    {"attention gqa d64 chunk after 47 documents", 2,  17,  64,  47,    0,    80,  8, 2,  64,  64, 1, 0, 0},
    {"attention mha d1 T65",                       1,  65,  65,   0,    0,    65,  2, 2,   1,   1, 0, 0, 0},
    {"attention mha d256 T130",                    1, 130, 130,   0,    0,   130,  2, 2, 256, 256, 0, 0, 0},
    {"attention gqa d96/v40 T100 documents",       1, 100, 100,   0,    0,   100,  4, 1,  96,  40, 1, 0, 0},
    {"attention gqa d64 ring diagonal documents",  2,  70,  70, 140,  140,    70,  8, 2,  64,  64, 1, 1, 0},
    {"attention gqa d64 ring earlier documents",   2,  70,  70, 210,   70,    70,  8, 2,  64,  64, 1, 1, 0},
    {"attention mla d192/v128 ring earlier",       2,  65,  65, 130,   65,    65,  4, 4, 192, 128, 0, 0, 0},
    {"attention mha d8 ring keys after queries",   2, 100, 100,   0,   30,   100,  4, 4,   8,   8, 0, 0, 0},
    {"attention gqa d128 decode ring documents",   2,   1,  64, 300,  100,    64,  8, 2, 128, 128, 1, 0, 0},
    {"attention gqa d64 T200 dropout 0.3",         2, 200, 200,   0,    0,   200,  8, 2,  64,  64, 1, 1, 0.3},
    {"attention mla d192/v128 T17 dropout 0.1",    2,  17,  17,   0,    0,    17,  4, 4, 192, 128, 0, 0, 0.1},
    {"attention gqa d64 ring earlier dropout 0.5", 2,  70,  70, 210,   70,    70,  8, 2,  64,  64, 1, 1, 0.5},
};

// key_start (B·Tq): each batch row is cut into documents at random positions (about one
// in 16, and always at a third of the row); a query's first key is its document's start.
static int32_t *document_starts(const AttentionCase *c) {
    int positions = c->q_pos0 + c->Tq;
    int32_t *cut = check_random_ints((size_t)c->B * positions, 0, 16);
    int32_t *starts = check_random_ints((size_t)c->B * c->Tq, 0, 1);  // overwritten below
    for (int b = 0; b < c->B; b++) {
        int start = 0;
        for (int p = 0; p < positions; p++) {
            if (p > 0 && (cut[(size_t)b * positions + p] == 0 || p == positions / 3)) start = p;
            if (p >= c->q_pos0) starts[(size_t)b * c->Tq + p - c->q_pos0] = start;
        }
    }
    return starts;
}

// The element counts of one case's tensors.
typedef struct {
    size_t q, k, v, out, lse;
} AttentionSizes;

static AttentionSizes attention_sizes(const AttentionCase *c) {
    size_t tokens = (size_t)c->B * c->Tq, kv_rows = (size_t)c->B * c->kv_row_stride;
    AttentionSizes n = {.q = tokens * c->heads * c->head_dim, .k = kv_rows * c->kv_heads * c->head_dim,
                        .v = kv_rows * c->kv_heads * c->v_head_dim, .out = tokens * c->heads * c->v_head_dim,
                        .lse = (size_t)c->B * c->heads * c->Tq};
    return n;
}

// 1 when the n floats at device pointers a and b are the same bits (copied to host).
static int same_bits(const float *a, const float *b, size_t n) {
    float *ha = check_random(n, 0, 1), *hb = check_random(n, 0, 1);
    check_download(ha, a, n * sizeof(float));
    check_download(hb, b, n * sizeof(float));
    return memcmp(ha, hb, n * sizeof(float)) == 0;
}

// A pass/fail line through the harness: 1 against 1 when `same`, else 1 against 2.
static void check_same(const char *check, const char *output, int same) {
    check_compare_double(check, output, 1.0, same ? 1.0 : 2.0, 0.5);
}

// lse is −∞ for a query that sees no key, which the normwise error cannot weigh: the −∞
// entries must be the same on both backends, and the finite ones are compared.
static void check_compare_lse(const char *check, const float *cpu, const float *gpu_device, size_t n) {
    float *gpu = check_random(n, 0, 1), *cpu_finite = check_host_copy(cpu, n);
    check_finish();
    check_download(gpu, gpu_device, n * sizeof(float));
    int same_rows = 1;
    for (size_t i = 0; i < n; i++) {
        int cpu_empty = cpu[i] == -INFINITY, gpu_empty = gpu[i] == -INFINITY;
        same_rows &= cpu_empty == gpu_empty;
        if (cpu_empty) cpu_finite[i] = 0;
        if (gpu_empty) gpu[i] = 0;
    }
    check_same(check, "lse -inf rows", same_rows);
    check_compare(check, "lse", cpu_finite, check_to_device(gpu, n), n, TOL_FP32);
}

static void check_attention_case(const AttentionCase *c) {
    AttentionSizes n = attention_sizes(c);
    float *q = check_random(n.q, -2, 2), *k = check_random(n.k, -2, 2), *v = check_random(n.v, -1, 1);
    float *dout = check_random(n.out, -1, 1);
    AttentionShape s = {.B = c->B, .Tq = c->Tq, .Tk = c->Tk, .q_pos0 = c->q_pos0, .k_pos0 = c->k_pos0, .heads = c->heads,
                        .kv_heads = c->kv_heads, .head_dim = c->head_dim, .v_head_dim = c->v_head_dim,
                        .kv_row_stride = c->kv_row_stride, .scale = 1.0f / sqrtf((float)c->head_dim),
                        .key_start = c->documents ? document_starts(c) : NULL};
    if (c->dropout > 0) {
        s.dropout = (DropoutMask){.stream = 0xD0D0CAFEULL, .threshold = (uint32_t)(c->dropout * 4294967296.0),
                                  .scale = (real)(1 / (1 - c->dropout))};
        s.head_first = c->heads;
    }
    AttentionShape sd = s;  // the same shape with a device copy of key_start
    if (s.key_start) sd.key_start = check_ints_to_device(s.key_start, (size_t)c->B * c->Tq);
    float *d_q = check_to_device(q, n.q), *d_k = check_to_device(k, n.k), *d_v = check_to_device(v, n.v);

    // forward
    float *out = check_random(n.out, 0, 1), *lse = check_random(n.lse, 0, 1);  // overwritten
    ops_cpu_backend.attention_forward(out, lse, q, k, v, &s);
    float *d_out = check_device_nan(n.out), *d_lse = check_device_nan(n.lse);
    under()->attention_forward(d_out, d_lse, d_q, d_k, d_v, &sd);
    check_finish();
    check_compare(c->name, "out", out, d_out, n.out, TOL_FP32);
    check_compare_lse(c->name, lse, d_lse, n.lse);

    // backward from the cpu's out and lse; gradients accumulate onto the same start
    float *dq = check_random(n.q, -1, 1), *dk = check_random(n.k, -1, 1), *dv = check_random(n.v, -1, 1);
    float *d_dq = check_to_device(dq, n.q), *d_dk = check_to_device(dk, n.k), *d_dv = check_to_device(dv, n.v);
    float *d_dout = check_to_device(dout, n.out), *d_out_cpu = check_to_device(out, n.out);
    float *d_lse_cpu = check_to_device(lse, n.lse);
    ops_cpu_backend.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, &s);
    under()->attention_backward(d_dq, d_dk, d_dv, d_dout, d_out_cpu, d_lse_cpu, d_q, d_k, d_v, &sd);
    check_finish();
    check_compare(c->name, "dq", dq, d_dq, n.q, TOL_FP32);
    check_compare(c->name, "dk", dk, d_dk, n.k, TOL_FP32);
    check_compare(c->name, "dv", dv, d_dv, n.v, TOL_FP32);
    if (!c->repeat) return;

    // the same ops again from the same start: the same bits
    float *d_out2 = check_device_nan(n.out), *d_lse2 = check_device_nan(n.lse);
    under()->attention_forward(d_out2, d_lse2, d_q, d_k, d_v, &sd);
    float *dq0 = check_random(n.q, -1, 1), *dk0 = check_random(n.k, -1, 1), *dv0 = check_random(n.v, -1, 1);
    float *runs[2][3];
    for (int run = 0; run < 2; run++) {
        runs[run][0] = check_to_device(dq0, n.q), runs[run][1] = check_to_device(dk0, n.k);
        runs[run][2] = check_to_device(dv0, n.v);
        under()->attention_backward(runs[run][0], runs[run][1], runs[run][2], d_dout, d_out_cpu, d_lse_cpu, d_q, d_k,
                                d_v, &sd);
    }
    check_finish();
    check_same(c->name, "out repeat bits", same_bits(d_out, d_out2, n.out) && same_bits(d_lse, d_lse2, n.lse));
    check_same(c->name, "dq repeat bits", same_bits(runs[0][0], runs[1][0], n.q));
    check_same(c->name, "dk repeat bits", same_bits(runs[0][1], runs[1][1], n.k));
    check_same(c->name, "dv repeat bits", same_bits(runs[0][2], runs[1][2], n.v));
}

// ---- q, k, v and out stored as bf16 (ops.h AttentionShape: what --bf16 keeps on the cpu) -----
// The backend under test reads bf16 q, k, v and writes a bf16 out; the cpu reference runs on fp32
// storage of the same values (check_stored_to_device rounds the host copies in place), its out
// then rounded once and its backward reading D from those rounded values. On the cpu backend
// the bits must be the same; elsewhere within fp32 arithmetic, but for out's rounding (bf16).
static void check_attention_stored(const AttentionCase *c) {
    AttentionSizes n = attention_sizes(c);
    float *q = check_random(n.q, -2, 2), *k = check_random(n.k, -2, 2), *v = check_random(n.v, -1, 1);
    float *dout = check_random(n.out, -1, 1);
    AttentionShape s = {.B = c->B, .Tq = c->Tq, .Tk = c->Tk, .q_pos0 = c->q_pos0, .heads = c->heads,
                        .kv_heads = c->kv_heads, .head_dim = c->head_dim, .v_head_dim = c->v_head_dim,
                        .kv_row_stride = c->kv_row_stride, .scale = 1.0f / sqrtf((float)c->head_dim)};
    AttentionShape s16 = s;
    s16.q_store = s16.kv_store = s16.out_store = STORE_BF16;
    void *d_q = check_stored_to_device(q, n.q, STORE_BF16), *d_k = check_stored_to_device(k, n.k, STORE_BF16);
    void *d_v = check_stored_to_device(v, n.v, STORE_BF16);
    int on_cpu = check_backend() == &check_backend_cpu;
    char name[96];
    snprintf(name, sizeof name, "%s bf16-stored", c->name);

    float *out = check_random(n.out, 0, 1), *lse = check_random(n.lse, 0, 1);  // overwritten
    ops_cpu_backend.attention_forward(out, lse, q, k, v, &s);
    for (size_t i = 0; i < n.out; i++) out[i] = bf16_to_float(bf16_from_float_flushed(out[i]));  // as kept
    void *d_out = check_device_nan(n.out);  // overwritten: NaN bits wherever a row is not written
    float *d_lse = check_device_nan(n.lse);
    under()->attention_forward(d_out, d_lse, d_q, d_k, d_v, &s16);
    check_finish();
    check_compare(name, "out", out, check_widened_from_device(d_out, n.out, STORE_BF16), n.out,
                  on_cpu ? 0 : TOL_BF16);
    check_compare_lse(name, lse, d_lse, n.lse);

    // backward from the cpu's (rounded) out and lse, gradients accumulating onto the same start
    float *dq = check_random(n.q, -1, 1), *dk = check_random(n.k, -1, 1), *dv = check_random(n.v, -1, 1);
    float *d_dq = check_to_device(dq, n.q), *d_dk = check_to_device(dk, n.k), *d_dv = check_to_device(dv, n.v);
    float *d_dout = check_to_device(dout, n.out), *d_lse_cpu = check_to_device(lse, n.lse);
    void *d_out_cpu = check_stored_to_device(check_host_copy(out, n.out), n.out, STORE_BF16);
    ops_cpu_backend.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, &s);
    under()->attention_backward(d_dq, d_dk, d_dv, d_dout, d_out_cpu, d_lse_cpu, d_q, d_k, d_v, &s16);
    check_finish();
    double tol = on_cpu ? 0 : TOL_FP32;
    check_compare(name, "dq", dq, d_dq, n.q, tol);
    check_compare(name, "dk", dk, d_dk, n.k, tol);
    check_compare(name, "dv", dv, d_dv, n.v, tol);
}

// ---- attention_merge -----------------------------------------------------------------------

// Random partial results (out, lse) of B·Tq queries: about one row in 8 saw no key (lse = −∞,
// out = 0), as rows of a fully masked block do.
static void random_partial(float **out, float **lse, const AttentionShape *s, int dv) {
    size_t rows = (size_t)s->B * s->Tq * s->heads;
    *out = check_random(rows * dv, -1, 1), *lse = check_random(rows, -4, 4);
    int32_t *empty = check_random_ints(rows, 0, 8);
    for (size_t stat = 0; stat < rows; stat++) {  // stat = (b·heads + h)·Tq + t
        if (empty[stat]) continue;
        size_t bh = stat / s->Tq, t = stat % s->Tq, b = bh / s->heads, h = bh % s->heads;
        (*lse)[stat] = -INFINITY;
        memset(*out + ((b * s->Tq + t) * s->heads + h) * dv, 0, dv * sizeof(float));
    }
}

static void check_merge_case(const char *name, int B, int Tq, int heads, int dv) {
    AttentionShape s = {.B = B, .Tq = Tq, .heads = heads, .kv_heads = heads, .head_dim = dv};
    float *out, *lse, *out_block, *lse_block;
    random_partial(&out, &lse, &s, dv);
    random_partial(&out_block, &lse_block, &s, dv);
    size_t rows = (size_t)B * Tq * heads;
    float *d_out = check_to_device(out, rows * dv), *d_lse = check_to_device(lse, rows);
    float *d_out_block = check_to_device(out_block, rows * dv), *d_lse_block = check_to_device(lse_block, rows);
    ops_cpu_backend.attention_merge(out, lse, out_block, lse_block, &s);
    under()->attention_merge(d_out, d_lse, d_out_block, d_lse_block, &s);
    check_finish();
    check_compare(name, "out", out, d_out, rows * dv, TOL_FP32);
    check_compare_lse(name, lse, d_lse, rows);
}

void check_attention_ops(void) {
    for (size_t i = 0; i < sizeof(attention_cases) / sizeof(attention_cases[0]); i++) {
        check_attention_case(&attention_cases[i]);
        check_free_all();
    }
    // bf16 storage: grouped heads over several tiles, MLA's widths, decoding
    static const int stored_cases[] = {1, 8, 12};
    for (size_t i = 0; i < sizeof(stored_cases) / sizeof(stored_cases[0]); i++) {
        check_attention_stored(&attention_cases[stored_cases[i]]);
        check_free_all();
    }
    check_merge_case("attention_merge h8 dv128 T70", 2, 70, 8, 128);
    check_free_all();
    check_merge_case("attention_merge h4 dv40 T33", 3, 33, 4, 40);
    check_free_all();
}

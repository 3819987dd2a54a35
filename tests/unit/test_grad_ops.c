// test_grad_ops.c — finite-difference checks of every op's backward against its forward,
// in double precision (the library is compiled with real = double). Each op is checked
// with a random linear functional of its output, loss = Σ out ⊙ R for a fixed random R,
// so that dout = R. Central differences with eps = 1e-6 are accurate to ~1e-9 here, so
// an element passes when |analytic − numeric| <= 1e-8 + 1e-6·(|analytic| + |numeric|).
// The same file checks the forward passes that have a simple direct formula (attention
// against a naive full softmax matrix, the dispatch plan with dropping and padding, AdamW,
// vec_sum_squares). The router has its own file, test_grad_router.c.
#include <math.h>
#include <string.h>

#include "core/rng.h"
#include "moe/dispatcher.h"
#include "moe/experts.h"
#include "ops/ops.h"
#include "testlib.h"

#define FD_EPS 1e-6
#define FD_ATOL 1e-8
#define FD_RTOL 1e-6

// ---- helpers -----------------------------------------------------------------------------

static real *alloc_normal(Rng *rng, size_t n, double scale) {
    real *x = mt_malloc((n ? n : 1) * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = (real)(scale * rng_normal(rng));
    return x;
}

static real *alloc_copy(const real *src, size_t n) {
    real *x = mt_malloc((n ? n : 1) * sizeof(real));
    memcpy(x, src, n * sizeof(real));
    return x;
}

static double dot_real(const real *a, const real *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// after − before: the part a backward ADDED to a pre-filled buffer
static real *alloc_diff(const real *after, const real *before, size_t n) {
    real *d = mt_malloc((n ? n : 1) * sizeof(real));
    for (size_t i = 0; i < n; i++) d[i] = after[i] - before[i];
    return d;
}

typedef double (*Objective)(void *ctx);

// Central differences of f with respect to every element of p, compared with analytic.
static void fd_check(const char *what, real *p, size_t n, const real *analytic, Objective f, void *ctx) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        real saved = p[i];
        p[i] = saved + FD_EPS;
        double up = f(ctx);
        p[i] = saved - FD_EPS;
        double down = f(ctx);
        p[i] = saved;
        double numeric = (up - down) / (2 * FD_EPS), a = analytic[i];
        double err = fabs(a - numeric), tol = FD_ATOL + FD_RTOL * (fabs(a) + fabs(numeric));
        if (!(err <= tol)) {
            if (bad < 3) CHECK(0, "%s[%zu]: analytic %.12g numeric %.12g", what, i, a, numeric);
            bad++;
        }
    }
    if (bad > 3) CHECK(0, "%s: %d of %zu elements wrong", what, bad, n);
}

// ---- linear --------------------------------------------------------------------------------

typedef struct {
    real *y, *x, *W, *R;
    int N, in, out;
} LinearCtx;

static double linear_obj(void *p) {
    LinearCtx *c = p;
    linear_forward(c->y, c->x, c->W, c->N, c->in, c->out);
    return dot_real(c->y, c->R, (size_t)c->N * c->out);
}

static void check_linear(int portable) {
    mt_gemm_force_portable(portable);
    const char *backend = mt_gemm_backend();
    Rng rng;
    rng_seed(&rng, 11);
    int N = 5, in = 7, out = 6;
    size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    LinearCtx c = {mt_malloc(ny * sizeof(real)), alloc_normal(&rng, nx, 1), alloc_normal(&rng, nw, 0.5),
                   alloc_normal(&rng, ny, 1), N, in, out};
    // forward against a direct sum
    linear_forward(c.y, c.x, c.W, N, in, out);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int i = 0; i < in; i++) s += (double)c.x[n * in + i] * c.W[o * in + i];
            CHECK_CLOSE(c.y[n * out + o], s, 1e-13, 1e-13, "linear_forward");
        }
    // backward accumulates into pre-filled dx and dW
    real *dx0 = alloc_normal(&rng, nx, 1), *dW0 = alloc_normal(&rng, nw, 1);
    real *dx = alloc_copy(dx0, nx), *dW = alloc_copy(dW0, nw);
    linear_backward(dx, dW, c.R, c.x, c.W, N, in, out);
    real *gx = alloc_diff(dx, dx0, nx), *gW = alloc_diff(dW, dW0, nw);
    char what[64];
    snprintf(what, sizeof what, "linear dx (%s)", backend);
    fd_check(what, c.x, nx, gx, linear_obj, &c);
    snprintf(what, sizeof what, "linear dW (%s)", backend);
    fd_check(what, c.W, nw, gW, linear_obj, &c);
    // dx == NULL: only dW, the same values
    real *dW2 = alloc_copy(dW0, nw);
    linear_backward(NULL, dW2, c.R, c.x, c.W, N, in, out);
    for (size_t i = 0; i < nw; i++) CHECK_CLOSE(dW2[i], dW[i], 0, 0, "linear dW with dx NULL");
    free(dx0), free(dW0), free(dx), free(dW), free(gx), free(gW), free(dW2);
    free(c.y), free(c.x), free(c.W), free(c.R);
    mt_gemm_force_portable(0);
}

static void test_linear_default_backend(void) { check_linear(0); }
static void test_linear_portable_backend(void) { check_linear(1); }

// ---- embedding -------------------------------------------------------------------------------

typedef struct {
    real *out, *table, *R;
    const int32_t *tokens;
    int N, C;
} EmbCtx;

static double emb_obj(void *p) {
    EmbCtx *c = p;
    embedding_forward(c->out, c->tokens, c->table, c->N, c->C);
    return dot_real(c->out, c->R, (size_t)c->N * c->C);
}

static void test_embedding(void) {
    Rng rng;
    rng_seed(&rng, 12);
    enum { V = 6, C = 5, N = 9 };
    static const int32_t tokens[N] = {1, 3, 1, 0, 5, 1, 3, 2, 5};  // 4 never used
    EmbCtx c = {mt_malloc(N * C * sizeof(real)), alloc_normal(&rng, V * C, 1),
                alloc_normal(&rng, N * C, 1), tokens, N, C};
    embedding_forward(c.out, tokens, c.table, N, C);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < C; j++)
            CHECK(c.out[n * C + j] == c.table[tokens[n] * C + j], "embedding_forward row %d", n);
    real *d0 = alloc_normal(&rng, V * C, 1), *d = alloc_copy(d0, V * C);
    embedding_backward(d, c.R, tokens, N, C);
    real *g = alloc_diff(d, d0, V * C);
    fd_check("embedding dtable", c.table, V * C, g, emb_obj, &c);
    for (int j = 0; j < C; j++) CHECK(d[4 * C + j] == d0[4 * C + j], "unused token 4 touched");
    free(d0), free(d), free(g), free(c.out), free(c.table), free(c.R);
}

// ---- RMSNorm -----------------------------------------------------------------------------------

typedef struct {
    real *y, *rstd, *x, *w, *R;
    int N, C;
    real eps;
} RmsCtx;

static double rms_obj(void *p) {
    RmsCtx *c = p;
    rmsnorm_forward(c->y, STORE_FP32, c->rstd, c->x, STORE_FP32, c->w, c->N, c->C, c->eps);
    return dot_real(c->y, c->R, (size_t)c->N * c->C);
}

static void test_rmsnorm(void) {
    Rng rng;
    rng_seed(&rng, 13);
    int N = 4, C = 6;
    size_t n = (size_t)N * C;
    RmsCtx c = {mt_malloc(n * sizeof(real)), mt_malloc(N * sizeof(real)), alloc_normal(&rng, n, 1),
                alloc_normal(&rng, C, 1), alloc_normal(&rng, n, 1), N, C, 1e-5};
    for (int j = 0; j < C; j++) c.w[j] += 1;
    rmsnorm_forward(c.y, STORE_FP32, c.rstd, c.x, STORE_FP32, c.w, N, C, c.eps);
    for (int r = 0; r < N; r++) {
        double ss = 0;
        for (int j = 0; j < C; j++) ss += (double)c.x[r * C + j] * c.x[r * C + j];
        double rstd = 1 / sqrt(ss / C + c.eps);
        CHECK_CLOSE(c.rstd[r], rstd, 0, 1e-14, "rmsnorm rstd");
        for (int j = 0; j < C; j++)
            CHECK_CLOSE(c.y[r * C + j], c.x[r * C + j] * rstd * c.w[j], 1e-15, 1e-13, "rmsnorm y");
    }
    real *dx0 = alloc_normal(&rng, n, 1), *dw0 = alloc_normal(&rng, C, 1);
    real *dx = alloc_copy(dx0, n), *dw = alloc_copy(dw0, C);
    rmsnorm_backward(dx, dw, c.R, c.x, STORE_FP32, c.w, c.rstd, N, C);
    real *gx = alloc_diff(dx, dx0, n), *gw = alloc_diff(dw, dw0, C);
    fd_check("rmsnorm dx", c.x, n, gx, rms_obj, &c);
    fd_check("rmsnorm dw", c.w, C, gw, rms_obj, &c);
    free(dx0), free(dw0), free(dx), free(dw), free(gx), free(gw);
    free(c.y), free(c.rstd), free(c.x), free(c.w), free(c.R);
}

// ---- RoPE -----------------------------------------------------------------------------------------

typedef struct {
    real *tmp, *x, *R, *cs;
    int N, T, pos0;
    size_t n;             // elements of x: N rows of layout.row_stride
    int offset;           // first rotary element of each head within the head
    RopeLayout layout;
    const int32_t *positions;  // per token, or NULL (pos0 + n % T)
} RopeCtx;

static double rope_obj(void *p) {
    RopeCtx *c = p;
    memcpy(c->tmp, c->x, c->n * sizeof(real));
    TokenLayout tokens = {.B = c->N / c->T, .T = c->T, .pos0 = c->pos0, .positions = c->positions};
    rope_forward(c->tmp + c->offset, c->cs, &tokens, &c->layout);
    return dot_real(c->tmp, c->R, c->n);
}

// Rotate-half over whole heads, and interleaved pairs on the last columns of wider heads
// (the query layout of Multi-Latent Attention).
static void test_rope_layout(int interleaved, int offset, int explicit_positions) {
    Rng rng;
    rng_seed(&rng, 14 + interleaved);
    int B = 3, T = 4, N = B * T, pos0 = 5, heads = 3, d = 6, half = d / 2, max_pos = pos0 + T;
    int head_stride = offset + d;
    RopeLayout layout = {.heads = heads, .dim = d, .head_stride = head_stride, .row_stride = heads * head_stride,
                         .interleaved = interleaved};
    size_t n = (size_t)N * layout.row_stride;
    int32_t positions[12];  // documents restarting inside rows: --reset-position-ids
    for (int t = 0; t < N; t++) positions[t] = (t % T) % 3 + (t % 2);
    RopeCtx c = {mt_malloc(n * sizeof(real)), alloc_normal(&rng, n, 1), alloc_normal(&rng, n, 1),
                 mt_malloc((size_t)max_pos * half * 2 * sizeof(real)), N, T, pos0, n, offset, layout,
                 explicit_positions ? positions : NULL};
    rope_table(c.cs, max_pos, d, 10000.0);
    // the table holds cos/sin of pos·base^(−2i/d) (angles rounded to float: ~1e-6)
    for (int p = 0; p < max_pos; p++)
        for (int i = 0; i < half; i++) {
            double angle = p * pow(10000.0, -2.0 * i / d);
            CHECK_CLOSE(c.cs[(p * half + i) * 2 + 0], cos(angle), 2e-6, 0, "rope_table cos");
            CHECK_CLOSE(c.cs[(p * half + i) * 2 + 1], sin(angle), 2e-6, 0, "rope_table sin");
        }
    // forward: token n of batch row n / T sits at position pos0 + n % T; pairs (i, i + d/2)
    // or (2i, 2i + 1); the columns before `offset` are untouched
    rope_obj(&c);
    for (int t = 0; t < N; t++) {
        const real *cs = c.cs + (size_t)(c.positions ? c.positions[t] : pos0 + t % T) * half * 2;
        for (int h = 0; h < heads; h++) {
            size_t at = (size_t)t * layout.row_stride + (size_t)h * head_stride;
            for (int i = 0; i < offset; i++) CHECK(c.tmp[at + i] == c.x[at + i], "rope leaves other columns");
            at += offset;
            for (int i = 0; i < half; i++) {
                size_t first = at + (interleaved ? 2 * i : i), second = first + (interleaved ? 1 : half);
                double a = c.x[first], b = c.x[second], co = cs[2 * i], si = cs[2 * i + 1];
                CHECK_CLOSE(c.tmp[first], a * co - b * si, 1e-14, 1e-14, "rope_forward first of pair");
                CHECK_CLOSE(c.tmp[second], b * co + a * si, 1e-14, 1e-14, "rope_forward second of pair");
            }
        }
    }
    // backward is the exact transpose: d/dx Σ rope(x) ⊙ R = rope_backward(R)
    real *g = alloc_copy(c.R, n);
    TokenLayout tokens = {.B = B, .T = T, .pos0 = pos0, .positions = c.positions};
    rope_backward(g + offset, c.cs, &tokens, &layout);
    fd_check(interleaved ? "rope interleaved dx" : "rope dx", c.x, n, g, rope_obj, &c);
    free(g), free(c.tmp), free(c.x), free(c.R), free(c.cs);
}

static void test_rope(void) {
    test_rope_layout(0, 0, 0);
    test_rope_layout(1, 4, 0);
    test_rope_layout(0, 2, 1);
}

// ---- attention ---------------------------------------------------------------------------------

static int v_dim(const AttentionShape *s) { return s->v_head_dim ? s->v_head_dim : s->head_dim; }
static size_t q_len(const AttentionShape *s) { return (size_t)s->B * s->Tq * s->heads * s->head_dim; }
static size_t out_len(const AttentionShape *s) { return (size_t)s->B * s->Tq * s->heads * v_dim(s); }
static size_t k_len(const AttentionShape *s) { return (size_t)s->B * s->kv_row_stride * s->kv_heads * s->head_dim; }
static size_t v_len(const AttentionShape *s) { return (size_t)s->B * s->kv_row_stride * s->kv_heads * v_dim(s); }

// Naive reference: the full (Tq × Tk) causal softmax matrix of each (batch, head), then P·V.
static void attention_naive(double *out, double *lse, const real *q, const real *k,
                            const real *v, const AttentionShape *s) {
    int d = s->head_dim, dv = v_dim(s), group = s->heads / s->kv_heads;
    double *P = mt_malloc((size_t)s->Tq * s->Tk * sizeof(double));
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->heads; h++) {
            int kvh = h / group;
            for (int t = 0; t < s->Tq; t++) {
                double *row = P + (size_t)t * s->Tk, sum = 0;
                const real *qr = q + (((size_t)b * s->Tq + t) * s->heads + h) * d;
                int start = s->key_start ? s->key_start[(size_t)b * s->Tq + t] : 0;
                for (int j = 0; j < s->Tk; j++) {
                    if (j > s->q_pos0 + t || j < start) {  // causal and document masks
                        row[j] = 0;
                        continue;
                    }
                    const real *kr = k + (((size_t)b * s->kv_row_stride + j) * s->kv_heads + kvh) * d;
                    double score = 0;
                    for (int i = 0; i < d; i++) score += (double)qr[i] * kr[i];
                    row[j] = exp(s->scale * score);  // scores are O(1): no shift needed
                    sum += row[j];
                }
                lse[((size_t)b * s->heads + h) * s->Tq + t] = log(sum);
                for (int j = 0; j < s->Tk; j++) row[j] /= sum;
            }
            for (int t = 0; t < s->Tq; t++)
                for (int i = 0; i < dv; i++) {
                    double o = 0;
                    for (int j = 0; j < s->Tk; j++) {
                        if (P[(size_t)t * s->Tk + j] == 0) continue;  // masked (skips NaN padding)
                        o += P[(size_t)t * s->Tk + j] *
                             v[(((size_t)b * s->kv_row_stride + j) * s->kv_heads + kvh) * dv + i];
                    }
                    out[(((size_t)b * s->Tq + t) * s->heads + h) * dv + i] = o;
                }
        }
    free(P);
}

static void check_attention_forward(const AttentionShape *s, const real *q, const real *k,
                                    const real *v, const char *what) {
    size_t nq = out_len(s), nl = (size_t)s->B * s->heads * s->Tq;
    real *out = mt_malloc(nq * sizeof(real)), *lse = mt_malloc(nl * sizeof(real));
    double *ref = mt_malloc(nq * sizeof(double)), *ref_lse = mt_malloc(nl * sizeof(double));
    attention_forward(out, lse, q, k, v, s);
    attention_naive(ref, ref_lse, q, k, v, s);
    int bad = 0;
    for (size_t i = 0; i < nq; i++)
        if (!(fabs(out[i] - ref[i]) <= 1e-13 + 1e-12 * fabs(ref[i])) && bad++ < 3)
            CHECK(0, "%s out[%zu]: got %.15g expected %.15g", what, i, (double)out[i], ref[i]);
    for (size_t i = 0; i < nl; i++)
        if (!(fabs(lse[i] - ref_lse[i]) <= 1e-13 + 1e-12 * fabs(ref_lse[i])) && bad++ < 3)
            CHECK(0, "%s lse[%zu]: got %.15g expected log sum exp %.15g", what, i, (double)lse[i],
                  ref_lse[i]);
    free(out), free(lse), free(ref), free(ref_lse);
}

typedef struct {
    const AttentionShape *s;
    real *out, *lse, *q, *k, *v, *R;
} AttnCtx;

static double attn_obj(void *p) {
    AttnCtx *c = p;
    attention_forward(c->out, c->lse, c->q, c->k, c->v, c->s);
    return dot_real(c->out, c->R, out_len(c->s));
}

static void check_attention_grad(int kv_heads, int v_head_dim, const int32_t *key_start, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    AttentionShape s = {.B = 2, .Tq = 5, .Tk = 5, .q_pos0 = 0, .heads = 4, .kv_heads = kv_heads,
                        .head_dim = 4, .v_head_dim = v_head_dim, .kv_row_stride = 5, .scale = 1 / sqrt(4.0),
                        .key_start = key_start};
    size_t nq = q_len(&s), nk = k_len(&s), nv = v_len(&s), no = out_len(&s), nl = (size_t)s.B * s.heads * s.Tq;
    AttnCtx c = {&s, mt_malloc(no * sizeof(real)), mt_malloc(nl * sizeof(real)),
                 alloc_normal(&rng, nq, 1), alloc_normal(&rng, nk, 1), alloc_normal(&rng, nv, 1),
                 alloc_normal(&rng, no, 1)};
    char what[80];
    snprintf(what, sizeof what, "attention heads=4 kv_heads=%d v_head_dim=%d", kv_heads, v_dim(&s));
    check_attention_forward(&s, c.q, c.k, c.v, what);
    attn_obj(&c);
    real *dq0 = alloc_normal(&rng, nq, 1), *dk0 = alloc_normal(&rng, nk, 1), *dv0 = alloc_normal(&rng, nv, 1);
    real *dq = alloc_copy(dq0, nq), *dk = alloc_copy(dk0, nk), *dv = alloc_copy(dv0, nv);
    attention_backward(dq, dk, dv, c.R, c.out, c.lse, c.q, c.k, c.v, &s);
    real *gq = alloc_diff(dq, dq0, nq), *gk = alloc_diff(dk, dk0, nk), *gv = alloc_diff(dv, dv0, nv);
    snprintf(what, sizeof what, "attention dq (kv_heads=%d, dv=%d)", kv_heads, v_dim(&s));
    fd_check(what, c.q, nq, gq, attn_obj, &c);
    snprintf(what, sizeof what, "attention dk (kv_heads=%d, dv=%d)", kv_heads, v_dim(&s));
    fd_check(what, c.k, nk, gk, attn_obj, &c);
    snprintf(what, sizeof what, "attention dv (kv_heads=%d, dv=%d)", kv_heads, v_dim(&s));
    fd_check(what, c.v, nv, gv, attn_obj, &c);
    free(dq0), free(dk0), free(dv0), free(dq), free(dk), free(dv), free(gq), free(gk), free(gv);
    free(c.out), free(c.lse), free(c.q), free(c.k), free(c.v), free(c.R);
}

static void test_attention_mha(void) { check_attention_grad(4, 0, NULL, 21); }
static void test_attention_gqa_kv2(void) { check_attention_grad(2, 0, NULL, 22); }
static void test_attention_mqa_kv1(void) { check_attention_grad(1, 0, NULL, 23); }
// value heads wider and narrower than query/key heads (Multi-Latent Attention)
static void test_attention_value_width(void) {
    check_attention_grad(4, 6, NULL, 25);
    check_attention_grad(2, 3, NULL, 26);
}
// --reset-attention-mask: row 0 holds documents [0,2) [2,5), row 1 [0,1) [1,4) [4,5)
static void test_attention_document_mask(void) {
    static const int32_t key_start[10] = {0, 0, 2, 2, 2, 0, 1, 1, 1, 4};
    check_attention_grad(4, 0, key_start, 27);
    check_attention_grad(2, 3, key_start, 28);
}

// KV-cache shape: Tq queries at the end of a Tk-key window, batch rows kv_row_stride apart.
// The rows past Tk hold NaN: reading them would poison the output.
static void test_attention_kv_cache_forward(void) {
    Rng rng;
    rng_seed(&rng, 24);
    for (int kv_heads = 1; kv_heads <= 4; kv_heads *= 2) {
        AttentionShape s = {.B = 2, .Tq = 3, .Tk = 7, .q_pos0 = 4, .heads = 4, .kv_heads = kv_heads,
                            .head_dim = 4, .kv_row_stride = 9, .scale = 1 / sqrt(4.0)};
        size_t nkv = k_len(&s);
        real *q = alloc_normal(&rng, q_len(&s), 1), *k = alloc_normal(&rng, nkv, 1),
             *v = alloc_normal(&rng, nkv, 1);
        for (int b = 0; b < s.B; b++)
            for (int j = s.Tk; j < s.kv_row_stride; j++)
                for (int i = 0; i < s.kv_heads * s.head_dim; i++) {
                    size_t at = ((size_t)b * s.kv_row_stride + j) * s.kv_heads * s.head_dim + i;
                    k[at] = v[at] = NAN;
                }
        char what[64];
        snprintf(what, sizeof what, "kv-cache attention kv_heads=%d", kv_heads);
        check_attention_forward(&s, q, k, v, what);
        free(q), free(k), free(v);
    }
}

// ---- SwiGLU ----------------------------------------------------------------------------------------

typedef struct {
    real *act, *gate, *up, *scale, *R;
    int M, I;
} SwigluCtx;

static double swiglu_obj(void *p) {
    SwigluCtx *c = p;
    swiglu_forward(c->act, STORE_FP32, c->gate, c->up, STORE_FP32, c->scale, c->M, c->I);
    return dot_real(c->act, c->R, (size_t)c->M * c->I);
}

static void check_swiglu(int with_scale) {
    Rng rng;
    rng_seed(&rng, 31 + with_scale);
    int M = 4, I = 5;
    size_t n = (size_t)M * I;
    SwigluCtx c = {mt_malloc(n * sizeof(real)), alloc_normal(&rng, n, 2), alloc_normal(&rng, n, 1),
                   with_scale ? alloc_normal(&rng, M, 1) : NULL, alloc_normal(&rng, n, 1), M, I};
    swiglu_obj(&c);
    for (int m = 0; m < M; m++)
        for (int i = 0; i < I; i++) {
            double g = c.gate[m * I + i], ref = g / (1 + exp(-g)) * c.up[m * I + i] * (c.scale ? c.scale[m] : 1);
            CHECK_CLOSE(c.act[m * I + i], ref, 1e-15, 1e-13, "swiglu_forward");
        }
    // backward overwrites: pre-fill with garbage
    real *dg = alloc_normal(&rng, n, 9), *du = alloc_normal(&rng, n, 9), *ds = alloc_normal(&rng, M, 9);
    swiglu_backward(dg, du, STORE_FP32, with_scale ? ds : NULL, c.R, c.gate, c.up, STORE_FP32, c.scale, M, I);
    fd_check("swiglu dgate", c.gate, n, dg, swiglu_obj, &c);
    fd_check("swiglu dup", c.up, n, du, swiglu_obj, &c);
    if (with_scale) fd_check("swiglu drow_scale", c.scale, M, ds, swiglu_obj, &c);
    free(dg), free(du), free(ds), free(c.act), free(c.gate), free(c.up), free(c.scale), free(c.R);
}

static void test_swiglu_no_scale(void) { check_swiglu(0); }
static void test_swiglu_row_scale(void) { check_swiglu(1); }

// ---- softmax ----------------------------------------------------------------------------------------

typedef struct {
    real *y, *x, *R;
    int N, C;
} SoftmaxCtx;

static double softmax_obj(void *p) {
    SoftmaxCtx *c = p;
    softmax_forward(c->y, c->x, c->N, c->C);
    return dot_real(c->y, c->R, (size_t)c->N * c->C);
}

static void test_softmax(void) {
    Rng rng;
    rng_seed(&rng, 41);
    int N = 3, C = 6;
    size_t n = (size_t)N * C;
    SoftmaxCtx c = {mt_malloc(n * sizeof(real)), alloc_normal(&rng, n, 2), alloc_normal(&rng, n, 1), N, C};
    softmax_obj(&c);
    for (int r = 0; r < N; r++) {
        double sum = 0;
        for (int j = 0; j < C; j++) sum += exp(c.x[r * C + j]);
        for (int j = 0; j < C; j++)
            CHECK_CLOSE(c.y[r * C + j], exp(c.x[r * C + j]) / sum, 1e-16, 1e-13, "softmax_forward");
    }
    real *dx0 = alloc_normal(&rng, n, 1), *dx = alloc_copy(dx0, n);
    softmax_backward(dx, c.y, c.R, N, C);  // accumulates
    real *g = alloc_diff(dx, dx0, n);
    fd_check("softmax dx", c.x, n, g, softmax_obj, &c);
    free(dx0), free(dx), free(g), free(c.y), free(c.x), free(c.R);
}

// ---- cross-entropy ----------------------------------------------------------------------------------

typedef struct {
    real *losses, *lse, *logits, *weight;
    const int32_t *targets;
    int N, V;
} CeCtx;

static double ce_obj(void *p) {
    CeCtx *c = p;
    cross_entropy_forward(c->losses, c->lse, c->logits, c->targets, c->N, c->V);
    return dot_real(c->losses, c->weight, c->N);
}

static void test_cross_entropy(void) {
    Rng rng;
    rng_seed(&rng, 51);
    enum { N = 5, V = 19 };  // V past one group of 8 lanes, with a remainder
    static const int32_t targets[N] = {3, 0, 6, 3, 1};
    real weight[N] = {0.5, 0, 1.3, 2, 0.7};
    CeCtx c = {mt_malloc(N * sizeof(real)), mt_malloc(N * sizeof(real)), alloc_normal(&rng, N * V, 2), weight, targets,
               N, V};
    ce_obj(&c);
    for (int n = 0; n < N; n++) {
        double sum = 0;
        for (int v = 0; v < V; v++) sum += exp(c.logits[n * V + v]);
        CHECK_CLOSE(c.losses[n], log(sum) - c.logits[n * V + targets[n]], 1e-14, 1e-13,
                    "cross_entropy_forward");
    }
    real *dl = alloc_normal(&rng, N * V, 9);  // overwritten
    cross_entropy_backward(dl, c.logits, c.lse, targets, weight, N, V);
    fd_check("cross_entropy dlogits", c.logits, N * V, dl, ce_obj, &c);
    for (int v = 0; v < V; v++) CHECK(dl[1 * V + v] == 0, "zero-weight row: dlogits[1,%d] = %g", v, (double)dl[V + v]);
    free(dl), free(c.losses), free(c.lse), free(c.logits);
}

// ---- experts ---------------------------------------------------------------------------------------------

enum { XG = 3, XH = 4, XI = 5 };

typedef struct {
    ExpertShape s;
    ExpertWeights w;
    ExpertActs acts;
    real *out, *in, *scale, *R;
    int rows;
} ExpertsCtx;

static double experts_obj(void *p) {
    ExpertsCtx *c = p;
    experts_forward(c->out, &c->acts, c->in, c->scale, &c->w, &c->s);
    return dot_real(c->out, c->R, (size_t)c->rows * XH);
}

static void check_experts(int with_scale) {
    Rng rng;
    rng_seed(&rng, 81 + with_scale);
    static const int32_t offsets[XG + 1] = {0, 3, 3, 7};  // group 1 has no rows
    int rows = offsets[XG];
    real *gate[XG], *up[XG], *down[XG], *dgate[XG], *dup[XG], *ddown[XG];
    real *dgate0[XG], *dup0[XG], *ddown0[XG];
    size_t nw = XI * XH;
    for (int g = 0; g < XG; g++) {
        gate[g] = alloc_normal(&rng, nw, 0.7), up[g] = alloc_normal(&rng, nw, 0.7);
        down[g] = alloc_normal(&rng, nw, 0.7);
        // accumulate into pre-filled gradients; the empty group's start (and must stay) at zero
        double fill = g == 1 ? 0 : 1;
        dgate0[g] = alloc_normal(&rng, nw, fill), dup0[g] = alloc_normal(&rng, nw, fill);
        ddown0[g] = alloc_normal(&rng, nw, fill);
        dgate[g] = alloc_copy(dgate0[g], nw), dup[g] = alloc_copy(dup0[g], nw);
        ddown[g] = alloc_copy(ddown0[g], nw);
    }
    ExpertsCtx c = {{XG, XH, XI, offsets, NULL, NULL, 0, STORE_FP32, STORE_FP32}, {gate, up, down, NULL, NULL, NULL},
                    {mt_malloc(rows * XI * sizeof(real)), mt_malloc(rows * XI * sizeof(real)),
                     mt_malloc(rows * XI * sizeof(real)), STORE_FP32, STORE_FP32, STORE_FP32},
                    mt_malloc(rows * XH * sizeof(real)), alloc_normal(&rng, rows * XH, 1),
                    with_scale ? alloc_normal(&rng, rows, 1) : NULL, alloc_normal(&rng, rows * XH, 1), rows};
    ExpertWeights dw = {dgate, dup, ddown, NULL, NULL, NULL};
    experts_obj(&c);
    // forward against a direct per-row computation
    for (int g = 0; g < XG; g++)
        for (int r = offsets[g]; r < offsets[g + 1]; r++) {
            double act[XI];
            for (int i = 0; i < XI; i++) {
                double a = 0, b = 0;
                for (int h = 0; h < XH; h++) {
                    a += (double)gate[g][i * XH + h] * c.in[r * XH + h];
                    b += (double)up[g][i * XH + h] * c.in[r * XH + h];
                }
                act[i] = a / (1 + exp(-a)) * b * (c.scale ? c.scale[r] : 1);
            }
            for (int h = 0; h < XH; h++) {
                double o = 0;
                for (int i = 0; i < XI; i++) o += down[g][h * XI + i] * act[i];
                CHECK_CLOSE(c.out[r * XH + h], o, 1e-14, 1e-12, "experts_forward");
            }
        }
    real *din = alloc_normal(&rng, rows * XH, 9), *ds = alloc_normal(&rng, rows, 9);  // overwritten
    real *s1 = mt_malloc(rows * XI * sizeof(real)), *s2 = mt_malloc(rows * XI * sizeof(real)),
         *s3 = mt_malloc(rows * XI * sizeof(real));
    experts_backward(din, with_scale ? ds : NULL, &dw, c.R, &c.acts, c.in, c.scale, &c.w, &c.s, s1, s2, s3);
    fd_check("experts drows_in", c.in, rows * XH, din, experts_obj, &c);
    if (with_scale) fd_check("experts drow_scale", c.scale, rows, ds, experts_obj, &c);
    char what[64];
    for (int g = 0; g < XG; g++) {
        real *gg = alloc_diff(dgate[g], dgate0[g], nw), *gu = alloc_diff(dup[g], dup0[g], nw),
             *gd = alloc_diff(ddown[g], ddown0[g], nw);
        snprintf(what, sizeof what, "experts dW_gate[%d]", g);
        fd_check(what, gate[g], nw, gg, experts_obj, &c);
        snprintf(what, sizeof what, "experts dW_up[%d]", g);
        fd_check(what, up[g], nw, gu, experts_obj, &c);
        snprintf(what, sizeof what, "experts dW_down[%d]", g);
        fd_check(what, down[g], nw, gd, experts_obj, &c);
        free(gg), free(gu), free(gd);
    }
    for (size_t i = 0; i < nw; i++)
        CHECK(dgate[1][i] == 0 && dup[1][i] == 0 && ddown[1][i] == 0, "empty group's weight grads touched at %zu", i);
    for (int g = 0; g < XG; g++)
        free(gate[g]), free(up[g]), free(down[g]), free(dgate[g]), free(dup[g]), free(ddown[g]),
            free(dgate0[g]), free(dup0[g]), free(ddown0[g]);
    free(c.acts.gate), free(c.acts.up), free(c.acts.act), free(c.out), free(c.in), free(c.scale), free(c.R);
    free(din), free(ds), free(s1), free(s2), free(s3);
}

static void test_experts_row_scale(void) { check_experts(1); }
static void test_experts_no_scale(void) { check_experts(0); }

// ---- dispatcher ----------------------------------------------------------------------------------------------

enum { DN = 7, DK = 2, DE = 5, DH = 3, DNK = DN * DK, DMAXROWS = 64 };

// Every output of the plan, dispatch, gather and combine against direct formulas, for one
// routing: topk (DN,DK), kept (NULL = all kept) and capacity (0 = no padding).
static void check_dispatch(const char *what, const int32_t *topk, const int32_t *kept, int capacity, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    int32_t rpe[DE], offsets[DE + 1], row_of_choice[DNK], token_of_row[DMAXROWS];
    for (int r = 0; r < DMAXROWS; r++) token_of_row[r] = -7;  // sentinel: untouched
    DispatchPlan plan = {DN, DK, DE, rpe, offsets, row_of_choice, token_of_row, 0, NULL, 1};  // rows: set by the plan
    dispatch_plan(&plan, topk, kept, capacity);
    // expected: kept choices per expert, rows per expert, offsets
    int kept_count[DE] = {0}, want_offsets[DE + 1] = {0};
    for (int i = 0; i < DNK; i++)
        if (!kept || kept[i]) kept_count[topk[i]]++;
    for (int e = 0; e < DE; e++) {
        int want_rows = capacity > 0 ? capacity : kept_count[e];
        want_offsets[e + 1] = want_offsets[e] + want_rows;
        CHECK(rpe[e] == want_rows, "%s: rows_per_expert[%d] = %d, expected %d", what, e, rpe[e], want_rows);
    }
    for (int e = 0; e <= DE; e++)
        CHECK(offsets[e] == want_offsets[e], "%s: expert_offsets[%d] = %d, expected %d", what, e, offsets[e],
              want_offsets[e]);
    int total = want_offsets[DE];
    CHECK(total <= DMAXROWS, "%s: %d rows", what, total);
    CHECK(plan.rows == total, "%s: plan.rows = %d, expected %d", what, plan.rows, total);
    for (int e = 0; e < DE; e++)  // the host copy the grouped GEMMs take their problem sizes from
        CHECK(plan.host_rows_per_expert[e] == rpe[e], "%s: host_rows_per_expert[%d] = %d, expected %d", what, e,
              plan.host_rows_per_expert[e], rpe[e]);
    if (capacity > 0) CHECK(total == DE * capacity, "%s: padded plan has %d rows, expected %d", what, total, DE * capacity);
    // row of a kept choice: its expert's first row + the kept choices of that expert before it
    // (token order); dropped choices have row -1
    int padding[DMAXROWS] = {0};
    for (int e = 0; e < DE; e++)
        for (int r = want_offsets[e] + kept_count[e]; r < want_offsets[e + 1]; r++) padding[r] = 1;
    for (int i = 0; i < DNK; i++) {
        if (kept && !kept[i]) {
            CHECK(row_of_choice[i] == -1, "%s: dropped choice %d has row %d", what, i, row_of_choice[i]);
            continue;
        }
        int before = 0;
        for (int i2 = 0; i2 < i; i2++) before += topk[i2] == topk[i] && (!kept || kept[i2]);
        int want = want_offsets[topk[i]] + before;
        CHECK(row_of_choice[i] == want, "%s: row_of_choice[%d] = %d, expected %d", what, i, row_of_choice[i], want);
        if (want >= 0 && want < DMAXROWS)
            CHECK(token_of_row[want] == i / DK, "%s: token_of_row[%d] = %d, expected %d", what, want,
                  token_of_row[want], i / DK);
    }
    for (int r = 0; r < total; r++)
        if (padding[r]) CHECK(token_of_row[r] == -1, "%s: padding row %d has token %d", what, r, token_of_row[r]);
    // dispatch into buffers full of garbage: kept rows copy x and their choice's value, padding
    // rows are zero with value 0
    real *x = alloc_normal(&rng, DN * DH, 1), *rows = alloc_normal(&rng, DMAXROWS * DH, 9);
    real *cv = alloc_normal(&rng, DNK, 1), *rv = alloc_normal(&rng, DMAXROWS, 9), *cv2 = alloc_normal(&rng, DNK, 9);
    dispatch_forward(rows, STORE_FP32, rv, x, STORE_FP32, cv, &plan, DH);
    for (int i = 0; i < DNK; i++) {
        int r = row_of_choice[i];
        if (r < 0 || r >= total) continue;
        for (int h = 0; h < DH; h++)
            CHECK(rows[r * DH + h] == x[(i / DK) * DH + h], "%s: dispatch row of choice %d", what, i);
        CHECK(rv[r] == cv[i], "%s: dispatch row value of choice %d", what, i);
    }
    for (int r = 0; r < total; r++)
        if (padding[r]) {
            for (int h = 0; h < DH; h++) CHECK(rows[r * DH + h] == 0, "%s: padding row %d not zero", what, r);
            CHECK(rv[r] == 0, "%s: padding row %d value %g", what, r, (double)rv[r]);
        }
    // gather inverts the values; 0 for dropped choices
    gather_choice_values(cv2, rv, &plan);
    for (int i = 0; i < DNK; i++) {
        real want = kept && !kept[i] ? 0 : cv[i];
        CHECK(cv2[i] == want, "%s: gather_choice_values[%d] = %g, expected %g", what, i, (double)cv2[i], (double)want);
    }
    // combine: out[n] = Σ_j over kept choices of rows[row_of_choice[n,j]], in choice order
    // (bitwise), overwriting; padding rows hold garbage and must not contribute
    real *y = alloc_normal(&rng, DMAXROWS * DH, 1), *out = alloc_normal(&rng, DN * DH, 9);
    combine_forward(out, y, &plan, DH, 0);
    for (int n = 0; n < DN; n++)
        for (int h = 0; h < DH; h++) {
            real s = 0;
            for (int j = 0; j < DK; j++)
                if (!kept || kept[n * DK + j]) s += y[row_of_choice[n * DK + j] * DH + h];
            CHECK(out[n * DH + h] == s, "%s: combine_forward[%d,%d] = %.17g, expected %.17g", what, n, h,
                  (double)out[n * DH + h], (double)s);
        }
    // combine is the adjoint of dispatch over the non-padding rows: <combine(y), z> == <y, dispatch(z)>
    // with y's padding rows zeroed (dispatch zeroes them on its side)
    for (int r = 0; r < total; r++)
        if (padding[r])
            for (int h = 0; h < DH; h++) y[r * DH + h] = 0;
    combine_forward(out, y, &plan, DH, 0);
    real *z = alloc_normal(&rng, DN * DH, 1), *dz = alloc_normal(&rng, DMAXROWS * DH, 9);
    dispatch_forward(dz, STORE_FP32, NULL, z, STORE_FP32, NULL, &plan, DH);
    double lhs = dot_real(out, z, DN * DH), rhs = dot_real(y, dz, (size_t)total * DH);
    CHECK_CLOSE(lhs, rhs, 1e-14, 1e-13, "<combine(y), z> vs <y, dispatch(z)>");
    // accumulate = 1 adds to what is there
    real *acc = alloc_normal(&rng, DN * DH, 1), *acc0 = alloc_copy(acc, DN * DH);
    combine_forward(acc, y, &plan, DH, 1);
    for (int n = 0; n < DN; n++)
        for (int h = 0; h < DH; h++) {
            real s = acc0[n * DH + h];
            for (int j = 0; j < DK; j++)
                if (!kept || kept[n * DK + j]) s += y[row_of_choice[n * DK + j] * DH + h];
            CHECK(acc[n * DH + h] == s, "%s: combine_forward accumulate [%d,%d] = %.17g, expected %.17g", what, n,
                  h, (double)acc[n * DH + h], (double)s);
        }
    free(x), free(rows), free(cv), free(rv), free(cv2), free(y), free(out), free(z), free(dz), free(acc), free(acc0);
    dispatch_plan_free(&plan);
}

// A fixed routing: expert counts 4, 4, 3, 0, 3.
static const int32_t DISPATCH_TOPK[DNK] = {0, 1, 1, 2, 0, 4, 2, 0, 4, 1, 0, 2, 1, 4};
// Drops: token 4 loses both choices, tokens 1 and 2 one each; kept per expert 3, 3, 2, 0, 2.
static const int32_t DISPATCH_KEPT[DNK] = {1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1};

static void test_dispatch_combine(void) {
    Rng rng;
    rng_seed(&rng, 91);
    int32_t topk[DNK];
    for (int n = 0; n < DN; n++) {  // two distinct experts per token, never expert 3
        static const int32_t pool[4] = {0, 1, 2, 4};
        int a = rng_below(&rng, 4), b = (a + 1 + rng_below(&rng, 3)) % 4;
        topk[n * DK] = pool[a], topk[n * DK + 1] = pool[b];
    }
    check_dispatch("dropless random", topk, NULL, 0, 92);
    check_dispatch("dropless fixed", DISPATCH_TOPK, NULL, 0, 93);
    // an all-ones kept array is the same as NULL
    static const int32_t all[DNK] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    check_dispatch("dropless kept=1", DISPATCH_TOPK, all, 0, 94);
}

static void test_dispatch_dropped(void) {
    check_dispatch("dropped", DISPATCH_TOPK, DISPATCH_KEPT, 0, 95);
    // token 4 lost both choices: combine gives it zero, and accumulate leaves it as it was
    int32_t rpe[DE], offsets[DE + 1], row_of_choice[DNK], token_of_row[DMAXROWS];
    DispatchPlan plan = {DN, DK, DE, rpe, offsets, row_of_choice, token_of_row, 0, NULL, 1};  // rows: set by the plan
    dispatch_plan(&plan, DISPATCH_TOPK, DISPATCH_KEPT, 0);
    CHECK(offsets[DE] == 10, "dropped plan has %d rows, expected 10", offsets[DE]);
    real rows[DMAXROWS * DH], out[DN * DH];
    for (int i = 0; i < DMAXROWS * DH; i++) rows[i] = 1 + i;
    for (int i = 0; i < DN * DH; i++) out[i] = -5;
    combine_forward(out, rows, &plan, DH, 1);
    for (int h = 0; h < DH; h++) CHECK(out[4 * DH + h] == -5, "fully dropped token 4 changed by accumulate");
    combine_forward(out, rows, &plan, DH, 0);
    for (int h = 0; h < DH; h++) CHECK(out[4 * DH + h] == 0, "fully dropped token 4 not zero");
    dispatch_plan_free(&plan);
}

// got[0..n) == want[0..n), each difference named (what[i] = got, expected want)
static void check_int32s(const char *what, const int32_t *got, const int32_t *want, int n) {
    for (int i = 0; i < n; i++) CHECK(got[i] == want[i], "%s[%d] = %d, expected %d", what, i, got[i], want[i]);
}

static void test_dispatch_padded(void) {
    check_dispatch("padded, dropped, capacity 3", DISPATCH_TOPK, DISPATCH_KEPT, 3, 96);
    check_dispatch("padded, dropless, capacity 5", DISPATCH_TOPK, NULL, 5, 97);
    // the padded layout spelled out: expert e owns rows 3e..3e+2; expert 3 is all padding
    int32_t rpe[DE], offsets[DE + 1], row_of_choice[DNK], token_of_row[DMAXROWS];
    DispatchPlan plan = {DN, DK, DE, rpe, offsets, row_of_choice, token_of_row, 0, NULL, 1};  // rows: set by the plan
    dispatch_plan(&plan, DISPATCH_TOPK, DISPATCH_KEPT, 3);
    static const int32_t want_tokens[15] = {0, 3, 5, 0, 1, 6, 3, 5, -1, -1, -1, -1, 2, 6, -1};
    static const int32_t want_rows[DNK] = {0, 3, 4, -1, -1, 12, 6, 1, -1, -1, 2, 7, 5, 13};
    check_int32s("padded token_of_row", token_of_row, want_tokens, 15);
    check_int32s("padded row_of_choice", row_of_choice, want_rows, DNK);
    dispatch_plan_free(&plan);
}

// --moe-router-padding-for-quantization's plan spelled out (Megatron's pad_routing_map): each
// expert rounded up to a multiple of 4 with the first tokens that kept no choice of it (a
// dropped choice counts as none), expert 3 (no tokens) stays empty; every padding row is a
// copy of its token with value 0, and combine leaves it out.
static void test_dispatch_aligned(void) {
    int32_t rpe[DE], offsets[DE + 1], row_of_choice[DNK], token_of_row[DMAXROWS];
    DispatchPlan plan = {DN, DK, DE, rpe, offsets, row_of_choice, token_of_row, 0, NULL, .align = 4};
    dispatch_plan(&plan, DISPATCH_TOPK, DISPATCH_KEPT, 0);
    static const int32_t want_offsets[DE + 1] = {0, 4, 8, 12, 12, 16};
    static const int32_t want_tokens[16] = {0, 1, 3, 5, 0, 1, 2, 6, 0, 1, 3, 5, 0, 1, 2, 6};
    static const int32_t want_rows[DNK] = {0, 4, 5, -1, -1, 14, 10, 2, -1, -1, 3, 11, 7, 15};
    check_int32s("aligned expert_offsets", offsets, want_offsets, DE + 1);
    CHECK(plan.rows == 16 && plan.host_rows_per_expert[3] == 0, "aligned plan: %d rows", plan.rows);
    check_int32s("aligned token_of_row", token_of_row, want_tokens, 16);
    check_int32s("aligned row_of_choice", row_of_choice, want_rows, DNK);
    real x[DN * DH], rows[16 * DH], rv[16], cv[DNK], out[DN * DH], want[DN * DH] = {0};
    for (int i = 0; i < DN * DH; i++) x[i] = 1 + i;
    for (int i = 0; i < DNK; i++) cv[i] = 0.5 + i;
    dispatch_forward(rows, STORE_FP32, rv, x, STORE_FP32, cv, &plan, DH);
    int is_choice[16] = {0};
    for (int i = 0; i < DNK; i++)
        if (want_rows[i] >= 0) {
            is_choice[want_rows[i]] = 1;
            CHECK(rv[want_rows[i]] == cv[i], "aligned value of choice %d", i);
        }
    for (int r = 0; r < 16; r++) {
        for (int h = 0; h < DH; h++) CHECK(rows[r * DH + h] == x[want_tokens[r] * DH + h], "aligned row %d", r);
        if (!is_choice[r]) CHECK(rv[r] == 0, "aligned padding row %d has value %g", r, (double)rv[r]);
    }
    combine_forward(out, rows, &plan, DH, 0);
    for (int i = 0; i < DNK; i++)
        if (want_rows[i] >= 0)
            for (int h = 0; h < DH; h++) want[(i / DK) * DH + h] += x[(i / DK) * DH + h];
    for (int i = 0; i < DN * DH; i++) CHECK(out[i] == want[i], "aligned combine [%d] = %g, expected %g", i, (double)out[i], (double)want[i]);
    dispatch_plan_free(&plan);
    // a multiple above N: every expert with a token takes all N
    int32_t big_tokens[DE * DN];
    plan = (DispatchPlan){DN, DK, DE, rpe, offsets, row_of_choice, big_tokens, 0, NULL, .align = 8};
    dispatch_plan(&plan, DISPATCH_TOPK, DISPATCH_KEPT, 0);
    for (int e = 0; e < DE; e++) CHECK(rpe[e] == (e == 3 ? 0 : DN), "aligned to 8: expert %d has %d rows", e, rpe[e]);
    CHECK(plan.rows == 4 * DN, "aligned to 8: %d rows", plan.rows);
    dispatch_plan_free(&plan);
}

static void test_dispatch_max_rows(void) {
    // N·k dropless or unpadded; E·C padded, C = ceil(k·N/E·factor) capped at N
    CHECK(dispatch_max_rows(7, 2, 5, 0, 0, 1) == 14, "dropless");
    CHECK(dispatch_max_rows(7, 2, 5, 0, 1, 1) == 14, "padding without a capacity factor");
    CHECK(dispatch_max_rows(7, 2, 5, 1.0, 0, 1) == 14, "capacity without padding");
    CHECK(dispatch_max_rows(7, 2, 5, 1.0, 1, 1) == 15, "padded C=3: %zu", dispatch_max_rows(7, 2, 5, 1.0, 1, 1));
    CHECK(dispatch_max_rows(7, 2, 5, 0.5, 1, 1) == 14, "padded C=2 (10 rows < N·k): %zu", dispatch_max_rows(7, 2, 5, 0.5, 1, 1));
    CHECK(dispatch_max_rows(7, 2, 5, 4.0, 1, 1) == 35, "padded C capped at N=7: %zu", dispatch_max_rows(7, 2, 5, 4.0, 1, 1));
    CHECK(dispatch_max_rows(6, 1, 4, 1.5, 1, 1) == 12, "padded C=ceil(2.25)=3: %zu", dispatch_max_rows(6, 1, 4, 1.5, 1, 1));
    // a factor whose k·N/E · factor is beyond int: clamped to N before the conversion
    CHECK(dispatch_capacity(1024, 2, 8, 2e7) == 1024, "capacity of factor 2e7: %d", dispatch_capacity(1024, 2, 8, 2e7));
    CHECK(dispatch_capacity(1024, 2, 8, 0) == 0, "dropless capacity: %d", dispatch_capacity(1024, 2, 8, 0));
    CHECK(dispatch_max_rows(1024, 2, 8, 2e7, 1, 1) == 8192, "padded rows of factor 2e7: %zu",
          dispatch_max_rows(1024, 2, 8, 2e7, 1, 1));
    // aligned: align − 1 more rows per expert, at most N per expert
    CHECK(dispatch_max_rows(7, 2, 5, 0, 0, 4) == 29, "aligned to 4: %zu", dispatch_max_rows(7, 2, 5, 0, 0, 4));
    CHECK(dispatch_max_rows(7, 2, 5, 0, 0, 16) == 35, "aligned to 16, capped at E·N: %zu",
          dispatch_max_rows(7, 2, 5, 0, 0, 16));
}

// ---- AdamW ----------------------------------------------------------------------------------------------------

static void check_adamw(int decay) {
    Rng rng;
    rng_seed(&rng, 101 + decay);
    enum { n = 9 };
    AdamWStep h = {.lr = 3e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = 3};
    real *p = alloc_normal(&rng, n, 1), *g = alloc_normal(&rng, n, 1), *m = alloc_normal(&rng, n, 0.1),
         *v = alloc_normal(&rng, n, 0.1);
    for (int i = 0; i < n; i++) v[i] *= v[i];
    g[0] = 0, m[0] = 0, v[0] = 0;  // an untouched parameter: stays put apart from decay
    real *p0 = alloc_copy(p, n), *m0 = alloc_copy(m, n), *v0 = alloc_copy(v, n);
    adamw_update(p, g, m, v, n, decay, &h);
    for (int i = 0; i < n; i++) {
        double pp = p0[i];
        if (decay) pp *= 1 - h.lr * h.weight_decay;  // torch: decoupled decay first
        double mm = h.beta1 * m0[i] + (1 - h.beta1) * g[i];
        double vv = h.beta2 * v0[i] + (1 - h.beta2) * (double)g[i] * g[i];
        double mhat = mm / (1 - pow(h.beta1, h.step)), vhat = vv / (1 - pow(h.beta2, h.step));
        pp -= h.lr * mhat / (sqrt(vhat) + h.eps);
        CHECK_CLOSE(m[i], mm, 1e-16, 1e-14, "adamw m");
        CHECK_CLOSE(v[i], vv, 1e-18, 1e-14, "adamw v");
        CHECK_CLOSE(p[i], pp, 1e-15, 1e-13, "adamw p");
    }
    free(p), free(g), free(m), free(v), free(p0), free(m0), free(v0);
}

static void test_adamw_decay(void) { check_adamw(1); }
static void test_adamw_no_decay(void) { check_adamw(0); }

// ---- vec_sum_squares ----------------------------------------------------------------------------------------------

static void test_vec_sum_squares(void) {
    Rng rng;
    rng_seed(&rng, 111);
    size_t sizes[] = {0, 1, 5, 4096, 4097, 10000};
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        size_t n = sizes[t];
        real *x = alloc_normal(&rng, n, 1);
        double s = 0;
        for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
        double got = vec_sum_squares(x, n);
        CHECK(fabs(got - s) <= 1e-12 * s && (n > 0 || got == 0), "vec_sum_squares n=%zu: %.17g vs %.17g", n, got, s);
        free(x);
    }
}

// ---- clamp ----------------------------------------------------------------------------------------------

static void test_clamp(void) {
    real x[6] = {-3, -1.5, -0.2, 0.7, 1.5, 2.5}, y[6], d[6] = {1, 2, 3, 4, 5, 6};
    clamp_forward(y, x, 6, 1.5);
    static const real want[6] = {-1.5, -1.5, -0.2, 0.7, 1.5, 1.5};
    for (int i = 0; i < 6; i++) CHECK(y[i] == want[i], "clamp_forward[%d] = %g", i, (double)y[i]);
    // the gradient passes inside [-limit, limit] (edges included, as torch.clamp) and stops outside
    clamp_backward(d, x, 6, 1.5);
    static const real want_d[6] = {0, 2, 3, 4, 5, 0};
    for (int i = 0; i < 6; i++) CHECK(d[i] == want_d[i], "clamp_backward[%d] = %g", i, (double)d[i]);
}

int main(void) {
    RUN(test_linear_default_backend);
    RUN(test_linear_portable_backend);
    RUN(test_embedding);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_attention_mha);
    RUN(test_attention_gqa_kv2);
    RUN(test_attention_mqa_kv1);
    RUN(test_attention_value_width);
    RUN(test_attention_document_mask);
    RUN(test_clamp);
    RUN(test_attention_kv_cache_forward);
    RUN(test_swiglu_no_scale);
    RUN(test_swiglu_row_scale);
    RUN(test_softmax);
    RUN(test_cross_entropy);
    RUN(test_experts_row_scale);
    RUN(test_experts_no_scale);
    RUN(test_dispatch_combine);
    RUN(test_dispatch_dropped);
    RUN(test_dispatch_padded);
    RUN(test_dispatch_aligned);
    RUN(test_dispatch_max_rows);
    RUN(test_adamw_decay);
    RUN(test_adamw_no_decay);
    RUN(test_vec_sum_squares);
    TESTS_DONE();
}

// elementwise.c — vector helpers, embedding, RMSNorm, RoPE, SwiGLU, softmax,
// cross-entropy and AdamW for the cpu backend. Each loop is parallel over rows or
// elements only; every sum runs in a fixed order, so results do not depend on the
// number of threads.
#include <math.h>
#include <string.h>

#include "core/profile.h"
#include "core/float_formats.h"
#include "ops/adamw_math.h"
#include "ops/cpu/row_reduce.h"
#include "ops/cpu/cpu_ops.h"

#if defined(__SSE2__) && !defined(MT_DOUBLE)
#include <immintrin.h>
#define STREAMING_STORES 1  // SSE2's non-temporal stores of four floats
#else
#define STREAMING_STORES 0
#endif

#define PARALLEL_ROWS _Pragma("omp parallel for schedule(static) if (N > 16)")

void cpu_vec_copy(real *dst, const real *src, size_t n) { memcpy(dst, src, n * sizeof(real)); }

// A buffer this large (the gradients, zeroed at the start of a step) is next read long after
// the caches have let it go: its zeros are written past them (non-temporal stores, which skip
// reading each line before writing it: 1.7-2x memset's rate on 2 cores of an Intel Xeon,
// bench/RESULTS.md). Smaller ones (activation gradients, summed into soon after) stay cached.
enum { ZERO_STREAMED_BYTES = 64 << 20 };

// x[0, n) = 0 written past the caches where the instruction set has such stores, else memset.
static void zero_streamed(real *x, size_t n) {
#if STREAMING_STORES
    size_t i = 0;
    for (; i < n && ((uintptr_t)(x + i) & 15); i++) x[i] = 0;  // to a 16-byte boundary
    for (; i + 4 <= n; i += 4) _mm_stream_ps(x + i, _mm_setzero_ps());
    for (; i < n; i++) x[i] = 0;
#else
    memset(x, 0, n * sizeof(real));
#endif
}

// Large buffers are zeroed by every thread, a chunk each: one core's stores do not reach the
// memory bandwidth.
void cpu_vec_zero(real *x, size_t n) {
    enum { ZERO_CHUNK = 1 << 16 };  // elements
    size_t chunks = (n + ZERO_CHUNK - 1) / ZERO_CHUNK;
    int streamed = n * sizeof(real) >= ZERO_STREAMED_BYTES;
#pragma omp parallel if (chunks > 4)
    {
#pragma omp for schedule(static) nowait
        for (size_t c = 0; c < chunks; c++) {
            real *chunk = x + c * ZERO_CHUNK;
            size_t m = MT_MIN(ZERO_CHUNK, n - c * ZERO_CHUNK);
            if (streamed) zero_streamed(chunk, m);
            else memset(chunk, 0, m * sizeof(real));
        }
#if STREAMING_STORES
        if (streamed) _mm_sfence();  // each thread's streamed zeros visible before the region ends
#endif
    }
}

void cpu_vec_add(real *y, const real *x, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void cpu_vec_scale(real *x, real s, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void cpu_vec_sum_squares_to(double *sum, const real *x, size_t n) { sum[0] = cpu_vec_sum_squares(x, n); }

void cpu_bf16_pack(real *packed, const real *x, size_t n) {
    enum { RUN = 1 << 14 };  // values a thread rounds at a time
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t at = 0; at < n; at += RUN) cpu_bf16_round_run((uint16_t *)packed + at, x + at, MT_MIN(RUN, n - at));
}

void cpu_bf16_unpack(real *x, const real *packed, size_t n) {
    enum { RUN = 1 << 14 };
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t at = 0; at < n; at += RUN)
        cpu_bf16_widen_run(x + at, (const uint16_t *)packed + at, MT_MIN(RUN, n - at));
}

void cpu_vec_count_zeros_to(double *count, const real *x, size_t n) {
    long long zeros = 0;
#pragma omp parallel for schedule(static) reduction(+ : zeros) if (n > 65536)
    for (size_t i = 0; i < n; i++) zeros += x[i] == 0;
    count[0] = (double)zeros;
}

double cpu_vec_sum_squares(const real *x, size_t n) {
    // Fixed-size chunks summed in order: the same answer for any thread count.
    enum { CHUNK = 4096 };
    size_t chunks = (n + CHUNK - 1) / CHUNK;
    double *partial = mt_calloc(chunks ? chunks : 1, sizeof(double));
#pragma omp parallel for schedule(static) if (chunks > 8)
    for (size_t c = 0; c < chunks; c++) {
        size_t end = MT_MIN(n, (c + 1) * CHUNK);
        partial[c] = row_dot(x + c * CHUNK, x + c * CHUNK, (int)(end - c * CHUNK));
    }
    double total = 0;
    for (size_t c = 0; c < chunks; c++) total += partial[c];
    free(partial);
    return total;
}

// ---- embedding -----------------------------------------------------------------------

void cpu_embedding_forward(real *out, const int32_t *tokens, const real *table, int N, int C) {
    PROF_SCOPE(PROF_EMBEDDING);
    PARALLEL_ROWS
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * C, table + (size_t)tokens[n] * C, C * sizeof(real));
}

void cpu_embedding_backward(real *dtable, const real *dout, const int32_t *tokens, int N, int C) {
    PROF_SCOPE(PROF_EMBEDDING);
    // Parallel over blocks of channels, tokens in order within each: every element sums its
    // tokens in order (deterministic without atomics), a token's block of channels at a time.
    enum { CHANNELS = 64 };  // a block: contiguous in dout's and dtable's rows
    int blocks = (C + CHANNELS - 1) / CHANNELS;
#pragma omp parallel for schedule(static) if (C >= 2 * CHANNELS)
    for (int b = 0; b < blocks; b++) {
        int c0 = b * CHANNELS, c1 = MT_MIN(C, c0 + CHANNELS);
        for (int n = 0; n < N; n++) {
            real *row = dtable + (size_t)tokens[n] * C;
            const real *grad = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) row[c] += grad[c];
        }
    }
}

// ---- RMSNorm ---------------------------------------------------------------------------

// A row of y = x·r·w into yr, stored as `store` (a bf16 row made a chunk of reals at a time
// and rounded as a run).
static void rmsnorm_row(void *yr, Storage store, const real *xr, real r, const real *w, int C) {
    enum { CHUNK = 256 };
    real chunk[CHUNK];
    for (int c0 = 0; c0 < C; c0 += CHUNK) {
        int n = MT_MIN(CHUNK, C - c0);
        real *y = store == STORE_FP32 ? (real *)yr + c0 : chunk;
        for (int c = 0; c < n; c++) y[c] = xr[c0 + c] * r * w[c0 + c];
        if (store == STORE_BF16) cpu_bf16_round_run((uint16_t *)yr + c0, chunk, (size_t)n);
    }
}

// Elements at .. at + n of x stored as `store` as reals: x's own when fp32, else widened
// (exactly) into wide.
static const real *reals_at(real *wide, const void *x, Storage store, size_t at, int n) {
    if (store == STORE_FP32) return (const real *)x + at;
    cpu_bf16_widen_run(wide, (const uint16_t *)x + at, (size_t)n);
    return wide;
}

// A row's worth of scratch per thread for reals_at when x is stored bf16, else NULL.
static real *row_scratch(Storage store, int C) {
    return store == STORE_FP32 ? NULL : mt_malloc((size_t)C * sizeof(real));
}

void cpu_rmsnorm_forward(void *y, Storage y_store, real *rstd, const void *x, Storage x_store, const real *w, int N,
                         int C, real eps) {
    PROF_SCOPE(PROF_NORM);
#pragma omp parallel if (N > 16)
    {
        real *scratch = row_scratch(x_store, C);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const real *xr = reals_at(scratch, x, x_store, (size_t)n * C, C);
            double ss = row_dot(xr, xr, C);
            real r = (real)(1.0 / sqrt(ss / C + eps));
            rstd[n] = r;
            rmsnorm_row(storage_at(y, y_store, (size_t)n * C), y_store, xr, r, w, C);
        }
        free(scratch);
    }
}

// dw_c += Σ_n dy·x·r, each column's sum in double over the rows in order. The rows are read
// in memory order: each thread takes a band of columns and walks every row through it,
// adding to the band's sums (the same order per column as a column-by-column loop).
static void rmsnorm_weight_grad(real *dw, const real *dy, const void *x, Storage x_store, const real *rstd, int N,
                                int C) {
    enum { BAND = 64 };  // columns of one band: a cache line of each row at a time, sums in registers and L1
    int bands = (C + BAND - 1) / BAND;
#pragma omp parallel for schedule(static) if (C >= 64 && bands > 1)
    for (int b = 0; b < bands; b++) {
        int c0 = b * BAND, width = MT_MIN(BAND, C - c0);
        double s[BAND] = {0};
        real widened[BAND];
        for (int n = 0; n < N; n++) {
            const real *dyr = dy + (size_t)n * C + c0, *xr = reals_at(widened, x, x_store, (size_t)n * C + c0, width);
            double r = rstd[n];
            for (int c = 0; c < width; c++) s[c] += (double)dyr[c] * xr[c] * r;
        }
        for (int c = 0; c < width; c++) dw[c0 + c] += (real)s[c];
    }
}

// y = x·r·w with r = (mean(x²)+eps)^(-1/2):
//   dw_c += Σ_n dy·x·r ;  dx = r·(dy⊙w) − x · r³/C · Σ_c (dy⊙w)·x
void cpu_rmsnorm_backward(real *dx, real *dw, const real *dy, const void *x, Storage x_store, const real *w,
                          const real *rstd, int N, int C) {
    PROF_SCOPE(PROF_NORM);
#pragma omp parallel if (N > 16)
    {
        real *scratch = row_scratch(x_store, C);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const real *xr = reals_at(scratch, x, x_store, (size_t)n * C, C), *dyr = dy + (size_t)n * C;
            real *dxr = dx + (size_t)n * C;
            double r = rstd[n], dot = row_dot3(dyr, w, xr, C);
            double k = dot * r * r * r / C;
            for (int c = 0; c < C; c++) dxr[c] += (real)(r * dyr[c] * w[c] - k * xr[c]);
        }
        free(scratch);
    }
    rmsnorm_weight_grad(dw, dy, x, x_store, rstd, N, C);
}

// ---- the residual connection ----------------------------------------------------------

void cpu_residual_add(void *y, Storage y_store, const void *x, Storage x_store, const real *branch, size_t n) {
    enum { CHUNK = 4096 };  // elements a thread widens at a time
    size_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t k = 0; k < chunks; k++) {
        size_t i0 = k * CHUNK;
        int m = (int)MT_MIN((size_t)CHUNK, n - i0);
        real widened[CHUNK];
        const real *xr = reals_at(widened, x, x_store, i0, m), *br = branch + i0;
        real *sums = y_store == STORE_FP32 ? (real *)y + i0 : widened;  // a bf16 y: summed in place, rounded
        for (int i = 0; i < m; i++) sums[i] = xr[i] + br[i];
        if (y_store == STORE_BF16) cpu_bf16_round_run((uint16_t *)y + i0, sums, (size_t)m);
    }
}

// ---- RoPE ------------------------------------------------------------------------------

void rope_plain_inv_freq(float *inv_freq, int dim, double base) {
    // rounded to float from double, as the reference implementations' tables come out
    for (int i = 0; i < dim / 2; i++) inv_freq[i] = (float)(1.0 / pow(base, (double)(2 * i) / dim));
}

void rope_table_from(real *cos_sin, int max_pos, int half, const float *inv_freq, float scale) {
    for (int p = 0; p < max_pos; p++)
        for (int i = 0; i < half; i++) {
            float angle = (float)p * inv_freq[i];
            cos_sin[((size_t)p * half + i) * 2 + 0] = (real)(cosf(angle) * scale);
            cos_sin[((size_t)p * half + i) * 2 + 1] = (real)(sinf(angle) * scale);
        }
}

void rope_table(real *cos_sin, int max_pos, int dim, double base) {
    float *inv_freq = mt_malloc((size_t)(dim / 2) * sizeof(float));
    rope_plain_inv_freq(inv_freq, dim, base);
    rope_table_from(cos_sin, max_pos, dim / 2, inv_freq, 1.0f);
    free(inv_freq);
}

RopeLayout rope_layout_heads(int heads, int head_dim) {
    RopeLayout l = {.heads = heads, .dim = head_dim, .head_stride = head_dim, .row_stride = heads * head_dim};
    return l;
}

// direction +1 rotates by +angle (forward), −1 by −angle (the transpose, for backward)
static void rope_rotate(real *x, const real *cos_sin, const TokenLayout *t, const RopeLayout *l, int direction) {
    int half = l->dim / 2, N = t->B * t->T;
    int second = l->interleaved ? 1 : half;  // offset of a pair's second element
    int step = l->interleaved ? 2 : 1;       // offset between consecutive pairs
    PARALLEL_ROWS
    for (int n = 0; n < N; n++) {
        int position = t->positions ? t->positions[n] : t->pos0 + n % t->T;
        const real *cs = cos_sin + (size_t)position * half * 2;
        for (int h = 0; h < l->heads; h++) {
            real *v = x + (size_t)n * l->row_stride + (size_t)h * l->head_stride;
            for (int i = 0; i < half; i++) {
                real c = cs[2 * i], s = direction * cs[2 * i + 1];
                real *first = v + i * step;
                real a = first[0], b = first[second];
                first[0] = a * c - b * s;
                first[second] = b * c + a * s;
            }
        }
    }
}

void cpu_rope_forward(real *x, const real *cos_sin, const TokenLayout *t, const RopeLayout *l) {
    PROF_SCOPE(PROF_ROPE);
    rope_rotate(x, cos_sin, t, l, +1);
}

void cpu_rope_backward(real *dx, const real *cos_sin, const TokenLayout *t, const RopeLayout *l) {
    PROF_SCOPE(PROF_ROPE);
    rope_rotate(dx, cos_sin, t, l, -1);
}

// ---- clamp ----------------------------------------------------------------------------------

void cpu_clamp_forward(real *y, const real *x, size_t n, real limit) {
    PROF_SCOPE(PROF_ACTIVATION);
    for (size_t i = 0; i < n; i++) y[i] = x[i] < -limit ? -limit : x[i] > limit ? limit : x[i];
}

void cpu_clamp_backward(real *d, const real *x, size_t n, real limit) {
    PROF_SCOPE(PROF_ACTIVATION);
    for (size_t i = 0; i < n; i++)
        if (x[i] < -limit || x[i] > limit) d[i] = 0;
}

// ---- SwiGLU ------------------------------------------------------------------------------

static inline real sigmoid(real x) { return 1 / (1 + real_exp(-x)); }

// SwiGLU runs a row in chunks: σ of a chunk into a buffer by a loop of its own, then the
// products. (In one loop the compiler's masked vector code for the exponential's clamps
// chains each iteration to the previous one's division: ~5x slower, the same bits.)
enum { SWIGLU_CHUNK = 256 };

static void sigmoid_chunk(real *s, const real *x, int n) {
    for (int i = 0; i < n; i++) s[i] = sigmoid(x[i]);
}

// A chunk of SwiGLU products into `to`, stored as `store`.
static void swiglu_chunk(void *to, Storage store, const real *g, const real *u, real scale, int n) {
    real sg[SWIGLU_CHUNK];
    sigmoid_chunk(sg, g, n);
    real *a = store == STORE_FP32 ? to : sg;  // a bf16 chunk: the products in place of σ, rounded
    for (int i = 0; i < n; i++) a[i] = g[i] * sg[i] * u[i] * scale;
    if (store == STORE_BF16) cpu_bf16_round_run(to, sg, (size_t)n);
}

void cpu_swiglu_forward(void *act, Storage act_store, const void *gate, const void *up, Storage gu_store,
                        const real *row_scale, int M, int I) {
    PROF_SCOPE(PROF_ACTIVATION);
    int N = M;
    PARALLEL_ROWS
    for (int m = 0; m < M; m++) {
        real scale = row_scale ? row_scale[m] : 1, g_wide[SWIGLU_CHUNK], u_wide[SWIGLU_CHUNK];
        for (int c = 0; c < I; c += SWIGLU_CHUNK) {
            size_t at = (size_t)m * I + c;
            int n = MT_MIN(SWIGLU_CHUNK, I - c);
            swiglu_chunk(storage_at(act, act_store, at), act_store, reals_at(g_wide, gate, gu_store, at, n),
                         reals_at(u_wide, up, gu_store, at, n), scale, n);
        }
    }
}

// One row of swiglu_backward: dg, du (I) overwritten, *ds when ds; g and u stored as gu_store,
// u_row (I reals) holding the row of u as reals (u's own when fp32, a buffer to widen it into
// otherwise).
static void swiglu_backward_row(real *dg_row, real *du_row, real *ds, const real *da_row, const void *gate,
                                const void *up, Storage gu_store, size_t row, real *u_row, real scale, int I) {
    real sg[SWIGLU_CHUNK], g_wide[SWIGLU_CHUNK];
    const real *u_all = reals_at(u_row, up, gu_store, row, I);
    for (int c = 0; c < I; c += SWIGLU_CHUNK) {
        int n = MT_MIN(SWIGLU_CHUNK, I - c);
        const real *g = reals_at(g_wide, gate, gu_store, row + c, n), *u = u_all + c, *da = da_row + c;
        real *dg = dg_row + c, *du = du_row + c;
        sigmoid_chunk(sg, g, n);
        for (int i = 0; i < n; i++) {
            real silu = g[i] * sg[i];
            dg[i] = da[i] * u[i] * scale * sg[i] * (1 + g[i] * (1 - sg[i]));
            du[i] = da[i] * silu;  // · scale below, once ds has used it
        }
    }
    if (ds) *ds = (real)row_dot(du_row, u_all, I);
    for (int i = 0; i < I; i++) du_row[i] *= scale;
}

// act = silu(g)·u·s with silu'(g) = σ(g)(1 + g(1 − σ(g))):
//   dg = dact·u·s·silu'(g);  du = dact·silu(g)·s;  ds = Σ_i dact·silu(g)·u
// A row's dg and du are made in reals (the outputs' own rows when fp32, else a thread's buffers,
// stored rounded after).
void cpu_swiglu_backward(void *dgate, void *dup, Storage d_store, real *drow_scale, const real *dact, const void *gate,
                         const void *up, Storage gu_store, const real *row_scale, int M, int I) {
    PROF_SCOPE(PROF_ACTIVATION);
    int N = M, own = d_store == STORE_FP32;
#pragma omp parallel if (N > 16)
    {
        real *u_row = gu_store == STORE_FP32 ? NULL : mt_malloc((size_t)I * sizeof(real));
        real *d_rows = own ? NULL : mt_malloc(2 * (size_t)I * sizeof(real));
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) {
            size_t row = (size_t)m * I;
            real *dg = own ? (real *)dgate + row : d_rows, *du = own ? (real *)dup + row : d_rows + I;
            swiglu_backward_row(dg, du, drow_scale ? drow_scale + m : NULL, dact + row, gate, up, gu_store, row, u_row,
                                row_scale ? row_scale[m] : 1, I);
            if (own) continue;
            cpu_store_run(storage_at(dgate, d_store, row), d_store, dg, (size_t)I);
            cpu_store_run(storage_at(dup, d_store, row), d_store, du, (size_t)I);
        }
        free(u_row);
        free(d_rows);
    }
}

// ---- softmax -------------------------------------------------------------------------------

void cpu_softmax_forward(real *y, const real *x, int N, int C) {
    PROF_SCOPE(PROF_ACTIVATION);
    PARALLEL_ROWS
    for (int n = 0; n < N; n++) {
        const real *xr = x + (size_t)n * C;
        real *yr = y + (size_t)n * C;
        real mx = xr[0];
        for (int c = 1; c < C; c++) mx = xr[c] > mx ? xr[c] : mx;
        double sum = 0;
        for (int c = 0; c < C; c++) sum += exp((double)xr[c] - mx);
        for (int c = 0; c < C; c++) yr[c] = (real)(exp((double)xr[c] - mx) / sum);
    }
}

void cpu_softmax_backward(real *dx, const real *y, const real *dy, int N, int C) {
    PROF_SCOPE(PROF_ACTIVATION);
    PARALLEL_ROWS
    for (int n = 0; n < N; n++) {
        const real *yr = y + (size_t)n * C, *dyr = dy + (size_t)n * C;
        double dot = 0;
        for (int c = 0; c < C; c++) dot += (double)yr[c] * dyr[c];
        for (int c = 0; c < C; c++) dx[(size_t)n * C + c] += (real)(yr[c] * (dyr[c] - dot));
    }
}

// ---- cross-entropy -----------------------------------------------------------------------

// log Σ_c e^(x_c)
static double row_logsumexp(const real *x, int C) {
    real mx = row_max(x, C);
    return mx + log(row_sum_exp(x, C, mx));
}

void cpu_cross_entropy_forward(real *losses, real *lse, const real *logits, const int32_t *targets, int N, int V) {
    PROF_SCOPE(PROF_LOSS);
    PARALLEL_ROWS
    for (int n = 0; n < N; n++) {
        const real *row = logits + (size_t)n * V;
        double row_lse = row_logsumexp(row, V);
        lse[n] = (real)row_lse;
        losses[n] = (real)(row_lse - row[targets[n]]);
    }
}

void cpu_cross_entropy_backward(real *dlogits, const real *logits, const real *lse, const int32_t *targets,
                            const real *weight, int N, int V) {
    PROF_SCOPE(PROF_LOSS);
    PARALLEL_ROWS
    for (int n = 0; n < N; n++) {
        const real *row = logits + (size_t)n * V;
        real *drow = dlogits + (size_t)n * V;
        real w = weight[n];
        if (w == 0) {
            memset(drow, 0, V * sizeof(real));
            continue;
        }
        real shift = lse[n];
        for (int v = 0; v < V; v++) drow[v] = real_exp(row[v] - shift) * w;
        drow[targets[n]] -= w;
    }
}

// ---- AdamW -----------------------------------------------------------------------------------

// In the compute type with the constants folded (vectorizes: one multiply-add chain, one
// square root and one division per element); the arithmetic of ops/adamw_math.h.
void cpu_adamw_update(real *p, const real *g, real *m, real *v, size_t n, int decay,
                  const AdamWStep *h) {
    PROF_SCOPE(PROF_OPTIMIZER);
    AdamWConstants k = adamw_constants(decay, h);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        real mi, vi;
        adamw_moments(&mi, &vi, g[i], m[i], v[i], &k);
        m[i] = mi;
        v[i] = vi;
        p[i] = adamw_param(p[i], mi, vi, &k);
    }
}

// Two passes over the range: the new moments' largest magnitudes (their new scales), then
// the same new moments again, stored with those scales, and the parameters. The maximum
// does not depend on the order it is taken in, so any thread count gives the same bits.
void cpu_adamw_update_scaled(real *p, const real *g, void *m, void *v, MomentScales *s, size_t n, int decay,
                             const AdamWStep *h, const MomentDtype dtype[ADAMW_MOMENTS]) {
    PROF_SCOPE(PROF_OPTIMIZER);
    AdamWConstants k = adamw_constants(decay, h);
    MomentFactors old_m = moment_factors(dtype[0], s->scale[0]), old_v = moment_factors(dtype[1], s->scale[1]);
    float max_m = 0, max_v = 0;
#pragma omp parallel for schedule(static) reduction(max : max_m, max_v) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        real mi, vi;
        adamw_moments(&mi, &vi, g[i], moment_load(m, i, dtype[0], old_m), moment_load(v, i, dtype[1], old_v), &k);
        max_m = fmaxf(max_m, fabsf((float)mi));
        max_v = fmaxf(max_v, fabsf((float)vi));
    }
    s->absmax[0] = max_m, s->absmax[1] = max_v;
    s->scale[0] = moment_scale(dtype[0], max_m), s->scale[1] = moment_scale(dtype[1], max_v);
    MomentFactors new_m = moment_factors(dtype[0], s->scale[0]), new_v = moment_factors(dtype[1], s->scale[1]);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        real mi, vi;
        adamw_moments(&mi, &vi, g[i], moment_load(m, i, dtype[0], old_m), moment_load(v, i, dtype[1], old_v), &k);
        moment_store(m, i, dtype[0], new_m, mi);
        moment_store(v, i, dtype[1], new_v, vi);
        p[i] = adamw_param(p[i], mi, vi, &k);
    }
}

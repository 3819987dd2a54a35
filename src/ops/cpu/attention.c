// attention.c — causal grouped-query attention, flash style, for the cpu backend.
//
// No (T×T) matrix is kept: queries are processed in tiles of QUERY_TILE rows against
// the keys they may see, with the scores of one tile in a per-thread scratch; forward
// stores only each row's logsumexp. Backward recomputes the probabilities from
// (q, k, lse). Key j sits at position k_pos0 + j; for one tile (rows t, keys j < the tile's
// key count):
//   S = scale·Q Kᵀ,  P = exp(S − lse) (0 outside the keys [first, end) row t sees),  O = P V
//   D_t = dO_t·O_t,  dP = dO Vᵀ,  dS = P ⊙ (dP − D) · scale
//   dQ += dS K,  dK += dSᵀ Q,  dV += Pᵀ dO
// With attention dropout (Z = kept·scale of each (query, key), ops/dropout_math.h) the forward
// multiplies P by Z before O = P V (lse stays that of P), and the backward uses
//   dV += (P ⊙ Z)ᵀ dO,  dS = P ⊙ (Z ⊙ dP − D) · scale   (D = dO·O with the dropped O).
// The products are GEMMs on strided views (heads are interleaved in each token row).
// Backward work is split over (batch row, kv head): the thread that owns a kv head owns
// its dK/dV and the dQ of the query heads that read it, so no two threads write the same
// memory and every sum runs in a fixed order whatever the thread count.
#include <math.h>
#include <string.h>

#include "core/profile.h"
#include "ops/cpu/row_reduce.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dropout_math.h"

enum { QUERY_TILE = 64 };

// Strided views of one (batch row, head): row t of Q is q + q_offset + t·q_stride, and
// likewise for out (o), K (k) and V (v).
typedef struct {
    size_t q_offset, o_offset, k_offset, v_offset;  // this head's row 0
    int q_stride, o_stride, k_stride, v_stride;     // elements between consecutive token rows
} HeadView;

static int value_width(const AttentionShape *s) { return s->v_head_dim ? s->v_head_dim : s->head_dim; }

static HeadView head_view(const AttentionShape *s, int b, int h) {
    int kvh = h / (s->heads / s->kv_heads), dv = value_width(s);
    size_t q_row0 = (size_t)b * s->Tq * s->heads, kv_row0 = (size_t)b * s->kv_row_stride * s->kv_heads;
    HeadView v = {.q_offset = (q_row0 + h) * s->head_dim, .o_offset = (q_row0 + h) * dv,
                  .k_offset = (kv_row0 + kvh) * s->head_dim, .v_offset = (kv_row0 + kvh) * dv,
                  .q_stride = s->heads * s->head_dim, .o_stride = s->heads * dv,
                  .k_stride = s->kv_heads * s->head_dim, .v_stride = s->kv_heads * dv};
    return v;
}

// The keys [first, end) query t of batch row b sees: from its document's start (key_start,
// --reset-attention-mask) to its own position, within the Tk keys; empty when first ≥ end.
typedef struct {
    int first, end;
} KeyRange;

static KeyRange visible_keys(const AttentionShape *s, int b, int t) {
    int start = s->key_start ? s->key_start[(size_t)b * s->Tq + t] : 0;
    KeyRange r = {.first = MT_MAX(start - s->k_pos0, 0), .end = MT_MIN(s->q_pos0 + t + 1 - s->k_pos0, s->Tk)};
    return r;
}

// The keys [0, count) the score tile of queries [t0, t0 + rows) spans: up to the last row's
// position (≤ 0: no row of the tile sees a key).
static int tile_key_count(const AttentionShape *s, int t0, int rows) {
    return MT_MIN(s->q_pos0 + t0 + rows - s->k_pos0, s->Tk);
}

// A bound on tile_key_count over every tile, at least 1 (the size of the score scratch).
static int max_tile_keys(const AttentionShape *s) {
    return MT_MAX(tile_key_count(s, 0, s->Tq), 1);
}

// Rows [t0, t0 + rows) that see no key: out = 0, lse = −∞.
static void unseen_rows(real *out, real *lse_row, const AttentionShape *s, const HeadView *view, int t0, int rows) {
    for (int r = 0; r < rows; r++) {
        memset(out + view->o_offset + (size_t)(t0 + r) * view->o_stride, 0, (size_t)value_width(s) * sizeof(real));
        lse_row[t0 + r] = -INFINITY;
    }
}

// The dropout row key of query t of (b, h); 0 without dropout.
static uint64_t dropout_key(const AttentionShape *s, int b, int h, int t) {
    return dropout_row_key(s->dropout.stream, dropout_attention_row(b, s->head_first + h, s->q_pos0 + t));
}

// Z of key j of the query whose dropout_key is key.
static real dropout_z(const AttentionShape *s, uint64_t key, int j) {
    return dropout_kept(key, (uint64_t)(s->k_pos0 + j), s->dropout.threshold) ? s->dropout.scale : 0;
}

// A row of P (keys [first, end) seen) multiplied by Z: the probabilities P·V uses.
static void drop_probs(real *p, const AttentionShape *s, int b, int h, int t, KeyRange seen) {
    uint64_t key = dropout_key(s, b, h, t);
    for (int j = seen.first; j < seen.end; j++) p[j] *= dropout_z(s, key, j);
}

// scores (rows, keys) = scale · Q[t0 : t0+rows] · K[0 : keys]ᵀ
static void tile_scores(real *scores, const real *q, const real *k, const AttentionShape *s, const HeadView *v,
                        int t0, int rows, int keys) {
    cpu_gemm(0, 1, rows, keys, s->head_dim, s->scale, q + v->q_offset + (size_t)t0 * v->q_stride, v->q_stride,
            k + v->k_offset, v->k_stride, 0, scores, keys);
}

static void attend_head(real *out, real *lse_row, real *scores, const real *q, const real *k, const real *v,
                        const AttentionShape *s, int b, int h) {
    HeadView view = head_view(s, b, h);
    for (int t0 = 0; t0 < s->Tq; t0 += QUERY_TILE) {
        int rows = MT_MIN(QUERY_TILE, s->Tq - t0), keys = tile_key_count(s, t0, rows);
        if (keys <= 0) {
            unseen_rows(out, lse_row, s, &view, t0, rows);
            continue;
        }
        tile_scores(scores, q, k, s, &view, t0, rows, keys);
        for (int r = 0; r < rows; r++) {  // softmax over the visible keys [first, end) of row r
            real *row = scores + (size_t)r * keys;
            KeyRange seen = visible_keys(s, b, t0 + r);
            if (seen.first >= seen.end) {  // a zero row of P: out = 0
                memset(row, 0, (size_t)keys * sizeof(real));
                lse_row[t0 + r] = -INFINITY;
                continue;
            }
            real max = row_max(row + seen.first, seen.end - seen.first);
            for (int j = seen.first; j < seen.end; j++) row[j] = real_exp(row[j] - max);
            real sum = (real)row_sum(row + seen.first, seen.end - seen.first), inv = 1 / sum;
            for (int j = 0; j < seen.first; j++) row[j] = 0;
            for (int j = seen.first; j < seen.end; j++) row[j] *= inv;
            for (int j = seen.end; j < keys; j++) row[j] = 0;
            lse_row[t0 + r] = max + (real)log((double)sum);
            if (s->dropout.threshold) drop_probs(row, s, b, h, t0 + r, seen);
        }
        // O[t0 : t0+rows] = P · V[0 : keys]
        cpu_gemm(0, 0, rows, value_width(s), keys, 1, scores, keys, v + view.v_offset, view.v_stride, 0,
                out + view.o_offset + (size_t)t0 * view.o_stride, view.o_stride);
    }
}

void cpu_attention_forward(real *out, real *lse, const real *q, const real *k, const real *v,
                       const AttentionShape *s) {
    PROF_SCOPE(PROF_ATTENTION);
    int tile_keys = max_tile_keys(s);
#pragma omp parallel
    {
        real *scores = mt_malloc((size_t)QUERY_TILE * tile_keys * sizeof(real));
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < s->B; b++)
            for (int h = 0; h < s->heads; h++)
                attend_head(out, lse + ((size_t)b * s->heads + h) * s->Tq, scores, q, k, v, s, b, h);
        free(scores);
    }
}

// With dropout, a row of the backward: dp (dO·Vᵀ) becomes dS = P ⊙ (Z ⊙ dP − D)·scale and p
// (P) becomes P ⊙ Z, over the keys [first, end) seen.
static void dropped_ds(real *p, real *dp, real D, const AttentionShape *s, int b, int h, int t, KeyRange seen) {
    uint64_t key = dropout_key(s, b, h, t);
    for (int j = seen.first; j < seen.end; j++) {
        real z = dropout_z(s, key, j);
        dp[j] = p[j] * (z * dp[j] - D) * s->scale;
        p[j] *= z;
    }
}

// Backward of one query head of one batch row; dk/dv are the head's kv-head gradients.
static void attention_head_backward(real *dq, real *dk, real *dv, real *probs, real *dprobs, const real *dout,
                                    const real *out, const real *lse_row, const real *q, const real *k,
                                    const real *v, const AttentionShape *s, int b, int h) {
    HeadView view = head_view(s, b, h);
    int d = s->head_dim, v_width = value_width(s);
    for (int t0 = 0; t0 < s->Tq; t0 += QUERY_TILE) {
        int rows = MT_MIN(QUERY_TILE, s->Tq - t0), keys = tile_key_count(s, t0, rows);
        if (keys <= 0) continue;  // no row of the tile sees a key: no gradient
        const real *q_tile = q + view.q_offset + (size_t)t0 * view.q_stride;
        const real *dout_tile = dout + view.o_offset + (size_t)t0 * view.o_stride;
        tile_scores(probs, q, k, s, &view, t0, rows, keys);
        // dP = dO · Vᵀ
        cpu_gemm(0, 1, rows, keys, v_width, 1, dout_tile, view.o_stride, v + view.v_offset, view.v_stride, 0, dprobs, keys);
        for (int r = 0; r < rows; r++) {
            real *p = probs + (size_t)r * keys, *dp = dprobs + (size_t)r * keys;
            const real *o_row = out + view.o_offset + (size_t)(t0 + r) * view.o_stride;
            const real *do_row = dout_tile + (size_t)r * view.o_stride;
            real D = 0;
            for (int i = 0; i < v_width; i++) D += do_row[i] * o_row[i];
            KeyRange seen = visible_keys(s, b, t0 + r);
            seen.first = MT_MIN(seen.first, keys);  // an empty range zeroes the whole row
            for (int j = 0; j < seen.first; j++) p[j] = dp[j] = 0;
            // (two loops: fused, the exponential's vector code runs ~5x slower; elementwise.c's SwiGLU)
            for (int j = seen.first; j < seen.end; j++) p[j] = real_exp(p[j] - lse_row[t0 + r]);
            if (s->dropout.threshold) dropped_ds(p, dp, D, s, b, h, t0 + r, seen);
            else
                for (int j = seen.first; j < seen.end; j++) dp[j] = p[j] * (dp[j] - D) * s->scale;  // now dS
            for (int j = MT_MAX(seen.end, seen.first); j < keys; j++) p[j] = dp[j] = 0;
        }
        // dQ += dS · K ; dK += dSᵀ · Q ; dV += Pᵀ · dO
        cpu_gemm(0, 0, rows, d, keys, 1, dprobs, keys, k + view.k_offset, view.k_stride, 1,
                dq + view.q_offset + (size_t)t0 * view.q_stride, view.q_stride);
        cpu_gemm(1, 0, keys, d, rows, 1, dprobs, keys, q_tile, view.q_stride, 1, dk + view.k_offset, view.k_stride);
        cpu_gemm(1, 0, keys, v_width, rows, 1, probs, keys, dout_tile, view.o_stride, 1, dv + view.v_offset, view.v_stride);
    }
}

void cpu_attention_backward(real *dq, real *dk, real *dv, const real *dout, const real *out,
                        const real *lse, const real *q, const real *k, const real *v,
                        const AttentionShape *s) {
    PROF_SCOPE(PROF_ATTENTION);
    int group = s->heads / s->kv_heads;
    int tile_keys = max_tile_keys(s);
#pragma omp parallel
    {
        real *probs = mt_malloc((size_t)QUERY_TILE * tile_keys * sizeof(real));
        real *dprobs = mt_malloc((size_t)QUERY_TILE * tile_keys * sizeof(real));
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < s->B; b++)
            for (int kvh = 0; kvh < s->kv_heads; kvh++)
                for (int h = kvh * group; h < (kvh + 1) * group; h++)
                    attention_head_backward(dq, dk, dv, probs, dprobs, dout, out,
                                            lse + ((size_t)b * s->heads + h) * s->Tq, q, k, v, s, b, h);
        free(probs);
        free(dprobs);
    }
}

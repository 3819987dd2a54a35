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
// The products are GEMMs; the query heads that share a kv head are stacked into one GEMM
// (HeadStack below), so K and V are read and packed once for the group.
// Forward work is split over (batch row, kv head, stack, query tile), each writing its own
// rows of out and lse. Backward work is split over (batch row, kv head): the thread that owns
// a kv head owns its dK/dV and the dQ of the query heads that read it, so no two threads
// write the same memory and every sum runs in a fixed order whatever the thread count.
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/float_formats.h"
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

// Rows [t0, t0 + rows) that see no key: out = 0 (zero bits, fp32 or bf16), lse = −∞.
static void unseen_rows(void *out, real *lse_row, const AttentionShape *s, const HeadView *view, int t0, int rows) {
    for (int r = 0; r < rows; r++) {
        memset(storage_at(out, s->out_store, view->o_offset + (size_t)(t0 + r) * view->o_stride), 0,
               (size_t)value_width(s) * storage_bytes(s->out_store));
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

// The query heads of one kv head are taken together, up to STACKED_HEADS at a time: their
// tiles' rows stacked head after head (row g·rows + i is query t0 + i of head h0 + g) into
// one GEMM against the kv head's keys, so that K and V are packed once for all of them.
// The scores, out, dP and dQ get the same sums as with one head at a time; dK and dV sum
// the stack's rows (every head's tile) in one GEMM, so their last bits depend on how many
// heads a stack holds (fixed by the shapes: never by the threads, in the backward). The
// stacked operands are copied in (and the outputs back) through a per-thread scratch.
typedef struct {
    int h0, count;  // query heads [h0, h0 + count), all reading one kv head
} HeadStack;

// Query heads per stack: up to STACKED_HEADS of a kv head's group, fewer when one head's
// score tile is large (long keys), so that a score scratch stays within SCORE_SCRATCH_MAX.
static int stack_heads(const AttentionShape *s, int tile_keys) {
    enum { STACKED_HEADS = 4 };
    const size_t SCORE_SCRATCH_MAX = (size_t)8 << 20;
    size_t one_head = (size_t)QUERY_TILE * tile_keys * sizeof(real);
    int fit = (int)MT_MAX(1, SCORE_SCRATCH_MAX / one_head);
    return MT_MIN(MT_MIN(STACKED_HEADS, s->heads / s->kv_heads), fit);
}

static int thread_count(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// Stacks of one kv head's query heads.
static int stacks_per_kv_head(const AttentionShape *s, int per_stack) {
    int group = s->heads / s->kv_heads;
    return (group + per_stack - 1) / per_stack;
}

static HeadStack head_stack(const AttentionShape *s, int kvh, int stack, int per_stack) {
    int group = s->heads / s->kv_heads, first = stack * per_stack;
    HeadStack hs = {.h0 = kvh * group + first, .count = MT_MIN(per_stack, group - first)};
    return hs;
}

// dst (count·rows, width) <- rows [t0, t0 + rows) of each head of the stack, from x whose
// head h row t starts at offset(h) + t·stride (the head's view).
typedef enum { VIEW_Q, VIEW_O } ViewKind;

static size_t view_row(const HeadView *v, ViewKind kind, int t) {
    return kind == VIEW_Q ? v->q_offset + (size_t)t * v->q_stride : v->o_offset + (size_t)t * v->o_stride;
}

// x (stored as store) may be q or out (VIEW_Q, VIEW_O: their storage), or an fp32 gradient.
static void gather_rows(real *dst, const void *x, Storage store, const AttentionShape *s, int b, HeadStack hs,
                        ViewKind kind, int t0, int rows, int width) {
    for (int g = 0; g < hs.count; g++) {
        HeadView view = head_view(s, b, hs.h0 + g);
        for (int i = 0; i < rows; i++)
            cpu_load_run(dst + ((size_t)g * rows + i) * width,
                         storage_at_const(x, store, view_row(&view, kind, t0 + i)), store, (size_t)width);
    }
}

// The inverse of gather_rows: src's stacked rows written back to x (stored as store).
static void scatter_rows(void *x, Storage store, const real *src, const AttentionShape *s, int b, HeadStack hs,
                         ViewKind kind, int t0, int rows, int width) {
    for (int g = 0; g < hs.count; g++) {
        HeadView view = head_view(s, b, hs.h0 + g);
        for (int i = 0; i < rows; i++)
            cpu_store_run(storage_at(x, store, view_row(&view, kind, t0 + i)), store,
                          src + ((size_t)g * rows + i) * width, (size_t)width);
    }
}

// The kv head's K or V of a view (row 0), stored as s->kv_store.
static const void *kv_rows(const void *x, const AttentionShape *s, size_t offset) {
    return storage_at_const(x, s->kv_store, offset);
}

// scores (stacked rows, keys) = Q_stacked · K[0 : keys]ᵀ (K of the stack's kv head), not yet
// scaled: with alpha 1 the GEMM may sum straight into scores (AMX), and scale_seen then
// rounds scale·sum once, as alpha = scale would (head_dim within one K block).
static void stacked_scores(real *scores, const real *q_stacked, const void *k, const AttentionShape *s,
                           const HeadView *v, int stacked_rows, int keys) {
    cpu_gemm_stored(0, 1, stacked_rows, keys, s->head_dim, 1, q_stacked, STORE_FP32, s->head_dim,
                    kv_rows(k, s, v->k_offset), s->kv_store, v->k_stride, 0, scores, STORE_FP32, keys);
}

// The scores of the keys [first, end) a row sees, times the attention's scale.
static void scale_seen(real *row, KeyRange seen, real scale) {
    for (int j = seen.first; j < seen.end; j++) row[j] *= scale;
}

// A row of scores over the keys [0, keys) becomes the probabilities of the visible keys
// (zero elsewhere); returns the row's lse (−∞ and a zero row when it sees no key).
static real softmax_row(real *row, int keys, KeyRange seen) {
    if (seen.first >= seen.end) {
        memset(row, 0, (size_t)keys * sizeof(real));
        return -INFINITY;
    }
    real max = row_max(row + seen.first, seen.end - seen.first);
    for (int j = seen.first; j < seen.end; j++) row[j] = real_exp(row[j] - max);
    real sum = (real)row_sum(row + seen.first, seen.end - seen.first), inv = 1 / sum;
    for (int j = 0; j < seen.first; j++) row[j] = 0;
    for (int j = seen.first; j < seen.end; j++) row[j] *= inv;
    for (int j = seen.end; j < keys; j++) row[j] = 0;
    return max + (real)log((double)sum);
}

// Per-thread scratch of the forward: the stacked Q tile, its scores, its output.
typedef struct {
    real *q, *scores, *out;
} ForwardScratch;

// Queries [t0, t0 + rows) of the heads of hs (batch row b): out and lse.
static void attend_tile(void *out, real *lse, const ForwardScratch *w, const void *q, const void *k, const void *v,
                        const AttentionShape *s, int b, HeadStack hs, int t0) {
    int rows = MT_MIN(QUERY_TILE, s->Tq - t0), keys = tile_key_count(s, t0, rows), dv = value_width(s);
    HeadView kv_view = head_view(s, b, hs.h0);
    for (int g = 0; g < hs.count && keys <= 0; g++) {
        HeadView view = head_view(s, b, hs.h0 + g);
        unseen_rows(out, lse + ((size_t)b * s->heads + hs.h0 + g) * s->Tq, s, &view, t0, rows);
    }
    if (keys <= 0) return;
    gather_rows(w->q, q, s->q_store, s, b, hs, VIEW_Q, t0, rows, s->head_dim);
    stacked_scores(w->scores, w->q, k, s, &kv_view, hs.count * rows, keys);
    for (int g = 0; g < hs.count; g++) {
        int h = hs.h0 + g;
        real *lse_row = lse + ((size_t)b * s->heads + h) * s->Tq;
        for (int i = 0; i < rows; i++) {
            real *row = w->scores + ((size_t)g * rows + i) * keys;
            KeyRange seen = visible_keys(s, b, t0 + i);
            scale_seen(row, seen, s->scale);
            lse_row[t0 + i] = softmax_row(row, keys, seen);
            if (s->dropout.threshold && seen.first < seen.end) drop_probs(row, s, b, h, t0 + i, seen);
        }
    }
    // O_stacked = P · V[0 : keys]
    cpu_gemm_stored(0, 0, hs.count * rows, dv, keys, 1, w->scores, STORE_FP32, keys, kv_rows(v, s, kv_view.v_offset),
                    s->kv_store, kv_view.v_stride, 0, w->out, STORE_FP32, dv);
    scatter_rows(out, s->out_store, w->out, s, b, hs, VIEW_O, t0, rows, dv);
}

void cpu_attention_forward(void *out, real *lse, const void *q, const void *k, const void *v,
                           const AttentionShape *s) {
    PROF_SCOPE(PROF_ATTENTION);
    int tile_keys = max_tile_keys(s), per_stack = stack_heads(s, tile_keys);
    int tiles = (s->Tq + QUERY_TILE - 1) / QUERY_TILE;
    // fewer heads a stack while that leaves threads without work (generation: one tile); the
    // forward's bits do not depend on the stacking
    while (per_stack > 1 && (long)s->B * s->kv_heads * stacks_per_kv_head(s, per_stack) * tiles < thread_count())
        per_stack--;
    int stacks = stacks_per_kv_head(s, per_stack);
    size_t stacked_rows = (size_t)per_stack * QUERY_TILE;
#pragma omp parallel
    {
        ForwardScratch w = {mt_malloc(stacked_rows * s->head_dim * sizeof(real)),
                            mt_malloc(stacked_rows * tile_keys * sizeof(real)),
                            mt_malloc(stacked_rows * value_width(s) * sizeof(real))};
#pragma omp for collapse(4) schedule(dynamic)
        for (int b = 0; b < s->B; b++)
            for (int kvh = 0; kvh < s->kv_heads; kvh++)
                for (int stack = 0; stack < stacks; stack++)
                    for (int tile = 0; tile < tiles; tile++)
                        attend_tile(out, lse, &w, q, k, v, s, b, head_stack(s, kvh, stack, per_stack), tile * QUERY_TILE);
        free(w.q);
        free(w.scores);
        free(w.out);
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

// One row of the backward (query t of head h): p holds its unscaled scores and becomes P (⊙ Z
// with dropout), dp holds dO·Vᵀ and becomes dS; zero outside the keys the row sees.
// o_row is stored as s->out_store.
static void backward_row(real *p, real *dp, int keys, const void *o_row, const real *do_row, real lse,
                         const AttentionShape *s, int b, int h, int t) {
    int v_width = value_width(s);
    real D = 0;
    if (s->out_store == STORE_FP32)
        for (int i = 0; i < v_width; i++) D += do_row[i] * ((const real *)o_row)[i];
    else
        for (int i = 0; i < v_width; i++) D += do_row[i] * (real)bf16_to_float(((const uint16_t *)o_row)[i]);
    KeyRange seen = visible_keys(s, b, t);
    seen.first = MT_MIN(seen.first, keys);  // an empty range zeroes the whole row
    for (int j = 0; j < seen.first; j++) p[j] = dp[j] = 0;
    scale_seen(p, seen, s->scale);
    // (two loops: fused, the exponential's vector code runs ~5x slower; elementwise.c's SwiGLU)
    for (int j = seen.first; j < seen.end; j++) p[j] = real_exp(p[j] - lse);
    if (s->dropout.threshold) dropped_ds(p, dp, D, s, b, h, t, seen);
    else
        for (int j = seen.first; j < seen.end; j++) dp[j] = p[j] * (dp[j] - D) * s->scale;  // now dS
    for (int j = MT_MAX(seen.end, seen.first); j < keys; j++) p[j] = dp[j] = 0;
}

// Per-thread scratch of the backward: stacked Q, dO and dQ tiles, P and dP (then dS).
typedef struct {
    real *q, *dout, *dq, *probs, *dprobs;
} BackwardScratch;

// Queries [t0, t0 + rows) of the heads of hs (batch row b): their dq, and their share of the
// kv head's dk and dv.
static void attention_tile_backward(real *dq, real *dk, real *dv, const BackwardScratch *w, const real *dout,
                                    const void *out, const real *lse, const void *q, const void *k, const void *v,
                                    const AttentionShape *s, int b, HeadStack hs, int t0) {
    int rows = MT_MIN(QUERY_TILE, s->Tq - t0), keys = tile_key_count(s, t0, rows);
    if (keys <= 0) return;  // no row of the tile sees a key: no gradient
    int d = s->head_dim, v_width = value_width(s), R = hs.count * rows;
    HeadView kv_view = head_view(s, b, hs.h0);
    gather_rows(w->q, q, s->q_store, s, b, hs, VIEW_Q, t0, rows, d);
    gather_rows(w->dout, dout, STORE_FP32, s, b, hs, VIEW_O, t0, rows, v_width);
    gather_rows(w->dq, dq, STORE_FP32, s, b, hs, VIEW_Q, t0, rows, d);
    stacked_scores(w->probs, w->q, k, s, &kv_view, R, keys);
    // dP = dO · Vᵀ
    cpu_gemm_stored(0, 1, R, keys, v_width, 1, w->dout, STORE_FP32, v_width, kv_rows(v, s, kv_view.v_offset),
                    s->kv_store, kv_view.v_stride, 0, w->dprobs, STORE_FP32, keys);
    for (int g = 0; g < hs.count; g++) {
        int h = hs.h0 + g;
        HeadView view = head_view(s, b, h);
        const real *lse_row = lse + ((size_t)b * s->heads + h) * s->Tq;
        for (int i = 0; i < rows; i++) {
            size_t r = (size_t)g * rows + i;
            backward_row(w->probs + r * keys, w->dprobs + r * keys, keys,
                         storage_at_const(out, s->out_store, view_row(&view, VIEW_O, t0 + i)),
                         w->dout + r * v_width, lse_row[t0 + i], s, b, h, t0 + i);
        }
    }
    // dQ += dS · K ; dK += dSᵀ · Q ; dV += Pᵀ · dO
    cpu_gemm_stored(0, 0, R, d, keys, 1, w->dprobs, STORE_FP32, keys, kv_rows(k, s, kv_view.k_offset), s->kv_store,
                    kv_view.k_stride, 1, w->dq, STORE_FP32, d);
    scatter_rows(dq, STORE_FP32, w->dq, s, b, hs, VIEW_Q, t0, rows, d);
    cpu_gemm(1, 0, keys, d, R, 1, w->dprobs, keys, w->q, d, 1, dk + kv_view.k_offset, kv_view.k_stride);
    cpu_gemm(1, 0, keys, v_width, R, 1, w->probs, keys, w->dout, v_width, 1, dv + kv_view.v_offset, kv_view.v_stride);
}

void cpu_attention_backward(real *dq, real *dk, real *dv, const real *dout, const void *out,
                            const real *lse, const void *q, const void *k, const void *v,
                            const AttentionShape *s) {
    PROF_SCOPE(PROF_ATTENTION);
    int tile_keys = max_tile_keys(s), per_stack = stack_heads(s, tile_keys);
    int stacks = stacks_per_kv_head(s, per_stack);
    size_t stacked_rows = (size_t)per_stack * QUERY_TILE;
#pragma omp parallel
    {
        BackwardScratch w = {mt_malloc(stacked_rows * s->head_dim * sizeof(real)),
                             mt_malloc(stacked_rows * value_width(s) * sizeof(real)),
                             mt_malloc(stacked_rows * s->head_dim * sizeof(real)),
                             mt_malloc(stacked_rows * tile_keys * sizeof(real)),
                             mt_malloc(stacked_rows * tile_keys * sizeof(real))};
        // a thread owns a kv head's dk, dv (and its query heads' dq): no two write the same memory
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < s->B; b++)
            for (int kvh = 0; kvh < s->kv_heads; kvh++)
                for (int stack = 0; stack < stacks; stack++)
                    for (int t0 = 0; t0 < s->Tq; t0 += QUERY_TILE)
                        attention_tile_backward(dq, dk, dv, &w, dout, out, lse, q, k, v, s, b,
                                                head_stack(s, kvh, stack, per_stack), t0);
        free(w.q);
        free(w.dout);
        free(w.dq);
        free(w.probs);
        free(w.dprobs);
    }
}

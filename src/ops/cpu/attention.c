// attention.c — causal grouped-query attention, flash style, for the cpu backend.
//
// Forward keeps no (T×T) matrix: each query row computes its scores against the keys
// it may see into a row-sized scratch, takes the softmax, and stores only the row's
// logsumexp. Backward recomputes the probabilities from (q, k, lse):
//   p_j = exp(s_j − lse),  s_j = scale·q·k_j,  D = dout·out,  dp_j = dout·v_j,
//   ds_j = p_j (dp_j − D),  dq += scale Σ_j ds_j k_j,  dk_j += scale ds_j q,  dv_j += p_j dout.
// Work is split over (batch row, kv head): the thread that owns a kv head owns its dk/dv
// and the dq of the query heads that read it, so no two threads write the same memory
// and every sum runs in a fixed order.
#include <math.h>
#include <string.h>

#include "ops/ops.h"

#ifdef MT_DOUBLE
#define real_exp exp
#else
#define real_exp expf
#endif

static inline real dot(const real *a, const real *b, int n) {
    real s = 0;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline void axpy(real *restrict y, real a, const real *restrict x, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static inline size_t q_index(const AttentionShape *s, int b, int t, int h) {
    return (((size_t)b * s->Tq + t) * s->heads + h) * s->head_dim;
}

static inline size_t kv_index(const AttentionShape *s, int b, int j, int kvh) {
    return (((size_t)b * s->kv_row_stride + j) * s->kv_heads + kvh) * s->head_dim;
}

// scores[j] = scale · q·k_j for the keys 0..last of kv head kvh; returns the maximum.
static real row_scores(real *scores, const real *q_row, const real *k, const AttentionShape *s, int b, int kvh,
                       int last) {
    real max = -INFINITY;
    for (int j = 0; j <= last; j++) {
        scores[j] = s->scale * dot(q_row, k + kv_index(s, b, j, kvh), s->head_dim);
        max = scores[j] > max ? scores[j] : max;
    }
    return max;
}

// One query row: out_row = Σ_j softmax(s)_j v_j; returns the row's logsumexp.
static real attend_row(real *out_row, real *scores, const real *q_row, const real *k, const real *v,
                       const AttentionShape *s, int b, int kvh, int last) {
    int d = s->head_dim;
    real max = row_scores(scores, q_row, k, s, b, kvh, last);
    real sum = 0;
    for (int j = 0; j <= last; j++) {
        scores[j] = real_exp(scores[j] - max);
        sum += scores[j];
    }
    memset(out_row, 0, d * sizeof(real));
    real inv = 1 / sum;
    for (int j = 0; j <= last; j++) axpy(out_row, scores[j] * inv, v + kv_index(s, b, j, kvh), d);
    return max + (real)log((double)sum);
}

void attention_forward(real *out, real *lse, const real *q, const real *k, const real *v,
                       const AttentionShape *s) {
    int group = s->heads / s->kv_heads;
#pragma omp parallel
    {
        real *scores = mt_malloc((size_t)s->Tk * sizeof(real));
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < s->B; b++)
            for (int h = 0; h < s->heads; h++)
                for (int t = 0; t < s->Tq; t++) {
                    size_t qi = q_index(s, b, t, h);
                    lse[((size_t)b * s->heads + h) * s->Tq + t] =
                        attend_row(out + qi, scores, q + qi, k, v, s, b, h / group, s->q_pos0 + t);
                }
        free(scores);
    }
}

// Gradients of one query row (b, t, h) against its visible keys.
static void attention_row_backward(real *dq, real *dk, real *dv, real *probs, const real *dout, const real *out,
                                   const real *lse, const real *q, const real *k, const real *v,
                                   const AttentionShape *s, int b, int t, int h, int kvh) {
    int d = s->head_dim, last = s->q_pos0 + t;
    size_t qi = q_index(s, b, t, h);
    real row_lse = lse[((size_t)b * s->heads + h) * s->Tq + t];
    real D = dot(dout + qi, out + qi, d);
    row_scores(probs, q + qi, k, s, b, kvh, last);
    for (int j = 0; j <= last; j++) probs[j] = real_exp(probs[j] - row_lse);
    for (int j = 0; j <= last; j++) {
        size_t ki = kv_index(s, b, j, kvh);
        real ds = probs[j] * (dot(dout + qi, v + ki, d) - D) * s->scale;
        axpy(dq + qi, ds, k + ki, d);
        axpy(dk + ki, ds, q + qi, d);
        axpy(dv + ki, probs[j], dout + qi, d);
    }
}

void attention_backward(real *dq, real *dk, real *dv, const real *dout, const real *out,
                        const real *lse, const real *q, const real *k, const real *v,
                        const AttentionShape *s) {
    int group = s->heads / s->kv_heads;
#pragma omp parallel
    {
        real *probs = mt_malloc((size_t)s->Tk * sizeof(real));
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < s->B; b++)
            for (int kvh = 0; kvh < s->kv_heads; kvh++)
                for (int h = kvh * group; h < (kvh + 1) * group; h++)
                    for (int t = 0; t < s->Tq; t++)
                        attention_row_backward(dq, dk, dv, probs, dout, out, lse, q, k, v, s, b, t, h, kvh);
        free(probs);
    }
}

// attention.c — causal grouped-query attention, flash style, for the cpu backend.
//
// Forward keeps no (T×T) matrix: each query row streams over its visible keys with an
// online softmax and stores only its logsumexp. Backward recomputes the probabilities
// from (q, k, lse):  p_j = exp(s_j − lse),  s_j = scale·q·k_j,
//   D = dout·out,  dp_j = dout·v_j,  ds_j = p_j (dp_j − D),
//   dq += scale Σ_j ds_j k_j,  dk_j += scale ds_j q,  dv_j += p_j dout.
// Work is split over (batch row, kv head): the thread that owns a kv head owns its dk/dv
// and the dq of the query heads that read it, so no two threads write the same memory.
#include <math.h>
#include <string.h>

#include "ops/ops.h"

static inline real dot(const real *a, const real *b, int n) {
    real s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline void axpy(real *y, real a, const real *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static inline size_t q_index(const AttentionShape *s, int b, int t, int h) {
    return (((size_t)b * s->Tq + t) * s->heads + h) * s->head_dim;
}

static inline size_t kv_index(const AttentionShape *s, int b, int j, int kvh) {
    return (((size_t)b * s->kv_row_stride + j) * s->kv_heads + kvh) * s->head_dim;
}

// One query row: out_row = Σ_j softmax(s)_j v_j over keys 0..last; returns logsumexp.
static real attend_row(real *out_row, const real *q_row, const real *k, const real *v,
                       const AttentionShape *s, int b, int kvh, int last) {
    int d = s->head_dim;
    real running_max = -INFINITY, running_sum = 0;
    memset(out_row, 0, d * sizeof(real));
    for (int j = 0; j <= last; j++) {
        real score = s->scale * dot(q_row, k + kv_index(s, b, j, kvh), d);
        if (score > running_max) {
            real correction = (real)exp((double)(running_max - score));
            for (int i = 0; i < d; i++) out_row[i] *= correction;
            running_sum *= correction;
            running_max = score;
        }
        real p = (real)exp((double)(score - running_max));
        running_sum += p;
        axpy(out_row, p, v + kv_index(s, b, j, kvh), d);
    }
    real inv = 1 / running_sum;
    for (int i = 0; i < d; i++) out_row[i] *= inv;
    return running_max + (real)log((double)running_sum);
}

void attention_forward(real *out, real *lse, const real *q, const real *k, const real *v,
                       const AttentionShape *s) {
    int group = s->heads / s->kv_heads;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->heads; h++)
            for (int t = 0; t < s->Tq; t++) {
                size_t qi = q_index(s, b, t, h);
                lse[((size_t)b * s->heads + h) * s->Tq + t] =
                    attend_row(out + qi, q + qi, k, v, s, b, h / group, s->q_pos0 + t);
            }
}

void attention_backward(real *dq, real *dk, real *dv, const real *dout, const real *out,
                        const real *lse, const real *q, const real *k, const real *v,
                        const AttentionShape *s) {
    int d = s->head_dim, group = s->heads / s->kv_heads;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < s->B; b++)
        for (int kvh = 0; kvh < s->kv_heads; kvh++)
            for (int h = kvh * group; h < (kvh + 1) * group; h++)
                for (int t = 0; t < s->Tq; t++) {
                    size_t qi = q_index(s, b, t, h);
                    real row_lse = lse[((size_t)b * s->heads + h) * s->Tq + t];
                    real D = dot(dout + qi, out + qi, d);
                    for (int j = 0; j <= s->q_pos0 + t; j++) {
                        size_t ki = kv_index(s, b, j, kvh);
                        real p = (real)exp((double)(s->scale * dot(q + qi, k + ki, d) - row_lse));
                        real ds = p * (dot(dout + qi, v + ki, d) - D) * s->scale;
                        axpy(dq + qi, ds, k + ki, d);
                        axpy(dk + ki, ds, q + qi, d);
                        axpy(dv + ki, p, dout + qi, d);
                    }
                }
}

// moe_route.h — the per-token arithmetic of MoE routing (contracts in ops.h
// moe_route_tokens and src/moe/router.h), written once for every place that computes it:
// the cpu backend's moe_route_tokens (src/ops/cpu/moe.c), the cuda backend's kernel
// (src/ops/cuda/moe.cu, as device code) and the router's statistics and backward on the
// host (src/moe/router.c). All in double; the callers own the scratch arrays (no VLAs
// here, so nvcc can compile it).
#pragma once
#include <math.h>

#include "ops/ops.h"
#include "ops/ops_router.h"

#ifdef __CUDACC__
#define ROUTE_FN static inline __host__ __device__
#else
#define ROUTE_FN static inline
#endif

#define ROUTE_NORMALIZE_EPS 1e-20  // Megatron's epsilon in the sigmoid normalisations

// torch.nn.functional.softplus with beta 1, threshold 20
ROUTE_FN double route_softplus(double x) { return x > 20 ? x : log1p(exp(x)); }
ROUTE_FN double route_sigmoid(double x) { return 1 / (1 + exp(-x)); }

// The elementwise score functions (softmax rows are handled whole).
ROUTE_FN double route_score_of(ScoreFunction f, double logit) {
    if (f == SCORE_SIGMOID) return route_sigmoid(logit);
    return sqrt(route_softplus(logit));  // SCORE_SQRTSOFTPLUS
}

// row (E) of scores in double: softmax over the row, or the elementwise function
ROUTE_FN void route_score_row(double *s, const real *logits, int E, ScoreFunction f) {
    if (f != SCORE_SOFTMAX) {
        for (int e = 0; e < E; e++) s[e] = route_score_of(f, logits[e]);
        return;
    }
    double max = logits[0], sum = 0;
    for (int e = 1; e < E; e++) max = logits[e] > max ? logits[e] : max;
    for (int e = 0; e < E; e++) sum += (s[e] = exp((double)logits[e] - max));
    for (int e = 0; e < E; e++) s[e] /= sum;
}

// ŝ: softmax as is; sigmoid / sqrtsoftplus normalised over the experts
ROUTE_FN void route_aux_score_row(double *aux, const double *s, int E, ScoreFunction f) {
    double norm = 1;
    if (f != SCORE_SOFTMAX) {
        double sum = 0;
        for (int e = 0; e < E; e++) sum += s[e];
        norm = sum + ROUTE_NORMALIZE_EPS;
    }
    for (int e = 0; e < E; e++) aux[e] = s[e] / norm;
}

// Whether e is one of idx[0, j).
ROUTE_FN int route_picked(const int32_t *idx, int j, int e) {
    for (int i = 0; i < j; i++)
        if (idx[i] == e) return 1;
    return 0;
}

// The experts route_topk keeps a bit of when they are picked (up to this many, in 128 bytes):
// more are looked up in the picks so far.
enum { ROUTE_PICKED_BITS = 1024 };

// The k largest of values (E) among allowed ones (NULL: all), descending, lowest index
// on ties; −1 where fewer than k are allowed. Round j takes the first allowed expert not
// picked yet and then each later one whose value is larger (so a NaN value is passed over
// unless it comes first).
ROUTE_FN void route_topk(int32_t *idx, const double *values, const unsigned char *allowed, int E, int k) {
    uint64_t picked[ROUTE_PICKED_BITS / 64] = {0};
    int bits = E <= ROUTE_PICKED_BITS;
    for (int j = 0; j < k; j++) {
        int best = -1;
        double best_value = 0;  // values[best]
        for (int e = 0; e < E; e++) {
            if (allowed && !allowed[e]) continue;
            if (bits ? (picked[e / 64] >> (e % 64)) & 1 : route_picked(idx, j, e)) continue;
            if (best < 0 || values[e] > best_value) best = e, best_value = values[e];
        }
        idx[j] = best;
        if (bits && best >= 0) picked[best / 64] |= (uint64_t)1 << (best % 64);
    }
}

// Allow only the experts (allowed (E): 1 or 0) of the group_topk best of num_groups
// groups; a group's score is the sum of its top k/group_topk values, in selection order.
// Scratch: group_score (num_groups), top (k/group_topk), best_groups (group_topk).
ROUTE_FN void route_group_limit(unsigned char *allowed, const double *values, const RouteShape *r,
                                double *group_score, int32_t *top, int32_t *best_groups) {
    int E = r->E, G = r->num_groups, size = E / G, per_group = r->k / r->group_topk;
    for (int g = 0; g < G; g++) {
        route_topk(top, values + g * size, NULL, size, per_group);
        group_score[g] = 0;
        for (int i = 0; i < per_group; i++) group_score[g] += values[g * size + top[i]];
    }
    route_topk(best_groups, group_score, NULL, G, r->group_topk);
    for (int e = 0; e < E; e++) allowed[e] = 0;
    for (int i = 0; i < r->group_topk; i++)
        for (int e = best_groups[i] * size; e < (best_groups[i] + 1) * size; e++) allowed[e] = 1;
}

// probs (k) of one token's chosen experts idx (k): softmax-post: softmax over the chosen
// logits; otherwise the chosen scores s, divided by their sum + eps for sigmoid /
// sqrtsoftplus when k > 1; then × topk_scaling. Scratch: p (k).
ROUTE_FN void route_probs(real *probs, const int32_t *idx, const real *logits, const double *s, const RouteShape *r,
                          double *p) {
    int k = r->k;
    double scale = r->topk_scaling > 0 ? r->topk_scaling : 1;
    if (r->score == SCORE_SOFTMAX && !r->pre_softmax) {  // softmax over the selected logits
        double max = logits[idx[0]], sum = 0;
        for (int j = 1; j < k; j++) max = logits[idx[j]] > max ? logits[idx[j]] : max;
        for (int j = 0; j < k; j++) sum += (p[j] = exp((double)logits[idx[j]] - max));
        for (int j = 0; j < k; j++) p[j] /= sum;
    } else {
        double sum = 0;
        for (int j = 0; j < k; j++) sum += (p[j] = s[idx[j]]);
        if (r->score != SCORE_SOFTMAX && k > 1)
            for (int j = 0; j < k; j++) p[j] /= sum + ROUTE_NORMALIZE_EPS;
    }
    for (int j = 0; j < k; j++) probs[j] = (real)(p[j] * scale);
}

// The value top-k selects expert e on: the logit (softmax), its softmax (pre-softmax),
// or the score plus the expert bias (sigmoid / sqrtsoftplus).
ROUTE_FN double route_select_value(const RouteShape *r, const real *logits, const double *s, const real *bias,
                                   int e) {
    if (r->score == SCORE_SOFTMAX) return r->pre_softmax ? s[e] : logits[e];
    return s[e] + (bias ? bias[e] : 0);
}

// ---- Sinkhorn routing (ops_router.h moe_router_sinkhorn) ------------------------------------------

#define ROUTE_SINKHORN_EPS 1e-8       // Megatron-Core's epsilon in the scale updates
#define ROUTE_SINKHORN_TOL 1e-4       // its tolerance on the mean change of d1
#define ROUTE_SINKHORN_MAX_ROUNDS 1000  // a bound Megatron-Core does not have (it loops until converged)

// One scale of a Sinkhorn round: (1/count) / (sum + eps).
ROUTE_FN double route_sinkhorn_scale(double sum, int count) { return (1.0 / count) / (sum + ROUTE_SINKHORN_EPS); }

// Whether the round that changed d1 by diff (E), summed in order, has converged.
ROUTE_FN int route_sinkhorn_converged(const double *diff, int E) {
    double sum = 0;
    for (int e = 0; e < E; e++) sum += diff[e];
    return !(sum / E > ROUTE_SINKHORN_TOL);
}

// ---- quantile balancing (ops_router.h moe_router_quantile) ----------------------------------------

// One token's picks (k) of v_e = l_e − beta_e (in float), lowest index on ties; returns its
// (k+1)-th largest v, the best expert not picked. Scratch: v (E).
ROUTE_FN float route_quantile_token(int32_t *idx, const real *l, const real *beta, int E, int k, double *v) {
    for (int e = 0; e < E; e++) v[e] = (double)((float)l[e] - (float)beta[e]);
    route_topk(idx, v, NULL, E, k);
    int next = -1;
    for (int e = 0; e < E; e++) {
        int taken = 0;
        for (int j = 0; j < k && !taken; j++) taken = idx[j] == e;
        if (!taken && (next < 0 || v[e] > v[next])) next = e;
    }
    return (float)v[next];
}

// The (rank+1)-th largest of x (n floats, 0 ≤ rank < n), x reordered: a deterministic
// quickselect (its value is the same whatever the pivots).
ROUTE_FN float route_select_descending(float *x, int n, int rank) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = x[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (x[i] > pivot) i++;
            while (x[j] < pivot) j--;
            if (i <= j) {
                float t = x[i];
                x[i] = x[j];
                x[j] = t;
                i++;
                j--;
            }
        }
        if (rank <= j) hi = j;
        else if (rank >= i) lo = i;
        else return x[rank];
    }
    return x[rank];
}

// ---- router statistics and backward ------------------------------------------------------------

// logsumexp of one token's logits (E), in double
ROUTE_FN double route_row_lse(const real *l, int E) {
    double max = l[0], sum = 0;
    for (int e = 1; e < E; e++) max = l[e] > max ? l[e] : max;
    for (int e = 0; e < E; e++) sum += exp((double)l[e] - max);
    return max + log(sum);
}

// d score / d logit for the elementwise score functions, given the score s
ROUTE_FN double route_score_slope(ScoreFunction f, double logit, double s) {
    if (f == SCORE_SIGMOID) return s * (1 - s);
    double dsoftplus = logit > 20 ? 1 : route_sigmoid(logit);
    return s > 0 ? dsoftplus / (2 * s) : 0;
}

// d(probs)/d(selected scores or logits) of one token: accumulate into dsel (E) for the
// selected experts idx (k); dp_row (k) the probs' gradient, kept (k) 0 for dropped choices,
// l (E) the logits, s (E) the scores. Scratch: dp (k), q (k).
ROUTE_FN void route_probs_backward(double *dsel, const real *dp_row, const int32_t *kept, const int32_t *idx,
                                   const real *l, const double *s, const RouteShape *r, double *dp, double *q) {
    int k = r->k;
    double scale = r->topk_scaling > 0 ? r->topk_scaling : 1;
    for (int j = 0; j < k; j++) dp[j] = kept[j] ? scale * dp_row[j] : 0;  // dropped probs are 0
    if (r->score == SCORE_SOFTMAX && !r->pre_softmax) {  // q = softmax of the selected logits
        double max = l[idx[0]], sum = 0, dot = 0;
        for (int j = 1; j < k; j++) max = l[idx[j]] > max ? l[idx[j]] : max;
        for (int j = 0; j < k; j++) sum += (q[j] = exp((double)l[idx[j]] - max));
        for (int j = 0; j < k; j++) dot += (q[j] /= sum) * dp[j];
        for (int j = 0; j < k; j++) dsel[idx[j]] += q[j] * (dp[j] - dot);  // into the logits directly
        return;
    }
    if (r->score != SCORE_SOFTMAX && k > 1) {  // p_j = u_j / (U + eps)
        double U = 0, dot = 0;
        for (int j = 0; j < k; j++) U += s[idx[j]];
        double norm = U + ROUTE_NORMALIZE_EPS;
        for (int j = 0; j < k; j++) dot += dp[j] * s[idx[j]];
        for (int j = 0; j < k; j++) dsel[idx[j]] += dp[j] / norm - dot / (norm * norm);
        return;
    }
    for (int j = 0; j < k; j++) dsel[idx[j]] += dp[j];
}

// dl (E) = d(objective)/d(logits) of one token (contract: ops_router.h moe_router_backward):
// the probs' gradient dp_row (k), the balance losses' gradient on ŝ from the counts, the
// z-loss. seq_counts_row (E): the counts of the token's sequence.
// Scratch: s, ds, g (E each), dp, q (k each).
ROUTE_FN void route_backward_token(double *dl, const real *l, const real *dp_row, const int32_t *kept,
                                   const int32_t *idx, const int32_t *aux_counts, const double *global_counts,
                                   const int32_t *seq_counts_row, const RouterGradShape *g, double *s, double *ds,
                                   double *grad, double *dp, double *q) {
    const RouteShape *r = &g->route;
    int E = r->E;
    route_score_row(s, l, E, r->score);
    for (int e = 0; e < E; e++) dl[e] = ds[e] = 0;
    // probs: softmax-post lands on the logits, the others on the scores
    int post = r->score == SCORE_SOFTMAX && !r->pre_softmax;
    route_probs_backward(post ? dl : ds, dp_row, kept, idx, l, s, r, dp, q);
    // balance losses: gradient on ŝ, then onto the scores
    for (int e = 0; e < E; e++)
        grad[e] = g->aux * aux_counts[e] + g->global * global_counts[e] + g->seq * seq_counts_row[e];
    if (r->score == SCORE_SOFTMAX) {
        for (int e = 0; e < E; e++) ds[e] += grad[e];  // ŝ = s
    } else {                                           // ŝ = s / (Σ s + eps)
        double sum = 0, dot = 0;
        for (int e = 0; e < E; e++) sum += s[e];
        double norm = sum + ROUTE_NORMALIZE_EPS;
        for (int e = 0; e < E; e++) dot += grad[e] * s[e];
        for (int e = 0; e < E; e++) ds[e] += grad[e] / norm - dot / (norm * norm);
    }
    // scores onto the logits
    if (r->score == SCORE_SOFTMAX) {
        double dot = 0;
        for (int e = 0; e < E; e++) dot += s[e] * ds[e];
        for (int e = 0; e < E; e++) dl[e] += s[e] * (ds[e] - dot);
    } else {
        for (int e = 0; e < E; e++) dl[e] += ds[e] * route_score_slope(r->score, l[e], s[e]);
    }
    // z-loss: d/dl (lse²) = 2·lse·softmax(l)
    if (g->z_factor != 0) {
        double lse = route_row_lse(l, E);
        for (int e = 0; e < E; e++) dl[e] += g->z_factor * lse * exp((double)l[e] - lse);
    }
}

// The sequence of this member's token n: its global index (token_index[n], or token_first + n) / seq_length.
ROUTE_FN int route_sequence_of(const int32_t *token_index, int token_first, int seq_length, int n) {
    return (token_index ? token_index[n] : token_first + n) / seq_length;
}

// report's balance losses (REPORT_AUX, _SEQ_AUX, _GLOBAL_AUX) from the per-sequence columns of ŝ
// (sequences, E), the counts and the global counts; sums over e, then b, in order.
ROUTE_FN void route_balance_losses(double *report, const double *columns, const int32_t *seq_counts,
                                    const int32_t *aux_counts, const double *global_counts, const RouterLossShape *s) {
    int N = s->tokens, E = s->E, k = s->k, S = s->seq_length, sequences = s->sequences;
    double aux = 0, global = 0, seq = 0;
    for (int e = 0; e < E; e++) {
        double column = 0;
        for (int b = 0; b < sequences; b++) {
            double seq_column = columns[(size_t)b * E + e];
            seq += seq_column * seq_counts[(size_t)b * E + e];
            column += seq_column;
        }
        aux += column * aux_counts[e];
        global += column * global_counts[e];
    }
    report[REPORT_AUX] = aux * E / ((double)k * N * N);
    report[REPORT_GLOBAL_AUX] = global * E / ((double)k * N * N);
    report[REPORT_SEQ_AUX] = seq * E / ((double)k * S * S) / sequences;
}

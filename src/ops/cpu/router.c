// router.c — the cpu backend's router ops (contracts in ops_router.h): capacity, statistics, losses and the router backward.
// OpenMP over tokens; every token's result is computed by one thread in a fixed order.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/cpu_ops.h"
#include "ops/moe_route.h"

void cpu_moe_router_backward(real *dlogits, const real *dprobs, const real *logits, const int32_t *topk_idx,
                             const int32_t *kept, const int32_t *aux_counts, const double *global_counts,
                             const int32_t *seq_counts, const int32_t *token_index, int N,
                             const RouterGradShape *g) {
    int E = g->route.E, k = g->route.k;
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {
        double s[E], dl[E], ds[E], grad[E], dp[k], q[k];
        int b = route_sequence_of(token_index, g->token_first, g->seq_length, n);
        route_backward_token(dl, logits + (size_t)n * E, dprobs + (size_t)n * k, kept + (size_t)n * k,
                             topk_idx + (size_t)n * k, aux_counts, global_counts, seq_counts + (size_t)b * E, g, s,
                             ds, grad, dp, q);
        for (int e = 0; e < E; e++) dlogits[(size_t)n * E + e] = (real)dl[e];
    }
}

// ---- capacity ---------------------------------------------------------------------------------

typedef struct {
    int choice;  // n·k + j
    real prob;
} Candidate;

static int by_prob_then_token(const void *a, const void *b) {
    const Candidate *x = a, *y = b;
    if (x->prob != y->prob) return x->prob > y->prob ? -1 : 1;
    return x->choice < y->choice ? -1 : x->choice > y->choice;
}

void cpu_moe_router_capacity(real *topk_probs, int32_t *kept, const int32_t *topk_idx, int choices, int E,
                             int capacity, int by_position) {
    for (int i = 0; i < choices; i++) kept[i] = 1;
    if (capacity < 0) return;
    Candidate *cand = mt_malloc((size_t)choices * sizeof(Candidate));
    for (int e = 0; e < E; e++) {
        int count = 0;
        for (int i = 0; i < choices; i++)  // in token order
            if (topk_idx[i] == e) cand[count++] = (Candidate){i, topk_probs[i]};
        if (count <= capacity) continue;
        if (!by_position) qsort(cand, count, sizeof(Candidate), by_prob_then_token);
        for (int c = capacity; c < count; c++) {
            kept[cand[c].choice] = 0;
            topk_probs[cand[c].choice] = 0;
        }
    }
    free(cand);
}

// ---- Sinkhorn routing ---------------------------------------------------------------------------

void cpu_moe_router_sinkhorn(int32_t *topk_idx, double *work, const real *logits, int N, int E, int k) {
    double *cost = work, *d0 = cost + (size_t)N * E, *d1 = d0 + N, *diff = d1 + E;
    int parallel = (size_t)N * E > 4096;  // threads only for a matrix worth them
#pragma omp parallel for schedule(static) if (parallel)
    for (size_t i = 0; i < (size_t)N * E; i++) cost[i] = exp((double)logits[i]);
    for (int e = 0; e < E; e++) d1[e] = 1;
    for (int round = 0; round < ROUTE_SINKHORN_MAX_ROUNDS; round++) {
#pragma omp parallel for schedule(static) if (parallel)
        for (int n = 0; n < N; n++) {
            double sum = 0;
            for (int e = 0; e < E; e++) sum += d1[e] * cost[(size_t)n * E + e];
            d0[n] = route_sinkhorn_scale(sum, N);
        }
#pragma omp parallel for schedule(static) if (parallel)
        for (int e = 0; e < E; e++) {
            double sum = 0;
            for (int n = 0; n < N; n++) sum += d0[n] * cost[(size_t)n * E + e];
            double next = route_sinkhorn_scale(sum, E);
            diff[e] = fabs(d1[e] - next);
            d1[e] = next;
        }
        if (route_sinkhorn_converged(diff, E)) break;
    }
#pragma omp parallel for schedule(static) if (parallel)
    for (int n = 0; n < N; n++) {
        double *row = cost + (size_t)n * E;  // becomes the row's values
        for (int e = 0; e < E; e++) row[e] = d1[e] * row[e] * d0[n];
        route_topk(topk_idx + (size_t)n * k, row, NULL, E, k);
    }
}

// ---- quantile balancing -------------------------------------------------------------------------

void cpu_moe_router_quantile(int32_t *topk_idx, real *quantile, double *work, const real *logits, const real *beta,
                             int N, int E, int k) {
    double *rows = work, *threshold = work + (size_t)N * E;  // (N,E) scratch, (N) a_n
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++)
        threshold[n] = route_quantile_token(topk_idx + (size_t)n * k, logits + (size_t)n * E, beta, E, k,
                                            rows + (size_t)n * E);
    if (!quantile || N == 0) return;
    int target = (int)((int64_t)N * k / E);
#pragma omp parallel for schedule(static) if (E > 1)
    for (int e = 0; e < E; e++) {
        float *x = (float *)(rows + (size_t)e * N);  // the column's N values, in floats
        for (int n = 0; n < N; n++) x[n] = (float)logits[(size_t)n * E + e] - (float)threshold[n];
        quantile[e] = (real)route_select_descending(x, N, target);
    }
}

// ---- statistics -------------------------------------------------------------------------------

// Σ_n lse(logits_n)² of the N tokens
static double z_sum(const real *logits, int N, int E) {
    double z = 0;
#pragma omp parallel for schedule(static) reduction(+ : z) if (N > 64)
    for (int n = 0; n < N; n++) {
        double lse = route_row_lse(logits + (size_t)n * E, E);
        z += lse * lse;
    }
    return z;
}

// tokens_per_expert (E) and the dropped choices of the N·k choices
static int64_t count_kept(int32_t *tokens_per_expert, const int32_t *topk_idx, const int32_t *kept, int choices,
                          int E) {
    int64_t dropped = 0;
    memset(tokens_per_expert, 0, E * sizeof(int32_t));
    for (int i = 0; i < choices; i++)
        if (kept[i]) tokens_per_expert[topk_idx[i]]++;
    for (int i = 0; i < choices; i++) dropped += !kept[i];
    return dropped;
}

void cpu_moe_router_statistics(double *z, int64_t *counts, double *columns, int32_t *tokens_per_expert,
                               int64_t *dropped, const real *logits, const real *aux_scores, const int32_t *topk_idx,
                               const int32_t *kept, const int32_t *token_index, int N, const RouterStatShape *s) {
    int E = s->E, k = s->k, sequences = s->sequences;
    *z = z_sum(logits, N, E);
    *dropped = count_kept(tokens_per_expert, topk_idx, kept, N * k, E);
    memset(counts, 0, (size_t)(sequences + 1) * E * sizeof(int64_t));
    memset(columns, 0, (size_t)sequences * E * sizeof(double));
    int32_t *idx = mt_malloc((size_t)MT_MAX(N, 1) * k * sizeof(int32_t));
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {  // top-k of ŝ (in double, as the losses use it), a token per thread
        double sc[E], aux[E];
        route_score_row(sc, logits + (size_t)n * E, E, s->score);
        route_aux_score_row(aux, sc, E, s->score);
        route_topk(idx + (size_t)n * k, aux, NULL, E, k);
    }
    for (int n = 0; n < N; n++) {  // the sums in token order
        int b = route_sequence_of(token_index, s->token_first, s->seq_length, n);
        for (int j = 0; j < k; j++) counts[(size_t)b * E + idx[(size_t)n * k + j]]++;
        for (int e = 0; e < E; e++) columns[(size_t)b * E + e] += aux_scores[(size_t)n * E + e];
    }
    free(idx);
    for (int e = 0; e < E; e++) counts[(size_t)sequences * E + e] = tokens_per_expert[e];
}

void cpu_moe_router_count_totals(int32_t *seq_counts, int32_t *aux_counts, int32_t *group_tokens_per_expert,
                                 int64_t *group_counts64, const int64_t *counts, int sequences, int E) {
    memset(aux_counts, 0, E * sizeof(int32_t));
    for (int b = 0; b < sequences; b++)
        for (int e = 0; e < E; e++) {
            seq_counts[b * E + e] = (int32_t)counts[(size_t)b * E + e];
            aux_counts[e] += (int32_t)counts[(size_t)b * E + e];
        }
    if (group_tokens_per_expert)
        for (int e = 0; e < E; e++) group_tokens_per_expert[e] = (int32_t)counts[(size_t)sequences * E + e];
    for (int e = 0; e < E; e++) group_counts64[e] = aux_counts[e];
}

// ---- losses -----------------------------------------------------------------------------------

void cpu_moe_router_losses(double *report, double *group_counts, double *global_counts, const int64_t *group_counts64,
                           const double *before, const double *columns, const int32_t *seq_counts,
                           const int32_t *aux_counts, const double *z, const int64_t *dropped,
                           const int32_t *tokens_per_expert, const int32_t *group_tokens_per_expert,
                           const RouterLossShape *s) {
    int E = s->E;
    for (int e = 0; e < E; e++) {  // running mean over the micro-batches so far, this one included
        group_counts[e] = (double)group_counts64[e];
        global_counts[e] = ((before ? before[e] : 0) + group_counts[e]) / s->batches;
    }
    route_balance_losses(report, columns, seq_counts, aux_counts, global_counts, s);
    report[REPORT_Z_LOSS] = *z / s->tokens;
    report[REPORT_DROPPED] = (double)*dropped;
    double *rows = report + REPORT_FIXED;
    for (int e = 0; e < E; e++) {
        rows[e] = tokens_per_expert[e];
        rows[E + e] = group_tokens_per_expert ? group_tokens_per_expert[e] : 0;
        rows[2 * E + e] = group_counts[e];
    }
}

// ---- router input jitter, shared-expert gate -----------------------------------------------------

void cpu_moe_scale_by(real *y, const real *x, const real *scale, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = x[i] * scale[i];
}

void cpu_moe_gate_sigmoid(real *gate, size_t n) {
    for (size_t i = 0; i < n; i++) gate[i] = 1 / (1 + real_exp(-gate[i]));
}

void cpu_moe_gate_sigmoid_backward(real *dgate, const real *gate, size_t n) {
    for (size_t i = 0; i < n; i++) dgate[i] *= gate[i] * (1 - gate[i]);
}

// ---- expert bias ------------------------------------------------------------------------------

void cpu_moe_expert_bias_update(real *bias, const double *counts, int E, double rate) {
    double mean = 0;
    for (int e = 0; e < E; e++) mean += counts[e];
    mean /= E;
    for (int e = 0; e < E; e++) {
        double offset = mean - counts[e];
        bias[e] += (real)(rate * ((offset > 0) - (offset < 0)));
    }
}

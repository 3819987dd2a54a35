// moe.c — the cpu backend's MoE ops (contracts in ops.h): the router GEMM in double,
// the per-token routing, and the permute / unpermute of token rows. OpenMP over tokens
// (or rows); every token's result is computed by one thread in a fixed order.
#include <string.h>

#include "core/float_formats.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/moe_route.h"

void cpu_moe_router_logits(real *logits, const real *x, const real *W, int N, int H, int E) {
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++)
        for (int e = 0; e < E; e++) {
            double s = 0;
            for (int h = 0; h < H; h++) s += (double)x[(size_t)n * H + h] * W[(size_t)e * H + h];
            logits[(size_t)n * E + e] = (real)s;
        }
}

// ---- routing ----------------------------------------------------------------------------------

// allowed (E) for the experts of the best groups of one token's selection values (E)
static void limit_to_groups(unsigned char *allowed, const double *select, const RouteShape *r) {
    int per_group = r->k / r->group_topk;
    double group_score[r->num_groups];
    int32_t top[per_group > 0 ? per_group : 1], best_groups[r->group_topk];
    route_group_limit(allowed, select, r, group_score, top, best_groups);
}

// Choose the experts of one token and their probs (before capacity).
static void route_token(int32_t *idx, real *probs, const real *logits, const double *s, const real *bias,
                        const RouteShape *r) {
    int E = r->E, k = r->k;
    double p[k];
    if (r->replay) {  // the picks are given
        route_probs(probs, idx, logits, s, r, p);
        return;
    }
    double select[E];  // the values top-k runs on
    for (int e = 0; e < E; e++) select[e] = route_select_value(r, logits, s, bias, e);
    unsigned char allowed[E];
    if (r->num_groups > 0) limit_to_groups(allowed, select, r);
    route_topk(idx, select, r->num_groups > 0 ? allowed : NULL, E, k);
    route_probs(probs, idx, logits, s, r, p);
}

void cpu_moe_route_tokens(real *scores, real *aux_scores, int32_t *topk_idx, real *topk_probs, const real *logits,
                          const real *expert_bias, int N, const RouteShape *r) {
    int E = r->E, k = r->k;
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {
        const real *l = logits + (size_t)n * E;
        double s[E], aux[E];
        route_score_row(s, l, E, r->score);
        route_aux_score_row(aux, s, E, r->score);
        for (int e = 0; e < E; e++) {
            scores[(size_t)n * E + e] = (real)s[e];
            aux_scores[(size_t)n * E + e] = (real)aux[e];
        }
        route_token(topk_idx + (size_t)n * k, topk_probs + (size_t)n * k, l, s, expert_bias, r);
    }
}

// ---- permute / unpermute ---------------------------------------------------------------------

// rows[0, H) stored as `store` <- x[0, H) stored as x_store, or zeros when x is NULL (bf16 to bf16:
// the values themselves, which rounding them again would give)
static void store_row(void *row, Storage store, const void *x, Storage x_store, int H) {
    if (!x) {
        memset(row, 0, H * storage_bytes(store));
    } else if (store == x_store) {
        memcpy(row, x, H * storage_bytes(store));
    } else if (store == STORE_FP32) {  // from bf16: widened
        cpu_bf16_widen_run(row, x, (size_t)H);
    } else {
        cpu_bf16_round_run(row, x, (size_t)H);
    }
}

void cpu_moe_permute(void *rows, Storage rows_store, real *row_values, const void *x, Storage x_store,
                     const real *choice_values, const int32_t *token_of_row, const int32_t *row_of_choice, int R,
                     int k, int H) {
#pragma omp parallel for schedule(static) if (R > 64)
    for (int row = 0; row < R; row++) {
        int n = token_of_row[row];
        void *r = storage_at(rows, rows_store, (size_t)row * H);
        if (n < 0) {  // padding
            store_row(r, rows_store, NULL, x_store, H);
            if (row_values) row_values[row] = 0;
            continue;
        }
        store_row(r, rows_store, storage_at_const(x, x_store, (size_t)n * H), x_store, H);
        if (!row_values) continue;
        row_values[row] = 0;  // an aligned plan's padding row: the token, no choice
        for (int j = 0; j < k; j++)
            if (row_of_choice[n * k + j] == row) row_values[row] = choice_values[n * k + j];
    }
}

// out (N,H) (+)= Σ_j rows[row_of_choice[n·k + j]], choices in order
static void combine_rows(real *out, const real *rows, const int32_t *row_of_choice, int N, int k, int H,
                         int accumulate) {
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {
        real *o = out + (size_t)n * H;
        if (!accumulate) memset(o, 0, H * sizeof(real));
        for (int j = 0; j < k; j++) {
            int row = row_of_choice[n * k + j];
            if (row < 0) continue;  // dropped
            const real *r = rows + (size_t)row * H;
            for (int h = 0; h < H; h++) o[h] += r[h];
        }
    }
}

void cpu_moe_unpermute(real *out, real *choice_values, const real *rows, const real *row_values,
                       const int32_t *row_of_choice, int N, int k, int H, int accumulate) {
    if (out) combine_rows(out, rows, row_of_choice, N, k, H, accumulate);
    if (!choice_values) return;
    for (int i = 0; i < N * k; i++) {
        int row = row_of_choice[i];
        choice_values[i] = row < 0 ? 0 : row_values[row];
    }
}

#include "moe/dispatcher.h"

#include <string.h>

void dispatch_plan(DispatchPlan *plan, const int32_t *topk_idx) {
    int N = plan->N, k = plan->k, E = plan->E;
    memset(plan->tokens_per_expert, 0, E * sizeof(int32_t));
    for (int i = 0; i < N * k; i++) plan->tokens_per_expert[topk_idx[i]]++;
    plan->expert_offsets[0] = 0;
    for (int e = 0; e < E; e++)
        plan->expert_offsets[e + 1] = plan->expert_offsets[e] + plan->tokens_per_expert[e];
    // Counting sort: walking (token, choice) in order keeps token order within an expert.
    int32_t *next_row = mt_malloc(E * sizeof(int32_t));
    memcpy(next_row, plan->expert_offsets, E * sizeof(int32_t));
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            int row = next_row[topk_idx[n * k + j]]++;
            plan->row_of_choice[n * k + j] = row;
            plan->token_of_row[row] = n;
        }
    free(next_row);
}

void dispatch_forward(real *rows, real *row_values, const real *x, const real *choice_values,
                      const DispatchPlan *plan, int H) {
    int N = plan->N, k = plan->k;
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            int row = plan->row_of_choice[n * k + j];
            memcpy(rows + (size_t)row * H, x + (size_t)n * H, H * sizeof(real));
            if (row_values) row_values[row] = choice_values[n * k + j];
        }
}

void combine_forward(real *out, const real *rows, const DispatchPlan *plan, int H, int accumulate) {
    int N = plan->N, k = plan->k;
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {
        real *o = out + (size_t)n * H;
        if (!accumulate) memset(o, 0, H * sizeof(real));
        for (int j = 0; j < k; j++) {
            const real *r = rows + (size_t)plan->row_of_choice[n * k + j] * H;
            for (int h = 0; h < H; h++) o[h] += r[h];
        }
    }
}

void gather_choice_values(real *choice_values, const real *row_values, const DispatchPlan *plan) {
    for (int i = 0; i < plan->N * plan->k; i++) choice_values[i] = row_values[plan->row_of_choice[i]];
}

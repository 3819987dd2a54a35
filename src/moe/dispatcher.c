#include "moe/dispatcher.h"

#include <math.h>
#include <string.h>

#include "core/profile.h"
#include "ops/ops.h"

int dispatch_capacity(int N, int k, int E, double capacity_factor) {
    if (!(capacity_factor > 0)) return 0;
    double capacity = ceil((double)N * k / E * capacity_factor);
    return capacity < N ? (int)capacity : N;
}

size_t dispatch_max_rows(int N, int k, int E, double capacity_factor, int pad_to_capacity) {
    size_t rows = (size_t)N * k;
    if (pad_to_capacity && capacity_factor > 0)
        rows = MT_MAX(rows, (size_t)E * dispatch_capacity(N, k, E, capacity_factor));
    return rows;
}

void dispatch_plan(DispatchPlan *plan, const int32_t *topk_idx, const int32_t *kept, int capacity) {
    PROF_SCOPE(PROF_DISPATCH);
    int N = plan->N, k = plan->k, E = plan->E;
    int32_t *tokens = mt_calloc(E, sizeof(int32_t));
    for (int i = 0; i < N * k; i++)
        if (!kept || kept[i]) tokens[topk_idx[i]]++;
    plan->expert_offsets[0] = 0;
    for (int e = 0; e < E; e++) {
        MT_ASSERT(capacity == 0 || tokens[e] <= capacity);
        plan->rows_per_expert[e] = capacity > 0 ? capacity : tokens[e];
        plan->expert_offsets[e + 1] = plan->expert_offsets[e] + plan->rows_per_expert[e];
    }
    plan->rows = plan->expert_offsets[E];
    // Counting sort: walking (token, choice) in order keeps token order within an expert.
    int32_t *next_row = mt_malloc(E * sizeof(int32_t));
    memcpy(next_row, plan->expert_offsets, E * sizeof(int32_t));
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            int i = n * k + j;
            if (kept && !kept[i]) {
                plan->row_of_choice[i] = -1;
                continue;
            }
            int row = next_row[topk_idx[i]]++;
            plan->row_of_choice[i] = row;
            plan->token_of_row[row] = n;
        }
    for (int e = 0; e < E; e++)  // padding rows
        for (int row = next_row[e]; row < plan->expert_offsets[e + 1]; row++) plan->token_of_row[row] = -1;
    free(next_row);
    free(tokens);
}

void dispatch_forward(real *rows, real *row_values, const real *x, const real *choice_values,
                      const DispatchPlan *plan, int H) {
    PROF_SCOPE(PROF_DISPATCH);
    moe_permute(rows, row_values, x, choice_values, plan->token_of_row, plan->row_of_choice,
                plan->rows, plan->k, H);
}

void combine_forward(real *out, const real *rows, const DispatchPlan *plan, int H, int accumulate) {
    PROF_SCOPE(PROF_DISPATCH);
    moe_unpermute(out, NULL, rows, NULL, plan->row_of_choice, plan->N, plan->k, H, accumulate);
}

void dispatch_backward(real *dx, real *d_choice_values, const real *d_rows, const real *d_row_values,
                       const DispatchPlan *plan, int H) {
    PROF_SCOPE(PROF_DISPATCH);
    moe_unpermute(dx, d_choice_values, d_rows, d_row_values, plan->row_of_choice, plan->N, plan->k, H, 0);
}

void gather_choice_values(real *choice_values, const real *row_values, const DispatchPlan *plan) {
    PROF_SCOPE(PROF_DISPATCH);
    moe_unpermute(NULL, choice_values, NULL, row_values, plan->row_of_choice, plan->N, plan->k, 0, 0);
}

#include "moe/dispatcher.h"

#include <math.h>
#include <string.h>

#include "core/profile.h"

size_t dispatch_max_rows(int N, int k, int E, double capacity_factor, int pad_to_capacity) {
    size_t rows = (size_t)N * k;
    if (pad_to_capacity && capacity_factor > 0) {
        size_t capacity = (size_t)ceil((double)N * k / E * capacity_factor);
        if (capacity > (size_t)N) capacity = N;
        rows = MT_MAX(rows, (size_t)E * capacity);
    }
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
    int total = plan->expert_offsets[plan->E], k = plan->k;
#pragma omp parallel for schedule(static) if (total > 64)
    for (int row = 0; row < total; row++) {
        int n = plan->token_of_row[row];
        real *r = rows + (size_t)row * H;
        if (n < 0) {  // padding
            memset(r, 0, H * sizeof(real));
            if (row_values) row_values[row] = 0;
            continue;
        }
        memcpy(r, x + (size_t)n * H, H * sizeof(real));
        if (!row_values) continue;
        for (int j = 0; j < k; j++)
            if (plan->row_of_choice[n * k + j] == row) row_values[row] = choice_values[n * k + j];
    }
}

void combine_forward(real *out, const real *rows, const DispatchPlan *plan, int H, int accumulate) {
    PROF_SCOPE(PROF_DISPATCH);
    int N = plan->N, k = plan->k;
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {
        real *o = out + (size_t)n * H;
        if (!accumulate) memset(o, 0, H * sizeof(real));
        for (int j = 0; j < k; j++) {
            int row = plan->row_of_choice[n * k + j];
            if (row < 0) continue;  // dropped
            const real *r = rows + (size_t)row * H;
            for (int h = 0; h < H; h++) o[h] += r[h];
        }
    }
}

void gather_choice_values(real *choice_values, const real *row_values, const DispatchPlan *plan) {
    PROF_SCOPE(PROF_DISPATCH);
    for (int i = 0; i < plan->N * plan->k; i++) {
        int row = plan->row_of_choice[i];
        choice_values[i] = row < 0 ? 0 : row_values[row];
    }
}

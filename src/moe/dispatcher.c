#include "moe/dispatcher.h"

#include <math.h>

#include "core/device.h"
#include "core/profile.h"
#include "ops/ops.h"
#include "ops/ops_dispatch.h"

int dispatch_capacity(int N, int k, int E, double capacity_factor) {
    if (!(capacity_factor > 0)) return 0;
    double capacity = ceil((double)N * k / E * capacity_factor);
    return capacity < N ? (int)capacity : N;
}

size_t dispatch_max_rows(int N, int k, int E, double capacity_factor, int pad_to_capacity, int align) {
    size_t rows = (size_t)N * k;
    if (pad_to_capacity && capacity_factor > 0)
        rows = MT_MAX(rows, (size_t)E * dispatch_capacity(N, k, E, capacity_factor));
    if (align > 1) rows = MT_MIN(rows + (size_t)E * (align - 1), (size_t)E * N);
    return rows;
}

// The plan's rows per expert on the host: capacity each when padded (nothing to ask the
// device), the caller's host copy of the kept choices when it has one (rounded up when
// aligned), else the layer pass's one download of the plan (4·E bytes).
static void plan_host_rows(DispatchPlan *plan, int capacity, const double *known_rows) {
    int E = plan->E;
    if (!plan->host_rows_per_expert) plan->host_rows_per_expert = mt_calloc(E, sizeof(int32_t));
    int32_t *host_rows = plan->host_rows_per_expert;
    if (capacity > 0)
        for (int e = 0; e < E; e++) host_rows[e] = capacity;
    else if (known_rows && plan->align > 1)
        for (int e = 0; e < E; e++) host_rows[e] = dispatch_aligned_rows((int)known_rows[e], plan->N, plan->align);
    else if (known_rows)
        for (int e = 0; e < E; e++) host_rows[e] = (int32_t)known_rows[e];
    else
        device_download(host_rows, plan->rows_per_expert, (size_t)E * sizeof(int32_t));
    int rows = 0;
    for (int e = 0; e < E; e++) rows += host_rows[e];
    plan->rows = rows;
}

void dispatch_plan_known(DispatchPlan *plan, const int32_t *topk_idx, const int32_t *kept, int capacity,
                         const double *known_rows) {
    PROF_SCOPE(PROF_DISPATCH);
    moe_dispatch_plan(plan->rows_per_expert, plan->expert_offsets, plan->row_of_choice, plan->token_of_row, topk_idx,
                      kept, plan->N, plan->k, plan->E, capacity, plan->align);
    plan_host_rows(plan, capacity, known_rows);
}

void dispatch_plan(DispatchPlan *plan, const int32_t *topk_idx, const int32_t *kept, int capacity) {
    dispatch_plan_known(plan, topk_idx, kept, capacity, NULL);
}

void dispatch_plan_free(DispatchPlan *plan) {
    free(plan->host_rows_per_expert);
    plan->host_rows_per_expert = NULL;
}

void dispatch_forward(void *rows, Storage rows_store, real *row_values, const void *x, Storage x_store,
                      const real *choice_values, const DispatchPlan *plan, int H) {
    PROF_SCOPE(PROF_DISPATCH);
    moe_permute(rows, rows_store, row_values, x, x_store, choice_values, plan->token_of_row, plan->row_of_choice,
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

// dispatcher.h — moving tokens to their experts and back (single rank: permute only).
//
// Permute: the (token, choice) pairs are stably sorted by expert, so each expert's rows
// are contiguous and in token order inside the expert ("expert-major"). Combine is the
// exact reverse: token n's output is the sum of its k rows, added in choice order, which
// makes the result independent of threading. The backward of dispatch is a combine and
// the backward of combine is a dispatch. An expert-parallel dispatcher adds the
// exchange of counts and rows between these two steps.
#pragma once
#include "core/common.h"

typedef struct {
    int N, k, E;
    int32_t *tokens_per_expert;  // (E)
    int32_t *expert_offsets;     // (E+1) first row of each expert; [E] = N·k
    int32_t *row_of_choice;      // (N·k) row that holds token n's j-th choice
    int32_t *token_of_row;       // (N·k) inverse: the token a row came from
} DispatchPlan;

// topk_idx (N,k) -> plan (buffers preallocated by the caller)
void dispatch_plan(DispatchPlan *plan, const int32_t *topk_idx);
// x (N,H) -> rows (N·k,H);  per-choice values (N,k) -> per-row values (N·k) when non-NULL
void dispatch_forward(real *rows, real *row_values, const real *x, const real *choice_values,
                      const DispatchPlan *plan, int H);
// rows (N·k,H) -> out (N,H): out[n] = Σ_j rows[row_of_choice[n,j]]; accumulate: += instead of =
void combine_forward(real *out, const real *rows, const DispatchPlan *plan, int H, int accumulate);
// per-row values (N·k) -> per-choice values (N,k)
void gather_choice_values(real *choice_values, const real *row_values, const DispatchPlan *plan);

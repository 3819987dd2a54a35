// dispatcher.h — moving tokens to their experts and back (single rank: permute only).
//
// Permute: the kept (token, choice) pairs are stably sorted by expert, so each expert's
// rows are contiguous and in token order inside the expert ("expert-major"). Dropped
// choices (capacity) get no row. With padding to capacity every expert gets exactly
// `capacity` rows; the rows past its tokens are zero with prob 0 and contribute nothing.
// Aligned (--moe-router-padding-for-quantization, Megatron's pad_routing_map) each expert's
// rows are rounded up to a multiple of `align` with the first tokens that did not choose
// it: rows of real tokens with prob 0, which no choice points at, so they contribute
// nothing either (their rows only change what a quantizer's blocks and amaxes see).
// Combine is the exact reverse: token n's output is the sum of its rows, added in choice
// order, which makes the result independent of threading. The backward of dispatch is a
// combine and the backward of combine is a dispatch. An expert-parallel dispatcher adds
// the exchange of counts and rows between these two steps.
#pragma once
#include "core/common.h"
#include "ops/gemm.h"

typedef struct {
    int N, k, E;
    int32_t *rows_per_expert;    // (E) rows of each expert's segment (padding included)
    int32_t *expert_offsets;     // (E+1) first row of each expert; [E] = total rows
    int32_t *row_of_choice;      // (N·k) row that holds token n's j-th choice; -1 when dropped
    int32_t *token_of_row;       // (rows) the token a row came from; -1 for padding
    int rows;                    // rows of the plan (padding included): a host integer
    int32_t *host_rows_per_expert;  // (E) host memory: rows_per_expert, the layer pass's one
                                    // download of the plan (dispatch_plan allocates it)
    int align;                   // > 1: each expert's rows rounded up to a multiple of it (aligned)
} DispatchPlan;

// Rows an expert keeps under a capacity factor (0 = dropless: returns 0): ceil(k·N/E · factor),
// at most N. Computed in double and clamped before the conversion, so any factor is safe.
int dispatch_capacity(int N, int k, int E, double capacity_factor);
// Largest number of rows a plan can have: N·k, or E·capacity when padding; aligned
// (align > 1) up to align − 1 more per expert, at most N per expert.
size_t dispatch_max_rows(int N, int k, int E, double capacity_factor, int pad_to_capacity, int align);

// topk_idx (N,k), kept (N,k) or NULL (all kept), capacity > 0 to pad every expert to it
// (not with plan->align > 1)
void dispatch_plan(DispatchPlan *plan, const int32_t *topk_idx, const int32_t *kept, int capacity);
// The same when the host already knows each expert's kept choices (known_rows (E), integers as
// doubles: the router's downloaded tokens_per_expert of these N tokens): no download.
void dispatch_plan_known(DispatchPlan *plan, const int32_t *topk_idx, const int32_t *kept, int capacity,
                         const double *known_rows);
// Frees the plan's host memory (host_rows_per_expert); its tensor memory is the caller's.
void dispatch_plan_free(DispatchPlan *plan);
// The plan is the moe_dispatch_plan op (ops_dispatch.h); without capacity padding or known
// rows, its rows per expert come back to the host in one 4·E-byte download (plan->rows). The data movement runs as ops
// too (moe_permute / moe_unpermute in ops.h, kernels on a GPU).
// x (N,H) stored as x_store -> rows (rows,H) stored as rows_store (ops/gemm.h);  per-choice
// values (N,k) -> per-row values (rows) when non-NULL
void dispatch_forward(void *rows, Storage rows_store, real *row_values, const void *x, Storage x_store,
                      const real *choice_values, const DispatchPlan *plan, int H);
// rows (rows,H) -> out (N,H): out[n] = Σ_j rows[row_of_choice[n,j]]; accumulate: += instead of =
void combine_forward(real *out, const real *rows, const DispatchPlan *plan, int H, int accumulate);
// The backward of dispatch_forward: d_rows (rows,H) -> dx (N,H) overwritten (a combine), and
// d_row_values (rows) -> d_choice_values (N,k), 0 for dropped choices.
void dispatch_backward(real *dx, real *d_choice_values, const real *d_rows, const real *d_row_values,
                       const DispatchPlan *plan, int H);
// per-row values (rows) -> per-choice values (N,k); 0 for dropped choices
void gather_choice_values(real *choice_values, const real *row_values, const DispatchPlan *plan);

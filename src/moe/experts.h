// experts.h — SwiGLU experts over expert-major rows: per projection, one GEMM per
// expert over that expert's contiguous rows (a grouped GEMM).
//
// Expert e owns its contiguous rows of the permuted input (ExpertShape) and computes
//   gate = x·W_gateᵀ, up = x·W_upᵀ        (rows, I)
//   act  = silu(gate) · up · p             p = routing prob of the row (1 for dense)
//   out  = act·W_downᵀ                     (rows, H)
// The prob multiplies after the activation and before the down projection, as in
// Megatron-Core. A dense SwiGLU MLP is this with one group and no probs.
#pragma once
#include "core/common.h"
#include "ops/gemm.h"

struct QuantLinear;

typedef struct {
    real **gate, **up, **down;  // per group: (I,H), (I,H), (H,I)
    // per group, each projection's FP8 / FP4 quantizers (ops/quantized_linear.h); NULL arrays
    // when the recipe is off or leaves the layer in high precision
    struct QuantLinear **quant_gate, **quant_up, **quant_down;
} ExpertWeights;

// The rows of a call, in one of two forms:
//   * routed experts: counts (groups) in tensor memory, the rows of each group, the groups
//     back to back from row 0, `rows` of them in all (a host integer: the host sizes the
//     activations by it, never reads counts);
//     The weights of one kind (ExpertWeights) must be one block: group g's at a fixed stride.
//   * a shape the host knows (counts NULL: a dense FFN, tests): group g owns rows
//     offsets[g] .. offsets[g+1] (host memory), one GEMM per group.
typedef struct {
    int groups, H, I;
    const int32_t *offsets;  // (groups+1) host row ranges (counts NULL)
    const int32_t *counts;   // (groups) tensor memory: rows of each group, or NULL
    const int32_t *host_counts;  // (groups) host memory: the same counts as downloaded with the
                                 // layer pass's dispatch sizes, or NULL (mt_gemm_grouped)
    int rows;                // with counts: the rows of all groups
    Storage in_store;        // how the input rows are stored (the routed experts' under --bf16: bf16)
    Storage d_out_store;     // how the output rows' gradients are (the local dispatcher's under --bf16: bf16)
} ExpertShape;

typedef struct {
    real *gate, *up, *act;   // (rows, I) saved for backward
    // how act is stored: STORE_BF16 (--bf16 on the cpu, LayoutPlan.swiglu_act_store) holds it as
    // bf16, the down projection's GEMMs (its only readers) reading the same values
    Storage act_store;
    // how gate and up are stored: STORE_BF16 (LayoutPlan.gate_up_store) keeps the projections'
    // results rounded to bf16, as Megatron's bf16 GEMMs return them; SwiGLU reads those values
    Storage gate_up_store;
    // how the backward keeps their gradients (its scratch_dgate, scratch_dup): STORE_BF16 as act
    // (LayoutPlan.swiglu_act_store: the gate and up GEMMs' data and weight gradients, their only
    // readers, round them so anyway)
    Storage d_gate_up_store;
} ExpertActs;

// rows_in (rows,H; stored as s->in_store), row_scale (rows) or NULL -> rows_out (rows,H); fills acts
void experts_forward(real *rows_out, ExpertActs *acts, const real *rows_in,
                     const real *row_scale, const ExpertWeights *w, const ExpertShape *s);
// What experts_forward fills of acts (gate, up, act), the same bits: a recomputation.
void experts_forward_acts(ExpertActs *acts, const real *rows_in, const real *row_scale, const ExpertWeights *w,
                          const ExpertShape *s);
// act (rows, I; stored as acts->act_store) = experts_forward's act again, from the saved gate and up.
void experts_recompute_act(real *act, const ExpertActs *acts, const real *row_scale, const ExpertShape *s);

// drows_out (rows,H; stored as s->d_out_store) -> drows_in (rows,H) overwritten, drow_scale (rows) overwritten when
// non-NULL; weight gradients accumulate into dw. scratch: three (rows, I) buffers, the first two
// (the gate and up gradients) stored as acts->d_gate_up_store.
void experts_backward(real *drows_in, real *drow_scale, const ExpertWeights *dw,
                      const real *drows_out, const ExpertActs *acts, const real *rows_in,
                      const real *row_scale, const ExpertWeights *w, const ExpertShape *s,
                      real *scratch_dgate, real *scratch_dup, real *scratch_dact);
// experts_backward in two halves (--delay-wgrad-compute runs the second while the input
// gradients travel): the data gradients (drows_in, drow_scale; scratch_dgate and
// scratch_dup keep what the second half reads), then the weight gradients into dw. The same
// values as experts_backward, bit for bit.
void experts_backward_data(real *drows_in, real *drow_scale, const real *drows_out, const ExpertActs *acts,
                           const real *row_scale, const ExpertWeights *w, const ExpertShape *s,
                           real *scratch_dgate, real *scratch_dup, real *scratch_dact);
void experts_backward_weights(const ExpertWeights *dw, const real *drows_out, const ExpertActs *acts,
                              const real *rows_in, const ExpertShape *s, const real *scratch_dgate,
                              const real *scratch_dup);

// The rows a rank's experts compute in one MoE layer, as a token dispatcher hands them over
// (moe/token_dispatcher.h): the inputs and probs, where the outputs go, the saved
// activations and the grouping; for backward, the gradient buffers the dispatcher's
// combine_backward fills (d_rows_out) or reads back (d_rows_in, d_row_probs).
typedef struct {
    const real *rows_in, *row_probs;  // (rows,H), (rows)
    real *rows_out;                   // (rows,H)
    ExpertActs *acts;                 // (rows,I) each
    ExpertShape shape;
    real *d_rows_out, *d_rows_in, *d_row_probs;   // (rows,H), (rows,H), (rows)
    real *scratch_gate, *scratch_up, *scratch_act;  // (rows,I) each
} ExpertRows;

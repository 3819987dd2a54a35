// token_dispatcher.h — how the tokens of a MoE layer reach the experts and come back, as
// a table of phases (Megatron-Core's route -> dispatch -> experts -> combine): a
// dispatcher moves rows, it never calls the experts; the model's MoE block
// (model/moe_block.c) runs them between dispatch and combine on the ExpertRows the
// dispatcher hands over.
//
//   local      every expert here: permute (dispatch_forward), unpermute (combine_forward)
//   alltoall   expert parallelism: the permuted rows travel to the rank of their expert
//              and back (moe/expert_parallel.h)
//   allgather  expert parallelism by gathering every token of the group (and expert
//              tensor parallelism, whose FFN slices it sums)
#pragma once
#include "moe/expert_parallel.h"

// What a dispatcher needs of the layer's model, built by the caller.
typedef struct {
    int hidden, experts, moe_ffn;  // a row's width (H, or L with latent MoE), E (all of them) and
                                   // I (each expert's FFN on this rank)
    const ExpertParallel *ep;
    struct EpBuffers *buffers;     // the exchange's scratch (expert parallelism), or NULL: one
                                   // set per pass kind (a forward and a backward may overlap)
    int act_shared;                // --recompute-modules moe_act: the experts' SwiGLU product in
                                   // the pass's shared buffer, not kept per layer (the backward
                                   // recomputes it)
    Storage act_store;             // how the experts keep their SwiGLU product (moe/experts.h)
    Storage gate_up_store;         // and their gate and up projections (ExpertActs.gate_up_store)
    Storage rows_store;            // and their input rows (LayoutPlan.expert_rows_store: bf16 rows
                                   // travel to the experts' ranks as stored, H even)
    Storage x_store;               // how the tokens dispatched are stored (a MoE layer's ln2:
                                   // LayerActs.ln2_store; fp32 without a layer, or latent_in)
    int bf16_rows;                 // the rows and their output gradients travel to the experts'
                                   // ranks as bf16 (ops.h bf16_pack): only the experts' bf16-input
                                   // GEMMs read them, so the results are the same bits at half the
                                   // bytes (both dispatchers; H even)
} MoeDispatchContext;

// The backward buffers of the caller a dispatcher fills or hands the experts (rows: the
// most a plan of these N tokens can have).
typedef struct {
    real *d_rows_out, *d_rows_in;  // (rows,H) (H: the context's row width, throughout)
    real *d_row_probs;             // (rows)
    real *d_gate, *d_up, *d_act;   // (rows,I) the experts' scratch
    real *d_x;                     // (N,H) the gradient of the dispatched x
    real *d_choice_probs;          // (N,k) the gradient of the routing probs
} MoeBackwardBuffers;

// Each phase in two halves: the first computes and starts the exchange, the second (NULL:
// none, the first did it all) waits for it and completes the phase; between them the caller
// may compute other work while the rows travel (the alltoall dispatcher without expert
// tensor parallelism leaves its all-to-alls in flight). A phase's results are those of the
// second half's return; the two halves of one phase are called with the same arguments.
typedef struct {
    const char *name;
    // x (N,H) stored as ctx->x_store, ma->route -> rows (the rows this rank's experts compute)
    void (*dispatch)(const MoeDispatchContext *ctx, MoeActs *ma, const void *x, ExpertRows *rows);
    // (NULL: none) a middle step: the alltoall dispatcher's first half leaves the counts in
    // flight, this one waits for them and starts the rows
    void (*dispatch_exchange)(const MoeDispatchContext *ctx, MoeActs *ma);
    void (*dispatch_finish)(const MoeDispatchContext *ctx, MoeActs *ma, ExpertRows *rows);
    // rows->rows_out -> out (N,H) overwritten
    void (*combine)(const MoeDispatchContext *ctx, MoeActs *ma, const ExpertRows *rows, real *out);
    void (*combine_finish)(const MoeDispatchContext *ctx, MoeActs *ma, real *out);
    // d_out (N,H) -> rows->d_rows_out (and the gradient buffers of rows set)
    void (*combine_backward)(const MoeDispatchContext *ctx, MoeActs *ma, const MoeBackwardBuffers *grads,
                             const real *d_out, ExpertRows *rows);
    void (*combine_backward_finish)(const MoeDispatchContext *ctx, MoeActs *ma, ExpertRows *rows);
    // rows->d_rows_in, rows->d_row_probs -> grads->d_x (N,H) overwritten, grads->d_choice_probs (N,k)
    void (*dispatch_backward)(const MoeDispatchContext *ctx, MoeActs *ma, const MoeBackwardBuffers *grads,
                              const ExpertRows *rows);
    void (*dispatch_backward_finish)(const MoeDispatchContext *ctx, MoeActs *ma, const MoeBackwardBuffers *grads);
} TokenDispatcher;

extern const TokenDispatcher TOKEN_DISPATCHER_LOCAL, TOKEN_DISPATCHER_ALLTOALL, TOKEN_DISPATCHER_ALLGATHER;

// The dispatcher of an expert-parallel layout: local on one rank, else
// --moe-token-dispatcher-type (both carry expert tensor parallelism too).
const TokenDispatcher *token_dispatcher_of(const ExpertParallel *ep);

// The gradient buffers a dispatcher's combine_backward hands the experts: d_rows_out (the
// gradient of their outputs), d_rows_in and d_row_probs (where theirs go), three scratch
// buffers of (rows, I).
void expert_rows_set_backward(ExpertRows *rows, real *d_rows_out, real *d_rows_in, real *d_row_probs, real *gate,
                              real *up, real *act);

// The local dispatch of ma->route into ma's rows (the first step of the alltoall one too).
void local_dispatch_rows(const MoeDispatchContext *ctx, MoeActs *ma, const void *x);

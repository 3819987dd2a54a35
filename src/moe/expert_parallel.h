// expert_parallel.h — the routed experts of a MoE layer when they are split over an
// expert-parallel group (ExpertParallel below): each token's rows travel to the rank
// that holds its expert and the results travel back. Routing, the dispatch plan and the
// combine are the single-process ones; only where the expert rows are computed changes.
//
// alltoall (--moe-token-dispatcher-type alltoall, the default):
//   1. the local plan orders rows expert-major over all E experts, so the rows for rank
//      d's experts [d·local, (d+1)·local) are one contiguous segment;
//   2. the counts go first: each rank sends rank d its rows per expert of d;
//   3. the rows and their routing probs follow in one all-to-all-v each, arriving as
//      [source rank][local expert];
//   3b. with expert tensor parallelism (Megatron-Core's order) the ETP ranks, which hold
//      the same experts, all-gather what each received, so the rows arrive as [ETP
//      rank][source rank][local expert] and each rank computes its slice of their FFN;
//      on the way back a reduce-scatter over ETP sums the slices before the all-to-all;
//   4. they are sorted to [local expert][source], so each local expert's rows are
//      contiguous (one grouped GEMM), computed, sorted back and returned the same way.
//   Backward exchanges the output gradients the same way and returns the input and prob
//   gradients by the exact reverse (summed over the ETP slices).
// allgather (--moe-token-dispatcher-type allgather, over the ETP x EP group:
// ExpertParallel.gather):
//   every rank gathers the inputs and routing of the whole group, computes the rows routed
//   to its own experts (with ETP: its slice of their FFN), and a reduce-scatter returns each
//   rank the sums for its tokens (over the experts and the FFN slices).
//   Backward all-gathers the output gradient and reduce-scatters the input and prob
//   gradients.
// Results equal the single-process layer up to float summation order.
#pragma once
#include "moe/moe_acts.h"
#include "parallel/comm.h"

// How tokens reach experts held by other processes (--moe-token-dispatcher-type).
typedef enum { DISPATCH_ALLTOALL, DISPATCH_ALLGATHER } DispatcherType;

// Expert parallelism: the E experts of every MoE layer are split over the members of an
// expert-parallel group in blocks; member r holds experts [first, first + local) with
// local = E / size. Without it (size 1) every expert is here.
typedef struct {
    const Comm *comm;          // the expert-parallel group; NULL when the experts are all here, whole
    int size, rank;
    int local, first;          // local experts and the first one's global index
    DispatcherType dispatcher;
    // Expert tensor parallelism: the ranks holding the other slices of these experts' FFN
    // (NULL without it). Every token's rows must reach every slice, and the slices' partial
    // results are summed.
    const Comm *etp;
    // The group the allgather exchange runs over: the expert-parallel one, or with expert
    // tensor parallelism the ETP x EP group.
    const Comm *gather;        // NULL when the layer's experts are all here, whole
} ExpertParallel;

// The two exchanges are token dispatchers (moe/token_dispatcher.h):
// TOKEN_DISPATCHER_ALLTOALL and TOKEN_DISPATCHER_ALLGATHER, defined here.

// The scratch of the token exchange, shared by the layers of a model, made when tokens
// travel between ranks (ExpertParallel.gather).
struct EpBuffers;
struct EpBuffers *ep_buffers_new(int gradients);  // gradients: a backward pass's (its gradient buffers too)
void ep_buffers_free(struct EpBuffers *b);  // b may be NULL
// Seconds b spent in the token exchange since the last call (and restart the count); 0 for NULL.
double ep_take_comm_seconds(struct EpBuffers *b);
// Seconds b's exchanges were in flight while the caller computed other work, since the last
// call (and restart the count); 0 for NULL.
double ep_take_hidden_seconds(struct EpBuffers *b);
// What one micro-batch asks of the exchange: the sizes every one of its buffers is made for.
typedef struct {
    int tokens;      // N: this rank's tokens at the MoE layer
    int topk;        // k
    int capacity;    // rows per expert when padded to capacity (RouterOutput.capacity), else 0
    int expert_limit;  // rows per expert the capacity factor keeps at most (RouterOutput.expert_limit), 0: dropless
    int align;       // > 1: each source's rows of an expert rounded up to a multiple of it (DispatchPlan.align)
    int hidden, moe_ffn;  // a row's width (H, or the latent width) and each expert's FFN here
    int act_shared;  // --recompute-modules moe_act: the SwiGLU product is the pass's, not the layer's
    Storage act_store;  // how the SwiGLU product is kept (LayoutPlan.swiglu_act_store)
    Storage gate_up_store;  // and the gate and up projections (LayoutPlan.gate_up_store)
} EpExchangeShape;
// The most rows this rank's experts can be sent for one layer: from each of the ETP·EP
// source ranks min(k, local experts) rows per token (a token picks an expert once), at most
// local · the capacity factor's limit, and local · capacity when padded; aligned, up to
// align − 1 more per local expert, at most N each. However unbalanced
// the routing, no more: the row buffers are made this size once (dropless MoE cannot grow
// them step after step).
size_t ep_max_rows(const ExpertParallel *ep, const EpExchangeShape *s);
// Bytes of one layer's exchange state, and of one pass's shared scratch (gradients: a
// backward pass's), for that bound.
double ep_layer_bytes(const ExpertParallel *ep, const EpExchangeShape *s);
double ep_buffers_bytes(const ExpertParallel *ep, const EpExchangeShape *s, int gradients);
// Whether the allgather dispatcher's token gathers of a layer of shape s can move bf16 rows
// (MoeDispatchContext.bf16_rows): the pass's exchange buffer, made for ep_max_rows rows, holds
// the group's packed tokens and this rank's.
int ep_gather_packs_bf16(const ExpertParallel *ep, const EpExchangeShape *s);
// A MoE layer's exchange state (the rows this rank's experts computed, their counts and
// sizes): made on the layer's first exchange, or now by ep_layer_prepare (when several
// layers' MoeActs are to share one: the recompute slots, model/activations.c); ep_layer_free
// frees it (once per state).
void ep_layer_prepare(MoeActs *ma, const ExpertParallel *ep, int experts);
void ep_layer_free(MoeActs *ma);

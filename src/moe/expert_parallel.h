// expert_parallel.h — the routed experts of a MoE layer when they are split over an
// expert-parallel group (model.h ExpertParallel): each token's rows travel to the rank
// that holds its expert and the results travel back. Routing, the dispatch plan and the
// combine are the single-process ones; only where the expert rows are computed changes.
//
// alltoall (--moe-token-dispatcher-type alltoall, the default):
//   1. the local plan orders rows expert-major over all E experts, so the rows for rank
//      d's experts [d·local, (d+1)·local) are one contiguous segment;
//   2. the counts go first: each rank sends rank d its rows per expert of d;
//   3. the rows and their routing probs follow in one all-to-all-v each, arriving as
//      [source rank][local expert];
//   4. they are sorted to [local expert][source rank], so each local expert's rows are
//      contiguous (one grouped GEMM), computed, sorted back and returned the same way.
//   Backward exchanges the output gradients the same way and returns the input and prob
//   gradients by the exact reverse.
// allgather (--moe-token-dispatcher-type allgather, and always with expert tensor
// parallelism, over the ETP x EP group: ExpertParallel.gather):
//   every rank gathers the inputs and routing of the whole group, computes the rows routed
//   to its own experts (with ETP: its slice of their FFN), and a reduce-scatter returns each
//   rank the sums for its tokens (over the experts and the FFN slices).
//   Backward all-gathers the output gradient and reduce-scatters the input and prob
//   gradients.
// Results equal the single-process layer up to float summation order.
#pragma once
#include "model/model.h"

// ma->plan and ma->rows_in / ma->row_probs are the local dispatch; ffn_out (N,H) is
// overwritten with the combined expert outputs.
void ep_alltoall_forward(const Model *m, const LayerParams *lp, MoeActs *ma, real *ffn_out);
// ma->route and x (N,H) (the layer's expert input); ffn_out (N,H) overwritten.
void ep_allgather_forward(const Model *m, const LayerParams *lp, MoeActs *ma, const real *x, real *ffn_out);

// d_out (N,H) -> a->d_norm (N,H) overwritten and a->d_choice_probs (N,k); expert weight
// gradients accumulate into lp->ffn_grads.
void ep_alltoall_backward(const Model *m, const LayerParams *lp, MoeActs *ma, ModelActs *a, const real *d_out);
void ep_allgather_backward(const Model *m, const LayerParams *lp, MoeActs *ma, ModelActs *a, const real *d_out);

// Seconds spent in the token exchange since the last call (and restart the count).
double ep_take_comm_seconds(const Model *m);
void ep_buffers_new(Model *m);  // model_build_ep, when the group has several ranks
void ep_buffers_free(Model *m);
void ep_layer_free(MoeActs *ma);

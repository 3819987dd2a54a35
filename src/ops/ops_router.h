// ops_router.h — the ops of router capacity, counts, balancing statistics/losses and backward: their types and
// contracts (shapes, overwrite vs +=, reduction order); listed in op_list.h (MT_OPS_ROUTER).
// Definitions of the router's quantities: src/moe/router.h; the per-token formulas: ops/moe_route.h.
#pragma once
#include "ops/ops.h"

// ---- router backward ---------------------------------------------------------------------------

// What the router backward needs besides the tensors: the routing, the token group's shape and
// the loss factors (each already × the loss scale).
typedef struct {
    RouteShape route;
    int seq_length;          // tokens per sequence
    int token_first;         // global index of this member's first token (unused with token_index)
    double aux, global, seq; // balance gradient factors: loss_scale·coeff·E/(k·N²), the same, /(k·S²)/sequences
    double z_factor;         // loss_scale · z_loss_coeff · 2 / (N·P)
} RouterGradShape;

// dlogits (N,E) overwritten: the router's gradient on its logits (N,E) for this member's N
// tokens, given dprobs (N,k) (gradient of topk_probs), topk_idx / kept (N,k), and the forward's
// statistics aux_counts (E), global_counts (E, double), seq_counts (sequences, E);
// token_index (N) or NULL names each token's global index (its sequence: index / seq_length).
// Per token: the probs' gradient, the balance losses' gradient on ŝ, the z-loss
// (route_backward_token); all in double, sums in expert order; no cross-token reduction.
void moe_router_backward(real *dlogits, const real *dprobs, const real *logits, const int32_t *topk_idx,
                         const int32_t *kept, const int32_t *aux_counts, const double *global_counts,
                         const int32_t *seq_counts, const int32_t *token_index, int N, const RouterGradShape *g);

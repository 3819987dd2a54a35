// router.h — top-k softmax routing and the switch load-balancing loss.
//
// Given router logits l (N,E) = x·Wrᵀ:
//   default (Megatron's):        (v, I) = topk_k(l);  p = softmax(v) over the k selected
//   --moe-router-pre-softmax:    s = softmax(l);      (p, I) = topk_k(s)   (not renormalised)
// Ties are broken by the lowest expert index. The k choices of a token are kept in
// descending order of probability.
// Switch aux loss (Megatron-Core's switch_load_balancing_loss_func), always on the full
// softmax ŝ = softmax(l) and the token counts c_e of the routing:
//   L = coeff · E / (k·N²) · Σ_e (Σ_x ŝ[x,e]) · c_e
#pragma once
#include "core/common.h"

typedef struct {
    int N, E, k;
    int pre_softmax;
} RouterShape;

typedef struct {
    real *scores;              // (N,E) softmax over all experts
    int32_t *topk_idx;         // (N,k)
    real *topk_probs;          // (N,k)
    int32_t *tokens_per_expert;  // (E)
    double aux_loss;           // L / coeff (the value Megatron logs as load_balancing_loss)
} RouterOutput;

// logits (N,E) -> out (all fields)
void router_forward(RouterOutput *out, const real *logits, const RouterShape *s);
// dprobs (N,k) -> dlogits (N,E) overwritten; adds the aux-loss gradient scaled by
// aux_grad_scale (= coeff × the loss scale of this micro-batch; 0 disables it)
void router_backward(real *dlogits, const real *dprobs, const RouterOutput *out,
                     const RouterShape *s, double aux_grad_scale);

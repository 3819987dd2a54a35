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

// ---- router forward: capacity, statistics, losses ----------------------------------------------

// topk_idx (N,k) overwritten (--moe-router-load-balancing-type sinkhorn, training): each
// token's k experts of largest value in the Sinkhorn normalisation of c = exp(logits) (N,E),
// as Megatron-Core's moe_utils.sinkhorn: d0 = 1 (N), d1 = 1 (E); repeat
//   d0_n = (1/N) / (Σ_e d1_e·c_ne + 1e-8),  d1_e = (1/E) / (Σ_n d0_n·c_ne + 1e-8)
// until mean_e |d1_e − its previous value| ≤ 1e-4 (at most ROUTE_SINKHORN_MAX_ROUNDS rounds);
// values d1_e·c_ne·d0_n, top-k descending, lowest index on ties (route_topk). In double; every
// sum in index order (the error's too), so any backend gives the same rounds.
// work: N·E + N + 2·E doubles of scratch.
void moe_router_sinkhorn(int32_t *topk_idx, double *work, const real *logits, int N, int E, int k);

// Quantile balancing (--moe-router-load-balancing-type quantile_balancing, Megatron-Core's
// dual coordinate descent): topk_idx (N,k) overwritten with each token's k experts of
// largest v_ne = l_ne − beta_e (logits (N,E), beta (E); in float, as Megatron-Core), lowest
// index on ties. quantile (E), unless NULL, overwritten: with a_n the token's (k+1)-th largest
// v_ne (k < E) and C = N·k/E (N·k a multiple of E), quantile_e = the (C+1)-th largest of
// l_ne − a_n over the tokens: the bias that would leave expert e about C tokens (N = 0:
// quantile untouched).
// work: N·E + N doubles of scratch.
void moe_router_quantile(int32_t *topk_idx, real *quantile, double *work, const real *logits, const real *beta, int N,
                         int E, int k);

// kept (choices) overwritten: 1, or 0 for the choices past `capacity` of their expert
// (capacity < 0: all kept); topk_probs (choices) of the dropped choices set to 0, the others
// untouched. The choices n·k + j are in token order; per expert (topk_idx) the kept ones are
// the earliest (by_position) or those of the largest probs, ties by the earliest.
void moe_router_capacity(real *topk_probs, int32_t *kept, const int32_t *topk_idx, int choices, int E, int capacity,
                         int by_position);

// The token group's layout for the statistics: sequences of the micro-batch (all members),
// where this member's tokens lie (token_index, else token_first + n).
typedef struct {
    int E, k;
    ScoreFunction score;
    int sequences, seq_length, token_first;
} RouterStatShape;

// Over this member's N tokens, all overwritten:
//   z (1)                       Σ_n logsumexp(logits_n)², in double, in token order
//   counts (sequences + 1, E)   row b: the top-k of ŝ (from the logits, in double) over the
//                               tokens of sequence b; last row: kept choices per expert
//   columns (sequences, E)      Σ of aux_scores over the tokens of sequence b, in token order
//   tokens_per_expert (E)       kept choices per expert; dropped (1): choices not kept
// token_index (N) or NULL as in moe_router_backward.
void moe_router_statistics(double *z, int64_t *counts, double *columns, int32_t *tokens_per_expert,
                           int64_t *dropped, const real *logits, const real *aux_scores, const int32_t *topk_idx,
                           const int32_t *kept, const int32_t *token_index, int N, const RouterStatShape *s);

// From counts (sequences + 1, E) (summed over the token group), all overwritten:
// seq_counts (sequences, E), aux_counts (E) = Σ_b of the rows, group_tokens_per_expert (E, or
// NULL) = the last row, group_counts64 (E) = aux_counts (for the count group's sum).
void moe_router_count_totals(int32_t *seq_counts, int32_t *aux_counts, int32_t *group_tokens_per_expert,
                             int64_t *group_counts64, const int64_t *counts, int sequences, int E);

// The router's report to the host (doubles): the balance losses (value / coeff) in the
// order of router.h's BalanceType, the z-loss (mean_x lse²), this member's dropped
// choices, then three rows of E: tokens_per_expert, group_tokens_per_expert, group_counts.
enum { REPORT_AUX, REPORT_SEQ_AUX, REPORT_GLOBAL_AUX, REPORT_Z_LOSS, REPORT_DROPPED, REPORT_FIXED };
#define ROUTER_REPORT_DOUBLES(E) (REPORT_FIXED + 3 * (size_t)(E))

typedef struct {
    int E, k;
    int tokens;      // N·P: the micro-batch's tokens over the token group
    int seq_length, sequences;
    int batches;     // micro-batches global_counts averages over (those before + the count group's)
} RouterLossShape;

// Overwritten: group_counts (E) = group_counts64 as doubles; global_counts (E) = (before
// (E, or NULL: 0) + group_counts) / batches; report (ROUTER_REPORT_DOUBLES(E)) as above, from
// columns (sequences, E), seq_counts, aux_counts, z (1), dropped (1), tokens_per_expert and
// group_tokens_per_expert (E, or NULL: 0). The loss sums run over e, then b, in order.
void moe_router_losses(double *report, double *group_counts, double *global_counts, const int64_t *group_counts64,
                       const double *before, const double *columns, const int32_t *seq_counts,
                       const int32_t *aux_counts, const double *z, const int64_t *dropped,
                       const int32_t *tokens_per_expert, const int32_t *group_tokens_per_expert,
                       const RouterLossShape *s);

// ---- router input jitter, shared-expert gate -----------------------------------------------------

// y (n) = x ⊙ scale elementwise (y may be x): the jittered router input, its gradient.
void moe_scale_by(real *y, const real *x, const real *scale, size_t n);
// gate (n) = σ(gate) in place: the shared expert's gate from its logits, 1 / (1 + e^−z).
void moe_gate_sigmoid(real *gate, size_t n);
// dgate (n) *= gate ⊙ (1 − gate): the gradient through the gate's σ (gate: its output).
void moe_gate_sigmoid_backward(real *dgate, const real *gate, size_t n);

// bias (E) += rate · sign(mean(counts) − counts) (Megatron's expert-bias rule); counts (E):
// kept tokens per expert of the step, the mean summed in expert order.
void moe_expert_bias_update(real *bias, const double *counts, int E, double rate);

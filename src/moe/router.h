// router.h — Megatron-Core's top-k router: score functions, group-limited selection,
// expert bias, capacity dropping, load-balancing losses and z-loss (docs/moe.md).
//
// For router logits l (N,E) = x·Wrᵀ of one micro-batch, in order:
//   z-loss        L_z = coeff · mean_x logsumexp(l_x)²
//   scores        softmax (over all E) | sigmoid σ(l) | sqrtsoftplus sqrt(softplus(l))
//   selection     softmax-post: top-k of l; softmax-pre: top-k of softmax(l);
//                 sigmoid/sqrtsoftplus: top-k of s (+ expert bias: selection only)
//                 optionally limited to the best group_topk of num_groups expert groups
//                 (group score: sum of its top k/group_topk selection scores)
//   probs         softmax-post: softmax over the k selected logits; pre: s[I];
//                 sigmoid/sqrtsoftplus: s[I], divided by (Σ s[I] + 1e-20) when k > 1;
//                 then × topk scaling factor
//   capacity      C = ceil(k·N/E · factor); per expert keep the C choices with the largest
//                 prob ("probs") or the earliest tokens ("position"); dropped choices get
//                 prob 0 and no row
//   balance       on aux scores ŝ (softmax(l), or s / (Σ_E s + 1e-20)) and counts c of the
//                 top-k of ŝ, independent of bias, groups and capacity:
//                 aux_loss: coeff·E/(k·N²)·Σ_e c_e Σ_x ŝ[x,e]
//                 seq_aux_loss: the same per sequence (N = its length), averaged over sequences
//                 global_aux_loss: c = running mean of the counts over the micro-batches of
//                 the global batch so far; under data parallelism the micro-batches of
//                 every data-parallel rank so far (the counts are all-reduced per call)
// Token group (sequence / tensor / context parallelism): the N·P tokens of a micro-batch split
// over the P members of RouterCall.token_group, member r holding the contiguous tokens
// [r·N, (r+1)·N) of the flattened b·T + t order (a chunk may start or end inside a sequence),
// or with context parallelism the tokens RouterCall.token_index names. Every statistic
// and loss above is then the one over all N·P tokens, identical on every member and equal to
// what one process computes on them (up to the order of the double sums, which run in rank
// order through comm.h): N in the formulas is N·P, sequences are those of the whole
// micro-batch, capacity is decided on all N·P·k choices (gathered: ids and probs) and the
// counts are summed over the group; each member keeps the per-token outputs of its own N.
// Ties are broken by the lowest expert index (and the earliest token for capacity).
// All router arithmetic after the logits is in double. The per-token part (scores, ŝ,
// selection, probs) runs as the moe_route_tokens op (a kernel on a GPU); capacity, counts
// and losses, which need the whole micro-batch, are the ops of ops_router.h with the token
// group's sums between them; the scalars and counts the host needs come back in one
// download per call (RouterOutput.report).
#pragma once
#include "core/common.h"
#include "ops/ops.h"  // ScoreFunction, RouteShape, moe_route_tokens
#include "ops/ops_router.h"
#include "parallel/comm.h"

typedef enum { BALANCE_AUX, BALANCE_SEQ_AUX, BALANCE_GLOBAL_AUX, BALANCE_TYPES } BalanceType;
typedef enum { DROP_PROBS, DROP_POSITION } DropPolicy;

extern const char *const BALANCE_TYPE_NAMES[BALANCE_TYPES];  // "aux_loss", "seq_aux_loss", ...

typedef struct {
    int E, k;
    ScoreFunction score;
    int pre_softmax;
    double topk_scaling;                 // 0 = none
    int num_groups, group_topk;          // 0 = no group limit
    double capacity_factor;              // 0 = dropless
    DropPolicy drop_policy;
    int pad_to_capacity;
    double balance_coeff[BALANCE_TYPES]; // 0 = that loss is off
    double z_loss_coeff;
    int sinkhorn;                        // training picks the top-k of the Sinkhorn-balanced logits
    int quantile;                        // quantile balancing: picks the top-k of logits − RouterCall.qb_bias
} RouterConfig;

// Per-call inputs besides the logits.
typedef struct {
    int N;                       // tokens of this micro-batch here (with a token group: this member's)
    int seq_length;              // tokens per sequence (the micro-batch's N·P is a multiple), for seq_aux_loss
    const real *expert_bias;     // (E) or NULL
    // global_aux_loss: counts summed over the earlier micro-batches of this global batch,
    // and how many there were (NULL / 0: this micro-batch alone)
    const double *global_counts_before;
    int global_batches_before;
    // global_aux_loss with data parallelism: the group whose ranks run the other
    // micro-batches of this step (NULL: this process alone); the counts are summed over it.
    // With a token group: one member of each token group (their counts are the group's).
    const Comm *count_group;
    // The group the micro-batch's tokens are split over (NULL or size 1: all N are here);
    // every member holds the same N and calls router_forward at the same point.
    const Comm *token_group;
    int token_first;             // global index of this member's first token: rank · N (0 without a group)
    // Context parallelism: the member's tokens are not one contiguous run; token_index (N)
    // holds the global index (b·T + t of the whole micro-batch, increasing) of each one
    // instead (token_first unused). NULL: token_first + n.
    const int32_t *token_index;
    int training;                // a training forward (Sinkhorn routing balances only there)
    // Quantile balancing (RouterConfig.quantile): the bias (E) the picks subtract, and where a
    // training forward writes its quantiles (E), or NULL (evaluation, a recomputed forward).
    const real *qb_bias;
    real *qb_quantile;
    // Router replay: the caller has put the picks in RouterOutput.topk_idx (N, k); the
    // router keeps them and takes their probs from its scores instead of choosing.
    int replay;
} RouterCall;

// N is RouterCall.N (this member's tokens), P the token group's size (1 without one).
typedef struct {
    real *scores;                // (N,E) activation scores: softmax / sigmoid / sqrtsoftplus
    real *aux_scores;            // (N,E) ŝ for the balance losses
    int32_t *topk_idx;           // (N,k) chosen experts, in selection order
    real *topk_probs;            // (N,k) probs after scaling and dropping (0 = dropped)
    int32_t *kept;               // (N,k) 1 = the choice survived the capacity limit
    int32_t *tokens_per_expert;  // (E) kept choices per expert of these N tokens (what the dispatcher sends)
    // (E) or NULL: kept choices per expert over the token group's N·P tokens, the same on every
    // member (tokens_per_expert without a group). The expert-bias counts: sum these over the
    // data-parallel ranks only (one token group each), never over the token group again.
    int32_t *group_tokens_per_expert;
    int32_t *aux_counts;         // (E) top-k counts of ŝ over the micro-batch (all N·P tokens)
    int32_t *seq_counts;         // (N·P/seq_length, E) the same per sequence of the micro-batch
    double *global_counts;       // (E) the counts global_aux_loss used
    double *group_counts;        // (E) aux_counts summed over the count group (global_aux_loss)
    int group_batches;           // micro-batches group_counts covers (the count group's size)
    int capacity;                // rows per expert when padded (from the group's N·P); 0 when dropless
    int expert_limit;            // rows per expert the capacity factor keeps at most, padded or not; 0 when dropless
    int dropped;                 // dropped choices of these N tokens (the group's: sum over it)
    double balance_loss[BALANCE_TYPES];  // L / coeff of each type (computed for all types)
    double z_loss;               // mean_x logsumexp(l_x)² over all N·P tokens  (L_z / coeff)
    // Host memory (allocated by the first router_forward): the call's report, downloaded in
    // one copy (layout: ops_router.h); the host's copies of the counts are read through it.
    double *report;
} RouterOutput;

// Host copies (E each) of the last router_forward's tokens_per_expert, group_tokens_per_expert
// and group_counts (integers as doubles).
static inline const double *router_host_tokens_per_expert(const RouterOutput *o) { return o->report + REPORT_FIXED; }
static inline const double *router_host_group_tokens_per_expert(const RouterOutput *o, int E) {
    return o->report + REPORT_FIXED + E;
}
static inline const double *router_host_group_counts(const RouterOutput *o, int E) {
    return o->report + REPORT_FIXED + 2 * (size_t)E;
}

// Router bookkeeping that spans the micro-batches of one global batch (training only).
typedef struct {
    double *global_counts_sum;  // (E) global_aux_loss: top-k counts summed over micro-batches
    int global_micro_batches;
    double *bias_counts;        // (E) expert bias: kept tokens per expert this global batch
    // quantile balancing: each training forward's quantiles (E, tensor memory, written by the
    // router), their sum over this global batch's micro-batches (host) and how many there were
    real *qb_quantile;
    double *qb_quantile_sum;
    int qb_micro_batches;
} RouterState;

// Quantile balancing's bias after a global batch: q̄ = the micro-batches' mean quantile
// (averaged over the data-parallel group's ranks by the caller), then
//   bias = ema·bias + (1 − ema)·q̄,  minus its mean over the experts
// (Megatron-Core's update, in double; the bias is stored rounded). bias (E): host memory.
void quantile_bias_update(real *bias, const double *mean_quantile, int E, double ema);

// logits (N,E) -> out. Collective over call->token_group (and call->count_group with
// global_aux_loss): every member calls it at the same point.
void router_forward(RouterOutput *out, const real *logits, const RouterConfig *rc, const RouterCall *call);
// dprobs (N,k) (gradient of the probs in out) -> dlogits (N,E) overwritten, plus the
// gradients of every enabled balance loss and the z-loss, each scaled by loss_scale. With a
// token group, the N rows of this member of the one-process gradient on all N·P tokens
// (no communication: the forward's group statistics are in out).
void router_backward(real *dlogits, const real *dprobs, const real *logits, const RouterOutput *out,
                     const RouterConfig *rc, const RouterCall *call, double loss_scale);
// Σ over enabled balance losses and z-loss of coeff · value: what training minimises.
double router_objective(const RouterOutput *out, const RouterConfig *rc);
// Megatron's expert-bias rule: bias += rate · sign(mean(counts) − counts).
void expert_bias_update(real *bias, const double *counts, int E, double rate);

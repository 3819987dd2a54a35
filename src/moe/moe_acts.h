// moe_acts.h — what the forward of one MoE layer saves for its backward, on this rank's
// N tokens: the router's input, logits and routing, the dispatch plan and expert rows, and
// the shared expert's activations. The model holds one per MoE layer (model.h LayerActs).
#pragma once
#include "core/common.h"
#include "moe/dispatcher.h"
#include "moe/experts.h"
#include "moe/router.h"

typedef struct {
    const real *router_input;  // (N,H) ln2 itself (stored as router_input_store), or jittered_input
    Storage router_input_store;
    real *jittered_input;      // (N,H) ln2 ⊙ jitter (allocated with --moe-input-jitter-eps)
    real *jitter;              // (N,H) the noise factors (valid when jitter_used)
    int jitter_used;
    real *logits;       // (N,E) router_input·W_routerᵀ (random normal with forced balancing)
    // training: the global-aux counts of the step's earlier micro-batches as the forward saw
    // them (host memory, E), so that a recomputed forward routes the same
    double *counts_before;
    int batches_before;
    int pass;           // PassKind of the forward in progress: which exchange scratch it uses
    // latent MoE (--moe-latent-size L): the rows the dispatcher moves and the combine's result
    real *latent_in;    // (N,L) ln2·W_fc1ᵀ
    real *latent_out;   // (N,L) the combined expert rows, before fc2
    RouterCall call;
    RouterOutput route;
    DispatchPlan plan;
    ExpertRows expert_rows; // the rows this rank's experts computed (set by the token dispatcher)
    real *rows_in;      // (rows,H) permuted inputs (rows of L with latent MoE, as below)
    real *row_probs;    // (rows)
    ExpertActs experts; // (rows,I) each
    real *rows_out;     // (rows,H)
    ExpertActs shared;  // (N,Is) each, shared expert
    real *shared_gate;  // (N_local) sigmoid(ln2·w_gate)
    real *shared_gate_full;  // (N) of every token (gathered with sequence parallelism), or shared_gate
    real *shared_out;   // (N_local,H)
    struct EpLayer *ep; // expert parallel: the rows this rank's experts computed (moe/expert_parallel.c)
} MoeActs;

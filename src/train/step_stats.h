// step_stats.h — the losses and router statistics of one training step, accumulated over
// its micro-batches and summed over the data-parallel group.
#pragma once
#include "model/model.h"
#include "parallel/comm.h"
#include "train/metrics.h"

typedef struct {
    double lm_loss, aux_objective;
    double mtp_objective;  // multi-token prediction's share of the objective
    double *mtp_loss;      // (mtp_depths) each depth's loss
    int mtp_depths;
    RouterStats router;   // over MoE layers
    RouterStats *layers;  // (MoE layers) per layer
    int64_t *counts;      // (MoE layers, E) kept tokens per expert
    int moe_layers, num_experts;
} StepLosses;

// Add this micro-batch's router statistics, weighted by w, per MoE layer and overall.
void accumulate_router_stats(StepLosses *s, const Model *m, const ModelActs *a, double w);
// Sum the step's losses and statistics over the group (each rank weighted its
// micro-batches by 1 / (micro-batches of all ranks)), the data-parallel ranks or the
// pipeline stages (each its own layers' shares, the last its loss); every rank gets the totals.
void step_losses_allreduce(StepLosses *s, const Comm *dp);
// Sum the expert-bias token counts of this global batch over the group, before the update.
void router_state_allreduce(Model *m, const Comm *dp);

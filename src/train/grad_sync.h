// grad_sync.h — gradients and parameters across the data-parallel groups.
//
// The flat buffers have two regions (core/tensor_table.h): the dense tensors, whose
// gradients are summed over the dense data-parallel group (dp × cp), and the experts,
// summed over the expert data-parallel group (edp: the ranks holding the same experts).
//
//   plain           : all-reduce every gradient within its region's group; every rank
//                     steps every parameter it holds.
//   distributed     : (--use-distributed-optimizer, ZeRO-1) reduce-scatter each region so
//                     that a rank holds the summed gradients of its shard of the region,
//                     AdamW steps the shards with their own moments, then the updated
//                     shards are all-gathered. Shards are contiguous element ranges of
//                     near-equal size; no tensor size needs to divide anything.
// Sums run in rank order (parallel/comm.h), so results do not depend on timing.
#pragma once
#include "core/tensor_table.h"
#include "parallel/comm.h"
#include "train/optimizer.h"

enum { REGION_DENSE, REGION_EXPERT, REGIONS };

typedef struct {
    const Comm *comm;    // the group its gradients are summed over
    FlatRange range;     // the region's elements
    FlatRange shard;     // this rank's part (the whole region without the distributed optimizer)
    size_t *counts;      // (comm size) elements of each rank's shard
    real *buffer;        // (shard) reduce-scatter target with the distributed optimizer
    int sharded;         // distributed optimizer over more than one rank
} GradRegion;

typedef struct {
    GradRegion region[REGIONS];
    const Comm *ep;        // expert-parallel group: different experts, so their norms add up
    const Comm *tp, *etp;  // tensor-parallel groups: pieces of tensors, so their norms add up
    const Comm *pp;        // pipeline stages: different layers, so their norms add up
    int has_copies;        // the table holds a copy of another stage's tensor (TENSOR_COPY)
    int distributed;       // some region is sharded
    int overlap;           // more than one rank: sums start during the last backward
    CommRequest *pending;  // (max_pending) sums in flight
    int n_pending, max_pending;
    double first_start;    // when the first overlapped sum of this step started
    double hidden_s;       // the last grad_sync_finish: seconds sums were in flight before it waited
} GradSync;

// The groups of one rank's gradients: dp the dense data-parallel group (dp × cp), edp the
// expert data-parallel group, ep the expert-parallel one, tp and etp the tensor-parallel ones.
typedef struct {
    const Comm *dp, *edp, *ep, *tp, *etp, *pp;  // pp may be NULL (one stage)
} GradGroups;

// parts: how many parts backward can report in one pass.
void grad_sync_init(GradSync *g, const GradGroups *groups, const TensorTable *tt, int distributed, int parts);
void grad_sync_free(GradSync *g);
// The element ranges this rank's optimizer steps (its shards), for optimizer_init_ranges.
int grad_sync_shards(const GradSync *g, FlatRange *ranges);
// The same shards from the groups' sizes and ranks alone (nothing allocated: the memory plan,
// train/memory_plan.h), and the elements of the reduce-scatter buffers grad_sync_init makes.
int grad_sync_plan_shards(const GradGroups *groups, const TensorTable *tt, int distributed, FlatRange *ranges,
                          double *buffer_elements);
// After backward: the summed gradients of this rank's shards, in tt->grads.
void grad_sync_reduce(GradSync *g, TensorTable *tt);
// Overlapped reduction (when g->overlap): during the last micro-batch's backward, start
// the sum (all-reduce, or reduce-scatter onto the shards it crosses) of each range of
// gradients of a region as soon as it is final; then wait for all of them. The sums are
// the same as grad_sync_reduce's, bit for bit. The ranges of one backward must cover
// each region exactly once.
void grad_sync_part_ready(GradSync *g, TensorTable *tt, int region, int64_t begin, int64_t end);
void grad_sync_finish(GradSync *g, TensorTable *tt);
// L2 norm of all summed gradients of the model, each element counted once: a tensor piece
// several tensor-parallel ranks hold counts on the first of them, a tied LM head's copy on
// the last pipeline stage not at all (every rank gets the same value).
double grad_sync_norm(const GradSync *g, const TensorTable *tt);
// How many of those gradient elements are exactly zero, each counted once as in the norm,
// leaving out the tensors the optimizer never steps (the expert bias, which Megatron keeps as
// a buffer) (--log-num-zeros-in-grad; every rank gets the same count).
long long grad_sync_count_zeros(const GradSync *g, const TensorTable *tt);
// The same L2 norm of all trained parameters (--log-params-norm; not the expert bias, as
// Megatron's), after the optimizer step.
double grad_sync_params_norm(const GradSync *g, const TensorTable *tt);
// After the optimizer step: every rank holds every updated parameter of its tensors.
void grad_sync_gather_params(GradSync *g, TensorTable *tt);

// grad_sync.h — gradients and parameters across the data-parallel group.
//
//   plain DP        : all-reduce every gradient; every rank steps every parameter.
//   distributed     : (--use-distributed-optimizer, ZeRO-1) reduce-scatter the gradients
//                     so rank r holds the summed gradients of its shard [begin, end) of the
//                     flat parameters, AdamW steps that shard with its own moments, then
//                     the updated shards are all-gathered. Shards are contiguous element
//                     ranges of near-equal size; no tensor size needs to divide anything.
// Sums run in rank order (parallel/comm.h), so results do not depend on timing.
#pragma once
#include "core/tensor_table.h"
#include "parallel/comm.h"
#include "train/optimizer.h"

typedef struct {
    const Comm *dp;
    int distributed;
    int overlap;           // plain DP over > 1 rank: sums start during the last backward
    CommRequest *pending;  // (max_pending) sums in flight
    int n_pending, max_pending;
    size_t *counts;        // (dp size) elements of each rank's shard
    int64_t begin, end;    // this rank's shard (all elements without --use-distributed-optimizer)
    real *shard;           // (end − begin) reduce-scatter target
} GradSync;

// parts: how many ranges backward can report (grad_sync_part_ready) in one pass.
void grad_sync_init(GradSync *g, const Comm *dp, const TensorTable *tt, int distributed, int parts);
void grad_sync_free(GradSync *g);
// After backward: the summed gradients of this rank's elements, in tt->grads[begin, end).
void grad_sync_reduce(GradSync *g, TensorTable *tt);
// Overlapped reduction (when g->overlap): during the last micro-batch's backward, start
// the sum of each range of gradients as soon as it is final; then wait for all of them.
// The sums are the same as grad_sync_reduce's, bit for bit (rank order per element).
void grad_sync_part_ready(GradSync *g, TensorTable *tt, int64_t begin, int64_t end);
void grad_sync_finish(GradSync *g);
// L2 norm of all summed gradients (every rank gets the same value).
double grad_sync_norm(const GradSync *g, const TensorTable *tt);
// After the optimizer step: every rank holds every updated parameter.
void grad_sync_gather_params(GradSync *g, TensorTable *tt);

// With the distributed optimizer checkpoint I/O works on whole moments: gather the shards
// into full (every rank takes part; full is allocated here, free with optimizer_free), or
// take this rank's shard of full.
void grad_sync_gather_moments(const GradSync *g, const Optimizer *shard, const TensorTable *tt, Optimizer *full);
void grad_sync_take_moments(const GradSync *g, const Optimizer *full, Optimizer *shard);

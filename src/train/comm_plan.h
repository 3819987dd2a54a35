// comm_plan.h — the bytes one rank sends in a training step to each parallel dimension's
// ranks, from the configuration and its layout alone (moetron plan), counted as
// parallel/comm.h counts them (its per-group byte counters, which the step's JSONL logs as
// tp_bytes, cp_bytes, dp_bytes, expert_bytes and pp_bytes).
//
// Exact where the traffic does not depend on the data: tensor parallelism of dense layers
// (attention and SwiGLU blocks, vocabulary-parallel embedding and loss), the data-parallel
// gradient reductions and parameter gather with the distributed optimizer (and without it
// on two ranks), pipeline stage boundaries, the allgather token exchange. Estimates,
// flagged as such: the alltoall token exchange (its rows follow the routing: the plan takes
// balanced routing), context parallelism (by each layer's comm type), tensor parallelism of
// MoE and MLA layers, all-reduces over more than two data-parallel ranks without the
// distributed optimizer (each layer's bucket rounds its own even split), and the few
// statistics each step sums (losses, routing counts).
#pragma once
#include "core/config.h"
#include "model/model.h"
#include "train/grad_sync.h"
#include "train/pipeline.h"

typedef enum { DIM_TP, DIM_CP, DIM_DP, DIM_EP, DIM_PP, DIMS } ParallelDim;

typedef struct {
    double bytes[DIMS];
    int estimated[DIMS];  // 1 where the number is an estimate (see above)
} CommPlan;

const char *parallel_dim_name(ParallelDim d);  // "tp", "cp", "dp", "ep", "pp"
// m described for the rank (model_describe), pl its schedule (pipeline_init).
CommPlan comm_plan(const Config *c, const Model *m, const Pipeline *pl, const GradGroups *gg);

// memory_plan.h — what one rank of a run holds, from the configuration and that rank's
// groups, before anything large exists: the one model of memory the trainer's start-up check
// and `moetron plan` (src/cmd/plan.c) both use.
#pragma once
#include "core/config.h"
#include "model/model.h"
#include "parallel/groups.h"
#include "train/grad_sync.h"
#include "train/memory_check.h"
#include "train/pipeline.h"

// The model's and the gradient synchronisation's views of a rank's groups.
ModelGroups plan_model_groups(const ParallelGroups *pg);
GradGroups plan_grad_groups(const ParallelGroups *pg);

// The bytes one rank holds: m described for it (model_describe), pl its schedule's
// activations (pipeline_init), gg its gradient groups; on_gpu: the device is a GPU (state
// offloaded by --optimizer-cpu-offload leaves it; elsewhere that state and its host copies
// count). Parameters, gradients (with the distributed optimizer's reduce-scatter buffers),
// AdamW moments (their dtypes, scales), activations (every buffer plan in flight), the
// expert exchange at its bound, and the MPI library's temporaries of the gradient
// reductions in flight.
MemoryNeed memory_plan(const Config *c, const Model *m, const Pipeline *pl, const GradGroups *gg, int on_gpu);

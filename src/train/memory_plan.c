#include "train/memory_plan.h"

#include "train/optimizer.h"

ModelGroups plan_model_groups(const ParallelGroups *pg) {
    const Comm *g = pg->comm;
    // global_aux_loss counts: one rank of each micro-batch's (its TP x CP token group's) per data-parallel rank
    return (ModelGroups){.tp = &g[PG_TP], .ep = &g[PG_EP], .etp = &g[PG_ETP], .etp_ep = &g[PG_ETP_EP],
                         .count = &g[PG_DP], .cp = &g[PG_CP], .tp_cp = &g[PG_TP_CP], .cp_inner = &pg->cp_inner,
                         .cp_outer = &pg->cp_outer, .pp = &g[PG_PP], .edp = &g[PG_EDP], .described = pg->described};
}

GradGroups plan_grad_groups(const ParallelGroups *pg) {
    const Comm *g = pg->comm;
    return (GradGroups){.dp = &g[PG_DP_CP], .edp = &g[PG_EDP], .ep = &g[PG_EP], .tp = &g[PG_TP],
                        .etp = &g[PG_ETP], .pp = &g[PG_PP]};
}

// The AdamW state of the shards' elements: device-resident, and with --optimizer-cpu-offload
// the offloaded part (about the fraction asked: whole shards) in host memory with a copy of
// its weights and its gradients — off a GPU's books, on the cpu's.
static double optimizer_bytes(const Config *c, const TensorTable *tt, const FlatRange *shards, int n_shards,
                              int on_gpu) {
    OptimizerOptions options = optimizer_options(c);
    double elements = 0;
    for (int r = 0; r < n_shards; r++) elements += (double)(shards[r].end - shards[r].begin);
    double offloaded = options.offload_fraction * elements;
    // at most one scale pair per tensor and range
    double bytes = optimizer_state_bytes(options.dtype, elements - offloaded, (double)tt->count * n_shards);
    if (!on_gpu) bytes += optimizer_state_bytes(options.dtype, offloaded, 0) + 2.0 * offloaded * sizeof(real);
    return bytes;
}

// The gradient reductions over the data-parallel groups (all-reduces, or the distributed
// optimizer's reduce-scatters) run in flight layer after layer through the backward, and an
// MPI library holds a temporary of each one's size until it completes: at most the region's
// gradients. (NCCL on a GPU works in fixed buffers of its own.)
static double reduction_bytes(const TensorTable *tt, const GradGroups *gg, int on_gpu) {
    if (on_gpu) return 0;
    double bytes = 0;
    if (gg->dp->size > 1) bytes += (double)tt->dense_total * sizeof(real);
    if (gg->edp->size > 1) bytes += (double)(tt->total - tt->dense_total) * sizeof(real);
    return bytes;
}

MemoryNeed memory_plan(const Config *c, const Model *m, const Pipeline *pl, const GradGroups *gg, int on_gpu) {
    const TensorTable *tt = &m->tt;
    MemoryNeed need = {.parameters = (double)tt->total * sizeof(real), .micro_batch_size = c->micro_batch_size,
                       .seq_length = pl->T};
    FlatRange shards[REGIONS];
    double buffer_elements;
    int n_shards = grad_sync_plan_shards(gg, tt, c->use_distributed_optimizer, shards, &buffer_elements);
    need.gradients = need.parameters + buffer_elements * sizeof(real);
    need.optimizer = optimizer_bytes(c, tt, shards, n_shards, on_gpu);
    need.activations = pipeline_activation_bytes(pl, &need.exchange);
    need.reduction = reduction_bytes(tt, gg, on_gpu);
    return need;
}

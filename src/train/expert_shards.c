#include "train/expert_shards.h"

#include <string.h>

// The three flat buffers of a model and its moments that a gather copies.
enum { BUF_PARAMS, BUF_EXP_AVG, BUF_EXP_AVG_SQ, BUFS };

static real *buffer_of(const Model *m, const Optimizer *o, int which) {
    return which == BUF_PARAMS ? m->tt.params : which == BUF_EXP_AVG ? o->exp_avg : o->exp_avg_sq;
}

// Dense tensors are the same on every rank: copied. A local tensor's index in the global
// table is its global_index.
static void copy_dense(const Model *local, const Optimizer *local_opt, Model *global, Optimizer *global_opt,
                       int bufs) {
    for (int i = 0; i < local->tt.count; i++) {
        const TensorDesc *d = &local->tt.descs[i];
        if (d->flags & TENSOR_EXPERT) continue;
        const TensorDesc *g = &global->tt.descs[d->global_index];
        for (int b = 0; b < bufs; b++)
            memcpy(buffer_of(global, global_opt, b) + g->offset, buffer_of(local, local_opt, b) + d->offset,
                   d->numel * sizeof(real));
    }
}

// The experts of one MoE layer: every rank's block [gates, ups, downs of its local
// experts] is all-gathered, then each tensor lands in its place in the global model.
static void gather_layer_experts(const Model *local, const Optimizer *local_opt, Model *global,
                                 Optimizer *global_opt, int bufs, int layer, real *gathered) {
    const ExpertParallel *ep = &local->ep;
    const LayerParams *lp = &local->layers[layer], *gp = &global->layers[layer];
    ElemRange dense, block;
    model_grads_part_ranges(local, layer, &dense, &block);
    size_t block_len = (size_t)(block.end - block.begin);
    const TensorId *local_ids[3] = {lp->expert_gate, lp->expert_up, lp->expert_down};
    const TensorId *global_ids[3] = {gp->expert_gate, gp->expert_up, gp->expert_down};
    for (int b = 0; b < bufs; b++) {
        comm_allgather(ep->comm, buffer_of(local, local_opt, b) + block.begin, gathered, block_len);
        for (int r = 0; r < ep->size; r++)
            for (int part = 0; part < 3; part++)
                for (int le = 0; le < ep->local; le++) {
                    const TensorDesc *d = &local->tt.descs[local_ids[part][le]];
                    const TensorDesc *g = &global->tt.descs[global_ids[part][r * ep->local + le]];
                    memcpy(buffer_of(global, global_opt, b) + g->offset,
                           gathered + r * block_len + (d->offset - (size_t)block.begin), d->numel * sizeof(real));
                }
    }
}

void expert_shards_gather(const Model *local, const Optimizer *local_opt, Model *global, Optimizer *global_opt) {
    model_build(global, &local->cfg);
    int bufs = local_opt ? BUFS : 1;
    if (local_opt) {
        optimizer_init(global_opt, &global->tt);
        global_opt->step = local_opt->step;
    }
    copy_dense(local, local_opt, global, global_opt, bufs);
    size_t largest = 0;
    for (int l = 0; l < local->cfg.num_layers; l++) {
        ElemRange dense, block;
        model_grads_part_ranges(local, l, &dense, &block);
        largest = MT_MAX(largest, (size_t)(block.end - block.begin));
    }
    real *gathered = mt_malloc(MT_MAX(largest * local->ep.size, 1) * sizeof(real));
    for (int l = 0; l < local->cfg.num_layers; l++)
        if (local->layers[l].is_moe) gather_layer_experts(local, local_opt, global, global_opt, bufs, l, gathered);
    free(gathered);
}

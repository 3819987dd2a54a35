// tp_grads.c — gradients of the tensors tensor-parallel ranks hold whole but compute in
// parts (TensorShard.grad_partial): norms, the router and the shared-expert gate with
// sequence parallelism (each rank's tokens), per-head QK-norm weights, MLA's down
// projections and replicated kv heads (each rank's heads). After backward each is summed
// over the ranks holding it: the whole TP group, or the kv_share group for kv heads.
#include "model/model.h"

#include <string.h>

#include "core/device.h"
#include "ops/ops.h"

// The group summing tensor d's partial gradients.
static const Comm *holders(const Model *m, const TensorDesc *d) {
    return d->shard.parts == 1 ? m->plan.tp : &m->plan.kv_share;
}

static int summed_in(const Model *m, TensorId id, int part, const Comm *group) {
    const TensorDesc *d = &m->tt.descs[id];
    return d->shard.grad_partial && model_part_has_tensor(m, part, id) && holders(m, d) == group;
}

// Sums the partial gradients of one part's tensors that `group` holds, packed into one
// buffer so that each part costs one all-reduce.
static void sum_over(Model *m, int part, const Comm *group) {
    TensorTable *tt = &m->tt;
    size_t total = 0;
    for (int i = 0; i < tt->count; i++)
        if (summed_in(m, i, part, group))
            total += tt->descs[i].numel;
    if (!total) return;
    real *packed = device_calloc(total, sizeof(real)), *at = packed;  // tensor memory
    for (int i = 0; i < tt->count; i++)
        if (summed_in(m, i, part, group)) {
            vec_copy(at, tt_grad(tt, i), tt->descs[i].numel);
            at += tt->descs[i].numel;
        }
    comm_allreduce_sum(group, packed, total);
    at = packed;
    for (int i = 0; i < tt->count; i++)
        if (summed_in(m, i, part, group)) {
            vec_copy(tt_grad(tt, i), at, tt->descs[i].numel);
            at += tt->descs[i].numel;
        }
    device_free(packed);
}

void model_sum_partial_grads(Model *m, int part) {
    if (m->plan.tp_size == 1) return;
    sum_over(m, part, m->plan.tp);
    if (m->plan.kv_share.size > 1) sum_over(m, part, &m->plan.kv_share);
}

void model_sum_all_partial_grads(Model *m) {
    model_sum_partial_grads(m, GRADS_HEAD);
    for (int l = config_all_layers(&m->cfg) - 1; l >= 0; l--)
        if (plan_holds_layer(&m->plan, l)) model_sum_partial_grads(m, l);
    model_sum_partial_grads(m, GRADS_EMBEDDING);
}

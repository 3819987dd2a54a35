#include "core/device.h"
#include "core/tensor_table.h"

#include <string.h>

void tt_init(TensorTable *tt) { memset(tt, 0, sizeof(*tt)); }

TensorShard tensor_shard_none(void) { return (TensorShard){.group = SHARD_NONE, .axis = -1, .parts = 1}; }

TensorPieceRuns tensor_piece_runs(int ndim, const int64_t *shape, int axis, int parts, int index) {
    int64_t outer = 1, inner = 1;  // elements before the axis (rows of runs), and per step of it
    for (int i = 0; i < ndim; i++) {
        if (parts > 1 && i < axis) outer *= shape[i];
        else if (parts == 1 || i > axis) inner *= shape[i];
    }
    int64_t chunk = parts > 1 ? shape[axis] / parts * inner : inner;
    return (TensorPieceRuns){.runs = outer, .chunk = chunk, .stride = chunk * parts, .first = chunk * index};
}

TensorId tt_add(TensorTable *tt, const char *name, int ndim, const int64_t *shape,
                unsigned flags, InitKind init, double init_std, int layer, int expert) {
    return tt_add_shard(tt, name, ndim, shape, tensor_shard_none(), flags, init, init_std, layer, expert);
}

TensorId tt_add_shard(TensorTable *tt, const char *name, int ndim, const int64_t *shape, TensorShard shard,
                      unsigned flags, InitKind init, double init_std, int layer, int expert) {
    MT_ASSERT(ndim >= 1 && ndim <= MT_MAX_DIMS && strlen(name) < MT_NAME_MAX);
    MT_ASSERT(tt->params == NULL);  // all tensors are described before allocation
    if (tt->count == tt->capacity) {
        tt->capacity = tt->capacity ? 2 * tt->capacity : 64;
        tt->descs = mt_realloc(tt->descs, tt->capacity * sizeof(TensorDesc));
    }
    TensorDesc *d = &tt->descs[tt->count];
    memset(d, 0, sizeof(*d));
    strcpy(d->name, name);
    d->ndim = ndim;
    MT_ASSERT(shard.parts >= 1 && shard.index >= 0 && shard.index < shard.parts);
    MT_ASSERT(shard.parts == 1 || (shard.axis >= 0 && shard.axis < ndim && shape[shard.axis] % shard.parts == 0));
    d->shard = shard;
    d->numel = 1;
    for (int i = 0; i < ndim; i++) {
        d->shape[i] = shape[i];
        d->local_shape[i] = i == shard.axis ? shape[i] / shard.parts : shape[i];
        d->numel = mt_size_product((int64_t)d->numel, (size_t)d->local_shape[i]);
    }
    d->flags = flags;
    d->global_index = tt->described++;
    d->layer = layer;
    d->expert = expert;
    d->init = init;
    d->init_std = init_std;
    return tt->count++;
}

void tt_skip(TensorTable *tt) { tt->described++; }

void tt_mark_copy(TensorTable *tt, TensorId id, int global_index) {
    TensorDesc *d = &tt->descs[id];
    MT_ASSERT(id == tt->count - 1 && d->global_index == tt->described - 1 && global_index < d->global_index);
    d->global_index = global_index;
    d->flags |= TENSOR_COPY;
    tt->described--;
}

void tt_layout(TensorTable *tt) {
    tt->total = 0;
    for (int expert_region = 0; expert_region < 2; expert_region++) {
        for (int i = 0; i < tt->count; i++) {
            TensorDesc *d = &tt->descs[i];
            if (!(d->flags & TENSOR_EXPERT) != !expert_region) continue;
            d->offset = tt->total;
            tt->total += d->numel;
            if (tt->total > MT_MAX_PARAMETERS)
                mt_die("the model has more than %lld parameters (at %s); lower --num-layers, --num-experts, "
                       "--hidden-size or the FFN widths", (long long)MT_MAX_PARAMETERS, d->name);
        }
        if (!expert_region) tt->dense_total = tt->total;
    }
}

void tt_allocate(TensorTable *tt) {
    tt_layout(tt);
    tt->params = device_calloc(tt->total, sizeof(real));
    tt->grads = device_calloc(tt->total, sizeof(real));
}

void tt_free(TensorTable *tt) {
    free(tt->descs);
    device_free(tt->params);
    device_free(tt->grads);
    memset(tt, 0, sizeof(*tt));
}

TensorId tt_find(const TensorTable *tt, const char *name) {
    for (int i = 0; i < tt->count; i++)
        if (!strcmp(tt->descs[i].name, name)) return i;
    return -1;
}

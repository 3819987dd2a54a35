// tp_tables.h — tensor tables cut as a tensor-parallel model cuts them, built by hand for
// the checkpoint tests (tests/unit/test_hf_pieces.c, tests/mpi/test_ckpt_tp_mpi.c), and
// values every process can compute for any element of any tensor.
#pragma once
#include <string.h>

#include "core/config.h"
#include "core/tensor_table.h"
#include "mix64.h"

// A rank's coordinates in the tensor-parallel groups.
typedef struct {
    int tp, tp_rank;    // dense tensor parallel
    int etp, etp_rank;  // expert tensor parallel
} TpCoords;

// A tensor cut along axis into parts pieces over a group of `size` ranks (this one `rank`):
// each piece on size/parts consecutive ranks.
static inline TensorShard tp_cut(ShardGroup group, int axis, int parts, int rank, int size) {
    if (size == 1) return tensor_shard_none();
    return (TensorShard){.group = group, .axis = parts > 1 ? axis : -1, .parts = parts,
                         .index = rank * parts / size};
}

static inline int tp_name_has(const char *name, const char *part) { return strstr(name, part) != NULL; }

// How a tensor-parallel model cuts each tensor (model/layout.h): column-parallel rows,
// row-parallel columns, vocabulary rows, kv heads fewer than TP on several ranks each,
// norms and routers whole on every TP rank, experts' gate/up rows and down columns over ETP.
static inline TensorShard tp_shard_for(const Config *c, const TpCoords *t, const TensorDesc *d) {
    if (d->flags & TENSOR_EXPERT)
        return tp_cut(SHARD_ETP, tp_name_has(d->name, "down_proj") || tp_name_has(d->name, ".w2.") ? 1 : 0, t->etp,
                      t->etp_rank, t->etp);
    if (tp_name_has(d->name, "k_proj") || tp_name_has(d->name, "v_proj"))
        return tp_cut(SHARD_TP, 0, t->tp < c->kv_heads ? t->tp : c->kv_heads, t->tp_rank, t->tp);
    if (tp_name_has(d->name, "o_proj") || tp_name_has(d->name, "down_proj"))
        return tp_cut(SHARD_TP, 1, t->tp, t->tp_rank, t->tp);
    if (d->ndim == 2 && (d->flags & TENSOR_DECAY) && !(d->flags & TENSOR_ROUTER))
        return tp_cut(SHARD_TP, 0, t->tp, t->tp_rank, t->tp);  // embedding, q, gate, up, lm_head
    return tp_cut(SHARD_TP, -1, 1, t->tp_rank, t->tp);
}

// *tt (described) again with the shards of coordinates t: the same tensors, order and
// global indices; allocated.
static inline void tp_shard_table(TensorTable *tt, const Config *c, const TpCoords *t) {
    TensorTable cut;
    tt_init(&cut);
    for (int i = 0; i < tt->count; i++) {
        const TensorDesc *d = &tt->descs[i];
        while (cut.described < d->global_index) tt_skip(&cut);
        tt_add_shard(&cut, d->name, d->ndim, d->shape, tp_shard_for(c, t, d), d->flags, d->init, d->init_std,
                     d->layer, d->expert);
    }
    while (cut.described < tt->described) tt_skip(&cut);
    tt_free(tt);
    *tt = cut;
    tt_allocate(tt);
}

// The global element of element j of d's piece (written out for 1-D and 2-D tensors,
// independently of the code under test).
static inline int64_t tp_global_element(const TensorDesc *d, int64_t j) {
    if (d->shard.parts == 1) return j;
    if (d->shard.axis == 0) return d->shard.index * (int64_t)d->numel + j;
    int64_t cols = d->local_shape[1], row = j / cols, col = j % cols;
    return row * d->shape[1] + d->shard.index * cols + col;
}

enum { TP_VALUE_RANGE = 1 << 20, TP_VALUE_SCALE = 1 << 10 };  // multiples of 2^-10: exact in float

// Element e of global tensor g in buffer `buffer` (0 parameters, 1 and 2 the moments).
static inline real tp_value(int g, int64_t e, int buffer) {
    uint64_t h = mix64(((uint64_t)buffer << 56) ^ ((uint64_t)g << 36) ^ (uint64_t)e);
    double v = ((double)(h % TP_VALUE_RANGE) - TP_VALUE_RANGE / 2) / TP_VALUE_SCALE;
    return (real)(buffer == 2 ? v * v : v);
}

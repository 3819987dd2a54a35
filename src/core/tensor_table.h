// tensor_table.h — every parameter described once, living in flat buffers.
//
// A TensorDesc names a parameter (its Hugging Face name), gives its global shape, how it
// is sharded across a parallel group (TensorShard: which piece this rank holds), where it sits in the flat
// buffers and how it is treated (weight decay, expert, router, init). Parameters,
// gradients and optimizer moments are each ONE flat buffer with the same offsets, so
// zeroing, gradient reduction, clipping, the optimizer and checkpoints are loops over
// descriptors. Model code holds a TensorId (an index) per tensor, never raw offsets.
#pragma once
#include "core/common.h"

#define MT_MAX_DIMS 4
// The most parameters a model may have (2^50: 4 PiB in fp32), so that the flat buffers'
// byte sizes and offsets stay far inside size_t.
#define MT_MAX_PARAMETERS ((int64_t)1 << 50)
#define MT_NAME_MAX 128

typedef int TensorId;

typedef enum {
    TENSOR_DECAY = 1 << 0,   // receives weight decay (matrices; not norms)
    TENSOR_EXPERT = 1 << 1,  // belongs to one routed expert (reduced over the expert-DP group)
    TENSOR_ROUTER = 1 << 2,  // router weight
    TENSOR_NORM = 1 << 3,    // RMSNorm weight
    TENSOR_NOT_TRAINED = 1 << 4,  // state kept with the weights but never stepped by the optimizer
    TENSOR_COPY = 1 << 5,    // a second copy of a tensor another pipeline stage holds (the tied LM head)
} TensorFlags;

typedef enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS } InitKind;

// Which parallel group a parameter is split across.
typedef enum { SHARD_NONE, SHARD_TP, SHARD_ETP } ShardGroup;

// How a parameter is split: the global tensor is cut along `axis` into `parts` equal
// pieces; the `size` ranks of the group hold them in order, each piece on size/parts
// consecutive ranks (parts == size: one piece each; parts == 1: replicated). This rank
// holds piece `index`. grad_partial: each holder of a piece computes only part of its
// gradient (its own heads or tokens), so the holders' gradients are summed after backward;
// otherwise every holder computes the whole gradient. Experts split over expert parallelism
// are whole tensors held by one rank (TENSOR_EXPERT), not shards.
typedef struct {
    ShardGroup group;  // SHARD_NONE: the whole tensor, on every rank of its data-parallel group
    int axis;          // -1 when parts == 1
    int parts, index;
    int grad_partial;
} TensorShard;

typedef struct {
    char name[MT_NAME_MAX];
    int ndim;
    int64_t shape[MT_MAX_DIMS];  // global shape
    TensorShard shard;           // the piece of it this rank holds
    int64_t local_shape[MT_MAX_DIMS];  // the piece's shape (shape, divided along shard.axis)
    size_t offset;               // into the flat buffers (local elements), set by tt_allocate
    size_t numel;                // local elements
    unsigned flags;
    int layer;                   // -1 for embedding / final norm / head
    int expert;                  // -1 unless TENSOR_EXPERT: the global expert index
    int global_index;            // index among all tensors of the model on one process
                                 // (seeds its init: the same values in every layout)
    InitKind init;
    double init_std;
} TensorDesc;

// The flat buffers hold the dense (non-expert) tensors first, then the expert tensors:
// [0, dense_total) is reduced over the dense data-parallel group, [dense_total, total)
// over the expert data-parallel group. Within each region tensors keep their order.
typedef struct {
    TensorDesc *descs;
    int count, capacity;
    int described;     // tensors described, including those held by other processes
    size_t dense_total; // elements of the dense region
    size_t total;      // elements in each flat buffer
    real *params;      // (total)
    real *grads;       // (total)
} TensorTable;

void tt_init(TensorTable *tt);
// Describe a tensor; returns its id. Buffers are allocated later by tt_allocate.
TensorId tt_add(TensorTable *tt, const char *name, int ndim, const int64_t *shape,
                unsigned flags, InitKind init, double init_std, int layer, int expert);
// tt_add for a piece of a tensor (the shape is global: its axis must divide by parts).
TensorId tt_add_shard(TensorTable *tt, const char *name, int ndim, const int64_t *shape, TensorShard shard,
                      unsigned flags, InitKind init, double init_std, int layer, int expert);
// The whole tensor on every rank.
TensorShard tensor_shard_none(void);

// Where piece `index` of a tensor cut along `axis` into `parts` lies in the global
// row-major tensor: `runs` runs of `chunk` elements, run r from global element
// first + r·stride. A whole tensor or a piece of axis 0 is one run (a row block); a piece
// of axis 1 of a matrix is one run per row (a column block). The piece's own elements are
// the runs one after the other.
typedef struct {
    int64_t runs, chunk, stride, first;
} TensorPieceRuns;
TensorPieceRuns tensor_piece_runs(int ndim, const int64_t *shape, int axis, int parts, int index);
// A tensor of the model that another process holds (an expert of another expert-parallel
// rank): counted for global_index, not stored here.
void tt_skip(TensorTable *tt);
// Makes the tensor just added (id) a copy of the model's tensor global_index (described
// earlier): it takes that index and is not counted again (TENSOR_COPY).
void tt_mark_copy(TensorTable *tt, TensorId id, int global_index);
void tt_layout(TensorTable *tt);    // offsets (dense region first) and totals, nothing allocated
void tt_allocate(TensorTable *tt);  // the layout, then params and grads zeroed
void tt_free(TensorTable *tt);
TensorId tt_find(const TensorTable *tt, const char *name);  // -1 when absent

static inline real *tt_param(const TensorTable *tt, TensorId id) {
    return tt->params + tt->descs[id].offset;
}
static inline real *tt_grad(const TensorTable *tt, TensorId id) {
    return tt->grads + tt->descs[id].offset;
}

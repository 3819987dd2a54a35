// ckpt_shards.h — saving a checkpoint that no process holds whole. Under expert
// parallelism each rank holds its own experts, with the distributed optimizer its shards
// of the moments; the checkpoint stays the one a single process would write. World rank 0
// writes the files tensor by tensor: for each tensor (in file order) the ranks that hold
// its pieces send them to rank 0, which appends the tensor and moves on. No process ever
// holds more than its training buffers plus, on rank 0, one tensor.
//
// Which rank sends which piece: a parameter comes from rank 0 of its region's group (the
// dense data-parallel group for dense tensors, the expert data-parallel group of the rank
// holding the expert for experts: one sender per element); a moment comes from every rank
// whose optimizer shard overlaps the tensor's elements (rank 0 of the group when the
// region is not sharded). The pieces of every rank are exchanged once per save, so the
// writer knows where each piece lands. Loading needs no counterpart: each rank reads its
// own tensors and shard ranges by name (checkpoint_load).
#pragma once
#include "parallel/comm.h"
#include "train/checkpoint.h"
#include "train/grad_sync.h"

typedef struct {
    const Model *local;
    const Optimizer *opt;
    const GradSync *sync;
    Model global;       // the table of the whole model (described, not allocated): the files' layout
    int *local_of;      // (global tensors) its index in local's table, -1 for another rank's expert
    int64_t *pieces;    // (world, global tensors, CKPT_BUFFERS, 2): first element and count each rank sends
    Comm world;
    real *staging;      // rank 0: the tensor being assembled (the largest tensor's size)
    size_t *counts, *displs;  // (world) scratch of one gather
} CkptShards;

// Collective over the world. opt's ranges are sync's shards (grad_sync_shards order).
void ckpt_shards_open(CkptShards *s, const Model *local, const Optimizer *opt, const GradSync *sync);
// The source for checkpoint_save_from (s->global is the model to pass with it).
CkptSource ckpt_shards_source(CkptShards *s);
void ckpt_shards_close(CkptShards *s);

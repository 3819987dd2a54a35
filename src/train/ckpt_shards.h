// ckpt_shards.h — saving a checkpoint that no process holds whole. Under tensor
// parallelism (TP, ETP) each rank holds a piece of most tensors, under expert parallelism
// its own experts, with the distributed optimizer its shards of the moments; the checkpoint
// stays the one a single process would write (whole tensors under their Hugging Face
// names), so that any layout resumes any other. World rank 0 writes the files tensor by
// tensor: for each tensor (in file order) the ranks that hold its pieces send them to rank
// 0, which assembles the global row-major tensor and moves on. No process ever holds more
// than its training buffers plus its own piece of one tensor (downloaded from tensor memory
// into host memory, which the gather sends) and, on rank 0, one tensor (and, for a tensor
// whose pieces are column blocks, its pieces before they are re-strided: the largest such
// tensor once more).
//
// Which rank sends which piece (core/tensor_table.h: TensorShard): the global tensor is cut
// into `parts` pieces; the ranks of a data-parallel replica (the ranks of one region group:
// the dense data-parallel group for dense tensors, the expert data-parallel group for
// experts) all hold the same pieces. A parameter piece is offered by rank 0 of each replica
// holding it; a moment piece by every rank whose optimizer shard (a range of the local flat
// buffer) overlaps it, or by rank 0 of the replica when the region is not sharded. Of the
// replicas offering a piece (TP ranks sharing replicated kv heads, norms every TP rank
// holds, data-parallel copies), the one whose rank 0 has the lowest world rank sends it,
// so every element has one sender. What every rank holds is exchanged once per save, so
// the writer knows where each piece lands. Loading needs no counterpart: each rank reads
// its own pieces and shard ranges by name (checkpoint_load, hf_weights.h).
#pragma once
#include "parallel/comm.h"
#include "train/checkpoint.h"
#include "train/grad_sync.h"

typedef struct {
    const Model *local;
    const Optimizer *opt;
    const GradSync *sync;
    Model global;       // the table of the whole model on one process (described, not allocated): the files' layout
    int *local_of;      // (global tensors) its index in local's table, -1 for another rank's expert
    int64_t *held;      // (world, global tensors, fields) what each rank holds and sends (ckpt_shards.c)
    int *parts_of, *axis_of;  // (global tensors) how the run cuts each tensor
    Comm world;
    real *staging;      // rank 0: the tensor being assembled (the largest tensor's size)
    real *pieces;       // rank 0: the pieces of a tensor cut into column blocks (the largest such), or NULL
    real *sent;         // this rank's part of the tensor being gathered, downloaded from tensor memory
                        // (the largest local tensor's size)
    size_t *counts, *displs;  // (world) scratch of one gather
} CkptShards;

// Collective over the world. opt's ranges are sync's shards (grad_sync_shards order).
void ckpt_shards_open(CkptShards *s, const Model *local, const Optimizer *opt, const GradSync *sync);
// The source for checkpoint_save_from (s->global is the model to pass with it).
CkptSource ckpt_shards_source(CkptShards *s);
void ckpt_shards_close(CkptShards *s);

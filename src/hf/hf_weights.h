// hf_weights.h — load a model's weights by name from a moetron checkpoint or a Hugging
// Face directory (single file or shards; per-expert or fused experts; F32/BF16/F16/FP8).
#pragma once
#include "model/model.h"

// Fill every parameter of m from DIR; fatal with one line naming the file and tensor when
// one is missing, has the wrong shape or dtype, or when a file holds a tensor m lacks.
// The files hold whole (global) tensors; a tensor m holds a piece of (its TensorShard,
// tensor parallelism) is read as that piece only: a block of rows is one byte range, a
// block of columns one range per row.
void hf_weights_load(const char *dir, Model *m);

// The element count of tt's largest tensor (at least 1): the size of a host staging buffer
// any one of its tensors passes through between a file and tensor memory.
size_t hf_largest_tensor(const TensorTable *tt);

// One group of tensors in a single safetensors file keyed by the model's tensor names
// (optimizer.safetensors): tensor "<prefix><name>" for every tensor of m's table, read into
// dest + that tensor's offset in the flat buffers, or just its elements inside the windows.
// A window of the flat layout: elements [begin, end) of m's parameters (its local flat
// buffers, pieces included), stored compactly at dest[0 .. end - begin) (a distributed
// optimizer's shard of the moments).
typedef struct {
    int64_t begin, end;
    real *dest;
} HfWindow;

enum { HF_MAX_WINDOWS = 2 };

typedef struct {
    const char *prefix;   // e.g. "exp_avg."
    real *dest;           // a flat buffer laid out like m's parameters (when n_windows is 0)
    int n_windows;        // > 0: only the elements inside these windows are read, into them
    HfWindow windows[HF_MAX_WINDOWS];
    // With n_windows > 0 and store set, each window's part of a tensor goes to
    // store(store_ctx, first flat element, host values, count) instead of the window's dest.
    void (*store)(void *store_ctx, int64_t flat, const real *values, size_t count);
    void *store_ctx;
    int optional;         // the group may be absent as a whole, never in part
    int present;          // out: the group was there (always 1 for a required group)
} HfTensorGroup;

// Read every group from the file at path with the same checks as hf_weights_load: fatal
// with one line when a tensor is missing, has the wrong shape or dtype, when an optional
// group is there only in part, or when the file holds any tensor no group names.
void hf_load_tensor_groups(const char *path, const Model *m, HfTensorGroup *groups, int n_groups);

// backend.h — the table of operations a compute backend provides.
//
// The model calls the functions of ops.h and gemm.h; src/ops/dispatch.c forwards each
// call to the active backend's entry here. The entries are those of src/ops/op_list.h. The cpu backend (src/ops/cpu/, functions
// named cpu_*) is always built; the cuda backend (src/ops/cuda/, cuda_*) when the
// build found the CUDA toolkit (MT_HAVE_CUDA, float builds only). Every entry has the
// signature and the contract of the ops.h / gemm.h function of the same name; pointers
// are to memory the backend can read (host memory for cpu, device or managed memory
// for cuda — src/core/device.h allocates the right kind), except the small per-group
// descriptions of the grouped GEMMs (rows, offsets, pointer arrays), which are host
// arrays in every backend.
#pragma once
#include "ops/op_list.h"

#define MT_OP_FIELD(ret, api, name, params, args) ret(*name) params;
typedef struct OpsBackend {
    const char *name;
    MT_OPS(MT_OP_FIELD)  // one entry per op of op_list.h, named as the op
    // ---- after an op: make its results visible to host code (NULL: nothing to do).
    // The model's own loops (router statistics, dispatch plan) read op outputs directly,
    // so the dispatcher finishes every op before returning.
    void (*finish)(void);
} OpsBackend;

extern const OpsBackend ops_cpu_backend;
#if defined(MT_HAVE_CUDA) && !defined(MT_DOUBLE)
extern const OpsBackend ops_cuda_backend;
#endif

// The backend every ops.h / gemm.h call goes to from now on (cpu until set).
void ops_select(const OpsBackend *b);
// fn (or NULL) runs after each op, on the calling thread: the trainer lets communication in
// flight progress there (comm_progress).
void ops_set_between_ops(void (*fn)(void));

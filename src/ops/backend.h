// backend.h — the table of operations a compute backend provides.
//
// The model calls the functions of ops.h and gemm.h; src/ops/dispatch.c forwards each
// call to the active backend's entry here. The entries are those of src/ops/op_list.h. The cpu backend (src/ops/cpu/, functions
// named cpu_*) is always built; the cuda backend (src/ops/cuda/, cuda_*) when the
// build found the CUDA toolkit (MT_HAVE_CUDA, float builds only). Every entry has the
// signature and the contract of the ops.h / gemm.h function of the same name; pointers
// are to tensor memory (host memory for cpu, device memory for cuda —
// src/core/device.h allocates the right kind); host-side parameters come by value or in
// small structs the op reads when it is called.
#pragma once
#include "ops/op_list.h"

// A backend whose ops run asynchronously times them with marks in its queue (--profile):
// mark() records one and gives its index (-1: none left), seconds(a, b) the time between
// two (waiting for b), reset() frees every mark.
typedef struct {
    int (*mark)(void);
    double (*seconds)(int from, int to);
    void (*reset)(void);
} BackendTimer;

#define MT_OP_FIELD(ret, api, name, params, args) ret(*name) params;
typedef struct OpsBackend {
    const char *name;
    MT_OPS(MT_OP_FIELD)  // one entry per op of op_list.h, named as the op
    // ---- waits for every queued op (NULL: ops complete on return, as on the cpu). Ops
    // are not finished one by one: host code reads tensors only through downloads
    // (src/core/device.h), which wait themselves.
    void (*finish)(void);
    const BackendTimer *timer;  // NULL: ops are timed by the wall clock
} OpsBackend;

extern const OpsBackend ops_cpu_backend;
#if defined(MT_HAVE_CUDA) && !defined(MT_DOUBLE)
extern const OpsBackend ops_cuda_backend;
#endif

// The backend every ops.h / gemm.h call goes to from now on (cpu until set).
void ops_select(const OpsBackend *b);
const OpsBackend *ops_active(void);
// fn (or NULL) runs after each op, on the calling thread: the trainer lets communication in
// flight progress there (comm_progress).
void ops_set_between_ops(void (*fn)(void));

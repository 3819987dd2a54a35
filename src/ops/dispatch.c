// dispatch.c — the functions of ops.h and gemm.h, each forwarded to the active backend
// (src/ops/backend.h); the wrappers are generated from the op list (src/ops/op_list.h).
// Ops are queued, not waited for: on the cuda backend an op returns once its kernels are
// on the stream, and host code sees results only through downloads (src/core/device.h).
#include "ops/backend.h"
#include "core/device.h"
#include "ops/op_profile.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static const OpsBackend *active = &ops_cpu_backend;

static void (*between_ops)(void);

void ops_select(const OpsBackend *b) { active = b; }
const OpsBackend *ops_active(void) { return active; }
void ops_set_between_ops(void (*fn)(void)) { between_ops = fn; }

static inline void finished(void) {
#ifdef _OPENMP
    if (omp_in_parallel()) return;  // the hook runs on the thread that calls MPI only
#endif
    if (between_ops) between_ops();
}

// Each op's wrapper: runs active-><name>(args); with --profile, the op's time (wall clock
// on the cpu, queue marks on the GPU) is added to its row of the per-op profile.
#define MT_OP_CALL_void(name, args) active->name args
#define MT_OP_CALL_double(name, args) double result = active->name args
#define MT_OP_RETURN_void
#define MT_OP_RETURN_double return result;
#define MT_OP_WRAPPER(ret, api, name, params, args) \
    ret api params {                                \
        OpStamp t0 = op_profile_start();            \
        device_access_begin();                      \
        MT_OP_CALL_##ret(name, args);               \
        device_access_end();                        \
        finished();                                 \
        op_profile_stop(OP_##name, t0);             \
        MT_OP_RETURN_##ret                          \
    }
MT_OPS(MT_OP_WRAPPER)

#define MT_OP_NAME(ret, api, name, params, args) #name,
static const char *const OP_NAMES[OPS_COUNT] = {MT_OPS(MT_OP_NAME)};
const char *op_name(OpId op) { return op >= 0 && op < OPS_COUNT ? OP_NAMES[op] : "?"; }

// backend_cpu.c — the cpu backend's op table (src/ops/backend.h).
#include "ops/backend.h"
#include "ops/cpu/cpu_ops.h"

const OpsBackend ops_cpu_backend = {
    .name = "cpu",
    MT_OPS(MT_OP_ENTRY_CPU)  // .gemm = cpu_gemm, ... for every op of op_list.h
    .finish = NULL,
};

// cpu_ops.h — the cpu backend: each cpu_X implements X of ops.h / gemm.h on host memory
// with OpenMP (contracts there). The model reaches them through src/ops/dispatch.c;
// tests and the cuda op checks may call them directly.
#pragma once
#include "ops/op_list.h"

// Every op of src/ops/op_list.h as cpu_<name> (gemm.c, linear.c, elementwise.c,
// attention.c, attention_merge.c, moe.c).
MT_OPS(MT_OP_PROTO_CPU)

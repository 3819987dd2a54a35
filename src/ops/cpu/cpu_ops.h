// cpu_ops.h — the cpu backend: each cpu_X implements X of ops.h / gemm.h on host memory
// with OpenMP (contracts there). The model reaches them through src/ops/dispatch.c;
// tests and the cuda op checks may call them directly.
#pragma once
#include <string.h>

#include "core/float_formats.h"
#include "ops/op_list.h"
#include "ops/cpu/gemm_lowp.h"

// Every op of src/ops/op_list.h as cpu_<name> (gemm.c, linear.c, elementwise.c,
// attention.c, attention_merge.c, moe.c).
MT_OPS(MT_OP_PROTO_CPU)

// A run of n values between reals and bf16 (ops/gemm.h STORE_BF16): rounded as bf16_pack rounds,
// and widened back exactly. The bf16 ops of this backend write and read their runs through these.
static inline void cpu_bf16_round_run(uint16_t *dst, const real *src, size_t n) { lowp_bf16_round_run(dst, src, n); }
static inline void cpu_bf16_widen_run(real *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (real)bf16_to_float(src[i]);
}
// The same between reals and a run stored as `store`: copied when fp32, else through the two above.
static inline void cpu_store_run(void *dst, Storage store, const real *src, size_t n) {
    if (store == STORE_FP32) memcpy(dst, src, n * sizeof(real));
    else cpu_bf16_round_run(dst, src, n);
}
static inline void cpu_load_run(real *dst, const void *src, Storage store, size_t n) {
    if (store == STORE_FP32) memcpy(dst, src, n * sizeof(real));
    else cpu_bf16_widen_run(dst, src, n);
}

// sp_gather.c — the sequence-parallel all-gathers whose rows only bf16-input GEMMs read (a
// block's normed input before its column-parallel projections, a row-parallel projection's
// output gradient, the LM head's input): with model_exchanges_bf16 they travel as bf16, half
// the bytes, and the GEMMs read the same values as from fp32 rows (layers.h).
#include "model/layers.h"
#include "ops/ops.h"

void model_tp_gather_gemm_rows(const Model *m, real *scratch, const real *x, real *x_full, int N, int C) {
    TpRegion r = model_tp_region(m);
    if (!model_tp_gathers_bf16(m) || C % 2) {  // (model.h: sequence parallelism, bf16 exchanges, no recipe)
        tp_enter_forward(&r, x, x_full, N, C);
        return;
    }
    // scratch (N, C): all ranks' packed rows in its first half, this rank's in its second
    size_t local = (size_t)N / r.tp->size * C, all = (size_t)N * C;
    real *gathered = scratch, *mine = scratch + all / 2;
    bf16_pack(mine, x, local);
    comm_allgather(r.tp, mine, gathered, local / 2);
    bf16_unpack(x_full, gathered, all);
}

void model_tp_gather_stored(const Model *m, real *scratch, const real *x, real *x_full, Storage store, int N, int C) {
    if (store == STORE_FP32) {
        model_tp_gather_gemm_rows(m, scratch, x, x_full, N, C);
        return;
    }
    TpRegion r = model_tp_region(m);
    tp_enter_forward(&r, x, x_full, N, C / 2);  // a bf16 row of even C: C/2 reals, moved as they are
}

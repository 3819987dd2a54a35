// sp_gather.c — the sequence-parallel all-gathers whose rows only bf16-input GEMMs read (a
// block's normed input before its column-parallel projections, a row-parallel projection's
// output gradient, the LM head's input): with model_exchanges_bf16 they travel as bf16, half
// the bytes, and the GEMMs read the same values as from fp32 rows (layers.h).
#include "model/layers.h"
#include "ops/ops.h"

// Whether this gather moves bf16: sequence parallelism over more than one rank, bf16
// exchanges, no FP8 / FP4 recipe (its quantizers read the fp32 values), rows in pairs.
static int gathers_bf16(const Model *m, const TpRegion *r, int C) {
    return r->sequence_parallel && r->tp->size > 1 && model_exchanges_bf16(m) && !m->quant && C % 2 == 0;
}

void model_tp_gather_gemm_rows(const Model *m, real *scratch, const real *x, real *x_full, int N, int C) {
    TpRegion r = model_tp_region(m);
    if (!gathers_bf16(m, &r, C)) {
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

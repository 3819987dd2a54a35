// shared_expert.c — the shared expert of a MoE layer: a dense SwiGLU on every token (tensor
// parallel as the dense FFN: gate/up column-parallel on ln2_full, down row-parallel), its
// output scaled per token by σ(ln2·w_gate) with --moe-shared-expert-gate (computed on this
// rank's tokens, gathered). Its output and input gradient are computed apart from adding
// them in, so that --moe-shared-expert-overlap can compute them while routed rows travel.
#include <math.h>

#include "model/layers.h"
#include "ops/ops.h"
#include "ops/quantized_linear.h"

// One group covering the N rows (offsets {0, N}) of ln2_full, stored as la's; this rank's columns.
static ExpertShape shared_shape(const Model *m, const LayerActs *la, const int32_t offsets[2]) {
    return (ExpertShape){
        .groups = 1, .H = m->plan.hidden, .I = m->plan.shared_ffn, .offsets = offsets, .in_store = la->ln2_store};
}

void shared_expert_forward(const Model *m, const LayerParams *lp, LayerActs *la, int N) {
    MoeActs *ma = &la->moe;
    TpRegion region = model_tp_region(m);
    int H = m->plan.hidden, N_local = plan_local_tokens(&m->plan, N);
    int32_t offsets[2] = {0, N};
    ExpertShape shape = shared_shape(m, la, offsets);
    real *gate = NULL;
    if (lp->shared_expert_gate >= 0) {  // σ(x·w_gate) scales the whole shared output
        qlinear_forward_stored(NULL, ma->shared_gate, la->ln2, la->ln2_store, tt_param(&m->tt, lp->shared_expert_gate),
                               N_local, H, 1);
        moe_gate_sigmoid(ma->shared_gate, (size_t)N_local);
        tp_enter_forward(&region, ma->shared_gate, ma->shared_gate_full, N, 1);
        gate = ma->shared_gate_full;
    }
    // ffn_partial: free until down
    model_tp_gather_stored(m, la->ffn_partial, la->ln2, la->ln2_full, la->ln2_store, N, H);
    experts_forward(la->ffn_partial, &ma->shared, la->ln2_full, gate, &lp->shared_params, &shape);
    tp_exit_forward(&region, la->ffn_partial, ma->shared_out, N, H);
}

void shared_expert_backward(Model *m, const LayerParams *lp, LayerActs *la, ModelActs *a, const real *d_out) {
    MoeActs *ma = &la->moe;
    TpRegion region = model_tp_region(m);
    int N = a->N, N_local = a->N_local, H = m->plan.hidden;
    int32_t offsets[2] = {0, N};
    ExpertShape shape = shared_shape(m, la, offsets);
    int gated = lp->shared_expert_gate >= 0;
    // --recompute-modules shared_experts: gate, up and their product again (shared buffers)
    if (plan_recomputes(&m->plan, RECOMPUTE_SHARED_EXPERTS))
        experts_forward_acts(&ma->shared, la->ln2_full, gated ? ma->shared_gate_full : NULL, &lp->shared_params,
                             &shape);
    model_tp_gather_gemm_rows(m, a->sp_workspace, d_out, a->d_out_full, N, H);
    experts_backward(a->d_shared_in_full, gated ? a->d_shared_gate_full : NULL, &lp->shared_grads, a->d_out_full,
                     &ma->shared, la->ln2_full, gated ? ma->shared_gate_full : NULL, &lp->shared_params, &shape,
                     a->d_gate, a->d_up, a->d_act);
    tp_enter_backward(&region, a->d_shared_in_full, a->d_shared_in, N, H);
    if (!gated) return;
    // each rank's columns make part of the gate's gradient: summed over TP, this rank's tokens kept
    tp_enter_backward(&region, a->d_shared_gate_full, a->d_shared_gate, N, 1);
    // gate g = σ(z), z = x·w: dz = dg·g(1−g)
    moe_gate_sigmoid_backward(a->d_shared_gate, ma->shared_gate, (size_t)N_local);
}

void shared_expert_backward_add(Model *m, const LayerParams *lp, LayerActs *la, ModelActs *a) {
    int N_local = a->N_local, H = m->plan.hidden;
    vec_add(a->d_norm, a->d_shared_in, (size_t)N_local * H);
    if (lp->shared_expert_gate < 0) return;
    qlinear_backward_stored(NULL, a->d_norm, tt_grad(&m->tt, lp->shared_expert_gate), a->d_shared_gate, la->ln2,
                            la->ln2_store, tt_param(&m->tt, lp->shared_expert_gate), N_local, H, 1);
}

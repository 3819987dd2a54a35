// mlp.c — the dense SwiGLU feed-forward: the expert code with a single group and no probs.
// With tensor parallelism gate/up are column-parallel and down row-parallel: the block is
// entered on ln2 and exited on ffn_out (parallel/tp_mappings.h).
#include "model/layers.h"

// One group covering all N rows of ln2_full (stored as la's), this rank's F/TP columns.
static ExpertShape dense_shape(const Model *m, const LayerActs *la, int32_t offsets[2], int N) {
    offsets[0] = 0;
    offsets[1] = N;
    return (ExpertShape){
        .groups = 1, .H = m->plan.hidden, .I = m->plan.ffn, .offsets = offsets, .in_store = la->ln2_store};
}

void mlp_forward(const Model *m, int layer, LayerActs *la, int N) {
    int32_t offsets[2];
    ExpertShape shape = dense_shape(m, la, offsets, N);
    TpRegion region = model_tp_region(m);
    // ffn_partial: free until fc2
    model_tp_gather_stored(m, la->ffn_partial, la->ln2, la->ln2_full, la->ln2_store, N, m->plan.hidden);
    experts_forward(la->ffn_partial, &la->mlp, la->ln2_full, NULL, &m->layers[layer].ffn_params, &shape);
    tp_exit_forward(&region, la->ffn_partial, la->ffn_out, N, m->plan.hidden);
}

void mlp_backward(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out) {
    int32_t offsets[2];
    ExpertShape shape = dense_shape(m, la, offsets, a->N);
    const LayerParams *lp = &m->layers[layer];
    TpRegion region = model_tp_region(m);
    // --recompute-modules mlp: gate, up and their product again (shared buffers)
    if (plan_recomputes(&m->plan, RECOMPUTE_MLP)) experts_forward_acts(&la->mlp, la->ln2_full, NULL, &lp->ffn_params, &shape);
    model_tp_gather_gemm_rows(m, a->sp_workspace, d_out, a->d_out_full, a->N, m->plan.hidden);
    experts_backward(a->d_norm_full, NULL, &lp->ffn_grads, a->d_out_full, &la->mlp, la->ln2_full, NULL,
                     &lp->ffn_params, &shape, a->d_gate, a->d_up, a->d_act);
    tp_enter_backward(&region, a->d_norm_full, a->d_norm, a->N, m->plan.hidden);
}

// moe_layer.c — the MoE feed-forward: router → dispatcher → experts → combine.
#include "model/layers.h"
#include "ops/ops.h"

static RouterShape router_shape(const Config *c, int N) {
    return (RouterShape){.N = N, .E = c->num_experts, .k = c->moe_router_topk,
                         .pre_softmax = c->moe_router_pre_softmax};
}

static ExpertShape expert_shape(const Config *c, const MoeActs *ma) {
    return (ExpertShape){.groups = c->num_experts, .H = c->hidden_size, .I = c->moe_ffn,
                         .offsets = ma->plan.expert_offsets};
}

void moe_forward(const Model *m, int layer, LayerActs *la, int N) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    MoeActs *ma = &la->moe;
    int H = c->hidden_size, E = c->num_experts;
    RouterShape rs = router_shape(c, N);
    ma->plan.N = N;
    linear_forward(ma->logits, la->ln2, tt_param(&m->tt, lp->router), N, H, E);
    router_forward(&ma->route, ma->logits, &rs);
    dispatch_plan(&ma->plan, ma->route.topk_idx);
    dispatch_forward(ma->rows_in, ma->row_probs, la->ln2, ma->route.topk_probs, &ma->plan, H);
    ExpertShape es = expert_shape(c, ma);
    experts_forward(ma->rows_out, &ma->experts, ma->rows_in, ma->row_probs, &lp->ffn_params, &es);
    combine_forward(la->ffn_out, ma->rows_out, &ma->plan, H, 0);
}

void moe_backward(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out,
                  double aux_grad_scale) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    MoeActs *ma = &la->moe;
    int N = a->N, H = c->hidden_size, E = c->num_experts;
    // combine backward = dispatch of the output gradient (probs are inside the experts)
    dispatch_forward(a->d_rows_out, NULL, d_out, NULL, &ma->plan, H);
    ExpertShape es = expert_shape(c, ma);
    experts_backward(a->d_rows_in, a->d_row_probs, &lp->ffn_grads, a->d_rows_out, &ma->experts, ma->rows_in,
                     ma->row_probs, &lp->ffn_params, &es, a->d_gate, a->d_up, a->d_act);
    // dispatch backward = combine of the input-row gradients
    combine_forward(a->d_norm, a->d_rows_in, &ma->plan, H, 0);
    // router: probs → logits → (ln2, W_router)
    RouterShape rs = router_shape(c, N);
    gather_choice_values(a->d_choice_probs, a->d_row_probs, &ma->plan);
    router_backward(a->d_router_logits, a->d_choice_probs, &ma->route, &rs, aux_grad_scale);
    linear_backward(a->d_norm, tt_grad(&m->tt, lp->router), a->d_router_logits, la->ln2,
                    tt_param(&m->tt, lp->router), N, H, E);
}

// mlp.c — the dense SwiGLU feed-forward: the expert code with a single group and no probs.
#include "model/layers.h"

// One group covering all N rows.
static ExpertShape dense_shape(const Config *c, int32_t offsets[2], int N) {
    offsets[0] = 0;
    offsets[1] = N;
    return (ExpertShape){.groups = 1, .H = c->hidden_size, .I = c->ffn_hidden_size, .offsets = offsets};
}

void mlp_forward(const Model *m, int layer, LayerActs *la, int N) {
    int32_t offsets[2];
    ExpertShape shape = dense_shape(&m->cfg, offsets, N);
    experts_forward(la->ffn_out, &la->mlp, la->ln2, NULL, &m->layers[layer].ffn_params, &shape);
}

void mlp_backward(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out) {
    int32_t offsets[2];
    ExpertShape shape = dense_shape(&m->cfg, offsets, a->N);
    const LayerParams *lp = &m->layers[layer];
    experts_backward(a->d_norm, NULL, &lp->ffn_grads, d_out, &la->mlp, la->ln2, NULL, &lp->ffn_params, &shape,
                     a->d_gate, a->d_up, a->d_act);
}

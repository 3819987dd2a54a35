// mlp.c — the dense SwiGLU feed-forward: the expert code with a single group and no probs.
#include "model/layers.h"
#include "ops/ops.h"

typedef struct {
    ExpertWeights weights;
    real *gate, *up, *down;  // storage behind the one-element pointer arrays
    int32_t offsets[2];
    ExpertShape shape;
} DenseAsExpert;

static void dense_as_expert(DenseAsExpert *d, const TensorTable *tt, const LayerParams *lp,
                            int use_grads, const Config *c, int N) {
    real *(*pick)(const TensorTable *, TensorId) = use_grads ? tt_grad : tt_param;
    d->gate = pick(tt, lp->mlp_gate);
    d->up = pick(tt, lp->mlp_up);
    d->down = pick(tt, lp->mlp_down);
    d->weights = (ExpertWeights){&d->gate, &d->up, &d->down};
    d->offsets[0] = 0;
    d->offsets[1] = N;
    d->shape = (ExpertShape){.groups = 1, .H = c->hidden_size, .I = c->ffn_hidden_size, .offsets = d->offsets};
}

void mlp_forward(const Model *m, int layer, LayerActs *la, int N) {
    DenseAsExpert w;
    dense_as_expert(&w, &m->tt, &m->layers[layer], 0, &m->cfg, N);
    experts_forward(la->ffn_out, &la->mlp, la->ln2, NULL, &w.weights, &w.shape);
}

void mlp_backward(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out) {
    DenseAsExpert w, dw;
    dense_as_expert(&w, &m->tt, &m->layers[layer], 0, &m->cfg, a->N);
    dense_as_expert(&dw, &m->tt, &m->layers[layer], 1, &m->cfg, a->N);
    experts_backward(a->d_norm, NULL, &dw.weights, d_out, &la->mlp, la->ln2, NULL, &w.weights, &w.shape,
                     a->d_gate, a->d_up, a->d_act);
}

#include "train/optimizer.h"

#include <math.h>
#include <string.h>

#include "ops/ops.h"

void optimizer_init(Optimizer *o, const TensorTable *tt) {
    o->exp_avg = mt_calloc(tt->total, sizeof(real));
    o->exp_avg_sq = mt_calloc(tt->total, sizeof(real));
    o->step = 0;
}

void optimizer_free(Optimizer *o) {
    free(o->exp_avg);
    free(o->exp_avg_sq);
    memset(o, 0, sizeof(*o));
}

double grad_global_norm(const TensorTable *tt) { return sqrt(vec_sum_squares(tt->grads, tt->total)); }

void optimizer_step(Optimizer *o, TensorTable *tt, const Config *c, double lr, double grad_norm) {
    if (c->clip_grad > 0) {
        double clip = c->clip_grad / (grad_norm + 1e-6);
        if (clip < 1.0) vec_scale(tt->grads, (real)clip, tt->total);
    }
    o->step++;
    AdamWStep h = {.lr = lr, .beta1 = c->adam_beta1, .beta2 = c->adam_beta2, .eps = c->adam_eps,
                   .weight_decay = c->weight_decay, .step = o->step};
    for (int i = 0; i < tt->count; i++) {
        const TensorDesc *d = &tt->descs[i];
        if (d->flags & TENSOR_NOT_TRAINED) continue;  // e.g. the router expert bias
        adamw_update(tt->params + d->offset, tt->grads + d->offset, o->exp_avg + d->offset,
                     o->exp_avg_sq + d->offset, d->numel, (d->flags & TENSOR_DECAY) != 0, &h);
    }
}

#include "train/optimizer.h"

#include <math.h>
#include <string.h>

#include "ops/ops.h"

void optimizer_init_range(Optimizer *o, int64_t begin, int64_t end) {
    o->begin = begin;
    o->end = end;
    o->exp_avg = mt_calloc((size_t)MT_MAX(end - begin, 1), sizeof(real));
    o->exp_avg_sq = mt_calloc((size_t)MT_MAX(end - begin, 1), sizeof(real));
    o->step = 0;
}

void optimizer_init(Optimizer *o, const TensorTable *tt) { optimizer_init_range(o, 0, (int64_t)tt->total); }

void optimizer_free(Optimizer *o) {
    free(o->exp_avg);
    free(o->exp_avg_sq);
    memset(o, 0, sizeof(*o));
}

double grad_sum_squares(const TensorTable *tt, int64_t begin, int64_t end) {
    return vec_sum_squares(tt->grads + begin, (size_t)(end - begin));
}

void optimizer_step(Optimizer *o, TensorTable *tt, const Config *c, double lr, double grad_norm) {
    if (c->clip_grad > 0) {
        double clip = c->clip_grad / (grad_norm + 1e-6);
        if (clip < 1.0) vec_scale(tt->grads + o->begin, (real)clip, (size_t)(o->end - o->begin));
    }
    o->step++;
    AdamWStep h = {.lr = lr, .beta1 = c->adam_beta1, .beta2 = c->adam_beta2, .eps = c->adam_eps,
                   .weight_decay = c->weight_decay, .step = o->step};
    for (int i = 0; i < tt->count; i++) {
        const TensorDesc *d = &tt->descs[i];
        if (d->flags & TENSOR_NOT_TRAINED) continue;  // e.g. the router expert bias
        // the part of the tensor inside [begin, end)
        int64_t from = MT_MAX((int64_t)d->offset, o->begin), to = MT_MIN((int64_t)(d->offset + d->numel), o->end);
        if (from >= to) continue;
        adamw_update(tt->params + from, tt->grads + from, o->exp_avg + (from - o->begin),
                     o->exp_avg_sq + (from - o->begin), (size_t)(to - from), (d->flags & TENSOR_DECAY) != 0, &h);
    }
}

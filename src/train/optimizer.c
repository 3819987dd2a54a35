#include "core/device.h"
#include "train/optimizer.h"

#include <math.h>
#include <string.h>

#include "core/profile.h"
#include "ops/ops.h"

void optimizer_init_ranges(Optimizer *o, const FlatRange *ranges, int n_ranges) {
    MT_ASSERT(n_ranges >= 1 && n_ranges <= OPT_MAX_RANGES);
    memset(o, 0, sizeof(*o));
    size_t elements = 0;
    for (int r = 0; r < n_ranges; r++) {
        o->ranges[r] = ranges[r];
        elements += (size_t)(ranges[r].end - ranges[r].begin);
    }
    o->n_ranges = n_ranges;
    o->exp_avg = device_calloc(MT_MAX(elements, 1), sizeof(real));
    o->exp_avg_sq = device_calloc(MT_MAX(elements, 1), sizeof(real));
}

void optimizer_init(Optimizer *o, const TensorTable *tt) {
    FlatRange all = {0, (int64_t)tt->total};
    optimizer_init_ranges(o, &all, 1);
}

void optimizer_free(Optimizer *o) {
    device_free(o->exp_avg);
    device_free(o->exp_avg_sq);
    memset(o, 0, sizeof(*o));
}

size_t optimizer_moment_base(const Optimizer *o, int r) {
    size_t base = 0;
    for (int i = 0; i < r; i++) base += (size_t)(o->ranges[i].end - o->ranges[i].begin);
    return base;
}

double grad_sum_squares(const TensorTable *tt, int64_t begin, int64_t end) {
    return vec_sum_squares(tt->grads + begin, (size_t)(end - begin));
}

// AdamW on the part of every trained tensor inside range r.
static void step_range(Optimizer *o, int r, TensorTable *tt, const AdamWStep *h) {
    FlatRange range = o->ranges[r];
    real *m1 = o->exp_avg + optimizer_moment_base(o, r) - range.begin;  // indexed by flat element
    real *m2 = o->exp_avg_sq + optimizer_moment_base(o, r) - range.begin;
    for (int i = 0; i < tt->count; i++) {
        const TensorDesc *d = &tt->descs[i];
        if (d->flags & TENSOR_NOT_TRAINED) continue;  // e.g. the router expert bias
        int64_t from = MT_MAX((int64_t)d->offset, range.begin);
        int64_t to = MT_MIN((int64_t)(d->offset + d->numel), range.end);
        if (from >= to) continue;
        adamw_update(tt->params + from, tt->grads + from, m1 + from, m2 + from, (size_t)(to - from),
                     (d->flags & TENSOR_DECAY) != 0, h);
    }
}

void optimizer_step(Optimizer *o, TensorTable *tt, const Config *c, double lr, double grad_norm) {
    PROF_SCOPE(PROF_OPTIMIZER);
    double clip = c->clip_grad > 0 ? c->clip_grad / (grad_norm + 1e-6) : 1;
    o->step++;
    AdamWStep h = {.lr = lr, .beta1 = c->adam_beta1, .beta2 = c->adam_beta2, .eps = c->adam_eps,
                   .weight_decay = c->weight_decay, .step = o->step};
    for (int r = 0; r < o->n_ranges; r++) {
        FlatRange range = o->ranges[r];
        if (clip < 1.0) vec_scale(tt->grads + range.begin, (real)clip, (size_t)(range.end - range.begin));
        step_range(o, r, tt, &h);
    }
}

// dropout.c — the masks of the model's dropout sites (contracts in dropout.h).
#include "model/dropout.h"

#include <math.h>

#include "ops/dropout_math.h"

DropoutMask dropout_mask(const Batch *batch, int layer, int site, double p) {
    DropoutMask mask = {.threshold = 0, .scale = 1};
    if (!batch->training || p <= 0) return mask;
    uint64_t site_key = dropout_splitmix((uint64_t)layer * 4 + (uint64_t)site);
    mask.stream = dropout_splitmix(batch->noise_seed ^ site_key);
    mask.threshold = (uint32_t)floor(p * 4294967296.0);  // p < 1: below 2³²
    mask.scale = (real)(1 / (1 - p));
    return mask;
}

void hidden_dropout(const Model *m, const ModelActs *a, int layer, DropoutSite site, real *y, const real *x) {
    const LayoutPlan *p = &m->plan;
    int rows = a->N_local, H = p->hidden;
    DropoutMask mask = dropout_mask(&a->input, layer, (int)site, m->cfg.hidden_dropout);
    if (!mask.threshold) {
        if (y != x) vec_copy(y, x, (size_t)rows * H);
        return;
    }
    DropoutShape s = {.mask = mask, .rows = rows, .cols = H, .row_first = plan_first_local_token(p, rows),
                      .row_index = p->cp_size > 1 ? a->token_index : NULL};
    dropout_apply(y, x, &s);
}

const real *hidden_dropout_backward(const Model *m, ModelActs *a, int layer, DropoutSite site) {
    if (!dropout_mask(&a->input, layer, (int)site, m->cfg.hidden_dropout).threshold) return a->d_resid;
    hidden_dropout(m, a, layer, site, a->d_branch, a->d_resid);
    return a->d_branch;
}

#include "train/lr_schedule.h"

#include <math.h>

static double wsd_coefficient(const Config *c, long s) {
    double anneal_start = c->decay_steps - c->wsd_decay_steps;
    if (s <= anneal_start || c->wsd_decay_steps <= 0) return 1.0;
    double r = (s - anneal_start) / c->wsd_decay_steps;
    switch (c->wsd_style) {
    case WSD_LINEAR: return 1.0 - r;
    case WSD_COSINE: return 0.5 * (cos(M_PI * r) + 1.0);
    case WSD_EXPONENTIAL: return 2.0 * pow(0.5, r) - 1.0;
    case WSD_MINUS_SQRT: return 1.0 - sqrt(r);
    }
    return 1.0;
}

double lr_at(const Config *c, long s) {
    double warmup = c->warmup_steps, decay = c->decay_steps;
    if (warmup > 0 && s <= warmup) return c->lr_warmup_init + (c->lr - c->lr_warmup_init) * (double)s / warmup;
    if (c->decay_style == LR_CONSTANT) return c->lr;
    if (s > decay) return c->min_lr;
    double coeff;
    if (c->decay_style == LR_WSD) {
        coeff = wsd_coefficient(c, s);
    } else {
        double r = decay > warmup ? (s - warmup) / (decay - warmup) : 1.0;
        coeff = c->decay_style == LR_LINEAR ? 1.0 - r : 0.5 * (cos(M_PI * r) + 1.0);
    }
    return c->min_lr + coeff * (c->lr - c->min_lr);
}

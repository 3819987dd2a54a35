// loss_scaler.c — Megatron's constant and dynamic grad scalers (loss_scaler.h).
#include "train/loss_scaler.h"

#define LOSS_SCALE_GROWTH 2.0f   // Megatron's growth_factor
#define LOSS_SCALE_BACKOFF 0.5f  // and backoff_factor

void loss_scaler_init(LossScaler *s, const Config *c) {
    *s = (LossScaler){.kind = LOSS_SCALING_NONE, .state = {.scale = 1.0f}};
    if (c->loss_scale > 0) {
        s->kind = LOSS_SCALING_CONSTANT;
        s->state.scale = (float)c->loss_scale;
    } else if (c->fp16) {
        s->kind = LOSS_SCALING_DYNAMIC;
        s->state.scale = (float)c->initial_loss_scale;
        s->min_scale = (float)c->min_loss_scale;
        s->growth_interval = (long)c->loss_scale_window;
        s->hysteresis = c->hysteresis;
        s->state.hysteresis_tracker = c->hysteresis;
    }
}

float loss_scaler_inv_scale(const LossScaler *s) { return (float)(1.0 / (double)s->state.scale); }

void loss_scaler_update(LossScaler *s, int found_inf) {
    if (s->kind != LOSS_SCALING_DYNAMIC) return;
    LossScalerState *st = &s->state;
    if (found_inf) {
        st->growth_tracker = 0;
        if (--st->hysteresis_tracker <= 0) {
            float backed_off = st->scale * LOSS_SCALE_BACKOFF;
            st->scale = backed_off > s->min_scale ? backed_off : s->min_scale;
        }
        return;
    }
    if (++st->growth_tracker == s->growth_interval) {
        st->growth_tracker = 0;
        st->hysteresis_tracker = s->hysteresis;
        st->scale *= LOSS_SCALE_GROWTH;
    }
}

const char *loss_scaler_kind_name(const LossScaler *s) {
    static const char *const names[] = {"none", "constant", "dynamic"};
    return names[s->kind];
}

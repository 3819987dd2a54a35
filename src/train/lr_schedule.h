// lr_schedule.h — Megatron-LM's learning-rate schedule (OptimizerParamScheduler).
//   warmup:  lr = init + (lr_max − init) · s / warmup   for s <= warmup (init: --lr-warmup-init)
//   decay:   r = (s − warmup) / (decay − warmup); lr = min + coeff(r) · (max − min)
//            constant: 1, linear: 1 − r, cosine: (1 + cos πr)/2,
//            WSD: 1 until the last --lr-wsd-decay-iters steps, then the WSD shape
//   after --lr-decay-iters: min_lr
// s counts optimizer steps already taken: step 1 uses s = 0, as in Megatron-LM (so the
// first step of a warmup runs at lr init). warmup, decay and WSD's decay are Config's
// warmup_steps, decay_steps, wsd_decay_steps: in steps, fractional when given in samples or
// by --lr-warmup-fraction (Megatron's scheduler counts samples).
#pragma once
#include "core/config.h"

double lr_at(const Config *c, long steps_taken);

// loss_scaler.h — loss scaling (Megatron's grad scalers): the backward starts from the
// objective times `scale`, the optimizer sees the gradients times 1/scale, and a step whose
// unscaled gradients hold an infinity or NaN is skipped.
//
//   none      fp32, or --bf16 without --loss-scale: scale 1, nothing is checked here.
//   constant  --loss-scale S (with --fp16, --bf16 or --use-distributed-optimizer): scale S
//             for the whole run; overflowing steps are skipped.
//   dynamic   --fp16 without --loss-scale: from --initial-loss-scale (2^32). An overflow
//             resets the growth count and takes one from the hysteresis count; when that
//             reaches 0 the scale halves (never below --min-loss-scale). --loss-scale-window
//             steps in a row without one double the scale and refill the hysteresis count
//             (--hysteresis). The scale is an fp32 value, as Megatron's tensor is.
// A skipped step leaves the weights, the optimizer and the learning-rate schedule where they
// were (Megatron advances its scheduler only on successful steps); the expert biases still
// take the batch's update, as Megatron makes it before its optimizer looks for overflows; the
// data it read is consumed. The state is saved with checkpoints (trainer_state.json).
#pragma once
#include "core/config.h"

typedef enum { LOSS_SCALING_NONE, LOSS_SCALING_CONSTANT, LOSS_SCALING_DYNAMIC } LossScaling;

typedef struct {
    float scale;
    long growth_tracker;     // steps since the last overflow or growth
    int hysteresis_tracker;  // overflows left before the scale backs off
} LossScalerState;

typedef struct {
    LossScaling kind;
    float min_scale;
    long growth_interval;  // --loss-scale-window
    int hysteresis;
    LossScalerState state;
} LossScaler;

// The scaler of c's flags, in its start-of-run state.
void loss_scaler_init(LossScaler *s, const Config *c);
// 1/scale as the gradients are multiplied by it: the reciprocal in double, rounded to fp32.
float loss_scaler_inv_scale(const LossScaler *s);
// After a step whose (unscaled) gradients did or did not overflow.
void loss_scaler_update(LossScaler *s, int found_inf);
// "constant", "dynamic" or "none".
const char *loss_scaler_kind_name(const LossScaler *s);

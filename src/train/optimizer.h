// optimizer.h — AdamW over the tensor table with global-norm gradient clipping.
// Moments live in flat buffers with the same offsets as the parameters. Weight decay
// applies to tensors flagged TENSOR_DECAY (matrices), never to norms.
#pragma once
#include "core/config.h"
#include "core/tensor_table.h"

typedef struct {
    real *exp_avg;     // (total) first moment
    real *exp_avg_sq;  // (total) second moment
    long step;         // optimizer steps taken
} Optimizer;

void optimizer_init(Optimizer *o, const TensorTable *tt);
void optimizer_free(Optimizer *o);
// L2 norm of all gradients (fixed summation order)
double grad_global_norm(const TensorTable *tt);
// Clip to c->clip_grad (Megatron: scale by clip/(norm + 1e-6) when that is < 1), then step.
void optimizer_step(Optimizer *o, TensorTable *tt, const Config *c, double lr, double grad_norm);

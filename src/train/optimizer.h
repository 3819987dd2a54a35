// optimizer.h — AdamW over the tensor table with global-norm gradient clipping.
// Moments live in flat buffers with the same offsets as the parameters. Weight decay
// applies to tensors flagged TENSOR_DECAY (matrices), never to norms.
#pragma once
#include "core/config.h"
#include "core/tensor_table.h"

// The optimizer updates the elements [begin, end) of the flat parameters: all of them, or
// this rank's shard with --use-distributed-optimizer (moments exist for the shard only).
typedef struct {
    real *exp_avg;     // (end − begin) first moment; element i of the parameters at i − begin
    real *exp_avg_sq;  // (end − begin) second moment
    int64_t begin, end;
    long step;         // optimizer steps taken
} Optimizer;

void optimizer_init(Optimizer *o, const TensorTable *tt);  // every element
void optimizer_init_range(Optimizer *o, int64_t begin, int64_t end);
void optimizer_free(Optimizer *o);
// Σ gradient² over [begin, end) (fixed summation order)
double grad_sum_squares(const TensorTable *tt, int64_t begin, int64_t end);
// Clip to c->clip_grad (Megatron: scale by clip/(norm + 1e-6) when that is < 1), then step
// the elements [o->begin, o->end).
void optimizer_step(Optimizer *o, TensorTable *tt, const Config *c, double lr, double grad_norm);

// optimizer.h — AdamW over the tensor table with global-norm gradient clipping.
// Weight decay applies to tensors flagged TENSOR_DECAY (matrices), never to norms.
#pragma once
#include "core/config.h"
#include "core/tensor_table.h"

// Element ranges [begin, end) of the flat parameters.
typedef struct {
    int64_t begin, end;
} FlatRange;

enum { OPT_MAX_RANGES = 2 };

// The optimizer updates some element ranges of the flat parameters: all of them, or with
// --use-distributed-optimizer this rank's shard of the dense region and of the expert
// region. Moments exist for those elements only, range after range.
typedef struct {
    FlatRange ranges[OPT_MAX_RANGES];
    int n_ranges;
    real *exp_avg;     // (elements of the ranges) first moment
    real *exp_avg_sq;  // second moment
    long step;         // optimizer steps taken
} Optimizer;

void optimizer_init(Optimizer *o, const TensorTable *tt);  // every element: one range
void optimizer_init_ranges(Optimizer *o, const FlatRange *ranges, int n_ranges);
void optimizer_free(Optimizer *o);
// Where range r's moments start in exp_avg / exp_avg_sq.
size_t optimizer_moment_base(const Optimizer *o, int r);
// Σ gradient² over [begin, end) (fixed summation order)
double grad_sum_squares(const TensorTable *tt, int64_t begin, int64_t end);
// Clip to c->clip_grad (Megatron: scale by clip/(norm + 1e-6) when that is < 1), then step
// the optimizer's ranges.
void optimizer_step(Optimizer *o, TensorTable *tt, const Config *c, double lr, double grad_norm);

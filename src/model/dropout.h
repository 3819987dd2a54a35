// dropout.h — Megatron's --hidden-dropout and --attention-dropout (docs/architecture.md,
// "Dropout"): inverted dropout in training forwards only, each mask a hash of the run's
// micro-batch, the layer, the site and the element's global coordinates (ops/dropout_math.h),
// so that every parallel layout, rerun and recompute draws the same mask and no mask is kept.
#pragma once
#include "model/model.h"

// The dropout sites of a layer (part of the hash).
typedef enum { DROPOUT_ATTENTION_OUT, DROPOUT_FFN_OUT, DROPOUT_ATTENTION_PROBS } DropoutSite;

// The mask of site `site` of layer `layer` (0.. the decoder's and MTP's layers) in the
// micro-batch `batch` at probability p: threshold 0 (nothing dropped) unless batch->training
// and p > 0. The stream hashes batch->noise_seed (the run seed and the micro-batch's first
// sample: the same micro-batch in every layout), layer and site.
DropoutMask dropout_mask(const Batch *batch, int layer, int site, double p);

// --hidden-dropout on a branch's output before its residual add: this rank's N_local token
// rows x (N_local, H) of a->input -> y (y may be x; y = x when off). Rows are hashed by the
// token's index in the whole micro-batch (sequence and context parallelism: model/layout.h),
// columns by the hidden index. The same call on the gradient is its backward.
void hidden_dropout(const Model *m, const ModelActs *a, int layer, DropoutSite site, real *y, const real *x);
// The gradient of a branch's output from d(its residual sum) a->d_resid: a->d_resid itself
// when hidden dropout is off in a->input's pass, else the dropped copy in a->d_branch.
const real *hidden_dropout_backward(const Model *m, ModelActs *a, int layer, DropoutSite site);

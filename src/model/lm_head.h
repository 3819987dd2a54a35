// lm_head.h — final RMSNorm, logits over the (padded) vocabulary, masked cross-entropy.
//   lm_loss = Σ_n mask_n · CE_n / Σ_n mask_n   (mean over the counted tokens)
#pragma once
#include "model/model.h"

// a->x_final (N,H) -> a->logits (N,V); with batch->targets also token_loss and lm_loss
void lm_head_forward(const Model *m, ModelActs *a, const Batch *batch);
// sets a->d_resid = d(loss_scale · lm_loss)/d(x_final) and accumulates head/norm grads
void lm_head_backward(Model *m, ModelActs *a, const Batch *batch, double loss_scale);

// lm_head.h — the two ends of the model that see the vocabulary: the token embedding, and
// final RMSNorm, logits over the (padded) vocabulary, masked cross-entropy.
//   lm_loss = Σ_n mask_n · CE_n / Σ_n mask_n   (mean over the counted tokens)
// With tensor parallelism both are vocab-parallel (model/vocab_parallel.h): a rank holds
// V/TP rows of the embedding and LM head and never the whole vocabulary's logits.
#pragma once
#include "model/model.h"

// tokens (N) -> a->x_entry (N_local,H)
void embedding_model_forward(const Model *m, ModelActs *a, const int32_t *tokens);
// a->d_resid (N_local,H) -> the embedding's gradient (+=)
void embedding_model_backward(Model *m, ModelActs *a, const int32_t *tokens);
// a->x_final (N,H) -> a->logits (N,V); with batch->targets also token_loss and lm_loss
void lm_head_forward(const Model *m, ModelActs *a, const Batch *batch);
// sets a->d_resid = d(loss_scale · lm_loss)/d(x_final) and accumulates head/norm grads
void lm_head_backward(Model *m, ModelActs *a, const Batch *batch, double loss_scale);

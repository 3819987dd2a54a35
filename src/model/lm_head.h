// lm_head.h — the two ends of the model that see the vocabulary: the token embedding, and
// final RMSNorm, logits over the (padded) vocabulary, masked cross-entropy.
//   lm_loss = Σ_n mask_n · CE_n / Σ_n mask_n   (mean over the counted tokens)
// With tensor parallelism both are vocab-parallel (model/vocab_parallel.h): a rank holds
// V/TP rows of the embedding and LM head and never the whole vocabulary's logits. The
// multi-token-prediction depths (model/mtp.c) use the same embedding and head.
#pragma once
#include "model/model.h"

// tokens (N) -> out (N_local,H)
void embedding_lookup(const Model *m, ModelActs *a, real *out, const int32_t *tokens);
// d_out (N_local,H) -> the embedding's gradient (+=)
void embedding_lookup_backward(Model *m, ModelActs *a, const real *d_out, const int32_t *tokens);
// tokens (N) -> a->x_entry (N_local,H)
void embedding_model_forward(const Model *m, ModelActs *a, const int32_t *tokens);
// a->d_resid (N_local,H) -> the embedding's gradient (+=)
void embedding_model_backward(Model *m, ModelActs *a, const int32_t *tokens);

// The head over one set of hidden states and its loss: logits (N,V/TP), each token's
// cross-entropy and log-sum-exp, and its weight d(mean)/d(token_loss).
typedef struct {
    real *logits, *token_loss, *token_lse, *loss_weight;
    Storage hidden_store;  // how the head's input (hidden_full below) is stored (ops/gemm.h)
} HeadLoss;

// logits = hidden_full (N,H, stored as h->hidden_store) · W_headᵀ; with targets also the masked mean cross-entropy
// (over every token of the micro-batch: summed over the sequence's context-parallel ranks),
// which it returns (0 without targets or counted tokens).
double head_loss_forward(const Model *m, const HeadLoss *h, const real *hidden_full, const int32_t *targets,
                         const real *mask, int N);
// The gradient of weight · that mean: d(hidden) of this rank's tokens into a->d_norm
// (N_local,H, overwritten); the head's weight gradient accumulated.
void head_loss_backward(Model *m, ModelActs *a, const HeadLoss *h, const real *hidden_full, const int32_t *targets,
                        double weight);

// a->x_final (N,H) -> a->logits (N,V); with batch->targets also token_loss and lm_loss
void lm_head_forward(const Model *m, ModelActs *a, const Batch *batch);
// The head's backward in two halves, between which multi-token prediction adds its
// gradient of the final norm's output: the loss's, d(loss_scale · lm_loss)/d(lnf) into
// a->d_norm; then the final norm's, a->d_norm -> a->d_resid = d(x_final) (and its grads).
void lm_head_backward_loss(Model *m, ModelActs *a, const Batch *batch, double loss_scale);
void lm_head_backward_norm(Model *m, ModelActs *a);

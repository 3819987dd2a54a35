// lm_head.c — the token embedding and the LM head with its loss, vocab-parallel with
// tensor parallelism (model/vocab_parallel.h).
#include "model/lm_head.h"

#include "model/layers.h"
#include "model/vocab_parallel.h"
#include "core/device.h"
#include "ops/ops.h"
#include "ops/ops_loss.h"
#include "ops/quantized_linear.h"

// The (counted, total) pair lm_loss_sums writes: one tensor block of two doubles for the
// process, made on first use (the head's forward runs one micro-batch at a time).
static double *loss_sums_block(void) {
    static double *block;
    if (!block) block = device_calloc(2, sizeof(double));
    return block;
}

// The embedding table this stage holds: its own, or the last pipeline stage's copy.
static TensorId embedding_table(const Model *m) { return m->embed >= 0 ? m->embed : m->embed_copy; }

void embedding_lookup(const Model *m, ModelActs *a, real *out, const int32_t *tokens) {
    VocabSlice slice = vocab_slice_of_plan(&m->plan);
    vocab_embedding_forward(&slice, &a->vocab_scratch, out, tokens, tt_param(&m->tt, embedding_table(m)), a->N,
                            m->plan.hidden);
}

void embedding_lookup_backward(Model *m, ModelActs *a, const real *d_out, const int32_t *tokens) {
    VocabSlice slice = vocab_slice_of_plan(&m->plan);
    vocab_embedding_backward(&slice, &a->vocab_scratch, tt_grad(&m->tt, embedding_table(m)), d_out, tokens, a->N,
                             m->plan.hidden);
}

// The first block's input; a bf16 residual stream (layout.h) takes the embedding rounded once,
// looked up into the forward's ffn_out first (free until the first FFN).
void embedding_model_forward(const Model *m, ModelActs *a, const int32_t *tokens) {
    if (m->plan.residual_store == STORE_FP32) {
        embedding_lookup(m, a, a->x_entry, tokens);
        return;
    }
    embedding_lookup(m, a, a->ffn_out, tokens);
    bf16_pack(a->x_entry, a->ffn_out, (size_t)a->N_local * m->plan.hidden);
}

void embedding_model_backward(Model *m, ModelActs *a, const int32_t *tokens) {
    embedding_lookup_backward(m, a, a->d_resid, tokens);
}

double head_loss_forward(const Model *m, const HeadLoss *h, const real *hidden_full, const int32_t *targets,
                         const real *mask, int N) {
    int H = m->plan.hidden, V = m->plan.vocab;
    qlinear_forward_stored(NULL, h->logits, hidden_full, h->hidden_store, tt_param(&m->tt, m->lm_head), N, H,
                           V);  // this rank's vocabulary
    if (!targets) return 0;
    VocabSlice slice = vocab_slice_of_plan(&m->plan);
    vocab_cross_entropy_forward(&slice, h->token_loss, h->token_lse, h->logits, targets, N);
    // (counted, total) of this rank's tokens; with context parallelism summed over the
    // sequence's ranks: the mean over every token of the micro-batch, not a mean of means
    double sums[2];
    lm_loss_sums(loss_sums_block(), h->token_loss, mask, N);
    device_download(sums, loss_sums_block(), sizeof(sums));  // once per micro-batch: 16 bytes
    if (m->plan.cp_size > 1) comm_allreduce_sum_double(m->plan.cp, sums, 2);
    double counted = sums[0], total = sums[1];
    lm_loss_weights(h->loss_weight, mask, counted, N);
    return counted > 0 ? total / counted : 0;
}

void head_loss_backward(Model *m, ModelActs *a, const HeadLoss *h, const real *hidden_full, const int32_t *targets,
                        double weight) {
    int N = a->N, H = m->plan.hidden, V = m->plan.vocab;
    TpRegion region = model_tp_region(m);
    VocabSlice slice = vocab_slice_of_plan(&m->plan);
    vec_scale_double(a->d_token_loss, h->loss_weight, weight, (size_t)N);
    vocab_cross_entropy_backward(&slice, &a->vocab_scratch, a->d_logits, h->logits, h->token_lse, targets,
                                 a->d_token_loss, N);
    // logits = hidden·W_headᵀ: d_hidden = Σ_tp d_logits·W_head, dW_head += d_logitsᵀ·hidden
    vec_zero(a->d_norm_full, (size_t)N * H);
    qlinear_backward_stored(NULL, a->d_norm_full, tt_grad(&m->tt, m->lm_head), a->d_logits, hidden_full,
                            h->hidden_store, tt_param(&m->tt, m->lm_head), N, H, V);
    tp_enter_backward(&region, a->d_norm_full, a->d_norm, N, H);
}

// The main head's loss buffers.
static HeadLoss main_head(const ModelActs *a) {
    return (HeadLoss){.logits = a->logits, .token_loss = a->token_loss, .token_lse = a->token_lse,
                      .loss_weight = a->loss_weight, .hidden_store = a->lnf_store};
}

void lm_head_forward(const Model *m, ModelActs *a, const Batch *batch) {
    int N = a->N, H = m->plan.hidden;
    rmsnorm_forward(a->lnf, a->lnf_store, a->lnf_rstd, a->x_final, m->plan.residual_store,
                    tt_param(&m->tt, m->final_norm), a->N_local, H, (real)m->cfg.norm_epsilon);
    model_tp_gather_stored(m, a->sp_workspace, a->lnf, a->lnf_full, a->lnf_store, N, H);
    HeadLoss h = main_head(a);
    a->lm_loss = head_loss_forward(m, &h, a->lnf_full, batch->targets, batch->loss_mask, N);
}

void lm_head_backward_loss(Model *m, ModelActs *a, const Batch *batch, double loss_scale) {
    MT_ASSERT(batch->targets);
    HeadLoss h = main_head(a);
    head_loss_backward(m, a, &h, a->lnf_full, batch->targets, loss_scale);
}

void lm_head_backward_norm(Model *m, ModelActs *a) {
    int H = m->plan.hidden;
    vec_zero(a->d_resid, (size_t)a->N_local * H);
    rmsnorm_backward(a->d_resid, tt_grad(&m->tt, m->final_norm), a->d_norm, a->x_final, m->plan.residual_store,
                     tt_param(&m->tt, m->final_norm), a->lnf_rstd, a->N_local, H);
}

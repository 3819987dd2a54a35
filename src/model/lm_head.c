// lm_head.c — the token embedding and the LM head with its loss, vocab-parallel with
// tensor parallelism (model/vocab_parallel.h).
#include "model/lm_head.h"

#include "model/layers.h"
#include "model/vocab_parallel.h"
#include "core/device.h"
#include "ops/ops.h"
#include "ops/ops_loss.h"

// The (counted, total) pair lm_loss_sums writes: one tensor block of two doubles for the
// process, made on first use (the head's forward runs one micro-batch at a time).
static double *loss_sums_block(void) {
    static double *block;
    if (!block) block = device_calloc(2, sizeof(double));
    return block;
}

void embedding_model_forward(const Model *m, ModelActs *a, const int32_t *tokens) {
    VocabSlice slice = vocab_slice_of_plan(&m->plan);
    vocab_embedding_forward(&slice, &a->vocab_scratch, a->x_entry, tokens, tt_param(&m->tt, m->embed), a->N,
                            m->plan.hidden);
}

void embedding_model_backward(Model *m, ModelActs *a, const int32_t *tokens) {
    VocabSlice slice = vocab_slice_of_plan(&m->plan);
    vocab_embedding_backward(&slice, &a->vocab_scratch, tt_grad(&m->tt, m->embed), a->d_resid, tokens, a->N,
                             m->plan.hidden);
}

void lm_head_forward(const Model *m, ModelActs *a, const Batch *batch) {
    const Config *c = &m->cfg;
    int N = a->N, H = m->plan.hidden, V = m->plan.vocab;
    TpRegion region = model_tp_region(m);
    rmsnorm_forward(a->lnf, a->lnf_rstd, a->x_final, tt_param(&m->tt, m->final_norm), a->N_local, H,
                    (real)c->norm_epsilon);
    tp_enter_forward(&region, a->lnf, a->lnf_full, N, H);
    linear_forward(a->logits, a->lnf_full, tt_param(&m->tt, m->lm_head), N, H, V);  // this rank's vocabulary
    a->lm_loss = 0;
    if (!batch->targets) return;
    VocabSlice slice = vocab_slice_of_plan(&m->plan);
    vocab_cross_entropy_forward(&slice, a->token_loss, a->token_lse, a->logits, batch->targets, N);
    // (counted, total) of this rank's tokens; with context parallelism summed over the
    // sequence's ranks: the mean over every token of the micro-batch, not a mean of means
    double sums[2];
    lm_loss_sums(loss_sums_block(), a->token_loss, batch->loss_mask, N);
    device_download(sums, loss_sums_block(), sizeof(sums));  // once per micro-batch: 16 bytes
    if (m->plan.cp_size > 1) comm_allreduce_sum_double(m->plan.cp, sums, 2);
    double counted = sums[0], total = sums[1];
    lm_loss_weights(a->loss_weight, batch->loss_mask, counted, N);
    a->lm_loss = counted > 0 ? total / counted : 0;
}

void lm_head_backward(Model *m, ModelActs *a, const Batch *batch, double loss_scale) {
    int N = a->N, H = m->plan.hidden, V = m->plan.vocab;
    TpRegion region = model_tp_region(m);
    VocabSlice slice = vocab_slice_of_plan(&m->plan);
    MT_ASSERT(batch->targets);
    vec_scale_double(a->d_token_loss, a->loss_weight, loss_scale, (size_t)N);
    vocab_cross_entropy_backward(&slice, &a->vocab_scratch, a->d_logits, a->logits, a->token_lse, batch->targets,
                                 a->d_token_loss, N);
    // logits = lnf·W_headᵀ: d_lnf = Σ_tp d_logits·W_head, dW_head += d_logitsᵀ·lnf
    vec_zero(a->d_norm_full, (size_t)N * H);
    linear_backward(a->d_norm_full, tt_grad(&m->tt, m->lm_head), a->d_logits, a->lnf_full,
                    tt_param(&m->tt, m->lm_head), N, H, V);
    tp_enter_backward(&region, a->d_norm_full, a->d_norm, N, H);
    vec_zero(a->d_resid, (size_t)a->N_local * H);
    rmsnorm_backward(a->d_resid, tt_grad(&m->tt, m->final_norm), a->d_norm, a->x_final,
                     tt_param(&m->tt, m->final_norm), a->lnf_rstd, a->N_local, H);
}

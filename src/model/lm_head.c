#include "model/lm_head.h"

#include "ops/ops.h"

void embedding_model_forward(const Model *m, ModelActs *a, const int32_t *tokens) {
    MT_ASSERT(m->plan.tp_size == 1);
    embedding_forward(a->layers[0].x_in, tokens, tt_param(&m->tt, m->embed), a->N, m->plan.hidden);
}

void embedding_model_backward(Model *m, ModelActs *a, const int32_t *tokens) {
    MT_ASSERT(m->plan.tp_size == 1);
    embedding_backward(tt_grad(&m->tt, m->embed), a->d_resid, tokens, a->N, m->plan.hidden);
}

void lm_head_forward(const Model *m, ModelActs *a, const Batch *batch) {
    const Config *c = &m->cfg;
    int N = a->N, H = c->hidden_size, V = c->padded_vocab_size;
    rmsnorm_forward(a->lnf, a->lnf_rstd, a->x_final, tt_param(&m->tt, m->final_norm), N, H, (real)c->norm_epsilon);
    linear_forward(a->logits, a->lnf, tt_param(&m->tt, m->lm_head), N, H, V);
    a->lm_loss = 0;
    if (!batch->targets) return;
    cross_entropy_forward(a->token_loss, a->token_lse, a->logits, batch->targets, N, V);
    double counted = 0, total = 0;
    for (int n = 0; n < N; n++) {
        double w = batch->loss_mask ? batch->loss_mask[n] : 1;
        counted += w;
        total += w * a->token_loss[n];
    }
    for (int n = 0; n < N; n++)
        a->loss_weight[n] = counted > 0 ? (real)((batch->loss_mask ? batch->loss_mask[n] : 1) / counted) : 0;
    a->lm_loss = counted > 0 ? total / counted : 0;
}

void lm_head_backward(Model *m, ModelActs *a, const Batch *batch, double loss_scale) {
    const Config *c = &m->cfg;
    int N = a->N, H = c->hidden_size, V = c->padded_vocab_size;
    MT_ASSERT(batch->targets);
    for (int n = 0; n < N; n++) a->d_token_loss[n] = (real)(a->loss_weight[n] * loss_scale);
    cross_entropy_backward(a->d_logits, a->logits, a->token_lse, batch->targets, a->d_token_loss, N, V);
    // logits = lnf·W_headᵀ: d_lnf = d_logits·W_head, dW_head += d_logitsᵀ·lnf
    vec_zero(a->d_norm, (size_t)N * H);
    linear_backward(a->d_norm, tt_grad(&m->tt, m->lm_head), a->d_logits, a->lnf, tt_param(&m->tt, m->lm_head),
                    N, H, V);
    vec_zero(a->d_resid, (size_t)N * H);
    rmsnorm_backward(a->d_resid, tt_grad(&m->tt, m->final_norm), a->d_norm, a->x_final,
                     tt_param(&m->tt, m->final_norm), a->lnf_rstd, N, H);
}

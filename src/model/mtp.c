// mtp.c — multi-token prediction (DeepSeek-V3, as Megatron-Core trains it), on the chunk
// holding the LM head, after the head's forward.
//
// Depth k (0 ≤ k < D) predicts, at each position t, the label k+1 positions further on
// (the token t+k+2) from the previous depth's output h (depth 0: the final norm's output)
// and the embedding of the token t+k+1:
//
//   x      = eh_proj([enorm(embed(token_{t+k+1})), hnorm(h_t)])      [H, 2H] · (2H)
//   out_k  = final_norm_k(layer_{L+k}(x))                             a transformer layer
//   loss_k = masked mean CE(head(out_k), label_{t+k+1})                the shared LM head
//
// with tokens, labels and mask rolled along each sequence (token 0 and mask 0 past its
// end: model/activations.c). The objective adds mtp_loss_scaling_factor / D · Σ_k loss_k,
// whose gradients flow into the decoder through h (depth 0 reads the final norm's output)
// and into the shared embedding and head. The tensor-parallel layout is the decoder's:
// eh_proj is whole on every rank (each computes its own tokens with sequence parallelism).
#include <string.h>

#include "model/layers.h"
#include "model/lm_head.h"
#include "model/stage_pass.h"
#include "ops/ops.h"
#include "ops/ops_parallel.h"
#include "ops/quantized_linear.h"

// dst[b,t] = src[b,t+shift] (elements of `size` bytes) within each of the B rows of T, zero
// bytes past a row's end.
static void roll_rows(void *dst, const void *src, size_t size, int B, int T, int shift) {
    size_t keep = shift < T ? (size_t)(T - shift) : 0;
    for (int b = 0; b < B; b++) {
        char *row = (char *)dst + (size_t)b * T * size;
        memcpy(row, (const char *)src + ((size_t)b * T + (size_t)shift) * size, keep * size);
        memset(row + keep * size, 0, ((size_t)T - keep) * size);
    }
}

void mtp_roll_inputs(const Batch *b, int depths, int32_t *tokens, int32_t *targets, real *loss_mask) {
    size_t n = (size_t)b->B * b->T;
    real *ones = b->loss_mask ? NULL : mt_malloc(n * sizeof(real));
    for (size_t i = 0; ones && i < n; i++) ones[i] = 1;
    for (int k = 0; k < depths; k++) {
        roll_rows(tokens + k * n, b->tokens, sizeof(int32_t), b->B, b->T, k + 1);
        roll_rows(targets + k * n, b->targets, sizeof(int32_t), b->B, b->T, k + 1);
        roll_rows(loss_mask + k * n, ones ? ones : b->loss_mask, sizeof(real), b->B, b->T, k + 1);
    }
    free(ones);
}

// What depth k reads as the previous depth's output: the final norm's (depth 0) or depth k−1's.
static const real *depth_input(const ModelActs *a, int k) { return k ? a->mtp[k - 1].out : a->lnf; }

static HeadLoss depth_head(const MtpActs *d) {
    return (HeadLoss){.logits = d->logits, .token_loss = d->token_loss, .token_lse = d->token_lse,
                      .loss_weight = d->loss_weight};
}

// The gradient weight of each depth's mean loss in the objective.
static double depth_weight(const Config *c) { return c->mtp_loss_scaling_factor / c->mtp_num_layers; }

// cat (N,2H) = [left, right] of two (N,H) row sets, or back (split) when `split`.
static void concat_halves(real *cat, real *left, real *right, int N, int H, int split) {
    size_t row = (size_t)H * sizeof(real), pitch = 2 * row;
    if (split) {
        rows_copy_strided(left, row, cat, pitch, row, N);
        rows_copy_strided(right, row, cat + H, pitch, row, N);
    } else {
        rows_copy_strided(cat, pitch, left, row, row, N);
        rows_copy_strided(cat + H, pitch, right, row, row, N);
    }
}

static void depth_forward(StagePass *s, int k) {
    const Model *m = s->m;
    ModelActs *a = s->a;
    const MtpParams *mp = &m->mtp[k];
    MtpActs *d = &a->mtp[k];
    int l = m->plan.layers + k, N = a->N, N_local = a->N_local, H = m->plan.hidden;
    real eps = (real)m->cfg.norm_epsilon;
    embedding_lookup(m, a, d->emb, d->tokens);
    rmsnorm_forward(d->emb_norm, STORE_FP32, d->emb_rstd, d->emb, STORE_FP32, tt_param(&m->tt, mp->enorm), N_local, H,
                    eps);
    rmsnorm_forward(d->hidden_norm, STORE_FP32, d->hidden_rstd, depth_input(a, k), STORE_FP32,
                    tt_param(&m->tt, mp->hnorm), N_local, H, eps);
    concat_halves(d->cat, d->emb_norm, d->hidden_norm, N_local, H, 0);
    qlinear_forward(model_quant(m, mp->eh_proj), a->layers[l].x_in, d->cat, tt_param(&m->tt, mp->eh_proj), N_local,
                    2 * H, H);
    stage_block_forward(s, l, d->x_out);
    rmsnorm_forward(d->out, STORE_FP32, d->out_rstd, d->x_out, STORE_FP32, tt_param(&m->tt, mp->final_norm), N_local,
                    H, eps);
    model_tp_gather_gemm_rows(m, a->sp_workspace, d->out, d->out_full, N, H);
    HeadLoss h = depth_head(d);
    a->mtp_loss[k] = head_loss_forward(m, &h, d->out_full, d->targets, d->loss_mask, N);
}

void mtp_forward(StagePass *s) {
    ModelActs *a = s->a;
    for (int k = 0; k < a->mtp_depths; k++) {
        depth_forward(s, k);
        a->mtp_objective += depth_weight(&s->m->cfg) * a->mtp_loss[k];
    }
}

// Depth k's backward: from its loss and (k < D−1) the next depth's gradient of its output
// (a->d_mtp_hidden) to the gradient of its input h, left in a->d_mtp_hidden.
static void depth_backward(StagePass *s, int k) {
    Model *m = s->m;
    ModelActs *a = s->a;
    const MtpParams *mp = &m->mtp[k];
    MtpActs *d = &a->mtp[k];
    int l = m->plan.layers + k, N_local = a->N_local, H = m->plan.hidden;
    size_t n = (size_t)N_local * H;
    HeadLoss h = depth_head(d);
    head_loss_backward(m, a, &h, d->out_full, d->targets, s->loss_scale * depth_weight(&m->cfg));  // -> d_norm
    if (k + 1 < a->mtp_depths) vec_add(a->d_norm, a->d_mtp_hidden, n);
    vec_zero(a->d_resid, n);
    rmsnorm_backward(a->d_resid, tt_grad(&m->tt, mp->final_norm), a->d_norm, d->x_out, STORE_FP32,
                     tt_param(&m->tt, mp->final_norm), d->out_rstd, N_local, H);
    stage_block_backward(s, l);  // d_resid: d(x_out) -> d(x_in)
    vec_zero(a->d_mtp_cat, 2 * n);
    qlinear_backward(model_quant(m, mp->eh_proj), a->d_mtp_cat, tt_grad(&m->tt, mp->eh_proj), a->d_resid, d->cat,
                     tt_param(&m->tt, mp->eh_proj), N_local, 2 * H, H);
    concat_halves(a->d_mtp_cat, a->d_norm, a->d_resid, N_local, H, 1);  // d(emb_norm), d(hidden_norm)
    vec_zero(a->d_mtp_emb, n);
    rmsnorm_backward(a->d_mtp_emb, tt_grad(&m->tt, mp->enorm), a->d_norm, d->emb, STORE_FP32,
                     tt_param(&m->tt, mp->enorm), d->emb_rstd, N_local, H);
    embedding_lookup_backward(m, a, a->d_mtp_emb, d->tokens);
    vec_zero(a->d_mtp_hidden, n);
    rmsnorm_backward(a->d_mtp_hidden, tt_grad(&m->tt, mp->hnorm), a->d_resid, depth_input(a, k), STORE_FP32,
                     tt_param(&m->tt, mp->hnorm), d->hidden_rstd, N_local, H);
    if (s->ready) s->ready(s->ctx, l);  // the depth's tensors and its layer's are complete
}

void mtp_backward(StagePass *s) {
    for (int k = s->a->mtp_depths - 1; k >= 0; k--) depth_backward(s, k);
}

#include "model/stage_pass.h"

#include <string.h>

#include "model/dropout.h"
#include "model/layers.h"
#include "model/lm_head.h"
#include "ops/ops.h"
#include "ops/quantized_linear.h"

// The phases of a MoE layer in a pass (model/layers.h; PHASE_EXCHANGE: forward only).
enum { PHASE_BEGIN, PHASE_EXCHANGE, PHASE_EXPERTS, PHASE_END };

void stage_pass_forward(StagePass *s, const Model *m, ModelActs *a, const Batch *batch, KvCache *kv, int pos0) {
    // the forward writes only a and the router's bookkeeping (RouterState, behind a pointer)
    *s = (StagePass){.kind = PASS_FORWARD, .m = (Model *)m, .a = a, .batch = batch, .kv = kv, .pos0 = pos0};
}

void stage_pass_backward(StagePass *s, Model *m, ModelActs *a, double loss_scale, GradsReadyFn ready, void *ctx) {
    *s = (StagePass){.kind = PASS_BACKWARD, .m = m, .a = a, .loss_scale = loss_scale, .ready = ready, .ctx = ctx};
}

static const StageChunk *chunk_of(const StagePass *s) { return &s->m->plan.chunk[s->a->chunk]; }

// With context parallelism each of this rank's tokens' index in the micro-batch, else NULL.
static const int32_t *token_index_of(const StagePass *s) { return s->m->plan.cp_size > 1 ? s->a->token_index : NULL; }

// The attention block and the norm before the FFN: x_in -> x_mid, ln2.
static void attention_and_norm_forward(const Model *m, int l, LayerActs *la, const ModelActs *a, KvCache *kv) {
    attention_block_forward(m, l, la, a, kv);
    const real *w = tt_param(&m->tt, m->layers[l].post_attn_norm);
    rmsnorm_forward(la->ln2, la->ln2_store, la->ln2_rstd, la->x_mid, la->resid_store, w, a->N_local, m->plan.hidden,
                    (real)m->cfg.norm_epsilon);
}

// x_out = x_mid + dropout(ffn_out): the next block's input, stored as the layer's stream is (the
// dropout in place: ffn_out is dead once added).
static void layer_output(const Model *m, const ModelActs *a, int l, const LayerActs *la, real *x_out) {
    hidden_dropout(m, a, l, DROPOUT_FFN_OUT, la->ffn_out, la->ffn_out);
    residual_add(x_out, la->resid_store, la->x_mid, la->resid_store, la->ffn_out, (size_t)a->N_local * m->plan.hidden);
}

// ---- forward ------------------------------------------------------------------------------

// The micro-batch's shapes and tokens; the embedding when the chunk holds it (else x_entry
// holds the previous stage's output).
static void forward_prologue(StagePass *s) {
    const Model *m = s->m;
    const LayoutPlan *p = &m->plan;
    ModelActs *a = s->a;
    const Batch *batch = s->batch = acts_stage_batch(a, s->batch);
    int B = batch->B, T = batch->T, N = B * T;
    a->B = B;
    a->T = T;
    a->N = N;
    a->N_local = plan_local_tokens(p, N);
    a->tokens = (TokenLayout){.B = B, .T = T, .pos0 = s->pos0, .positions = batch->positions,
                              .key_start = batch->key_start};
    if (p->cp_size > 1) plan_token_index(p, a->token_index, B, T);
    if (chunk_of(s)->holds_embedding) embedding_model_forward(m, a, batch->tokens);
    memset(a->balance_loss, 0, sizeof(a->balance_loss));
    a->z_loss = a->aux_objective = 0;
    s->layer = chunk_of(s)->first_layer;
    s->started = 1;
}

// The layer's output into the next block's input (or the chunk's output).
static void forward_layer_done(StagePass *s) {
    ModelActs *a = s->a;
    layer_output(s->m, a, s->layer, &a->layers[s->layer],
                 s->layer + 1 < chunk_layer_end(chunk_of(s)) ? a->layers[s->layer + 1].x_in : a->x_final);
    s->layer++;
    s->phase = PHASE_BEGIN;
}

static void add_router_losses(StagePass *s, int l) {
    ModelActs *a = s->a;
    const RouterOutput *r = &a->layers[l].moe.route;
    for (int t = 0; t < BALANCE_TYPES; t++) a->balance_loss[t] += r->balance_loss[t];
    a->z_loss += r->z_loss;
    a->aux_objective += router_objective(r, &s->m->router);
    s->dropped += r->dropped;
}

// The shares of the means over every MoE layer of the model (the stages' shares add up);
// the loss when the chunk holds the head (else x_final goes to the next stage).
static void forward_epilogue(StagePass *s) {
    const Config *c = &s->m->cfg;
    ModelActs *a = s->a;
    a->lm_loss = a->mtp_objective = 0;
    if (chunk_of(s)->holds_head) {
        lm_head_forward(s->m, a, s->batch);
        if (s->batch->targets) mtp_forward(s);  // adds its MoE layers' router losses
    }
    int moe_layers = model_moe_layers(c);
    if (moe_layers) {
        for (int t = 0; t < BALANCE_TYPES; t++) a->balance_loss[t] /= moe_layers;
        a->z_loss /= moe_layers;
    }
    a->dropped_frac = moe_layers ? (double)s->dropped / ((double)a->N_local * c->moe_router_topk * moe_layers) : 0;
    s->finished = 1;
}

static int forward_advance(StagePass *s) {
    const Model *m = s->m;
    ModelActs *a = s->a;
    if (!s->started) forward_prologue(s);
    while (s->layer < chunk_layer_end(chunk_of(s))) {
        int l = s->layer, N = a->N;
        LayerActs *la = &a->layers[l];
        const LayerParams *lp = &m->layers[l];
        if (s->phase == PHASE_BEGIN) {
            attention_and_norm_forward(m, l, la, a, s->kv ? &s->kv[l] : NULL);
            if (!lp->is_moe) {
                mlp_forward(m, l, la, N);
                forward_layer_done(s);
                continue;
            }
            moe_forward_begin(m, l, la, s->batch, token_index_of(s), PASS_FORWARD);
            s->phase = PHASE_EXCHANGE;
            return 1;
        }
        if (s->phase == PHASE_EXCHANGE) {
            moe_forward_exchange(m, l, la);
            s->phase = PHASE_EXPERTS;
            return 1;
        }
        if (s->phase == PHASE_EXPERTS) {
            moe_forward_experts(m, l, la);
            s->phase = PHASE_END;
            return 1;
        }
        moe_forward_end(m, l, la, N);
        add_router_losses(s, l);
        forward_layer_done(s);
    }
    forward_epilogue(s);
    return 0;
}

void stage_block_forward(StagePass *s, int l, real *x_out) {
    const Model *m = s->m;
    ModelActs *a = s->a;
    LayerActs *la = &a->layers[l];
    attention_and_norm_forward(m, l, la, a, NULL);
    if (!m->layers[l].is_moe) {
        mlp_forward(m, l, la, a->N);
    } else {
        moe_forward(m, l, la, s->batch, token_index_of(s), PASS_FORWARD);
        add_router_losses(s, l);
    }
    layer_output(m, a, l, la, x_out);
}

// ---- recomputation --------------------------------------------------------------------------

// The forward of layer `last`'s recompute group again, from the input the group kept
// (model/activations.c), just before the group's backward: every activation its layers'
// backwards read is back. A recomputed forward counts nothing the forward counted (router
// losses, routing bookkeeping, dropped choices: PASS_RECOMPUTE), draws the same jitter and
// forced-balancing noise, and leaves the group's output (the next block's kept input) alone.
static void recompute_group(StagePass *s, int last) {
    Model *m = s->m;
    ModelActs *a = s->a;
    const Batch *batch = &a->input;
    for (int l = m->plan.recompute_first[last]; l <= last; l++) {
        LayerActs *la = &a->layers[l];
        attention_and_norm_forward(m, l, la, a, NULL);
        if (m->layers[l].is_moe) moe_forward(m, l, la, batch, token_index_of(s), PASS_RECOMPUTE);
        else mlp_forward(m, l, la, batch->B * batch->T);
        if (l < last) layer_output(m, a, l, la, a->layers[l + 1].x_in);
    }
}

// --recompute-modules layernorm: both norms' outputs of layer l again (the buffers every
// layer shares), before its backward reads them.
static void recompute_norms(const Model *m, int l, LayerActs *la, const ModelActs *a) {
    const LayerParams *lp = &m->layers[l];
    int N_local = a->N_local, H = m->plan.hidden;
    real eps = (real)m->cfg.norm_epsilon;
    rmsnorm_forward(la->ln1, la->ln1_store, la->ln1_rstd, la->x_in, la->resid_store, tt_param(&m->tt, lp->input_norm),
                    N_local, H, eps);
    rmsnorm_forward(la->ln2, la->ln2_store, la->ln2_rstd, la->x_mid, la->resid_store,
                    tt_param(&m->tt, lp->post_attn_norm), N_local, H, eps);
}

// What layer l's backward reads and the forward did not keep: its recompute group (full,
// when l is the group's last layer), or the selective modules the layer as a whole needs
// (the norms, the MoE block; the other modules are recomputed inside their blocks' backward).
static void recompute_before_backward(StagePass *s, int l) {
    Model *m = s->m;
    ModelActs *a = s->a;
    LayerActs *la = &a->layers[l];
    if (plan_recompute_last(&m->plan, l)) recompute_group(s, l);
    if (plan_recomputes(&m->plan, RECOMPUTE_LAYERNORM)) recompute_norms(m, l, la, a);
    if (m->layers[l].is_moe && plan_recomputes(&m->plan, RECOMPUTE_MOE))
        moe_forward(m, l, la, &a->input, token_index_of(s), PASS_RECOMPUTE);
}

// ---- backward -----------------------------------------------------------------------------

// x_out = x_mid + ffn(RMSNorm(x_mid)): with d_resid = d(x_mid) after the FFN's backward,
// the norm's and the attention block's (d(x_mid) -> d(x_in)); the layer's gradients are then final.
static void norm_and_attention_backward(Model *m, ModelActs *a, int l) {
    LayerActs *la = &a->layers[l];
    const LayerParams *lp = &m->layers[l];
    rmsnorm_backward(a->d_resid, tt_grad(&m->tt, lp->post_attn_norm), a->d_norm, la->x_mid, la->resid_store,
                     tt_param(&m->tt, lp->post_attn_norm), la->ln2_rstd, a->N_local, m->plan.hidden);
    attention_block_backward(m, l, la, a);
}

static void backward_layer_done(StagePass *s) {
    int l = s->layer;
    norm_and_attention_backward(s->m, s->a, l);
    if (s->ready) s->ready(s->ctx, l);
    s->layer--;
    s->phase = PHASE_BEGIN;
}

// The stochastic rounding of layer l's gradients in this phase of its backward draws from
// the micro-batch's own stream of that piece (whatever ran before on this rank).
static void seed_gradient_rounding(StagePass *s, int l) {
    if (s->m->quant)
        quant_context_seed_rounding(s->m->quant, s->a->input.noise_seed, (uint64_t)l * (PHASE_END + 1) + s->phase);
}

void stage_block_backward(StagePass *s, int l) {
    Model *m = s->m;
    ModelActs *a = s->a;
    LayerActs *la = &a->layers[l];
    recompute_before_backward(s, l);
    const real *d_ffn = hidden_dropout_backward(m, a, l, DROPOUT_FFN_OUT);
    if (m->layers[l].is_moe) moe_backward(m, l, la, a, d_ffn, s->loss_scale);
    else mlp_backward(m, l, la, a, d_ffn);
    norm_and_attention_backward(m, a, l);
}

// The head's backward, multi-token prediction's between its two halves: d_resid = d(x_final).
static void head_backward(StagePass *s) {
    Model *m = s->m;
    ModelActs *a = s->a;
    if (a->mtp_depths) mtp_backward(s);  // first: it uses the scratch the head's halves pass on
    lm_head_backward_loss(m, a, &a->input, s->loss_scale);
    if (a->mtp_depths) vec_add(a->d_norm, a->d_mtp_hidden, (size_t)a->N_local * m->plan.hidden);
    lm_head_backward_norm(m, a);
    if (s->ready) s->ready(s->ctx, GRADS_HEAD);
}

static int backward_advance(StagePass *s) {
    Model *m = s->m;
    ModelActs *a = s->a;
    const StageChunk *k = chunk_of(s);
    if (!s->started) {
        if (k->holds_head) head_backward(s);  // sets d_resid = d(x_final); else it holds the next stage's gradient
        s->layer = chunk_layer_end(k) - 1;
        s->started = 1;
    }
    while (s->layer >= k->first_layer) {
        int l = s->layer;
        LayerActs *la = &a->layers[l];
        seed_gradient_rounding(s, l);
        if (s->phase == PHASE_BEGIN) {
            recompute_before_backward(s, l);
            s->d_ffn = hidden_dropout_backward(m, a, l, DROPOUT_FFN_OUT);
            if (!m->layers[l].is_moe) {
                mlp_backward(m, l, la, a, s->d_ffn);
                backward_layer_done(s);
                continue;
            }
            moe_backward_begin(m, l, la, a, s->d_ffn);
            s->phase = PHASE_EXPERTS;
            return 1;
        }
        if (s->phase == PHASE_EXPERTS) {
            moe_backward_experts(m, l, la, a);
            s->phase = PHASE_END;
            return 1;
        }
        moe_backward_end(m, l, la, a, s->d_ffn, s->loss_scale);
        backward_layer_done(s);
    }
    if (k->holds_embedding) {  // else d_resid is d(x_entry), for the previous stage
        embedding_model_backward(m, a, a->input.tokens);
        if (s->ready) s->ready(s->ctx, GRADS_EMBEDDING);
    }
    s->finished = 1;
    return 0;
}

int stage_pass_advance(StagePass *s) {
    if (s->finished) return 0;
    return s->kind == PASS_FORWARD ? forward_advance(s) : backward_advance(s);
}

#include "model/stage_pass.h"

#include <string.h>

#include "model/layers.h"
#include "model/lm_head.h"
#include "ops/ops.h"

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

// x_out = x_mid + ffn_out: the next block's input (or the chunk's output).
static void forward_layer_done(StagePass *s) {
    ModelActs *a = s->a;
    const LayerActs *la = &a->layers[s->layer];
    size_t n = (size_t)a->N_local * s->m->plan.hidden;
    real *x_out = s->layer + 1 < chunk_layer_end(chunk_of(s)) ? a->layers[s->layer + 1].x_in : a->x_final;
    vec_copy(x_out, la->x_mid, n);
    vec_add(x_out, la->ffn_out, n);
    s->layer++;
    s->phase = PHASE_BEGIN;
}

static void add_router_losses(StagePass *s) {
    ModelActs *a = s->a;
    const RouterOutput *r = &a->layers[s->layer].moe.route;
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
    int moe_layers = model_moe_layers(c);
    if (moe_layers) {
        for (int t = 0; t < BALANCE_TYPES; t++) a->balance_loss[t] /= moe_layers;
        a->z_loss /= moe_layers;
    }
    a->dropped_frac = moe_layers ? (double)s->dropped / ((double)a->N_local * c->moe_router_topk * moe_layers) : 0;
    a->lm_loss = 0;
    if (chunk_of(s)->holds_head) lm_head_forward(s->m, a, s->batch);
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
            attention_block_forward(m, l, la, &a->tokens, s->kv ? &s->kv[l] : NULL);
            rmsnorm_forward(la->ln2, la->ln2_rstd, la->x_mid, tt_param(&m->tt, lp->post_attn_norm), a->N_local,
                            m->plan.hidden, (real)m->cfg.norm_epsilon);
            if (!lp->is_moe) {
                mlp_forward(m, l, la, N);
                forward_layer_done(s);
                continue;
            }
            moe_forward_begin(m, l, la, s->batch, m->plan.cp_size > 1 ? a->token_index : NULL);
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
        add_router_losses(s);
        forward_layer_done(s);
    }
    forward_epilogue(s);
    return 0;
}

// ---- backward -----------------------------------------------------------------------------

// x_out = x_mid + ffn(RMSNorm(x_mid)): with d_resid = d(x_mid) after the FFN's backward,
// the norm's and the attention block's (d(x_mid) -> d(x_in)); the layer's gradients are then final.
static void backward_layer_done(StagePass *s) {
    Model *m = s->m;
    ModelActs *a = s->a;
    int l = s->layer;
    LayerActs *la = &a->layers[l];
    const LayerParams *lp = &m->layers[l];
    rmsnorm_backward(a->d_resid, tt_grad(&m->tt, lp->post_attn_norm), a->d_norm, la->x_mid,
                     tt_param(&m->tt, lp->post_attn_norm), la->ln2_rstd, a->N_local, m->plan.hidden);
    attention_block_backward(m, l, la, a);
    if (s->ready) s->ready(s->ctx, l);
    s->layer--;
    s->phase = PHASE_BEGIN;
}

static int backward_advance(StagePass *s) {
    Model *m = s->m;
    ModelActs *a = s->a;
    const StageChunk *k = chunk_of(s);
    if (!s->started) {
        if (k->holds_head) {  // sets d_resid = d(x_final); else it holds the next stage's gradient
            lm_head_backward(m, a, &a->input, s->loss_scale);
            if (s->ready) s->ready(s->ctx, GRADS_HEAD);
        }
        s->layer = chunk_layer_end(k) - 1;
        s->started = 1;
    }
    while (s->layer >= k->first_layer) {
        int l = s->layer;
        LayerActs *la = &a->layers[l];
        if (s->phase == PHASE_BEGIN) {
            if (!m->layers[l].is_moe) {
                mlp_backward(m, l, la, a, a->d_resid);
                backward_layer_done(s);
                continue;
            }
            moe_backward_begin(m, l, la, a, a->d_resid);
            s->phase = PHASE_EXPERTS;
            return 1;
        }
        if (s->phase == PHASE_EXPERTS) {
            moe_backward_experts(m, l, la, a);
            s->phase = PHASE_END;
            return 1;
        }
        moe_backward_end(m, l, la, a, a->d_resid, s->loss_scale);
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

// attention.c — the attention half of a decoder block: RMSNorm, q/k/v (standard GQA
// with optional QK-norm per head or per projection and --clip-qkv, or Multi-Latent
// Attention in mla.c), RoPE, causal attention, output projection, residual.
#include <math.h>
#include <string.h>

#include "model/layers.h"
#include "ops/ops.h"

AttentionWidths attention_widths(const Config *c) {
    AttentionWidths w = {.q = c->num_attention_heads * c->head_dim, .k = c->kv_heads * c->head_dim};
    w.v = c->multi_latent_attention ? c->num_attention_heads * c->v_head_dim : w.k;
    w.out = c->multi_latent_attention ? w.v : w.q;
    return w;
}

static AttentionShape attention_shape(const Config *c, int B, int T, int Tk, int pos0, int kv_row_stride,
                                      const int32_t *key_start) {
    AttentionShape s = {.B = B, .Tq = T, .Tk = Tk, .q_pos0 = pos0, .heads = c->num_attention_heads, .key_start = key_start,
                        .kv_heads = c->kv_heads, .head_dim = c->head_dim,
                        .v_head_dim = c->multi_latent_attention ? c->v_head_dim : c->head_dim,
                        .kv_row_stride = kv_row_stride, .scale = (real)(1.0 / sqrt((double)c->head_dim))};
    return s;
}

// Copy this chunk's keys and values into the cache at positions pos0 .. pos0+T (batch 1).
static void kv_cache_store(KvCache *kv, const real *k, const real *v, int T, int pos0) {
    if (pos0 + T > kv->capacity)
        mt_die("generation needs %d positions but the model supports %d (--max-position-embeddings)",
               pos0 + T, kv->capacity);
    memcpy(kv->k + (size_t)pos0 * kv->k_width, k, (size_t)T * kv->k_width * sizeof(real));
    memcpy(kv->v + (size_t)pos0 * kv->v_width, v, (size_t)T * kv->v_width * sizeof(real));
}

void attention_core_forward(const Model *m, LayerActs *la, const TokenLayout *tokens, KvCache *kv) {
    const Config *c = &m->cfg;
    int B = tokens->B, T = tokens->T, pos0 = tokens->pos0;
    if (kv) {
        kv_cache_store(kv, la->k, la->v, T, pos0);
        AttentionShape s = attention_shape(c, 1, T, pos0 + T, pos0, kv->capacity, tokens->key_start);
        attention_forward(la->att, la->lse, la->q, kv->k, kv->v, &s);
    } else {
        AttentionShape s = attention_shape(c, B, T, T, pos0, T, tokens->key_start);
        attention_forward(la->att, la->lse, la->q, la->k, la->v, &s);
    }
}

void attention_core_backward(const Model *m, LayerActs *la, ModelActs *a) {
    const Config *c = &m->cfg;
    AttentionWidths w = attention_widths(c);
    vec_zero(a->d_q, (size_t)a->N * w.q);
    vec_zero(a->d_k, (size_t)a->N * w.k);
    vec_zero(a->d_v, (size_t)a->N * w.v);
    AttentionShape s = attention_shape(c, a->B, a->T, a->T, 0, a->T, a->tokens.key_start);
    attention_backward(a->d_q, a->d_k, a->d_v, a->d_att, la->att, la->lse, la->q, la->k, la->v, &s);
}

// ---- standard attention: q, k, v projections, QK-norm, clip, RoPE --------------------------

// QK-norm of `heads` heads of width d per token: one RMSNorm per head, or over the whole
// projection (--qk-layernorm-scope projection).
static void qk_norm_forward(const Config *c, real *y, real *rstd, const real *x, const real *w, int N, int heads) {
    int d = c->head_dim;
    if (c->qk_norm_whole) rmsnorm_forward(y, rstd, x, w, N, heads * d, (real)c->norm_epsilon);
    else rmsnorm_forward(y, rstd, x, w, N * heads, d, (real)c->norm_epsilon);
}

static void qk_norm_backward(const Config *c, real *dx, real *dw, const real *dy, const real *x, const real *w,
                             const real *rstd, int N, int heads) {
    int d = c->head_dim;
    if (c->qk_norm_whole) rmsnorm_backward(dx, dw, dy, x, w, rstd, N, heads * d);
    else rmsnorm_backward(dx, dw, dy, x, w, rstd, N * heads, d);
}

// q, k, v from ln1: projection -> [QK-norm] -> [clip] -> RoPE (q, k).
static void standard_qkv_forward(const Model *m, const LayerParams *lp, LayerActs *la, const TokenLayout *tokens) {
    const Config *c = &m->cfg;
    const TensorTable *tt = &m->tt;
    int N = tokens->B * tokens->T, H = c->hidden_size, heads = c->num_attention_heads;
    AttentionWidths w = attention_widths(c);
    linear_forward(la->q_raw, la->ln1, tt_param(tt, lp->q_proj), N, H, w.q);
    linear_forward(la->k_raw, la->ln1, tt_param(tt, lp->k_proj), N, H, w.k);
    linear_forward(la->v_raw, la->ln1, tt_param(tt, lp->v_proj), N, H, w.v);
    if (c->qk_layernorm) {
        qk_norm_forward(c, la->q_normed, la->q_rstd, la->q_raw, tt_param(tt, lp->q_norm), N, heads);
        qk_norm_forward(c, la->k_normed, la->k_rstd, la->k_raw, tt_param(tt, lp->k_norm), N, c->kv_heads);
    }
    if (c->clip_qkv > 0) {
        real limit = (real)c->clip_qkv;
        clamp_forward(la->q, la->q_normed, (size_t)N * w.q, limit);
        clamp_forward(la->k, la->k_normed, (size_t)N * w.k, limit);
        clamp_forward(la->v, la->v_raw, (size_t)N * w.v, limit);
    }
    RopeLayout q_rope = rope_layout_heads(heads, c->head_dim), k_rope = rope_layout_heads(c->kv_heads, c->head_dim);
    q_rope.interleaved = k_rope.interleaved = c->rotary_interleaved;
    rope_forward(la->q, m->rope_cos_sin, tokens, &q_rope);
    rope_forward(la->k, m->rope_cos_sin, tokens, &k_rope);
}

// d_q, d_k, d_v (gradients of the final q, k, v) -> d_norm (+=) and the weight gradients.
static void standard_qkv_backward(Model *m, const LayerParams *lp, LayerActs *la, ModelActs *a) {
    const Config *c = &m->cfg;
    TensorTable *tt = &m->tt;
    int N = a->N, H = c->hidden_size, heads = c->num_attention_heads;
    AttentionWidths w = attention_widths(c);
    RopeLayout q_rope = rope_layout_heads(heads, c->head_dim), k_rope = rope_layout_heads(c->kv_heads, c->head_dim);
    q_rope.interleaved = k_rope.interleaved = c->rotary_interleaved;
    rope_backward(a->d_q, m->rope_cos_sin, &a->tokens, &q_rope);
    rope_backward(a->d_k, m->rope_cos_sin, &a->tokens, &k_rope);
    if (c->clip_qkv > 0) {  // in place: the gradient stops where the value was clamped
        real limit = (real)c->clip_qkv;
        clamp_backward(a->d_q, la->q_normed, (size_t)N * w.q, limit);
        clamp_backward(a->d_k, la->k_normed, (size_t)N * w.k, limit);
        clamp_backward(a->d_v, la->v_raw, (size_t)N * w.v, limit);
    }
    real *dq_raw = a->d_q, *dk_raw = a->d_k;
    if (c->qk_layernorm) {
        dq_raw = a->d_q_raw;
        dk_raw = a->d_k_raw;
        vec_zero(dq_raw, (size_t)N * w.q);
        vec_zero(dk_raw, (size_t)N * w.k);
        qk_norm_backward(c, dq_raw, tt_grad(tt, lp->q_norm), a->d_q, la->q_raw, tt_param(tt, lp->q_norm),
                         la->q_rstd, N, heads);
        qk_norm_backward(c, dk_raw, tt_grad(tt, lp->k_norm), a->d_k, la->k_raw, tt_param(tt, lp->k_norm),
                         la->k_rstd, N, c->kv_heads);
    }
    linear_backward(a->d_norm, tt_grad(tt, lp->q_proj), dq_raw, la->ln1, tt_param(tt, lp->q_proj), N, H, w.q);
    linear_backward(a->d_norm, tt_grad(tt, lp->k_proj), dk_raw, la->ln1, tt_param(tt, lp->k_proj), N, H, w.k);
    linear_backward(a->d_norm, tt_grad(tt, lp->v_proj), a->d_v, la->ln1, tt_param(tt, lp->v_proj), N, H, w.v);
}

// ---- the block ---------------------------------------------------------------------------------

void attention_block_forward(const Model *m, int layer, LayerActs *la, const TokenLayout *tokens, KvCache *kv) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    const TensorTable *tt = &m->tt;
    int N = tokens->B * tokens->T, H = c->hidden_size;
    rmsnorm_forward(la->ln1, la->ln1_rstd, la->x_in, tt_param(tt, lp->input_norm), N, H, (real)c->norm_epsilon);
    if (c->multi_latent_attention) mla_forward(m, layer, la, tokens);
    else standard_qkv_forward(m, lp, la, tokens);
    attention_core_forward(m, la, tokens, kv);
    // x_mid = x_in + att·W_oᵀ
    linear_forward(la->x_mid, la->att, tt_param(tt, lp->o_proj), N, attention_widths(c).out, H);
    vec_add(la->x_mid, la->x_in, (size_t)N * H);
}

void attention_block_backward(Model *m, int layer, LayerActs *la, ModelActs *a) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    TensorTable *tt = &m->tt;
    int N = a->N, H = c->hidden_size, att_width = attention_widths(c).out;
    // o_proj: d_att = d_resid·W_o ; dW_o += d_residᵀ·att
    vec_zero(a->d_att, (size_t)N * att_width);
    linear_backward(a->d_att, tt_grad(tt, lp->o_proj), a->d_resid, la->att, tt_param(tt, lp->o_proj), N,
                    att_width, H);
    attention_core_backward(m, la, a);
    vec_zero(a->d_norm, (size_t)N * H);
    if (c->multi_latent_attention) mla_backward(m, layer, la, a);
    else standard_qkv_backward(m, lp, la, a);
    // the residual path keeps d_resid; the norm path adds to it
    rmsnorm_backward(a->d_resid, tt_grad(tt, lp->input_norm), a->d_norm, la->x_in, tt_param(tt, lp->input_norm),
                     la->ln1_rstd, N, H);
}

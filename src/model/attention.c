// attention.c — the attention half of a decoder block (GQA, RoPE, optional QK-norm).
#include <math.h>
#include <string.h>

#include "model/layers.h"
#include "ops/ops.h"

static AttentionShape attention_shape(const Config *c, int B, int T, int Tk, int pos0,
                                      int kv_row_stride) {
    AttentionShape s = {.B = B, .Tq = T, .Tk = Tk, .q_pos0 = pos0, .heads = c->num_attention_heads,
                        .kv_heads = c->kv_heads, .head_dim = c->head_dim,
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

void attention_block_forward(const Model *m, int layer, LayerActs *la, int B, int T,
                             KvCache *kv, int pos0) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    const TensorTable *tt = &m->tt;
    int N = B * T, H = c->hidden_size, d = c->head_dim;
    int q_width = c->num_attention_heads * d, kv_width = c->kv_heads * d;

    rmsnorm_forward(la->ln1, la->ln1_rstd, la->x_in, tt_param(tt, lp->input_norm), N, H, (real)c->norm_epsilon);
    linear_forward(la->q_raw, la->ln1, tt_param(tt, lp->q_proj), N, H, q_width);
    linear_forward(la->k_raw, la->ln1, tt_param(tt, lp->k_proj), N, H, kv_width);
    linear_forward(la->v, la->ln1, tt_param(tt, lp->v_proj), N, H, kv_width);
    if (c->qk_layernorm) {  // per head, over the head dimension, before RoPE
        rmsnorm_forward(la->q, la->q_rstd, la->q_raw, tt_param(tt, lp->q_norm), N * c->num_attention_heads, d,
                        (real)c->norm_epsilon);
        rmsnorm_forward(la->k, la->k_rstd, la->k_raw, tt_param(tt, lp->k_norm), N * c->kv_heads, d,
                        (real)c->norm_epsilon);
    }
    rope_forward(la->q, m->rope_cos_sin, N, T, pos0, c->num_attention_heads, d);
    rope_forward(la->k, m->rope_cos_sin, N, T, pos0, c->kv_heads, d);

    if (kv) {
        kv_cache_store(kv, la->k, la->v, T, pos0);
        AttentionShape s = attention_shape(c, 1, T, pos0 + T, pos0, kv->capacity);
        attention_forward(la->att, la->lse, la->q, kv->k, kv->v, &s);
    } else {
        AttentionShape s = attention_shape(c, B, T, T, pos0, T);
        attention_forward(la->att, la->lse, la->q, la->k, la->v, &s);
    }
    // x_mid = x_in + att·W_oᵀ
    linear_forward(la->x_mid, la->att, tt_param(tt, lp->o_proj), N, q_width, H);
    vec_add(la->x_mid, la->x_in, (size_t)N * H);
}

void attention_block_backward(Model *m, int layer, LayerActs *la, ModelActs *a) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    TensorTable *tt = &m->tt;
    int B = a->B, T = a->T, N = a->N, H = c->hidden_size, d = c->head_dim;
    int heads = c->num_attention_heads, q_width = heads * d, kv_width = c->kv_heads * d;

    // o_proj: d_att = d_resid·W_o ; dW_o += d_residᵀ·att
    vec_zero(a->d_att, (size_t)N * q_width);
    linear_backward(a->d_att, tt_grad(tt, lp->o_proj), a->d_resid, la->att, tt_param(tt, lp->o_proj), N,
                    q_width, H);
    vec_zero(a->d_q, (size_t)N * q_width);
    vec_zero(a->d_k, (size_t)N * kv_width);
    vec_zero(a->d_v, (size_t)N * kv_width);
    AttentionShape s = attention_shape(c, B, T, T, 0, T);
    attention_backward(a->d_q, a->d_k, a->d_v, a->d_att, la->att, la->lse, la->q, la->k, la->v, &s);
    rope_backward(a->d_q, m->rope_cos_sin, N, T, 0, heads, d);
    rope_backward(a->d_k, m->rope_cos_sin, N, T, 0, c->kv_heads, d);
    real *dq_raw = a->d_q, *dk_raw = a->d_k;
    if (c->qk_layernorm) {
        dq_raw = a->d_q_raw;
        dk_raw = a->d_k_raw;
        vec_zero(dq_raw, (size_t)N * q_width);
        vec_zero(dk_raw, (size_t)N * kv_width);
        rmsnorm_backward(dq_raw, tt_grad(tt, lp->q_norm), a->d_q, la->q_raw, tt_param(tt, lp->q_norm),
                         la->q_rstd, N * heads, d);
        rmsnorm_backward(dk_raw, tt_grad(tt, lp->k_norm), a->d_k, la->k_raw, tt_param(tt, lp->k_norm),
                         la->k_rstd, N * c->kv_heads, d);
    }
    // q, k, v projections all read ln1
    vec_zero(a->d_norm, (size_t)N * H);
    linear_backward(a->d_norm, tt_grad(tt, lp->q_proj), dq_raw, la->ln1, tt_param(tt, lp->q_proj), N, H, q_width);
    linear_backward(a->d_norm, tt_grad(tt, lp->k_proj), dk_raw, la->ln1, tt_param(tt, lp->k_proj), N, H, kv_width);
    linear_backward(a->d_norm, tt_grad(tt, lp->v_proj), a->d_v, la->ln1, tt_param(tt, lp->v_proj), N, H, kv_width);
    // the residual path keeps d_resid; the norm path adds to it
    rmsnorm_backward(a->d_resid, tt_grad(tt, lp->input_norm), a->d_norm, la->x_in, tt_param(tt, lp->input_norm),
                     la->ln1_rstd, N, H);
}

// attention.c — the attention half of a decoder block: RMSNorm, q/k/v (standard GQA
// with optional QK-norm per head or per projection and --clip-qkv, or Multi-Latent
// Attention in mla.c), RoPE, causal attention, output projection, residual.
#include <math.h>

#include "model/cp_attention.h"
#include "model/dropout.h"
#include "model/layers.h"
#include "model/sharded_norm.h"
#include "ops/ops.h"
#include "ops/quantized_linear.h"

// The widths of the whole model (every head).
AttentionWidths attention_widths(const Config *c) {
    AttentionWidths w = {.q = c->num_attention_heads * c->head_dim, .k = c->kv_heads * c->head_dim};
    w.v = c->multi_latent_attention ? c->num_attention_heads * c->v_head_dim : w.k;
    w.out = c->multi_latent_attention ? w.v : w.q;
    return w;
}

// This rank's heads (model/layout.h), q, k, v and the output stored as the layer's.
static AttentionShape attention_shape(const LayoutPlan *p, const LayerActs *la, int B, int T, int Tk, int pos0,
                                      int kv_row_stride, const int32_t *key_start) {
    AttentionShape s = {.B = B, .Tq = T, .Tk = Tk, .q_pos0 = pos0, .heads = p->heads, .key_start = key_start,
                        .kv_heads = p->kv_heads, .head_dim = p->head_dim, .v_head_dim = p->v_head_dim,
                        .kv_row_stride = kv_row_stride, .scale = (real)p->softmax_scale, .head_first = p->heads_first,
                        .q_store = la->qkv_store, .kv_store = la->qkv_store, .out_store = la->att_store};
    return s;
}

// --attention-dropout's mask of layer `layer` in a's pass (none outside training).
static DropoutMask probs_dropout(const Model *m, int layer, const ModelActs *a) {
    return dropout_mask(&a->input, layer, DROPOUT_ATTENTION_PROBS, m->cfg.attention_dropout);
}

// dst (n) <- src stored as store (tensor memory): copied, or bf16 values widened (exactly).
static void copy_widened(real *dst, const real *src, Storage store, size_t n) {
    if (store == STORE_BF16) bf16_unpack(dst, src, n);
    else vec_copy(dst, src, n);
}

// Copy this chunk's keys and values (stored as store) into the cache, fp32, at positions
// pos0 .. pos0+T (batch 1).
static void kv_cache_store(KvCache *kv, const real *k, const real *v, Storage store, int T, int pos0) {
    if (pos0 + T > kv->capacity)
        mt_die("generation needs %d positions but the model supports %d (--max-position-embeddings)",
               pos0 + T, kv->capacity);
    copy_widened(kv->k + (size_t)pos0 * kv->k_width, k, store, (size_t)T * kv->k_width);
    copy_widened(kv->v + (size_t)pos0 * kv->v_width, v, store, (size_t)T * kv->v_width);
}

// With context parallelism a layer's attention spans the CP group (model/cp_attention.h):
// this rank's T tokens of each sequence are its two chunks of T/2.
static CpAttention layer_cp_attention(const LayoutPlan *p, int layer) {
    return (CpAttention){.type = p->cp_comm[layer], .cp = p->cp, .inner = p->cp_inner, .outer = p->cp_outer};
}

static RingAttentionShape cp_attention_shape(const Model *m, int B, int T, const int32_t *key_start,
                                             DropoutMask dropout) {
    const LayoutPlan *p = &m->plan;
    return (RingAttentionShape){.B = B, .C = T / 2, .heads = p->heads, .kv_heads = p->kv_heads,
                                .head_dim = p->head_dim, .v_head_dim = p->v_head_dim,
                                .scale = (real)p->softmax_scale, .key_start = key_start, .dropout = dropout,
                                .head_first = p->heads_first, .bf16_kv = model_exchanges_bf16(m)};
}

void attention_core_forward(const Model *m, int layer, LayerActs *la, const ModelActs *a, KvCache *kv) {
    const LayoutPlan *c = &m->plan;
    const TokenLayout *tokens = &a->tokens;
    int B = tokens->B, T = tokens->T, pos0 = tokens->pos0;
    if (c->cp_size > 1) {
        MT_ASSERT(!kv);  // generation runs on one process
        CpAttention g = layer_cp_attention(c, layer);
        RingAttentionShape s = cp_attention_shape(m, B, T, tokens->key_start, probs_dropout(m, layer, a));
        cp_attention_forward(&g, la->att, la->lse, la->q, la->k, la->v, &s);
    } else if (kv) {
        kv_cache_store(kv, la->k, la->v, la->qkv_store, T, pos0);
        AttentionShape s = attention_shape(c, la, 1, T, pos0 + T, pos0, kv->capacity, tokens->key_start);
        s.kv_store = STORE_FP32;  // the cache's
        attention_forward(la->att, la->lse, la->q, kv->k, kv->v, &s);
    } else {
        AttentionShape s = attention_shape(c, la, B, T, T, pos0, T, tokens->key_start);
        s.dropout = probs_dropout(m, layer, a);
        attention_forward(la->att, la->lse, la->q, la->k, la->v, &s);
    }
}

void attention_core_backward(const Model *m, int layer, LayerActs *la, ModelActs *a) {
    const LayoutPlan *c = &m->plan;
    AttentionWidths w = c->width;
    vec_zero(a->d_q, (size_t)a->N * w.q);
    vec_zero(a->d_k, (size_t)a->N * w.k);
    vec_zero(a->d_v, (size_t)a->N * w.v);
    if (c->cp_size > 1) {
        CpAttention g = layer_cp_attention(c, layer);
        RingAttentionShape s = cp_attention_shape(m, a->B, a->T, a->tokens.key_start, probs_dropout(m, layer, a));
        cp_attention_backward(&g, a->d_q, a->d_k, a->d_v, a->d_att, la->att, la->lse, la->q, la->k, la->v, &s);
        return;
    }
    AttentionShape s = attention_shape(c, la, a->B, a->T, a->T, 0, a->T, a->tokens.key_start);
    s.dropout = probs_dropout(m, layer, a);
    attention_backward(a->d_q, a->d_k, a->d_v, a->d_att, la->att, la->lse, la->q, la->k, la->v, &s);
}

// ---- standard attention: q, k, v projections, QK-norm, clip, RoPE --------------------------

// QK-norm of `heads` heads of width d per token: one RMSNorm per head, or over the whole
// projection (--qk-layernorm-scope projection; its statistics span every TP rank's heads,
// model/sharded_norm.c).
static void qk_norm_forward(const Model *m, real *y, real *rstd, const real *x, const real *w, int N, int heads,
                            const NormShards *shards) {
    const Config *c = &m->cfg;
    int d = m->plan.head_dim;
    if (c->qk_norm_whole) rmsnorm_sharded_forward(y, rstd, x, w, N, heads * d, (real)c->norm_epsilon, shards);
    else rmsnorm_forward(y, STORE_FP32, rstd, x, STORE_FP32, w, N * heads, d, (real)c->norm_epsilon);
}

static void qk_norm_backward(const Model *m, real *dx, real *dw, const real *dy, const real *x, const real *w,
                             const real *rstd, int N, int heads, const NormShards *shards) {
    int d = m->plan.head_dim;
    if (m->cfg.qk_norm_whole) rmsnorm_sharded_backward(dx, dw, dy, x, w, rstd, N, heads * d, shards);
    else rmsnorm_backward(dx, dw, dy, x, STORE_FP32, w, rstd, N * heads, d);
}

// The whole-projection norms' columns: the queries' split over TP, the keys' too, each
// piece held by TP/kv_parts ranks.
static NormShards query_shards(const LayoutPlan *p) { return (NormShards){p->tp, 1}; }
static NormShards key_shards(const LayoutPlan *p) { return (NormShards){p->tp, p->tp_size / p->kv_parts}; }

static RopeLayout heads_rope(const Config *c, int heads, int head_dim) {
    RopeLayout l = rope_layout_heads(heads, head_dim);
    l.interleaved = c->rotary_interleaved;
    return l;
}

// q, k, v stored as the layer keeps them (layout.h qkv_store): rounded from their fp32 values.
static void qkv_stored(const LayerActs *la, AttentionWidths w, int N) {
    if (la->qkv_store == STORE_FP32) return;  // q_fp32 is q itself
    bf16_pack(la->q, la->q_fp32, (size_t)N * w.q);
    bf16_pack(la->k, la->k_fp32, (size_t)N * w.k);
    bf16_pack(la->v, la->v_fp32, (size_t)N * w.v);
}

// q, k and v are one GEMM in Megatron-Core (linear_qkv) and share their quantizers here: under
// current scaling operand op takes one amax over the three tensors (qlinear_fused_amax_begin).
static void qkv_amax_begin(QuantLinear *q, QuantOperand op, const real *qt, const real *kt, const real *vt,
                           size_t nq, size_t nk, size_t nv) {
    qlinear_fused_amax_begin(q, op, 3, (const real *[]){qt, kt, vt}, (size_t[]){nq, nk, nv});
}

// q, k, v of this rank's heads from ln1_full: projection -> [QK-norm] -> [clip] -> RoPE (q, k),
// then stored as kept.
static void standard_qkv_forward(const Model *m, const LayerParams *lp, LayerActs *la, const TokenLayout *tokens) {
    const Config *c = &m->cfg;
    const LayoutPlan *p = &m->plan;
    const TensorTable *tt = &m->tt;
    int N = tokens->B * tokens->T, H = p->hidden;
    AttentionWidths w = p->width;
    const real *x = la->ln1_full;
    Storage xs = la->ln1_store;
    QuantLinear *qkv = model_quant(m, lp->q_proj);  // k's and v's too
    qkv_amax_begin(qkv, QUANT_WEIGHT, tt_param(tt, lp->q_proj), tt_param(tt, lp->k_proj), tt_param(tt, lp->v_proj),
                   (size_t)w.q * H, (size_t)w.k * H, (size_t)w.v * H);
    qlinear_forward_stored(qkv, la->q_raw, x, xs, tt_param(tt, lp->q_proj), N, H, w.q);
    qlinear_forward_stored(qkv, la->k_raw, x, xs, tt_param(tt, lp->k_proj), N, H, w.k);
    qlinear_forward_stored(qkv, la->v_raw, x, xs, tt_param(tt, lp->v_proj), N, H, w.v);
    qlinear_fused_amax_end(qkv, QUANT_WEIGHT);
    if (c->qk_layernorm) {
        NormShards qs = query_shards(p), ks = key_shards(p);
        qk_norm_forward(m, la->q_normed, la->q_rstd, la->q_raw, tt_param(tt, lp->q_norm), N, p->heads, &qs);
        qk_norm_forward(m, la->k_normed, la->k_rstd, la->k_raw, tt_param(tt, lp->k_norm), N, p->kv_heads, &ks);
    }
    if (c->clip_qkv > 0) {
        real limit = (real)c->clip_qkv;
        clamp_forward(la->q_fp32, la->q_normed, (size_t)N * w.q, limit);
        clamp_forward(la->k_fp32, la->k_normed, (size_t)N * w.k, limit);
        clamp_forward(la->v_fp32, la->v_raw, (size_t)N * w.v, limit);
    }
    RopeLayout q_rope = heads_rope(c, p->heads, p->head_dim), k_rope = heads_rope(c, p->kv_heads, p->head_dim);
    rope_forward(la->q_fp32, m->rope_cos_sin, tokens, &q_rope);
    rope_forward(la->k_fp32, m->rope_cos_sin, tokens, &k_rope);
    qkv_stored(la, w, N);
}

// d_q, d_k, d_v (gradients of the final q, k, v) -> d_norm_full (+=) and the weight gradients.
static void standard_qkv_backward(Model *m, const LayerParams *lp, LayerActs *la, ModelActs *a) {
    const Config *c = &m->cfg;
    const LayoutPlan *p = &m->plan;
    TensorTable *tt = &m->tt;
    int N = a->N, H = p->hidden;
    AttentionWidths w = p->width;
    RopeLayout q_rope = heads_rope(c, p->heads, p->head_dim), k_rope = heads_rope(c, p->kv_heads, p->head_dim);
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
        NormShards qs = query_shards(p), ks = key_shards(p);
        dq_raw = a->d_q_raw;
        dk_raw = a->d_k_raw;
        vec_zero(dq_raw, (size_t)N * w.q);
        vec_zero(dk_raw, (size_t)N * w.k);
        qk_norm_backward(m, dq_raw, tt_grad(tt, lp->q_norm), a->d_q, la->q_raw, tt_param(tt, lp->q_norm),
                         la->q_rstd, N, p->heads, &qs);
        qk_norm_backward(m, dk_raw, tt_grad(tt, lp->k_norm), a->d_k, la->k_raw, tt_param(tt, lp->k_norm),
                         la->k_rstd, N, p->kv_heads, &ks);
    }
    const real *x = la->ln1_full;
    Storage xs = la->ln1_store;
    QuantLinear *qkv = model_quant(m, lp->q_proj);  // k's and v's too
    qkv_amax_begin(qkv, QUANT_WEIGHT, tt_param(tt, lp->q_proj), tt_param(tt, lp->k_proj), tt_param(tt, lp->v_proj),
                   (size_t)w.q * H, (size_t)w.k * H, (size_t)w.v * H);
    qkv_amax_begin(qkv, QUANT_GRAD, dq_raw, dk_raw, a->d_v, (size_t)N * w.q, (size_t)N * w.k, (size_t)N * w.v);
    qlinear_backward_stored(qkv, a->d_norm_full, tt_grad(tt, lp->q_proj), dq_raw, x, xs, tt_param(tt, lp->q_proj), N,
                            H, w.q);
    qlinear_backward_stored(qkv, a->d_norm_full, tt_grad(tt, lp->k_proj), dk_raw, x, xs, tt_param(tt, lp->k_proj), N,
                            H, w.k);
    qlinear_backward_stored(qkv, a->d_norm_full, tt_grad(tt, lp->v_proj), a->d_v, x, xs, tt_param(tt, lp->v_proj), N,
                            H, w.v);
    qlinear_fused_amax_end(qkv, QUANT_WEIGHT);
    qlinear_fused_amax_end(qkv, QUANT_GRAD);
}

// ---- the block ---------------------------------------------------------------------------------
// With tensor parallelism the block is entered before q/k/v (column-parallel) and exited
// after o_proj (row-parallel): parallel/tp_mappings.h. Outside it x_in, ln1 and x_mid hold
// this rank's tokens (all of them without sequence parallelism).

TpRegion model_tp_region(const Model *m) {
    return (TpRegion){.tp = m->plan.tp, .sequence_parallel = m->plan.sequence_parallel};
}

void attention_block_forward(const Model *m, int layer, LayerActs *la, const ModelActs *a, KvCache *kv) {
    const Config *c = &m->cfg;
    const TokenLayout *tokens = &a->tokens;
    const LayerParams *lp = &m->layers[layer];
    const TensorTable *tt = &m->tt;
    TpRegion region = model_tp_region(m);
    int N = tokens->B * tokens->T, N_local = plan_local_tokens(&m->plan, N), H = m->plan.hidden;
    rmsnorm_forward(la->ln1, la->ln1_store, la->ln1_rstd, la->x_in, la->resid_store, tt_param(tt, lp->input_norm),
                    N_local, H, (real)c->norm_epsilon);
    // attn_partial: free until o_proj
    model_tp_gather_stored(m, la->attn_partial, la->ln1, la->ln1_full, la->ln1_store, N, H);
    if (c->multi_latent_attention) mla_forward(m, layer, la, tokens);
    else standard_qkv_forward(m, lp, la, tokens);
    attention_core_forward(m, layer, la, a, kv);
    // x_mid = x_in + dropout(Σ_tp att·W_oᵀ), the sum in fp32 (attn_out) stored as the stream is
    qlinear_forward_stored(model_quant(m, lp->o_proj), la->attn_partial, la->att, la->att_store,
                           tt_param(tt, lp->o_proj), N, m->plan.width.out, H);
    tp_exit_forward(&region, la->attn_partial, la->attn_out, N, H);
    hidden_dropout(m, a, layer, DROPOUT_ATTENTION_OUT, la->attn_out, la->attn_out);
    residual_add(la->x_mid, la->resid_store, la->x_in, la->resid_store, la->attn_out, (size_t)N_local * H);
}

void attention_block_backward(Model *m, int layer, LayerActs *la, ModelActs *a) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    TensorTable *tt = &m->tt;
    TpRegion region = model_tp_region(m);
    int N = a->N, N_local = a->N_local, H = m->plan.hidden, att_width = m->plan.width.out;
    // --recompute-modules mla_up_proj / core_attn: q, k, v, then the attention output and
    // log-sum-exps again (buffers every layer shares)
    if (c->multi_latent_attention && plan_recomputes(&m->plan, RECOMPUTE_MLA_UP_PROJ))
        mla_recompute_up_projections(m, layer, la, &a->tokens);
    if (plan_recomputes(&m->plan, RECOMPUTE_CORE_ATTN)) attention_core_forward(m, layer, la, a, NULL);
    // o_proj: d_att = d_out·W_o ; dW_o += d_outᵀ·att, with d_out of all N tokens
    const real *d_out = hidden_dropout_backward(m, a, layer, DROPOUT_ATTENTION_OUT);  // d(o_proj's output)
    model_tp_gather_gemm_rows(m, a->sp_workspace, d_out, a->d_out_full, N, H);
    vec_zero(a->d_att, (size_t)N * att_width);
    qlinear_backward_stored(model_quant(m, lp->o_proj), a->d_att, tt_grad(tt, lp->o_proj), a->d_out_full, la->att,
                            la->att_store, tt_param(tt, lp->o_proj), N, att_width, H);
    attention_core_backward(m, layer, la, a);
    vec_zero(a->d_norm_full, (size_t)N * H);
    if (c->multi_latent_attention) mla_backward(m, layer, la, a);
    else standard_qkv_backward(m, lp, la, a);
    tp_enter_backward(&region, a->d_norm_full, a->d_norm, N, H);
    // the residual path keeps d_resid; the norm path adds to it
    rmsnorm_backward(a->d_resid, tt_grad(tt, lp->input_norm), a->d_norm, la->x_in, la->resid_store,
                     tt_param(tt, lp->input_norm), la->ln1_rstd, N_local, H);
}

// mla.c — Multi-Latent Attention (DeepSeek-V2/V3), forward and backward.
//
// Widths: rq = --q-lora-rank, rkv = --kv-lora-rank, dn = --qk-head-dim (no position),
// dr = --qk-pos-emb-head-dim (rotary), dv = --v-head-dim, dq = dn + dr.
//   queries : q = ln1·W_qᵀ, or RMSNorm(ln1·W_q_aᵀ)·W_q_bᵀ        (N, heads, dq)
//   latent  : [c, k_r] = ln1·W_kv_aᵀ                            (N, rkv), (N, dr)
//   per head: [k_n, v] = RMSNorm(c)·W_kv_bᵀ                      (N, heads, dn + dv)
//   keys    : k = [k_n, RoPE(k_r)] — one rotary key shared by every head
//   queries : the last dr columns of each head rotated by RoPE
// then causal attention with scale 1/sqrt(dq) (times YaRN's correction: model/rope_scaling.h) over values of width dv.
// With tensor parallelism a rank computes its heads (q_b, kv_b split by heads) from the
// whole latent (W_q_a, W_kv_a and their norms on every rank): the gradients those receive
// from the rank's heads are partial and are summed over TP after backward.
// The latent norms use eps 1e-6 whatever --norm-epsilon is, as DeepSeek-V3 does.
#include "model/layers.h"
#include "ops/ops.h"
#include "ops/quantized_linear.h"
#include "ops/ops_parallel.h"

#define MLA_LATENT_NORM_EPS 1e-6

typedef struct {
    int heads, rq, rkv, dn, dr, dv, dq;
} MlaDims;

// The dimensions of this rank's heads (model/layout.h): heads split over TP.
static MlaDims mla_dims(const Model *m) {
    const Config *c = &m->cfg;
    MlaDims d = {.heads = m->plan.heads, .rq = c->q_lora_rank, .rkv = c->kv_lora_rank,
                 .dn = c->qk_head_dim, .dr = c->qk_pos_emb_head_dim, .dv = c->v_head_dim};
    d.dq = d.dn + d.dr;
    return d;
}

// The rotary columns of every query head (starting at column dn of head 0).
static RopeLayout query_rope(const Config *c, MlaDims d) {
    RopeLayout l = {.heads = d.heads, .dim = d.dr, .head_stride = d.dq, .row_stride = d.heads * d.dq,
                    .interleaved = c->rotary_interleaved};
    return l;
}

static RopeLayout key_rope(const Config *c, MlaDims d) {
    RopeLayout l = rope_layout_heads(1, d.dr);
    l.interleaved = c->rotary_interleaved;
    return l;
}

// k (N, heads, dq) = [k_n, k_rope];  v (N, heads, dv)  from kv_b (N, heads, dn + dv)
static void assemble_keys_values(real *k, real *v, const real *kv_b, const real *k_rope, int N, MlaDims d) {
    size_t per_head = ((size_t)d.dn + d.dv) * sizeof(real), key = (size_t)d.dq * sizeof(real);
    int rows = N * d.heads;
    rows_copy_strided(k, key, kv_b, per_head, d.dn * sizeof(real), rows);
    for (int h = 0; h < d.heads; h++)  // the one rotary key of a token into every head
        rows_copy_strided(k + (size_t)h * d.dq + d.dn, d.heads * key, k_rope, d.dr * sizeof(real),
                          d.dr * sizeof(real), N);
    rows_copy_strided(v, d.dv * sizeof(real), kv_b + d.dn, per_head, d.dv * sizeof(real), rows);
}

// The reverse: d_kv_b from d_k's no-position part and d_v; d_k_rope = Σ over heads (in order).
static void split_key_value_grads(real *d_kv_b, real *d_k_rope, const real *d_k, const real *d_v, int N, MlaDims d) {
    size_t per_head = ((size_t)d.dn + d.dv) * sizeof(real), key = (size_t)d.dq * sizeof(real);
    int rows = N * d.heads;
    rows_copy_strided(d_kv_b, per_head, d_k, key, d.dn * sizeof(real), rows);
    rows_copy_strided(d_kv_b + d.dn, per_head, d_v, d.dv * sizeof(real), d.dv * sizeof(real), rows);
    heads_sum(d_k_rope, d_k + d.dn, N, d.heads, d.dq, d.dr);
}

// The up projections (Megatron's mla_up_proj): q from the query latent (or ln1 without
// --q-lora-rank) with RoPE on its rotary columns, kv_b from the normed kv latent, and the
// keys and values assembled with the rotated shared key — from what the forward keeps.
static void up_projections_forward(const Model *m, const LayerParams *lp, LayerActs *la, const TokenLayout *tokens,
                                   MlaDims d) {
    const TensorTable *tt = &m->tt;
    MlaActs *ma = &la->mla;
    int N = tokens->B * tokens->T, H = m->plan.hidden, q_width = d.heads * d.dq;
    if (d.rq) qlinear_forward(model_quant(m, lp->q_b_proj), la->q, ma->q_a_norm, tt_param(tt, lp->q_b_proj), N, d.rq, q_width);
    else
        qlinear_forward_stored(model_quant(m, lp->q_proj), la->q, la->ln1_full, la->ln1_store, tt_param(tt, lp->q_proj),
                               N, H, q_width);
    RopeLayout qr = query_rope(&m->cfg, d);
    rope_forward(la->q + d.dn, m->rope_cos_sin, tokens, &qr);
    qlinear_forward(model_quant(m, lp->kv_b_proj), ma->kv_b, ma->latent_norm, tt_param(tt, lp->kv_b_proj), N, d.rkv,
                    d.heads * (d.dn + d.dv));
    assemble_keys_values(la->k, la->v, ma->kv_b, ma->k_rope, N, d);
}

void mla_forward(const Model *m, int layer, LayerActs *la, const TokenLayout *tokens) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    const TensorTable *tt = &m->tt;
    MlaDims d = mla_dims(m);
    MlaActs *ma = &la->mla;
    int N = tokens->B * tokens->T, H = m->plan.hidden;
    if (d.rq) {  // the query latent
        qlinear_forward_stored(model_quant(m, lp->q_a_proj), ma->q_a, la->ln1_full, la->ln1_store,
                               tt_param(tt, lp->q_a_proj), N, H, d.rq);
        rmsnorm_forward(ma->q_a_norm, STORE_FP32, ma->q_a_rstd, ma->q_a, STORE_FP32, tt_param(tt, lp->q_a_norm), N,
                        d.rq, (real)MLA_LATENT_NORM_EPS);
    }
    // W_kv_a's first rkv rows make the latent, the last dr rows the rotary key
    const real *w_kv_a = tt_param(tt, lp->kv_a_proj);
    // two GEMMs on W_kv_a's row blocks, with its one set of quantizers (a tensorwise scale from
    // the whole weight's amax, as of one GEMM)
    QuantLinear *q_kv_a = model_quant(m, lp->kv_a_proj);
    size_t n_kv_a = (size_t)(d.rkv + d.dr) * H;
    qlinear_fused_amax_begin(q_kv_a, QUANT_WEIGHT, 1, (const real *[]){w_kv_a}, &n_kv_a);
    qlinear_forward_stored(q_kv_a, ma->latent, la->ln1_full, la->ln1_store, w_kv_a, N, H, d.rkv);
    qlinear_forward_stored(q_kv_a, ma->k_rope, la->ln1_full, la->ln1_store, w_kv_a + (size_t)d.rkv * H, N, H, d.dr);
    qlinear_fused_amax_end(q_kv_a, QUANT_WEIGHT);
    RopeLayout kr = key_rope(c, d);
    rope_forward(ma->k_rope, m->rope_cos_sin, tokens, &kr);
    rmsnorm_forward(ma->latent_norm, STORE_FP32, ma->latent_rstd, ma->latent, STORE_FP32, tt_param(tt, lp->kv_a_norm),
                    N, d.rkv, (real)MLA_LATENT_NORM_EPS);
    up_projections_forward(m, lp, la, tokens, d);
}

void mla_recompute_up_projections(const Model *m, int layer, LayerActs *la, const TokenLayout *tokens) {
    up_projections_forward(m, &m->layers[layer], la, tokens, mla_dims(m));
}

static void queries_backward(Model *m, const LayerParams *lp, LayerActs *la, ModelActs *a, MlaDims d) {
    TensorTable *tt = &m->tt;
    int N = a->N, H = m->plan.hidden, q_width = d.heads * d.dq;
    MlaActs *ma = &la->mla;
    if (!d.rq) {
        qlinear_backward_stored(model_quant(m, lp->q_proj), a->d_norm_full, tt_grad(tt, lp->q_proj), a->d_q,
                                la->ln1_full, la->ln1_store, tt_param(tt, lp->q_proj), N, H, q_width);
        return;
    }
    vec_zero(a->d_q_a_norm, (size_t)N * d.rq);
    qlinear_backward(model_quant(m, lp->q_b_proj), a->d_q_a_norm, tt_grad(tt, lp->q_b_proj), a->d_q, ma->q_a_norm,
                     tt_param(tt, lp->q_b_proj), N, d.rq, q_width);
    vec_zero(a->d_q_a, (size_t)N * d.rq);
    rmsnorm_backward(a->d_q_a, tt_grad(tt, lp->q_a_norm), a->d_q_a_norm, ma->q_a, STORE_FP32,
                     tt_param(tt, lp->q_a_norm), ma->q_a_rstd, N, d.rq);
    qlinear_backward_stored(model_quant(m, lp->q_a_proj), a->d_norm_full, tt_grad(tt, lp->q_a_proj), a->d_q_a,
                            la->ln1_full, la->ln1_store, tt_param(tt, lp->q_a_proj), N, H, d.rq);
}

void mla_backward(Model *m, int layer, LayerActs *la, ModelActs *a) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    TensorTable *tt = &m->tt;
    MlaDims d = mla_dims(m);
    MlaActs *ma = &la->mla;
    int N = a->N, H = m->plan.hidden;
    RopeLayout qr = query_rope(c, d), kr = key_rope(c, d);
    rope_backward(a->d_q + d.dn, m->rope_cos_sin, &a->tokens, &qr);
    queries_backward(m, lp, la, a, d);
    split_key_value_grads(a->d_kv_b, a->d_k_rope, a->d_k, a->d_v, N, d);
    rope_backward(a->d_k_rope, m->rope_cos_sin, &a->tokens, &kr);
    vec_zero(a->d_latent_norm, (size_t)N * d.rkv);
    qlinear_backward(model_quant(m, lp->kv_b_proj), a->d_latent_norm, tt_grad(tt, lp->kv_b_proj), a->d_kv_b,
                     ma->latent_norm, tt_param(tt, lp->kv_b_proj), N, d.rkv, d.heads * (d.dn + d.dv));
    vec_zero(a->d_latent, (size_t)N * d.rkv);
    rmsnorm_backward(a->d_latent, tt_grad(tt, lp->kv_a_norm), a->d_latent_norm, ma->latent, STORE_FP32,
                     tt_param(tt, lp->kv_a_norm), ma->latent_rstd, N, d.rkv);
    const real *w_kv_a = tt_param(tt, lp->kv_a_proj);
    real *dw_kv_a = tt_grad(tt, lp->kv_a_proj);
    size_t rope_rows = (size_t)d.rkv * H;
    QuantLinear *q_kv_a = model_quant(m, lp->kv_a_proj);
    const real *x = la->ln1_full;
    Storage xs = la->ln1_store;
    size_t n_kv_a = rope_rows + (size_t)d.dr * H;  // tensorwise: the whole weight's amax, and both gradients'
    qlinear_fused_amax_begin(q_kv_a, QUANT_WEIGHT, 1, (const real *[]){w_kv_a}, &n_kv_a);
    qlinear_fused_amax_begin(q_kv_a, QUANT_GRAD, 2, (const real *[]){a->d_latent, a->d_k_rope},
                             (size_t[]){(size_t)N * d.rkv, (size_t)N * d.dr});
    qlinear_backward_stored(q_kv_a, a->d_norm_full, dw_kv_a, a->d_latent, x, xs, w_kv_a, N, H, d.rkv);
    qlinear_backward_stored(q_kv_a, a->d_norm_full, dw_kv_a + rope_rows, a->d_k_rope, x, xs, w_kv_a + rope_rows, N, H,
                            d.dr);
    qlinear_fused_amax_end(q_kv_a, QUANT_WEIGHT);
    qlinear_fused_amax_end(q_kv_a, QUANT_GRAD);
}

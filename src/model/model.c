// model.c — the tensor table of the model, weight init, and the layer sequence of the
// forward and backward passes.
#include "model/model.h"

#include <math.h>
#include <string.h>

#include "core/rng.h"
#include "model/layers.h"
#include "model/lm_head.h"
#include "ops/ops.h"

// ---- building the tensor table ---------------------------------------------------------

typedef struct {
    Model *m;
    int layer;
} Builder;

static TensorId add_layer_tensor(Builder *b, LayerPart part, int expert, int64_t rows, int64_t cols,
                                 unsigned flags, InitKind init, double std) {
    char name[MT_NAME_MAX];
    hf_layer_tensor_name(name, b->m->family, b->layer, part, expert);
    int64_t shape[2] = {rows, cols};
    return tt_add(&b->m->tt, name, cols ? 2 : 1, shape, flags, init, std, b->layer, expert);
}

static TensorId add_norm(Builder *b, LayerPart part, int64_t width) {
    return add_layer_tensor(b, part, -1, width, 0, TENSOR_NORM, INIT_ONES, 0);
}

static void build_layer(Builder *b, LayerParams *lp) {
    const Config *c = &b->m->cfg;
    int64_t H = c->hidden_size, d = c->head_dim;
    int64_t q_width = c->num_attention_heads * d, kv_width = c->kv_heads * d;
    double std = c->init_method_std, out_std = std / sqrt(2.0 * c->num_layers);
    lp->input_norm = add_norm(b, PART_INPUT_NORM, H);
    lp->q_proj = add_layer_tensor(b, PART_Q_PROJ, -1, q_width, H, TENSOR_DECAY, INIT_NORMAL, std);
    lp->k_proj = add_layer_tensor(b, PART_K_PROJ, -1, kv_width, H, TENSOR_DECAY, INIT_NORMAL, std);
    lp->v_proj = add_layer_tensor(b, PART_V_PROJ, -1, kv_width, H, TENSOR_DECAY, INIT_NORMAL, std);
    lp->o_proj = add_layer_tensor(b, PART_O_PROJ, -1, H, q_width, TENSOR_DECAY, INIT_NORMAL, out_std);
    lp->q_norm = c->qk_layernorm ? add_norm(b, PART_Q_NORM, d) : -1;
    lp->k_norm = c->qk_layernorm ? add_norm(b, PART_K_NORM, d) : -1;
    lp->post_attn_norm = add_norm(b, PART_POST_ATTN_NORM, H);
    lp->is_moe = c->moe_layer[b->layer];
    if (!lp->is_moe) {
        int64_t F = c->ffn_hidden_size;
        lp->mlp_gate = add_layer_tensor(b, PART_MLP_GATE, -1, F, H, TENSOR_DECAY, INIT_NORMAL, std);
        lp->mlp_up = add_layer_tensor(b, PART_MLP_UP, -1, F, H, TENSOR_DECAY, INIT_NORMAL, std);
        lp->mlp_down = add_layer_tensor(b, PART_MLP_DOWN, -1, H, F, TENSOR_DECAY, INIT_NORMAL, out_std);
        return;
    }
    int E = c->num_experts;
    int64_t I = c->moe_ffn;
    lp->router = add_layer_tensor(b, PART_ROUTER, -1, E, H, TENSOR_DECAY | TENSOR_ROUTER, INIT_NORMAL, std);
    lp->expert_gate = mt_malloc(E * sizeof(TensorId));
    lp->expert_up = mt_malloc(E * sizeof(TensorId));
    lp->expert_down = mt_malloc(E * sizeof(TensorId));
    unsigned expert_flags = TENSOR_DECAY | TENSOR_EXPERT;
    for (int e = 0; e < E; e++) {  // all gates, then ups, then downs: each a contiguous [E, ...] block
        lp->expert_gate[e] = add_layer_tensor(b, PART_EXPERT_GATE, e, I, H, expert_flags, INIT_NORMAL, std);
    }
    for (int e = 0; e < E; e++)
        lp->expert_up[e] = add_layer_tensor(b, PART_EXPERT_UP, e, I, H, expert_flags, INIT_NORMAL, std);
    for (int e = 0; e < E; e++)
        lp->expert_down[e] = add_layer_tensor(b, PART_EXPERT_DOWN, e, H, I, expert_flags, INIT_NORMAL, out_std);
}

// Point a layer's per-group FFN weight arrays at the parameters (or gradients).
static ExpertWeights bind_ffn(const TensorTable *tt, const LayerParams *lp, int groups, int grads) {
    real *(*pick)(const TensorTable *, TensorId) = grads ? tt_grad : tt_param;
    ExpertWeights w = {mt_malloc(groups * sizeof(real *)), mt_malloc(groups * sizeof(real *)),
                       mt_malloc(groups * sizeof(real *))};
    for (int g = 0; g < groups; g++) {
        w.gate[g] = pick(tt, lp->is_moe ? lp->expert_gate[g] : lp->mlp_gate);
        w.up[g] = pick(tt, lp->is_moe ? lp->expert_up[g] : lp->mlp_up);
        w.down[g] = pick(tt, lp->is_moe ? lp->expert_down[g] : lp->mlp_down);
    }
    return w;
}

static void free_ffn(ExpertWeights *w) {
    free(w->gate);
    free(w->up);
    free(w->down);
}

void model_build(Model *m, const Config *cfg) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->family = hf_family_choose(cfg);
    tt_init(&m->tt);
    const Config *c = &m->cfg;
    int64_t embed_shape[2] = {c->padded_vocab_size, c->hidden_size};
    m->embed = tt_add(&m->tt, HF_EMBED_NAME, 2, embed_shape, TENSOR_DECAY, INIT_NORMAL, c->init_method_std, -1, -1);
    m->layers = mt_calloc(c->num_layers, sizeof(LayerParams));
    Builder b = {m, 0};
    for (b.layer = 0; b.layer < c->num_layers; b.layer++) build_layer(&b, &m->layers[b.layer]);
    int64_t norm_shape[1] = {c->hidden_size};
    m->final_norm = tt_add(&m->tt, HF_FINAL_NORM_NAME, 1, norm_shape, TENSOR_NORM, INIT_ONES, 0, -1, -1);
    m->lm_head = c->untie_embeddings_and_output_weights
                     ? tt_add(&m->tt, HF_LM_HEAD_NAME, 2, embed_shape, TENSOR_DECAY, INIT_NORMAL,
                              c->init_method_std, -1, -1)
                     : m->embed;
    tt_allocate(&m->tt);
    for (int l = 0; l < c->num_layers; l++) {
        LayerParams *lp = &m->layers[l];
        int groups = lp->is_moe ? c->num_experts : 1;
        lp->ffn_params = bind_ffn(&m->tt, lp, groups, 0);
        lp->ffn_grads = bind_ffn(&m->tt, lp, groups, 1);
    }
    m->rope_cos_sin = mt_malloc((size_t)c->max_positions * c->head_dim * sizeof(real));
    rope_table(m->rope_cos_sin, c->max_positions, c->head_dim, c->rotary_base);
}

void model_init_weights(Model *m, uint64_t seed) {
    for (int i = 0; i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        real *p = tt_param(&m->tt, i);
        Rng rng;  // one stream per tensor: a tensor's values do not depend on the others
        rng_seed_stream(&rng, seed, (uint64_t)i + 1);
        for (size_t j = 0; j < d->numel; j++)
            p[j] = d->init == INIT_ONES ? 1 : d->init == INIT_ZEROS ? 0 : (real)(d->init_std * rng_normal(&rng));
    }
}

void model_free(Model *m) {
    for (int l = 0; l < m->cfg.num_layers; l++) {
        free(m->layers[l].expert_gate);
        free(m->layers[l].expert_up);
        free(m->layers[l].expert_down);
        free_ffn(&m->layers[l].ffn_params);
        free_ffn(&m->layers[l].ffn_grads);
    }
    free(m->layers);
    free(m->rope_cos_sin);
    tt_free(&m->tt);
}

// ---- forward and backward ------------------------------------------------------------------

double model_forward(const Model *m, ModelActs *a, const Batch *batch, KvCache *kv, int pos0) {
    const Config *c = &m->cfg;
    MT_ASSERT(batch->B * batch->T <= a->capacity_tokens);
    int B = batch->B, T = batch->T, N = B * T, H = c->hidden_size;
    a->B = B;
    a->T = T;
    a->N = N;
    embedding_forward(a->layers[0].x_in, batch->tokens, tt_param(&m->tt, m->embed), N, H);
    a->aux_loss = a->aux_objective = 0;
    int moe_layers = 0;
    for (int l = 0; l < c->num_layers; l++) {
        LayerActs *la = &a->layers[l];
        const LayerParams *lp = &m->layers[l];
        attention_block_forward(m, l, la, B, T, kv ? &kv[l] : NULL, pos0);
        rmsnorm_forward(la->ln2, la->ln2_rstd, la->x_mid, tt_param(&m->tt, lp->post_attn_norm), N, H,
                        (real)c->norm_epsilon);
        if (lp->is_moe) {
            moe_forward(m, l, la, N);
            a->aux_loss += la->moe.route.aux_loss;
            a->aux_objective += c->moe_aux_loss_coeff * la->moe.route.aux_loss;
            moe_layers++;
        } else {
            mlp_forward(m, l, la, N);
        }
        real *x_out = l + 1 < c->num_layers ? a->layers[l + 1].x_in : a->x_final;
        vec_copy(x_out, la->x_mid, (size_t)N * H);
        vec_add(x_out, la->ffn_out, (size_t)N * H);
    }
    if (moe_layers) a->aux_loss /= moe_layers;
    lm_head_forward(m, a, batch);
    return a->lm_loss;
}

void model_backward(Model *m, ModelActs *a, const Batch *batch, double loss_scale) {
    const Config *c = &m->cfg;
    int N = a->N, H = c->hidden_size;
    lm_head_backward(m, a, batch, loss_scale);  // sets d_resid = d(x_final)
    for (int l = c->num_layers - 1; l >= 0; l--) {
        LayerActs *la = &a->layers[l];
        const LayerParams *lp = &m->layers[l];
        // x_out = x_mid + ffn(RMSNorm(x_mid)): d_resid carries d(x_out) and becomes d(x_mid)
        if (lp->is_moe) moe_backward(m, l, la, a, a->d_resid, c->moe_aux_loss_coeff * loss_scale);
        else mlp_backward(m, l, la, a, a->d_resid);
        rmsnorm_backward(a->d_resid, tt_grad(&m->tt, lp->post_attn_norm), a->d_norm, la->x_mid,
                         tt_param(&m->tt, lp->post_attn_norm), la->ln2_rstd, N, H);
        attention_block_backward(m, l, la, a);  // d(x_mid) -> d(x_in)
    }
    embedding_backward(tt_grad(&m->tt, m->embed), a->d_resid, batch->tokens, N, H);
}

// ---- FLOPs -----------------------------------------------------------------------------------

double model_train_flops_per_token(const Config *c) {
    double H = c->hidden_size, d = c->head_dim, heads = c->num_attention_heads, kv = c->kv_heads;
    double attn_proj = H * d * (2 * heads + 2 * kv);           // q, o, k, v weights
    double attn_scores = 2 * heads * d * (c->seq_length + 1) / 2.0;  // QKᵀ and PV, causal average
    double per_token_macs = c->padded_vocab_size * H;          // LM head
    for (int l = 0; l < c->num_layers; l++) {
        per_token_macs += attn_proj + attn_scores;
        if (c->moe_layer[l])
            per_token_macs += H * c->num_experts + (double)c->moe_router_topk * 3 * H * c->moe_ffn;
        else
            per_token_macs += 3 * H * c->ffn_hidden_size;
    }
    return 3 * 2 * per_token_macs;  // 2 FLOPs per MAC; backward costs twice the forward
}

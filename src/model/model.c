// model.c — the tensor table of the model, weight init, and the layer sequence of the
// forward and backward passes.
#include "core/device.h"
#include "model/model.h"

#include <math.h>
#include <string.h>

#include "core/rng.h"
#include "model/layers.h"
#include "model/lm_head.h"
#include "moe/expert_parallel.h"
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

static void build_shared_expert(Builder *b, LayerParams *lp) {
    const Config *c = &b->m->cfg;
    int64_t H = c->hidden_size, Is = c->moe_shared_expert_intermediate_size;
    double std = c->init_method_std, out_std = std / sqrt(2.0 * c->num_layers);
    lp->shared_gate = lp->shared_up = lp->shared_down = lp->shared_expert_gate = -1;
    if (!Is) return;
    lp->shared_gate = add_layer_tensor(b, PART_SHARED_GATE, -1, Is, H, TENSOR_DECAY, INIT_NORMAL, std);
    lp->shared_up = add_layer_tensor(b, PART_SHARED_UP, -1, Is, H, TENSOR_DECAY, INIT_NORMAL, std);
    lp->shared_down = add_layer_tensor(b, PART_SHARED_DOWN, -1, H, Is, TENSOR_DECAY, INIT_NORMAL, out_std);
    if (c->moe_shared_expert_gate)
        lp->shared_expert_gate = add_layer_tensor(b, PART_SHARED_EXPERT_GATE, -1, 1, H, TENSOR_DECAY, INIT_NORMAL, std);
}

// Multi-Latent Attention: queries full-rank or through a rank-rq bottleneck; keys and
// values from one rank-rkv latent plus a rotary key shared by all heads.
static void build_mla(Builder *b, LayerParams *lp) {
    const Config *c = &b->m->cfg;
    int64_t H = c->hidden_size, heads = c->num_attention_heads, rq = c->q_lora_rank, rkv = c->kv_lora_rank;
    int64_t q_width = heads * c->head_dim, dr = c->qk_pos_emb_head_dim;
    double std = c->init_method_std;
    lp->q_proj = lp->q_a_proj = lp->q_a_norm = lp->q_b_proj = -1;
    if (rq) {
        lp->q_a_proj = add_layer_tensor(b, PART_Q_A_PROJ, -1, rq, H, TENSOR_DECAY, INIT_NORMAL, std);
        lp->q_a_norm = add_norm(b, PART_Q_A_NORM, rq);
        lp->q_b_proj = add_layer_tensor(b, PART_Q_B_PROJ, -1, q_width, rq, TENSOR_DECAY, INIT_NORMAL, std);
    } else {
        lp->q_proj = add_layer_tensor(b, PART_Q_PROJ, -1, q_width, H, TENSOR_DECAY, INIT_NORMAL, std);
    }
    lp->kv_a_proj = add_layer_tensor(b, PART_KV_A_PROJ, -1, rkv + dr, H, TENSOR_DECAY, INIT_NORMAL, std);
    lp->kv_a_norm = add_norm(b, PART_KV_A_NORM, rkv);
    lp->kv_b_proj = add_layer_tensor(b, PART_KV_B_PROJ, -1, heads * (c->qk_head_dim + c->v_head_dim), rkv,
                                     TENSOR_DECAY, INIT_NORMAL, std);
    lp->k_proj = lp->v_proj = lp->q_norm = lp->k_norm = -1;
}

static void build_attention(Builder *b, LayerParams *lp) {
    const Config *c = &b->m->cfg;
    int64_t H = c->hidden_size, d = c->head_dim;
    int64_t q_width = c->num_attention_heads * d, kv_width = c->kv_heads * d;
    double std = c->init_method_std, out_std = std / sqrt(2.0 * c->num_layers);
    lp->input_norm = add_norm(b, PART_INPUT_NORM, H);
    lp->q_a_proj = lp->q_a_norm = lp->q_b_proj = lp->kv_a_proj = lp->kv_a_norm = lp->kv_b_proj = -1;
    if (c->multi_latent_attention) {
        build_mla(b, lp);
    } else {
        lp->q_proj = add_layer_tensor(b, PART_Q_PROJ, -1, q_width, H, TENSOR_DECAY, INIT_NORMAL, std);
        lp->k_proj = add_layer_tensor(b, PART_K_PROJ, -1, kv_width, H, TENSOR_DECAY, INIT_NORMAL, std);
        lp->v_proj = add_layer_tensor(b, PART_V_PROJ, -1, kv_width, H, TENSOR_DECAY, INIT_NORMAL, std);
        // QK-norm weights: one per head dimension, or one per projection column (OLMoE)
        lp->q_norm = c->qk_layernorm ? add_norm(b, PART_Q_NORM, c->qk_norm_whole ? q_width : d) : -1;
        lp->k_norm = c->qk_layernorm ? add_norm(b, PART_K_NORM, c->qk_norm_whole ? kv_width : d) : -1;
    }
    int64_t att_width = c->multi_latent_attention ? c->num_attention_heads * c->v_head_dim : q_width;
    lp->o_proj = add_layer_tensor(b, PART_O_PROJ, -1, H, att_width, TENSOR_DECAY, INIT_NORMAL, out_std);
}

// One part of every routed expert (all gates, then all ups, then all downs: each part a
// contiguous [E, ...] block, as the fused Hugging Face layouts). Experts of other
// expert-parallel ranks are counted and named, not stored.
static void build_experts(Builder *b, LayerPart part, int64_t rows, int64_t cols, double std,
                          TensorId **ids) {
    Model *m = b->m;
    const ExpertParallel *ep = &m->ep;
    *ids = mt_malloc(ep->local * sizeof(TensorId));
    for (int e = 0; e < m->cfg.num_experts; e++) {
        if (e >= ep->first && e < ep->first + ep->local) {
            (*ids)[e - ep->first] =
                add_layer_tensor(b, part, e, rows, cols, TENSOR_DECAY | TENSOR_EXPERT, INIT_NORMAL, std);
            continue;
        }
        m->remote_names = mt_realloc(m->remote_names, (size_t)(m->n_remote + 1) * sizeof(*m->remote_names));
        hf_layer_tensor_name(m->remote_names[m->n_remote++], m->family, b->layer, part, e);
        tt_skip(&m->tt);
    }
}

static void build_layer(Builder *b, LayerParams *lp) {
    const Config *c = &b->m->cfg;
    int64_t H = c->hidden_size;
    double std = c->init_method_std, out_std = std / sqrt(2.0 * c->num_layers);
    build_attention(b, lp);
    lp->post_attn_norm = add_norm(b, PART_POST_ATTN_NORM, H);
    lp->is_moe = c->moe_layer[b->layer];
    lp->expert_bias = lp->shared_gate = lp->shared_up = lp->shared_down = lp->shared_expert_gate = -1;
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
    // DeepSeek-V3 checkpoints always carry the bias (zeros when it is not enabled)
    int has_bias = c->moe_router_enable_expert_bias || b->m->family == HF_DEEPSEEK_V3;
    lp->expert_bias = has_bias
                          ? add_layer_tensor(b, PART_EXPERT_BIAS, -1, E, 0, TENSOR_ROUTER | TENSOR_NOT_TRAINED, INIT_ZEROS, 0)
                          : -1;
    build_shared_expert(b, lp);
    build_experts(b, PART_EXPERT_GATE, I, H, std, &lp->expert_gate);
    build_experts(b, PART_EXPERT_UP, I, H, std, &lp->expert_up);
    build_experts(b, PART_EXPERT_DOWN, H, I, out_std, &lp->expert_down);
}

// Per-group weight pointer arrays over tensors gate[g], up[g], down[g], into the
// parameters (or the gradients).
static ExpertWeights bind_groups(const TensorTable *tt, const TensorId *gate, const TensorId *up,
                                 const TensorId *down, int groups, int grads) {
    real *(*pick)(const TensorTable *, TensorId) = grads ? tt_grad : tt_param;
    ExpertWeights w = {mt_malloc(groups * sizeof(real *)), mt_malloc(groups * sizeof(real *)),
                       mt_malloc(groups * sizeof(real *))};
    for (int g = 0; g < groups; g++) {
        w.gate[g] = pick(tt, gate[g]);
        w.up[g] = pick(tt, up[g]);
        w.down[g] = pick(tt, down[g]);
    }
    return w;
}

static void bind_layer_weights(const TensorTable *tt, LayerParams *lp, int local_experts) {
    for (int grads = 0; grads < 2; grads++) {
        ExpertWeights *ffn = grads ? &lp->ffn_grads : &lp->ffn_params;
        *ffn = lp->is_moe ? bind_groups(tt, lp->expert_gate, lp->expert_up, lp->expert_down, local_experts, grads)
                          : bind_groups(tt, &lp->mlp_gate, &lp->mlp_up, &lp->mlp_down, 1, grads);
        if (lp->shared_gate >= 0)
            *(grads ? &lp->shared_grads : &lp->shared_params) =
                bind_groups(tt, &lp->shared_gate, &lp->shared_up, &lp->shared_down, 1, grads);
    }
}

RouterConfig model_router_config(const Config *c) {
    RouterConfig rc = {.E = c->num_experts, .k = c->moe_router_topk, .score = (ScoreFunction)c->score_function,
                       .pre_softmax = c->moe_router_pre_softmax, .topk_scaling = c->moe_router_topk_scaling_factor,
                       .num_groups = c->moe_router_num_groups, .group_topk = c->moe_router_group_topk,
                       .capacity_factor = c->moe_expert_capacity_factor, .drop_policy = (DropPolicy)c->drop_policy,
                       .pad_to_capacity = c->moe_pad_expert_input_to_capacity, .z_loss_coeff = c->moe_z_loss_coeff};
    for (int t = 0; t < BALANCE_TYPES; t++) rc.balance_coeff[t] = c->balance_coeff[t];
    return rc;
}

static void free_ffn(ExpertWeights *w) {
    free(w->gate);
    free(w->up);
    free(w->down);
}

// Which experts this process holds; dies with one line when they cannot be split evenly.
static ExpertParallel expert_parallel_of(const Config *c, const Comm *comm) {
    int size = comm ? comm->size : 1, E = c->num_experts;
    if (E % size)
        mt_die("--num-experts %d must be a multiple of --expert-model-parallel-size %d (each rank holds the same "
               "number of experts)", E, size);
    ExpertParallel ep = {.comm = size > 1 ? comm : NULL, .size = size, .rank = size > 1 ? comm->rank : 0,
                         .local = E / size};
    ep.first = ep.rank * ep.local;
    ep.dispatcher = strcmp(c->moe_token_dispatcher_type, "allgather") == 0 ? DISPATCH_ALLGATHER : DISPATCH_ALLTOALL;
    return ep;
}

void model_build(Model *m, const Config *cfg) { model_build_ep(m, cfg, NULL); }

void model_build_ep(Model *m, const Config *cfg, const Comm *ep) {
    model_describe(m, cfg, ep);
    model_allocate(m);
}

void model_describe(Model *m, const Config *cfg, const Comm *ep) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->ep = expert_parallel_of(cfg, ep);
    m->family = hf_family_choose(cfg, m->family_note);
    if (m->family != HF_MOETRON) m->family_note[0] = 0;
    m->router = model_router_config(cfg);
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
    tt_layout(&m->tt);
}

void model_allocate(Model *m) {
    const Config *c = &m->cfg;
    tt_allocate(&m->tt);
    m->router_state = mt_calloc(c->num_layers, sizeof(RouterState));
    for (int l = 0; l < c->num_layers; l++) {
        bind_layer_weights(&m->tt, &m->layers[l], m->ep.local);
        if (!m->layers[l].is_moe) continue;
        m->router_state[l].global_counts_sum = mt_calloc(c->num_experts, sizeof(double));
        m->router_state[l].bias_counts = mt_calloc(c->num_experts, sizeof(double));
    }
    m->rope_cos_sin = device_calloc((size_t)c->max_positions * c->rope_dim, sizeof(real));
    rope_table(m->rope_cos_sin, c->max_positions, c->rope_dim, c->rotary_base);
    if (m->ep.size > 1) ep_buffers_new(m);
}

void model_init_weights(Model *m, uint64_t seed) {
    for (int i = 0; i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        real *p = tt_param(&m->tt, i);
        Rng rng;  // one stream per tensor: a tensor's values do not depend on the others
        rng_seed_stream(&rng, seed, (uint64_t)d->global_index + 1);
        for (size_t j = 0; j < d->numel; j++)
            p[j] = d->init == INIT_ONES ? 1 : d->init == INIT_ZEROS ? 0 : (real)(d->init_std * rng_normal(&rng));
    }
}

void model_free(Model *m) {
    for (int l = 0; m->layers && l < m->cfg.num_layers; l++) {
        free(m->layers[l].expert_gate);
        free(m->layers[l].expert_up);
        free(m->layers[l].expert_down);
        free_ffn(&m->layers[l].ffn_params);
        free_ffn(&m->layers[l].ffn_grads);
        free_ffn(&m->layers[l].shared_params);
        free_ffn(&m->layers[l].shared_grads);
        if (!m->router_state) continue;  // described, never allocated
        free(m->router_state[l].global_counts_sum);
        free(m->router_state[l].bias_counts);
    }
    free(m->layers);
    free(m->remote_names);
    ep_buffers_free(m);
    free(m->router_state);
    device_free(m->rope_cos_sin);
    tt_free(&m->tt);
}

// ---- forward and backward ------------------------------------------------------------------

double model_forward(const Model *m, ModelActs *a, const Batch *batch, KvCache *kv, int pos0) {
    const Config *c = &m->cfg;
    batch = acts_stage_batch(a, batch);
    int B = batch->B, T = batch->T, N = B * T, H = c->hidden_size;
    a->B = B;
    a->T = T;
    a->N = N;
    a->tokens = (TokenLayout){.B = B, .T = T, .pos0 = pos0, .positions = batch->positions,
                              .key_start = batch->key_start};
    embedding_forward(a->layers[0].x_in, batch->tokens, tt_param(&m->tt, m->embed), N, H);
    memset(a->balance_loss, 0, sizeof(a->balance_loss));
    a->z_loss = a->aux_objective = 0;
    int moe_layers = 0;
    long choices = 0, dropped = 0;
    for (int l = 0; l < c->num_layers; l++) {
        LayerActs *la = &a->layers[l];
        const LayerParams *lp = &m->layers[l];
        attention_block_forward(m, l, la, &a->tokens, kv ? &kv[l] : NULL);
        rmsnorm_forward(la->ln2, la->ln2_rstd, la->x_mid, tt_param(&m->tt, lp->post_attn_norm), N, H,
                        (real)c->norm_epsilon);
        if (lp->is_moe) {
            moe_forward(m, l, la, batch);
            const RouterOutput *r = &la->moe.route;
            for (int t = 0; t < BALANCE_TYPES; t++) a->balance_loss[t] += r->balance_loss[t];
            a->z_loss += r->z_loss;
            a->aux_objective += router_objective(r, &m->router);
            choices += (long)N * c->moe_router_topk;
            dropped += r->dropped;
            moe_layers++;
        } else {
            mlp_forward(m, l, la, N);
        }
        real *x_out = l + 1 < c->num_layers ? a->layers[l + 1].x_in : a->x_final;
        vec_copy(x_out, la->x_mid, (size_t)N * H);
        vec_add(x_out, la->ffn_out, (size_t)N * H);
    }
    if (moe_layers) {
        for (int t = 0; t < BALANCE_TYPES; t++) a->balance_loss[t] /= moe_layers;
        a->z_loss /= moe_layers;
    }
    a->dropped_frac = choices ? (double)dropped / choices : 0;
    lm_head_forward(m, a, batch);
    return a->lm_loss;
}

void model_backward(Model *m, ModelActs *a, const Batch *batch, double loss_scale) {
    model_backward_notify(m, a, batch, loss_scale, NULL, NULL);
}

void model_backward_notify(Model *m, ModelActs *a, const Batch *batch, double loss_scale, GradsReadyFn ready,
                           void *ctx) {
    const Config *c = &m->cfg;
    int N = a->N, H = c->hidden_size;
    MT_ASSERT(batch->B == a->input.B && batch->T == a->input.T);
    batch = &a->input;  // the forward's copy, in tensor memory
    lm_head_backward(m, a, batch, loss_scale);  // sets d_resid = d(x_final)
    if (ready) ready(ctx, GRADS_HEAD);
    for (int l = c->num_layers - 1; l >= 0; l--) {
        LayerActs *la = &a->layers[l];
        const LayerParams *lp = &m->layers[l];
        // x_out = x_mid + ffn(RMSNorm(x_mid)): d_resid carries d(x_out) and becomes d(x_mid)
        if (lp->is_moe) moe_backward(m, l, la, a, a->d_resid, loss_scale);
        else mlp_backward(m, l, la, a, a->d_resid);
        rmsnorm_backward(a->d_resid, tt_grad(&m->tt, lp->post_attn_norm), a->d_norm, la->x_mid,
                         tt_param(&m->tt, lp->post_attn_norm), la->ln2_rstd, N, H);
        attention_block_backward(m, l, la, a);  // d(x_mid) -> d(x_in)
        if (ready) ready(ctx, l);
    }
    embedding_backward(tt_grad(&m->tt, m->embed), a->d_resid, batch->tokens, N, H);
    if (ready) ready(ctx, GRADS_EMBEDDING);
}

// The dense region holds embedding, layer 0 .. L-1, final norm, lm_head; the expert region
// the experts of layer 0 .. L-1 (tt_allocate): each part is one range in each region.
static int64_t dense_start_of_layer(const Model *m, int layer) {
    if (layer == m->cfg.num_layers) return (int64_t)m->tt.descs[m->final_norm].offset;
    return (int64_t)m->tt.descs[m->layers[layer].input_norm].offset;
}

// First expert element of the first MoE layer at or after `layer` (the region's end if none).
static int64_t expert_start_from_layer(const Model *m, int layer) {
    for (int l = layer; l < m->cfg.num_layers; l++)
        if (m->layers[l].is_moe) return (int64_t)m->tt.descs[m->layers[l].expert_gate[0]].offset;
    return (int64_t)m->tt.total;
}

void model_grads_part_ranges(const Model *m, int part, ElemRange *dense, ElemRange *experts) {
    *experts = (ElemRange){0, 0};
    if (part == GRADS_EMBEDDING) {
        *dense = (ElemRange){0, dense_start_of_layer(m, 0)};
    } else if (part == GRADS_HEAD) {
        *dense = (ElemRange){dense_start_of_layer(m, m->cfg.num_layers), (int64_t)m->tt.dense_total};
    } else {
        *dense = (ElemRange){dense_start_of_layer(m, part), dense_start_of_layer(m, part + 1)};
        if (m->layers[part].is_moe) *experts = (ElemRange){expert_start_from_layer(m, part),
                                                           expert_start_from_layer(m, part + 1)};
    }
}

void model_end_global_batch(Model *m, int apply_bias_update) {
    const Config *c = &m->cfg;
    for (int l = 0; l < c->num_layers; l++) {
        const LayerParams *lp = &m->layers[l];
        RouterState *rs = &m->router_state[l];
        if (!lp->is_moe) continue;
        if (c->moe_router_enable_expert_bias && apply_bias_update)
            expert_bias_update(tt_param(&m->tt, lp->expert_bias), rs->bias_counts, c->num_experts,
                               c->moe_router_bias_update_rate);
        memset(rs->bias_counts, 0, c->num_experts * sizeof(double));
        memset(rs->global_counts_sum, 0, c->num_experts * sizeof(double));
        rs->global_micro_batches = 0;
    }
}

// ---- FLOPs -----------------------------------------------------------------------------------

// Multiply-accumulates per token of one attention block (projections and the causal
// average of the QKᵀ and PV products).
static double attention_macs_per_token(const Config *c) {
    double H = c->hidden_size, heads = c->num_attention_heads, causal_keys = (c->seq_length + 1) / 2.0;
    if (!c->multi_latent_attention) {
        double d = c->head_dim, kv = c->kv_heads;
        return H * d * (2 * heads + 2 * kv) + heads * 2 * d * causal_keys;
    }
    double dq = c->head_dim, dv = c->v_head_dim, rq = c->q_lora_rank, rkv = c->kv_lora_rank;
    double queries = rq ? H * rq + rq * heads * dq : H * heads * dq;
    double keys_values = H * (rkv + c->qk_pos_emb_head_dim) + rkv * heads * (c->qk_head_dim + dv);
    return queries + keys_values + heads * dv * H + heads * (dq + dv) * causal_keys;
}

double model_train_flops_per_token(const Config *c) {
    double H = c->hidden_size;
    double per_token_macs = c->padded_vocab_size * H;  // LM head
    for (int l = 0; l < c->num_layers; l++) {
        per_token_macs += attention_macs_per_token(c);
        if (c->moe_layer[l])
            per_token_macs += H * c->num_experts + (double)c->moe_router_topk * 3 * H * c->moe_ffn +
                              3 * H * c->moe_shared_expert_intermediate_size;
        else
            per_token_macs += 3 * H * c->ffn_hidden_size;
    }
    return 3 * 2 * per_token_macs;  // 2 FLOPs per MAC; backward costs twice the forward
}

// model.c — the tensor table of the model, weight init, and the layer sequence of the
// forward and backward passes.
#include "core/device.h"
#include "model/model.h"

#include <math.h>
#include <string.h>

#include "core/rng.h"
#include "model/layers.h"
#include "model/lm_head.h"
#include "model/rope_scaling.h"
#include "model/stage_pass.h"
#include "moe/expert_parallel.h"
#include "ops/ops.h"
#include "ops/quantized_linear.h"

// ---- building the tensor table ---------------------------------------------------------

typedef struct {
    Model *m;
    int layer;
} Builder;

// A tensor another process holds (another pipeline stage's, another expert-parallel rank's
// expert): named for the loader, counted for global_index, not stored here.
static TensorId add_remote(Model *m, const char *name) {
    m->remote_names = mt_realloc(m->remote_names, (size_t)(m->n_remote + 1) * sizeof(*m->remote_names));
    snprintf(m->remote_names[m->n_remote++], MT_NAME_MAX, "%s", name);
    tt_skip(&m->tt);
    return -1;
}

static TensorId add_layer_shard(Builder *b, LayerPart part, int expert, int64_t rows, int64_t cols,
                                TensorShard shard, unsigned flags, InitKind init, double std) {
    char name[MT_NAME_MAX];
    hf_layer_tensor_name(name, b->m->family, b->layer, part, expert);
    if (!plan_holds_layer(&b->m->plan, b->layer)) return add_remote(b->m, name);  // another stage's layer
    int64_t shape[2] = {rows, cols};
    return tt_add_shard(&b->m->tt, name, cols ? 2 : 1, shape, shard, flags, init, std, b->layer, expert);
}

// Column-parallel [rows, cols]: the output rows split over TP (into `parts` pieces).
static TensorId add_column_parallel(Builder *b, LayerPart part, int64_t rows, int64_t cols, int parts, double std) {
    return add_layer_shard(b, part, -1, rows, cols, plan_tp_shard(&b->m->plan, 0, parts), TENSOR_DECAY,
                           INIT_NORMAL, std);
}

// Row-parallel [rows, cols]: the input columns split over TP; the outputs are summed.
static TensorId add_row_parallel(Builder *b, LayerPart part, int64_t rows, int64_t cols, double std) {
    const LayoutPlan *p = &b->m->plan;
    return add_layer_shard(b, part, -1, rows, cols, plan_tp_shard(p, 1, p->tp_size), TENSOR_DECAY, INIT_NORMAL,
                           std);
}

// A matrix every TP rank holds whole (the router, MLA's down projections, the shared
// expert gate); grad_partial when each rank's gradient covers part of the tokens or heads.
static TensorId add_replicated(Builder *b, LayerPart part, int64_t rows, int64_t cols, unsigned flags,
                               int grad_partial, double std) {
    return add_layer_shard(b, part, -1, rows, cols, plan_tp_replicated(&b->m->plan, grad_partial), flags,
                           INIT_NORMAL, std);
}

// RMSNorm weights: whole on every TP rank; with sequence parallelism each rank's gradient
// covers its tokens only.
static TensorId add_norm(Builder *b, LayerPart part, int64_t width) {
    const LayoutPlan *p = &b->m->plan;
    return add_layer_shard(b, part, -1, width, 0, plan_tp_replicated(p, p->sequence_parallel), TENSOR_NORM,
                           INIT_ONES, 0);
}

static void build_shared_expert(Builder *b, LayerParams *lp) {
    const Config *c = &b->m->cfg;
    const LayoutPlan *p = &b->m->plan;
    int64_t H = c->hidden_size, Is = c->moe_shared_expert_intermediate_size;
    double std = c->init_method_std, out_std = std / sqrt(2.0 * c->num_layers);
    lp->shared_gate = lp->shared_up = lp->shared_down = lp->shared_expert_gate = -1;
    if (!Is) return;
    lp->shared_gate = add_column_parallel(b, PART_SHARED_GATE, Is, H, p->tp_size, std);
    lp->shared_up = add_column_parallel(b, PART_SHARED_UP, Is, H, p->tp_size, std);
    lp->shared_down = add_row_parallel(b, PART_SHARED_DOWN, H, Is, out_std);
    if (c->moe_shared_expert_gate)  // on each rank's own tokens with sequence parallelism
        lp->shared_expert_gate =
            add_replicated(b, PART_SHARED_EXPERT_GATE, 1, H, TENSOR_DECAY, p->sequence_parallel, std);
}

// Multi-Latent Attention: queries full-rank or through a rank-rq bottleneck; keys and
// values from one rank-rkv latent plus a rotary key shared by all heads. The down
// projections and their norms are whole on every TP rank (each rank's heads make part of
// their gradient); the up projections split the heads.
static void build_mla(Builder *b, LayerParams *lp) {
    const Config *c = &b->m->cfg;
    int tp = b->m->plan.tp_size;
    int64_t H = c->hidden_size, heads = c->num_attention_heads, rq = c->q_lora_rank, rkv = c->kv_lora_rank;
    int64_t q_width = heads * c->head_dim, dr = c->qk_pos_emb_head_dim;
    double std = c->init_method_std;
    lp->q_proj = lp->q_a_proj = lp->q_a_norm = lp->q_b_proj = -1;
    if (rq) {
        lp->q_a_proj = add_replicated(b, PART_Q_A_PROJ, rq, H, TENSOR_DECAY, 1, std);
        lp->q_a_norm = add_layer_shard(b, PART_Q_A_NORM, -1, rq, 0, plan_tp_replicated(&b->m->plan, 1),
                                       TENSOR_NORM, INIT_ONES, 0);
        lp->q_b_proj = add_column_parallel(b, PART_Q_B_PROJ, q_width, rq, tp, std);
    } else {
        lp->q_proj = add_column_parallel(b, PART_Q_PROJ, q_width, H, tp, std);
    }
    lp->kv_a_proj = add_replicated(b, PART_KV_A_PROJ, rkv + dr, H, TENSOR_DECAY, 1, std);
    lp->kv_a_norm = add_layer_shard(b, PART_KV_A_NORM, -1, rkv, 0, plan_tp_replicated(&b->m->plan, 1),
                                    TENSOR_NORM, INIT_ONES, 0);
    lp->kv_b_proj = add_column_parallel(b, PART_KV_B_PROJ, heads * (c->qk_head_dim + c->v_head_dim), rkv, tp, std);
    lp->k_proj = lp->v_proj = lp->q_norm = lp->k_norm = -1;
}

// QK-norm weights: one per head dimension (whole on every TP rank, each rank's heads
// making part of the gradient), or one per projection column (split as the projection).
static TensorId add_qk_norm(Builder *b, LayerPart part, int64_t projection_width, int parts) {
    const Config *c = &b->m->cfg;
    const LayoutPlan *p = &b->m->plan;
    TensorShard shard = c->qk_norm_whole ? plan_tp_shard(p, 0, parts) : plan_tp_replicated(p, 1);
    return add_layer_shard(b, part, -1, c->qk_norm_whole ? projection_width : c->head_dim, 0, shard, TENSOR_NORM,
                           INIT_ONES, 0);
}

static void build_attention(Builder *b, LayerParams *lp) {
    const Config *c = &b->m->cfg;
    const LayoutPlan *p = &b->m->plan;
    int64_t H = c->hidden_size, d = c->head_dim;
    int64_t q_width = c->num_attention_heads * d, kv_width = c->kv_heads * d;
    double std = c->init_method_std, out_std = std / sqrt(2.0 * c->num_layers);
    lp->input_norm = add_norm(b, PART_INPUT_NORM, H);
    lp->q_a_proj = lp->q_a_norm = lp->q_b_proj = lp->kv_a_proj = lp->kv_a_norm = lp->kv_b_proj = -1;
    if (c->multi_latent_attention) {
        build_mla(b, lp);
    } else {
        lp->q_proj = add_column_parallel(b, PART_Q_PROJ, q_width, H, p->tp_size, std);
        lp->k_proj = add_column_parallel(b, PART_K_PROJ, kv_width, H, p->kv_parts, std);
        lp->v_proj = add_column_parallel(b, PART_V_PROJ, kv_width, H, p->kv_parts, std);
        lp->q_norm = c->qk_layernorm ? add_qk_norm(b, PART_Q_NORM, q_width, p->tp_size) : -1;
        lp->k_norm = c->qk_layernorm ? add_qk_norm(b, PART_K_NORM, kv_width, p->kv_parts) : -1;
    }
    int64_t att_width = c->multi_latent_attention ? c->num_attention_heads * c->v_head_dim : q_width;
    lp->o_proj = add_row_parallel(b, PART_O_PROJ, H, att_width, out_std);
}

// Latent MoE (--moe-latent-size L): fc1 [L,H] takes the routed experts' tokens to L, fc2
// [H,L] (an output projection's init) brings their combined rows back; whole on every TP
// rank, each rank's tokens making part of the gradient with sequence parallelism.
static void build_latent_projections(Builder *b, LayerParams *lp) {
    const Config *c = &b->m->cfg;
    const LayoutPlan *p = &b->m->plan;
    int64_t H = c->hidden_size, L = c->moe_latent_size;
    double std = c->init_method_std, out_std = std / sqrt(2.0 * c->num_layers);
    if (!L) return;
    lp->fc1_latent_proj = add_replicated(b, PART_FC1_LATENT_PROJ, L, H, TENSOR_DECAY, p->sequence_parallel, std);
    lp->fc2_latent_proj = add_replicated(b, PART_FC2_LATENT_PROJ, H, L, TENSOR_DECAY, p->sequence_parallel, out_std);
}

// One part of every routed expert (all gates, then all ups, then all downs: each part a
// contiguous [E, ...] block, as the fused Hugging Face layouts), split over ETP along
// `axis`. Experts of other expert-parallel ranks are counted and named, not stored.
static void build_experts(Builder *b, LayerPart part, int64_t rows, int64_t cols, int axis, double std,
                          TensorId **ids) {
    Model *m = b->m;
    const ExpertParallel *ep = &m->ep;
    TensorShard shard = plan_etp_shard(&m->plan, axis);
    *ids = mt_malloc(ep->local * sizeof(TensorId));
    for (int e = 0; e < m->cfg.num_experts; e++) {
        if (e >= ep->first && e < ep->first + ep->local) {
            (*ids)[e - ep->first] = add_layer_shard(b, part, e, rows, cols, shard, TENSOR_DECAY | TENSOR_EXPERT,
                                                    INIT_NORMAL, std);
            continue;
        }
        char name[MT_NAME_MAX];
        hf_layer_tensor_name(name, m->family, b->layer, part, e);
        add_remote(m, name);
    }
}

static void build_layer(Builder *b, LayerParams *lp) {
    const Config *c = &b->m->cfg;
    const LayoutPlan *p = &b->m->plan;
    int64_t H = c->hidden_size;
    double std = c->init_method_std, out_std = std / sqrt(2.0 * c->num_layers);
    build_attention(b, lp);
    lp->post_attn_norm = add_norm(b, PART_POST_ATTN_NORM, H);
    lp->is_moe = c->moe_layer[b->layer];
    lp->expert_bias = lp->qb_bias = lp->shared_gate = lp->shared_up = lp->shared_down = lp->shared_expert_gate = -1;
    lp->fc1_latent_proj = lp->fc2_latent_proj = -1;
    if (!lp->is_moe) {
        int64_t F = c->ffn_hidden_size;
        lp->mlp_gate = add_column_parallel(b, PART_MLP_GATE, F, H, p->tp_size, std);
        lp->mlp_up = add_column_parallel(b, PART_MLP_UP, F, H, p->tp_size, std);
        lp->mlp_down = add_row_parallel(b, PART_MLP_DOWN, H, F, out_std);
        return;
    }
    int E = c->num_experts;
    int64_t I = c->moe_ffn;
    // the router sees each rank's own tokens with sequence parallelism
    lp->router = add_replicated(b, PART_ROUTER, E, H, TENSOR_DECAY | TENSOR_ROUTER, p->sequence_parallel, std);
    // DeepSeek-V3 checkpoints always carry the bias (zeros when it is not enabled)
    int has_bias = c->moe_router_enable_expert_bias || b->m->family == HF_DEEPSEEK_V3;
    lp->expert_bias = has_bias ? add_layer_shard(b, PART_EXPERT_BIAS, -1, E, 0, plan_tp_replicated(p, 0),
                                                 TENSOR_ROUTER | TENSOR_NOT_TRAINED, INIT_ZEROS, 0)
                               : -1;
    if (c->quantile_balancing)
        lp->qb_bias = add_layer_shard(b, PART_QB_BIAS, -1, E, 0, plan_tp_replicated(p, 0),
                                      TENSOR_ROUTER | TENSOR_NOT_TRAINED, INIT_ZEROS, 0);
    build_latent_projections(b, lp);
    build_shared_expert(b, lp);
    int64_t rows_width = p->moe_hidden;  // H, or the latent width
    build_experts(b, PART_EXPERT_GATE, I, rows_width, 0, std, &lp->expert_gate);
    build_experts(b, PART_EXPERT_UP, I, rows_width, 0, std, &lp->expert_up);
    build_experts(b, PART_EXPERT_DOWN, rows_width, I, 1, out_std, &lp->expert_down);
}

// Multi-token prediction, after the LM head (so the decoder's tensors keep their places
// and initial values): each depth a transformer layer of the last decoder layer's kind,
// numbered after the decoder's as DeepSeek-V3 does, then its own norms and projection.
// The projection is whole on every TP rank (each rank's tokens make part of its gradient
// with sequence parallelism).
static void build_mtp(Builder *b) {
    Model *m = b->m;
    const Config *c = &m->cfg;
    const LayoutPlan *p = &m->plan;
    int64_t H = c->hidden_size;
    if (!c->mtp_num_layers) return;
    if (p->holds_head) m->mtp = mt_calloc(c->mtp_num_layers, sizeof(MtpParams));
    MtpParams unused;
    for (int k = 0; k < c->mtp_num_layers; k++) {
        b->layer = c->num_layers + k;
        MtpParams *mp = m->mtp ? &m->mtp[k] : &unused;
        build_layer(b, &m->layers[b->layer]);
        mp->enorm = add_norm(b, PART_MTP_ENORM, H);
        mp->hnorm = add_norm(b, PART_MTP_HNORM, H);
        mp->eh_proj = add_replicated(b, PART_MTP_EH_PROJ, H, 2 * H, TENSOR_DECAY, p->sequence_parallel,
                                     c->init_method_std);
        mp->final_norm = add_norm(b, PART_MTP_FINAL_NORM, H);
    }
}

// Per-group weight pointer arrays over tensors gate[g], up[g], down[g], into the
// parameters (or the gradients).
// The groups' quantizers of one projection (model_quant), or NULL when none is quantized.
static struct QuantLinear **bind_quant(const Model *m, const TensorId *ids, int groups) {
    if (!model_quant(m, ids[0])) return NULL;
    struct QuantLinear **q = mt_malloc(groups * sizeof(*q));
    for (int g = 0; g < groups; g++) q[g] = model_quant(m, ids[g]);
    return q;
}

static ExpertWeights bind_groups(const Model *m, const TensorId *gate, const TensorId *up, const TensorId *down,
                                 int groups, int grads) {
    const TensorTable *tt = &m->tt;
    real *(*pick)(const TensorTable *, TensorId) = grads ? tt_grad : tt_param;
    ExpertWeights w = {mt_malloc(groups * sizeof(real *)), mt_malloc(groups * sizeof(real *)),
                       mt_malloc(groups * sizeof(real *)), bind_quant(m, gate, groups), bind_quant(m, up, groups),
                       bind_quant(m, down, groups)};
    for (int g = 0; g < groups; g++) {
        w.gate[g] = pick(tt, gate[g]);
        w.up[g] = pick(tt, up[g]);
        w.down[g] = pick(tt, down[g]);
    }
    return w;
}

static void bind_layer_weights(const Model *m, LayerParams *lp, int local_experts) {
    for (int grads = 0; grads < 2; grads++) {
        ExpertWeights *ffn = grads ? &lp->ffn_grads : &lp->ffn_params;
        *ffn = lp->is_moe ? bind_groups(m, lp->expert_gate, lp->expert_up, lp->expert_down, local_experts, grads)
                          : bind_groups(m, &lp->mlp_gate, &lp->mlp_up, &lp->mlp_down, 1, grads);
        if (lp->shared_gate >= 0)
            *(grads ? &lp->shared_grads : &lp->shared_params) =
                bind_groups(m, &lp->shared_gate, &lp->shared_up, &lp->shared_down, 1, grads);
    }
}

RouterConfig model_router_config(const Config *c) {
    RouterConfig rc = {.E = c->num_experts, .k = c->moe_router_topk, .score = (ScoreFunction)c->score_function,
                       .pre_softmax = c->moe_router_pre_softmax, .topk_scaling = c->moe_router_topk_scaling_factor,
                       .num_groups = c->moe_router_num_groups, .group_topk = c->moe_router_group_topk,
                       .capacity_factor = c->moe_expert_capacity_factor, .drop_policy = (DropPolicy)c->drop_policy,
                       .pad_to_capacity = c->moe_pad_expert_input_to_capacity, .z_loss_coeff = c->moe_z_loss_coeff,
                       .sinkhorn = c->sinkhorn_routing, .quantile = c->quantile_balancing};
    for (int t = 0; t < BALANCE_TYPES; t++) rc.balance_coeff[t] = c->balance_coeff[t];
    return rc;
}

static void free_ffn(ExpertWeights *w) {
    free(w->gate);
    free(w->up);
    free(w->down);
    free(w->quant_gate);
    free(w->quant_up);
    free(w->quant_down);
}

// Which experts this process holds, and the group their tokens travel over; dies with one
// line when they cannot be split evenly.
static ExpertParallel expert_parallel_of(const Config *c, const ModelGroups *g) {
    const Comm *comm = g ? g->ep : NULL;
    int size = comm ? comm->size : 1, E = c->num_experts;
    if (E % size)
        mt_die("--num-experts %d must be a multiple of --expert-model-parallel-size %d (each rank holds the same "
               "number of experts)", E, size);
    const Comm *etp = g && g->etp && g->etp->size > 1 ? g->etp : NULL;
    ExpertParallel ep = {.comm = size > 1 || etp ? comm : NULL, .size = size, .rank = size > 1 ? comm->rank : 0,
                         .local = E / size, .etp = etp};
    ep.first = ep.rank * ep.local;
    ep.dispatcher = strcmp(c->moe_token_dispatcher_type, "allgather") == 0 ? DISPATCH_ALLGATHER : DISPATCH_ALLTOALL;
    ep.gather = etp ? g->etp_ep : ep.comm;
    return ep;
}

void model_build(Model *m, const Config *cfg) { model_build_on(m, cfg, NULL); }

void model_build_on(Model *m, const Config *cfg, const ModelGroups *groups) {
    model_describe(m, cfg, groups);
    model_allocate(m);
}

void model_describe(Model *m, const Config *cfg, const ModelGroups *groups) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    layout_plan_init(&m->plan, cfg, groups);
    m->ep = expert_parallel_of(cfg, groups);
    m->count_group = groups ? groups->count : NULL;
    m->family = hf_family_choose(cfg, m->family_note);
    if (m->family != HF_MOETRON) m->family_note[0] = 0;
    m->router = model_router_config(cfg);
    tt_init(&m->tt);
    const Config *c = &m->cfg;
    // the vocabulary's rows split over TP (vocab-parallel embedding and LM head)
    int64_t embed_shape[2] = {c->padded_vocab_size, c->hidden_size};
    TensorShard vocab_rows = plan_tp_shard(&m->plan, 0, m->plan.tp_size);
    const LayoutPlan *p = &m->plan;
    int tied = !c->untie_embeddings_and_output_weights, embed_index = m->tt.described;
    // the last pipeline stage reads the embedding too when its head is tied or its
    // multi-token-prediction depths look tokens up
    int copies_embedding = p->holds_head && !p->holds_embedding && (tied || c->mtp_num_layers);
    m->embed = m->final_norm = m->lm_head = m->embed_copy = -1;  // on other stages
    if (p->holds_embedding)
        m->embed = tt_add_shard(&m->tt, HF_EMBED_NAME, 2, embed_shape, vocab_rows, TENSOR_DECAY, INIT_NORMAL,
                                c->init_method_std, -1, -1);
    else if (copies_embedding)
        tt_skip(&m->tt);  // the last stage's copy below reads it
    else
        add_remote(m, HF_EMBED_NAME);
    m->layers = mt_calloc(config_all_layers(c), sizeof(LayerParams));  // indexed by global layer; this rank's stored
    Builder b = {m, 0};
    for (b.layer = 0; b.layer < c->num_layers; b.layer++) build_layer(&b, &m->layers[b.layer]);
    int64_t norm_shape[1] = {c->hidden_size};
    m->final_norm = p->holds_head ? tt_add_shard(&m->tt, HF_FINAL_NORM_NAME, 1, norm_shape,
                                                 plan_tp_replicated(p, p->sequence_parallel), TENSOR_NORM, INIT_ONES, 0,
                                                 -1, -1)
                                  : add_remote(m, HF_FINAL_NORM_NAME);
    if (!tied) {
        m->lm_head = p->holds_head ? tt_add_shard(&m->tt, HF_LM_HEAD_NAME, 2, embed_shape, vocab_rows, TENSOR_DECAY,
                                                  INIT_NORMAL, c->init_method_std, -1, -1)
                                   : add_remote(m, HF_LM_HEAD_NAME);
    } else if (p->holds_head && !p->holds_embedding) {
        // a tied LM head on the last pipeline stage: a copy of the first stage's embedding,
        // kept equal by summing the two copies' gradients (the trainer's sum_tied_embedding)
        m->lm_head = tt_add_shard(&m->tt, HF_EMBED_NAME, 2, embed_shape, vocab_rows, TENSOR_DECAY, INIT_NORMAL,
                                  c->init_method_std, -1, -1);
        tt_mark_copy(&m->tt, m->lm_head, embed_index);
    } else if (p->holds_head) {
        m->lm_head = m->embed;
    }
    if (copies_embedding && tied) m->embed_copy = m->lm_head;
    if (copies_embedding && !tied) {  // the depths' own copy, kept equal as the tied head is
        m->embed_copy = tt_add_shard(&m->tt, HF_EMBED_NAME, 2, embed_shape, vocab_rows, TENSOR_DECAY, INIT_NORMAL,
                                     c->init_method_std, -1, -1);
        tt_mark_copy(&m->tt, m->embed_copy, embed_index);
    }
    build_mtp(&b);
    tt_layout(&m->tt);
}

void model_allocate(Model *m) {
    const Config *c = &m->cfg;
    tt_allocate(&m->tt);
    model_quant_init(m);
    m->router_state = mt_calloc(config_all_layers(c), sizeof(RouterState));
    for (int l = 0; l < config_all_layers(c); l++) {
        if (!plan_holds_layer(&m->plan, l)) continue;
        bind_layer_weights(m, &m->layers[l], m->ep.local);
        if (!m->layers[l].is_moe) continue;
        m->router_state[l].global_counts_sum = mt_calloc(c->num_experts, sizeof(double));
        m->router_state[l].bias_counts = mt_calloc(c->num_experts, sizeof(double));
        if (m->layers[l].qb_bias >= 0) {
            m->router_state[l].qb_quantile = device_calloc(c->num_experts, sizeof(real));
            m->router_state[l].qb_quantile_sum = mt_calloc(c->num_experts, sizeof(double));
        }
    }
    size_t table = (size_t)c->max_positions * c->rope_dim;
    real *cos_sin = mt_malloc(table * sizeof(real));  // computed on the host, then copied
    rope_scaled_table(cos_sin, c);
    m->rope_cos_sin = device_calloc(table, sizeof(real));
    device_upload(m->rope_cos_sin, cos_sin, table * sizeof(real));
    free(cos_sin);
    for (int pass = 0; pass < PASS_KINDS && m->ep.gather; pass++) m->ep_buffers[pass] = ep_buffers_new(pass == PASS_BACKWARD);
}

// The elements of a tensor's piece in the order of the global tensor: global element j
// lies in the piece when its coordinate along the shard axis does.
static int64_t piece_element(const TensorDesc *d, int64_t j) {
    const TensorShard *sh = &d->shard;
    if (sh->parts == 1) return j;
    int64_t inner = 1;  // elements per step along the axis
    for (int i = sh->axis + 1; i < d->ndim; i++) inner *= d->shape[i];
    int64_t along = d->shape[sh->axis], width = along / sh->parts;
    int64_t coord = j / inner % along, outer = j / (inner * along);
    if (coord / width != sh->index) return -1;
    return (outer * width + coord % width) * inner + j % inner;
}

// The initial values of this rank's piece of tensor d into p (d->numel reals).
static void init_tensor_values(real *p, const TensorDesc *d, uint64_t seed) {
    Rng rng;  // one stream per tensor: a tensor's values do not depend on the others or the layout
    rng_seed_stream(&rng, seed, (uint64_t)d->global_index + 1);
    int64_t global_numel = (int64_t)d->numel * d->shard.parts;
    for (int64_t j = 0; j < global_numel; j++) {
        real v = d->init == INIT_ONES ? 1 : d->init == INIT_ZEROS ? 0 : (real)(d->init_std * rng_normal(&rng));
        int64_t local = piece_element(d, j);
        if (local >= 0) p[local] = v;
    }
}

// On the cpu, where tensor memory is host memory, the tensors are drawn in place on every thread,
// one tensor each at a time (each its own stream: the same values whatever the threads). On a
// GPU, and with strict memory (which allows tensor memory no host access), each is drawn into
// host staging and copied, one at a time on this thread.
void model_init_weights(Model *m, uint64_t seed) {
    if (device_active() == DEVICE_CPU) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int i = 0; i < m->tt.count; i++) init_tensor_values(tt_param(&m->tt, i), &m->tt.descs[i], seed);
        return;
    }
    for (int i = 0; i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        real *p = mt_malloc((d->numel ? d->numel : 1) * sizeof(real));
        init_tensor_values(p, d, seed);
        device_upload(tt_param(&m->tt, i), p, d->numel * sizeof(real));
        free(p);
    }
}

void model_free(Model *m) {
    for (int l = 0; m->layers && l < config_all_layers(&m->cfg); l++) {
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
        free(m->router_state[l].qb_quantile_sum);
        device_free(m->router_state[l].qb_quantile);
    }
    free(m->layers);
    free(m->mtp);
    free(m->remote_names);
    for (int pass = 0; pass < PASS_KINDS; pass++) {
        ep_buffers_free(m->ep_buffers[pass]);
        m->ep_buffers[pass] = NULL;
    }
    free(m->router_state);
    model_quant_free(m);
    device_free(m->rope_cos_sin);
    tt_free(&m->tt);
    layout_plan_free(&m->plan);
}

// ---- forward and backward ------------------------------------------------------------------

int model_exchanges_bf16(const Model *m) { return m->plan.exchanges_bf16; }

int model_expert_rows_bf16(const Model *m) {
    return model_exchanges_bf16(m) && !m->quant && m->plan.moe_hidden % 2 == 0;
}

int model_tp_gathers_bf16(const Model *m) {
    const LayoutPlan *p = &m->plan;
    return model_exchanges_bf16(m) && !m->quant && p->sequence_parallel && p->tp_size > 1 && p->hidden % 2 == 0;
}

int model_moe_layers(const Config *c) {
    int n = 0;
    for (int l = 0; l < config_all_layers(c); l++) n += c->moe_layer[l];
    return n;
}

void model_stage_forward(const Model *m, ModelActs *a, const Batch *batch, KvCache *kv, int pos0) {
    StagePass pass;
    stage_pass_forward(&pass, m, a, batch, kv, pos0);
    while (stage_pass_advance(&pass)) continue;
}

double model_forward(const Model *m, ModelActs *a, const Batch *batch, KvCache *kv, int pos0) {
    MT_ASSERT(m->plan.chunks == 1 && m->plan.holds_embedding && m->plan.holds_head);  // the whole model here
    model_stage_forward(m, a, batch, kv, pos0);
    return a->lm_loss;
}

void model_backward(Model *m, ModelActs *a, const Batch *batch, double loss_scale) {
    model_backward_notify(m, a, batch, loss_scale, NULL, NULL);
}

void model_backward_notify(Model *m, ModelActs *a, const Batch *batch, double loss_scale, GradsReadyFn ready,
                           void *ctx) {
    MT_ASSERT(batch->B == a->input.B && batch->T == a->input.T);
    MT_ASSERT(m->plan.chunks == 1 && m->plan.holds_embedding && m->plan.holds_head);  // as model_forward
    model_stage_backward(m, a, loss_scale, ready, ctx);
}

void model_stage_backward(Model *m, ModelActs *a, double loss_scale, GradsReadyFn ready, void *ctx) {
    StagePass pass;
    stage_pass_backward(&pass, m, a, loss_scale, ready, ctx);
    while (stage_pass_advance(&pass)) continue;
}

int model_part_has_tensor(const Model *m, int part, TensorId id) {
    const TensorDesc *d = &m->tt.descs[id];
    if (part >= 0) return d->layer == part;
    if (part == GRADS_EMBEDDING) return id == m->embed;
    return d->layer < 0 && id != m->embed;  // GRADS_HEAD: final norm, the LM head (untied, or the tied copy)
}

// The elements of a part in one region: its tensors lie together (tt_layout keeps the order
// they were described in), so the span from the first to the last is theirs alone.
static ElemRange part_range(const Model *m, int part, int experts) {
    ElemRange r = {0, 0};
    for (int i = 0; i < m->tt.count; i++) {
        const TensorDesc *d = &m->tt.descs[i];
        if (!!(d->flags & TENSOR_EXPERT) != experts || !model_part_has_tensor(m, part, i)) continue;
        int64_t begin = (int64_t)d->offset, end = begin + (int64_t)d->numel;
        if (r.end == r.begin) r = (ElemRange){begin, end};
        r.begin = MT_MIN(r.begin, begin), r.end = MT_MAX(r.end, end);
    }
    return r;
}

void model_grads_part_ranges(const Model *m, int part, ElemRange *dense, ElemRange *experts) {
    *dense = part_range(m, part, 0);
    *experts = part_range(m, part, 1);
}

void model_upcycle_routers(Model *m) {
    const Config *c = &m->cfg;
    int G = c->moe_upcycling_granularity, E = c->num_experts, H = c->hidden_size;
    if (!c->moe_use_upcycling || G == 1) return;
    real *w = mt_malloc((size_t)E * H * sizeof(real));  // [E, H], whole on every rank
    for (int l = 0; l < config_all_layers(c); l++) {
        const LayerParams *lp = &m->layers[l];
        if (!lp->is_moe || !plan_holds_layer(&m->plan, l)) continue;
        MT_ASSERT(m->tt.descs[lp->router].numel == (size_t)E * H);
        device_download(w, tt_param(&m->tt, lp->router), (size_t)E * H * sizeof(real));
        for (int e = E - 1; e >= 0; e--) memmove(w + (size_t)e * H, w + (size_t)(e / G) * H, (size_t)H * sizeof(real));
        device_upload(tt_param(&m->tt, lp->router), w, (size_t)E * H * sizeof(real));
    }
    free(w);
}

// Quantile balancing at the end of a global batch: the micro-batches' mean quantile, averaged
// over the data-parallel ranks that ran the others (the same on every rank), moves the bias
// (unless the step was skipped, or took no quantile); the sums start again.
static void quantile_balancing_step(Model *m, const LayerParams *lp, RouterState *rs, int apply) {
    int E = m->cfg.num_experts;
    if (apply && rs->qb_micro_batches > 0) {
        double *mean = mt_malloc((size_t)E * sizeof(double));
        for (int e = 0; e < E; e++) mean[e] = rs->qb_quantile_sum[e] / rs->qb_micro_batches;
        int ranks = m->count_group ? m->count_group->size : 1;
        if (ranks > 1) {
            comm_allreduce_sum_double(m->count_group, mean, (size_t)E);
            for (int e = 0; e < E; e++) mean[e] /= ranks;
        }
        real *bias = mt_malloc((size_t)E * sizeof(real));  // the tensor, through the host
        device_download(bias, tt_param(&m->tt, lp->qb_bias), (size_t)E * sizeof(real));
        quantile_bias_update(bias, mean, E, m->cfg.moe_router_quantile_balancing_ema);
        device_upload(tt_param(&m->tt, lp->qb_bias), bias, (size_t)E * sizeof(real));
        free(bias);
        free(mean);
    }
    memset(rs->qb_quantile_sum, 0, (size_t)E * sizeof(double));
    rs->qb_micro_batches = 0;
}

void model_end_global_batch(Model *m, int apply_bias_update) {
    const Config *c = &m->cfg;
    if (m->quant) {  // delayed scaling's new scales, once per step, from amaxes every holder agrees on
        model_quant_reduce_amaxes(m);
        quant_context_end_step(m->quant);
    }
    for (int l = 0; l < config_all_layers(c); l++) {
        const LayerParams *lp = &m->layers[l];
        RouterState *rs = &m->router_state[l];
        if (!lp->is_moe || !plan_holds_layer(&m->plan, l)) continue;
        if (c->moe_router_enable_expert_bias && apply_bias_update)
            expert_bias_update(tt_param(&m->tt, lp->expert_bias), rs->bias_counts, c->num_experts,
                               c->moe_router_bias_update_rate);
        if (lp->qb_bias >= 0) quantile_balancing_step(m, lp, rs, apply_bias_update);
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
    double H = c->hidden_size, latent = c->moe_latent_size;  // latent MoE: fc1 and fc2, experts L wide
    double expert_width = latent ? latent : H;
    // the LM head, once more per multi-token-prediction depth, with each depth's projection
    double per_token_macs = c->padded_vocab_size * H * (1 + c->mtp_num_layers) + 2 * H * H * c->mtp_num_layers;
    for (int l = 0; l < config_all_layers(c); l++) {
        per_token_macs += attention_macs_per_token(c);
        if (c->moe_layer[l])
            per_token_macs += H * c->num_experts + (double)c->moe_router_topk * 3 * expert_width * c->moe_ffn +
                              3 * H * c->moe_shared_expert_intermediate_size + 2 * H * latent;
        else
            per_token_macs += 3 * H * c->ffn_hidden_size;
    }
    return 3 * 2 * per_token_macs;  // 2 FLOPs per MAC; backward costs twice the forward
}

void model_parameter_counts(const Config *c, double *all, double *active) {
    Model whole;
    model_describe(&whole, c, NULL);
    *all = *active = 0;
    for (int i = 0; i < whole.tt.count; i++) {
        const TensorDesc *d = &whole.tt.descs[i];
        if (d->flags & TENSOR_COPY) continue;
        *all += (double)d->numel;
        *active += d->flags & TENSOR_EXPERT ? (double)d->numel * c->moe_router_topk / c->num_experts : (double)d->numel;
    }
    model_free(&whole);
}

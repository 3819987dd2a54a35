// layout.c — the layout plan of one rank (layout.h). The sizes were validated with the
// flags (config_validate); here they are only divided.
#include "model/layout.h"

#include "core/device.h"
#include "model/cp_batch.h"  // cp_token_index
#include "model/rope_scaling.h"
#include "ops/quantized_linear.h"  // quant_router_padding_multiple
#include "parallel/pipeline_layout.h"

#include <string.h>

// A piece of `total` items out of `parts`: the count per piece, and this piece's first item.
static int piece(int total, int parts, int index, int *first) {
    MT_ASSERT(parts >= 1 && total % parts == 0);
    *first = total / parts * index;
    return total / parts;
}

static void plan_attention(LayoutPlan *p, const Config *c) {
    p->head_dim = c->head_dim;
    p->v_head_dim = c->multi_latent_attention ? c->v_head_dim : c->head_dim;
    p->softmax_scale = attention_softmax_scale(c);
    p->heads = piece(c->num_attention_heads, p->tp_size, p->tp_rank, &p->heads_first);
    // kv heads split over TP, or (fewer than TP) each held by TP/kv_heads consecutive ranks
    p->kv_parts = MT_MIN(c->kv_heads, p->tp_size);
    int kv_index = p->tp_rank * p->kv_parts / p->tp_size;
    p->kv_heads = piece(c->kv_heads, p->kv_parts, kv_index, &p->kv_first);
    p->width.q = p->heads * p->head_dim;
    p->width.k = p->kv_heads * p->head_dim;
    p->width.v = c->multi_latent_attention ? p->heads * p->v_head_dim : p->width.k;
    p->width.out = c->multi_latent_attention ? p->width.v : p->width.q;
    p->q_norm_width = c->qk_norm_whole ? p->width.q : p->head_dim;
    p->k_norm_width = c->qk_norm_whole ? p->width.k : p->head_dim;
}

// The TP ranks that hold the same kv heads as this one: consecutive blocks of TP/kv_parts.
// Every world rank calls comm_group once for its own block (described: only its rank and size).
static void make_kv_share(LayoutPlan *p, int described) {
    int replicas = p->tp_size / p->kv_parts;
    if (replicas == 1) {
        p->kv_share = comm_self("kv");
        return;
    }
    if (described) {
        p->kv_share = (Comm){.name = "kv", .rank = p->tp_rank % replicas, .size = replicas};
        return;
    }
    // the world ranks of this rank's TP group, learnt by gathering them
    int64_t mine = comm_world_rank(), *tp_ranks = mt_malloc((size_t)p->tp_size * sizeof(int64_t));
    comm_allgather_int64(p->tp, &mine, tp_ranks, 1);
    int first = p->tp_rank / replicas * replicas, *members = mt_malloc((size_t)replicas * sizeof(int));
    for (int i = 0; i < replicas; i++) members[i] = (int)tp_ranks[first + i];
    p->kv_share = comm_group("kv", members, replicas);
    free(members);
    free(tp_ranks);
}

static const Comm *group_or_self(const Comm *group, Comm *self, const char *name) {
    if (group) return group;
    *self = comm_self(name);
    return self;
}

static void plan_context_parallel(LayoutPlan *p, const Config *c, const ModelGroups *g) {
    static Comm self_cp, self_inner;
    p->cp = group_or_self(g ? g->cp : NULL, &self_cp, "cp");
    p->cp_size = p->cp->size;
    p->cp_rank = p->cp->rank;
    p->cp_inner = group_or_self(g ? g->cp_inner : NULL, &self_inner, "cp_inner");
    p->cp_outer = g && g->cp_outer ? g->cp_outer : p->cp;
    for (int l = 0; l < c->num_layers; l++) p->cp_comm[l] = (CpCommType)c->cp_comm[l];
    for (int l = c->num_layers; l < config_all_layers(c); l++)  // the MTP layers': the last layer's
        p->cp_comm[l] = p->cp_comm[c->num_layers - 1];
    p->token_group = p->cp_size > 1 ? (p->sequence_parallel ? g->tp_cp : p->cp) : p->sequence_parallel ? p->tp : NULL;
}

void plan_token_index(const LayoutPlan *p, int32_t *index, int B, int T_local) {
    int N_local = plan_local_tokens(p, B * T_local), first = plan_first_local_token(p, N_local);
    int T = T_local * p->cp_size;
    int32_t *host = mt_malloc((size_t)MT_MAX(N_local, 1) * sizeof(int32_t));  // index is tensor memory
    for (int n = 0; n < N_local; n++) {
        int flat = first + n, b = flat / T_local, t = flat % T_local;
        host[n] = b * T + (p->cp_size > 1 ? cp_token_index(T, p->cp_size, p->cp_rank, t) : t);
    }
    device_upload(index, host, (size_t)N_local * sizeof(int32_t));
    free(host);
}

// The chunks of this rank: its virtual stages of the placement (one stage without PP).
static void plan_pipeline(LayoutPlan *p, const Config *c, const ModelGroups *g) {
    p->pp_size = g && g->pp ? g->pp->size : 1;
    p->pp_rank = g && g->pp ? g->pp->rank : 0;
    if (p->pp_size == 1) {
        p->chunks = 1;
        p->chunk = mt_calloc(1, sizeof(StageChunk));
        *p->chunk = (StageChunk){.layers = c->num_layers, .holds_embedding = 1, .holds_head = 1};
        p->holds_embedding = p->holds_head = 1;
        return;
    }
    PipelineLayout layout;
    char err[512];
    if (pipeline_layout_make(&layout, c, err, sizeof(err))) mt_die("%s", err);
    MT_ASSERT(layout.pp == p->pp_size);
    p->chunks = layout.vp;
    p->chunk = mt_calloc((size_t)p->chunks, sizeof(StageChunk));
    for (int k = 0; k < p->chunks; k++) {
        int s = pipeline_virtual_stage(&layout, p->pp_rank, k);
        p->chunk[k] = (StageChunk){.virtual_stage = s, .first_layer = layout.first_layer[s], .layers = layout.layers[s],
                                   .holds_embedding = s == 0, .holds_head = s == layout.stages - 1};
        p->holds_embedding |= p->chunk[k].holds_embedding;
        p->holds_head |= p->chunk[k].holds_head;
    }
}

// The recompute groups of each chunk (Megatron-Core's methods): uniform cuts the chunk's
// layers into groups of N from its first (the last one shorter); block makes each of its
// first N layers a group of one and leaves the rest alone.
static void plan_recompute(LayoutPlan *p, const Config *c) {
    for (int l = 0; l < MT_MAX_LAYERS; l++) p->recompute_first[l] = -1;
    p->recompute_modules = c->recompute_module_mask;
    if (strcmp(c->recompute_granularity, "full")) return;
    int n = c->recompute_num_layers, uniform = !strcmp(c->recompute_method, "uniform");
    for (int k = 0; k < p->chunks; k++) {
        const StageChunk *ch = &p->chunk[k];
        int recomputed = uniform ? ch->layers : MT_MIN(n, ch->layers), size = uniform ? n : 1;
        for (int i = 0; i < recomputed; i += size) {
            int first = ch->first_layer + i, layers = MT_MIN(size, recomputed - i);
            for (int j = 0; j < layers; j++) p->recompute_first[first + j] = first;
            p->recompute_groups++;
            p->recompute_group_max = MT_MAX(p->recompute_group_max, layers);
        }
    }
}

int plan_recompute_last(const LayoutPlan *p, int l) {
    return plan_recomputed(p, l) && (l + 1 == p->layers || p->recompute_first[l + 1] != p->recompute_first[l]);
}

int plan_layer_chunk(const LayoutPlan *p, int layer) {
    for (int k = 0; k < p->chunks; k++)
        if ((layer >= p->chunk[k].first_layer && layer < chunk_layer_end(&p->chunk[k])) ||
            (layer >= p->layers && layer < chunk_mtp_end(p, &p->chunk[k])))
            return k;
    return -1;
}

// Whether the environment variable `name` asks for "fp32" (unset or empty: no; anything else
// is refused).
static int fp32_asked(const char *name) {
    const char *asked = getenv(name);
    if (!asked || !asked[0]) return 0;
    if (strcmp(asked, "fp32") != 0) mt_die("%s=%s: use fp32 (or unset it)", name, asked);
    return 1;
}

// What MOETRON_ACTIVATIONS asks of --bf16's activation storage (layout.h).
typedef enum { KEEP_AS_MEGATRON, KEEP_GEMM_INPUTS, KEEP_FP32 } ActivationsAsked;

static ActivationsAsked activations_asked(void) {
    const char *asked = getenv("MOETRON_ACTIVATIONS");
    if (!asked || !asked[0]) return KEEP_AS_MEGATRON;
    if (!strcmp(asked, "gemm-inputs")) return KEEP_GEMM_INPUTS;
    if (!strcmp(asked, "fp32")) return KEEP_FP32;
    mt_die("MOETRON_ACTIVATIONS=%s: use gemm-inputs or fp32 (or unset it)", asked);
}

// LayoutPlan.exchanges_bf16, swiglu_act_store, expert_rows_store, gate_up_store (layout.h). The
// cuda backend keeps them fp32: the device in use, or for a command that selects none (moetron
// plan) the one --device names.
static void plan_bf16_storage(LayoutPlan *p, const Config *c) {
    int on_cuda = device_active() == DEVICE_CUDA || !strcmp(c->device, "cuda");
    int bf16_gemms = c->bf16 && !on_cuda;
    p->exchanges_bf16 = bf16_gemms && !fp32_asked("MOETRON_EXCHANGE");
    ActivationsAsked asked = bf16_gemms && !c->quant_recipe ? activations_asked() : KEEP_FP32;
    int kept_bf16 = asked != KEEP_FP32;
    p->swiglu_act_store = kept_bf16 ? STORE_BF16 : STORE_FP32;
    int rows_bf16 = kept_bf16 && p->exchanges_bf16 && p->moe_hidden % 2 == 0;
    p->expert_rows_store = rows_bf16 ? STORE_BF16 : STORE_FP32;
    p->gate_up_store = asked == KEEP_AS_MEGATRON ? STORE_BF16 : STORE_FP32;
    p->norm_store = kept_bf16 && p->exchanges_bf16 && p->hidden % 2 == 0 ? STORE_BF16 : STORE_FP32;
    int router_reads_bf16 = !(c->moe_input_jitter_eps > 0) && !c->router_fp64;
    int moe_norm_bf16 = asked == KEEP_AS_MEGATRON && p->hidden % 2 == 0 && router_reads_bf16;
    p->moe_norm_store = moe_norm_bf16 ? STORE_BF16 : STORE_FP32;
    int attention_bf16 = p->cp_size == 1 && !c->multi_latent_attention;
    int even_widths = p->width.q % 2 == 0 && p->width.k % 2 == 0 && p->width.v % 2 == 0;
    p->qkv_store = kept_bf16 && attention_bf16 && even_widths ? STORE_BF16 : STORE_FP32;
    p->att_store = asked == KEEP_AS_MEGATRON && p->cp_size == 1 ? STORE_BF16 : STORE_FP32;
    int residual_bf16 = asked == KEEP_AS_MEGATRON && !c->fp32_residual_connection && p->hidden % 2 == 0;
    p->residual_store = residual_bf16 ? STORE_BF16 : STORE_FP32;
}

void layout_plan_init(LayoutPlan *p, const Config *c, const ModelGroups *g) {
    memset(p, 0, sizeof(*p));
    static Comm self;
    self = comm_self("tp");
    p->tp = g && g->tp ? g->tp : &self;
    p->tp_size = p->tp->size;
    p->tp_rank = p->tp->rank;
    p->sequence_parallel = c->sequence_parallel && p->tp_size > 1;
    plan_context_parallel(p, c, g);
    p->hidden = c->hidden_size;
    p->layers = c->num_layers;
    p->mtp_layers = c->mtp_num_layers;
    plan_pipeline(p, c, g);
    plan_recompute(p, c);
    p->experts = c->num_experts;
    p->topk = c->moe_router_topk;
    p->expert_row_align =
        c->moe_router_padding_for_quantization ? quant_router_padding_multiple((QuantRecipe)c->quant_recipe) : 1;
    plan_attention(p, c);
    int unused;
    p->ffn = piece(c->ffn_hidden_size, p->tp_size, p->tp_rank, &unused);
    p->shared_ffn = piece(c->moe_shared_expert_intermediate_size, p->tp_size, p->tp_rank, &unused);
    p->etp_size = g && g->etp ? g->etp->size : 1;
    p->etp_rank = g && g->etp ? g->etp->rank : 0;
    p->moe_ffn = piece(c->moe_ffn, p->etp_size, p->etp_rank, &unused);
    p->moe_hidden = c->moe_latent_size ? c->moe_latent_size : c->hidden_size;
    plan_bf16_storage(p, c);
    p->padded_vocab = c->padded_vocab_size;
    p->vocab = piece(c->padded_vocab_size, p->tp_size, p->tp_rank, &p->vocab_first);
    make_kv_share(p, g && g->described);
    if (g) {
        p->dense_amax_groups[0] = g->tp_cp ? g->tp_cp : g->tp;
        p->dense_amax_groups[1] = g->count;
        p->expert_amax_groups[0] = g->etp;
        p->expert_amax_groups[1] = g->edp;
    }
}

void layout_plan_single(LayoutPlan *p, const Config *c) { layout_plan_init(p, c, NULL); }

void layout_plan_free(LayoutPlan *p) {
    if (p->kv_share.size > 1) comm_free(&p->kv_share);
    free(p->chunk);
    memset(p, 0, sizeof(*p));
}

TensorShard plan_tp_shard(const LayoutPlan *p, int axis, int parts) {
    if (p->tp_size == 1) return tensor_shard_none();
    // parts below TP: replicated pieces, each holder computing the gradient of its own heads
    return (TensorShard){.group = SHARD_TP, .axis = parts > 1 ? axis : -1, .parts = parts,
                         .index = p->tp_rank * parts / p->tp_size, .grad_partial = parts < p->tp_size};
}

TensorShard plan_etp_shard(const LayoutPlan *p, int axis) {
    if (p->etp_size == 1) return tensor_shard_none();
    return (TensorShard){.group = SHARD_ETP, .axis = axis, .parts = p->etp_size, .index = p->etp_rank};
}

TensorShard plan_tp_replicated(const LayoutPlan *p, int grad_partial) {
    if (p->tp_size == 1) return tensor_shard_none();
    return (TensorShard){.group = SHARD_TP, .axis = -1, .parts = 1, .grad_partial = grad_partial};
}

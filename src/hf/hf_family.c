#include "hf/hf_family.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/tensor_table.h"

static const struct {
    const char *model_type, *architecture;
} FAMILIES[HF_FAMILY_COUNT] = {
    [HF_MIXTRAL] = {"mixtral", "MixtralForCausalLM"},
    [HF_QWEN3_MOE] = {"qwen3_moe", "Qwen3MoeForCausalLM"},
    [HF_OLMOE] = {"olmoe", "OlmoeForCausalLM"},
    [HF_DEEPSEEK_V3] = {"deepseek_v3", "DeepseekV3ForCausalLM"},
    [HF_MOETRON] = {"moetron_moe", "MoetronMoeForCausalLM"},
};

const char *hf_model_type(HfFamily family) { return FAMILIES[family].model_type; }
const char *hf_architecture(HfFamily family) { return FAMILIES[family].architecture; }

HfFamily hf_family_from_model_type(const char *model_type) {
    for (int f = 0; f < HF_FAMILY_COUNT; f++)
        if (model_type && !strcmp(model_type, FAMILIES[f].model_type)) return (HfFamily)f;
    return HF_FAMILY_COUNT;
}

// ---- what each family can express ----------------------------------------------------------

static int all_layers_moe(const Config *c) {
    for (int l = 0; l < c->num_layers; l++)
        if (!c->moe_layer[l]) return 0;
    return c->num_experts > 0;
}

// What a family cannot express, every reason joined by "; " into buf.
typedef struct {
    char *buf;
    size_t cap, len;
    int count;
} Gaps;

static void gap(Gaps *g, const char *reason) {
    if (g->len >= g->cap) return;  // full: the rest is cut, the count stays right
    g->len += snprintf(g->buf + g->len, g->cap - g->len, "%s%s", g->count ? "; " : "", reason);
    if (g->len >= g->cap) g->len = g->cap;
    g->count++;
}

// Router features beyond a softmax router with optional top-k renormalisation.
static void beyond_softmax_router(const Config *c, Gaps *g) {
    if (c->num_experts == 0) return;
    if (c->score_function != 0) gap(g, "--moe-router-score-function other than softmax");
    if (c->moe_router_enable_expert_bias) gap(g, "--moe-router-enable-expert-bias");
    if (c->moe_router_num_groups) gap(g, "group-limited routing");
    if (c->moe_router_topk_scaling_factor > 0 && c->moe_router_topk_scaling_factor != 1)
        gap(g, "--moe-router-topk-scaling-factor");
    if (c->moe_expert_capacity_factor > 0) gap(g, "token dropping (--moe-expert-capacity-factor)");
    if (c->moe_shared_expert_intermediate_size) gap(g, "shared experts");
}

// Attention features beyond standard grouped-query attention with rotate-half RoPE.
static void beyond_standard_attention(const Config *c, Gaps *g) {
    if (c->multi_latent_attention) gap(g, "--multi-latent-attention");
    if (c->rotary_interleaved) gap(g, "--rotary-interleaved");
}

static void mixtral_gaps(const Config *c, Gaps *g) {
    if (c->qk_layernorm) gap(g, "--qk-layernorm");
    if (c->clip_qkv > 0) gap(g, "--clip-qkv");
    if (!all_layers_moe(c)) gap(g, "dense layers (every Mixtral layer is MoE)");
    if (c->moe_router_pre_softmax) gap(g, "--moe-router-pre-softmax (Mixtral always renormalises the top-k)");
}

static void qwen3_gaps(const Config *c, Gaps *g) {
    if (!c->qk_layernorm || c->qk_norm_whole) gap(g, "attention without per-head QK-norm (needs --qk-layernorm)");
    if (c->clip_qkv > 0) gap(g, "--clip-qkv");
}

static void olmoe_gaps(const Config *c, Gaps *g) {
    if (!c->qk_norm_whole) gap(g, "attention without whole-projection QK-norm (needs --qk-layernorm-scope projection)");
    if (c->head_dim * c->num_attention_heads != c->hidden_size) gap(g, "a head dimension other than hidden / heads");
    if (!all_layers_moe(c)) gap(g, "dense layers (every OLMoE layer is MoE)");
}

static void deepseek_gaps(const Config *c, Gaps *g) {
    if (!c->multi_latent_attention) gap(g, "attention without --multi-latent-attention");
    if (c->num_experts == 0) {
        gap(g, "a dense model");
        return;  // the router checks below describe experts
    }
    if (c->score_function != 1) gap(g, "a router score function other than sigmoid");
    if (c->moe_expert_capacity_factor > 0) gap(g, "token dropping (--moe-expert-capacity-factor)");
    if (c->moe_shared_expert_gate) gap(g, "--moe-shared-expert-gate");
    int Is = c->moe_shared_expert_intermediate_size;
    if (Is == 0 || Is % c->moe_ffn) gap(g, "a shared-expert width that is not a positive multiple of --moe-ffn-hidden-size");
    if (c->moe_router_num_groups && c->moe_router_topk / c->moe_router_group_topk != 2) {
        char why[200];
        snprintf(why, sizeof(why), "group scores from the top %d experts of a group (DeepSeek-V3 sums the top 2: "
                 "--moe-router-topk must be twice --moe-router-group-topk)", c->moe_router_topk / c->moe_router_group_topk);
        gap(g, why);
    }
    if (!c->moe_router_num_groups && c->num_experts < 2) gap(g, "a single expert");
    int first_moe = 0;
    while (first_moe < c->num_layers && !c->moe_layer[first_moe]) first_moe++;
    for (int l = first_moe; l < c->num_layers; l++)
        if (!c->moe_layer[l]) {
            gap(g, "a dense layer after an MoE layer (DeepSeek-V3 has only the first k dense)");
            break;
        }
}

// YaRN's scales as transformers reads them: cos and sin by mscale(s, mscale) / mscale(s,
// mscale_all_dim) only when both are non-zero (mscale(s, 1) otherwise), and (MLA) the softmax
// by mscale(s, mscale_all_dim)² only with rope_type yarn.
static void yarn_as_transformers(const Config *c, Gaps *g) {
    int yarn = !strcmp(c->rope_type, "yarn"), both = c->mscale != 0 && c->mscale_all_dim != 0;
    if (yarn && !both && !(c->mscale == 1 && c->mscale_all_dim == 0))
        gap(g, "YaRN with one of --mscale / --mscale-all-dim zero (transformers then scales cos and sin otherwise)");
    if (!yarn && c->multi_latent_attention && c->rotary_scaling_factor > 1 && c->mscale_all_dim != 0)
        gap(g, "MLA's softmax correction (--rotary-scaling-factor, --mscale-all-dim) without --rope-type yarn");
}

const char *hf_family_cannot_express(HfFamily family, const Config *c, char *buf, size_t cap) {
    Gaps g = {.buf = buf, .cap = cap};
    buf[0] = 0;
    if (family == HF_MOETRON) return NULL;
    yarn_as_transformers(c, &g);
    if (c->quantile_balancing && c->num_experts > 0)
        gap(&g, "quantile-balancing routing (its per-expert bias steers every forward; transformers' families have "
                "no place for it)");
    if (c->moe_latent_size && c->num_experts > 0)
        gap(&g, "latent MoE (--moe-latent-size: transformers' families have no latent projections)");
    if (family != HF_DEEPSEEK_V3) {
        if (c->mtp_num_layers) gap(&g, "multi-token prediction (--mtp-num-layers: DeepSeek-V3's layers carry it)");
        beyond_standard_attention(c, &g);
        beyond_softmax_router(c, &g);
    }
    switch (family) {
    case HF_MIXTRAL: mixtral_gaps(c, &g); break;
    case HF_QWEN3_MOE: qwen3_gaps(c, &g); break;
    case HF_OLMOE: olmoe_gaps(c, &g); break;
    case HF_DEEPSEEK_V3: deepseek_gaps(c, &g); break;
    default: break;
    }
    return g.count ? buf : NULL;
}

HfFamily hf_family_choose(const Config *c, char *why) {
    char gap[1024];
    if (strcmp(c->hf_architecture, "auto")) {
        HfFamily f = hf_family_from_model_type(c->hf_architecture);
        if (f == HF_FAMILY_COUNT) mt_die("--hf-architecture %s is not a known family", c->hf_architecture);
        if (hf_family_cannot_express(f, c, gap, sizeof(gap)))
            mt_die("--hf-architecture %s cannot express this model: %s; choose another family or --hf-architecture auto",
                   c->hf_architecture, gap);
        why[0] = 0;
        return f;
    }
    // The one family the model's attention points to, else the closest by router.
    static const HfFamily preference[] = {HF_DEEPSEEK_V3, HF_OLMOE, HF_QWEN3_MOE, HF_MIXTRAL};
    HfFamily natural = c->multi_latent_attention ? HF_DEEPSEEK_V3
                       : c->qk_norm_whole        ? HF_OLMOE
                       : c->qk_layernorm         ? HF_QWEN3_MOE
                                                 : HF_MIXTRAL;
    for (size_t i = 0; i < sizeof(preference) / sizeof(preference[0]); i++)
        if (!hf_family_cannot_express(preference[i], c, gap, sizeof(gap))) {
            why[0] = 0;
            return preference[i];
        }
    hf_family_cannot_express(natural, c, gap, sizeof(gap));
    snprintf(why, 256, "%s cannot express %.190s, nor can another Hugging Face family", hf_model_type(natural), gap);
    return HF_MOETRON;
}

// ---- tensor names ------------------------------------------------------------------------

static const char *part_suffix(HfFamily family, LayerPart part) {
    int mixtral = family == HF_MIXTRAL;
    switch (part) {
    case PART_INPUT_NORM: return "input_layernorm";
    case PART_POST_ATTN_NORM: return "post_attention_layernorm";
    case PART_Q_PROJ: return "self_attn.q_proj";
    case PART_K_PROJ: return "self_attn.k_proj";
    case PART_V_PROJ: return "self_attn.v_proj";
    case PART_O_PROJ: return "self_attn.o_proj";
    case PART_Q_NORM: return "self_attn.q_norm";
    case PART_K_NORM: return "self_attn.k_norm";
    case PART_Q_A_PROJ: return "self_attn.q_a_proj";
    case PART_Q_A_NORM: return "self_attn.q_a_layernorm";
    case PART_Q_B_PROJ: return "self_attn.q_b_proj";
    case PART_KV_A_PROJ: return "self_attn.kv_a_proj_with_mqa";
    case PART_KV_A_NORM: return "self_attn.kv_a_layernorm";
    case PART_KV_B_PROJ: return "self_attn.kv_b_proj";
    case PART_MLP_GATE: return "mlp.gate_proj";
    case PART_MLP_UP: return "mlp.up_proj";
    case PART_MLP_DOWN: return "mlp.down_proj";
    case PART_ROUTER: return mixtral ? "block_sparse_moe.gate" : "mlp.gate";
    case PART_EXPERT_GATE: return mixtral ? "w1" : "gate_proj";
    case PART_EXPERT_UP: return mixtral ? "w3" : "up_proj";
    case PART_EXPERT_DOWN: return mixtral ? "w2" : "down_proj";
    case PART_EXPERT_BIAS: return "mlp.gate.e_score_correction_bias";
    case PART_QB_BIAS: return "mlp.gate.quantile_balancing_bias";
    case PART_SHARED_GATE: return "mlp.shared_experts.gate_proj";
    case PART_SHARED_UP: return "mlp.shared_experts.up_proj";
    case PART_SHARED_DOWN: return "mlp.shared_experts.down_proj";
    case PART_SHARED_EXPERT_GATE: return "mlp.shared_expert_gate";
    case PART_MTP_ENORM: return "enorm";
    case PART_MTP_HNORM: return "hnorm";
    case PART_MTP_EH_PROJ: return "eh_proj";
    case PART_MTP_FINAL_NORM: return "shared_head.norm";
    case PART_MTP_EMBED: return "embed_tokens";
    case PART_MTP_HEAD: return "shared_head.head";
    case PART_FC1_LATENT_PROJ: return "mlp.fc1_latent_proj";
    case PART_FC2_LATENT_PROJ: return "mlp.fc2_latent_proj";
    }
    return "?";
}

void hf_layer_tensor_name(char *out, HfFamily family, int layer, LayerPart part, int expert) {
    const char *suffix = part_suffix(family, part);
    if (part == PART_EXPERT_GATE || part == PART_EXPERT_UP || part == PART_EXPERT_DOWN)
        snprintf(out, MT_NAME_MAX, "model.layers.%d.%s.experts.%d.%s.weight", layer,
                 family == HF_MIXTRAL ? "block_sparse_moe" : "mlp", expert, suffix);
    else if (part == PART_EXPERT_BIAS || part == PART_QB_BIAS)
        snprintf(out, MT_NAME_MAX, "model.layers.%d.%s", layer, suffix);
    else
        snprintf(out, MT_NAME_MAX, "model.layers.%d.%s.weight", layer, suffix);
}

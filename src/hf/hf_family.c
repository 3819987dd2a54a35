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

// Router features beyond a softmax router with optional top-k renormalisation.
static const char *beyond_softmax_router(const Config *c) {
    if (c->num_experts == 0) return NULL;
    if (c->score_function != 0) return "--moe-router-score-function other than softmax";
    if (c->moe_router_enable_expert_bias) return "--moe-router-enable-expert-bias";
    if (c->moe_router_num_groups) return "group-limited routing";
    if (c->moe_router_topk_scaling_factor > 0 && c->moe_router_topk_scaling_factor != 1)
        return "--moe-router-topk-scaling-factor";
    if (c->moe_expert_capacity_factor > 0) return "token dropping (--moe-expert-capacity-factor)";
    if (c->moe_shared_expert_intermediate_size) return "shared experts";
    return NULL;
}

// Attention features beyond standard grouped-query attention with rotate-half RoPE.
static const char *beyond_standard_attention(const Config *c) {
    if (c->multi_latent_attention) return "--multi-latent-attention";
    if (c->rotary_interleaved) return "--rotary-interleaved";
    return NULL;
}

static const char *mixtral_gap(const Config *c) {
    if (c->qk_layernorm) return "--qk-layernorm";
    if (c->clip_qkv > 0) return "--clip-qkv";
    if (!all_layers_moe(c)) return "dense layers (every Mixtral layer is MoE)";
    if (c->moe_router_pre_softmax) return "--moe-router-pre-softmax (Mixtral always renormalises the top-k)";
    return NULL;
}

static const char *qwen3_gap(const Config *c) {
    if (!c->qk_layernorm || c->qk_norm_whole) return "attention without per-head QK-norm (needs --qk-layernorm)";
    if (c->clip_qkv > 0) return "--clip-qkv";
    return NULL;
}

static const char *olmoe_gap(const Config *c) {
    if (!c->qk_norm_whole) return "attention without whole-projection QK-norm (needs --qk-layernorm-scope projection)";
    if (c->head_dim * c->num_attention_heads != c->hidden_size) return "a head dimension other than hidden / heads";
    if (!all_layers_moe(c)) return "dense layers (every OLMoE layer is MoE)";
    return NULL;
}

static const char *deepseek_gap(const Config *c, char *buf, size_t cap) {
    if (!c->multi_latent_attention) return "attention without --multi-latent-attention";
    if (c->num_experts == 0) return "a dense model";
    if (c->score_function != 1) return "a router score function other than sigmoid";
    if (c->moe_expert_capacity_factor > 0) return "token dropping (--moe-expert-capacity-factor)";
    if (c->moe_shared_expert_gate) return "--moe-shared-expert-gate";
    int Is = c->moe_shared_expert_intermediate_size;
    if (Is == 0 || Is % c->moe_ffn)
        return "a shared-expert width that is not a positive multiple of --moe-ffn-hidden-size";
    if (c->moe_router_num_groups && c->moe_router_topk / c->moe_router_group_topk != 2) {
        snprintf(buf, cap, "group scores from the top %d experts of a group (DeepSeek-V3 sums the top 2: "
                 "--moe-router-topk must be twice --moe-router-group-topk)", c->moe_router_topk / c->moe_router_group_topk);
        return buf;
    }
    if (!c->moe_router_num_groups && c->num_experts < 2) return "a single expert";
    int first_moe = 0;
    while (first_moe < c->num_layers && !c->moe_layer[first_moe]) first_moe++;
    for (int l = first_moe; l < c->num_layers; l++)
        if (!c->moe_layer[l]) return "a dense layer after an MoE layer (DeepSeek-V3 has only the first k dense)";
    return NULL;
}

const char *hf_family_cannot_express(HfFamily family, const Config *c, char *buf, size_t cap) {
    const char *gap = NULL;
    if (family == HF_MOETRON) return NULL;
    if (family != HF_DEEPSEEK_V3) {
        gap = beyond_standard_attention(c);
        if (!gap) gap = beyond_softmax_router(c);
    }
    if (!gap) {
        switch (family) {
        case HF_MIXTRAL: gap = mixtral_gap(c); break;
        case HF_QWEN3_MOE: gap = qwen3_gap(c); break;
        case HF_OLMOE: gap = olmoe_gap(c); break;
        case HF_DEEPSEEK_V3: gap = deepseek_gap(c, buf, cap); break;
        default: break;
        }
    }
    if (gap && gap != buf) snprintf(buf, cap, "%s", gap);
    return gap ? buf : NULL;
}

HfFamily hf_family_choose(const Config *c, char *why) {
    char gap[200];
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
    snprintf(why, 256, "%s cannot express %.160s, nor can another Hugging Face family", hf_model_type(natural), gap);
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
    case PART_SHARED_GATE: return "mlp.shared_experts.gate_proj";
    case PART_SHARED_UP: return "mlp.shared_experts.up_proj";
    case PART_SHARED_DOWN: return "mlp.shared_experts.down_proj";
    case PART_SHARED_EXPERT_GATE: return "mlp.shared_expert_gate";
    }
    return "?";
}

void hf_layer_tensor_name(char *out, HfFamily family, int layer, LayerPart part, int expert) {
    const char *suffix = part_suffix(family, part);
    if (part == PART_EXPERT_GATE || part == PART_EXPERT_UP || part == PART_EXPERT_DOWN)
        snprintf(out, MT_NAME_MAX, "model.layers.%d.%s.experts.%d.%s.weight", layer,
                 family == HF_MIXTRAL ? "block_sparse_moe" : "mlp", expert, suffix);
    else if (part == PART_EXPERT_BIAS)
        snprintf(out, MT_NAME_MAX, "model.layers.%d.%s", layer, suffix);
    else
        snprintf(out, MT_NAME_MAX, "model.layers.%d.%s.weight", layer, suffix);
}

#include "hf/hf_family.h"

#include <stdio.h>

#include "core/common.h"
#include "core/tensor_table.h"

// A reason (written to why) when a feature has no Qwen3-MoE equivalent; NULL otherwise.
static const char *beyond_qwen3(const Config *c) {
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

HfFamily hf_family_choose(const Config *c, char *why) {
    const char *extra = beyond_qwen3(c);
    if (extra) {
        snprintf(why, 256, "%s has no equivalent in Qwen3-MoE or Mixtral", extra);
        return HF_MOETRON;
    }
    if (c->qk_layernorm) return HF_QWEN3_MOE;
    // Without QK-norm only Mixtral remains: every layer MoE, renormalised top-k.
    if (c->num_experts == 0) {
        snprintf(why, 256, "a dense model without --qk-layernorm is neither Qwen3-MoE nor Mixtral");
        return HF_MOETRON;
    }
    for (int l = 0; l < c->num_layers; l++)
        if (!c->moe_layer[l]) {
            snprintf(why, 256, "--moe-layer-freq %.64s makes layer %d dense, which Mixtral cannot express "
                     "(add --qk-layernorm for Qwen3-MoE)", c->moe_layer_freq, l);
            return HF_MOETRON;
        }
    if (c->moe_router_pre_softmax) {
        snprintf(why, 256, "--moe-router-pre-softmax does not renormalise the top-k, which Mixtral always does "
                 "(add --qk-layernorm for Qwen3-MoE)");
        return HF_MOETRON;
    }
    return HF_MIXTRAL;
}

const char *hf_model_type(HfFamily family) {
    return family == HF_MIXTRAL ? "mixtral" : family == HF_QWEN3_MOE ? "qwen3_moe" : "moetron_moe";
}

const char *hf_architecture(HfFamily family) {
    return family == HF_MIXTRAL ? "MixtralForCausalLM" : family == HF_QWEN3_MOE ? "Qwen3MoeForCausalLM"
                                                                              : "MoetronMoeForCausalLM";
}

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

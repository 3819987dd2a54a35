#include "hf/hf_family.h"

#include <stdio.h>

#include "core/common.h"
#include "core/tensor_table.h"

HfFamily hf_family_choose(const Config *c) {
    if (c->qk_layernorm) return HF_QWEN3_MOE;
    // Without QK-norm only Mixtral remains: every layer MoE, renormalised top-k.
    if (c->num_experts == 0)
        mt_die("a dense model without --qk-layernorm has no Hugging Face MoE family to be saved as; "
               "add --qk-layernorm (Qwen3-MoE) or set --num-experts");
    for (int l = 0; l < c->num_layers; l++)
        if (!c->moe_layer[l])
            mt_die("--moe-layer-freq %s makes layer %d dense, which Mixtral cannot express; "
                   "add --qk-layernorm to save as Qwen3-MoE, or make every layer MoE",
                   c->moe_layer_freq, l);
    if (c->moe_router_pre_softmax)
        mt_die("--moe-router-pre-softmax does not renormalise the top-k, which Mixtral always does; "
               "add --qk-layernorm to save as Qwen3-MoE (norm_topk_prob=false)");
    return HF_MIXTRAL;
}

const char *hf_model_type(HfFamily family) { return family == HF_MIXTRAL ? "mixtral" : "qwen3_moe"; }

const char *hf_architecture(HfFamily family) {
    return family == HF_MIXTRAL ? "MixtralForCausalLM" : "Qwen3MoeForCausalLM";
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
    }
    return "?";
}

void hf_layer_tensor_name(char *out, HfFamily family, int layer, LayerPart part, int expert) {
    const char *suffix = part_suffix(family, part);
    if (part == PART_EXPERT_GATE || part == PART_EXPERT_UP || part == PART_EXPERT_DOWN)
        snprintf(out, MT_NAME_MAX, "model.layers.%d.%s.experts.%d.%s.weight", layer,
                 family == HF_MIXTRAL ? "block_sparse_moe" : "mlp", expert, suffix);
    else
        snprintf(out, MT_NAME_MAX, "model.layers.%d.%s.weight", layer, suffix);
}

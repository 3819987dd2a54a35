// hf_family.h — which Hugging Face architecture family a moetron model is saved as,
// and the tensor names of that family. The tensor table is built with these names, so
// a checkpoint is written and read by name with no other mapping.
//
//   qwen3_moe : QK-norm per head; any mix of dense and MoE layers; softmax router with
//               norm_topk_prob true (top-k then softmax) or false (pre-softmax).
//   mixtral   : no QK-norm; every layer MoE; top-k then softmax (renormalised).
//   moetron   : anything else (sigmoid scores, expert bias, groups, capacity, shared
//               experts, ...): moetron's own model_type, read by moetron only, with the
//               Qwen3-MoE tensor names plus DeepSeek-style names for the extra tensors.
#pragma once
#include "core/config.h"

typedef enum { HF_MIXTRAL, HF_QWEN3_MOE, HF_MOETRON } HfFamily;

// The Hugging Face family that expresses c exactly, or HF_MOETRON with the reason none
// does written to why (256 bytes).
HfFamily hf_family_choose(const Config *c, char *why);
const char *hf_model_type(HfFamily family);      // "mixtral" / "qwen3_moe"
const char *hf_architecture(HfFamily family);    // "MixtralForCausalLM" / ...

// Parts of a decoder layer that have a name.
typedef enum {
    PART_INPUT_NORM, PART_POST_ATTN_NORM,
    PART_Q_PROJ, PART_K_PROJ, PART_V_PROJ, PART_O_PROJ, PART_Q_NORM, PART_K_NORM,
    PART_MLP_GATE, PART_MLP_UP, PART_MLP_DOWN,          // dense SwiGLU
    PART_ROUTER,
    PART_EXPERT_GATE, PART_EXPERT_UP, PART_EXPERT_DOWN, // routed expert `expert`
    PART_EXPERT_BIAS,                                   // router expert bias
    PART_SHARED_GATE, PART_SHARED_UP, PART_SHARED_DOWN, // shared expert
    PART_SHARED_EXPERT_GATE,                            // its sigmoid gate [1,H]
} LayerPart;

// Writes e.g. "model.layers.3.mlp.experts.5.gate_proj.weight" into out (MT_NAME_MAX).
void hf_layer_tensor_name(char *out, HfFamily family, int layer, LayerPart part, int expert);

#define HF_EMBED_NAME "model.embed_tokens.weight"
#define HF_FINAL_NORM_NAME "model.norm.weight"
#define HF_LM_HEAD_NAME "lm_head.weight"

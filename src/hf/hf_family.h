// hf_family.h — which Hugging Face architecture family a moetron model is saved as,
// and the tensor names of that family. The tensor table is built with these names, so
// a checkpoint is written and read by name with no other mapping.
//
//   qwen3_moe : QK-norm per head; any mix of dense and MoE layers; softmax router with
//               norm_topk_prob true (top-k then softmax) or false (pre-softmax).
//   mixtral   : no QK-norm; every layer MoE; top-k then softmax (renormalised).
#pragma once
#include "core/config.h"

typedef enum { HF_MIXTRAL, HF_QWEN3_MOE } HfFamily;

// The family that expresses c exactly; dies naming the conflicting flags if none does.
HfFamily hf_family_choose(const Config *c);
const char *hf_model_type(HfFamily family);      // "mixtral" / "qwen3_moe"
const char *hf_architecture(HfFamily family);    // "MixtralForCausalLM" / ...

// Parts of a decoder layer that have a name.
typedef enum {
    PART_INPUT_NORM, PART_POST_ATTN_NORM,
    PART_Q_PROJ, PART_K_PROJ, PART_V_PROJ, PART_O_PROJ, PART_Q_NORM, PART_K_NORM,
    PART_MLP_GATE, PART_MLP_UP, PART_MLP_DOWN,          // dense SwiGLU
    PART_ROUTER,
    PART_EXPERT_GATE, PART_EXPERT_UP, PART_EXPERT_DOWN, // routed expert `expert`
} LayerPart;

// Writes e.g. "model.layers.3.mlp.experts.5.gate_proj.weight" into out (MT_NAME_MAX).
void hf_layer_tensor_name(char *out, HfFamily family, int layer, LayerPart part, int expert);

#define HF_EMBED_NAME "model.embed_tokens.weight"
#define HF_FINAL_NORM_NAME "model.norm.weight"
#define HF_LM_HEAD_NAME "lm_head.weight"

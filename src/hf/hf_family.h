// hf_family.h — which Hugging Face architecture family a moetron model is saved as,
// and the tensor names of that family. The tensor table is built with these names, so
// a checkpoint is written and read by name with no other mapping.
//
//   mixtral     : no QK-norm; every layer MoE; top-k then softmax (renormalised).
//   qwen3_moe   : QK-norm per head; any mix of dense and MoE layers; softmax router with
//                 norm_topk_prob true (top-k then softmax) or false (pre-softmax).
//   olmoe       : QK-norm over the whole q and k projections, optional clip_qkv; every
//                 layer MoE; softmax router as Qwen3-MoE.
//   deepseek_v3 : Multi-Latent Attention; sigmoid router with e_score_correction_bias,
//                 group-limited routing, routed scaling factor; shared experts; the
//                 first layers dense.
//   moetron_moe : anything else (capacity, sqrtsoftplus, shared-expert gate, ...):
//                 moetron's own model_type, read by moetron only, with the Qwen3-MoE
//                 and DeepSeek-V3 tensor names.
#pragma once
#include "core/config.h"

typedef enum { HF_MIXTRAL, HF_QWEN3_MOE, HF_OLMOE, HF_DEEPSEEK_V3, HF_MOETRON, HF_FAMILY_COUNT } HfFamily;

// The family of --hf-architecture, or, for "auto", the one that expresses c exactly with
// HF_MOETRON and the reason none does written to why (256 bytes; "" otherwise). A family
// named by --hf-architecture that cannot express c is fatal, naming every feature it lacks.
HfFamily hf_family_choose(const Config *c, char *why);
// NULL when family expresses c exactly, else everything it cannot express ("a; b; c").
const char *hf_family_cannot_express(HfFamily family, const Config *c, char *buf, size_t cap);
const char *hf_model_type(HfFamily family);      // "mixtral" / "qwen3_moe" / ...
const char *hf_architecture(HfFamily family);    // "MixtralForCausalLM" / ...
HfFamily hf_family_from_model_type(const char *model_type);  // HF_FAMILY_COUNT if unknown

// Parts of a decoder layer that have a name.
typedef enum {
    PART_INPUT_NORM, PART_POST_ATTN_NORM,
    PART_Q_PROJ, PART_K_PROJ, PART_V_PROJ, PART_O_PROJ, PART_Q_NORM, PART_K_NORM,
    // Multi-Latent Attention
    PART_Q_A_PROJ, PART_Q_A_NORM, PART_Q_B_PROJ, PART_KV_A_PROJ, PART_KV_A_NORM, PART_KV_B_PROJ,
    PART_MLP_GATE, PART_MLP_UP, PART_MLP_DOWN,          // dense SwiGLU
    PART_ROUTER,
    PART_EXPERT_GATE, PART_EXPERT_UP, PART_EXPERT_DOWN, // routed expert `expert`
    PART_EXPERT_BIAS,                                   // router expert bias
    PART_QB_BIAS,                                       // quantile balancing's per-expert bias (moetron's own)
    PART_SHARED_GATE, PART_SHARED_UP, PART_SHARED_DOWN, // shared expert
    PART_SHARED_EXPERT_GATE,                            // its sigmoid gate [1,H]
    PART_FC1_LATENT_PROJ, PART_FC2_LATENT_PROJ,         // latent MoE: [L,H], [H,L] (moetron's own)
    // a multi-token-prediction depth's own (its layer index follows the decoder's, as
    // DeepSeek-V3's num_nextn_predict_layers): the norms of the next token's embedding and of
    // the previous depth's hidden state, their projection [H, 2H], the norm before the head,
    // and the copies of the embedding and LM head DeepSeek-V3 checkpoints carry there
    PART_MTP_ENORM, PART_MTP_HNORM, PART_MTP_EH_PROJ, PART_MTP_FINAL_NORM, PART_MTP_EMBED, PART_MTP_HEAD,
} LayerPart;

// Writes e.g. "model.layers.3.mlp.experts.5.gate_proj.weight" into out (MT_NAME_MAX).
void hf_layer_tensor_name(char *out, HfFamily family, int layer, LayerPart part, int expert);

#define HF_EMBED_NAME "model.embed_tokens.weight"
#define HF_FINAL_NORM_NAME "model.norm.weight"
#define HF_LM_HEAD_NAME "lm_head.weight"

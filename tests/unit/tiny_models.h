// tiny_models.h — small model configurations the float unit tests share: a 2-layer MoE
// (hidden 32, 4 heads, 4 experts) and setters for each attention kind.
#pragma once
#include <string.h>

#include "core/config.h"

typedef void (*ConfigVariant)(Config *c);

// The base model for seq_length tokens; variant (or NULL) adjusts it, then it is validated.
static inline void tiny_moe_config(Config *c, int seq_length, int qk_layernorm, int group_query,
                                   ConfigVariant variant) {
    config_defaults(c);
    c->num_layers = 2;
    c->hidden_size = 32;
    c->num_attention_heads = 4;
    c->group_query_attention = group_query;
    c->num_query_groups = 2;
    c->seq_length = seq_length;
    c->num_experts = 4;
    c->moe_ffn_hidden_size = 24;
    c->qk_layernorm = qk_layernorm;
    c->init_method_std = 0.2;
    if (variant) variant(c);
    config_validate(c);
}

// OLMoE attention: QK-norm over whole projections, clip_qkv small enough to clamp some
// values of the 0.2-std weights.
static inline void variant_olmoe(Config *c) {
    c->qk_layernorm = 1;
    strcpy(c->qk_layernorm_scope, "projection");
    c->clip_qkv = 0.5;
}

// Multi-Latent Attention with full-rank queries and interleaved RoPE.
static inline void variant_mla(Config *c) {
    c->multi_latent_attention = 1;
    c->group_query_attention = 0;
    c->kv_lora_rank = 12;
    c->qk_head_dim = 6;
    c->qk_pos_emb_head_dim = 4;
    c->v_head_dim = 10;
    c->rotary_interleaved = 1;
}

// Multi-Latent Attention with low-rank queries and rotate-half RoPE.
static inline void variant_mla_q_lora(Config *c) {
    variant_mla(c);
    c->q_lora_rank = 8;
    c->rotary_interleaved = 0;
}

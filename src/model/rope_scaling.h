// rope_scaling.h — the rotary frequencies of a model and the scales that go with them:
// plain RoPE, YaRN (DeepSeek-V3's and Qwen3's context extension, Megatron-Core's
// --rope-type yarn), Llama 3's scaling (--use-rope-scaling, transformers' "llama3") and linear
// position interpolation (--rotary-seq-len-interpolation-factor, transformers' "linear"). docs/hf.md, "RoPE scaling", has the formulas.
#pragma once
#include "core/common.h"
#include "core/config.h"

// The table of rotary angles for max_positions positions of this model's rotary width
// (c->rope_dim): cos_sin (max_positions, rope_dim/2, 2), YaRN's cos/sin scale applied.
void rope_scaled_table(real *cos_sin, const Config *c);

// The inverse frequencies (rope_dim/2) of the model: plain base^(−2i/d), divided by the
// linear factor, rescaled as Llama 3, or YaRN's blend of the plain and the interpolated (divided by the factor)
// ones over the correction range of dimensions, in float as the reference implementations.
void rope_scaled_inv_freq(float *inv_freq, const Config *c);

// What cos and sin are multiplied by: YaRN's mscale(s, mscale) / mscale(s, mscale_all_dim)
// with mscale(s, m) = 0.1·m·ln(s) + 1 (1 when s ≤ 1); 1 otherwise.
float rope_cos_sin_scale(const Config *c);

// The attention's softmax scale: 1/sqrt(head_dim), with Multi-Latent Attention times
// mscale(s, mscale_all_dim)² (Megatron-Core's and DeepSeek-V3's correction; s is
// --rotary-scaling-factor, so 1 leaves it as it is).
double attention_softmax_scale(const Config *c);

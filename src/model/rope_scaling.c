// rope_scaling.c — rotary frequencies and scales (rope_scaling.h). YaRN follows
// transformers' _compute_yarn_parameters and Megatron-Core's YarnRotaryEmbedding, which
// agree: the correction range [low, high] of dimensions from the rotations beta_fast and
// beta_slow over the original context (floored and ceiled), a linear ramp over it, and
//   inv_freq = inv_interpolated · (1 − e) + inv_extrapolated · e,   e = 1 − ramp,
// all in float as they compute it.
#include "model/rope_scaling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

static int is_yarn(const Config *c) { return !strcmp(c->rope_type, "yarn"); }

// YaRN's mscale(s, m) = 0.1·m·ln(s) + 1, 1 when s ≤ 1.
static double yarn_mscale(double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * log(s) + 1.0; }

// The dimension whose wavelength fits `rotations` times into the original context.
static double yarn_correction_dim(double rotations, int dim, double base, int original) {
    return dim * log(original / (rotations * 2 * M_PI)) / (2 * log(base));
}

static void yarn_inv_freq(float *inv_freq, const Config *c) {
    int dim = c->rope_dim, half = dim / 2;
    float factor = (float)c->rotary_scaling_factor;
    double low = floor(yarn_correction_dim(c->beta_fast, dim, c->rotary_base, c->original_max_position_embeddings));
    double high = ceil(yarn_correction_dim(c->beta_slow, dim, c->rotary_base, c->original_max_position_embeddings));
    low = fmax(low, 0);
    high = fmin(high, dim - 1);
    if (low == high) high += 0.001;  // no division by zero
    for (int i = 0; i < half; i++) {
        float pos_freq = powf((float)c->rotary_base, (float)(2 * i) / (float)dim);
        float extrapolated = 1.0f / pos_freq, interpolated = 1.0f / (factor * pos_freq);
        float ramp = fminf(fmaxf(((float)i - (float)low) / (float)(high - low), 0.0f), 1.0f);
        float e = 1.0f - ramp;  // the share of the original frequency
        inv_freq[i] = interpolated * (1.0f - e) + extrapolated * e;
    }
}

// Llama 3's scaling (transformers' "llama3", Megatron-Core's --use-rope-scaling): with L the
// original context and s the factor, a frequency of wavelength w = 2π/f above L (low
// frequency factor 1) is divided by s, one below L/4 (high frequency factor 4) kept, and one
// between blended: (1 − m)·f/s + m·f with m = (L/w − 1) / (4 − 1). In float, as both compute it.
static void llama3_inv_freq(float *inv_freq, const Config *c) {
    enum { LOW_FREQ_FACTOR = 1, HIGH_FREQ_FACTOR = 4 };  // Llama 3's, fixed in Megatron-Core too
    float factor = (float)c->rope_scaling_factor, context = (float)c->original_max_position_embeddings;
    float low_wavelen = context / LOW_FREQ_FACTOR, high_wavelen = context / HIGH_FREQ_FACTOR;
    for (int i = 0; i < c->rope_dim / 2; i++) {
        float f = inv_freq[i], wavelen = (float)(2 * M_PI) / f;
        float scaled = wavelen > low_wavelen ? f / factor : f;
        float m = (context / wavelen - LOW_FREQ_FACTOR) / (HIGH_FREQ_FACTOR - LOW_FREQ_FACTOR);
        int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        inv_freq[i] = medium ? (1 - m) * scaled / factor + m * scaled : scaled;
    }
}

void rope_scaled_inv_freq(float *inv_freq, const Config *c) {
    if (is_yarn(c)) {
        yarn_inv_freq(inv_freq, c);
        return;
    }
    rope_plain_inv_freq(inv_freq, c->rope_dim, c->rotary_base);
    if (c->use_rope_scaling) llama3_inv_freq(inv_freq, c);
    if (c->rotary_seq_len_interpolation_factor > 0)
        for (int i = 0; i < c->rope_dim / 2; i++) inv_freq[i] /= (float)c->rotary_seq_len_interpolation_factor;
}

float rope_cos_sin_scale(const Config *c) {
    if (!is_yarn(c)) return 1.0f;
    double s = c->rotary_scaling_factor;
    return (float)(yarn_mscale(s, c->mscale) / yarn_mscale(s, c->mscale_all_dim));
}

double attention_softmax_scale(const Config *c) {
    double scale = 1.0 / sqrt((double)c->head_dim);
    if (!c->multi_latent_attention) return scale;
    double m = yarn_mscale(c->rotary_scaling_factor, c->mscale_all_dim);
    return scale * m * m;
}

void rope_scaled_table(real *cos_sin, const Config *c) {
    float *inv_freq = mt_malloc((size_t)(c->rope_dim / 2) * sizeof(float));
    rope_scaled_inv_freq(inv_freq, c);
    rope_table_from(cos_sin, c->max_positions, c->rope_dim / 2, inv_freq, rope_cos_sin_scale(c));
    free(inv_freq);
}

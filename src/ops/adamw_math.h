// adamw_math.h — the one source of AdamW's arithmetic (ops.h adamw_update,
// adamw_update_scaled) for the cpu backend and the cuda kernels alike: the step's constants
// folded in double and rounded to the compute type, the per-element update, and how a
// moment is stored in a narrower type (--use-precision-aware-optimizer), with Transformer
// Engine FusedAdam's scaling: each moment decoded to the compute type, stepped, then a new
// scale from its largest magnitude, and stored with it.
#pragma once
#include <math.h>
#include <stddef.h>

#include "core/float_formats.h"
#include "ops/ops.h"

#ifdef __CUDACC__
#define ADAMW_FN static inline __host__ __device__
#else
#define ADAMW_FN static inline
#endif

// The largest magnitude a scaled moment is stored at: half of fp16's largest finite value
// (headroom, as Transformer Engine), FP8 E4M3's largest.
#define MOMENT_FP16_RANGE 32752.0f
#define MOMENT_FP8_RANGE E4M3_MAX

// The constants of one step, as the compute type.
typedef struct {
    real beta1, beta2, one_minus_beta1, one_minus_beta2, eps, lr, inv_bias1, inv_sqrt_bias2, decay_factor;
    real grad_scale;  // AdamWStep's; 1 when that is not above 0 (unscaled: x·1 is x)
} AdamWConstants;

static inline AdamWConstants adamw_constants(int decay, const AdamWStep *h) {
    AdamWConstants k;
    k.beta1 = (real)h->beta1;
    k.beta2 = (real)h->beta2;
    k.one_minus_beta1 = (real)(1.0 - h->beta1);
    k.one_minus_beta2 = (real)(1.0 - h->beta2);
    k.eps = (real)h->eps;
    k.lr = (real)h->lr;
    k.inv_bias1 = (real)(1.0 / (1.0 - pow(h->beta1, (double)h->step)));
    k.inv_sqrt_bias2 = (real)(1.0 / sqrt(1.0 - pow(h->beta2, (double)h->step)));
    k.decay_factor = decay ? (real)(1.0 - h->lr * h->weight_decay) : (real)1;
    k.grad_scale = h->grad_scale > 0 ? (real)h->grad_scale : (real)1;
    return k;
}

// The new moments of one element from its gradient g (times the step's grad_scale) and its old
// moments m, v.
ADAMW_FN void adamw_moments(real *m_out, real *v_out, real g, real m, real v, const AdamWConstants *k) {
    g *= k->grad_scale;
    *m_out = k->beta1 * m + k->one_minus_beta1 * g;
    *v_out = k->beta2 * v + k->one_minus_beta2 * g * g;
}

// The parameter after the step, from its new moments.
ADAMW_FN real adamw_param(real p, real m, real v, const AdamWConstants *k) {
    real update = (m * k->inv_bias1) / (real_sqrt(v) * k->inv_sqrt_bias2 + k->eps);
    return p * k->decay_factor - k->lr * update;
}

// ---- moments in narrower types ------------------------------------------------------------

ADAMW_FN size_t moment_bytes(MomentDtype d) {
    return d == MOMENT_FP32 ? sizeof(real) : d == MOMENT_FP8 ? 1 : 2;
}

// What the stored values are multiplied by to give the moment (decode) and the moment by to
// give what is stored (encode), from a MomentScales scale (ops.h).
typedef struct {
    float decode, encode;
} MomentFactors;

ADAMW_FN MomentFactors moment_factors(MomentDtype d, float scale) {
    MomentFactors f = {1.0f, 1.0f};
    if (d == MOMENT_FP16) f.decode = scale, f.encode = scale > 0 ? 1.0f / scale : 0.0f;
    if (d == MOMENT_FP8) f.decode = 1.0f / scale, f.encode = scale;
    return f;
}

// The scale a moment whose largest magnitude is absmax is stored with. Transformer Engine
// takes fp8's as 1 / (absmax / 448); for an all-zero moment (an expert no token reached)
// that would be infinite and store NaN, so it is 1 here.
ADAMW_FN float moment_scale(MomentDtype d, float absmax) {
    if (d == MOMENT_FP16) return absmax / MOMENT_FP16_RANGE;
    if (d != MOMENT_FP8) return 1.0f;
    float s = absmax / MOMENT_FP8_RANGE;
    return s > 0 ? 1.0f / s : 1.0f;
}

// Whether dtype d needs a scale (its absmax).
ADAMW_FN int moment_scaled(MomentDtype d) { return d == MOMENT_FP16 || d == MOMENT_FP8; }

// Element i of a moment stored as d.
ADAMW_FN real moment_load(const void *data, size_t i, MomentDtype d, MomentFactors f) {
    switch (d) {
    case MOMENT_BF16: return (real)bf16_to_float(((const uint16_t *)data)[i]);
    case MOMENT_FP16: return (real)(f16_to_float(((const uint16_t *)data)[i]) * f.decode);
    case MOMENT_FP8: return (real)(e4m3_to_float(((const uint8_t *)data)[i]) * f.decode);
    default: return ((const real *)data)[i];
    }
}

ADAMW_FN void moment_store(void *data, size_t i, MomentDtype d, MomentFactors f, real x) {
    switch (d) {
    case MOMENT_BF16: ((uint16_t *)data)[i] = bf16_from_float((float)x); break;
    case MOMENT_FP16: ((uint16_t *)data)[i] = f16_from_float((float)x * f.encode); break;
    case MOMENT_FP8: ((uint8_t *)data)[i] = e4m3_from_float((float)x * f.encode); break;
    default: ((real *)data)[i] = x;
    }
}

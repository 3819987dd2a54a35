// moment_probe.c — moetron's narrow number formats and its AdamW with narrow moments
// (--use-precision-aware-optimizer) on given values, for
// tests/conformance/precision_optimizer.py (comparison against torch's casts and a
// re-derivation of Transformer Engine FusedAdam's scaling).
//
// usage: moment_probe IN.safetensors OUT.safetensors EXP_AVG_DTYPE EXP_AVG_SQ_DTYPE DECAY
//
// IN:  x  (n)    F32: values to convert
//      p  (n)    F32: parameters before the first step
//      g  (S,n)  F32: the gradient of each of S steps
// The dtypes are fp32, bf16, fp16 or fp8; DECAY is 0 or 1 (weight decay 0.1).
// OUT: bf16, fp16, e4m3 (I32 n): the bits of x in each format
//      p, m, v (F32 n): after the S steps (m, v decoded with their scales)
//      m_bits, v_bits (I32 n): the stored moments' bits (fp32: the float's)
//      scale_m, scale_v (F32 S): the scales after each step
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/float_formats.h"
#include "core/safetensors.h"
#include "ops/adamw_math.h"

static const char *const DTYPE_NAMES[MOMENT_DTYPES] = {"fp32", "bf16", "fp16", "fp8"};

static MomentDtype parse_dtype(const char *name) {
    for (int d = 0; d < MOMENT_DTYPES; d++)
        if (strcmp(name, DTYPE_NAMES[d]) == 0) return (MomentDtype)d;
    mt_die("moment_probe: dtype %s: use fp32, bf16, fp16 or fp8", name);
}

// The F32 tensor `name` of f with `numel` elements, as floats (malloc'd).
static float *read_floats(const StFile *f, const char *name, int64_t *numel) {
    const StTensor *t = st_find(f, name);
    if (!t || t->dtype != ST_F32) mt_die("moment_probe: needs an F32 tensor %s", name);
    *numel = st_numel(t);
    float *out = mt_malloc((size_t)MT_MAX(*numel, 1) * sizeof(float));
    memcpy(out, st_data(f, t), (size_t)*numel * sizeof(float));
    return out;
}

static int32_t stored_bits(const void *data, size_t i, MomentDtype d) {
    switch (d) {
    case MOMENT_FP8: return ((const uint8_t *)data)[i];
    case MOMENT_BF16:
    case MOMENT_FP16: return ((const uint16_t *)data)[i];
    default: return (int32_t)float_bits(((const float *)data)[i]);
    }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s IN.safetensors OUT.safetensors EXP_AVG_DTYPE EXP_AVG_SQ_DTYPE DECAY\n", argv[0]);
        return 2;
    }
    MomentDtype dtype[ADAMW_MOMENTS] = {parse_dtype(argv[3]), parse_dtype(argv[4])};
    int decay = atoi(argv[5]);
    char err[512];
    StFile in;
    if (st_open(&in, argv[1], err, sizeof(err))) mt_die("moment_probe: %s: %s", argv[1], err);
    int64_t nx, n, ng;
    float *x = read_floats(&in, "x", &nx), *p = read_floats(&in, "p", &n), *g = read_floats(&in, "g", &ng);
    if (n == 0 || ng % n) mt_die("moment_probe: g must be (steps, %lld)", (long long)n);
    int64_t steps = ng / n;

    int32_t *bits[3];
    for (int k = 0; k < 3; k++) bits[k] = mt_malloc((size_t)MT_MAX(nx, 1) * sizeof(int32_t));
    for (int64_t i = 0; i < nx; i++) {
        bits[0][i] = bf16_from_float(x[i]);
        bits[1][i] = f16_from_float(x[i]);
        bits[2][i] = e4m3_from_float(x[i]);
    }

    void *m = mt_calloc((size_t)n, moment_bytes(dtype[0])), *v = mt_calloc((size_t)n, moment_bytes(dtype[1]));
    MomentScales s = {{1, 1}, {0, 0}};
    float *scales = mt_malloc((size_t)steps * 2 * sizeof(float));
    for (int64_t step = 1; step <= steps; step++) {
        AdamWStep h = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = step};
        adamw_update_scaled(p, g + (step - 1) * n, m, v, &s, (size_t)n, decay, &h, dtype);
        scales[step - 1] = s.scale[0], scales[steps + step - 1] = s.scale[1];
    }
    float *decoded[ADAMW_MOMENTS];
    int32_t *stored[ADAMW_MOMENTS];
    void *moments[ADAMW_MOMENTS] = {m, v};
    for (int k = 0; k < ADAMW_MOMENTS; k++) {
        decoded[k] = mt_malloc((size_t)n * sizeof(float));
        stored[k] = mt_malloc((size_t)n * sizeof(int32_t));
        MomentFactors f = moment_factors(dtype[k], s.scale[k]);
        for (int64_t i = 0; i < n; i++) {
            decoded[k][i] = (float)moment_load(moments[k], (size_t)i, dtype[k], f);
            stored[k][i] = stored_bits(moments[k], (size_t)i, dtype[k]);
        }
    }

    StWriter w;
    stw_init(&w);
    int64_t shape_x[1] = {nx}, shape_n[1] = {n}, shape_s[1] = {steps};
    stw_add(&w, "bf16", ST_I32, 1, shape_x, bits[0]);
    stw_add(&w, "fp16", ST_I32, 1, shape_x, bits[1]);
    stw_add(&w, "e4m3", ST_I32, 1, shape_x, bits[2]);
    stw_add(&w, "p", ST_F32, 1, shape_n, p);
    stw_add(&w, "m", ST_F32, 1, shape_n, decoded[0]);
    stw_add(&w, "v", ST_F32, 1, shape_n, decoded[1]);
    stw_add(&w, "m_bits", ST_I32, 1, shape_n, stored[0]);
    stw_add(&w, "v_bits", ST_I32, 1, shape_n, stored[1]);
    stw_add(&w, "scale_m", ST_F32, 1, shape_s, scales);
    stw_add(&w, "scale_v", ST_F32, 1, shape_s, scales + steps);
    if (stw_finish(&w, argv[2], err, sizeof(err))) mt_die("moment_probe: %s", err);
    for (int k = 0; k < 3; k++) free(bits[k]);
    for (int k = 0; k < ADAMW_MOMENTS; k++) free(decoded[k]), free(stored[k]), free(moments[k]);
    free(scales), free(x), free(p), free(g);
    st_close(&in);
    return 0;
}

// quant_probe.c — moetron's quantizers (ops_quantize.h, the cpu backend) on given values, for
// tests/conformance/quantizers.py (comparison against torch's float8 casts, torchao's MX and
// NVFP4 references and re-derivations of Transformer Engine's scaling).
//
// usage: quant_probe IN.safetensors OUT.safetensors SEED
//
// IN:  x        (rows, cols) F32: the values to quantize
//      history  (L) F32: an amax history, newest first (DelayedScaling)
// OUT, for each quantizer Q (names below): Q_codes (U8, packed for NVFP4), Q_scales (F32
// scale_inv for FP8, U8 E8M0 / E4M3 for MX / NVFP4), Q_y (F32, dequantized);
//   t_e4m3, t_e5m2, t_e4m3_pow2        FP8 per tensor (+ Q_amax, Q_scale F32 scalars)
//   b1, b1_fp32, b128                  FP8 1×128 (power-of-2 / fp32 scales), 128×128
//   mx_e4m3_floor, mx_e4m3_rceil, mx_e5m2_floor
//   nv1, nv16, nv1_sr                  NVFP4 1×16, 16×16, 1×16 stochastic (SEED); nv_amax
//   hadamard (F32, when cols is a multiple of 16): x through hadamard16 with TE's signs
//   delayed (F32 4): scales of (most_recent, max) × margin (0, 1) from history, previous 0.5
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "ops/op_list.h"

enum { MAX_OUTPUTS = 96 };

// Every output buffer, kept until the file is written.
typedef struct {
    StWriter w;
    void *buffers[MAX_OUTPUTS];
    int count;
    int64_t rows, cols;
} Probe;

static void *probe_alloc(Probe *pr, size_t bytes) {
    if (pr->count == MAX_OUTPUTS) mt_die("quant_probe: more than %d outputs", MAX_OUTPUTS);
    return pr->buffers[pr->count++] = mt_calloc(bytes ? bytes : 1, 1);
}

static void probe_add(Probe *pr, const char *prefix, const char *what, StDtype dtype, int64_t r, int64_t c,
                      const void *data) {
    char name[64];
    snprintf(name, sizeof(name), "%s_%s", prefix, what);
    int64_t shape[2] = {r, c};
    stw_add(&pr->w, name, dtype, 2, shape, data);
}

static float *read_floats(const StFile *f, const char *name, int64_t *rows, int64_t *cols) {
    const StTensor *t = st_find(f, name);
    if (!t || t->dtype != ST_F32 || t->ndim < 1 || t->ndim > 2)
        mt_die("quant_probe: needs a 1-D or 2-D F32 tensor %s", name);
    *rows = t->ndim == 2 ? t->shape[0] : 1;
    *cols = t->shape[t->ndim - 1];
    float *out = mt_malloc((size_t)MT_MAX(*rows * *cols, 1) * sizeof(float));
    memcpy(out, st_data(f, t), (size_t)(*rows * *cols) * sizeof(float));
    return out;
}

static void probe_fp8_tensor(Probe *pr, const char *q, const float *x, Fp8Format f, int pow2) {
    size_t n = (size_t)(pr->rows * pr->cols);
    float *amax = probe_alloc(pr, sizeof(float)), *scale = probe_alloc(pr, sizeof(float));
    float *scale_inv = probe_alloc(pr, sizeof(float)), *y = probe_alloc(pr, n * sizeof(float));
    uint8_t *codes = probe_alloc(pr, n);
    Fp8ScaleParams p = {.format = f, .pow2_scales = pow2, .amax_epsilon = 0.0f};
    quant_amax(amax, x, n, AMAX_IGNORE_NAN);
    fp8_scale_from_amax(scale, scale_inv, amax, &p);
    fp8_quantize_tensor(codes, x, scale, n, f);
    fp8_dequantize_tensor(y, codes, scale_inv, n, f);
    probe_add(pr, q, "amax", ST_F32, 1, 1, amax);
    probe_add(pr, q, "scale", ST_F32, 1, 1, scale);
    probe_add(pr, q, "scales", ST_F32, 1, 1, scale_inv);
    probe_add(pr, q, "codes", ST_U8, pr->rows, pr->cols, codes);
    probe_add(pr, q, "y", ST_F32, pr->rows, pr->cols, y);
}

static void probe_fp8_block(Probe *pr, const char *q, const float *x, int tile_rows, int pow2) {
    int rows = (int)pr->rows, cols = (int)pr->cols;
    int64_t sr = (rows + tile_rows - 1) / tile_rows, sc = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
    Fp8BlockParams p = {.format = FP8_E4M3, .tile_rows = tile_rows, .pow2_scales = pow2, .amax_epsilon = 0.0f};
    uint8_t *codes = probe_alloc(pr, (size_t)rows * cols);
    float *scale_inv = probe_alloc(pr, (size_t)(sr * sc) * sizeof(float));
    float *y = probe_alloc(pr, (size_t)rows * cols * sizeof(float));
    fp8_block_quantize(codes, scale_inv, x, rows, cols, &p);
    fp8_block_dequantize(y, codes, scale_inv, rows, cols, &p);
    probe_add(pr, q, "codes", ST_U8, rows, cols, codes);
    probe_add(pr, q, "scales", ST_F32, sr, sc, scale_inv);
    probe_add(pr, q, "y", ST_F32, rows, cols, y);
}

static void probe_mx(Probe *pr, const char *q, const float *x, Fp8Format f, MxScaleMode mode) {
    int rows = (int)pr->rows, cols = (int)pr->cols;
    int64_t sc = (cols + MX_BLOCK - 1) / MX_BLOCK;
    uint8_t *codes = probe_alloc(pr, (size_t)rows * cols), *scales = probe_alloc(pr, (size_t)(rows * sc));
    float *y = probe_alloc(pr, (size_t)rows * cols * sizeof(float));
    mxfp8_quantize(codes, scales, x, rows, cols, f, mode);
    mxfp8_dequantize(y, codes, scales, rows, cols, f);
    probe_add(pr, q, "codes", ST_U8, rows, cols, codes);
    probe_add(pr, q, "scales", ST_U8, rows, sc, scales);
    probe_add(pr, q, "y", ST_F32, rows, cols, y);
}

static void probe_nvfp4(Probe *pr, const char *q, const float *x, const float *amax, int tile_rows,
                        int stochastic, uint64_t seed) {
    int rows = (int)pr->rows, cols = (int)pr->cols;
    int64_t sc = (cols + NVFP4_BLOCK - 1) / NVFP4_BLOCK;
    Nvfp4Params p = {.tile_rows = tile_rows, .stochastic = stochastic, .seed = seed};
    uint8_t *codes = probe_alloc(pr, (size_t)rows * cols / 2), *scales = probe_alloc(pr, (size_t)(rows * sc));
    float *y = probe_alloc(pr, (size_t)rows * cols * sizeof(float));
    nvfp4_quantize(codes, scales, x, amax, rows, cols, &p);
    nvfp4_dequantize(y, codes, scales, amax, rows, cols);
    probe_add(pr, q, "codes", ST_U8, rows, cols / 2, codes);
    probe_add(pr, q, "scales", ST_U8, rows, sc, scales);
    probe_add(pr, q, "y", ST_F32, rows, cols, y);
}

static void probe_delayed(Probe *pr, const float *history, int length) {
    float *scales = probe_alloc(pr, 4 * sizeof(float)), scale_inv, prev = 0.5f;
    for (int k = 0; k < 4; k++) {
        Fp8DelayedParams p = {.format = FP8_E4M3, .history_len = length,
                              .algo = k & 1 ? AMAX_HISTORY_MAX : AMAX_HISTORY_MOST_RECENT, .margin = k >> 1};
        fp8_delayed_scale(scales + k, &scale_inv, history, &prev, &p);
    }
    probe_add(pr, "delayed", "scales", ST_F32, 1, 4, scales);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s IN.safetensors OUT.safetensors SEED\n", argv[0]);
        return 2;
    }
    uint64_t seed = strtoull(argv[3], NULL, 0);
    char err[512];
    StFile in;
    if (st_open(&in, argv[1], err, sizeof(err))) mt_die("quant_probe: %s: %s", argv[1], err);
    Probe pr = {.count = 0};
    int64_t hr, hc;
    float *x = read_floats(&in, "x", &pr.rows, &pr.cols), *history = read_floats(&in, "history", &hr, &hc);
    stw_init(&pr.w);
    probe_fp8_tensor(&pr, "t_e4m3", x, FP8_E4M3, 0);
    probe_fp8_tensor(&pr, "t_e5m2", x, FP8_E5M2, 0);
    probe_fp8_tensor(&pr, "t_e4m3_pow2", x, FP8_E4M3, 1);
    probe_fp8_block(&pr, "b1", x, 1, 1);
    probe_fp8_block(&pr, "b1_fp32", x, 1, 0);
    probe_fp8_block(&pr, "b128", x, FP8_BLOCK, 1);
    probe_mx(&pr, "mx_e4m3_floor", x, FP8_E4M3, MX_SCALE_FLOOR);
    probe_mx(&pr, "mx_e4m3_rceil", x, FP8_E4M3, MX_SCALE_RCEIL);
    probe_mx(&pr, "mx_e5m2_floor", x, FP8_E5M2, MX_SCALE_FLOOR);
    if (pr.cols % 2 == 0) {
        float *amax = probe_alloc(&pr, sizeof(float));
        quant_amax(amax, x, (size_t)(pr.rows * pr.cols), AMAX_PROPAGATE_NAN);
        probe_add(&pr, "nv", "amax", ST_F32, 1, 1, amax);
        probe_nvfp4(&pr, "nv1", x, amax, 1, 0, seed);
        probe_nvfp4(&pr, "nv16", x, amax, NVFP4_BLOCK, 0, seed);
        probe_nvfp4(&pr, "nv1_sr", x, amax, 1, 1, seed);
    }
    if (pr.cols % HADAMARD_DIM == 0) {
        float *h = probe_alloc(&pr, (size_t)(pr.rows * pr.cols) * sizeof(float));
        hadamard16(h, x, (size_t)(pr.rows * pr.cols), HADAMARD_TE_WGRAD_SIGNS);
        int64_t shape[2] = {pr.rows, pr.cols};
        stw_add(&pr.w, "hadamard", ST_F32, 2, shape, h);
    }
    probe_delayed(&pr, history, (int)(hr * hc));
    if (stw_finish(&pr.w, argv[2], err, sizeof(err))) mt_die("quant_probe: %s", err);
    for (int i = 0; i < pr.count; i++) free(pr.buffers[i]);
    free(x), free(history);
    st_close(&in);
    return 0;
}

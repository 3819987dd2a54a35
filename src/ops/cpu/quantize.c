// quantize.c — the cpu backend's quantizer ops (contracts in ops_quantize.h), with the
// arithmetic of ops/quantize_math.h (shared with the cuda kernels): tensors walked tile by
// tile (one OpenMP iteration each), every element's code from its tile's scale.
#include "ops/cpu/cpu_ops.h"
#include "ops/gemm.h"
#include "ops/quantize_math.h"

// The amax of tile q of x (row pitch cols).
static float tile_amax(const float *x, int cols, QuantTile q, AmaxNan nan) {
    float amax = 0.0f;
    for (int r = q.r0; r < q.r1; r++)
        for (int c = q.c0; c < q.c1; c++) amax = quant_amax_fold(amax, x[(size_t)r * cols + c], nan);
    return amax;
}

static long tile_count(int rows, int cols, int tile_rows, int tile_cols) {
    return (long)quant_blocks(rows, tile_rows) * quant_blocks(cols, tile_cols);
}

// ---- FP8 per tensor ---------------------------------------------------------------------------

void cpu_quant_amax(float *amax, const float *x, size_t n, AmaxNan nan) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = quant_amax_fold(m, x[i], nan);
    amax[0] = m;
}

void cpu_fp8_scale_from_amax(float *scale, float *scale_inv, const float *amax, const Fp8ScaleParams *p) {
    scale[0] = fp8_amax_scale(amax[0], fp8_max(p->format), p->pow2_scales, p->amax_epsilon, QUANT_F32_MAX);
    scale_inv[0] = fp8_scale_inv(scale[0]);
}

void cpu_fp8_delayed_scale(float *scale, float *scale_inv, const float *history, const float *prev,
                           const Fp8DelayedParams *p) {
    quant_check_history("fp8_delayed_scale", p->history_len);
    float s = fp8_history_scale(history, p->history_len, p, prev[0]);
    scale[0] = s;
    scale_inv[0] = fp8_scale_inv(s);
}

void cpu_fp8_quantize_tensor(uint8_t *codes, const float *x, const float *scale, size_t n, Fp8Format f) {
    float s = scale[0];
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) codes[i] = fp8_code(f, x[i], s);
}

void cpu_fp8_dequantize_tensor(float *y, const uint8_t *codes, const float *scale_inv, size_t n, Fp8Format f) {
    float s = scale_inv[0];
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) y[i] = fp8_value(f, codes[i], s);
}

void cpu_fp8_transpose(uint8_t *t, const uint8_t *codes, int rows, int cols) {
    quant_check_shape("fp8_transpose", rows, cols, 0);
#pragma omp parallel for schedule(static)
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++) t[(size_t)c * rows + r] = codes[(size_t)r * cols + c];
}

// The emulation: both operands dequantized into work, then one fp32 GEMM.
void cpu_fp8_gemm(float *C, const uint8_t *A, Fp8Format fa, const float *a_scale_inv, const uint8_t *B, Fp8Format fb,
                  const float *b_scale_inv, int M, int N, int K, float beta, float *work) {
    quant_check_gemm("fp8_gemm", M, N, K, beta);
#ifdef MT_DOUBLE
    (void)C, (void)A, (void)fa, (void)a_scale_inv, (void)B, (void)fb, (void)b_scale_inv, (void)work;
    mt_die("fp8_gemm: the double-precision build has no FP8 GEMMs");
#else
    float *a = work, *b = work + (size_t)M * K;
    cpu_fp8_dequantize_tensor(a, A, a_scale_inv, (size_t)M * K, fa);
    cpu_fp8_dequantize_tensor(b, B, b_scale_inv, (size_t)N * K, fb);
    GemmInputs saved = mt_gemm_inputs();
    if (saved != GEMM_INPUTS_FP32) mt_gemm_set_inputs(GEMM_INPUTS_FP32);
    cpu_gemm(0, 1, M, N, K, 1, a, K, b, K, beta, C, N);
    if (saved != GEMM_INPUTS_FP32) mt_gemm_set_inputs(saved);
#endif
}

// ---- FP8 in tiles -------------------------------------------------------------------------------

void cpu_fp8_block_quantize(uint8_t *codes, float *scale_inv, const float *x, int rows, int cols,
                            const Fp8BlockParams *p) {
    quant_check_shape("fp8_block_quantize", rows, cols, 0);
    quant_check_tile_rows("fp8_block_quantize", p->tile_rows, 1, FP8_BLOCK);
    long tiles = tile_count(rows, cols, p->tile_rows, FP8_BLOCK);
#pragma omp parallel for schedule(static)
    for (long t = 0; t < tiles; t++) {
        QuantTile q = quant_tile(t, rows, cols, p->tile_rows, FP8_BLOCK);
        float scale = fp8_block_scale(tile_amax(x, cols, q, AMAX_IGNORE_NAN), p);
        scale_inv[t] = fp8_scale_inv(scale);
        for (int r = q.r0; r < q.r1; r++)
            for (int c = q.c0; c < q.c1; c++) {
                size_t i = (size_t)r * cols + c;
                codes[i] = fp8_code(p->format, x[i], scale);
            }
    }
}

void cpu_fp8_block_dequantize(float *y, const uint8_t *codes, const float *scale_inv, int rows, int cols,
                              const Fp8BlockParams *p) {
    quant_check_shape("fp8_block_dequantize", rows, cols, 0);
    quant_check_tile_rows("fp8_block_dequantize", p->tile_rows, 1, FP8_BLOCK);
    int per_row = quant_blocks(cols, FP8_BLOCK);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *s = scale_inv + (size_t)(r / p->tile_rows) * per_row;
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            y[i] = fp8_value(p->format, codes[i], s[c / FP8_BLOCK]);
        }
    }
}

// ---- MXFP8 --------------------------------------------------------------------------------------

void cpu_mxfp8_quantize(uint8_t *codes, uint8_t *scales, const float *x, int rows, int cols, Fp8Format f,
                        MxScaleMode mode) {
    quant_check_shape("mxfp8_quantize", rows, cols, 0);
    long blocks = tile_count(rows, cols, 1, MX_BLOCK);
#pragma omp parallel for schedule(static)
    for (long t = 0; t < blocks; t++) {
        QuantTile q = quant_tile(t, rows, cols, 1, MX_BLOCK);
        uint8_t e = mx_scale(tile_amax(x, cols, q, AMAX_PROPAGATE_NAN), f, mode);
        scales[t] = e;
        for (int c = q.c0; c < q.c1; c++) {
            size_t i = (size_t)q.r0 * cols + c;
            codes[i] = mx_code(x[i], e, f, mode);
        }
    }
}

void cpu_mxfp8_dequantize(float *y, const uint8_t *codes, const uint8_t *scales, int rows, int cols, Fp8Format f) {
    quant_check_shape("mxfp8_dequantize", rows, cols, 0);
    int per_row = quant_blocks(cols, MX_BLOCK);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            y[i] = mx_value(codes[i], scales[(size_t)r * per_row + c / MX_BLOCK], f);
        }
}

// ---- NVFP4 ---------------------------------------------------------------------------------------

void cpu_nvfp4_quantize(uint8_t *codes, uint8_t *scales, const float *x, const float *amax, int rows, int cols,
                        const Nvfp4Params *p) {
    quant_check_shape("nvfp4_quantize", rows, cols, 1);
    quant_check_tile_rows("nvfp4_quantize", p->tile_rows, 1, NVFP4_BLOCK);
    float tensor_scale = nvfp4_tensor_scale(amax[0]);
    int per_row = quant_blocks(cols, NVFP4_BLOCK);
    long tiles = tile_count(rows, cols, p->tile_rows, NVFP4_BLOCK);
#pragma omp parallel for schedule(static)
    for (long t = 0; t < tiles; t++) {
        QuantTile q = quant_tile(t, rows, cols, p->tile_rows, NVFP4_BLOCK);
        uint8_t s = nvfp4_block_scale(tile_amax(x, cols, q, AMAX_PROPAGATE_NAN), tensor_scale);
        float m = nvfp4_multiplier(tensor_scale, s);
        for (int r = q.r0; r < q.r1; r++) {
            scales[(size_t)r * per_row + q.c0 / NVFP4_BLOCK] = s;
            for (int c = q.c0; c < q.c1; c += 2) {
                size_t i = (size_t)r * cols + c;
                uint8_t lo = nvfp4_element(x[i], m, p, i), hi = nvfp4_element(x[i + 1], m, p, i + 1);
                codes[i / 2] = (uint8_t)(lo | hi << 4);
            }
        }
    }
}

void cpu_nvfp4_dequantize(float *y, const uint8_t *codes, const uint8_t *scales, const float *amax, int rows,
                          int cols) {
    quant_check_shape("nvfp4_dequantize", rows, cols, 1);
    float tensor_scale = nvfp4_tensor_scale(amax[0]);
    int per_row = quant_blocks(cols, NVFP4_BLOCK);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            y[i] = nvfp4_value(nvfp4_unpack(codes, i), scales[(size_t)r * per_row + c / NVFP4_BLOCK], tensor_scale);
        }
}

void cpu_hadamard16(float *y, const float *x, size_t n, uint32_t sign_mask) {
    quant_check_hadamard("hadamard16", n);
#pragma omp parallel for schedule(static)
    for (size_t g = 0; g < n / HADAMARD_DIM; g++) hadamard16_group(y + g * HADAMARD_DIM, x + g * HADAMARD_DIM, sign_mask);
}

// quantized_linear.c — the FP8 / FP4 recipes' GEMMs (quantized_linear.h): per-tensor FP8 as
// quantize → fp8_gemm on the codes, the block recipes as quantize → dequantize → fp32 GEMM.
// Every step on tensor memory is an op (quantizers, transposes, copies, GEMMs), so the cpu
// and the cuda backend run the same code; the host only picks
// shapes, seeds and the one amax an all-zero NVFP4 tensor needs to be skipped.
#include "ops/quantized_linear.h"

#include <string.h>

#include "core/device.h"
#include "ops/gemm.h"
#include "ops/ops.h"
#include "ops/ops_parallel.h"
#include "ops/quantize_math.h"

enum {
    WORK_A,     // the GEMM's first operand
    WORK_B,     // its second
    WORK_T,     // a transposed copy
    WORK_PAD,   // the transposed copy padded to whole Hadamard groups
    WORKS,
    CODES_A = 0,    // the codes of the GEMM's first operand
    CODES_B,        // of its second
    CODES_T,        // the rowwise codes of an operand a GEMM takes transposed
    AMAX_SCALES = 2,  // c->amax: an amax, a fold, then (scale, scale_inv) per operand
    AMAX_SLOTS = AMAX_SCALES + 2 * QUANT_OPERANDS,
    RNG_FLOAT_WORDS = 4,  // 16-bit pieces of one 64-bit word (each exact in a float)
    RNG_WORD_BITS = 16,
};

int quant_recipe_alignment(QuantRecipe r) {
    if (r == QUANT_OFF) return 0;
    return r == QUANT_MXFP8 ? MX_BLOCK : NVFP4_BLOCK;
}

#define QUANT_RNG_TAG 0x5175616e74ull  // "Quant": the stochastic rounding's draws

enum { FP8_ROUTER_PADDING = 16, MXFP8_ROUTER_PADDING = 32, NVFP4_ROUTER_PADDING = 128 };

int quant_router_padding_multiple(QuantRecipe r) {
    if (r == QUANT_OFF) return 0;
    return r == QUANT_NVFP4 ? NVFP4_ROUTER_PADDING : r == QUANT_MXFP8 ? MXFP8_ROUTER_PADDING : FP8_ROUTER_PADDING;
}

// ---- the context -------------------------------------------------------------------------------

void quant_context_seed_rounding(QuantContext *c, uint64_t micro_batch_seed, uint64_t stream) {
    rng_seed_stream(&c->rng, micro_batch_seed ^ QUANT_RNG_TAG, stream);
}

static size_t operand_slots(const QuantContext *c) { return (size_t)c->capacity * QUANT_OPERANDS; }

QuantContext *quant_context_new(const QuantRecipeConfig *cfg, int linears) {
    QuantContext *c = mt_calloc(1, sizeof(QuantContext));
    c->cfg = *cfg;
    c->capacity = linears;
    c->linear = mt_calloc((size_t)MT_MAX(linears, 1), sizeof(QuantLinear));
    c->amax = device_calloc(AMAX_SLOTS, sizeof(float));
    rng_seed_stream(&c->rng, cfg->seed, QUANT_RNG_TAG);
    if (cfg->recipe == QUANT_DELAYED) {
        size_t slots = operand_slots(c), L = (size_t)cfg->history_len;
        c->history = device_calloc(slots * L, sizeof(float));
        c->roll = device_calloc(slots * L + slots, sizeof(float));  // the rolled copy, then zeros
        c->scale = device_calloc(slots * 2, sizeof(float));
        float *ones = mt_malloc(slots * 2 * sizeof(float));
        for (size_t i = 0; i < slots * 2; i++) ones[i] = 1.0f;  // TE's initial scale and scale_inv
        device_upload(c->scale, ones, slots * 2 * sizeof(float));
        free(ones);
    }
    if (cfg->recipe == QUANT_TENSORWISE) {
        c->fused_amax = device_calloc(operand_slots(c), sizeof(float));
        c->fused_set = mt_calloc(operand_slots(c), 1);
    }
    return c;
}

void quant_context_free(QuantContext *c) {
    if (!c) return;
    for (int i = 0; i < WORKS; i++) device_free(c->work[i]);
    for (int i = 0; i < QUANT_CODE_BUFFERS; i++) device_free(c->codes[i]);
    device_free(c->block_scales);
    device_free(c->amax);
    device_free(c->history);
    device_free(c->roll);
    device_free(c->scale);
    device_free(c->fused_amax);
    free(c->fused_set);
    free(c->host_offsets);
    free(c->linear);
    free(c);
}

int qlinear_fuses_amax(const QuantLinear *q) { return q && q->ctx->cfg.recipe == QUANT_TENSORWISE; }

QuantLinear *quant_context_linear(QuantContext *c) {
    MT_ASSERT(c->linears < c->capacity);
    QuantLinear *q = &c->linear[c->linears];
    *q = (QuantLinear){.ctx = c, .slot = c->linears++};
    return q;
}

static Fp8Format operand_format(const QuantContext *c, QuantOperand op) {
    return op == QUANT_GRAD && c->cfg.hybrid ? FP8_E5M2 : FP8_E4M3;
}

#ifndef MT_DOUBLE
// ---- one operand: quantize and dequantize -----------------------------------------------------

// Tensor memory of n elements, grown (to at least twice what it was) and then kept.
static void *grown(void **buffer, size_t *len, size_t n, size_t size) {
    if (n > *len) {
        device_free(*buffer);
        *len = MT_MAX(n, 2 * *len);
        *buffer = device_calloc(*len, size);
    }
    return *buffer;
}

static float *work(QuantContext *c, int which, size_t n) {
    return grown((void **)&c->work[which], &c->work_len[which], n, sizeof(float));
}

// One scale per tensor: the columnwise values are the rowwise ones.
static int per_tensor(QuantRecipe r) { return r == QUANT_DELAYED || r == QUANT_TENSORWISE; }

// Weights in square tiles (128×128 FP8 blocks, 16×16 NVFP4): the same values both ways.
static int square_weight(QuantRecipe r, QuantOperand op) {
    return op == QUANT_WEIGHT && (r == QUANT_BLOCKWISE || r == QUANT_NVFP4);
}

static float *slot_of(float *base, const QuantLinear *q, QuantOperand op, size_t per_slot) {
    return base + ((size_t)q->slot * QUANT_OPERANDS + op) * per_slot;
}

// Whether operand op of q takes the fused amax (tensorwise; NULL for the other recipes).
static uint8_t *fused_flag(const QuantLinear *q, QuantOperand op) {
    return q->ctx->fused_set ? q->ctx->fused_set + (size_t)q->slot * QUANT_OPERANDS + op : NULL;
}

// ---- per-tensor FP8 (delayed, tensorwise): codes and one scale -------------------------------

// into = max(into, c->amax[0]), NaN skipped (c->amax[1] holds into's value for the fold).
static void fold_amax(QuantContext *c, float *into) {
    vec_copy(c->amax + 1, into, 1);
    quant_amax(into, c->amax, 2, AMAX_IGNORE_NAN);
}

static uint8_t *codes_buffer(QuantContext *c, int which, size_t n) {
    return grown((void **)&c->codes[which], &c->codes_len[which], n, 1);
}

// The (scale, scale_inv) pair of operand op for x (n), in tensor memory. Delayed scaling:
// history[0] = max(history[0], amax(x)) and the pair the history gave at the last step's end.
// Current scaling (Float8CurrentScaling: amax_epsilon 0, no power-of-2 scales): from amax(x).
static const float *tensor_scale(QuantLinear *q, QuantOperand op, const float *x, size_t n) {
    QuantContext *c = q->ctx;
    const uint8_t *fused = fused_flag(q, op);
    if (fused && *fused) vec_copy(c->amax, slot_of(c->fused_amax, q, op, 1), 1);
    else quant_amax(c->amax, x, n, AMAX_IGNORE_NAN);
    if (c->cfg.recipe == QUANT_DELAYED) {
        float *history = slot_of(c->history, q, op, (size_t)c->cfg.history_len);
        fold_amax(c, history);
        return slot_of(c->scale, q, op, 2);
    }
    Fp8ScaleParams p = {.format = operand_format(c, op), .pow2_scales = 0, .amax_epsilon = 0};
    float *scale = c->amax + AMAX_SCALES + 2 * (int)op;
    fp8_scale_from_amax(scale, scale + 1, c->amax, &p);
    return scale;
}

// An operand as fp8_gemm takes it: its codes, format and scale_inv.
typedef struct {
    uint8_t *codes;
    Fp8Format format;
    const float *scale_inv;
} TensorCodes;

// x (n) quantized with one scale into codes buffer `which`.
static TensorCodes tensor_codes(QuantLinear *q, QuantOperand op, const float *x, size_t n, int which) {
    TensorCodes t = {.codes = codes_buffer(q->ctx, which, n), .format = operand_format(q->ctx, op)};
    const float *scale = tensor_scale(q, op, x, n);
    fp8_quantize_tensor(t.codes, x, scale, n, t.format);
    t.scale_inv = scale + 1;
    return t;
}

// x (rows, cols) quantized, its codes transposed into buffer `which`: (cols, rows).
static TensorCodes tensor_codes_transposed(QuantLinear *q, QuantOperand op, const float *x, int rows, int cols,
                                           int which) {
    TensorCodes t = tensor_codes(q, op, x, (size_t)rows * cols, CODES_T);
    uint8_t *transposed = codes_buffer(q->ctx, which, (size_t)rows * cols);
    fp8_transpose(transposed, t.codes, rows, cols);
    t.codes = transposed;
    return t;
}

static void tensor_fake_quant(QuantLinear *q, QuantOperand op, float *y, const float *x, size_t n) {
    TensorCodes t = tensor_codes(q, op, x, n, CODES_A);
    fp8_dequantize_tensor(y, t.codes, t.scale_inv, n, t.format);
}

// Float8BlockScaling: E4M3 (E5M2 gradients with hybrid), power-of-2 scales, tiles 1×128 or
// 128×128 (weights).
static void blockwise_fake_quant(QuantContext *c, QuantOperand op, float *y, const float *x, int rows, int cols) {
    Fp8BlockParams p = {.format = operand_format(c, op), .tile_rows = op == QUANT_WEIGHT ? FP8_BLOCK : 1,
                        .pow2_scales = 1, .amax_epsilon = 0};
    size_t tiles = (size_t)quant_blocks(rows, p.tile_rows) * quant_blocks(cols, FP8_BLOCK);
    uint8_t *codes = codes_buffer(c, CODES_A, (size_t)rows * cols);
    float *scale_inv = grown((void **)&c->block_scales, &c->block_scales_len, tiles * sizeof(float), 1);
    fp8_block_quantize(codes, scale_inv, x, rows, cols, &p);
    fp8_block_dequantize(y, codes, scale_inv, rows, cols, &p);
}

// MXFP8: 32-element blocks of a row, E8M0 scales by RCEIL (TE's and cuBLAS's rule).
static void mxfp8_fake_quant(QuantContext *c, QuantOperand op, float *y, const float *x, int rows, int cols) {
    Fp8Format f = operand_format(c, op);
    uint8_t *codes = codes_buffer(c, CODES_A, (size_t)rows * cols);
    uint8_t *scales = grown((void **)&c->block_scales, &c->block_scales_len,
                            (size_t)rows * quant_blocks(cols, MX_BLOCK), 1);
    mxfp8_quantize(codes, scales, x, rows, cols, f, MX_SCALE_RCEIL);
    mxfp8_dequantize(y, codes, scales, rows, cols, f);
}

// NVFP4: 16-element blocks (16×16 tiles for weights), a per-tensor scale from the amax,
// gradients rounded stochastically. An all-zero tensor (whose per-tensor scale would be 0)
// is zeros, as its quantization is in TE.
static void nvfp4_fake_quant(QuantContext *c, QuantOperand op, float *y, const float *x, int rows, int cols) {
    size_t n = (size_t)rows * cols;
    quant_amax(c->amax, x, n, AMAX_PROPAGATE_NAN);
    float amax;
    device_download(&amax, c->amax, sizeof(float));
    if (amax == 0.0f) {
        vec_zero(y, n);
        return;
    }
    Nvfp4Params p = {.tile_rows = op == QUANT_WEIGHT ? NVFP4_BLOCK : 1, .stochastic = op == QUANT_GRAD};
    if (p.stochastic) p.seed = rng_u64(&c->rng);
    uint8_t *codes = codes_buffer(c, CODES_A, n / 2 + 1);
    uint8_t *scales = grown((void **)&c->block_scales, &c->block_scales_len,
                            (size_t)rows * quant_blocks(cols, NVFP4_BLOCK), 1);
    nvfp4_quantize(codes, scales, x, c->amax, rows, cols, &p);
    nvfp4_dequantize(y, codes, scales, c->amax, rows, cols);
}

// y (rows, cols) = the dequantized x with its blocks along the rows' elements (y may be x).
static void fake_quant_rows(QuantLinear *q, QuantOperand op, float *y, const float *x, int rows, int cols) {
    QuantContext *c = q->ctx;
    size_t n = (size_t)rows * cols;
    switch (c->cfg.recipe) {
    case QUANT_DELAYED:
    case QUANT_TENSORWISE: tensor_fake_quant(q, op, y, x, n); break;
    case QUANT_BLOCKWISE: blockwise_fake_quant(c, op, y, x, rows, cols); break;
    case QUANT_MXFP8: mxfp8_fake_quant(c, op, y, x, rows, cols); break;
    case QUANT_NVFP4: nvfp4_fake_quant(c, op, y, x, rows, cols); break;
    default: mt_die("quantized linear: recipe %d is not a quantizing one", (int)c->cfg.recipe);
    }
}

static int pad_to(int v, int multiple) { return (v + multiple - 1) / multiple * multiple; }

// The columnwise copy t (cols, k) of x (rows, cols), blocks along the rows: transposed, and
// for NVFP4 (whose wgrad inputs take the random Hadamard transform along the tokens) padded
// with zero rows to whole groups of 16 and transformed with TE's wgrad signs. Returns k.
static int fake_quant_columns(QuantLinear *q, QuantOperand op, float *t, const float *x, int rows, int cols) {
    QuantContext *c = q->ctx;
    QuantRecipe r = c->cfg.recipe;
    if (per_tensor(r) || square_weight(r, op)) {  // the rowwise values, transposed
        float *rowwise = work(c, WORK_T, (size_t)rows * cols);
        fake_quant_rows(q, op, rowwise, x, rows, cols);
        batched_transpose(t, rowwise, 1, rows, cols);
        return rows;
    }
    if (r != QUANT_NVFP4) {
        batched_transpose(t, x, 1, rows, cols);
        fake_quant_rows(q, op, t, t, cols, rows);
        return rows;
    }
    int k = pad_to(rows, HADAMARD_DIM);
    float *transposed = work(c, WORK_T, (size_t)rows * cols), *padded = transposed;
    batched_transpose(transposed, x, 1, rows, cols);
    if (k != rows) {
        padded = work(c, WORK_PAD, (size_t)k * cols);
        vec_zero(padded, (size_t)k * cols);
        rows_copy_strided(padded, (size_t)k * sizeof(float), transposed, (size_t)rows * sizeof(float),
                          (size_t)rows * sizeof(float), cols);
    }
    hadamard16(t, padded, (size_t)k * cols, HADAMARD_TE_WGRAD_SIGNS);
    fake_quant_rows(q, op, t, t, cols, k);
    return k;
}

// The rows a columnwise copy of `rows` rows has.
static int columnwise_rows(const QuantContext *c, int rows) {
    return c->cfg.recipe == QUANT_NVFP4 ? pad_to(rows, HADAMARD_DIM) : rows;
}

int qlinear_dequantized(QuantLinear *q, QuantOperand op, int columnwise, float *y, const float *x, int rows,
                        int cols) {
    if (columnwise) return fake_quant_columns(q, op, y, x, rows, cols);
    fake_quant_rows(q, op, y, x, rows, cols);
    return rows;
}

// ---- the GEMMs -----------------------------------------------------------------------------------
// Per-tensor recipes multiply the codes (fp8_gemm: FP8 tensor cores where the backend has
// them, the dequantized values otherwise). The block recipes take the dequantized values as
// they are (fp32 inputs, whatever --bf16 / --fp16 set): a quantized GEMM multiplies the FP8 /
// FP4 values exactly and accumulates in fp32.

static float *fp8_gemm_work(QuantContext *c, int M, int N, int K) {
    return work(c, WORK_A, ((size_t)M + N) * K);
}

// y (N, out) = x·Wᵀ: x (N, in) and W (out, in) are both along in as they are.
static void tensor_forward(QuantLinear *q, real *y, const real *x, const real *W, int N, int in, int out) {
    TensorCodes a = tensor_codes(q, QUANT_INPUT, x, (size_t)N * in, CODES_A);
    TensorCodes b = tensor_codes(q, QUANT_WEIGHT, W, (size_t)out * in, CODES_B);
    fp8_gemm(y, a.codes, a.format, a.scale_inv, b.codes, b.format, b.scale_inv, N, out, in, 0,
             fp8_gemm_work(q->ctx, N, out, in));
}

// dx (N, in) += dy·W: dy (N, out) as it is, W's codes transposed to (in, out).
static void tensor_dgrad(QuantLinear *q, real *dx, const real *dy, const real *W, int N, int in, int out) {
    TensorCodes a = tensor_codes(q, QUANT_GRAD, dy, (size_t)N * out, CODES_A);
    TensorCodes b = tensor_codes_transposed(q, QUANT_WEIGHT, W, out, in, CODES_B);
    fp8_gemm(dx, a.codes, a.format, a.scale_inv, b.codes, b.format, b.scale_inv, N, in, out, 1,
             fp8_gemm_work(q->ctx, N, in, out));
}

// dW (out, in) += dyᵀ·x: both transposed to run along the tokens, (out, N) and (in, N).
static void tensor_wgrad(QuantLinear *q, real *dW, const real *dy, const real *x, int N, int in, int out) {
    TensorCodes a = tensor_codes_transposed(q, QUANT_GRAD, dy, N, out, CODES_A);
    TensorCodes b = tensor_codes_transposed(q, QUANT_INPUT, x, N, in, CODES_B);
    fp8_gemm(dW, a.codes, a.format, a.scale_inv, b.codes, b.format, b.scale_inv, out, in, N, 1,
             fp8_gemm_work(q->ctx, out, in, N));
}

static int fp32_gemms_begin(void) {
    int saved = device_gemm_inputs();
    if (saved != GEMM_INPUTS_FP32) device_set_gemm_inputs(GEMM_INPUTS_FP32);
    return saved;
}

static void fp32_gemms_end(int saved) {
    if (saved != GEMM_INPUTS_FP32) device_set_gemm_inputs(saved);
}

static void quantized_forward(QuantLinear *q, real *y, const real *x, const real *W, int N, int in, int out) {
    QuantContext *c = q->ctx;
    if (per_tensor(c->cfg.recipe)) {
        tensor_forward(q, y, x, W, N, in, out);
        return;
    }
    float *xq = work(c, WORK_A, (size_t)N * in), *wq = work(c, WORK_B, (size_t)out * in);
    fake_quant_rows(q, QUANT_INPUT, xq, x, N, in);
    fake_quant_rows(q, QUANT_WEIGHT, wq, W, out, in);
    int saved = fp32_gemms_begin();
    mt_gemm(0, 1, N, out, in, 1, xq, in, wq, in, 0, y, out);  // y = x·Wᵀ
    fp32_gemms_end(saved);
}

static void quantized_dgrad(QuantLinear *q, real *dx, const real *dy, const real *W, int N, int in, int out) {
    QuantContext *c = q->ctx;
    if (per_tensor(c->cfg.recipe)) {
        tensor_dgrad(q, dx, dy, W, N, in, out);
        return;
    }
    float *dyq = work(c, WORK_A, (size_t)N * out), *wt = work(c, WORK_B, (size_t)out * in);
    fake_quant_rows(q, QUANT_GRAD, dyq, dy, N, out);
    fake_quant_columns(q, QUANT_WEIGHT, wt, W, out, in);  // Wᵀ (in, out), blocks along out
    int saved = fp32_gemms_begin();
    mt_gemm(0, 1, N, in, out, 1, dyq, out, wt, out, 1, dx, in);  // dx += dy·W
    fp32_gemms_end(saved);
}

static void quantized_wgrad(QuantLinear *q, real *dW, const real *dy, const real *x, int N, int in, int out) {
    QuantContext *c = q->ctx;
    if (per_tensor(c->cfg.recipe)) {
        tensor_wgrad(q, dW, dy, x, N, in, out);
        return;
    }
    size_t k = (size_t)columnwise_rows(c, N);
    float *dyt = work(c, WORK_A, k * out), *xt = work(c, WORK_B, k * in);
    fake_quant_columns(q, QUANT_GRAD, dyt, dy, N, out);  // dyᵀ (out, k)
    fake_quant_columns(q, QUANT_INPUT, xt, x, N, in);    // xᵀ (in, k)
    int saved = fp32_gemms_begin();
    mt_gemm(0, 1, out, in, (int)k, 1, dyt, (int)k, xt, (int)k, 1, dW, in);  // dW += dyᵀ·x
    fp32_gemms_end(saved);
}
void qlinear_fused_amax_begin(QuantLinear *q, QuantOperand op, int parts, const real *const *x, const size_t *n) {
    if (!qlinear_fuses_amax(q)) return;
    QuantContext *c = q->ctx;
    float *fused = slot_of(c->fused_amax, q, op, 1);
    quant_amax(fused, x[0], n[0], AMAX_IGNORE_NAN);
    for (int i = 1; i < parts; i++) {
        quant_amax(c->amax, x[i], n[i], AMAX_IGNORE_NAN);
        fold_amax(c, fused);
    }
    *fused_flag(q, op) = 1;
}

void qlinear_fused_amax_end(QuantLinear *q, QuantOperand op) {
    uint8_t *fused = q ? fused_flag(q, op) : NULL;
    if (fused) *fused = 0;
}
#else
static void no_quantization(void) { mt_die("the double-precision build has no FP8 / FP4 GEMMs"); }
void qlinear_fused_amax_begin(QuantLinear *q, QuantOperand op, int parts, const real *const *x, const size_t *n) {
    (void)op, (void)parts, (void)x, (void)n;
    if (q) no_quantization();
}
void qlinear_fused_amax_end(QuantLinear *q, QuantOperand op) { (void)q, (void)op; }
int qlinear_dequantized(QuantLinear *q, QuantOperand op, int columnwise, float *y, const float *x, int rows,
                        int cols) {
    (void)q, (void)op, (void)columnwise, (void)y, (void)x, (void)cols;
    no_quantization();
    return rows;
}
#define quantized_forward(...) no_quantization()
#define quantized_dgrad(...) no_quantization()
#define quantized_wgrad(...) no_quantization()
#endif

void qlinear_forward(QuantLinear *q, real *y, const real *x, const real *W, int N, int in, int out) {
    if (!q) linear_forward(y, x, W, N, in, out);
    else quantized_forward(q, y, x, W, N, in, out);
}

void qlinear_backward_data(QuantLinear *q, real *dx, const real *dy, const real *W, int N, int in, int out) {
    if (!dx) return;
    if (!q) linear_backward(dx, NULL, dy, NULL, W, N, in, out);
    else quantized_dgrad(q, dx, dy, W, N, in, out);
}

void qlinear_backward_weight(QuantLinear *q, real *dW, const real *dy, const real *x, int N, int in, int out) {
    if (!q) mt_gemm(1, 0, out, in, N, 1, dy, out, x, in, 1, dW, in);  // linear_backward's dW
    else quantized_wgrad(q, dW, dy, x, N, in, out);
}

void qlinear_backward(QuantLinear *q, real *dx, real *dW, const real *dy, const real *x, const real *W, int N,
                      int in, int out) {
    if (!q) {
        linear_backward(dx, dW, dy, x, W, N, in, out);
        return;
    }
    qlinear_backward_data(q, dx, dy, W, N, in, out);
    qlinear_backward_weight(q, dW, dy, x, N, in, out);
}

// A bf16-stored input reaches only the high-precision GEMMs (layout.h norm_store).
static void require_unquantized(const QuantLinear *q) {
    if (q) mt_die("internal error: a quantized linear layer given a bf16-stored input");
}

void qlinear_forward_stored(QuantLinear *q, real *y, const void *x, Storage x_store, const real *W, int N, int in,
                            int out) {
    if (x_store == STORE_FP32) {
        qlinear_forward(q, y, x, W, N, in, out);
        return;
    }
    require_unquantized(q);
    mt_gemm_stored(0, 1, N, out, in, 1, x, x_store, in, W, STORE_FP32, in, 0, y, STORE_FP32, out);  // linear_forward
}

void qlinear_backward_stored(QuantLinear *q, real *dx, real *dW, const real *dy, const void *x, Storage x_store,
                             const real *W, int N, int in, int out) {
    if (x_store == STORE_FP32) {
        qlinear_backward(q, dx, dW, dy, x, W, N, in, out);
        return;
    }
    require_unquantized(q);
    qlinear_backward_data(q, dx, dy, W, N, in, out);
    if (dW) mt_gemm_stored(1, 0, out, in, N, 1, dy, STORE_FP32, out, x, x_store, in, 1, dW, STORE_FP32, in);
}

// ---- delayed scaling's update and the state a checkpoint keeps ----------------------------------

void quant_context_end_step(QuantContext *c) {
    if (c->cfg.recipe != QUANT_DELAYED || !c->linears) return;
    size_t L = (size_t)c->cfg.history_len, rows = (size_t)c->linears * QUANT_OPERANDS, pitch = L * sizeof(float);
    for (size_t s = 0; s < rows; s++) {
        Fp8DelayedParams p = {.format = operand_format(c, (QuantOperand)(s % QUANT_OPERANDS)),
                              .history_len = (int)L, .algo = c->cfg.algo, .margin = c->cfg.margin};
        float *scale = c->scale + 2 * s;
        fp8_delayed_scale(scale, scale + 1, c->history + s * L, scale, &p);
    }
    // roll by one toward the front (TE's torch.roll(history, -1)), then history[0] = 0
    float *zeros = c->roll + operand_slots(c) * L;
    if (L > 1) {
        rows_copy_strided(c->roll, pitch, c->history + 1, pitch, pitch - sizeof(float), (int)rows);
        rows_copy_strided(c->roll + L - 1, pitch, c->history, pitch, sizeof(float), (int)rows);
        rows_copy_strided(c->history, pitch, c->roll, pitch, pitch, (int)rows);
    }
    rows_copy_strided(c->history, pitch, zeros, sizeof(float), sizeof(float), (int)rows);
}

// The history rows of linears [first, first + count): their first float each, pitch apart.
static float *step_amax_rows(const QuantContext *c, int first, int count, size_t *pitch, int *rows) {
    MT_ASSERT(c->cfg.recipe == QUANT_DELAYED && first >= 0 && count >= 0 && first + count <= c->linears);
    *pitch = (size_t)c->cfg.history_len * sizeof(float);
    *rows = count * QUANT_OPERANDS;
    return c->history + (size_t)first * QUANT_OPERANDS * c->cfg.history_len;
}

void quant_context_step_amaxes(const QuantContext *c, int first, int count, float *amax) {
    size_t pitch;
    int rows;
    const float *history = step_amax_rows(c, first, count, &pitch, &rows);
    if (rows) rows_copy_strided(amax, sizeof(float), history, pitch, sizeof(float), rows);
}

void quant_context_set_step_amaxes(QuantContext *c, int first, int count, const float *amax) {
    size_t pitch;
    int rows;
    float *history = step_amax_rows(c, first, count, &pitch, &rows);
    if (rows) rows_copy_strided(history, pitch, amax, sizeof(float), sizeof(float), rows);
}

static size_t delayed_floats(const QuantContext *c) {
    return c->cfg.recipe == QUANT_DELAYED ? operand_slots(c) * ((size_t)c->cfg.history_len + 2) : 0;
}

size_t quant_context_state_floats(const QuantContext *c) { return delayed_floats(c) + 4 * RNG_FLOAT_WORDS; }

void quant_context_state_save(const QuantContext *c, float *host) {
    size_t histories = operand_slots(c) * (size_t)c->cfg.history_len;
    if (delayed_floats(c)) {
        device_download(host, c->history, histories * sizeof(float));
        device_download(host + histories, c->scale, operand_slots(c) * 2 * sizeof(float));
    }
    float *rng = host + delayed_floats(c);
    for (int w = 0; w < 4; w++)
        for (int i = 0; i < RNG_FLOAT_WORDS; i++)
            rng[w * RNG_FLOAT_WORDS + i] = (float)((c->rng.s[w] >> (RNG_WORD_BITS * i)) & 0xFFFF);
}

void quant_context_state_load(QuantContext *c, const float *host) {
    size_t histories = operand_slots(c) * (size_t)c->cfg.history_len;
    if (delayed_floats(c)) {
        device_upload(c->history, host, histories * sizeof(float));
        device_upload(c->scale, host + histories, operand_slots(c) * 2 * sizeof(float));
    }
    const float *rng = host + delayed_floats(c);
    for (int w = 0; w < 4; w++) {
        c->rng.s[w] = 0;
        for (int i = 0; i < RNG_FLOAT_WORDS; i++)
            c->rng.s[w] |= (uint64_t)rng[w * RNG_FLOAT_WORDS + i] << (RNG_WORD_BITS * i);
    }
}

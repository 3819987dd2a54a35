// quantized_linear.h — FP8 / FP4 training recipes (Megatron-LM's --fp8-format / --fp8-recipe
// / --fp4-format, Transformer Engine's recipes): every operand of a quantized GEMM is
// quantized with the quantizer ops (ops_quantize.h). Per-tensor FP8 (delayed, tensorwise)
// then multiplies the codes with fp8_gemm (cuBLASLt's FP8 GEMM on the cuda backend where the
// GPU has one, the dequantized values elsewhere); the block recipes dequantize to fp32 and
// run the GEMM on those values with fp32 inputs. The module owns the recipe and the
// per-linear quantizer state (delayed scaling's amax histories and scales); the model calls
// qlinear_* instead of linear_forward / linear_backward, and the experts' GEMMs go through it
// per group.
// A NULL QuantLinear is the plain linear layer, bit for bit.
//
// Which operand is quantized how (docs/precision.md, "FP8 and FP4 training"), for y = x·Wᵀ:
//   fprop  y  = x·Wᵀ    x rowwise (blocks along in),  W rowwise (along in)
//   dgrad  dx = dy·W    dy rowwise (along out),       W columnwise (along out)
//   wgrad  dW = dyᵀ·x   dy columnwise (along tokens), x columnwise (along tokens)
// Formats: E4M3 for x and W; gradients E4M3 (--fp8-format e4m3) or E5M2 (hybrid); NVFP4 E2M1.
// This file is compiled into the library on both backends (every operation an op), but
// only with fp32 `real` (the double-precision test build has no quantized path).
#pragma once
#include "core/common.h"
#include "core/rng.h"
#include "ops/ops_quantize.h"

typedef enum {
    QUANT_OFF,
    QUANT_DELAYED,     // --fp8-recipe delayed: DelayedScaling, one scale per tensor from the amax history
    QUANT_TENSORWISE,  // --fp8-recipe tensorwise: Float8CurrentScaling, one scale per tensor from its amax
    QUANT_BLOCKWISE,   // --fp8-recipe blockwise: Float8BlockScaling, 1×128 (x, dy) and 128×128 (W) tiles
    QUANT_MXFP8,       // --fp8-recipe mxfp8: MXFP8BlockScaling, 32-element blocks along K, E8M0 scales
    QUANT_NVFP4,       // --fp4-format e2m1 --fp4-recipe nvfp4: NVFP4BlockScaling
    QUANT_RECIPES
} QuantRecipe;

// The GEMM alignment TE requires of every dimension a recipe blocks along the reduction
// dimension: 16 (FP8, NVFP4), 32 (MXFP8); 0 when off.
int quant_recipe_alignment(QuantRecipe r);
// The multiple --moe-router-padding-for-quantization rounds each expert's rows up to, as
// Megatron-Core's get_align_size_for_quantization: 32 (MXFP8), 128 (NVFP4: its grouped
// quantize and Hadamard kernels' tile), 16 (the other FP8 recipes); 0 when off.
int quant_router_padding_multiple(QuantRecipe r);

typedef struct {
    QuantRecipe recipe;
    int hybrid;                 // gradients in E5M2 (--fp8-format hybrid)
    int history_len;            // delayed: --fp8-amax-history-len
    AmaxHistoryAlgo algo;       // delayed: --fp8-amax-compute-algo
    int margin;                 // delayed: --fp8-margin
    uint64_t seed;              // stochastic rounding's stream (NVFP4 gradients)
} QuantRecipeConfig;

// The operands of a linear layer's three GEMMs.
typedef enum { QUANT_INPUT, QUANT_WEIGHT, QUANT_GRAD, QUANT_OPERANDS } QuantOperand;

struct QuantContext;
enum { QUANT_CODE_BUFFERS = 3 };

// One weight matrix's quantizers (a linear layer, or one expert's projection).
typedef struct QuantLinear {
    struct QuantContext *ctx;
    int slot;  // its operands' state: ctx->history / ctx->scale rows slot·QUANT_OPERANDS + operand
} QuantLinear;

typedef struct QuantContext {
    QuantRecipeConfig cfg;
    int linears;           // QuantLinears made (quant_context_linear)
    int capacity;          // of the arrays below
    QuantLinear *linear;   // (capacity) host memory
    // delayed scaling (tensor memory): per operand slot, history_len amaxes (history[0] this
    // step's) and (scale, scale_inv); 1 and 0 at first, as Transformer Engine's
    float *history, *scale, *roll;
    // scratch (tensor memory), grown to the largest operand and then kept
    float *work[4];
    size_t work_len[4];
    uint8_t *codes[QUANT_CODE_BUFFERS];  // a GEMM's two operands, and a copy to transpose
    size_t codes_len[QUANT_CODE_BUFFERS];
    uint8_t *block_scales;
    size_t block_scales_len;
    float *amax;               // an amax, a fold, and current scaling's (scale, scale_inv) per operand
    // tensorwise: per operand slot, the amax over a fused GEMM's parts (tensor memory) and
    // whether it stands (host memory; qlinear_fused_amax_begin / _end)
    float *fused_amax;
    uint8_t *fused_set;
    int32_t *host_offsets;     // (groups + 1) host memory, the experts' row ranges
    int host_offsets_len;
    Rng rng;                   // draws each stochastic quantization's seed
} QuantContext;

// A context for `linears` weight matrices (the bound of quant_context_linear).
QuantContext *quant_context_new(const QuantRecipeConfig *cfg, int linears);
void quant_context_free(QuantContext *ctx);
// The next weight matrix's quantizers (its delayed-scaling state zeroed, scales 1).
QuantLinear *quant_context_linear(QuantContext *ctx);
// Restarts the stochastic rounding's draws at a stream of a micro-batch's seed (the batch's
// noise_seed, a piece of its backward): the rounding of a micro-batch's gradients then
// depends on that micro-batch and piece only, not on what this rank ran before, so data-
// and pipeline-parallel layouts round as one process does.
void quant_context_seed_rounding(QuantContext *ctx, uint64_t micro_batch_seed, uint64_t stream);

// y (N,out) = Q(x)·Q(W)ᵀ, overwritten; q NULL: linear_forward.
void qlinear_forward(QuantLinear *q, real *y, const real *x, const real *W, int N, int in, int out);
// dx (N,in) += Q(dy)·Q(W) (skipped when dx NULL); q NULL: linear_backward's dx.
void qlinear_backward_data(QuantLinear *q, real *dx, const real *dy, const real *W, int N, int in, int out);
// dW (out,in) += Q(dy)ᵀ·Q(x) along the tokens; q NULL: linear_backward's dW.
void qlinear_backward_weight(QuantLinear *q, real *dW, const real *dy, const real *x, int N, int in, int out);
// Both, as linear_backward (dx NULL: no input gradient); q NULL: linear_backward.
void qlinear_backward(QuantLinear *q, real *dx, real *dW, const real *dy, const real *x, const real *W, int N,
                      int in, int out);
// qlinear_forward and qlinear_backward with x stored as x_store (ops/gemm.h Storage: a norm's
// output kept bf16, LayerActs). A bf16 x needs q NULL (a recipe quantizes from fp32 values).
void qlinear_forward_stored(QuantLinear *q, real *y, const void *x, Storage x_store, const real *W, int N, int in,
                            int out);
void qlinear_backward_stored(QuantLinear *q, real *dx, real *dW, const real *dy, const void *x, Storage x_store,
                             const real *W, int N, int in, int out);

// Current scaling (tensorwise) of a GEMM Megatron-Core runs whole and moetron in parts sharing
// q (q, k and v; gate and up): operand op of q takes its scale from the amax over all `parts`
// tensors (x[i] of n[i] elements, NaN skipped) — the whole tensor's, as Transformer Engine's —
// until qlinear_fused_amax_end. Nothing for q NULL or another recipe: delayed scaling's history
// already takes the maximum over the parts, the block recipes have no tensor scale, and NVFP4's
// tensor scale stays each part's (not yet fused: its weight gradient's operands take their
// amax after the Hadamard transform, so each part would be transformed first).
void qlinear_fused_amax_begin(QuantLinear *q, QuantOperand op, int parts, const real *const *x, const size_t *n);
void qlinear_fused_amax_end(QuantLinear *q, QuantOperand op);
// Whether q's recipe takes a fused amax (qlinear_fused_amax_begin does anything).
int qlinear_fuses_amax(const QuantLinear *q);

// The dequantized value of operand `op` of q as a GEMM over its columns reads it (rowwise)
// or over its rows (columnwise, returned transposed: t (cols, rows_padded)); what the GEMMs
// above multiply, for the tests. x (rows, cols); y (rows, cols) or t (cols, pad16(rows) for
// NVFP4, else rows); returns the rows of t (columnwise) or `rows`.
int qlinear_dequantized(QuantLinear *q, QuantOperand op, int columnwise, float *y, const float *x, int rows,
                        int cols);

// Delayed scaling after a step (Transformer Engine's amax_and_scale_update): each operand's
// new scale from its history (this step's amax in history[0]), then the history rolled and
// history[0] zeroed. Nothing for the other recipes.
void quant_context_end_step(QuantContext *ctx);
// Delayed scaling's amaxes of this step (history[0]) of the linears [first, first + count):
// copied out into amax (count·QUANT_OPERANDS floats, tensor memory, in slot-then-operand
// order) and back in, for the model to reduce them over the ranks that must agree.
void quant_context_step_amaxes(const QuantContext *ctx, int first, int count, float *amax);
void quant_context_set_step_amaxes(QuantContext *ctx, int first, int count, const float *amax);

// What a checkpoint keeps of the context, as floats: the histories, the scales and the
// stochastic rounding's Rng (each 64-bit word as four 16-bit floats, exact). The size is
// fixed by the recipe and the number of linears.
size_t quant_context_state_floats(const QuantContext *ctx);
void quant_context_state_save(const QuantContext *ctx, float *host);
void quant_context_state_load(QuantContext *ctx, const float *host);

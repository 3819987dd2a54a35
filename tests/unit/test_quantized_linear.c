// test_quantized_linear.c — the FP8 / FP4 recipes' linear layers (ops/quantized_linear.h):
// no recipe is linear_forward / linear_backward bit for bit; each recipe's forward, input
// gradient and weight gradient equal fp32 GEMMs of its dequantized operands bit for bit;
// those operands are the quantizer ops' own (an independent quantization with the ops of
// ops_quantize.h); delayed scaling's scale follows its amax history after a step; the
// state a checkpoint keeps restores the same results; a tensorwise fused amax makes each part
// of a tensor quantize as the whole.
#include <string.h>

#include "core/float_formats.h"
#include "ops/ops_parallel.h"
#include "ops/quantized_linear.h"
#include "testlib.h"

enum { N = 40, IN = 160, OUT = 64 };  // N not a multiple of 16 (NVFP4 pads), IN not of 128

static void fill(float *x, size_t n, unsigned seed, float scale) {
    unsigned s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = scale * (((s >> 8) & 0xFFFF) / 32768.0f - 1.0f) * (1 + (float)(i % 7));
    }
}

static int same(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

typedef struct {
    float x[N * IN], W[OUT * IN], dy[N * OUT];
} Operands;

static Operands *operands(void) {
    Operands *o = malloc(sizeof(Operands));
    fill(o->x, N * IN, 1, 0.5f);
    fill(o->W, OUT * IN, 2, 0.05f);
    fill(o->dy, N * OUT, 3, 1e-3f);
    return o;
}

static QuantContext *context(QuantRecipe r, int hybrid) {
    QuantRecipeConfig cfg = {.recipe = r, .hybrid = hybrid, .history_len = 4, .algo = AMAX_HISTORY_MAX, .seed = 7};
    return quant_context_new(&cfg, 2);
}

static void test_no_recipe_is_plain(void) {
    Operands *o = operands();
    static float y0[N * OUT], y1[N * OUT], dx0[N * IN], dx1[N * IN], dW0[OUT * IN], dW1[OUT * IN];
    linear_forward(y0, o->x, o->W, N, IN, OUT);
    qlinear_forward(NULL, y1, o->x, o->W, N, IN, OUT);
    CHECK(same(y0, y1, N * OUT), "forward differs");
    memset(dx0, 0, sizeof dx0), memset(dx1, 0, sizeof dx1), memset(dW0, 0, sizeof dW0), memset(dW1, 0, sizeof dW1);
    linear_backward(dx0, dW0, o->dy, o->x, o->W, N, IN, OUT);
    qlinear_backward(NULL, dx1, dW1, o->dy, o->x, o->W, N, IN, OUT);
    CHECK(same(dx0, dx1, N * IN) && same(dW0, dW1, OUT * IN), "backward differs");
    memset(dW1, 0, sizeof dW1);
    qlinear_backward_weight(NULL, dW1, o->dy, o->x, N, IN, OUT);
    CHECK(same(dW0, dW1, OUT * IN), "the weight gradient alone differs");
    free(o);
}

// Each GEMM of a recipe against fp32 GEMMs of the operands qlinear_dequantized gives (the
// stochastic rounding's draws replayed from the saved state).
static void check_recipe_gemms(QuantRecipe r, int hybrid) {
    Operands *o = operands();
    QuantContext *c = context(r, hybrid);
    QuantLinear *q = quant_context_linear(c);
    size_t state_n = quant_context_state_floats(c);
    float *state = malloc(state_n * sizeof(float));
    int K = r == QUANT_NVFP4 ? (N + 15) / 16 * 16 : N;
    size_t most = (size_t)(K > OUT ? K : OUT) * IN;  // the largest operand: x, W or their transposes
    float *a = calloc(most, sizeof(float)), *b = calloc(most, sizeof(float));
    static float y[N * OUT], ref[N * IN], got[N * IN], dW[OUT * IN], dW_ref[OUT * IN];

    qlinear_forward(q, y, o->x, o->W, N, IN, OUT);
    qlinear_dequantized(q, QUANT_INPUT, 0, a, o->x, N, IN);
    qlinear_dequantized(q, QUANT_WEIGHT, 0, b, o->W, OUT, IN);
    mt_gemm(0, 1, N, OUT, IN, 1, a, IN, b, IN, 0, ref, OUT);
    CHECK(same(y, ref, N * OUT), "recipe %d: forward is not the GEMM of its dequantized operands", r);

    quant_context_state_save(c, state);
    memset(got, 0, sizeof got), memset(ref, 0, sizeof ref);
    qlinear_backward_data(q, got, o->dy, o->W, N, IN, OUT);
    quant_context_state_load(c, state);
    qlinear_dequantized(q, QUANT_GRAD, 0, a, o->dy, N, OUT);
    qlinear_dequantized(q, QUANT_WEIGHT, 1, b, o->W, OUT, IN);  // Wᵀ (IN, OUT)
    mt_gemm(0, 1, N, IN, OUT, 1, a, OUT, b, OUT, 1, ref, IN);
    CHECK(same(got, ref, N * IN), "recipe %d: dgrad is not the GEMM of its dequantized operands", r);

    quant_context_state_save(c, state);
    memset(dW, 0, sizeof dW), memset(dW_ref, 0, sizeof dW_ref);
    qlinear_backward_weight(q, dW, o->dy, o->x, N, IN, OUT);
    quant_context_state_load(c, state);
    int k = qlinear_dequantized(q, QUANT_GRAD, 1, a, o->dy, N, OUT);
    CHECK(k == K, "recipe %d: columnwise rows %d, expected %d", r, k, K);
    qlinear_dequantized(q, QUANT_INPUT, 1, b, o->x, N, IN);
    mt_gemm(0, 1, OUT, IN, k, 1, a, k, b, k, 1, dW_ref, IN);
    CHECK(same(dW, dW_ref, OUT * IN), "recipe %d: wgrad is not the GEMM of its dequantized operands", r);

    // and near the fp32 weight gradient (the Hadamard transform cancels in dyᵀ·x)
    static float plain[OUT * IN];
    memset(plain, 0, sizeof plain);
    linear_backward(NULL, plain, o->dy, o->x, o->W, N, IN, OUT);
    double err = 0, norm = 0;
    for (int i = 0; i < OUT * IN; i++) err += (dW[i] - plain[i]) * (dW[i] - plain[i]), norm += plain[i] * plain[i];
    double tolerance = r == QUANT_NVFP4 ? 0.3 : 0.12;  // relative: E2M1 has one mantissa bit, E5M2 two
    if (r != QUANT_DELAYED)  // delayed scaling starts at scale 1: small gradients fall into subnormals
        CHECK(sqrt(err / norm) < tolerance, "recipe %d: wgrad's relative error %g", r, sqrt(err / norm));
    free(a), free(b), free(state), free(o);
    quant_context_free(c);
}

static void test_recipes_are_gemms_of_dequantized_operands(void) {
    for (int r = QUANT_DELAYED; r < QUANT_RECIPES; r++)
        for (int hybrid = 0; hybrid <= (r != QUANT_NVFP4); hybrid++) check_recipe_gemms((QuantRecipe)r, hybrid);
}

// The forward's operands against the quantizer ops called directly, recipe by recipe.
static void test_operands_are_the_quantizer_ops(void) {
    Operands *o = operands();
    static float want[OUT * IN], got[OUT * IN], t[OUT * IN], scale[2], amax[1];
    static uint8_t codes[OUT * IN], scales[OUT * IN];
    for (int r = QUANT_TENSORWISE; r < QUANT_RECIPES; r++) {
        QuantContext *c = context((QuantRecipe)r, 0);
        QuantLinear *q = quant_context_linear(c);
        qlinear_dequantized(q, QUANT_WEIGHT, 0, got, o->W, OUT, IN);
        if (r == QUANT_TENSORWISE) {
            Fp8ScaleParams p = {FP8_E4M3, 0, 0};
            quant_amax(amax, o->W, OUT * IN, AMAX_IGNORE_NAN);
            fp8_scale_from_amax(scale, scale + 1, amax, &p);
            fp8_quantize_tensor(codes, o->W, scale, OUT * IN, FP8_E4M3);
            fp8_dequantize_tensor(want, codes, scale + 1, OUT * IN, FP8_E4M3);
        } else if (r == QUANT_BLOCKWISE) {
            Fp8BlockParams p = {FP8_E4M3, FP8_BLOCK, 1, 0};
            fp8_block_quantize(codes, t, o->W, OUT, IN, &p);
            fp8_block_dequantize(want, codes, t, OUT, IN, &p);
        } else if (r == QUANT_MXFP8) {
            mxfp8_quantize(codes, scales, o->W, OUT, IN, FP8_E4M3, MX_SCALE_RCEIL);
            mxfp8_dequantize(want, codes, scales, OUT, IN, FP8_E4M3);
        } else {
            Nvfp4Params p = {.tile_rows = NVFP4_BLOCK};
            quant_amax(amax, o->W, OUT * IN, AMAX_PROPAGATE_NAN);
            nvfp4_quantize(codes, scales, o->W, amax, OUT, IN, &p);
            nvfp4_dequantize(want, codes, scales, amax, OUT, IN);
        }
        CHECK(same(got, want, OUT * IN), "recipe %d: the weight's values are not the quantizer op's", r);
        // columnwise: 1×128 / 32 / 16 blocks down the columns, i.e. the rows of the transpose
        if (r == QUANT_BLOCKWISE || r == QUANT_MXFP8) {
            qlinear_dequantized(q, QUANT_INPUT, 1, got, o->x, N, IN);
            batched_transpose(t, o->x, 1, N, IN);
            if (r == QUANT_MXFP8) {
                mxfp8_quantize(codes, scales, t, IN, N, FP8_E4M3, MX_SCALE_RCEIL);
                mxfp8_dequantize(want, codes, scales, IN, N, FP8_E4M3);
            } else {
                Fp8BlockParams p = {FP8_E4M3, 1, 1, 0};
                static float inv[IN * 2];
                fp8_block_quantize(codes, inv, t, IN, N, &p);
                fp8_block_dequantize(want, codes, inv, IN, N, &p);
            }
            CHECK(same(got, want, N * IN), "recipe %d: the columnwise input is not the transpose's", r);
        }
        quant_context_free(c);
    }
    free(o);
}

// Tensorwise with a fused amax (q/k/v, gate/up): each part of a whole tensor quantizes as the
// whole does (its scale from the amax of all the parts), bit for bit, until the fused amax
// ends; then a part takes its own amax again. The parts: W's first 24 rows and the other 40,
// the second part's amax the larger (the first's own scale then differs from the whole's).
static void test_tensorwise_fused_amax(void) {
    enum { FIRST = 24, REST = OUT - FIRST };
    Operands *o = operands();
    static float whole[OUT * IN], got[OUT * IN], own[OUT * IN], scale[2], amax[1];
    static uint8_t codes[OUT * IN];
    for (size_t i = FIRST * IN; i < OUT * IN; i++) o->W[i] *= 4;  // the larger amax in the second part
    Fp8ScaleParams p = {FP8_E4M3, 0, 0};
    quant_amax(amax, o->W, OUT * IN, AMAX_IGNORE_NAN);
    fp8_scale_from_amax(scale, scale + 1, amax, &p);
    fp8_quantize_tensor(codes, o->W, scale, OUT * IN, FP8_E4M3);
    fp8_dequantize_tensor(whole, codes, scale + 1, OUT * IN, FP8_E4M3);
    QuantContext *c = context(QUANT_TENSORWISE, 0);
    QuantLinear *q = quant_context_linear(c);
    qlinear_fused_amax_begin(q, QUANT_WEIGHT, 2, (const real *[]){o->W, o->W + FIRST * IN},
                             (size_t[]){FIRST * IN, REST * IN});
    qlinear_dequantized(q, QUANT_WEIGHT, 0, got, o->W, FIRST, IN);
    CHECK(same(got, whole, FIRST * IN), "the first part is not the whole tensor's first rows");
    qlinear_dequantized(q, QUANT_WEIGHT, 0, got, o->W + FIRST * IN, REST, IN);
    CHECK(same(got, whole + FIRST * IN, REST * IN), "the second part is not the whole tensor's last rows");
    qlinear_fused_amax_end(q, QUANT_WEIGHT);
    qlinear_dequantized(q, QUANT_WEIGHT, 0, own, o->W, FIRST, IN);
    CHECK(!same(own, whole, FIRST * IN), "after the end the first part still takes the whole's scale");
    // the gradient's columnwise copy (the weight gradient's operand): dy's first HALF rows and
    // the rest, the rest's amax the larger, fused: the transpose of the whole's first rows
    enum { HALF = N / 2 };
    static float dy_whole[N * OUT], t[N * OUT], want[N * OUT];
    for (size_t i = HALF * OUT; i < N * OUT; i++) o->dy[i] *= 4;
    quant_amax(amax, o->dy, N * OUT, AMAX_IGNORE_NAN);
    fp8_scale_from_amax(scale, scale + 1, amax, &p);
    fp8_quantize_tensor(codes, o->dy, scale, N * OUT, FP8_E4M3);
    fp8_dequantize_tensor(dy_whole, codes, scale + 1, N * OUT, FP8_E4M3);
    batched_transpose(want, dy_whole, 1, HALF, OUT);
    qlinear_fused_amax_begin(q, QUANT_GRAD, 2, (const real *[]){o->dy, o->dy + HALF * OUT},
                             (size_t[]){HALF * OUT, (N - HALF) * OUT});
    qlinear_dequantized(q, QUANT_GRAD, 1, t, o->dy, HALF, OUT);
    CHECK(same(t, want, HALF * OUT), "the gradient's columnwise part is not the whole's transposed rows");
    qlinear_fused_amax_end(q, QUANT_GRAD);
    qlinear_dequantized(q, QUANT_GRAD, 1, t, o->dy, HALF, OUT);
    CHECK(!same(t, want, HALF * OUT), "after the end the gradient's part still takes the whole's scale");
    quant_context_free(c);
    free(o);
}

// Delayed scaling: scale 1 in the first step; after it, (448 / amax of the step); the
// history rolled (TE's roll by -1, history[0] zeroed), and the max over the window.
static void test_delayed_scaling_update(void) {
    Operands *o = operands();
    QuantContext *c = context(QUANT_DELAYED, 1);
    QuantLinear *q = quant_context_linear(c);
    static float y[N * IN], plain[N * IN];
    float amax;
    size_t n = quant_context_state_floats(c);
    float *state = malloc(n * sizeof(float));
    qlinear_dequantized(q, QUANT_INPUT, 0, y, o->x, N, IN);
    // scale 1: E4M3 of x itself
    static uint8_t codes[N * IN];
    float one[1] = {1};
    fp8_quantize_tensor(codes, o->x, one, N * IN, FP8_E4M3);
    fp8_dequantize_tensor(plain, codes, one, N * IN, FP8_E4M3);
    CHECK(same(y, plain, N * IN), "the first step's scale is not 1");
    quant_amax(&amax, o->x, N * IN, AMAX_IGNORE_NAN);
    quant_context_end_step(c);
    quant_context_state_save(c, state);
    int L = 4;
    size_t scales = (size_t)c->capacity * QUANT_OPERANDS * L;
    CHECK(state[QUANT_INPUT * L + 0] == 0 && state[QUANT_INPUT * L + L - 1] == amax, "history not rolled");
    CHECK(state[scales + 2 * QUANT_INPUT] == E4M3_MAX / amax, "input scale %g, expected %g",
          state[scales + 2 * QUANT_INPUT], E4M3_MAX / amax);
    CHECK(state[scales + 2 * QUANT_GRAD] == 1, "an unused operand's scale changed");
    // a smaller tensor next step: max over the window keeps the old amax's scale
    static float half[N * IN];
    for (int i = 0; i < N * IN; i++) half[i] = o->x[i] / 4;
    qlinear_dequantized(q, QUANT_INPUT, 0, y, half, N, IN);
    quant_context_end_step(c);
    quant_context_state_save(c, state);
    CHECK(state[scales + 2 * QUANT_INPUT] == E4M3_MAX / amax, "max over the window lost");
    // the saved state gives the same values again
    QuantContext *d = context(QUANT_DELAYED, 1);
    QuantLinear *q2 = quant_context_linear(d);
    quant_context_state_load(d, state);
    static float y2[N * IN];
    qlinear_dequantized(q, QUANT_INPUT, 0, y, o->x, N, IN);
    qlinear_dequantized(q2, QUANT_INPUT, 0, y2, o->x, N, IN);
    CHECK(same(y, y2, N * IN), "a restored state quantizes differently");
    free(state), free(o);
    quant_context_free(c);
    quant_context_free(d);
}

int main(void) {
    RUN(test_no_recipe_is_plain);
    RUN(test_recipes_are_gemms_of_dequantized_operands);
    RUN(test_operands_are_the_quantizer_ops);
    RUN(test_delayed_scaling_update);
    RUN(test_tensorwise_fused_amax);
    TESTS_DONE();
}

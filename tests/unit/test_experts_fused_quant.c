// test_experts_fused_quant.c — tensorwise FP8 of the experts' gate and up projections as the
// one GEMM Megatron-Core runs for them (linear_fc1 over [W_gate; W_up]): experts_forward_acts
// gives the gate and up of one quantized forward over the stacked weights, and
// experts_backward_weights the weight gradients of one quantized weight gradient over the
// side-by-side output gradients, bit for bit: both parts scaled from the whole tensors'
// amaxes. W_up and the up gradient are the larger, so a gate scaled from its own amax would
// differ by whole FP8 steps.
#include <string.h>

#include "moe/experts.h"
#include "ops/quantized_linear.h"
#include "testlib.h"

enum { R = 24, H = 32, I = 16 };  // rows, hidden, FFN width: multiples of 16 (the FP8 alignment)

static void fill(float *x, size_t n, unsigned seed, float scale) {
    unsigned s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = scale * (((s >> 8) & 0xFFFF) / 32768.0f - 1.0f);
    }
}

static QuantContext *tensorwise(int linears) {
    QuantRecipeConfig cfg = {.recipe = QUANT_TENSORWISE, .history_len = 1, .seed = 1};
    return quant_context_new(&cfg, linears);
}

static void test_gate_up_as_one_gemm(void) {
    static float x[R * H], w_cat[2 * I * H], w_down[H * I], acts_buf[3][R * I], y_cat[R * 2 * I];
    static float dy_cat[R * 2 * I], dgate[R * I], dup[R * I], d_out[R * H];
    static float dw_gate[I * H], dw_up[I * H], dw_down[H * I], dw_cat[2 * I * H];
    fill(x, R * H, 1, 1.0f);
    fill(w_cat, I * H, 2, 0.1f);
    fill(w_cat + I * H, I * H, 3, 0.4f);  // W_up: the larger amax
    fill(w_down, H * I, 4, 0.1f);
    fill(dgate, R * I, 5, 1e-3f);
    fill(dup, R * I, 6, 4e-3f);  // the up gradient: the larger amax
    fill(d_out, R * H, 7, 1e-3f);
    for (int r = 0; r < R; r++) {
        memcpy(dy_cat + (size_t)r * 2 * I, dgate + (size_t)r * I, I * sizeof(float));
        memcpy(dy_cat + (size_t)r * 2 * I + I, dup + (size_t)r * I, I * sizeof(float));
    }
    // the experts: one group, gate and up sharing one QuantLinear as model/quant_layers.c binds them
    QuantContext *c = tensorwise(2);
    QuantLinear *fc1 = quant_context_linear(c), *fc2 = quant_context_linear(c);
    real *gate[] = {w_cat}, *up[] = {w_cat + I * H}, *down[] = {w_down};
    real *g_gate[] = {dw_gate}, *g_up[] = {dw_up}, *g_down[] = {dw_down};
    QuantLinear *q_fc1[] = {fc1}, *q_fc2[] = {fc2};
    ExpertWeights w = {gate, up, down, q_fc1, q_fc1, q_fc2}, dw = {g_gate, g_up, g_down, q_fc1, q_fc1, q_fc2};
    const int32_t offsets[] = {0, R};
    ExpertShape s = {.groups = 1, .H = H, .I = I, .offsets = offsets, .rows = R, .in_store = STORE_FP32,
                     .d_out_store = STORE_FP32};
    ExpertActs acts = {acts_buf[0], acts_buf[1], acts_buf[2], STORE_FP32, STORE_FP32, STORE_FP32};
    experts_forward_acts(&acts, x, NULL, &w, &s);
    experts_backward_weights(&dw, d_out, &acts, x, &s, dgate, dup);
    // the one GEMM: y_cat (R, 2I) = x·[W_gate; W_up]ᵀ, dW_cat (2I, H) = dy_catᵀ·x
    QuantContext *whole = tensorwise(1);
    QuantLinear *one = quant_context_linear(whole);
    qlinear_forward(one, y_cat, x, w_cat, R, H, 2 * I);
    qlinear_backward_weight(one, dw_cat, dy_cat, x, R, H, 2 * I);
    int gate_differs = 0, up_differs = 0;
    for (int r = 0; r < R; r++) {
        gate_differs += memcmp(acts.gate + (size_t)r * I, y_cat + (size_t)r * 2 * I, I * sizeof(float)) != 0;
        up_differs += memcmp(acts.up + (size_t)r * I, y_cat + (size_t)r * 2 * I + I, I * sizeof(float)) != 0;
    }
    CHECK(!gate_differs && !up_differs, "forward: %d gate rows and %d up rows differ from the one GEMM's",
          gate_differs, up_differs);
    CHECK(!memcmp(dw_gate, dw_cat, sizeof dw_gate) && !memcmp(dw_up, dw_cat + I * H, sizeof dw_up),
          "the weight gradients differ from the one GEMM's");
    quant_context_free(whole);
    quant_context_free(c);
}

int main(void) {
    RUN(test_gate_up_as_one_gemm);
    return tl_failed_cases != 0;
}

#include "moe/experts.h"

#include <string.h>

#include "core/device.h"
#include "ops/ops.h"
#include "ops/quantized_linear.h"

// The row range all groups cover (host integers): first .. first + total.
typedef struct {
    int first, total;
} RowSpan;

static RowSpan row_span(const ExpertShape *s) {
    if (s->counts) return (RowSpan){0, s->rows};
    return (RowSpan){s->offsets[0], s->offsets[s->groups] - s->offsets[0]};
}

// The groups' weights of one kind as one block: the first group's and the stride between groups.
static real *weight_block(real *const *w, int groups, size_t *stride) {
    *stride = groups > 1 ? (size_t)(w[1] - w[0]) : 0;
    for (int g = 0; g < groups; g++) MT_ASSERT(w[g] == w[0] + (size_t)g * *stride);
    return w[0];
}

// Each group's first row (host integers): offsets (groups + 1), from the host offsets, the
// host counts, or the counts downloaded (only the quantized path needs them on the host).
static void group_offsets(const ExpertShape *s, int32_t *offsets) {
    if (!s->counts) {
        for (int g = 0; g <= s->groups; g++) offsets[g] = s->offsets[g];
        return;
    }
    if (s->host_counts) memcpy(offsets + 1, s->host_counts, (size_t)s->groups * sizeof(int32_t));
    else device_download(offsets + 1, s->counts, (size_t)s->groups * sizeof(int32_t));
    offsets[0] = 0;
    for (int g = 0; g < s->groups; g++) offsets[g + 1] += offsets[g];
}

// group_offsets into the quantizers' context's host buffer (grown to the groups, then kept).
static const int32_t *quant_group_offsets(const ExpertShape *s, QuantContext *ctx) {
    if (ctx->host_offsets_len < s->groups + 1) {
        free(ctx->host_offsets);
        ctx->host_offsets_len = s->groups + 1;
        ctx->host_offsets = mt_malloc((size_t)ctx->host_offsets_len * sizeof(int32_t));
    }
    group_offsets(s, ctx->host_offsets);
    return ctx->host_offsets;
}

// The quantized form of project (trans_b: the forward, y = x·Wᵀ, beta 0; else the input
// gradient, dx += dy·W, beta 1) and of project_wgrad: one quantized GEMM per non-empty group,
// each with its expert's quantizers (Transformer Engine's GroupedLinear).
typedef enum { QUANT_FPROP, QUANT_DGRAD, QUANT_WGRAD } QuantGemm;

static void quant_project(const ExpertShape *s, QuantLinear *const *q, QuantGemm gemm, int N, int K, const real *A,
                          const real *X, real *const *W, real *C) {
    const int32_t *offsets = quant_group_offsets(s, q[0]->ctx);
    for (int g = 0; g < s->groups; g++) {
        size_t at = (size_t)offsets[g];
        int rows = offsets[g + 1] - offsets[g];
        if (rows <= 0) continue;
        if (gemm == QUANT_FPROP) qlinear_forward(q[g], C + at * N, A + at * K, W[g], rows, K, N);
        else if (gemm == QUANT_DGRAD) qlinear_backward_data(q[g], C + at * N, A + at * K, W[g], rows, N, K);
        else qlinear_backward_weight(q[g], W[g], A + at * N, X + at * K, rows, K, N);
    }
}

// Gate and up are one GEMM in Megatron-Core (linear_fc1) and share each group's quantizers here:
// under current scaling a group's weights take one amax over both (gate, up non-NULL), and so do
// its rows of the gate and up gradients (dgate, dup non-NULL; rows × I each), until
// gate_up_amax_end (qlinear_fused_amax_begin).
static void gate_up_amax_begin(const ExpertShape *s, QuantLinear *const *q, real *const *gate, real *const *up,
                               const real *dgate, const real *dup) {
    if (!q || !qlinear_fuses_amax(q[0])) return;  // (no download of the counts for nothing)
    const int32_t *offsets = quant_group_offsets(s, q[0]->ctx);
    size_t w = (size_t)s->I * s->H;  // a weight's elements
    for (int g = 0; g < s->groups; g++) {
        int rows = offsets[g + 1] - offsets[g];
        if (rows <= 0) continue;
        size_t at = (size_t)offsets[g] * s->I, n = (size_t)rows * s->I;
        if (gate) qlinear_fused_amax_begin(q[g], QUANT_WEIGHT, 2, (const real *[]){gate[g], up[g]}, (size_t[]){w, w});
        if (dgate)
            qlinear_fused_amax_begin(q[g], QUANT_GRAD, 2, (const real *[]){dgate + at, dup + at}, (size_t[]){n, n});
    }
}

static void gate_up_amax_end(const ExpertShape *s, QuantLinear *const *q) {
    for (int g = 0; q && g < s->groups; g++) {
        qlinear_fused_amax_end(q[g], QUANT_WEIGHT);
        qlinear_fused_amax_end(q[g], QUANT_GRAD);
    }
}

// C_g[rows_g, N] = A_g[rows_g, K]·op(W_g) + beta·C_g per group (op: ᵀ with trans_b; lda K, ldc N,
// W_g [K,N] or with trans_b [N,K]; beta 0 or 1; A stored as a_store and C as c_store, both fp32 when
// quantized): one grouped GEMM over counts, or with host offsets one GEMM per non-empty group.
static void project(const ExpertShape *s, QuantLinear *const *q, int trans_b, int N, int K, const void *A_stored,
                    Storage a_store, real *const *W, real beta, void *C, Storage c_store) {
    int ldb = trans_b ? K : N;
    if (s->counts && !q) {
        size_t stride;
        const real *B = weight_block(W, s->groups, &stride);
        mt_gemm_grouped(0, trans_b, s->groups, s->counts, s->host_counts, N, K, 1, A_stored, a_store, K, B, stride, ldb,
                        beta, C, c_store, N);
        return;
    }
    if (q) {  // the quantized forward overwrites, its input gradient accumulates (onto zeros for beta 0)
        MT_ASSERT(beta == 0 || !trans_b);
        MT_ASSERT(a_store == STORE_FP32 && c_store == STORE_FP32);
        if (!trans_b && beta == 0) {
            RowSpan r = row_span(s);
            vec_zero((real *)C + (size_t)r.first * N, (size_t)r.total * N);
        }
        quant_project(s, q, trans_b ? QUANT_FPROP : QUANT_DGRAD, N, K, A_stored, NULL, W, C);
        return;
    }
    for (int g = 0; g < s->groups; g++) {
        size_t at = (size_t)s->offsets[g];
        int rows = s->offsets[g + 1] - s->offsets[g];
        if (rows > 0)
            mt_gemm_stored(0, trans_b, rows, N, K, 1, storage_at_const(A_stored, a_store, at * K), a_store, K, W[g],
                           STORE_FP32, ldb, beta, storage_at(C, c_store, at * N), c_store, N);
    }
}

// W_g[out, in] += dY_gᵀ·X_g per group, dY_g (rows_g, out; stored as dy_store) and X_g (rows_g, in;
// stored as x_store), as project.
static void project_wgrad(const ExpertShape *s, QuantLinear *const *q, int out, int in, const void *dY,
                          Storage dy_store, const void *X_stored, Storage x_store, real *const *W) {
    if (s->counts && !q) {
        size_t stride;
        real *base = weight_block(W, s->groups, &stride);
        mt_gemm_grouped_wgrad(s->groups, s->counts, s->host_counts, out, in, 1, dY, dy_store, X_stored, x_store, base,
                              stride);
        return;
    }
    if (q) {
        MT_ASSERT(dy_store == STORE_FP32 && x_store == STORE_FP32);
        quant_project(s, q, QUANT_WGRAD, out, in, dY, X_stored, W, NULL);
        return;
    }
    for (int g = 0; g < s->groups; g++) {
        size_t at = (size_t)s->offsets[g];
        int rows = s->offsets[g + 1] - s->offsets[g];
        if (rows > 0)
            mt_gemm_stored(1, 0, out, in, rows, 1, storage_at_const(dY, dy_store, at * out), dy_store, out,
                           storage_at_const(X_stored, x_store, at * in), x_store, in, 1, W[g], STORE_FP32, in);
    }
}

void experts_recompute_act(real *act, const ExpertActs *acts, const real *row_scale, const ExpertShape *s) {
    int I = s->I;
    RowSpan r = row_span(s);
    size_t first_i = (size_t)r.first * I;
    Storage gu = acts->gate_up_store;
    swiglu_forward(storage_at(act, acts->act_store, first_i), acts->act_store, storage_at(acts->gate, gu, first_i),
                   storage_at(acts->up, gu, first_i), gu, row_scale ? row_scale + r.first : NULL, r.total, I);
}

void experts_forward_acts(ExpertActs *acts, const real *rows_in, const real *row_scale, const ExpertWeights *w,
                          const ExpertShape *s) {
    int H = s->H, I = s->I;
    // gate = x·W_gateᵀ, up = x·W_upᵀ: (rows,H) x (I,H)ᵀ per group
    gate_up_amax_begin(s, w->quant_gate, w->gate, w->up, NULL, NULL);
    project(s, w->quant_gate, 1, I, H, rows_in, s->in_store, w->gate, 0, acts->gate, acts->gate_up_store);
    project(s, w->quant_up, 1, I, H, rows_in, s->in_store, w->up, 0, acts->up, acts->gate_up_store);
    gate_up_amax_end(s, w->quant_gate);
    experts_recompute_act(acts->act, acts, row_scale, s);
}

void experts_forward(real *rows_out, ExpertActs *acts, const real *rows_in,
                     const real *row_scale, const ExpertWeights *w, const ExpertShape *s) {
    experts_forward_acts(acts, rows_in, row_scale, w, s);
    // out = act·W_downᵀ: (rows,I) x (H,I)ᵀ
    project(s, w->quant_down, 1, s->H, s->I, acts->act, acts->act_store, w->down, 0, rows_out, STORE_FP32);
}

void experts_backward_data(real *drows_in, real *drow_scale, const real *drows_out, const ExpertActs *acts,
                           const real *row_scale, const ExpertWeights *w, const ExpertShape *s,
                           real *scratch_dgate, real *scratch_dup, real *scratch_dact) {
    int H = s->H, I = s->I;
    RowSpan r = row_span(s);
    size_t first_i = (size_t)r.first * I;
    // down projection: dact = dy·W_down (rows,H) x (H,I)
    project(s, w->quant_down, 0, I, H, drows_out, s->d_out_store, w->down, 0, scratch_dact, STORE_FP32);
    Storage gu = acts->gate_up_store, d = acts->d_gate_up_store;
    swiglu_backward(storage_at(scratch_dgate, d, first_i), storage_at(scratch_dup, d, first_i), d,
                    drow_scale ? drow_scale + r.first : NULL, scratch_dact + first_i,
                    storage_at(acts->gate, gu, first_i), storage_at(acts->up, gu, first_i), gu,
                    row_scale ? row_scale + r.first : NULL, r.total, I);
    // gate and up projections share the input: dx = dgate·W_gate + dup·W_up (rows,I) x (I,H)
    gate_up_amax_begin(s, w->quant_gate, w->gate, w->up, scratch_dgate, scratch_dup);
    project(s, w->quant_gate, 0, H, I, scratch_dgate, d, w->gate, 0, drows_in, STORE_FP32);
    project(s, w->quant_up, 0, H, I, scratch_dup, d, w->up, 1, drows_in, STORE_FP32);
    gate_up_amax_end(s, w->quant_gate);
}

void experts_backward_weights(const ExpertWeights *dw, const real *drows_out, const ExpertActs *acts,
                              const real *rows_in, const ExpertShape *s, const real *scratch_dgate,
                              const real *scratch_dup) {
    int H = s->H, I = s->I;
    // dW_down += dyᵀ·act, dW_gate += dgateᵀ·x, dW_up += dupᵀ·x
    Storage d = acts->d_gate_up_store;
    project_wgrad(s, dw->quant_down, H, I, drows_out, s->d_out_store, acts->act, acts->act_store, dw->down);
    gate_up_amax_begin(s, dw->quant_gate, NULL, NULL, scratch_dgate, scratch_dup);
    project_wgrad(s, dw->quant_gate, I, H, scratch_dgate, d, rows_in, s->in_store, dw->gate);
    project_wgrad(s, dw->quant_up, I, H, scratch_dup, d, rows_in, s->in_store, dw->up);
    gate_up_amax_end(s, dw->quant_gate);
}

void experts_backward(real *drows_in, real *drow_scale, const ExpertWeights *dw,
                      const real *drows_out, const ExpertActs *acts, const real *rows_in,
                      const real *row_scale, const ExpertWeights *w, const ExpertShape *s,
                      real *scratch_dgate, real *scratch_dup, real *scratch_dact) {
    experts_backward_data(drows_in, drow_scale, drows_out, acts, row_scale, w, s, scratch_dgate, scratch_dup,
                          scratch_dact);
    experts_backward_weights(dw, drows_out, acts, rows_in, s, scratch_dgate, scratch_dup);
}

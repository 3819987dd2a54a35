// dispatch.c — the functions of ops.h and gemm.h, each forwarded to the active backend
// (src/ops/backend.h). A backend with a `finish` step (cuda) completes every op before
// the call returns, because the model's own loops read op outputs right after.
#include "ops/backend.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static const OpsBackend *active = &ops_cpu_backend;

static void (*between_ops)(void);

void ops_select(const OpsBackend *b) { active = b; }
void ops_set_between_ops(void (*fn)(void)) { between_ops = fn; }

static inline void finished(void) {
    if (active->finish) active->finish();
#ifdef _OPENMP
    if (omp_in_parallel()) return;  // the hook runs on the thread that calls MPI only
#endif
    if (between_ops) between_ops();
}

// Calls active->op(args...) and completes it.
#define FORWARD(op, ...)           \
    do {                           \
        active->op(__VA_ARGS__);   \
        finished();                \
    } while (0)

void mt_gemm(int trans_a, int trans_b, int M, int N, int K, real alpha, const real *A, int lda, const real *B,
             int ldb, real beta, real *C, int ldc) {
    FORWARD(gemm, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void mt_gemm_grouped(int trans_a, int trans_b, int groups, const int *rows, int N, int K, real alpha,
                     const real *A, const size_t *a_offsets, int lda, const real *const *B_ptrs, int ldb,
                     real beta, real *C, const size_t *c_offsets, int ldc) {
    FORWARD(gemm_grouped, trans_a, trans_b, groups, rows, N, K, alpha, A, a_offsets, lda, B_ptrs, ldb, beta, C,
            c_offsets, ldc);
}

void mt_gemm_grouped_wgrad(int groups, const int *rows, int out, int in, real alpha, const real *dY,
                           const size_t *dy_offsets, const real *X, const size_t *x_offsets, real *const *W_ptrs) {
    FORWARD(gemm_grouped_wgrad, groups, rows, out, in, alpha, dY, dy_offsets, X, x_offsets, W_ptrs);
}

void linear_forward(real *y, const real *x, const real *W, int N, int in, int out) {
    FORWARD(linear_forward, y, x, W, N, in, out);
}

void linear_backward(real *dx, real *dW, const real *dy, const real *x, const real *W, int N, int in, int out) {
    FORWARD(linear_backward, dx, dW, dy, x, W, N, in, out);
}

void vec_copy(real *dst, const real *src, size_t n) { FORWARD(vec_copy, dst, src, n); }
void vec_zero(real *x, size_t n) { FORWARD(vec_zero, x, n); }
void vec_add(real *y, const real *x, size_t n) { FORWARD(vec_add, y, x, n); }
void vec_scale(real *x, real s, size_t n) { FORWARD(vec_scale, x, s, n); }

// A scalar result: the backend completes the op to return it.
double vec_sum_squares(const real *x, size_t n) { return active->vec_sum_squares(x, n); }

void embedding_forward(real *out, const int32_t *tokens, const real *table, int N, int C) {
    FORWARD(embedding_forward, out, tokens, table, N, C);
}

void embedding_backward(real *dtable, const real *dout, const int32_t *tokens, int N, int C) {
    FORWARD(embedding_backward, dtable, dout, tokens, N, C);
}

void rmsnorm_forward(real *y, real *rstd, const real *x, const real *w, int N, int C, real eps) {
    FORWARD(rmsnorm_forward, y, rstd, x, w, N, C, eps);
}

void rmsnorm_backward(real *dx, real *dw, const real *dy, const real *x, const real *w, const real *rstd, int N,
                      int C) {
    FORWARD(rmsnorm_backward, dx, dw, dy, x, w, rstd, N, C);
}

void rope_forward(real *x, const real *cos_sin, const TokenLayout *t, const RopeLayout *l) {
    FORWARD(rope_forward, x, cos_sin, t, l);
}

void rope_backward(real *dx, const real *cos_sin, const TokenLayout *t, const RopeLayout *l) {
    FORWARD(rope_backward, dx, cos_sin, t, l);
}

void clamp_forward(real *y, const real *x, size_t n, real limit) { FORWARD(clamp_forward, y, x, n, limit); }
void clamp_backward(real *d, const real *x, size_t n, real limit) { FORWARD(clamp_backward, d, x, n, limit); }

void attention_forward(real *out, real *lse, const real *q, const real *k, const real *v, const AttentionShape *s) {
    FORWARD(attention_forward, out, lse, q, k, v, s);
}

void attention_backward(real *dq, real *dk, real *dv, const real *dout, const real *out, const real *lse,
                        const real *q, const real *k, const real *v, const AttentionShape *s) {
    FORWARD(attention_backward, dq, dk, dv, dout, out, lse, q, k, v, s);
}

void attention_merge(real *out, real *lse, const real *out_block, const real *lse_block, const AttentionShape *s) {
    FORWARD(attention_merge, out, lse, out_block, lse_block, s);
}

void swiglu_forward(real *act, const real *gate, const real *up, const real *row_scale, int M, int I) {
    FORWARD(swiglu_forward, act, gate, up, row_scale, M, I);
}

void swiglu_backward(real *dgate, real *dup, real *drow_scale, const real *dact, const real *gate, const real *up,
                     const real *row_scale, int M, int I) {
    FORWARD(swiglu_backward, dgate, dup, drow_scale, dact, gate, up, row_scale, M, I);
}

void softmax_forward(real *y, const real *x, int N, int C) { FORWARD(softmax_forward, y, x, N, C); }

void softmax_backward(real *dx, const real *y, const real *dy, int N, int C) {
    FORWARD(softmax_backward, dx, y, dy, N, C);
}

void cross_entropy_forward(real *losses, real *lse, const real *logits, const int32_t *targets, int N, int V) {
    FORWARD(cross_entropy_forward, losses, lse, logits, targets, N, V);
}

void cross_entropy_backward(real *dlogits, const real *logits, const real *lse, const int32_t *targets,
                            const real *weight, int N, int V) {
    FORWARD(cross_entropy_backward, dlogits, logits, lse, targets, weight, N, V);
}

void adamw_update(real *p, const real *g, real *m, real *v, size_t n, int decay, const AdamWStep *h) {
    FORWARD(adamw_update, p, g, m, v, n, decay, h);
}

void moe_router_logits(real *logits, const real *x, const real *W, int N, int H, int E) {
    FORWARD(moe_router_logits, logits, x, W, N, H, E);
}

void moe_route_tokens(real *scores, real *aux_scores, int32_t *topk_idx, real *topk_probs, const real *logits,
                      const real *expert_bias, int N, const RouteShape *r) {
    FORWARD(moe_route_tokens, scores, aux_scores, topk_idx, topk_probs, logits, expert_bias, N, r);
}

void moe_permute(real *rows, real *row_values, const real *x, const real *choice_values,
                 const int32_t *token_of_row, const int32_t *row_of_choice, int R, int k, int H) {
    FORWARD(moe_permute, rows, row_values, x, choice_values, token_of_row, row_of_choice, R, k, H);
}

void moe_unpermute(real *out, real *choice_values, const real *rows, const real *row_values,
                   const int32_t *row_of_choice, int N, int k, int H, int accumulate) {
    FORWARD(moe_unpermute, out, choice_values, rows, row_values, row_of_choice, N, k, H, accumulate);
}

#include "moe/experts.h"

#include <stdlib.h>

#include "ops/ops.h"

// The grouped-GEMM description of an ExpertShape: rows per group and where each group's
// rows start in a buffer H wide and in one I wide.
typedef struct {
    int *rows;
    size_t *at_h, *at_i;
    int first, total;  // the row range all groups cover: first .. first + total
} GroupRows;

static GroupRows group_rows(const ExpertShape *s) {
    GroupRows g = {mt_malloc((size_t)s->groups * sizeof(int)), mt_malloc((size_t)s->groups * sizeof(size_t)),
                   mt_malloc((size_t)s->groups * sizeof(size_t)), s->offsets[0],
                   s->offsets[s->groups] - s->offsets[0]};
    for (int e = 0; e < s->groups; e++) {
        g.rows[e] = s->offsets[e + 1] - s->offsets[e];
        g.at_h[e] = (size_t)s->offsets[e] * s->H;
        g.at_i[e] = (size_t)s->offsets[e] * s->I;
    }
    return g;
}

static void group_rows_free(GroupRows *g) {
    free(g->rows);
    free(g->at_h);
    free(g->at_i);
}

static const real *const *weights(real *const *w) { return (const real *const *)w; }

void experts_forward(real *rows_out, ExpertActs *acts, const real *rows_in,
                     const real *row_scale, const ExpertWeights *w, const ExpertShape *s) {
    int H = s->H, I = s->I, E = s->groups;
    GroupRows g = group_rows(s);
    size_t first_i = (size_t)g.first * I;
    // gate = x·W_gateᵀ, up = x·W_upᵀ: (rows,H) x (I,H)ᵀ per group
    mt_gemm_grouped(0, 1, E, g.rows, I, H, 1, rows_in, g.at_h, H, weights(w->gate), H, 0, acts->gate, g.at_i, I);
    mt_gemm_grouped(0, 1, E, g.rows, I, H, 1, rows_in, g.at_h, H, weights(w->up), H, 0, acts->up, g.at_i, I);
    swiglu_forward(acts->act + first_i, acts->gate + first_i, acts->up + first_i,
                   row_scale ? row_scale + g.first : NULL, g.total, I);
    // out = act·W_downᵀ: (rows,I) x (H,I)ᵀ
    mt_gemm_grouped(0, 1, E, g.rows, H, I, 1, acts->act, g.at_i, I, weights(w->down), I, 0, rows_out, g.at_h, H);
    group_rows_free(&g);
}

void experts_backward_data(real *drows_in, real *drow_scale, const real *drows_out, const ExpertActs *acts,
                           const real *row_scale, const ExpertWeights *w, const ExpertShape *s,
                           real *scratch_dgate, real *scratch_dup, real *scratch_dact) {
    int H = s->H, I = s->I, E = s->groups;
    GroupRows g = group_rows(s);
    size_t first_i = (size_t)g.first * I, first_h = (size_t)g.first * H;
    // down projection: dact = dy·W_down (rows,H) x (H,I)
    vec_zero(scratch_dact + first_i, (size_t)g.total * I);
    mt_gemm_grouped(0, 0, E, g.rows, I, H, 1, drows_out, g.at_h, H, weights(w->down), I, 1, scratch_dact, g.at_i, I);
    swiglu_backward(scratch_dgate + first_i, scratch_dup + first_i, drow_scale ? drow_scale + g.first : NULL,
                    scratch_dact + first_i, acts->gate + first_i, acts->up + first_i,
                    row_scale ? row_scale + g.first : NULL, g.total, I);
    // gate and up projections share the input: dx = dgate·W_gate + dup·W_up (rows,I) x (I,H)
    vec_zero(drows_in + first_h, (size_t)g.total * H);
    mt_gemm_grouped(0, 0, E, g.rows, H, I, 1, scratch_dgate, g.at_i, I, weights(w->gate), H, 1, drows_in, g.at_h, H);
    mt_gemm_grouped(0, 0, E, g.rows, H, I, 1, scratch_dup, g.at_i, I, weights(w->up), H, 1, drows_in, g.at_h, H);
    group_rows_free(&g);
}

void experts_backward_weights(const ExpertWeights *dw, const real *drows_out, const ExpertActs *acts,
                              const real *rows_in, const ExpertShape *s, const real *scratch_dgate,
                              const real *scratch_dup) {
    int H = s->H, I = s->I, E = s->groups;
    GroupRows g = group_rows(s);
    // dW_down += dyᵀ·act, dW_gate += dgateᵀ·x, dW_up += dupᵀ·x
    mt_gemm_grouped_wgrad(E, g.rows, H, I, 1, drows_out, g.at_h, acts->act, g.at_i, dw->down);
    mt_gemm_grouped_wgrad(E, g.rows, I, H, 1, scratch_dgate, g.at_i, rows_in, g.at_h, dw->gate);
    mt_gemm_grouped_wgrad(E, g.rows, I, H, 1, scratch_dup, g.at_i, rows_in, g.at_h, dw->up);
    group_rows_free(&g);
}

void experts_backward(real *drows_in, real *drow_scale, const ExpertWeights *dw,
                      const real *drows_out, const ExpertActs *acts, const real *rows_in,
                      const real *row_scale, const ExpertWeights *w, const ExpertShape *s,
                      real *scratch_dgate, real *scratch_dup, real *scratch_dact) {
    experts_backward_data(drows_in, drow_scale, drows_out, acts, row_scale, w, s, scratch_dgate, scratch_dup,
                          scratch_dact);
    experts_backward_weights(dw, drows_out, acts, rows_in, s, scratch_dgate, scratch_dup);
}

#include "moe/experts.h"

#include "ops/ops.h"

void experts_forward(real *rows_out, ExpertActs *acts, const real *rows_in,
                     const real *row_scale, const ExpertWeights *w, const ExpertShape *s) {
    int H = s->H, I = s->I;
    for (int g = 0; g < s->groups; g++) {
        int first = s->offsets[g], rows = s->offsets[g + 1] - first;
        if (rows == 0) continue;
        const real *x = rows_in + (size_t)first * H;
        real *gate = acts->gate + (size_t)first * I, *up = acts->up + (size_t)first * I;
        real *act = acts->act + (size_t)first * I;
        linear_forward(gate, x, w->gate[g], rows, H, I);
        linear_forward(up, x, w->up[g], rows, H, I);
        swiglu_forward(act, gate, up, row_scale ? row_scale + first : NULL, rows, I);
        linear_forward(rows_out + (size_t)first * H, act, w->down[g], rows, I, H);
    }
}

void experts_backward(real *drows_in, real *drow_scale, const ExpertWeights *dw,
                      const real *drows_out, const ExpertActs *acts, const real *rows_in,
                      const real *row_scale, const ExpertWeights *w, const ExpertShape *s,
                      real *scratch_dgate, real *scratch_dup, real *scratch_dact) {
    int H = s->H, I = s->I;
    for (int g = 0; g < s->groups; g++) {
        int first = s->offsets[g], rows = s->offsets[g + 1] - first;
        if (rows == 0) continue;
        const real *x = rows_in + (size_t)first * H, *dy = drows_out + (size_t)first * H;
        const real *gate = acts->gate + (size_t)first * I, *up = acts->up + (size_t)first * I;
        real *dgate = scratch_dgate + (size_t)first * I, *dup = scratch_dup + (size_t)first * I;
        real *dact = scratch_dact + (size_t)first * I, *dx = drows_in + (size_t)first * H;
        // down projection: dact = dy·W_down, dW_down += dyᵀ·act
        vec_zero(dact, (size_t)rows * I);
        linear_backward(dact, dw->down[g], dy, acts->act + (size_t)first * I, w->down[g], rows, I, H);
        swiglu_backward(dgate, dup, drow_scale ? drow_scale + first : NULL, dact, gate, up,
                        row_scale ? row_scale + first : NULL, rows, I);
        // gate and up projections share the input: dx = dgate·W_gate + dup·W_up
        vec_zero(dx, (size_t)rows * H);
        linear_backward(dx, dw->gate[g], dgate, x, w->gate[g], rows, H, I);
        linear_backward(dx, dw->up[g], dup, x, w->up[g], rows, H, I);
    }
}

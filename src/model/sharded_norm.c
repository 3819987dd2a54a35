// sharded_norm.c — RMSNorm over rows split by columns (sharded_norm.h). The row statistics
// are summed over the group in double (rank order, parallel/comm.h); the rest is local.
#include "model/sharded_norm.h"

#include <math.h>

#include "ops/ops.h"

static int whole_rows(const NormShards *s) { return s->group->size == 1; }

// Σ over the row's columns held here of a·b·c (c NULL: a·b), per row, in double.
static void row_dots(double *out, const real *a, const real *b, const real *c, int N, int C) {
    for (int n = 0; n < N; n++) {
        const real *ar = a + (size_t)n * C, *br = b + (size_t)n * C;
        double dot = 0;
        for (int j = 0; j < C; j++) dot += (double)ar[j] * br[j] * (c ? c[j] : 1);
        out[n] = dot;
    }
}

void rmsnorm_sharded_forward(real *y, real *rstd, const real *x, const real *w, int N, int C, real eps,
                             const NormShards *s) {
    if (whole_rows(s)) {
        rmsnorm_forward(y, STORE_FP32, rstd, x, STORE_FP32, w, N, C, eps);
        return;
    }
    int C_total = C * s->group->size / s->replicas;
    double *ss = mt_malloc((size_t)MT_MAX(N, 1) * sizeof(double));
    row_dots(ss, x, x, NULL, N, C);
    comm_allreduce_sum_double(s->group, ss, (size_t)N);
    for (int n = 0; n < N; n++) {
        real r = (real)(1.0 / sqrt(ss[n] / s->replicas / C_total + eps));
        rstd[n] = r;
        for (int j = 0; j < C; j++) y[(size_t)n * C + j] = x[(size_t)n * C + j] * r * w[j];
    }
    free(ss);
}

// dx = r·(dy⊙w) − x·r³/C_total·Σ_all (dy⊙w)·x. With replicas each holder's dy is its part
// of the piece's gradient and the holders' dx are summed later, so each takes 1/replicas
// of the second term.
void rmsnorm_sharded_backward(real *dx, real *dw, const real *dy, const real *x, const real *w, const real *rstd,
                              int N, int C, const NormShards *s) {
    if (whole_rows(s)) {
        rmsnorm_backward(dx, dw, dy, x, STORE_FP32, w, rstd, N, C);
        return;
    }
    int C_total = C * s->group->size / s->replicas;
    double *dot = mt_malloc((size_t)MT_MAX(N, 1) * sizeof(double));
    row_dots(dot, dy, x, w, N, C);
    comm_allreduce_sum_double(s->group, dot, (size_t)N);
    for (int n = 0; n < N; n++) {
        double r = rstd[n], k = dot[n] / s->replicas * r * r * r / C_total;
        for (int j = 0; j < C; j++) {
            size_t i = (size_t)n * C + j;
            dx[i] += (real)(r * dy[i] * w[j] - k * x[i]);
        }
    }
    for (int j = 0; j < C; j++) {
        double acc = 0;
        for (int n = 0; n < N; n++) acc += (double)dy[(size_t)n * C + j] * x[(size_t)n * C + j] * rstd[n];
        dw[j] += (real)acc;
    }
    free(dot);
}

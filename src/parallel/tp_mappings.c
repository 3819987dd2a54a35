// tp_mappings.c — tensor-parallel block boundaries (tp_mappings.h) on comm.h's collectives.
#include "parallel/tp_mappings.h"

#include <string.h>

static int split(const TpRegion *r) { return r->sequence_parallel && r->tp->size > 1; }

static void copy_rows(real *dst, const real *src, size_t n) {
    if (dst != src) memcpy(dst, src, n * sizeof(real));
}

void tp_enter_forward(const TpRegion *r, const real *x, real *x_full, int N, int C) {
    if (split(r)) comm_allgather(r->tp, x, x_full, (size_t)N / r->tp->size * C);
    else copy_rows(x_full, x, (size_t)N * C);
}

void tp_enter_backward(const TpRegion *r, real *d_full, real *d_x, int N, int C) {
    if (split(r)) {
        comm_reduce_scatter(r->tp, d_full, d_x, (size_t)N / r->tp->size * C);
        return;
    }
    comm_allreduce_sum(r->tp, d_full, (size_t)N * C);
    copy_rows(d_x, d_full, (size_t)N * C);
}

void tp_exit_forward(const TpRegion *r, real *y_partial, real *y, int N, int C) {
    tp_enter_backward(r, y_partial, y, N, C);  // the same sum: all-reduce, or reduce-scatter
}

void tp_exit_backward(const TpRegion *r, const real *d_y, real *d_full, int N, int C) {
    tp_enter_forward(r, d_y, d_full, N, C);  // the same movement: identity, or all-gather
}

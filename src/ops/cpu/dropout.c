// dropout.c — the cpu backend's dropout_apply (contract in ops.h; the mask in ops/dropout_math.h).
#include "ops/cpu/cpu_ops.h"
#include "ops/dropout_math.h"

void cpu_dropout_apply(real *y, const real *x, const DropoutShape *s) {
    const DropoutMask mask = s->mask;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < s->rows; r++) {
        int row = s->row_index ? s->row_index[r] : s->row_first + r;
        uint64_t key = dropout_row_key(mask.stream, (uint64_t)row);
        const real *xr = x + (size_t)r * s->cols;
        real *yr = y + (size_t)r * s->cols;
        for (int c = 0; c < s->cols; c++) yr[c] = dropout_kept(key, (uint64_t)c, mask.threshold) ? xr[c] * mask.scale : 0;
    }
}

// attention_merge.c — the log-sum-exp merge of two partial attention results of the same
// queries (ops.h attention_merge), for the cpu backend. The weights of one (token, head)
// row are computed in double from its two lse values; a side that saw no key (lse = −∞)
// gets weight 0 without an exponent of −∞ − (−∞).
#include <math.h>

#include "ops/cpu/cpu_ops.h"

void cpu_attention_merge(real *out, real *lse, const real *out_block, const real *lse_block,
                         const AttentionShape *s) {
    const int dv = s->v_head_dim ? s->v_head_dim : s->head_dim;
    const long long rows = (long long)s->B * s->Tq * s->heads;  // (token, head) rows of out
#pragma omp parallel for schedule(static)
    for (long long row = 0; row < rows; row++) {
        const long long token = row / s->heads;  // b·Tq + t
        const int h = (int)(row % s->heads), b = (int)(token / s->Tq), t = (int)(token % s->Tq);
        const size_t stat = ((size_t)b * s->heads + h) * s->Tq + t;
        real *o = out + (size_t)row * dv;
        const real *o_block = out_block + (size_t)row * dv;
        const double a = lse[stat], c = lse_block[stat];
        if (c == -INFINITY) continue;  // the block adds nothing
        if (a == -INFINITY) {          // nothing so far: the block's result
            for (int i = 0; i < dv; i++) o[i] = o_block[i];
            lse[stat] = (real)c;
            continue;
        }
        const double merged = fmax(a, c) + log1p(exp(-fabs(a - c)));
        const double weight = exp(a - merged), weight_block = exp(c - merged);
        for (int i = 0; i < dv; i++) o[i] = (real)(weight * o[i] + weight_block * o_block[i]);
        lse[stat] = (real)merged;
    }
}

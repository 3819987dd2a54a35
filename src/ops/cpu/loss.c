// loss.c — the cpu backend's LM head loss ops (ops_loss.h): masked loss sums, loss
// weights, the scaled copy of the backward's per-token loss gradient.
#include "ops/cpu/cpu_ops.h"

// sums = (Σ w, Σ w·loss) in order n = 0, 1, ...
void cpu_lm_loss_sums(double *sums, const real *token_loss, const real *loss_mask, int N) {
    double counted = 0, total = 0;
    for (int n = 0; n < N; n++) {
        double w = loss_mask ? loss_mask[n] : 1;
        counted += w;
        total += w * token_loss[n];
    }
    sums[0] = counted;
    sums[1] = total;
}

void cpu_lm_loss_weights(real *weight, const real *loss_mask, double counted, int N) {
    for (int n = 0; n < N; n++) weight[n] = counted > 0 ? (real)((loss_mask ? loss_mask[n] : 1) / counted) : 0;
}

void cpu_vec_scale_double(real *dst, const real *src, double scale, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (real)(src[i] * scale);
}

// loss.c — the cpu backend's loss ops (ops_loss.h): the LM head's masked loss sums, loss
// weights and the scaled copy of the backward's per-token loss gradient; the vocab-parallel
// embedding's and cross-entropy's per-token work (the loops model/vocab_parallel.c had).
#include <math.h>

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

// ---- vocab-parallel embedding and cross-entropy -------------------------------------------

// The token's row in the slice [first, first + vocab), or −1 when another rank holds it.
static int32_t slice_row(int first, int vocab, int32_t token) {
    int32_t row = token - first;
    return row >= 0 && row < vocab ? row : -1;
}

void cpu_vocab_slice_rows(int32_t *rows, const int32_t *tokens, int first, int vocab, int32_t missing, int N) {
    for (int n = 0; n < N; n++) {
        int32_t row = slice_row(first, vocab, tokens[n]);
        rows[n] = row >= 0 ? row : missing;
    }
}

// Parallel over channels, tokens in order (as cpu_embedding_backward).
void cpu_vocab_embedding_grad(real *dtable, const real *dout, const int32_t *rows, int N, int C) {
#pragma omp parallel for schedule(static) if (C >= 64)
    for (int c = 0; c < C; c++)
        for (int n = 0; n < N; n++)
            if (rows[n] >= 0) dtable[(size_t)rows[n] * C + c] += dout[(size_t)n * C + c];
}

void cpu_vocab_row_max(real *maxima, const real *logits, int N, int V) {
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {
        const real *row = logits + (size_t)n * V;
        real mx = row[0];
        for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        maxima[n] = mx;
    }
}

void cpu_vocab_row_stats(double *stats, real *maxima, const real *every, const real *logits, const int32_t *targets,
                         int first, int P, int N, int V) {
    for (int n = 0; n < N; n++) {
        real mx = every[n];
        for (int q = 1; q < P; q++) mx = MT_MAX(mx, every[(size_t)q * N + n]);
        maxima[n] = mx;
    }
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {
        const real *row = logits + (size_t)n * V;
        double sum = 0;
        for (int v = 0; v < V; v++) sum += real_exp(row[v] - maxima[n]);
        int32_t target = slice_row(first, V, targets[n]);
        stats[n] = sum;
        stats[N + n] = target >= 0 ? row[target] : 0;
    }
}

void cpu_vocab_ce_finish(real *losses, real *lse, const real *maxima, const double *stats, int N) {
    for (int n = 0; n < N; n++) {
        double row_lse = maxima[n] + log(stats[n]);
        lse[n] = (real)row_lse;
        losses[n] = (real)(row_lse - stats[N + n]);
    }
}

void cpu_vocab_ce_foreign_targets(real *dlogits, const real *logits, const real *lse, const int32_t *targets,
                                  const real *weight, int first, int N, int V) {
    for (int n = 0; n < N; n++) {
        if (slice_row(first, V, targets[n]) >= 0 || weight[n] == 0) continue;
        size_t at = (size_t)n * V;
        dlogits[at] = real_exp(logits[at] - lse[n]) * weight[n];
    }
}

// check_loss.c — the backend under test's ops of ops_loss.h (LM head loss sums and weights, vocab-parallel cross-entropy)
// against the cpu backend (op_check.h).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "op_check.h"

#include "ops/cpu/cpu_ops.h"

static const OpsBackend *cpu(void) { return &ops_cpu_backend; }

// lm_loss_sums with and without a mask, lm_loss_weights, vec_scale_double
static void check_lm_loss(int N, int masked) {
    char name[96];
    snprintf(name, sizeof(name), "lm_loss N=%d%s", N, masked ? " masked" : "");
    float *loss = check_random((size_t)N, 0, 8), *mask = masked ? check_random((size_t)N, 0, 1) : NULL;
    if (mask)
        for (int n = 0; n < N; n++) mask[n] = mask[n] < 0.3f ? 0 : 1;
    float *d_loss = check_to_device(loss, (size_t)N), *d_mask = mask ? check_to_device(mask, (size_t)N) : NULL;
    double sums[2], test_sums[2];
    double *d_sums = check_device_bytes((double[2]){NAN, NAN}, sizeof(sums));
    cpu()->lm_loss_sums(sums, loss, mask, N);
    under()->lm_loss_sums(d_sums, d_loss, d_mask, N);

    float *weight = check_random((size_t)N, 0, 1), *d_weight = check_device_nan((size_t)N);
    cpu()->lm_loss_weights(weight, mask, sums[0], N);
    under()->lm_loss_weights(d_weight, d_mask, sums[0], N);
    float *scaled = check_random((size_t)N, 0, 1), *d_scaled = check_device_nan((size_t)N);
    cpu()->vec_scale_double(scaled, weight, 1.0 / 3, (size_t)N);
    under()->vec_scale_double(d_scaled, check_to_device(weight, (size_t)N), 1.0 / 3, (size_t)N);

    check_download(test_sums, d_sums, sizeof(test_sums));
    check_compare_double(name, "counted", sums[0], test_sums[0], 1e-12);
    check_compare_double(name, "total", sums[1], test_sums[1], 1e-12);
    check_compare(name, "weight", weight, d_weight, (size_t)N, TOL_FP32);
    check_compare(name, "scaled", scaled, d_scaled, (size_t)N, TOL_FP32);
    check_free_all();
}

// The slice [first, first + V) of a vocabulary of 3V: about a third of the tokens held.
static int32_t *vocab_tokens(int N, int V) { return check_random_ints((size_t)N, 0, 3 * V); }

// vocab_slice_rows (both missing values) and vocab_embedding_grad (accumulating)
static void check_vocab_embedding(int N, int V, int C) {
    char name[96];
    snprintf(name, sizeof(name), "vocab_embedding N=%d V=%d C=%d", N, V, C);
    int first = V;
    int32_t *tokens = vocab_tokens(N, V), *d_tokens = check_ints_to_device(tokens, (size_t)N);
    int32_t *rows = check_random_ints((size_t)N, 0, 1), *targets = check_random_ints((size_t)N, 0, 1);
    int32_t *d_rows = check_device_unset_ints((size_t)N), *d_targets = check_device_unset_ints((size_t)N);
    cpu()->vocab_slice_rows(rows, tokens, first, V, -1, N);
    cpu()->vocab_slice_rows(targets, tokens, first, V, 0, N);
    under()->vocab_slice_rows(d_rows, d_tokens, first, V, -1, N);
    under()->vocab_slice_rows(d_targets, d_tokens, first, V, 0, N);

    size_t nc = (size_t)N * C, vc = (size_t)V * C;
    float *dout = check_random(nc, -1, 1), *dtable = check_random(vc, -1, 1);
    float *d_dtable = check_to_device(dtable, vc);
    cpu()->vocab_embedding_grad(dtable, dout, rows, N, C);
    under()->vocab_embedding_grad(d_dtable, check_to_device(dout, nc), check_ints_to_device(rows, (size_t)N), N, C);

    check_compare_ints(name, "rows", rows, d_rows, (size_t)N);
    check_compare_ints(name, "targets", targets, d_targets, (size_t)N);
    check_compare(name, "dtable", dtable, d_dtable, vc, TOL_FP32);
    check_free_all();
}

// doubles (n) as floats, for check_compare
static float *as_floats(const double *x, size_t n) {
    float *f = check_random(n, 0, 1);
    for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}

// vocab_row_max, vocab_row_stats (P ranks' maxima), vocab_ce_finish, vocab_ce_foreign_targets
static void check_vocab_cross_entropy(int N, int V, int P) {
    char name[96];
    snprintf(name, sizeof(name), "vocab_cross_entropy N=%d V=%d P=%d", N, V, P);
    int first = V;
    size_t nv = (size_t)N * V, n2 = 2 * (size_t)N;
    float *logits = check_random(nv, -8, 8), *d_logits = check_to_device(logits, nv);
    int32_t *targets = vocab_tokens(N, V), *d_targets = check_ints_to_device(targets, (size_t)N);
    float *mine = check_random((size_t)N, 0, 1), *d_mine = check_device_nan((size_t)N);
    cpu()->vocab_row_max(mine, logits, N, V);
    under()->vocab_row_max(d_mine, d_logits, N, V);

    float *every = check_random((size_t)P * N, -8, 10), *d_every = check_to_device(every, (size_t)P * N);
    float *maxima = check_random((size_t)N, 0, 1), *d_maxima = check_device_nan((size_t)N);
    double *stats = (double *)check_random(2 * n2, 0, 1), *test_stats = (double *)check_random(2 * n2, 0, 1);
    for (size_t i = 0; i < n2; i++) stats[i] = NAN;
    double *d_stats = check_device_bytes(stats, n2 * sizeof(double));  // NaNs: overwritten
    cpu()->vocab_row_stats(stats, maxima, every, logits, targets, first, P, N, V);
    under()->vocab_row_stats(d_stats, d_maxima, d_every, d_logits, d_targets, first, P, N, V);

    float *losses = check_random((size_t)N, 0, 1), *lse = check_random((size_t)N, 0, 1);
    float *d_losses = check_device_nan((size_t)N), *d_lse = check_device_nan((size_t)N);
    cpu()->vocab_ce_finish(losses, lse, maxima, stats, N);
    under()->vocab_ce_finish(d_losses, d_lse, check_to_device(maxima, (size_t)N),
                             check_device_bytes(stats, n2 * sizeof(double)), N);

    float *weight = check_random((size_t)N, 0.1f, 2);
    for (int n = 1; n < N; n += 3) weight[n] = 0;
    float *dlogits = check_random(nv, -1, 1), *d_dlogits = check_to_device(dlogits, nv);
    cpu()->vocab_ce_foreign_targets(dlogits, logits, lse, targets, weight, first, N, V);
    under()->vocab_ce_foreign_targets(d_dlogits, d_logits, check_to_device(lse, (size_t)N), d_targets,
                                      check_to_device(weight, (size_t)N), first, N, V);

    check_download(test_stats, d_stats, n2 * sizeof(double));
    check_compare(name, "row max", mine, d_mine, (size_t)N, 0);
    check_compare(name, "maxima", maxima, d_maxima, (size_t)N, 0);
    check_compare(name, "stats", as_floats(stats, n2), check_to_device(as_floats(test_stats, n2), n2), n2, TOL_FP32);
    check_compare(name, "losses", losses, d_losses, (size_t)N, TOL_FP32);
    check_compare(name, "lse", lse, d_lse, (size_t)N, TOL_FP32);
    check_compare(name, "dlogits", dlogits, d_dlogits, nv, TOL_FP32);
    check_free_all();
}

void check_loss_ops(void) {
    int sizes[] = {1, 37, 1000, 4099};
    for (int i = 0; i < 4; i++) {
        check_lm_loss(sizes[i], 0);
        check_lm_loss(sizes[i], 1);
    }
    check_vocab_embedding(1, 8, 4);
    check_vocab_embedding(300, 50, 96);
    check_vocab_cross_entropy(1, 8, 2);
    check_vocab_cross_entropy(37, 300, 2);
    check_vocab_cross_entropy(200, 1000, 4);
}

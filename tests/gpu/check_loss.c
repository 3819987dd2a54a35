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

void check_loss_ops(void) {
    int sizes[] = {1, 37, 1000, 4099};
    for (int i = 0; i < 4; i++) {
        check_lm_loss(sizes[i], 0);
        check_lm_loss(sizes[i], 1);
    }
}

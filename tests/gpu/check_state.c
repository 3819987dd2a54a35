// check_state.c — the backend under test's ops of ops_state.h (checkpoint staging, KV cache, sampling, optimizer bookkeeping)
// against the cpu backend (op_check.h).
#include <stdio.h>
#include <string.h>

#include "op_check.h"

static const OpsBackend *cpu(void) { return &ops_cpu_backend; }

// ---- sampling the next token --------------------------------------------------------------

// One token from random logits (ties: tied = 1 rounds them to halves, so equal logits and
// equal weights occur) under every filter setting and a spread of draws; the token must be
// the cpu's exactly.
static void check_sampling(int vocab, int tied) {
    static const SampleParams settings[] = {
        {0, 0, 1, 0}, {0.8, 5, 0.9, 0}, {1.0, 0, 1, 0}, {0.7, 3, 1, 0}, {1.5, 0, 0.5, 0}, {0.5, 1, 0.95, 0},
    };
    static const double draws[] = {0.0, 0.137, 0.5, 0.999};
    char name[96];
    float *logits = check_random((size_t)vocab, -4, 4);
    if (tied)
        for (int v = 0; v < vocab; v++) logits[v] = (float)(int)(logits[v] * 2) / 2;
    float *d_logits = check_to_device(logits, (size_t)vocab);
    double *work = (double *)check_random(4 * (size_t)vocab, 0, 1);
    int32_t *order = check_random_ints((size_t)vocab, 0, 1);
    double *d_work = (double *)check_device_nan(4 * (size_t)vocab);
    int32_t *d_order = check_device_unset_ints((size_t)vocab), *d_token = check_device_unset_ints(1);
    for (size_t s = 0; s < sizeof(settings) / sizeof(settings[0]); s++)
        for (size_t k = 0; k < sizeof(draws) / sizeof(draws[0]); k++) {
            SampleParams p = settings[s];
            p.u = draws[k];
            int32_t token = -1, test = -1;
            cpu()->sample_next_token(&token, logits, vocab, &p, work, order);
            under()->sample_next_token(d_token, d_logits, vocab, &p, d_work, d_order);
            check_finish();
            check_download(&test, d_token, sizeof(test));
            snprintf(name, sizeof(name), "sample vocab=%d%s T=%.1f k=%d p=%.2f u=%.3f", vocab, tied ? " tied" : "",
                     p.temperature, p.top_k, p.top_p, p.u);
            check_compare_ints(name, "token", &token, &test, 1);
        }
    check_free_all();
}

void check_state_ops(void) {
    static const int VOCABS[] = {1, 7, 300};
    for (int i = 0; i < 3; i++) {
        check_sampling(VOCABS[i], 0);
        check_sampling(VOCABS[i], 1);
    }
}

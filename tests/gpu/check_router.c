// check_router.c — the backend under test's ops of ops_router.h (router capacity, counts, balancing statistics and losses, router backward)
// against the cpu backend (op_check.h).
//
// The router backward's gradients and the statistics' doubles may differ from the cpu's in the
// last bits of exp/log or the order of a sum: TOL_FP32; integers (kept flags, counts) exactly.
// Cases cover every score function, softmax before / after top-k, dropped choices, balance and
// z-loss factors, sequences spread over a token group (token_index), capacity by position and
// by prob with exact ties.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "op_check.h"

static const OpsBackend *cpu(void) { return &ops_cpu_backend; }

#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

// ---- router backward ---------------------------------------------------------------------------

typedef struct {
    const char *what;
    RouteShape r;
    int N, sequences, indexed;  // indexed: token_index names every other token of 2·N
} BackwardCase;

// k distinct experts per token: (n·7 + j·3) mod E, with E coprime to 3 or k small enough
static int32_t *distinct_choices(int N, int E, int k) {
    int32_t *idx = check_random_ints((size_t)N * k, 0, 1);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) idx[(size_t)n * k + j] = (n * 7 + j) % E;
    return idx;
}

static void check_backward(const BackwardCase *c) {
    char name[128];
    snprintf(name, sizeof(name), "moe_router_backward %s N=%d E=%d k=%d", c->what, c->N, c->r.E, c->r.k);
    int N = c->N, E = c->r.E, k = c->r.k, total = c->indexed ? 2 * N : N, S = (total + c->sequences - 1) / c->sequences;
    size_t ne = (size_t)N * E, nk = (size_t)N * k, se = (size_t)c->sequences * E;
    RouterGradShape g = {.route = c->r, .seq_length = S, .token_first = 0,
                         .aux = 0.03, .global = 0.02, .seq = 0.05, .z_factor = 0.004};
    float *logits = check_random(ne, -4, 4), *dprobs = check_random(nk, -1, 1);
    int32_t *idx = distinct_choices(N, E, k), *kept = check_random_ints(nk, 0, 2);
    int32_t *aux_counts = check_random_ints((size_t)E, 0, 50), *seq_counts = check_random_ints(se, 0, 20);
    double *global_counts = (double *)check_random_ints((size_t)E * 2, 0, 1);
    for (int e = 0; e < E; e++) global_counts[e] = 10.0 + 0.25 * e;
    int32_t *index = NULL;
    if (c->indexed) {
        index = check_random_ints((size_t)N, 0, 1);
        for (int n = 0; n < N; n++) index[n] = 2 * n + (n & 1);
    }
    float *d_logits = check_to_device(logits, ne), *d_dprobs = check_to_device(dprobs, nk);
    int32_t *d_idx = check_ints_to_device(idx, nk), *d_kept = check_ints_to_device(kept, nk);
    int32_t *d_aux = check_ints_to_device(aux_counts, (size_t)E), *d_seq = check_ints_to_device(seq_counts, se);
    double *d_global = check_device_bytes(global_counts, (size_t)E * sizeof(double));
    int32_t *d_index = index ? check_ints_to_device(index, (size_t)N) : NULL;
    float *dlogits = check_random(ne, 0, 1), *d_dlogits = check_device_nan(ne);
    cpu()->moe_router_backward(dlogits, dprobs, logits, idx, kept, aux_counts, global_counts, seq_counts, index, N,
                               &g);
    under()->moe_router_backward(d_dlogits, d_dprobs, d_logits, d_idx, d_kept, d_aux, d_global, d_seq, d_index, N,
                                 &g);
    check_compare(name, "dlogits", dlogits, d_dlogits, ne, TOL_FP32);
    check_free_all();
}

// E, k, score, pre_softmax, topk_scaling, num_groups, group_topk, replay
static const BackwardCase BACKWARDS[] = {
    {"softmax", {8, 2, SCORE_SOFTMAX, 0, 0, 0, 0, 0}, 257, 4, 0},
    {"softmax-pre scaled", {64, 4, SCORE_SOFTMAX, 1, 2.5, 0, 0, 0}, 33, 3, 0},
    {"softmax k=1 indexed", {4, 1, SCORE_SOFTMAX, 0, 0, 0, 0, 0}, 32, 4, 1},
    {"sigmoid", {64, 8, SCORE_SIGMOID, 0, 2.5, 8, 4, 0}, 100, 2, 0},
    {"sigmoid k=1", {5, 1, SCORE_SIGMOID, 0, 0, 0, 0, 0}, 9, 1, 0},
    {"sqrtsoftplus indexed", {16, 4, SCORE_SQRTSOFTPLUS, 0, 0, 0, 0, 0}, 50, 5, 1},
    {"sigmoid DeepSeek-V3", {256, 8, SCORE_SIGMOID, 0, 2.5, 8, 4, 0}, 65, 1, 0},
};



// ---- helpers: outputs of 8-byte words --------------------------------------------------------

// n 8-byte words of 0xff (a NaN as double, −1 as int64) on the backend under test
static void *device_unset_words(size_t n) {
    uint64_t *host = (uint64_t *)check_random_ints(n * 2 + 1, 0, 1);
    memset(host, 0xff, n * sizeof(uint64_t));
    return check_device_bytes(host, n * sizeof(uint64_t));
}

static double *host_doubles(size_t n) { return (double *)check_random_ints(n * 2 + 1, 0, 1); }
static int64_t *host_int64s(size_t n) { return (int64_t *)check_random_ints(n * 2 + 1, 0, 1); }

// normwise as check_compare; NaN where the cpu has none: not written
static void compare_doubles(const char *check, const char *output, const double *cpu, const double *dev, size_t n,
                            double tol) {
    double *got = host_doubles(n), scale = 1e-30, diff = 0;
    check_download(got, dev, n * sizeof(double));
    int unwritten = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) && !isnan(cpu[i])) unwritten = 1;
        scale = fmax(scale, fabs(cpu[i]));
        diff = fmax(diff, fabs(got[i] - cpu[i]));
    }
    check_compare_double(check, output, scale, unwritten ? NAN : scale + diff, tol);
}

// exact; the error is the number that differ
static void compare_int64s(const char *check, const char *output, const int64_t *cpu, const int64_t *dev, size_t n) {
    int64_t *got = host_int64s(n);
    check_download(got, dev, n * sizeof(int64_t));
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) differ += got[i] != cpu[i];
    check_compare_double(check, output, 0, (double)differ, 0);
}

// ---- capacity ----------------------------------------------------------------------------------

typedef struct {
    int choices, E, capacity, by_position, ties;
} CapacityCase;

static void check_capacity(const CapacityCase *c) {
    char name[128];
    snprintf(name, sizeof(name), "moe_router_capacity choices=%d E=%d C=%d %s%s", c->choices, c->E, c->capacity,
             c->by_position ? "position" : "probs", c->ties ? " ties" : "");
    size_t n = (size_t)c->choices;
    int32_t *idx = check_random_ints(n, 0, c->E);
    float *probs = check_random(n, 0, 1);
    if (c->ties)
        for (size_t i = 0; i < n; i++) probs[i] = roundf(probs[i] * 4) / 4;
    int32_t *d_idx = check_ints_to_device(idx, n), *d_kept = check_device_unset_ints(n);
    float *d_probs = check_to_device(probs, n);
    int32_t *kept = check_random_ints(n, 0, 1);
    cpu()->moe_router_capacity(probs, kept, idx, c->choices, c->E, c->capacity, c->by_position);
    under()->moe_router_capacity(d_probs, d_kept, d_idx, c->choices, c->E, c->capacity, c->by_position);
    check_compare_ints(name, "kept", kept, d_kept, n);
    check_compare(name, "topk_probs", probs, d_probs, n, 0.0);
    check_free_all();
}

static const CapacityCase CAPACITIES[] = {
    {64, 4, 10, 0, 0}, {64, 4, 10, 1, 0}, {300, 8, 20, 0, 1}, {300, 8, 20, 1, 1}, {50, 4, -1, 0, 0}, {7, 3, 0, 0, 0},
};

// ---- statistics --------------------------------------------------------------------------------

typedef struct {
    const char *what;
    int N, E, k;
    ScoreFunction score;
    int sequences, indexed;
} StatCase;

static void check_statistics(const StatCase *c) {
    char name[128];
    snprintf(name, sizeof(name), "moe_router_statistics %s N=%d E=%d k=%d", c->what, c->N, c->E, c->k);
    int N = c->N, E = c->E, k = c->k, total = c->indexed ? 2 * N : N, S = (total + c->sequences - 1) / c->sequences;
    size_t ne = (size_t)N * E, nk = (size_t)N * k, se = (size_t)c->sequences * E, rows = se + E;
    RouterStatShape st = {.E = E, .k = k, .score = c->score, .sequences = c->sequences, .seq_length = S};
    float *logits = check_random(ne, -4, 4), *aux_scores = check_random(ne, 0, 1);
    int32_t *idx = distinct_choices(N, E, k), *kept = check_random_ints(nk, 0, 2), *index = NULL;
    if (c->indexed) {
        index = check_random_ints((size_t)N, 0, 1);
        for (int n = 0; n < N; n++) index[n] = 2 * n + (n & 1);
    }
    double *z = host_doubles(1), *columns = host_doubles(se);
    int64_t *counts = host_int64s(rows), *dropped = host_int64s(1);
    int32_t *tokens = check_random_ints((size_t)E, 0, 1);
    cpu()->moe_router_statistics(z, counts, columns, tokens, dropped, logits, aux_scores, idx, kept, index, N, &st);
    double *d_z = device_unset_words(1), *d_columns = device_unset_words(se);
    int64_t *d_counts = device_unset_words(rows), *d_dropped = device_unset_words(1);
    int32_t *d_tokens = check_device_unset_ints((size_t)E);
    under()->moe_router_statistics(d_z, d_counts, d_columns, d_tokens, d_dropped, check_to_device(logits, ne),
                                   check_to_device(aux_scores, ne), check_ints_to_device(idx, nk),
                                   check_ints_to_device(kept, nk), index ? check_ints_to_device(index, N) : NULL, N,
                                   &st);
    compare_doubles(name, "z", z, d_z, 1, TOL_FP32);
    compare_int64s(name, "counts", counts, d_counts, rows);
    compare_doubles(name, "columns", columns, d_columns, se, TOL_FP32);
    check_compare_ints(name, "tokens_per_expert", tokens, d_tokens, (size_t)E);
    compare_int64s(name, "dropped", dropped, d_dropped, 1);
    check_free_all();
}

static const StatCase STATS[] = {
    {"softmax", 257, 8, 2, SCORE_SOFTMAX, 4, 0},
    {"sigmoid indexed", 100, 64, 8, SCORE_SIGMOID, 5, 1},
    {"sqrtsoftplus k=1", 9, 5, 1, SCORE_SQRTSOFTPLUS, 1, 0},
};

// ---- count totals and losses -------------------------------------------------------------------

static void check_totals_and_losses(int E, int sequences, int with_before) {
    char name[128];
    snprintf(name, sizeof(name), "moe_router_count_totals/losses E=%d sequences=%d%s", E, sequences,
             with_before ? " before" : "");
    size_t se = (size_t)sequences * E, rows = se + E, report_n = ROUTER_REPORT_DOUBLES(E);
    int64_t *counts = host_int64s(rows);
    for (size_t i = 0; i < rows; i++) counts[i] = (i * 37) % 23;
    int32_t *seq = check_random_ints(se, 0, 1), *aux = check_random_ints((size_t)E, 0, 1);
    int32_t *group_tokens = check_random_ints((size_t)E, 0, 1);
    int64_t *group64 = host_int64s((size_t)E);
    cpu()->moe_router_count_totals(seq, aux, group_tokens, group64, counts, sequences, E);
    int32_t *d_seq = check_device_unset_ints(se), *d_aux = check_device_unset_ints((size_t)E);
    int32_t *d_group_tokens = check_device_unset_ints((size_t)E);
    int64_t *d_group64 = device_unset_words((size_t)E);
    under()->moe_router_count_totals(d_seq, d_aux, d_group_tokens, d_group64,
                                     check_device_bytes(counts, rows * sizeof(int64_t)), sequences, E);
    check_compare_ints(name, "seq_counts", seq, d_seq, se);
    check_compare_ints(name, "aux_counts", aux, d_aux, (size_t)E);
    check_compare_ints(name, "group_tokens_per_expert", group_tokens, d_group_tokens, (size_t)E);
    compare_int64s(name, "group_counts64", group64, d_group64, (size_t)E);

    RouterLossShape ls = {.E = E, .k = 2, .tokens = 64 * sequences, .seq_length = 64, .sequences = sequences,
                          .batches = with_before ? 3 : 1};
    double *before = host_doubles((size_t)E), *columns = host_doubles(se), *z = host_doubles(1);
    for (int e = 0; e < E; e++) before[e] = 5.0 * e;
    for (size_t i = 0; i < se; i++) columns[i] = 0.1 * (double)(i % 17);
    *z = 123.5;
    int64_t dropped = 7;
    int32_t *tokens = check_random_ints((size_t)E, 0, 40);
    double *report = host_doubles(report_n), *group = host_doubles((size_t)E), *global = host_doubles((size_t)E);
    cpu()->moe_router_losses(report, group, global, group64, with_before ? before : NULL, columns, seq, aux, z,
                             &dropped, tokens, group_tokens, &ls);
    double *d_report = device_unset_words(report_n), *d_group = device_unset_words((size_t)E);
    double *d_global = device_unset_words((size_t)E);
    under()->moe_router_losses(d_report, d_group, d_global, check_device_bytes(group64, E * sizeof(int64_t)),
                               with_before ? check_device_bytes(before, E * sizeof(double)) : NULL,
                               check_device_bytes(columns, se * sizeof(double)), check_ints_to_device(seq, se),
                               check_ints_to_device(aux, (size_t)E), check_device_bytes(z, sizeof(double)),
                               check_device_bytes(&dropped, sizeof(int64_t)), check_ints_to_device(tokens, (size_t)E),
                               check_ints_to_device(group_tokens, (size_t)E), &ls);
    compare_doubles(name, "report", report, d_report, report_n, TOL_FP32);
    compare_doubles(name, "group_counts", group, d_group, (size_t)E, 0.0);
    compare_doubles(name, "global_counts", global, d_global, (size_t)E, 0.0);
    check_free_all();
}

// ---- jitter product, shared-expert gate ---------------------------------------------------------

static void check_elementwise(size_t n) {
    char name[96];
    snprintf(name, sizeof(name), "moe_scale_by/gate n=%zu", n);
    float *x = check_random(n, -3, 3), *scale = check_random(n, 0.9f, 1.1f), *gate = check_random(n, -6, 6);
    float *dgate = check_random(n, -1, 1), *y = check_random(n, 0, 1);
    float *d_y = check_device_nan(n), *d_gate = check_to_device(gate, n), *d_dgate = check_to_device(dgate, n);
    float *d_x = check_to_device(x, n), *d_scale = check_to_device(scale, n);
    cpu()->moe_scale_by(y, x, scale, n);
    under()->moe_scale_by(d_y, d_x, d_scale, n);
    check_compare(name, "y", y, d_y, n, 0.0);
    under()->moe_scale_by(d_x, d_x, d_scale, n);  // in place
    check_compare(name, "y in place", y, d_x, n, 0.0);
    cpu()->moe_gate_sigmoid(gate, n);
    under()->moe_gate_sigmoid(d_gate, n);
    check_compare(name, "gate", gate, d_gate, n, TOL_FP32);
    float *d_gate_cpu = check_to_device(gate, n);  // the cpu's gate, so only the backward is compared
    cpu()->moe_gate_sigmoid_backward(dgate, gate, n);
    under()->moe_gate_sigmoid_backward(d_dgate, d_gate_cpu, n);
    check_compare(name, "dgate", dgate, d_dgate, n, TOL_FP32);
    check_free_all();
}

static void check_expert_bias(int E) {
    char name[96];
    snprintf(name, sizeof(name), "moe_expert_bias_update E=%d", E);
    float *bias = check_random((size_t)E, -0.1f, 0.1f), *d_bias = check_to_device(bias, (size_t)E);
    double *counts = host_doubles((size_t)E);
    for (int e = 0; e < E; e++) counts[e] = (double)((e * 7) % 5);
    cpu()->moe_expert_bias_update(bias, counts, E, 0.001);
    under()->moe_expert_bias_update(d_bias, check_device_bytes(counts, E * sizeof(double)), E, 0.001);
    check_compare(name, "bias", bias, d_bias, (size_t)E, 0.0);
    check_free_all();
}

// ---- Sinkhorn routing ----------------------------------------------------------------------------

static void check_sinkhorn(int N, int E, int k) {
    char name[96];
    snprintf(name, sizeof(name), "moe_router_sinkhorn N=%d E=%d k=%d", N, E, k);
    size_t ne = (size_t)N * E, nk = (size_t)N * k, work = ne + N + 2 * (size_t)E;
    float *logits = check_random(ne, -3, 3), *d_logits = check_to_device(logits, ne);
    int32_t *idx = check_random_ints(nk, 0, 1), *d_idx = check_device_unset_ints(nk);
    double *host_work = host_doubles(work);
    cpu()->moe_router_sinkhorn(idx, host_work, logits, N, E, k);
    under()->moe_router_sinkhorn(d_idx, check_device_bytes(host_work, work * sizeof(double)), d_logits, N, E, k);
    check_compare_ints(name, "topk_idx", idx, d_idx, nk);
    check_free_all();
}

// ---- quantile balancing --------------------------------------------------------------------------

static void check_quantile(int N, int E, int k, int with_quantile) {
    char name[96];
    snprintf(name, sizeof(name), "moe_router_quantile N=%d E=%d k=%d%s", N, E, k, with_quantile ? " quantile" : "");
    size_t ne = (size_t)N * E, nk = (size_t)N * k, work = ne + N;
    float *logits = check_random(ne, -3, 3), *bias = check_random((size_t)E, -0.5f, 0.5f);
    float *d_logits = check_to_device(logits, ne), *d_bias = check_to_device(bias, (size_t)E);
    int32_t *idx = check_random_ints(nk, 0, 1), *d_idx = check_device_unset_ints(nk);
    float *q = with_quantile ? check_random((size_t)E, 0, 1) : NULL;
    float *d_q = with_quantile ? check_device_nan((size_t)E) : NULL;
    double *host_work = host_doubles(work);
    cpu()->moe_router_quantile(idx, q, host_work, logits, bias, N, E, k);
    under()->moe_router_quantile(d_idx, d_q, check_device_bytes(host_work, work * sizeof(double)), d_logits, d_bias, N,
                                 E, k);
    check_compare_ints(name, "topk_idx", idx, d_idx, nk);
    if (with_quantile) check_compare(name, "quantile", q, d_q, (size_t)E, 0.0);
    check_free_all();
}

void check_router_ops(void) {
    check_quantile(8, 4, 1, 1);
    check_quantile(256, 16, 2, 1);
    check_quantile(64, 8, 3, 0);
    check_sinkhorn(1, 1, 1);
    check_sinkhorn(64, 8, 2);
    check_sinkhorn(300, 16, 1);
    check_expert_bias(4);
    check_expert_bias(64);
    check_elementwise(1);
    check_elementwise(1000);
    for (int i = 0; i < COUNT(BACKWARDS); i++) check_backward(&BACKWARDS[i]);
    for (int i = 0; i < COUNT(CAPACITIES); i++) check_capacity(&CAPACITIES[i]);
    for (int i = 0; i < COUNT(STATS); i++) check_statistics(&STATS[i]);
    check_totals_and_losses(4, 2, 0);
    check_totals_and_losses(64, 3, 1);
}

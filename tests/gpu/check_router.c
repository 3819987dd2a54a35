// check_router.c — the backend under test's ops of ops_router.h (router capacity, counts, balancing statistics and losses, router backward)
// against the cpu backend (op_check.h).
//
// The router backward's gradients may differ from the cpu's in the last bits of exp/log:
// TOL_FP32. Cases cover every score function, softmax before / after top-k, dropped choices,
// balance and z-loss factors, sequences spread over a token group (token_first, token_index).
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

// E, k, score, pre_softmax, topk_scaling, num_groups, group_topk
static const BackwardCase BACKWARDS[] = {
    {"softmax", {8, 2, SCORE_SOFTMAX, 0, 0, 0, 0}, 257, 4, 0},
    {"softmax-pre scaled", {64, 4, SCORE_SOFTMAX, 1, 2.5, 0, 0}, 33, 3, 0},
    {"softmax k=1 indexed", {4, 1, SCORE_SOFTMAX, 0, 0, 0, 0}, 32, 4, 1},
    {"sigmoid", {64, 8, SCORE_SIGMOID, 0, 2.5, 8, 4}, 100, 2, 0},
    {"sigmoid k=1", {5, 1, SCORE_SIGMOID, 0, 0, 0, 0}, 9, 1, 0},
    {"sqrtsoftplus indexed", {16, 4, SCORE_SQRTSOFTPLUS, 0, 0, 0, 0}, 50, 5, 1},
    {"sigmoid DeepSeek-V3", {256, 8, SCORE_SIGMOID, 0, 2.5, 8, 4}, 65, 1, 0},
};

void check_router_ops(void) {
    for (int i = 0; i < COUNT(BACKWARDS); i++) check_backward(&BACKWARDS[i]);
}

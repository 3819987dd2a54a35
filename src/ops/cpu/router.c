// router.c — the cpu backend's router ops (contracts in ops_router.h): the router backward.
// OpenMP over tokens; every token's result is computed by one thread in a fixed order.
#include "ops/cpu/cpu_ops.h"
#include "ops/moe_route.h"

void cpu_moe_router_backward(real *dlogits, const real *dprobs, const real *logits, const int32_t *topk_idx,
                             const int32_t *kept, const int32_t *aux_counts, const double *global_counts,
                             const int32_t *seq_counts, const int32_t *token_index, int N,
                             const RouterGradShape *g) {
    int E = g->route.E, k = g->route.k;
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {
        double s[E], dl[E], ds[E], grad[E], dp[k], q[k];
        int b = route_sequence_of(token_index, g->token_first, g->seq_length, n);
        route_backward_token(dl, logits + (size_t)n * E, dprobs + (size_t)n * k, kept + (size_t)n * k,
                             topk_idx + (size_t)n * k, aux_counts, global_counts, seq_counts + (size_t)b * E, g, s,
                             ds, grad, dp, q);
        for (int e = 0; e < E; e++) dlogits[(size_t)n * E + e] = (real)dl[e];
    }
}

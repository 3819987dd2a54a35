// router.cu — the cuda backend's router ops (contracts in ops_router.h, cpu twins in
// src/ops/cpu/router.c). Every output has one owning thread that computes it with the
// formulas of ops/moe_route.h in the cpu's order (deterministic; the cpu's results but for
// the last bits of exp/log).
#include "ops/cuda/cuda_internal.h"
#include "ops/moe_route.h"

constexpr size_t ROUTER_SMEM = 48 * 1024;  // dynamic shared memory without an opt-in
constexpr int ROUTER_THREADS = 64;         // tokens per block at most

// ---- router backward: one thread per token ------------------------------------------------------

// doubles of one token's scratch: s, dl, ds, grad (E each), dp, q (k each)
__host__ __device__ static size_t backward_scratch(int E, int k) { return (size_t)4 * E + 2 * (size_t)k; }

// Thread t of the block owns token n = blockIdx.x · blockDim.x + t and its slice of shared memory.
__global__ void router_backward_kernel(float *dlogits, const float *dprobs, const float *logits,
                                       const int32_t *topk_idx, const int32_t *kept, const int32_t *aux_counts,
                                       const double *global_counts, const int32_t *seq_counts,
                                       const int32_t *token_index, int N, RouterGradShape g) {
    extern __shared__ double router_smem[];
    int E = g.route.E, k = g.route.k;
    long n = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    double *s = router_smem + threadIdx.x * backward_scratch(E, k), *dl = s + E, *ds = dl + E, *grad = ds + E;
    double *dp = grad + E, *q = dp + k;
    int b = route_sequence_of(token_index, g.token_first, g.seq_length, (int)n);
    route_backward_token(dl, logits + (size_t)n * E, dprobs + (size_t)n * k, kept + (size_t)n * k,
                         topk_idx + (size_t)n * k, aux_counts, global_counts, seq_counts + (size_t)b * E, &g, s, ds,
                         grad, dp, q);
    for (int e = 0; e < E; e++) dlogits[(size_t)n * E + e] = (float)dl[e];
}

void cuda_moe_router_backward(real *dlogits, const real *dprobs, const real *logits, const int32_t *topk_idx,
                              const int32_t *kept, const int32_t *aux_counts, const double *global_counts,
                              const int32_t *seq_counts, const int32_t *token_index, int N,
                              const RouterGradShape *g) {
    if (N <= 0 || g->route.E <= 0) return;
    size_t per_token = backward_scratch(g->route.E, g->route.k) * sizeof(double);
    if (per_token > ROUTER_SMEM) mt_die("router backward: %d experts need %zu bytes of shared memory per token",
                                        g->route.E, per_token);
    int threads = (int)(ROUTER_SMEM / per_token);
    threads = threads < ROUTER_THREADS ? threads : ROUTER_THREADS;
    unsigned blocks = (unsigned)((N + threads - 1) / threads);
    router_backward_kernel<<<blocks, threads, threads * per_token, cuda_stream()>>>(
        dlogits, dprobs, logits, topk_idx, kept, aux_counts, global_counts, seq_counts, token_index, N, *g);
    CUDA_CHECK_LAUNCH();
}

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

// ---- capacity: one thread per choice ------------------------------------------------------------
// A choice's rank among its expert's: the choices before it (by_position), or those of a
// larger prob or an equal prob and an earlier choice — the place qsort gives it on the cpu.

__global__ void capacity_kept_kernel(int32_t *kept, const float *probs, const int32_t *topk_idx, int choices, int E,
                                     int capacity, int by_position) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < choices; i += (long)gridDim.x * blockDim.x) {
        int e = topk_idx[i];
        if (capacity < 0 || e < 0 || e >= E) {
            kept[i] = 1;
            continue;
        }
        float p = probs[i];
        long rank = 0;
        for (long j = 0; j < choices; j++) {
            if (j == i || topk_idx[j] != e) continue;
            rank += by_position ? j < i : probs[j] > p || (probs[j] == p && j < i);
        }
        kept[i] = rank < capacity;
    }
}

__global__ void capacity_drop_kernel(float *probs, const int32_t *kept, int choices) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < choices; i += (long)gridDim.x * blockDim.x)
        if (!kept[i]) probs[i] = 0.0f;
}

void cuda_moe_router_capacity(real *topk_probs, int32_t *kept, const int32_t *topk_idx, int choices, int E,
                              int capacity, int by_position) {
    if (choices <= 0) return;
    unsigned blocks = cuda_blocks((size_t)choices, 256);
    capacity_kept_kernel<<<blocks, 256, 0, cuda_stream()>>>(kept, topk_probs, topk_idx, choices, E, capacity,
                                                           by_position);
    CUDA_CHECK_LAUNCH();
    capacity_drop_kernel<<<blocks, 256, 0, cuda_stream()>>>(topk_probs, kept, choices);
    CUDA_CHECK_LAUNCH();
}

// ---- Sinkhorn routing ----------------------------------------------------------------------------

constexpr int SINKHORN_THREADS = 256;

// One block: threads over rows, then over columns, each sum in index order; thread 0 decides
// convergence from the round's changes in expert order (the cpu's rounds exactly).
__global__ void sinkhorn_kernel(int32_t *topk_idx, double *work, const float *logits, int N, int E, int k) {
    __shared__ int converged;
    double *cost = work, *d0 = cost + (size_t)N * E, *d1 = d0 + N, *diff = d1 + E;
    for (size_t i = threadIdx.x; i < (size_t)N * E; i += SINKHORN_THREADS) cost[i] = exp((double)logits[i]);
    for (int e = threadIdx.x; e < E; e += SINKHORN_THREADS) d1[e] = 1;
    __syncthreads();
    for (int round = 0; round < ROUTE_SINKHORN_MAX_ROUNDS; round++) {
        for (int n = threadIdx.x; n < N; n += SINKHORN_THREADS) {
            double sum = 0;
            for (int e = 0; e < E; e++) sum += d1[e] * cost[(size_t)n * E + e];
            d0[n] = route_sinkhorn_scale(sum, N);
        }
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += SINKHORN_THREADS) {
            double sum = 0;
            for (int n = 0; n < N; n++) sum += d0[n] * cost[(size_t)n * E + e];
            double next = route_sinkhorn_scale(sum, E);
            diff[e] = fabs(d1[e] - next);
            d1[e] = next;
        }
        __syncthreads();
        if (threadIdx.x == 0) converged = route_sinkhorn_converged(diff, E);
        __syncthreads();
        if (converged) break;
    }
    for (int n = threadIdx.x; n < N; n += SINKHORN_THREADS) {
        double *row = cost + (size_t)n * E;
        for (int e = 0; e < E; e++) row[e] = d1[e] * row[e] * d0[n];
        route_topk(topk_idx + (size_t)n * k, row, NULL, E, k);
    }
}

void cuda_moe_router_sinkhorn(int32_t *topk_idx, double *work, const real *logits, int N, int E, int k) {
    if (N <= 0) return;
    sinkhorn_kernel<<<1, SINKHORN_THREADS, 0, cuda_stream()>>>(topk_idx, work, logits, N, E, k);
    CUDA_CHECK_LAUNCH();
}

// ---- quantile balancing -------------------------------------------------------------------------

// One thread per token: its picks and threshold a_n (its row of rows as scratch).
__global__ void quantile_picks_kernel(int32_t *topk_idx, double *rows, double *threshold, const float *logits,
                                      const float *beta, int N, int E, int k) {
    long n = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    threshold[n] = route_quantile_token(topk_idx + n * k, logits + n * E, beta, E, k, rows + n * E);
}

// One thread per expert: its column's values (floats in its part of rows) and their (target+1)-th largest.
__global__ void quantile_columns_kernel(float *quantile, double *rows, const double *threshold, const float *logits,
                                        int N, int E, int target) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    float *x = (float *)(rows + (size_t)e * N);
    for (int n = 0; n < N; n++) x[n] = logits[(size_t)n * E + e] - (float)threshold[n];
    quantile[e] = route_select_descending(x, N, target);
}

void cuda_moe_router_quantile(int32_t *topk_idx, real *quantile, double *work, const real *logits, const real *beta,
                              int N, int E, int k) {
    if (N <= 0) return;
    double *rows = work, *threshold = work + (size_t)N * E;
    quantile_picks_kernel<<<cuda_blocks((size_t)N, 128), 128, 0, cuda_stream()>>>(topk_idx, rows, threshold, logits,
                                                                                  beta, N, E, k);
    CUDA_CHECK_LAUNCH();
    if (!quantile) return;
    quantile_columns_kernel<<<cuda_blocks((size_t)E, 64), 64, 0, cuda_stream()>>>(quantile, rows, threshold, logits, N,
                                                                                  E, (int)((int64_t)N * k / E));
    CUDA_CHECK_LAUNCH();
}

// ---- statistics ---------------------------------------------------------------------------------

constexpr int Z_THREADS = 256;

// z[0] = Σ_n lse(logits_n)²: one block; thread t sums tokens t, t + 256, ... in order, then a
// fixed tree over the threads (deterministic).
__global__ void z_sum_kernel(double *z, const float *logits, int N, int E) {
    __shared__ double part[Z_THREADS];
    double sum = 0;
    for (int n = threadIdx.x; n < N; n += Z_THREADS) {
        double lse = route_row_lse(logits + (size_t)n * E, E);
        sum += lse * lse;
    }
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int half = Z_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) *z = part[0];
}

// tokens_per_expert (E, zeroed) and dropped (zeroed) from the choices (integer atomics: exact)
__global__ void kept_counts_kernel(int32_t *tokens_per_expert, unsigned long long *dropped, const int32_t *topk_idx,
                                   const int32_t *kept, int choices) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < choices; i += (long)gridDim.x * blockDim.x) {
        if (kept[i]) atomicAdd(&tokens_per_expert[topk_idx[i]], 1);
        else atomicAdd(dropped, 1ull);
    }
}

// doubles of one token's scratch for the top-k of ŝ: s, aux (E each), then idx (k int32)
__host__ __device__ static size_t topk_scratch(int E, int k) { return (size_t)2 * E + ((size_t)k + 1) / 2; }

// counts (sequences + 1, E, zeroed): thread → token n, the top-k of its ŝ into its sequence's row
__global__ void sequence_counts_kernel(unsigned long long *counts, const float *logits, const int32_t *token_index,
                                       int N, RouterStatShape st) {
    extern __shared__ double router_smem[];
    int E = st.E, k = st.k;
    long n = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    double *s = router_smem + threadIdx.x * topk_scratch(E, k), *aux = s + E;
    int32_t *idx = (int32_t *)(aux + E);
    int b = route_sequence_of(token_index, st.token_first, st.seq_length, (int)n);
    route_score_row(s, logits + (size_t)n * E, E, st.score);
    route_aux_score_row(aux, s, E, st.score);
    route_topk(idx, aux, NULL, E, k);
    for (int j = 0; j < k; j++) atomicAdd(&counts[(size_t)b * E + idx[j]], 1ull);
}

// columns (sequences, E): thread → (b, e), the tokens of sequence b in order; and the last
// row of counts from tokens_per_expert (threads of b = 0)
__global__ void sequence_columns_kernel(double *columns, long long *counts, const float *aux_scores,
                                        const int32_t *tokens_per_expert, const int32_t *token_index, int N,
                                        RouterStatShape st) {
    int E = st.E;
    long cell = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (cell >= (long)st.sequences * E) return;
    int b = (int)(cell / E), e = (int)(cell % E);
    double sum = 0;
    for (int n = 0; n < N; n++)
        if (route_sequence_of(token_index, st.token_first, st.seq_length, n) == b) sum += aux_scores[(size_t)n * E + e];
    columns[cell] = sum;
    if (b == 0) counts[(size_t)st.sequences * E + e] = tokens_per_expert[e];
}

void cuda_moe_router_statistics(double *z, int64_t *counts, double *columns, int32_t *tokens_per_expert,
                                int64_t *dropped, const real *logits, const real *aux_scores,
                                const int32_t *topk_idx, const int32_t *kept, const int32_t *token_index, int N,
                                const RouterStatShape *s) {
    int E = s->E, k = s->k, choices = N * k;
    cudaStream_t st = cuda_stream();
    CUDA_CHECK(cudaMemsetAsync(counts, 0, (size_t)(s->sequences + 1) * E * sizeof(int64_t), st));
    CUDA_CHECK(cudaMemsetAsync(tokens_per_expert, 0, E * sizeof(int32_t), st));
    CUDA_CHECK(cudaMemsetAsync(dropped, 0, sizeof(int64_t), st));
    z_sum_kernel<<<1, Z_THREADS, 0, st>>>(z, logits, N, E);
    CUDA_CHECK_LAUNCH();
    if (choices > 0) {
        kept_counts_kernel<<<cuda_blocks((size_t)choices, 256), 256, 0, st>>>(
            tokens_per_expert, (unsigned long long *)dropped, topk_idx, kept, choices);
        CUDA_CHECK_LAUNCH();
    }
    if (N > 0) {
        size_t per_token = topk_scratch(E, k) * sizeof(double);
        if (per_token > ROUTER_SMEM) mt_die("router statistics: %d experts need %zu bytes of shared memory per token",
                                            E, per_token);
        int threads = (int)(ROUTER_SMEM / per_token);
        threads = threads < ROUTER_THREADS ? threads : ROUTER_THREADS;
        sequence_counts_kernel<<<(unsigned)((N + threads - 1) / threads), threads, threads * per_token, st>>>(
            (unsigned long long *)counts, logits, token_index, N, *s);
        CUDA_CHECK_LAUNCH();
    }
    long cells = (long)s->sequences * E;
    if (cells > 0) {
        sequence_columns_kernel<<<cuda_blocks((size_t)cells, 128), 128, 0, st>>>(
            columns, (long long *)counts, aux_scores, tokens_per_expert, token_index, N, *s);
        CUDA_CHECK_LAUNCH();
    }
}

// ---- count totals: one thread per expert --------------------------------------------------------

__global__ void count_totals_kernel(int32_t *seq_counts, int32_t *aux_counts, int32_t *group_tokens_per_expert,
                                    long long *group_counts64, const long long *counts, int sequences, int E) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    int32_t total = 0;
    for (int b = 0; b < sequences; b++) {
        seq_counts[(size_t)b * E + e] = (int32_t)counts[(size_t)b * E + e];
        total += (int32_t)counts[(size_t)b * E + e];
    }
    aux_counts[e] = total;
    if (group_tokens_per_expert) group_tokens_per_expert[e] = (int32_t)counts[(size_t)sequences * E + e];
    group_counts64[e] = total;
}

void cuda_moe_router_count_totals(int32_t *seq_counts, int32_t *aux_counts, int32_t *group_tokens_per_expert,
                                  int64_t *group_counts64, const int64_t *counts, int sequences, int E) {
    if (E <= 0) return;
    count_totals_kernel<<<(unsigned)((E + 127) / 128), 128, 0, cuda_stream()>>>(
        seq_counts, aux_counts, group_tokens_per_expert, (long long *)group_counts64, (const long long *)counts,
        sequences, E);
    CUDA_CHECK_LAUNCH();
}

// ---- losses: the counts per expert, then one thread for the sums (the cpu's order) --------------

__global__ void loss_counts_kernel(double *report, double *group_counts, double *global_counts,
                                   const long long *group_counts64, const double *before,
                                   const int32_t *tokens_per_expert, const int32_t *group_tokens_per_expert,
                                   RouterLossShape s) {
    int E = s.E, e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    double g = (double)group_counts64[e];
    group_counts[e] = g;
    global_counts[e] = ((before ? before[e] : 0) + g) / s.batches;
    double *rows = report + REPORT_FIXED;
    rows[e] = tokens_per_expert[e];
    rows[E + e] = group_tokens_per_expert ? group_tokens_per_expert[e] : 0;
    rows[2 * E + e] = g;
}

__global__ void loss_values_kernel(double *report, const double *global_counts, const double *columns,
                                   const int32_t *seq_counts, const int32_t *aux_counts, const double *z,
                                   const long long *dropped, RouterLossShape s) {
    route_balance_losses(report, columns, seq_counts, aux_counts, global_counts, &s);
    report[REPORT_Z_LOSS] = *z / s.tokens;
    report[REPORT_DROPPED] = (double)*dropped;
}

void cuda_moe_router_losses(double *report, double *group_counts, double *global_counts,
                            const int64_t *group_counts64, const double *before, const double *columns,
                            const int32_t *seq_counts, const int32_t *aux_counts, const double *z,
                            const int64_t *dropped, const int32_t *tokens_per_expert,
                            const int32_t *group_tokens_per_expert, const RouterLossShape *s) {
    cudaStream_t st = cuda_stream();
    if (s->E > 0) {
        loss_counts_kernel<<<(unsigned)((s->E + 127) / 128), 128, 0, st>>>(
            report, group_counts, global_counts, (const long long *)group_counts64, before, tokens_per_expert,
            group_tokens_per_expert, *s);
        CUDA_CHECK_LAUNCH();
    }
    loss_values_kernel<<<1, 1, 0, st>>>(report, global_counts, columns, seq_counts, aux_counts, z,
                                        (const long long *)dropped, *s);
    CUDA_CHECK_LAUNCH();
}

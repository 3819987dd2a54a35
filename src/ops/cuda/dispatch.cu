// dispatch.cu — the cuda backend's dispatch ops (contracts in ops_dispatch.h, cpu twins in
// src/ops/cpu/dispatch_ops.c). Every output is an integer or a copied row, so the results
// are the cpu's exactly:
//   * the plan: one block per expert walks the choices in order in chunks of its threads,
//     an exclusive scan of "this choice is a kept one of mine" giving each its row — the
//     cpu's stable counting sort, no atomics (an aligned plan walks tokens, with a second
//     scan for its padding tokens);
//   * the EP layout sums a few hundred counts on one thread, in the cpu's order;
//   * the segment sort: one block per segment finds where it starts in both orders and copies.
#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/cuda_ops.h"

constexpr int PLAN_THREADS = 256;
constexpr int FLAT_THREADS = 256;
constexpr int SEGMENT_THREADS = 256;

// Exclusive prefix sum of one int per thread over the block (PLAN_THREADS of them); *total:
// the block's sum. Every thread of the block must call it.
__device__ int block_exclusive_scan(int v, int *total) {
    __shared__ int buf[PLAN_THREADS];
    int t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    for (int offset = 1; offset < PLAN_THREADS; offset <<= 1) {
        int add = t >= offset ? buf[t - offset] : 0;
        __syncthreads();
        buf[t] += add;
        __syncthreads();
    }
    int inclusive = buf[t];
    *total = buf[PLAN_THREADS - 1];
    __syncthreads();  // the next call overwrites buf
    return inclusive - v;
}

// Expert e's kept choices in (token, choice) order: their number, and with row_of_choice
// non-NULL each one's row (first + its rank) written with its token.
__device__ int walk_expert(int e, const int32_t *topk_idx, const int32_t *kept, int choices, int k, int first,
                           int end, int32_t *row_of_choice, int32_t *token_of_row) {
    int base = 0;
    for (int c0 = 0; c0 < choices; c0 += PLAN_THREADS) {
        int i = c0 + threadIdx.x;
        int mine = i < choices && topk_idx[i] == e && (!kept || kept[i]);
        int chunk;
        int rank = base + block_exclusive_scan(mine, &chunk);
        if (mine && row_of_choice) {
            int row = first + rank;
            row_of_choice[i] = row;
            if (row < end) token_of_row[row] = i / k;  // row ≥ end: more than capacity (a broken contract)
        }
        base += chunk;
    }
    return base;
}

// tokens (E): kept choices per expert; blocks grid-stride over the experts.
__global__ void plan_count_kernel(int32_t *tokens, const int32_t *topk_idx, const int32_t *kept, int choices, int k,
                                  int E) {
    for (int e = blockIdx.x; e < E; e += gridDim.x) {
        int n = walk_expert(e, topk_idx, kept, choices, k, 0, 0, NULL, NULL);
        if (threadIdx.x == 0) tokens[e] = n;
    }
}

// rows_per_expert and expert_offsets from the counts, on one thread in expert order.
__global__ void plan_offsets_kernel(int32_t *rows_per_expert, int32_t *expert_offsets, const int32_t *tokens, int N,
                                    int E, int capacity, int align) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    expert_offsets[0] = 0;
    for (int e = 0; e < E; e++) {
        rows_per_expert[e] = capacity > 0 ? capacity : align > 1 ? dispatch_aligned_rows(tokens[e], N, align) : tokens[e];
        expert_offsets[e + 1] = expert_offsets[e] + rows_per_expert[e];
    }
}

// Each expert's rows: its kept choices in order, then its padding rows (−1).
__global__ void plan_rows_kernel(int32_t *row_of_choice, int32_t *token_of_row, const int32_t *expert_offsets,
                                 const int32_t *tokens, const int32_t *topk_idx, const int32_t *kept, int choices,
                                 int k, int E) {
    for (int e = blockIdx.x; e < E; e += gridDim.x) {
        int first = expert_offsets[e], end = expert_offsets[e + 1];
        walk_expert(e, topk_idx, kept, choices, k, first, end, row_of_choice, token_of_row);
        for (int row = first + tokens[e] + threadIdx.x; row < end; row += blockDim.x) token_of_row[row] = -1;
    }
}

// An aligned plan's rows of expert e (one block per expert, grid-stride): walking the tokens
// in chunks of the block's threads, a token takes a row when it has a kept choice of e, or
// when it has none and is among the first (rows − kept choices) such tokens; two exclusive
// scans give "tokens without a choice before me" and "rows before me" — the cpu's walk.
__global__ void plan_rows_aligned_kernel(int32_t *row_of_choice, int32_t *token_of_row, const int32_t *expert_offsets,
                                         const int32_t *tokens, const int32_t *topk_idx, const int32_t *kept, int N,
                                         int k, int E) {
    for (int e = blockIdx.x; e < E; e += gridDim.x) {
        int first = expert_offsets[e], padding = expert_offsets[e + 1] - first - tokens[e];
        int rows_before = 0, others_before = 0;
        for (int n0 = 0; n0 < N; n0 += PLAN_THREADS) {
            int n = n0 + threadIdx.x, choice = -1;
            for (int j = 0; n < N && j < k; j++) {
                int i = n * k + j;
                if (topk_idx[i] == e && (!kept || kept[i])) choice = i;
            }
            int other = n < N && choice < 0, others_chunk, rows_chunk;
            int other_rank = others_before + block_exclusive_scan(other, &others_chunk);
            int takes = choice >= 0 || (other && other_rank < padding);
            int row = first + rows_before + block_exclusive_scan(takes, &rows_chunk);
            if (takes) {
                token_of_row[row] = n;
                if (choice >= 0) row_of_choice[choice] = row;
            }
            others_before += others_chunk;
            rows_before += rows_chunk;
        }
    }
}

// Dropped choices get no row.
__global__ void plan_dropped_kernel(int32_t *row_of_choice, const int32_t *kept, int choices) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < choices; i += gridDim.x * blockDim.x)
        if (!kept[i]) row_of_choice[i] = -1;
}

static CudaScratch plan_scratch;  // tokens (E)

void cuda_moe_dispatch_plan(int32_t *rows_per_expert, int32_t *expert_offsets, int32_t *row_of_choice,
                            int32_t *token_of_row, const int32_t *topk_idx, const int32_t *kept, int N, int k, int E,
                            int capacity, int align) {
    MT_ASSERT(capacity == 0 || align <= 1);
    if (E <= 0) return;
    int choices = N * k;
    int32_t *tokens = (int32_t *)scratch_reserve(&plan_scratch, (size_t)E * sizeof(int32_t));
    unsigned blocks = (unsigned)(E < 65535 ? E : 65535);
    plan_count_kernel<<<blocks, PLAN_THREADS, 0, cuda_stream()>>>(tokens, topk_idx, kept, choices, k, E);
    CUDA_CHECK_LAUNCH();
    plan_offsets_kernel<<<1, 1, 0, cuda_stream()>>>(rows_per_expert, expert_offsets, tokens, N, E, capacity, align);
    CUDA_CHECK_LAUNCH();
    if (choices <= 0 && capacity <= 0) return;
    if (align > 1)
        plan_rows_aligned_kernel<<<blocks, PLAN_THREADS, 0, cuda_stream()>>>(row_of_choice, token_of_row,
                                                                             expert_offsets, tokens, topk_idx, kept, N,
                                                                             k, E);
    else
        plan_rows_kernel<<<blocks, PLAN_THREADS, 0, cuda_stream()>>>(row_of_choice, token_of_row, expert_offsets,
                                                                     tokens, topk_idx, kept, choices, k, E);
    CUDA_CHECK_LAUNCH();
    if (!kept || choices <= 0) return;
    plan_dropped_kernel<<<cuda_blocks((size_t)choices, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(
        row_of_choice, kept, choices);
    CUDA_CHECK_LAUNCH();
}

// ---- the allgather dispatcher's own choices ------------------------------------------------------

__global__ void keep_local_kernel(int32_t *kept, const int32_t *topk_idx, size_t n, int first, int local) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int e = topk_idx[i];
        kept[i] = kept[i] && e >= first && e < first + local;
    }
}

void cuda_moe_keep_local_choices(int32_t *kept, const int32_t *topk_idx, size_t n, int first, int local) {
    if (n == 0) return;
    keep_local_kernel<<<cuda_blocks(n, FLAT_THREADS), FLAT_THREADS, 0, cuda_stream()>>>(kept, topk_idx, n, first,
                                                                                       local);
    CUDA_CHECK_LAUNCH();
}

// ---- the alltoall exchange layout ----------------------------------------------------------------

__global__ void ep_layout_kernel(int32_t *counts, int32_t *offsets, int32_t *sizes, const int32_t *own_counts,
                                 const int32_t *recv_counts, const int32_t *expert_offsets, int P, int L, int S) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
        ep_layout_compute(counts, offsets, sizes, own_counts, recv_counts, expert_offsets, P, L, S);
}

void cuda_moe_ep_layout(int32_t *counts, int32_t *offsets, int32_t *sizes, const int32_t *own_counts,
                        const int32_t *recv_counts, const int32_t *expert_offsets, int P, int L, int S) {
    MT_ASSERT(P > 0 && S % P == 0);
    ep_layout_kernel<<<1, 1, 0, cuda_stream()>>>(counts, offsets, sizes, own_counts, recv_counts, expert_offsets, P,
                                                 L, S);
    CUDA_CHECK_LAUNCH();
}

// ---- segments between arrival and expert-major order ---------------------------------------------

// Block → segment seg = s·L + le (grid-stride): thread 0 finds its first row in arrival
// order (the segments before it) and sorted order (offsets[le] + its expert's earlier
// sources), then the block copies its rows.
__global__ void sort_segments_kernel(float *dst, const float *src, const int32_t *recv_counts,
                                     const int32_t *offsets, int S, int L, int width, int to_expert_major) {
    __shared__ size_t from, to, n;
    for (int seg = blockIdx.x; seg < S * L; seg += gridDim.x) {
        if (threadIdx.x == 0) {
            int s = seg / L, le = seg % L;
            size_t arrival = 0, sorted = (size_t)offsets[le];
            for (int i = 0; i < seg; i++) arrival += (size_t)recv_counts[i];
            for (int q = 0; q < s; q++) sorted += (size_t)recv_counts[q * L + le];
            from = to_expert_major ? arrival : sorted;
            to = to_expert_major ? sorted : arrival;
            n = (size_t)recv_counts[seg] * width;
        }
        __syncthreads();
        const float *a = src + from * width;
        float *b = dst + to * width;
        for (size_t i = threadIdx.x; i < n; i += blockDim.x) b[i] = a[i];
        __syncthreads();  // before thread 0 moves on to the next segment
    }
}

void cuda_moe_sort_segments(real *dst, const real *src, const int32_t *recv_counts, const int32_t *offsets, int S,
                            int L, int width, int to_expert_major) {
    long segments = (long)S * L;
    if (segments <= 0 || width <= 0) return;
    unsigned blocks = (unsigned)(segments < 65535 ? segments : 65535);
    sort_segments_kernel<<<blocks, SEGMENT_THREADS, 0, cuda_stream()>>>(dst, src, recv_counts, offsets, S, L, width,
                                                                        to_expert_major);
    CUDA_CHECK_LAUNCH();
}

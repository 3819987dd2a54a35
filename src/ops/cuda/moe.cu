// moe.cu — the cuda backend's MoE ops (contracts in ops.h, cpu twins in
// src/ops/cpu/moe.c): the router GEMM in double, the per-token routing, and the permute /
// unpermute of token rows. Every output has one owning thread (or warp) that computes it
// in the cpu's order, so the results are deterministic and, but for the last bits of
// exp/log in routing, the cpu's:
//   * router logits: a product of two floats is exact in double, so each dot product,
//     summed over h in order with one rounding per addition (fused or not), is the cpu's;
//   * permute copies bits; unpermute adds a token's rows in choice order in float;
//   * routing runs the formulas of ops/moe_route.h in double, the sums in expert order.
#include "core/float_formats.h"
#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/moe_route.h"

constexpr unsigned FULL_WARP = 0xffffffffu;
constexpr int MOE_ROW_THREADS = 256;
constexpr int MOE_FLAT_THREADS = 256;

// ---- router logits --------------------------------------------------------------------------

constexpr int LOGIT_TILE = 16;

// logits (N,E) = x (N,H) · W (E,H)ᵀ. Block (16,16) → a tile of 16 tokens × 16 experts;
// thread (x, y) owns logits[n0 + y, e0 + x]. H is walked in chunks of 16 through shared
// memory (xs: the tile's token rows, ws: its expert rows), and each thread adds its
// products in double for h = 0, 1, ..., H−1 in order. Tiles of tokens walk grid-stride
// in y (every thread of a block runs the same iterations: the barriers stay uniform).
__global__ void router_logits_kernel(float *logits, const float *x, const float *W, int N, int H, int E) {
    __shared__ float xs[LOGIT_TILE][LOGIT_TILE + 1], ws[LOGIT_TILE][LOGIT_TILE + 1];
    int tx = threadIdx.x, ty = threadIdx.y, e0 = blockIdx.x * LOGIT_TILE;
    int token_tiles = (N + LOGIT_TILE - 1) / LOGIT_TILE;
    for (int tile = blockIdx.y; tile < token_tiles; tile += gridDim.y) {
        int n0 = tile * LOGIT_TILE;
        double s = 0;
        for (int h0 = 0; h0 < H; h0 += LOGIT_TILE) {
            int h = h0 + tx;
            xs[ty][tx] = n0 + ty < N && h < H ? x[(size_t)(n0 + ty) * H + h] : 0.0f;
            ws[ty][tx] = e0 + ty < E && h < H ? W[(size_t)(e0 + ty) * H + h] : 0.0f;
            __syncthreads();
            int width = H - h0 < LOGIT_TILE ? H - h0 : LOGIT_TILE;
            for (int i = 0; i < width; i++) s += (double)xs[ty][i] * (double)ws[tx][i];
            __syncthreads();
        }
        if (n0 + ty < N && e0 + tx < E) logits[(size_t)(n0 + ty) * E + e0 + tx] = (float)s;
    }
}

void cuda_moe_router_logits(real *logits, const real *x, const real *W, int N, int H, int E) {
    if (N <= 0 || E <= 0) return;
    long token_tiles = (N + LOGIT_TILE - 1) / LOGIT_TILE;
    dim3 grid((unsigned)((E + LOGIT_TILE - 1) / LOGIT_TILE),
              (unsigned)(token_tiles < CUDA_MAX_ROWS_Y ? token_tiles : CUDA_MAX_ROWS_Y));
    router_logits_kernel<<<grid, dim3(LOGIT_TILE, LOGIT_TILE), 0, cuda_stream()>>>(logits, x, W, N, H, E);
    CUDA_CHECK_LAUNCH();
}

// ---- routing: one warp per token ---------------------------------------------------------------
// Lane l handles the experts e ≡ l (mod 32) of the elementwise steps; lane 0 takes the
// steps that are sums (in expert order, as the cpu) or short serial loops (group limit,
// probs), and __syncwarp orders the shared-memory hand-overs. A token's double arrays
// live in its warp's slice of dynamic shared memory (RouteSmem).

// Byte offsets of one token's arrays in its slice, each 8-byte aligned.
struct RouteSmem {
    size_t s, select, p, group_score, idx, top, best_groups, allowed, bytes;
};

static size_t align8(size_t bytes) { return (bytes + 7) & ~(size_t)7; }

static RouteSmem route_smem(const RouteShape *r) {
    int grouped = r->num_groups > 0, per_group = grouped ? r->k / r->group_topk : 1;
    size_t at = 0;
    RouteSmem m;
    m.s = at, at += align8((size_t)r->E * sizeof(double));
    m.select = at, at += align8((size_t)r->E * sizeof(double));
    m.p = at, at += align8((size_t)r->k * sizeof(double));
    m.group_score = at, at += align8((size_t)(grouped ? r->num_groups : 1) * sizeof(double));
    m.idx = at, at += align8((size_t)r->k * sizeof(int32_t));
    m.top = at, at += align8((size_t)(per_group > 0 ? per_group : 1) * sizeof(int32_t));
    m.best_groups = at, at += align8((size_t)(grouped ? r->group_topk : 1) * sizeof(int32_t));
    m.allowed = at, at += align8((size_t)r->E);
    m.bytes = at;
    return m;
}

// s (E) = the scores of one token's logits l (E) (route_score_row): lane 0 takes the
// softmax's max and sum in expert order, the lanes the exponentials and quotients.
__device__ void warp_score_row(double *s, const float *l, int E, ScoreFunction f, int lane) {
    if (f != SCORE_SOFTMAX) {
        for (int e = lane; e < E; e += CUDA_WARP) s[e] = route_score_of(f, l[e]);
        __syncwarp();
        return;
    }
    double max = 0, sum = 0;
    if (lane == 0) {
        max = l[0];
        for (int e = 1; e < E; e++) max = l[e] > max ? l[e] : max;
    }
    max = __shfl_sync(FULL_WARP, max, 0);
    for (int e = lane; e < E; e += CUDA_WARP) s[e] = exp((double)l[e] - max);
    __syncwarp();
    if (lane == 0)
        for (int e = 0; e < E; e++) sum += s[e];
    sum = __shfl_sync(FULL_WARP, sum, 0);
    for (int e = lane; e < E; e += CUDA_WARP) s[e] /= sum;
    __syncwarp();
}

// scores (E) and aux_scores (E) of the token from s (E) (route_aux_score_row); the
// normalising sum by lane 0 in expert order.
__device__ void warp_write_scores(float *scores, float *aux_scores, const double *s, int E, ScoreFunction f,
                                  int lane) {
    double norm = 1;
    if (f != SCORE_SOFTMAX) {
        double sum = 0;
        if (lane == 0)
            for (int e = 0; e < E; e++) sum += s[e];
        norm = __shfl_sync(FULL_WARP, sum, 0) + ROUTE_NORMALIZE_EPS;
    }
    for (int e = lane; e < E; e += CUDA_WARP) {
        scores[e] = (float)s[e];
        aux_scores[e] = (float)(s[e] / norm);
    }
}

// idx (k) = the top k of values (E) among the allowed experts, clearing each as it is
// taken: k rounds of a warp argmax. Each lane finds the first largest of its experts, then
// a butterfly over the lanes keeps the larger value, the lower index on ties — the
// expert route_topk picks (for values without NaN). −1 when none is left.
__device__ void warp_topk(int32_t *idx, const double *values, unsigned char *allowed, int E, int k, int lane) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        double v = 0;
        for (int e = lane; e < E; e += CUDA_WARP)
            if (allowed[e] && (best < 0 || values[e] > v)) {
                best = e;
                v = values[e];
            }
        for (int offset = CUDA_WARP / 2; offset > 0; offset >>= 1) {
            int other = __shfl_xor_sync(FULL_WARP, best, offset);
            double other_v = __shfl_xor_sync(FULL_WARP, v, offset);
            if (other >= 0 && (best < 0 || other_v > v || (other_v == v && other < best))) {
                best = other;
                v = other_v;
            }
        }
        if (lane == 0) {
            idx[j] = best;
            if (best >= 0) allowed[best] = 0;
        }
        __syncwarp();
    }
}

// One warp per token n = blockIdx.x · warps + warp; slice `m.bytes` of dynamic shared
// memory per warp. Writes scores, aux_scores (N,E), topk_idx, topk_probs (N,k).
__global__ void route_tokens_kernel(float *scores, float *aux_scores, int32_t *topk_idx, float *topk_probs,
                                    const float *logits, const float *bias, int N, RouteShape r, RouteSmem m) {
    extern __shared__ double route_smem_raw[];
    int warp = threadIdx.x / CUDA_WARP, lane = threadIdx.x % CUDA_WARP;
    long n = (long)blockIdx.x * (blockDim.x / CUDA_WARP) + warp;
    if (n >= N) return;  // the whole warp
    unsigned char *mine = (unsigned char *)route_smem_raw + warp * m.bytes;
    double *s = (double *)(mine + m.s), *select = (double *)(mine + m.select), *p = (double *)(mine + m.p);
    int32_t *idx = (int32_t *)(mine + m.idx);
    unsigned char *allowed = mine + m.allowed;
    int E = r.E, k = r.k;
    const float *l = logits + (size_t)n * E;

    warp_score_row(s, l, E, r.score, lane);
    warp_write_scores(scores + (size_t)n * E, aux_scores + (size_t)n * E, s, E, r.score, lane);
    if (r.replay) {  // the picks are given (router replay)
        if (lane == 0) route_probs(topk_probs + (size_t)n * k, topk_idx + (size_t)n * k, l, s, &r, p);
        return;
    }
    for (int e = lane; e < E; e += CUDA_WARP) {
        select[e] = route_select_value(&r, l, s, bias, e);
        allowed[e] = 1;
    }
    __syncwarp();
    if (r.num_groups > 0) {
        if (lane == 0)
            route_group_limit(allowed, select, &r, (double *)(mine + m.group_score), (int32_t *)(mine + m.top),
                              (int32_t *)(mine + m.best_groups));
        __syncwarp();
    }
    warp_topk(idx, select, allowed, E, k, lane);
    if (lane == 0) {
        route_probs(topk_probs + (size_t)n * k, idx, l, s, &r, p);
        for (int j = 0; j < k; j++) topk_idx[(size_t)n * k + j] = idx[j];
    }
}

constexpr int ROUTE_WARPS = 4;                    // tokens per block, fewer when their slices are large
constexpr size_t ROUTE_DEFAULT_SMEM = 48 * 1024;  // dynamic shared memory without an opt-in

// Dynamic shared memory of `bytes` for route_tokens_kernel, opting in above 48 KiB.
static void route_allow_smem(size_t bytes, int E) {
    if (bytes <= ROUTE_DEFAULT_SMEM) return;
    int device = 0, most = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (bytes > (size_t)most)
        mt_die("moe routing: %d experts need %zu bytes of shared memory per token, the GPU has %d", E, bytes, most);
    CUDA_CHECK(cudaFuncSetAttribute(route_tokens_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

void cuda_moe_route_tokens(real *scores, real *aux_scores, int32_t *topk_idx, real *topk_probs, const real *logits,
                           const real *expert_bias, int N, const RouteShape *r) {
    if (N <= 0 || r->E <= 0) return;
    RouteSmem m = route_smem(r);
    int warps = ROUTE_WARPS;
    while (warps > 1 && warps * m.bytes > ROUTE_DEFAULT_SMEM) warps /= 2;
    size_t bytes = warps * m.bytes;
    route_allow_smem(bytes, r->E);
    unsigned blocks = (unsigned)((N + warps - 1) / warps);
    route_tokens_kernel<<<blocks, warps * CUDA_WARP, bytes, cuda_stream()>>>(scores, aux_scores, topk_idx, topk_probs,
                                                                           logits, expert_bias, N, *r, m);
    CUDA_CHECK_LAUNCH();
}

// ---- permute / unpermute ------------------------------------------------------------------------

// x (N,H), fp32 (x32) or, when x32 is NULL, bf16 (x16, widened) -> rows (R,H), as fp32 (rows32)
// or, when rows32 is NULL, as bf16 (rows16); column tiles × rows: thread → column h of rows
// r = blockIdx.y, blockIdx.y + gridDim.y, ...; padding rows (token −1) get zeros.
__global__ void permute_rows_kernel(float *rows32, uint16_t *rows16, const float *x32, const uint16_t *x16,
                                    const int32_t *token_of_row, int R, int H) {
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    for (int r = blockIdx.y; r < R; r += gridDim.y) {
        int n = token_of_row[r];
        size_t at = (size_t)n * H + h;
        float v = n < 0 ? 0.0f : x32 ? x32[at] : bf16_to_float(x16[at]);
        if (rows32) rows32[(size_t)r * H + h] = v;
        else rows16[(size_t)r * H + h] = bf16_from_float_flushed(v);
    }
}

// row_values (R) from choice_values (N·k); thread → row r (grid-stride)
__global__ void permute_values_kernel(float *row_values, const float *choice_values, const int32_t *token_of_row,
                                      const int32_t *row_of_choice, int R, int k) {
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < R; r += gridDim.x * blockDim.x) {
        int n = token_of_row[r];
        row_values[r] = 0;  // padding, or an aligned plan's padding row (the token, no choice)
        if (n < 0) continue;
        for (int j = 0; j < k; j++)
            if (row_of_choice[n * k + j] == r) row_values[r] = choice_values[n * k + j];
    }
}

void cuda_moe_permute(void *rows, Storage rows_store, real *row_values, const void *x, Storage x_store,
                      const real *choice_values, const int32_t *token_of_row, const int32_t *row_of_choice, int R,
                      int k, int H) {
    if (R <= 0) return;
    if (H > 0) {
        unsigned threads = row_threads(H, MOE_ROW_THREADS);
        float *rows32 = rows_store == STORE_FP32 ? (float *)rows : NULL;
        const float *x32 = x_store == STORE_FP32 ? (const float *)x : NULL;
        permute_rows_kernel<<<tile_rows_grid(R, H, threads), threads, 0, cuda_stream()>>>(
            rows32, (uint16_t *)rows, x32, (const uint16_t *)x, token_of_row, R, H);
        CUDA_CHECK_LAUNCH();
    }
    if (!row_values) return;
    permute_values_kernel<<<cuda_blocks((size_t)R, MOE_FLAT_THREADS), MOE_FLAT_THREADS, 0, cuda_stream()>>>(
        row_values, choice_values, token_of_row, row_of_choice, R, k);
    CUDA_CHECK_LAUNCH();
}

// rows (R,H) -> out (N,H): the blocks of row y own token n = blockIdx.y (grid-stride),
// thread → column h; each sums the token's k rows in choice order in float, from out
// (accumulate) or from 0, skipping dropped choices — the cpu's additions in its order.
__global__ void unpermute_kernel(float *out, const float *rows, const int32_t *row_of_choice, int N, int k, int H,
                                 int accumulate) {
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    for (int n = blockIdx.y; n < N; n += gridDim.y) {
        float o = accumulate ? out[(size_t)n * H + h] : 0.0f;
        for (int j = 0; j < k; j++) {
            int row = row_of_choice[n * k + j];
            if (row >= 0) o += rows[(size_t)row * H + h];
        }
        out[(size_t)n * H + h] = o;
    }
}

// choice_values (N·k) = row_values[row_of_choice[i]], 0 when dropped; thread → choice i
__global__ void gather_choice_values_kernel(float *choice_values, const float *row_values,
                                            const int32_t *row_of_choice, size_t choices) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < choices; i += (size_t)gridDim.x * blockDim.x) {
        int row = row_of_choice[i];
        choice_values[i] = row < 0 ? 0.0f : row_values[row];
    }
}

void cuda_moe_unpermute(real *out, real *choice_values, const real *rows, const real *row_values,
                        const int32_t *row_of_choice, int N, int k, int H, int accumulate) {
    if (N <= 0) return;
    if (out && H > 0) {
        unsigned threads = row_threads(H, MOE_ROW_THREADS);
        unpermute_kernel<<<tile_rows_grid(N, H, threads), threads, 0, cuda_stream()>>>(out, rows, row_of_choice, N, k,
                                                                                      H, accumulate);
        CUDA_CHECK_LAUNCH();
    }
    size_t choices = (size_t)N * k;
    if (!choice_values || choices == 0) return;
    gather_choice_values_kernel<<<cuda_blocks(choices, MOE_FLAT_THREADS), MOE_FLAT_THREADS, 0, cuda_stream()>>>(
        choice_values, row_values, row_of_choice, choices);
    CUDA_CHECK_LAUNCH();
}

// attention_merge.cu — the log-sum-exp merge of two partial attention results of the same
// queries (ops.h attention_merge) for the cuda backend, mirroring
// src/ops/cpu/attention_merge.c: the weights of one (token, head) row in double from its
// two lse values, a side with lse = −∞ weighted 0, out stored as float.
//
// One warp per (token, head) row of out (B·Tq·heads rows of width dv): every lane reads
// the row's two lse values, takes the columns c ≡ lane (mod 32), and lane 0 writes the
// merged lse once all lanes have read the old one. Each element is written by one thread
// from its own inputs only, so the result does not depend on the launch.
#include <math.h>

#include "ops/cuda/cuda_internal.h"

static_assert(sizeof(real) == sizeof(float), "the cuda backend stores float");

namespace {

constexpr int MERGE_THREADS = 256;
constexpr int MERGE_WARPS = MERGE_THREADS / 32;

__global__ void __launch_bounds__(MERGE_THREADS)
    attention_merge_kernel(float *out, float *lse, const float *out_block, const float *lse_block, int Tq,
                           int heads, int dv, long long rows) {
    const long long row = (long long)blockIdx.x * MERGE_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;  // whole warps leave together
    const long long token = row / heads;  // b·Tq + t
    const int h = (int)(row % heads), b = (int)(token / Tq), t = (int)(token % Tq);
    const size_t stat = ((size_t)b * heads + h) * Tq + t;
    float *o = out + (size_t)row * dv;
    const float *o_block = out_block + (size_t)row * dv;
    const double a = lse[stat], c = lse_block[stat];
    if (c == -INFINITY) return;  // the block adds nothing (the same answer in every lane)
    double merged = c, weight = 0, weight_block = 1;  // nothing so far: the block's result
    if (a != -INFINITY) {
        merged = fmax(a, c) + log1p(exp(-fabs(a - c)));
        weight = exp(a - merged), weight_block = exp(c - merged);
    }
    for (int i = lane; i < dv; i += 32)
        o[i] = a == -INFINITY ? o_block[i] : (float)(weight * o[i] + weight_block * o_block[i]);
    __syncwarp();  // every lane has read lse[stat]
    if (lane == 0) lse[stat] = (float)merged;
}

}  // namespace

void cuda_attention_merge(real *out, real *lse, const real *out_block, const real *lse_block,
                          const AttentionShape *s) {
    const int dv = s->v_head_dim ? s->v_head_dim : s->head_dim;
    const long long rows = (long long)s->B * s->Tq * s->heads;
    if (rows <= 0) return;
    const unsigned blocks = (unsigned)((rows + MERGE_WARPS - 1) / MERGE_WARPS);
    attention_merge_kernel<<<blocks, MERGE_THREADS, 0, cuda_stream()>>>(out, lse, out_block, lse_block, s->Tq,
                                                                         s->heads, dv, rows);
    CUDA_CHECK_LAUNCH();
}

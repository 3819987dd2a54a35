// attention.cu — causal grouped-query attention for the cuda backend: flash style, fp32.
//
// The contract of attention_forward / attention_backward in ops.h, mirroring the cpu
// reference (src/ops/cpu/attention.c). Query t (0 ≤ t < Tq) of batch row b sits at
// position q_pos0 + t, key j at position k_pos0 + j, and the query sees key j when
//     first(b, t) ≤ j ≤ q_pos0 − k_pos0 + t  and  j < Tk,
//     first = max(key_start[b·Tq + t] (or 0) − k_pos0, 0).
// A query that sees no key gets out = 0 and lse = −∞ and adds nothing to any gradient,
// which is what the cpu reference computes for such a row.
//
// Layouts (d = head_dim, dv = v_head_dim or d, rows of k/v per batch row = kv_row_stride):
//   q, dq     (B·Tq, heads, d)           k, dk  (B·kv_row_stride, kv_heads, d)
//   out, dout (B·Tq, heads, dv)          v, dv  (B·kv_row_stride, kv_heads, dv)
//   lse, D    (B, heads, Tq)             query head h reads kv head h / (heads / kv_heads)
//
// Nothing of size Tq × Tk is ever stored. Every kernel works on score tiles of OWN × 64:
// the OWN rows the block owns (queries in forward and dq, keys in dk/dv) against 64 rows
// it walks (keys, resp. queries), in order:
//   forward  block (query tile, head, b): for each visible key tile, S = scale·Q Kᵀ,
//            online softmax (running max m and sum l per row), O = O·e^(m_old − m) + P V;
//            at the end out = O / l, lse = m + log l.
//   dsum     one warp per (token, head): D = Σ dout ⊙ out, the rowsum the backward needs.
//   dq       block (query tile, head, b): for each visible key tile, recompute
//            P = e^(scale·Q Kᵀ − lse), dP = dO Vᵀ, dS = P ⊙ (dP − D)·scale, dQ += dS K.
//   dk/dv    block (key tile, kv head, b): for each query head of the kv head's group in
//            order, for each query tile that sees the key tile, in order: recompute Pᵀ and
//            dSᵀ (keys as rows), dV += Pᵀ dO, dK += dSᵀ Q.
// Attention dropout (ops.h; the mask of ops/dropout_math.h, so the cpu backend's bits): the
// forward multiplies each tile's P by Z = kept·scale after the online softmax has summed
// it (l, hence lse, stay those of P); the backward uses dS = P ⊙ (Z ⊙ dP − D)·scale and
// P ⊙ Z for dV.
// Determinism without atomics: every element of out, lse, dq, dk and dv is written by
// exactly one thread of one block, which sums its terms in a fixed order (key tiles or
// (query head, query tile) pairs in increasing order, chunks of the head width in
// increasing order); row reductions are fixed shuffle butterflies. Two runs give the
// same bits.
//
// Thread → data mapping (NT = 256 threads, ty = tid / 16, tx = tid % 16):
//   score tile (OWN × 64): thread holds rows ty·RPT + i (RPT = OWN / 16, i < RPT) and
//     columns tx + 16·j (j < 4); the 16 threads sharing a ty (half a warp) hold whole
//     rows, so row max / row sum are 4-step shuffle butterflies within the half warp;
//   accumulators (OWN × W, W = 64, 128 or 256 ≥ the head width): rows ty·RPT + i,
//     columns tx + 16·c (c < W / 16) — the same rows as the thread's score rows, so the
//     online-softmax rescale needs no communication.
// Head widths from 1 to 256 are supported: the score products loop over the width in
// chunks of KC = 32 (zero-padded), the accumulators are templated on W.
//
// Tiles: OWN = 64 (OWN = 16 for a forward with Tq ≤ 16: decoding), 64 walked rows. Shared
// memory per block (static, under 48 KiB): the staging area (a KC-wide chunk of both
// score operands, or JC = 16 walked rows of an accumulate operand) 17 KiB, the P / dS tile
// 17 KiB, the tile's query statistics 0.75 KiB: 35 KiB. Registers hold the accumulators:
// 4 rows × W/16 columns per thread each of O, dQ, dK and dV.
#include <limits.h>
#include <math.h>

#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/cuda_internal.h"
#include "ops/dropout_math.h"

static_assert(sizeof(real) == sizeof(float), "the cuda backend stores float");

namespace {

constexpr int NT = 256;      // threads per block, a 16 × 16 grid
constexpr int WARPS = NT / 32;
constexpr int WALK = 64;     // rows of the walked operand of a score tile (keys or queries)
constexpr int KC = 32;       // width chunk of a score product staged in shared memory
constexpr int JC = 16;       // walked rows per staged chunk of an accumulate product
constexpr int PAD = 4;       // shared row padding: keeps float4 alignment, spreads banks
constexpr int MAX_WIDTH = 256;

// Per-call constants, passed by value to every kernel.
struct AttnGeom {
    int B, Tq, Tk, heads, kv_heads, group, d, dv, kv_row_stride;
    int q_shift;  // q_pos0 − k_pos0: query t sees the keys j ≤ t + q_shift
    int k_pos0;
    float scale;
    const int32_t *key_start;
    size_t q_stride, o_stride, k_stride, v_stride;  // elements between consecutive token rows
    int q_pos0, head_first;       // attention dropout's coordinates (AttentionShape)
    uint64_t drop_stream;
    uint32_t drop_threshold;      // 0: no dropout
    float drop_scale;
};

AttnGeom make_geom(const AttentionShape *s) {
    AttnGeom g;
    g.B = s->B, g.Tq = s->Tq, g.Tk = s->Tk, g.q_shift = s->q_pos0 - s->k_pos0, g.k_pos0 = s->k_pos0;
    g.heads = s->heads, g.kv_heads = s->kv_heads, g.group = s->heads / s->kv_heads;
    g.d = s->head_dim, g.dv = s->v_head_dim ? s->v_head_dim : s->head_dim;
    g.kv_row_stride = s->kv_row_stride, g.scale = s->scale, g.key_start = s->key_start;
    g.q_stride = (size_t)g.heads * g.d, g.o_stride = (size_t)g.heads * g.dv;
    g.k_stride = (size_t)g.kv_heads * g.d, g.v_stride = (size_t)g.kv_heads * g.dv;
    g.q_pos0 = s->q_pos0, g.head_first = s->head_first;
    g.drop_stream = s->dropout.stream, g.drop_threshold = s->dropout.threshold, g.drop_scale = s->dropout.scale;
    return g;
}

// ---- indexing ---------------------------------------------------------------------------

// Offset of head h of query token t of batch row b in q/dq (width d) or out/dout (width dv).
__device__ __forceinline__ size_t q_offset(const AttnGeom &g, int b, int t, int h) {
    return ((size_t)b * g.Tq + t) * g.q_stride + (size_t)h * g.d;
}
__device__ __forceinline__ size_t o_offset(const AttnGeom &g, int b, int t, int h) {
    return ((size_t)b * g.Tq + t) * g.o_stride + (size_t)h * g.dv;
}
// Offset of kv head kvh of key j of batch row b in k/dk (width d) or v/dv (width dv).
__device__ __forceinline__ size_t k_offset(const AttnGeom &g, int b, int j, int kvh) {
    return ((size_t)b * g.kv_row_stride + j) * g.k_stride + (size_t)kvh * g.d;
}
__device__ __forceinline__ size_t v_offset(const AttnGeom &g, int b, int j, int kvh) {
    return ((size_t)b * g.kv_row_stride + j) * g.v_stride + (size_t)kvh * g.dv;
}
// Offset of (b, h, t) in lse and D.
__device__ __forceinline__ size_t stat_offset(const AttnGeom &g, int b, int h, int t) {
    return ((size_t)b * g.heads + h) * g.Tq + t;
}

// The first key query t of batch row b may see; INT_MAX past the last query, so that
// such a row sees nothing.
__device__ __forceinline__ int first_key(const AttnGeom &g, int b, int t) {
    if (t >= g.Tq) return INT_MAX;
    return max((g.key_start ? g.key_start[(size_t)b * g.Tq + t] : 0) - g.k_pos0, 0);
}

// Whether query t (whose first visible key is `first`) sees key j.
__device__ __forceinline__ bool sees(const AttnGeom &g, int t, int first, int j) {
    return t < g.Tq && j < g.Tk && j >= first && j <= g.q_shift + t;
}

// Z of query t and key j of (b, h): dropout's kept·scale (1 without dropout).
__device__ __forceinline__ float dropout_z(const AttnGeom &g, int b, int h, int t, int j) {
    if (!g.drop_threshold) return 1.f;
    const uint64_t key = dropout_row_key(g.drop_stream, dropout_attention_row(b, g.head_first + h, g.q_pos0 + t));
    return dropout_kept(key, (uint64_t)(g.k_pos0 + j), g.drop_threshold) ? g.drop_scale : 0.f;
}

// ---- shared memory ----------------------------------------------------------------------

// One KC-wide chunk of the two operands of a score tile, chunk column major
// (a[k][r] = A[r][w0 + k]) so that a thread reads its RPT rows of A as one float4.
template <int OWN>
struct ScoreStage {
    float a[KC][OWN + PAD];
    float b[KC][WALK + PAD];
};

// The staging area is used by one product at a time: a score chunk or a chunk of JC
// walked rows of width ≤ SW for an accumulate product.
template <int OWN, int SW>
union Stage {
    ScoreStage<OWN> score;
    float rows[JC * SW];
};

// Everything a block keeps in shared memory (35 KiB at most: OWN = 64, SW = 256).
template <int OWN, int SW>
struct __align__(16) TileSmem {
    Stage<OWN, SW> stage;
    float probs[WALK][OWN + PAD];  // P or dS of the current tile, walked index major
    int first[WALK];               // first visible key of each query of the tile
    float lse[WALK], dsum[WALK];   // lse and D of each query of the tile (backward)
};

// ---- register fragments ------------------------------------------------------------------

template <int RPT>
__device__ __forceinline__ void read_own(const float *p, float (&x)[RPT]) {
    if constexpr (RPT == 4) {
        float4 v = *reinterpret_cast<const float4 *>(p);
        x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else {
#pragma unroll
        for (int i = 0; i < RPT; i++) x[i] = p[i];
    }
}

// probs[tx + 16·j][ty·RPT + i] = s[i][j]: the thread's score fragment, transposed into
// the walked-index-major layout the accumulate product reads.
template <int OWN, int RPT>
__device__ __forceinline__ void store_probs(float (*probs)[OWN + PAD], const float (&s)[RPT][4]) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float *dst = &probs[tx + 16 * j][ty * RPT];
        if constexpr (RPT == 4) {
            *reinterpret_cast<float4 *>(dst) = make_float4(s[0][j], s[1][j], s[2][j], s[3][j]);
        } else {
#pragma unroll
            for (int i = 0; i < RPT; i++) dst[i] = s[i][j];
        }
    }
}

template <int R, int C>
__device__ __forceinline__ void zero(float (&x)[R][C]) {
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int c = 0; c < C; c++) x[i][c] = 0.f;
}

// Row reductions over the 16 threads of a half warp (lanes differing in their low 4 bits).
__device__ __forceinline__ float row_max16(float x) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float row_sum16(float x) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// ---- the two tile products ----------------------------------------------------------------

// dst[k][r] = src[r·stride + w0 + k] for r < rows and w0 + k < width, else 0; ROWS × KC
// elements. Each warp moves 4 rows × 8 columns per step: global reads are whole 32-byte
// sectors, and since the row stride ROWS + PAD is 4 (mod 32) or 20 (mod 32) the 32
// shared stores of a step land in 32 distinct banks.
template <int ROWS>
__device__ __forceinline__ void stage_chunk(float (*dst)[ROWS + PAD], const float *src, size_t stride, int rows,
                                            int w0, int width) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int step = warp; step < (ROWS / 4) * (KC / 8); step += WARPS) {
        int k = (step % (KC / 8)) * 8 + lane % 8, r = (step / (KC / 8)) * 4 + lane / 8;
        float x = 0.f;
        if (r < rows && w0 + k < width) x = src[(size_t)r * stride + w0 + k];
        dst[k][r] = x;
    }
}

// acc (OWN × 64 fragment) = A·Bᵀ over `width` columns: A has rows a[r·a_stride], r < a_rows
// (≤ OWN), B rows b[j·b_stride], j < b_rows (≤ 64); missing rows count as zeros.
// Begins with a barrier, so the caller may have used the staging area just before.
template <int OWN, int SW>
__device__ void score_tile(float (&acc)[OWN / 16][4], const float *a, size_t a_stride, int a_rows, const float *b,
                           size_t b_stride, int b_rows, int width, Stage<OWN, SW> &stage) {
    constexpr int RPT = OWN / 16;
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    ScoreStage<OWN> &st = stage.score;
    zero(acc);
    for (int w0 = 0; w0 < width; w0 += KC) {
        __syncthreads();  // the previous readers of the staging area are done
        stage_chunk<OWN>(st.a, a, a_stride, a_rows, w0, width);
        stage_chunk<WALK>(st.b, b, b_stride, b_rows, w0, width);
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < KC; k++) {
            float av[RPT], bv[4];
            read_own<RPT>(&st.a[k][ty * RPT], av);
#pragma unroll
            for (int j = 0; j < 4; j++) bv[j] = st.b[k][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < RPT; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
    }
}

// acc (OWN × W fragment) += P·B: P (OWN × 64) in probs (walked index major), B rows
// b[j·b_stride], j < b_rows (≤ 64), `width` (≤ W) columns; missing rows and columns count
// as zeros. Staged JC rows at a time; begins with a barrier, so probs written just before
// the call (by any thread) are visible, and the caller's last use of the staging area is over.
template <int OWN, int SW, int W>
__device__ void accumulate_tile(float (&acc)[OWN / 16][W / 16], const float (*probs)[OWN + PAD], const float *b,
                                size_t b_stride, int b_rows, int width, Stage<OWN, SW> &stage) {
    static_assert(W <= SW, "the staging area holds JC rows of width SW");
    constexpr int RPT = OWN / 16;
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    float *rows = stage.rows;  // rows[jj·W + c] = B[j0 + jj][c]
    for (int j0 = 0; j0 < b_rows; j0 += JC) {
        __syncthreads();
        for (int e = threadIdx.x; e < JC * W; e += NT) {
            int jj = e / W, c = e % W;
            rows[e] = j0 + jj < b_rows && c < width ? b[(size_t)(j0 + jj) * b_stride + c] : 0.f;
        }
        __syncthreads();
#pragma unroll 4
        for (int jj = 0; jj < JC; jj++) {
            float pv[RPT];
            read_own<RPT>(&probs[j0 + jj][ty * RPT], pv);
#pragma unroll
            for (int c = 0; c < W / 16; c++) {
                float bv = rows[jj * W + tx + 16 * c];
#pragma unroll
                for (int i = 0; i < RPT; i++) acc[i][c] = fmaf(pv[i], bv, acc[i][c]);
            }
        }
    }
}

// ---- forward ------------------------------------------------------------------------------

// s (scores of own queries t0 + row × keys k0 + col) → scale·s where seen, −∞ elsewhere.
template <int RPT>
__device__ __forceinline__ void mask_scores(float (&s)[RPT][4], const AttnGeom &g, const int *first, int t0,
                                            int k0) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        int r = ty * RPT + i;
#pragma unroll
        for (int j = 0; j < 4; j++)
            s[i][j] = sees(g, t0 + r, first[r], k0 + tx + 16 * j) ? s[i][j] * g.scale : -INFINITY;
    }
}

// One key tile of the online softmax: s holds masked scaled scores; m and l (running max
// and sum, the same in all 16 threads of a row) are updated, o is rescaled by e^(m_old −
// m_new), and s becomes P = e^(s − m_new) (0 where masked). A row that has seen no key yet
// keeps m = −∞, l = 0, o = 0: it shifts by 0 instead of −∞, so every exponent is e^−∞ = 0.
// No branch depends on the row: both half warps reach every shuffle.
template <int RPT, int NC>
__device__ __forceinline__ void online_softmax(float (&s)[RPT][4], float (&m)[RPT], float (&l)[RPT],
                                               float (&o)[RPT][NC]) {
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        const float tile_max = row_max16(fmaxf(fmaxf(s[i][0], s[i][1]), fmaxf(s[i][2], s[i][3])));
        const float m_new = fmaxf(m[i], tile_max);
        const float shift = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = expf(m[i] - shift);  // 0 when m[i] = −∞
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            s[i][j] = expf(s[i][j] - shift);
            sum += s[i][j];
        }
        l[i] = l[i] * alpha + row_sum16(sum);
        m[i] = m_new;
#pragma unroll
        for (int c = 0; c < NC; c++) o[i][c] *= alpha;
    }
}

// P (own queries t0 + row × keys k0 + col) multiplied by Z, after online_softmax summed it.
template <int RPT>
__device__ __forceinline__ void drop_probs(float (&s)[RPT][4], const AttnGeom &g, int b, int h, int t0, int k0) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < RPT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) s[i][j] *= dropout_z(g, b, h, t0 + ty * RPT + i, k0 + tx + 16 * j);
}

// first[r] for the 64 queries t0 + r of batch row b (threads 0..63); no barrier.
__device__ __forceinline__ void load_first_keys(int *first, const AttnGeom &g, int b, int t0) {
    if (threadIdx.x < WALK) first[threadIdx.x] = first_key(g, b, t0 + threadIdx.x);
}

// The first key tile any of the `rows` queries in `first` may see (a multiple of WALK);
// tiles before it are fully masked for every row, so skipping them changes no bit.
__device__ __forceinline__ int first_key_tile(const int *first, int rows) {
    int lo = INT_MAX;
    for (int r = 0; r < rows; r++) lo = min(lo, first[r]);
    return lo / WALK * WALK;
}

// Block (query tile, head h, batch row b). Query tiles are taken last first: they see the
// most keys, so the longest blocks start earliest.
template <int OWN, int WV>
__global__ void __launch_bounds__(NT) attention_forward_kernel(float *out, float *lse, const float *q,
                                                               const float *k, const float *v, AttnGeom g) {
    constexpr int RPT = OWN / 16;
    __shared__ TileSmem<OWN, WV> sm;
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / g.group;
    const int t0 = (gridDim.x - 1 - blockIdx.x) * OWN, rows = min(OWN, g.Tq - t0);
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    load_first_keys(sm.first, g, b, t0);
    __syncthreads();
    const int key_end = min(g.q_shift + t0 + rows, g.Tk);  // past the last key any row sees (≤ 0: none)
    const float *q_tile = q + q_offset(g, b, t0, h);
    float m[RPT], l[RPT], o[RPT][WV / 16];
    zero(o);
#pragma unroll
    for (int i = 0; i < RPT; i++) m[i] = -INFINITY, l[i] = 0.f;
    for (int k0 = first_key_tile(sm.first, rows); k0 < key_end; k0 += WALK) {
        const int keys = min(WALK, key_end - k0);
        float s[RPT][4];
        score_tile<OWN, WV>(s, q_tile, g.q_stride, rows, k + k_offset(g, b, k0, kvh), g.k_stride, keys, g.d,
                            sm.stage);
        mask_scores<RPT>(s, g, sm.first, t0, k0);
        online_softmax<RPT, WV / 16>(s, m, l, o);
        if (g.drop_threshold) drop_probs<RPT>(s, g, b, h, t0, k0);
        __syncthreads();  // the previous tile's readers of probs are done
        store_probs<OWN, RPT>(sm.probs, s);
        accumulate_tile<OWN, WV, WV>(o, sm.probs, v + v_offset(g, b, k0, kvh), g.v_stride, keys, g.dv, sm.stage);
    }
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        const int t = t0 + ty * RPT + i;
        if (t >= g.Tq) continue;
        float *out_row = out + o_offset(g, b, t, h);
#pragma unroll
        for (int c = 0; c < WV / 16; c++)
            if (tx + 16 * c < g.dv) out_row[tx + 16 * c] = l[i] > 0.f ? o[i][c] / l[i] : 0.f;
        if (tx == 0) lse[stat_offset(g, b, h, t)] = l[i] > 0.f ? m[i] + logf(l[i]) : -INFINITY;
    }
}

// ---- backward -----------------------------------------------------------------------------

// D (B, heads, Tq) = Σ_c dout ⊙ out over the dv columns of each (token, head): warp w
// owns the w-th (token, head) row of dout/out; lanes take columns c ≡ lane (mod 32), then
// a shuffle butterfly sums the lanes.
__global__ void __launch_bounds__(NT) attention_dsum_kernel(float *dsum, const float *dout, const float *out,
                                                            AttnGeom g) {
    const long long w = (long long)blockIdx.x * WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (w >= (long long)g.B * g.Tq * g.heads) return;  // whole warps leave together
    const float *d_row = dout + (size_t)w * g.dv, *o_row = out + (size_t)w * g.dv;
    float sum = 0.f;
    for (int c = lane; c < g.dv; c += 32) sum = fmaf(d_row[c], o_row[c], sum);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
        const long long n = w / g.heads;  // token b·Tq + t
        const int h = (int)(w % g.heads), b = (int)(n / g.Tq), t = (int)(n % g.Tq);
        dsum[stat_offset(g, b, h, t)] = sum;
    }
}

// first, lse and D of the 64 queries t0 + r of (b, h) into shared memory (threads 0..63;
// 0 past the last query); no barrier.
__device__ __forceinline__ void load_query_stats(TileSmem<64, MAX_WIDTH> &sm, const float *lse, const float *dsum,
                                                 const AttnGeom &g, int b, int h, int t0) {
    const int r = threadIdx.x, t = t0 + r;
    if (r >= WALK) return;
    sm.first[r] = first_key(g, b, t);
    sm.lse[r] = t < g.Tq ? lse[stat_offset(g, b, h, t)] : 0.f;
    sm.dsum[r] = t < g.Tq ? dsum[stat_offset(g, b, h, t)] : 0.f;
}

// Whether query t (first visible key `first`) sees any of the keys [k0, k0 + keys).
__device__ __forceinline__ bool sees_any(const AttnGeom &g, int t, int first, int k0, int keys) {
    const int lo = max(first, k0), hi = min(min(g.q_shift + t, k0 + keys - 1), g.Tk - 1);
    return t < g.Tq && lo <= hi;
}

// P and dS of a recomputed 64 × 64 tile of (b, h): s (scores) becomes P ⊙ Z, P = e^(scale·s − lse)
// where the query sees the key (0 elsewhere), dp (dP) becomes dS = P ⊙ (Z ⊙ dP − D)·scale
// (Z = 1 without dropout). The
// fragment's rows are queries t0 + row and its columns keys k0 + col (dq kernel), or with
// KEY_ROWS the rows are keys k0 + row and the columns queries t0 + col (dk/dv kernel);
// first, lse and dsum are indexed by the query's place in its tile.
template <bool KEY_ROWS>
__device__ __forceinline__ void probs_and_ds(float (&s)[4][4], float (&dp)[4][4], const AttnGeom &g,
                                             const int *first, const float *lse, const float *dsum, int b, int h,
                                             int t0, int k0) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int query = KEY_ROWS ? tx + 16 * j : ty * 4 + i, key = KEY_ROWS ? ty * 4 + i : tx + 16 * j;
            const bool seen = sees(g, t0 + query, first[query], k0 + key);
            const float z = dropout_z(g, b, h, t0 + query, k0 + key);
            s[i][j] = seen ? expf(s[i][j] * g.scale - lse[query]) : 0.f;
            dp[i][j] = s[i][j] * (z * dp[i][j] - dsum[query]) * g.scale;
            s[i][j] *= z;
        }
}

// acc (64 × W fragment) added to the rows row0 + r (r < rows) of dst, width columns.
template <int W>
__device__ __forceinline__ void add_rows(float *dst, size_t stride, int rows, int width, const float (&acc)[4][W / 16]) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = ty * 4 + i;
        if (r >= rows) continue;
#pragma unroll
        for (int c = 0; c < W / 16; c++)
            if (tx + 16 * c < width) dst[(size_t)r * stride + tx + 16 * c] += acc[i][c];
    }
}

// Block (query tile, head h, batch row b) accumulates dq of its 64 queries, walking the
// visible key tiles in increasing order. Last query tiles first (they see the most keys).
template <int WD>
__global__ void __launch_bounds__(NT) attention_dq_kernel(float *dq, const float *dout, const float *lse,
                                                          const float *dsum, const float *q, const float *k,
                                                          const float *v, AttnGeom g) {
    __shared__ TileSmem<64, MAX_WIDTH> sm;
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / g.group;
    const int t0 = (gridDim.x - 1 - blockIdx.x) * 64, rows = min(64, g.Tq - t0);
    load_query_stats(sm, lse, dsum, g, b, h, t0);
    __syncthreads();
    const int key_end = min(g.q_shift + t0 + rows, g.Tk);
    const float *q_tile = q + q_offset(g, b, t0, h), *do_tile = dout + o_offset(g, b, t0, h);
    float acc[4][WD / 16];
    zero(acc);
    for (int k0 = first_key_tile(sm.first, rows); k0 < key_end; k0 += WALK) {
        const int keys = min(WALK, key_end - k0);
        const float *k_tile = k + k_offset(g, b, k0, kvh);
        float s[4][4], dp[4][4];
        score_tile<64, MAX_WIDTH>(s, q_tile, g.q_stride, rows, k_tile, g.k_stride, keys, g.d, sm.stage);
        score_tile<64, MAX_WIDTH>(dp, do_tile, g.o_stride, rows, v + v_offset(g, b, k0, kvh), g.v_stride, keys,
                                  g.dv, sm.stage);
        probs_and_ds<false>(s, dp, g, sm.first, sm.lse, sm.dsum, b, h, t0, k0);
        __syncthreads();  // the previous tile's readers of probs are done
        store_probs<64, 4>(sm.probs, dp);
        accumulate_tile<64, MAX_WIDTH, WD>(acc, sm.probs, k_tile, g.k_stride, keys, g.d, sm.stage);
    }
    add_rows<WD>(dq + q_offset(g, b, t0, h), g.q_stride, rows, g.d, acc);
}

// Block (key tile, kv head kvh, batch row b) accumulates dk and dv of its 64 keys: for
// each query head of the group in order, for each query tile from the first that can see
// the key tile, in order. Tiles in which no query sees any of the keys are skipped (all
// their terms are exact zeros).
template <int WD, int WV>
__global__ void __launch_bounds__(NT) attention_dkdv_kernel(float *dk, float *dv, const float *dout,
                                                            const float *lse, const float *dsum, const float *q,
                                                            const float *k, const float *v, AttnGeom g) {
    __shared__ TileSmem<64, MAX_WIDTH> sm;
    const int b = blockIdx.z, kvh = blockIdx.y, k0 = blockIdx.x * WALK, keys = min(WALK, g.Tk - k0);
    const float *k_tile = k + k_offset(g, b, k0, kvh), *v_tile = v + v_offset(g, b, k0, kvh);
    const int t_begin = max(k0 - g.q_shift, 0) / 64 * 64;  // earlier queries are before every key
    float acc_k[4][WD / 16], acc_v[4][WV / 16];
    zero(acc_k);
    zero(acc_v);
    for (int h = kvh * g.group; h < (kvh + 1) * g.group; h++) {
        for (int t0 = t_begin; t0 < g.Tq; t0 += 64) {
            const int rows = min(64, g.Tq - t0);
            __syncthreads();  // the previous tile's readers of first / lse / dsum are done
            load_query_stats(sm, lse, dsum, g, b, h, t0);
            const bool mine = threadIdx.x < WALK && sees_any(g, t0 + threadIdx.x, sm.first[threadIdx.x], k0, keys);
            if (!__syncthreads_or(mine)) continue;  // the same answer in every thread
            const float *q_tile = q + q_offset(g, b, t0, h), *do_tile = dout + o_offset(g, b, t0, h);
            float s[4][4], dp[4][4];  // Sᵀ and dPᵀ: keys × queries
            score_tile<64, MAX_WIDTH>(s, k_tile, g.k_stride, keys, q_tile, g.q_stride, rows, g.d, sm.stage);
            score_tile<64, MAX_WIDTH>(dp, v_tile, g.v_stride, keys, do_tile, g.o_stride, rows, g.dv, sm.stage);
            probs_and_ds<true>(s, dp, g, sm.first, sm.lse, sm.dsum, b, h, t0, k0);
            __syncthreads();  // the previous tile's readers of probs are done
            store_probs<64, 4>(sm.probs, s);
            accumulate_tile<64, MAX_WIDTH, WV>(acc_v, sm.probs, do_tile, g.o_stride, rows, g.dv, sm.stage);
            __syncthreads();  // Pᵀ is read; dSᵀ takes its place
            store_probs<64, 4>(sm.probs, dp);
            accumulate_tile<64, MAX_WIDTH, WD>(acc_k, sm.probs, q_tile, g.q_stride, rows, g.d, sm.stage);
        }
    }
    add_rows<WD>(dk + k_offset(g, b, k0, kvh), g.k_stride, keys, g.d, acc_k);
    add_rows<WV>(dv + v_offset(g, b, k0, kvh), g.v_stride, keys, g.dv, acc_v);
}

// ---- host side ------------------------------------------------------------------------------

// The accumulator width W (64, 128 or 256) that holds `width` columns.
int width_class(int width, const char *what) {
    if (width < 1 || width > MAX_WIDTH)
        mt_die("attention: %s %d is not supported by the cuda backend (1 to %d)", what, width, MAX_WIDTH);
    return width <= 64 ? 64 : width <= 128 ? 128 : 256;
}

unsigned tiles(int n, int tile) { return (unsigned)((n + tile - 1) / tile); }

template <int OWN, int WV>
void launch_forward(float *out, float *lse, const float *q, const float *k, const float *v, const AttnGeom &g) {
    dim3 grid(tiles(g.Tq, OWN), g.heads, g.B);
    attention_forward_kernel<OWN, WV><<<grid, NT, 0, cuda_stream()>>>(out, lse, q, k, v, g);
    CUDA_CHECK_LAUNCH();
}

template <int OWN>
void forward_width(float *out, float *lse, const float *q, const float *k, const float *v, const AttnGeom &g) {
    switch (width_class(g.dv, "v_head_dim")) {
    case 64: launch_forward<OWN, 64>(out, lse, q, k, v, g); break;
    case 128: launch_forward<OWN, 128>(out, lse, q, k, v, g); break;
    default: launch_forward<OWN, 256>(out, lse, q, k, v, g); break;
    }
}

template <int WD>
void launch_dq(float *dq, const float *dout, const float *lse, const float *dsum, const float *q, const float *k,
               const float *v, const AttnGeom &g) {
    dim3 grid(tiles(g.Tq, 64), g.heads, g.B);
    attention_dq_kernel<WD><<<grid, NT, 0, cuda_stream()>>>(dq, dout, lse, dsum, q, k, v, g);
    CUDA_CHECK_LAUNCH();
}

template <int WD, int WV>
void launch_dkdv(float *dk, float *dv, const float *dout, const float *lse, const float *dsum, const float *q,
                 const float *k, const float *v, const AttnGeom &g) {
    dim3 grid(tiles(g.Tk, WALK), g.kv_heads, g.B);
    attention_dkdv_kernel<WD, WV><<<grid, NT, 0, cuda_stream()>>>(dk, dv, dout, lse, dsum, q, k, v, g);
    CUDA_CHECK_LAUNCH();
}

template <int WD>
void dkdv_width(float *dk, float *dv, const float *dout, const float *lse, const float *dsum, const float *q,
                const float *k, const float *v, const AttnGeom &g) {
    switch (width_class(g.dv, "v_head_dim")) {
    case 64: launch_dkdv<WD, 64>(dk, dv, dout, lse, dsum, q, k, v, g); break;
    case 128: launch_dkdv<WD, 128>(dk, dv, dout, lse, dsum, q, k, v, g); break;
    default: launch_dkdv<WD, 256>(dk, dv, dout, lse, dsum, q, k, v, g); break;
    }
}

// D of the backward, kept between calls and grown to the largest (B, heads, Tq) seen;
// cuda_free waits for the device before the old buffer goes.
float *dsum_buffer(size_t n) {
    static float *buffer;
    static size_t capacity;
    if (n > capacity) {
        cuda_free(buffer);
        buffer = (float *)cuda_malloc(n * sizeof(float));
        capacity = n;
    }
    return buffer;
}

}  // namespace

// ---- q, k, v and out stored as bf16 (ops.h AttentionShape) ------------------------------------
// The kernels work on fp32: bf16-stored q, k and v are widened (exactly) into these first, and a
// bf16 out is computed into the fourth and rounded into out after (as bf16_pack rounds).
static CudaScratch widened_q, widened_k, widened_v, widened_out;

static size_t q_elements(const AttentionShape *s) { return (size_t)s->B * s->Tq * s->heads * s->head_dim; }
static size_t kv_elements(const AttentionShape *s, int width) {
    return (size_t)s->B * s->kv_row_stride * s->kv_heads * width;
}
static size_t out_elements(const AttentionShape *s) {
    return (size_t)s->B * s->Tq * s->heads * (s->v_head_dim ? s->v_head_dim : s->head_dim);
}

// The fp32 q, k, v the kernels read.
struct WidenedQkv {
    const float *q, *k, *v;
};
static WidenedQkv widened_qkv(const void *q, const void *k, const void *v, const AttentionShape *s) {
    int dv = s->v_head_dim ? s->v_head_dim : s->head_dim;
    return {scratch_widened(&widened_q, q, s->q_store, q_elements(s)),
            scratch_widened(&widened_k, k, s->kv_store, kv_elements(s, s->head_dim)),
            scratch_widened(&widened_v, v, s->kv_store, kv_elements(s, dv))};
}

static void forward_fp32(float *out, float *lse, const float *q, const float *k, const float *v,
                         const AttentionShape *s) {
    const AttnGeom g = make_geom(s);
    width_class(g.d, "head_dim");
    if (g.B <= 0 || g.Tq <= 0 || g.heads <= 0) return;
    if (g.Tq <= 16)  // decoding: a 16-query tile wastes less of the block than 64
        forward_width<16>(out, lse, q, k, v, g);
    else
        forward_width<64>(out, lse, q, k, v, g);
}

void cuda_attention_forward(void *out, real *lse, const void *q, const void *k, const void *v,
                            const AttentionShape *s) {
    WidenedQkv x = widened_qkv(q, k, v, s);
    size_t n_out = out_elements(s);
    float *out32 = s->out_store == STORE_FP32
                       ? (float *)out
                       : (float *)scratch_reserve(&widened_out, (n_out ? n_out : 1) * sizeof(float));
    forward_fp32(out32, lse, x.q, x.k, x.v, s);
    if (s->out_store == STORE_BF16) cuda_bf16_pack((float *)out, out32, n_out);
}

void cuda_attention_backward(real *dq, real *dk, real *dv, const real *dout, const void *out_stored, const real *lse,
                             const void *q_stored, const void *k_stored, const void *v_stored,
                             const AttentionShape *s) {
    const AttnGeom g = make_geom(s);
    const int wd = width_class(g.d, "head_dim");
    width_class(g.dv, "v_head_dim");
    if (g.B <= 0 || g.Tq <= 0 || g.heads <= 0 || g.Tk <= 0) return;
    WidenedQkv x = widened_qkv(q_stored, k_stored, v_stored, s);
    const float *q = x.q, *k = x.k, *v = x.v;
    const float *out = scratch_widened(&widened_out, out_stored, s->out_store, out_elements(s));
    const size_t rows = (size_t)g.B * g.Tq * g.heads;
    float *dsum = dsum_buffer(rows);
    attention_dsum_kernel<<<(unsigned)((rows + WARPS - 1) / WARPS), NT, 0, cuda_stream()>>>(dsum, dout, out, g);
    CUDA_CHECK_LAUNCH();
    switch (wd) {
    case 64: launch_dq<64>(dq, dout, lse, dsum, q, k, v, g); break;
    case 128: launch_dq<128>(dq, dout, lse, dsum, q, k, v, g); break;
    default: launch_dq<256>(dq, dout, lse, dsum, q, k, v, g); break;
    }
    switch (wd) {
    case 64: dkdv_width<64>(dk, dv, dout, lse, dsum, q, k, v, g); break;
    case 128: dkdv_width<128>(dk, dv, dout, lse, dsum, q, k, v, g); break;
    default: dkdv_width<256>(dk, dv, dout, lse, dsum, q, k, v, g); break;
    }
}

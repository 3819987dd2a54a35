// ops_dispatch.h — the ops of the dispatch plan, expert row grouping and EP exchange layouts: their types and
// contracts (shapes, overwrite vs +=, reduction order); listed in op_list.h (MT_OPS_DISPATCH).
// Every output is integer (exact on every backend) or a copy of rows (bits moved, no arithmetic).
#pragma once
#include "ops/ops.h"

// The dispatch plan of N tokens × k choices over E experts (src/moe/dispatcher.h): a stable
// counting sort of the kept choices by expert, walking (token, choice) in order, so each
// expert's rows are contiguous and in token order. All outputs overwritten:
//   rows_per_expert (E)   kept choices of e; capacity when capacity > 0 (padding; then every
//                         expert's kept choices must be ≤ capacity); with align > 1 the kept
//                         choices rounded up to a multiple of align, at most N
//                         (dispatch_aligned_rows: --moe-router-padding-for-quantization)
//   expert_offsets (E+1)  exclusive prefix sum of rows_per_expert; [E] = the plan's rows R
//   row_of_choice (N·k)   the row of choice i, −1 when dropped (kept[i] == 0)
//   token_of_row (R)      the token of each row: with capacity, −1 for the padding rows after
//                         an expert's choices; with align, an expert's padding rows are the
//                         first tokens (in token order) without a kept choice of it, among
//                         its other rows in token order, and no choice points at them
// topk_idx (N·k) in [0, E); kept (N·k) 0/1 or NULL (all kept); capacity and align > 1 not
// both.
void moe_dispatch_plan(int32_t *rows_per_expert, int32_t *expert_offsets, int32_t *row_of_choice,
                       int32_t *token_of_row, const int32_t *topk_idx, const int32_t *kept, int N, int k, int E,
                       int capacity, int align);

// Keeps the choices of experts [first, first + local) (the allgather dispatcher's own):
// kept[i] = kept[i] && first ≤ topk_idx[i] < first + local, in place, for the n choices.
void moe_keep_local_choices(int32_t *kept, const int32_t *topk_idx, size_t n, int first, int local);

// The layout of an alltoall exchange over P EP ranks, L local experts, S = T·P sources
// (T ETP ranks), from the exchanged counts. All outputs overwritten:
//   counts (L)        rows of each local expert: Σ_s recv_counts[s·L + le], s in order
//   offsets (L+1)     exclusive prefix sum of counts (each local expert's first row, sorted)
//   sizes (2P+T+1)    what the host needs to size the exchange: [0,P) rows sent to EP rank q
//                     (expert_offsets[(q+1)·L] − expert_offsets[q·L]); [P,2P) rows received
//                     from q (Σ_le own_counts[q·L + le]); [2P,2P+T) rows ETP rank t received
//                     (Σ of recv_counts[t·P·L .. (t+1)·P·L)); [2P+T] all rows (offsets[L])
// own_counts (P·L) [q][le], recv_counts (S·L) [t][q][le], expert_offsets (P·L+1) of the
// local plan.
void moe_ep_layout(int32_t *counts, int32_t *offsets, int32_t *sizes, const int32_t *own_counts,
                   const int32_t *recv_counts, const int32_t *expert_offsets, int P, int L, int S);

// Rows of `width` reals between arrival order [source s][local expert le] (segments of
// recv_counts[s·L + le] rows back to back) and expert-major order [le][s] (expert le's rows
// from offsets[le], its sources in order). to_expert_major: dst (expert-major) ← src
// (arrival); 0: the reverse. dst's rows of the segments are overwritten (bits copied).
// recv_counts (S·L), offsets (L+1) as moe_ep_layout's.
void moe_sort_segments(real *dst, const real *src, const int32_t *recv_counts, const int32_t *offsets, int S, int L,
                       int width, int to_expert_major);

#ifdef __CUDACC__
#define DISPATCH_FN static inline __host__ __device__
#else
#define DISPATCH_FN static inline
#endif

// Rows of an expert with `kept_choices` of N tokens in an aligned plan: rounded up to a
// multiple of align, at most N (an expert cannot take a token twice).
DISPATCH_FN int dispatch_aligned_rows(int kept_choices, int N, int align) {
    int rounded = (kept_choices + align - 1) / align * align;
    return rounded < N ? rounded : N;
}

// moe_ep_layout's arithmetic, shared by the backends (the cuda one runs it on one thread).
DISPATCH_FN void ep_layout_compute(int32_t *counts, int32_t *offsets, int32_t *sizes, const int32_t *own_counts,
                                   const int32_t *recv_counts, const int32_t *expert_offsets, int P, int L, int S) {
    int T = S / P;
    int32_t *send_rows = sizes, *recv_rows = sizes + P, *etp_rows = sizes + 2 * P;
    offsets[0] = 0;
    for (int le = 0; le < L; le++) {
        int rows = 0;
        for (int s = 0; s < S; s++) rows += recv_counts[s * L + le];
        counts[le] = rows;
        offsets[le + 1] = offsets[le] + rows;
    }
    for (int q = 0; q < P; q++) {
        send_rows[q] = expert_offsets[(q + 1) * L] - expert_offsets[q * L];
        recv_rows[q] = 0;
        for (int le = 0; le < L; le++) recv_rows[q] += own_counts[q * L + le];
    }
    for (int t = 0; t < T; t++) {
        etp_rows[t] = 0;
        for (int i = 0; i < P * L; i++) etp_rows[t] += recv_counts[t * P * L + i];
    }
    sizes[2 * P + T] = offsets[L];
}

// dispatch_ops.c — the cpu backend's dispatch ops (contracts in ops_dispatch.h): the
// dispatch plan's counting sort, the allgather dispatcher's choice filter, the alltoall
// exchange layout and the segment sort between arrival and expert-major order.
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/cpu_ops.h"

// tokens (E): kept choices per expert
static void count_kept(int32_t *tokens, const int32_t *topk_idx, const int32_t *kept, int choices, int E) {
    memset(tokens, 0, (size_t)E * sizeof(int32_t));
    for (int i = 0; i < choices; i++)
        if (!kept || kept[i]) tokens[topk_idx[i]]++;
}

// Rows of expert e's segment: capacity when padding to it, its kept choices rounded up to
// `align` (at most all N tokens) when aligning, else its kept choices.
static int32_t plan_expert_rows(int32_t kept_choices, int N, int capacity, int align) {
    if (capacity > 0) return capacity;
    return align > 1 ? dispatch_aligned_rows(kept_choices, N, align) : kept_choices;
}

// Counting sort: walking (token, choice) in order keeps token order within an expert; the
// rows past an expert's choices are its padding (token −1).
static void plan_rows_in_choice_order(int32_t *row_of_choice, int32_t *token_of_row, int32_t *next_row,
                                      const int32_t *expert_offsets, const int32_t *topk_idx, const int32_t *kept,
                                      int N, int k, int E) {
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            int i = n * k + j;
            if (kept && !kept[i]) {
                row_of_choice[i] = -1;
                continue;
            }
            int row = next_row[topk_idx[i]]++;
            row_of_choice[i] = row;
            token_of_row[row] = n;
        }
    for (int e = 0; e < E; e++)
        for (int row = next_row[e]; row < expert_offsets[e + 1]; row++) token_of_row[row] = -1;
}

// Aligned plan: walking the tokens in order, each expert takes the tokens with a kept
// choice of it and, while it still needs padding, the tokens without one (their rows carry
// the token but no choice: value 0) — Megatron's pad_routing_map, "the first zeros of
// each expert's column".
static void plan_rows_aligned(int32_t *row_of_choice, int32_t *token_of_row, int32_t *next_row,
                              const int32_t *expert_offsets, const int32_t *tokens, const int32_t *topk_idx,
                              const int32_t *kept, int N, int k, int E) {
    int32_t *pad_left = mt_malloc((size_t)E * sizeof(int32_t)), *choice_of_expert = mt_malloc((size_t)E * sizeof(int32_t));
    for (int e = 0; e < E; e++) pad_left[e] = expert_offsets[e + 1] - expert_offsets[e] - tokens[e];
    for (int e = 0; e < E; e++) choice_of_expert[e] = -1;
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < k; j++) {
            int i = n * k + j;
            if (kept && !kept[i]) row_of_choice[i] = -1;
            else choice_of_expert[topk_idx[i]] = i;
        }
        for (int e = 0; e < E; e++) {
            int i = choice_of_expert[e];
            if (i < 0 && pad_left[e] == 0) continue;
            int row = next_row[e]++;
            token_of_row[row] = n;
            if (i >= 0) row_of_choice[i] = row;
            else pad_left[e]--;
            choice_of_expert[e] = -1;
        }
    }
    free(pad_left);
    free(choice_of_expert);
}

void cpu_moe_dispatch_plan(int32_t *rows_per_expert, int32_t *expert_offsets, int32_t *row_of_choice,
                           int32_t *token_of_row, const int32_t *topk_idx, const int32_t *kept, int N, int k, int E,
                           int capacity, int align) {
    MT_ASSERT(capacity == 0 || align <= 1);
    int32_t *tokens = mt_malloc((size_t)MT_MAX(E, 1) * sizeof(int32_t));
    int32_t *next_row = mt_malloc((size_t)MT_MAX(E, 1) * sizeof(int32_t));
    count_kept(tokens, topk_idx, kept, N * k, E);
    expert_offsets[0] = 0;
    for (int e = 0; e < E; e++) {
        MT_ASSERT(capacity == 0 || tokens[e] <= capacity);
        rows_per_expert[e] = plan_expert_rows(tokens[e], N, capacity, align);
        expert_offsets[e + 1] = expert_offsets[e] + rows_per_expert[e];
    }
    memcpy(next_row, expert_offsets, (size_t)E * sizeof(int32_t));
    if (align > 1)
        plan_rows_aligned(row_of_choice, token_of_row, next_row, expert_offsets, tokens, topk_idx, kept, N, k, E);
    else
        plan_rows_in_choice_order(row_of_choice, token_of_row, next_row, expert_offsets, topk_idx, kept, N, k, E);
    free(tokens);
    free(next_row);
}

void cpu_moe_keep_local_choices(int32_t *kept, const int32_t *topk_idx, size_t n, int first, int local) {
    for (size_t i = 0; i < n; i++) {
        int e = topk_idx[i];
        kept[i] = kept[i] && e >= first && e < first + local;
    }
}

void cpu_moe_ep_layout(int32_t *counts, int32_t *offsets, int32_t *sizes, const int32_t *own_counts,
                       const int32_t *recv_counts, const int32_t *expert_offsets, int P, int L, int S) {
    ep_layout_compute(counts, offsets, sizes, own_counts, recv_counts, expert_offsets, P, L, S);
}

void cpu_moe_sort_segments(real *dst, const real *src, const int32_t *recv_counts, const int32_t *offsets, int S,
                           int L, int width, int to_expert_major) {
    int32_t *next = mt_malloc((size_t)MT_MAX(L, 1) * sizeof(int32_t));
    memcpy(next, offsets, (size_t)L * sizeof(int32_t));
    size_t arrival = 0;
    for (int s = 0; s < S; s++)
        for (int le = 0; le < L; le++) {
            size_t n = (size_t)recv_counts[s * L + le], sorted = (size_t)next[le];
            next[le] += (int32_t)n;
            size_t from = to_expert_major ? arrival : sorted, to = to_expert_major ? sorted : arrival;
            memcpy(dst + to * width, src + from * width, n * width * sizeof(real));
            arrival += n;
        }
    free(next);
}

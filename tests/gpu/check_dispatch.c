// check_dispatch.c — the backend under test's ops of ops_dispatch.h (dispatch plan, expert row grouping, EP exchange layouts)
// against the cpu backend (op_check.h). Every output is integer or copied rows: exact.
//
// Plans: random routings (k distinct experts per token) with and without dropped choices
// and capacity padding, choices past one block of threads and experts with no rows. The EP
// layout and the segment sort: random counts (empty segments included) over P EP ranks, L
// local experts and T ETP ranks.
#include <stdio.h>
#include <string.h>

#include "moe/dispatcher.h"
#include "op_check.h"

static const OpsBackend *cpu(void) { return &ops_cpu_backend; }

#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

// ---- the plan ------------------------------------------------------------------------------------

typedef struct {
    int N, k, E;
    int drop, pad;  // drop: about 1 choice in 4 dropped; pad: capacity one above the fullest expert
    int align;      // > 1: an aligned plan (--moe-router-padding-for-quantization)
} PlanCase;

// k distinct experts per token: token n's choice j is (first_n + j·step_n) mod E, distinct
// for j < k ≤ E as E is prime and 0 < step_n < E.
static int32_t *random_topk(const PlanCase *c) {
    size_t nk = (size_t)c->N * c->k;
    int32_t *topk = check_random_ints(nk, 0, c->E);
    int32_t *step = check_random_ints((size_t)c->N, 1, c->E);
    for (int n = 0; n < c->N; n++)
        for (int j = 1; j < c->k; j++) topk[n * c->k + j] = (topk[n * c->k] + j * step[n]) % c->E;
    return topk;
}

// capacity of the case: 0, or one above the most kept choices of an expert
static int plan_capacity(const PlanCase *c, const int32_t *topk, const int32_t *kept) {
    if (!c->pad) return 0;
    int32_t *count = check_random_ints((size_t)c->E, 0, 1);
    memset(count, 0, (size_t)c->E * sizeof(int32_t));
    int capacity = 0;
    for (size_t i = 0; i < (size_t)c->N * c->k; i++)
        if (!kept || kept[i]) capacity = MT_MAX(capacity, ++count[topk[i]]);
    return capacity + 1;
}

static void check_plan(const PlanCase *c) {
    char name[128];
    snprintf(name, sizeof(name), "moe_dispatch_plan N=%d k=%d E=%d%s%s align=%d", c->N, c->k, c->E,
             c->drop ? " drop" : "", c->pad ? " pad" : "", c->align);
    int N = c->N, k = c->k, E = c->E;
    size_t nk = (size_t)N * k;
    int32_t *topk = random_topk(c);
    int32_t *kept = c->drop ? check_random_ints(nk, 0, 4) : NULL;  // 0 = dropped
    if (kept)
        for (size_t i = 0; i < nk; i++) kept[i] = kept[i] != 0;
    int capacity = plan_capacity(c, topk, kept);
    size_t rows = dispatch_max_rows(N, k, E, 0, 0, c->align);
    if (capacity) rows = (size_t)E * capacity;
    int32_t *rpe = check_random_ints((size_t)E, 0, 1), *off = check_random_ints((size_t)E + 1, 0, 1);
    int32_t *roc = check_random_ints(nk, 0, 1), *tor = check_random_ints(rows, 0, 1);
    int32_t *d_rpe = check_device_unset_ints((size_t)E), *d_off = check_device_unset_ints((size_t)E + 1);
    int32_t *d_roc = check_device_unset_ints(nk), *d_tor = check_device_unset_ints(rows);
    int32_t *d_topk = check_ints_to_device(topk, nk), *d_kept = kept ? check_ints_to_device(kept, nk) : NULL;
    cpu()->moe_dispatch_plan(rpe, off, roc, tor, topk, kept, N, k, E, capacity, c->align);
    under()->moe_dispatch_plan(d_rpe, d_off, d_roc, d_tor, d_topk, d_kept, N, k, E, capacity, c->align);
    check_finish();
    size_t plan_rows = (size_t)off[E];
    check_compare_ints(name, "rows_per_expert", rpe, d_rpe, (size_t)E);
    check_compare_ints(name, "expert_offsets", off, d_off, (size_t)E + 1);
    check_compare_ints(name, "row_of_choice", roc, d_roc, nk);
    check_compare_ints(name, "token_of_row", tor, d_tor, plan_rows);
    check_free_all();
}

static void check_plans(void) {
    static const PlanCase cases[] = {
        {7, 2, 5, 0, 0, 1},   {7, 2, 5, 1, 0, 1},    {7, 2, 5, 0, 1, 1},  {7, 2, 5, 1, 1, 1},   {300, 3, 7, 0, 0, 1},
        {300, 3, 7, 1, 1, 1}, {1000, 2, 31, 1, 0, 1}, {3, 1, 13, 0, 1, 1}, {0, 2, 5, 0, 1, 1},
        // aligned: experts short of tokens to pad with, chunks past one block, drops
        {7, 2, 5, 0, 0, 16}, {7, 2, 5, 1, 0, 4}, {300, 3, 7, 1, 0, 16}, {1000, 2, 31, 1, 0, 32},
        {600, 1, 13, 0, 0, 128}, {0, 2, 5, 0, 0, 16},
    };
    for (int i = 0; i < COUNT(cases); i++) check_plan(&cases[i]);
}

// ---- the allgather dispatcher's own choices ------------------------------------------------------

static void check_keep_local(size_t n, int E, int first, int local) {
    char name[96];
    snprintf(name, sizeof(name), "moe_keep_local_choices n=%zu E=%d experts %d..%d", n, E, first, first + local - 1);
    int32_t *topk = check_random_ints(n, 0, E), *kept = check_random_ints(n, 0, 3);
    for (size_t i = 0; i < n; i++) kept[i] = kept[i] != 0;
    int32_t *d_topk = check_ints_to_device(topk, n), *d_kept = check_ints_to_device(kept, n);
    cpu()->moe_keep_local_choices(kept, topk, n, first, local);
    under()->moe_keep_local_choices(d_kept, d_topk, n, first, local);
    check_finish();
    check_compare_ints(name, "kept", kept, d_kept, n);
    check_free_all();
}

// ---- the alltoall exchange layout and the segment sort -----------------------------------------

typedef struct {
    int P, L, T;  // EP ranks, local experts, ETP ranks
    int width;
} LayoutCase;

// own_counts (P·L) is ETP rank t0's block of recv_counts (S·L), S = T·P; the local plan's
// expert_offsets (P·L + 1) from random rows per expert.
static void check_layout(const LayoutCase *c) {
    char name[96];
    int P = c->P, L = c->L, S = c->T * c->P;
    snprintf(name, sizeof(name), "moe_ep_layout / moe_sort_segments P=%d L=%d T=%d width=%d", P, L, c->T, c->width);
    size_t nrecv = (size_t)S * L, nsizes = (size_t)2 * P + c->T + 1;
    int32_t *recv = check_random_ints(nrecv, 0, 6), *own = recv;  // 0 .. 5 rows, empty segments too
    int32_t *plan_rows = check_random_ints((size_t)P * L, 0, 9), *offsets_plan = check_random_ints((size_t)P * L + 1, 0, 1);
    offsets_plan[0] = 0;
    for (int i = 0; i < P * L; i++) offsets_plan[i + 1] = offsets_plan[i] + plan_rows[i];
    int32_t *counts = check_random_ints((size_t)L, 0, 1), *offsets = check_random_ints((size_t)L + 1, 0, 1);
    int32_t *sizes = check_random_ints(nsizes, 0, 1);
    int32_t *d_recv = check_ints_to_device(recv, nrecv), *d_own = d_recv;
    int32_t *d_plan = check_ints_to_device(offsets_plan, (size_t)P * L + 1);
    int32_t *d_counts = check_device_unset_ints((size_t)L), *d_offsets = check_device_unset_ints((size_t)L + 1);
    int32_t *d_sizes = check_device_unset_ints(nsizes);
    cpu()->moe_ep_layout(counts, offsets, sizes, own, recv, offsets_plan, P, L, S);
    under()->moe_ep_layout(d_counts, d_offsets, d_sizes, d_own, d_recv, d_plan, P, L, S);
    check_finish();
    check_compare_ints(name, "counts", counts, d_counts, (size_t)L);
    check_compare_ints(name, "offsets", offsets, d_offsets, (size_t)L + 1);
    check_compare_ints(name, "sizes", sizes, d_sizes, nsizes);
    // both directions of the sort over these segments (offsets as the layout's)
    size_t n = (size_t)offsets[L] * c->width;
    float *src = check_random(MT_MAX(n, 1), -1, 1), *d_src = check_to_device(src, MT_MAX(n, 1));
    int32_t *d_off = check_ints_to_device(offsets, (size_t)L + 1);
    for (int to_expert_major = 0; to_expert_major < 2; to_expert_major++) {
        float *dst = check_random(MT_MAX(n, 1), -1, 1), *d_dst = check_device_nan(MT_MAX(n, 1));
        cpu()->moe_sort_segments(dst, src, recv, offsets, S, L, c->width, to_expert_major);
        under()->moe_sort_segments(d_dst, d_src, d_recv, d_off, S, L, c->width, to_expert_major);
        check_finish();
        check_compare(name, to_expert_major ? "expert-major rows" : "arrival rows", dst, d_dst, n, 0.0);
    }
    check_free_all();
}

void check_dispatch_ops(void) {
    check_plans();
    check_keep_local(1, 4, 0, 2);
    check_keep_local(5000, 16, 4, 4);
    static const LayoutCase layouts[] = {{2, 2, 1, 5}, {2, 1, 2, 1}, {4, 3, 2, 7}, {1, 4, 1, 3}, {3, 2, 1, 1}};
    for (int i = 0; i < COUNT(layouts); i++) check_layout(&layouts[i]);
}

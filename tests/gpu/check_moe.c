// check_moe.c — the backend under test's MoE ops against the cpu backend (op_check.h): the
// router GEMM in double, the per-token routing, permute and unpermute.
//
// Exact (tolerance 0) where the kernels promise the cpu's bits: router logits (products of
// floats are exact in double and are summed in the cpu's order), permute (copies),
// unpermute (the cpu's float additions in its order) and the chosen experts (integers,
// check_compare_ints). Routing's scores and probs may differ from the cpu's in the last
// bits of exp/log: TOL_FP32. Plans come from dispatch_plan on random routings with
// dropped choices and padding rows; routing cases include exact ties (logits on a coarse
// grid) for the lowest-index rule, group-limited selection, and an expert count large
// enough to need more than 48 KiB of shared memory per block.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/float_formats.h"
#include "op_check.h"
#include "moe/dispatcher.h"

static const OpsBackend *cpu(void) { return &ops_cpu_backend; }

#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))
#define EXACT 0.0

// ---- router logits ----------------------------------------------------------------------------

static void check_router_logits(int N, int H, int E) {
    char name[96];
    snprintf(name, sizeof(name), "moe_router_logits N=%d H=%d E=%d", N, H, E);
    size_t nh = (size_t)N * H, eh = (size_t)E * H, ne = (size_t)N * E;
    float *x = check_random(nh, -2, 2), *W = check_random(eh, -0.5f, 0.5f);
    float *d_x = check_to_device(x, nh), *d_W = check_to_device(W, eh), *d_logits = check_device_nan(ne);
    float *logits = check_random(ne, 0, 1);
    cpu()->moe_router_logits(logits, x, W, N, H, E);
    under()->moe_router_logits(d_logits, d_x, d_W, N, H, E);
    check_compare(name, "logits", logits, d_logits, ne, EXACT);
    check_free_all();
}

// ---- routing ----------------------------------------------------------------------------------

typedef struct {
    const char *what;
    RouteShape r;
    int N, bias, ties;  // bias: an expert bias; ties: logits on a grid of 0.5 (many equal values)
} RouteCase;

static void check_route(const RouteCase *c) {
    char name[128];
    const RouteShape *r = &c->r;
    snprintf(name, sizeof(name), "moe_route_tokens %s N=%d E=%d k=%d", c->what, c->N, r->E, r->k);
    size_t ne = (size_t)c->N * r->E, nk = (size_t)c->N * r->k;
    float *logits = check_random(ne, -4, 4);
    if (c->ties)
        for (size_t i = 0; i < ne; i++) logits[i] = roundf(logits[i] * 2) / 2;
    float *bias = c->bias ? check_random((size_t)r->E, -0.1f, 0.1f) : NULL;
    float *d_logits = check_to_device(logits, ne), *d_bias = bias ? check_to_device(bias, (size_t)r->E) : NULL;
    float *d_scores = check_device_nan(ne), *d_aux = check_device_nan(ne), *d_probs = check_device_nan(nk);
    int32_t *d_idx = check_device_unset_ints(nk);

    float *scores = check_random(ne, 0, 1), *aux = check_random(ne, 0, 1), *probs = check_random(nk, 0, 1);
    int32_t *idx = check_random_ints(nk, 0, 1);
    cpu()->moe_route_tokens(scores, aux, idx, probs, logits, bias, c->N, r);
    under()->moe_route_tokens(d_scores, d_aux, d_idx, d_probs, d_logits, d_bias, c->N, r);

    check_compare(name, "scores", scores, d_scores, ne, TOL_FP32);
    check_compare(name, "aux_scores", aux, d_aux, ne, TOL_FP32);
    check_compare_ints(name, "topk_idx", idx, d_idx, nk);
    check_compare(name, "topk_probs", probs, d_probs, nk, TOL_FP32);
    check_free_all();
}

// Router replay: the picks given (distinct, random), the probs of each score function.
static void check_route_replay(ScoreFunction score, int pre_softmax, int k) {
    char name[128];
    RouteShape r = {.E = 16, .k = k, .score = score, .pre_softmax = pre_softmax, .topk_scaling = 1.5, .replay = 1};
    int N = 40;
    snprintf(name, sizeof(name), "moe_route_tokens replay score=%d pre=%d k=%d", (int)score, pre_softmax, k);
    size_t ne = (size_t)N * r.E, nk = (size_t)N * k;
    float *logits = check_random(ne, -4, 4), *d_logits = check_to_device(logits, ne);
    int32_t *idx = check_random_ints(nk, 0, 1);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) idx[(size_t)n * k + j] = (n * 5 + j * 3) % r.E;  // distinct: 3j mod 16
    int32_t *d_idx = check_ints_to_device(idx, nk);
    float *d_scores = check_device_nan(ne), *d_aux = check_device_nan(ne), *d_probs = check_device_nan(nk);
    float *scores = check_random(ne, 0, 1), *aux = check_random(ne, 0, 1), *probs = check_random(nk, 0, 1);
    cpu()->moe_route_tokens(scores, aux, idx, probs, logits, NULL, N, &r);
    under()->moe_route_tokens(d_scores, d_aux, d_idx, d_probs, d_logits, NULL, N, &r);
    check_compare_ints(name, "topk_idx (kept)", idx, d_idx, nk);
    check_compare(name, "topk_probs", probs, d_probs, nk, TOL_FP32);
    check_free_all();
}

// E, k, score, pre_softmax, topk_scaling, num_groups, group_topk, replay
static const RouteCase ROUTES[] = {
    {"softmax", {8, 2, SCORE_SOFTMAX, 0, 0, 0, 0, 0}, 257, 0, 0},
    {"softmax ties", {8, 2, SCORE_SOFTMAX, 0, 0, 0, 0, 0}, 257, 0, 1},
    {"softmax-pre scaled", {64, 4, SCORE_SOFTMAX, 1, 2.5, 0, 0, 0}, 33, 0, 0},
    {"softmax-pre k=1", {2, 1, SCORE_SOFTMAX, 1, 0, 0, 0, 0}, 5, 0, 0},
    {"softmax E>128", {160, 6, SCORE_SOFTMAX, 0, 0, 0, 0, 0}, 7, 0, 0},
    {"sigmoid E=1", {1, 1, SCORE_SIGMOID, 0, 0, 0, 0, 0}, 3, 0, 0},
    {"sigmoid bias groups", {64, 8, SCORE_SIGMOID, 0, 2.5, 8, 4, 0}, 257, 1, 0},
    {"sigmoid groups ties", {64, 8, SCORE_SIGMOID, 0, 0, 8, 4, 0}, 100, 0, 1},
    {"sigmoid DeepSeek-V3", {256, 8, SCORE_SIGMOID, 0, 2.5, 8, 4, 0}, 65, 1, 0},
    {"sqrtsoftplus bias groups", {16, 4, SCORE_SQRTSOFTPLUS, 0, 0, 4, 2, 0}, 100, 1, 0},
    {"sqrtsoftplus k=1", {12, 1, SCORE_SQRTSOFTPLUS, 0, 0, 0, 0, 0}, 9, 0, 0},
    {"sigmoid E=3000 (shared memory opt-in)", {3000, 8, SCORE_SIGMOID, 0, 0, 0, 0, 0}, 9, 1, 0},
};

// ---- permute / unpermute ---------------------------------------------------------------------

typedef struct {
    int N, k, E, H;
    int drop, pad;  // drop: about 1 choice in 5 dropped; pad: every expert padded past its rows
    int align;      // > 1: an aligned plan (--moe-router-padding-for-quantization)
} PlanCase;

// A plan of random routings: k distinct experts per token (rejection from a pool of random
// draws, the lowest free expert when it runs dry), the kept flags and padding of the case.
static DispatchPlan random_plan(const PlanCase *c) {
    int N = c->N, k = c->k, E = c->E;
    size_t nk = (size_t)N * k, pool_size = nk * 4 + 1, next = 0;
    int32_t *pool = check_random_ints(pool_size, 0, E), *topk = check_random_ints(nk, 0, 1);
    int32_t *kept = c->drop ? check_random_ints(nk, 0, 5) : NULL;  // 0 = dropped
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            int e = -1;
            for (int fresh = 0; !fresh;) {
                e = next < pool_size ? pool[next++] : (e + 1) % E;
                fresh = 1;
                for (int i = 0; i < j; i++) fresh &= topk[n * k + i] != e;
            }
            topk[n * k + j] = e;
        }
    int capacity = 0;
    if (c->pad) {  // one more than the fullest expert, so every expert gets padding rows
        int32_t *count = check_random_ints((size_t)E, 0, 1);
        memset(count, 0, (size_t)E * sizeof(int32_t));
        for (size_t i = 0; i < nk; i++)
            if (!kept || kept[i]) capacity = MT_MAX(capacity, ++count[topk[i]]);
        capacity++;
    }
    size_t rows = c->pad ? (size_t)E * capacity : dispatch_max_rows(N, k, E, 0, 0, c->align);
    DispatchPlan plan = {.N = N, .k = k, .E = E, .align = c->align};
    plan.rows_per_expert = check_random_ints((size_t)E, 0, 1);
    plan.expert_offsets = check_random_ints((size_t)E + 1, 0, 1);
    plan.row_of_choice = check_random_ints(nk, 0, 1);
    plan.token_of_row = check_random_ints(rows, 0, 1);
    dispatch_plan(&plan, topk, kept, capacity);
    return plan;
}

static void check_permute(const PlanCase *c) {
    char name[128];
    snprintf(name, sizeof(name), "moe_permute/unpermute N=%d k=%d E=%d H=%d%s%s align=%d", c->N, c->k, c->E, c->H,
             c->drop ? " drop" : "", c->pad ? " pad" : "", c->align);
    DispatchPlan plan = random_plan(c);
    int N = c->N, k = c->k, H = c->H, R = plan.expert_offsets[c->E];
    size_t nh = (size_t)N * H, rh = (size_t)R * H, nk = (size_t)N * k;
    float *x = check_random(nh, -2, 2), *choice_values = check_random(nk, 0, 1);
    float *y = check_random(rh, -2, 2), *y_values = check_random((size_t)R, -1, 1), *acc = check_random(nh, -1, 1);
    int32_t *d_token_of_row = check_ints_to_device(plan.token_of_row, (size_t)R);
    int32_t *d_row_of_choice = check_ints_to_device(plan.row_of_choice, nk);
    float *d_x = check_to_device(x, nh), *d_choice_values = check_to_device(choice_values, nk);
    float *d_y = check_to_device(y, rh), *d_y_values = check_to_device(y_values, (size_t)R);
    float *d_acc = check_to_device(acc, nh), *d_rows = check_device_nan(rh), *d_row_values = check_device_nan(R);
    float *d_out = check_device_nan(nh), *d_gathered = check_device_nan(nk), *d_gathered_alone = check_device_nan(nk);

    float *rows = check_random(rh, 0, 1), *row_values = check_random((size_t)R, 0, 1);
    float *out = check_random(nh, 0, 1), *gathered = check_random(nk, 0, 1);
    cpu()->moe_permute(rows, STORE_FP32, row_values, x, STORE_FP32, choice_values, plan.token_of_row,
                       plan.row_of_choice, R, k, H);
    cpu()->moe_unpermute(out, gathered, y, y_values, plan.row_of_choice, N, k, H, 0);
    cpu()->moe_unpermute(acc, NULL, y, NULL, plan.row_of_choice, N, k, H, 1);

    under()->moe_permute(d_rows, STORE_FP32, d_row_values, d_x, STORE_FP32, d_choice_values, d_token_of_row,
                         d_row_of_choice, R, k, H);
    // the rows stored as bf16 (gemm.h STORE_BF16: the experts' input rows under --bf16), read back
    // through bf16_unpack: the fp32 rows rounded as bf16_pack rounds
    float *d_rows16 = check_device_nan((rh + 1) / 2), *d_rows_widened = check_device_nan(rh);
    under()->moe_permute(d_rows16, STORE_BF16, NULL, d_x, STORE_FP32, NULL, d_token_of_row, d_row_of_choice, R, k, H);
    under()->bf16_unpack(d_rows_widened, d_rows16, rh);
    float *rows_rounded = check_host_copy(rows, rh);
    for (size_t i = 0; i < rh; i++) rows_rounded[i] = bf16_to_float(bf16_from_float_flushed(rows[i]));
    // x stored as bf16 (a MoE layer's ln2 under --bf16), read widened: the rows of its values, as
    // fp32 rows and as bf16 rows (the same values)
    float *x_rounded = check_host_copy(x, nh), *rows_of_rounded = check_random(rh, 0, 1);
    void *d_x16 = check_stored_to_device(x_rounded, nh, STORE_BF16);
    cpu()->moe_permute(rows_of_rounded, STORE_FP32, NULL, x_rounded, STORE_FP32, NULL, plan.token_of_row,
                       plan.row_of_choice, R, k, H);
    float *d_rows_from16 = check_device_nan(rh), *d_rows16_from16 = check_device_nan((rh + 1) / 2);
    under()->moe_permute(d_rows_from16, STORE_FP32, NULL, d_x16, STORE_BF16, NULL, d_token_of_row, d_row_of_choice,
                         R, k, H);
    under()->moe_permute(d_rows16_from16, STORE_BF16, NULL, d_x16, STORE_BF16, NULL, d_token_of_row, d_row_of_choice, R,
                         k, H);
    under()->moe_unpermute(d_out, d_gathered, d_y, d_y_values, d_row_of_choice, N, k, H, 0);
    under()->moe_unpermute(d_acc, NULL, d_y, NULL, d_row_of_choice, N, k, H, 1);
    under()->moe_unpermute(NULL, d_gathered_alone, NULL, d_y_values, d_row_of_choice, N, k, H, 0);

    check_compare(name, "rows", rows, d_rows, rh, EXACT);
    check_compare(name, "rows stored bf16", rows_rounded, d_rows_widened, rh, EXACT);
    check_compare(name, "rows of bf16 x", rows_of_rounded, d_rows_from16, rh, EXACT);
    float *rows16_widened = check_widened_from_device(d_rows16_from16, rh, STORE_BF16);
    check_compare(name, "bf16 rows of bf16 x", rows_of_rounded, rows16_widened, rh, EXACT);
    check_compare(name, "row_values", row_values, d_row_values, (size_t)R, EXACT);
    check_compare(name, "out", out, d_out, nh, EXACT);
    check_compare(name, "out +=", acc, d_acc, nh, EXACT);
    check_compare(name, "choice_values", gathered, d_gathered, nk, EXACT);
    check_compare(name, "choice_values alone", gathered, d_gathered_alone, nk, EXACT);
    check_free_all();
    dispatch_plan_free(&plan);
}

static const PlanCase PLANS[] = {
    {1, 1, 1, 1, 0, 0, 1},   {7, 2, 4, 7, 1, 0, 1},      {257, 2, 8, 64, 0, 1, 1},
    {33, 6, 64, 4097, 1, 0, 1}, {300, 8, 256, 129, 1, 1, 1},
    {257, 2, 8, 64, 1, 0, 16}, {70, 2, 8, 33, 0, 0, 32},  // aligned: padding rows of real tokens
};

void check_moe_ops(void) {
    static const int LOGITS[][3] = {{1, 1, 1}, {3, 7, 5}, {257, 64, 60}, {33, 4097, 17}, {1000, 256, 256}};
    for (int i = 0; i < COUNT(LOGITS); i++) check_router_logits(LOGITS[i][0], LOGITS[i][1], LOGITS[i][2]);
    for (int i = 0; i < COUNT(ROUTES); i++) check_route(&ROUTES[i]);
    check_route_replay(SCORE_SOFTMAX, 0, 2);
    check_route_replay(SCORE_SOFTMAX, 1, 4);
    check_route_replay(SCORE_SIGMOID, 0, 3);
    check_route_replay(SCORE_SQRTSOFTPLUS, 0, 1);
    for (int i = 0; i < COUNT(PLANS); i++) check_permute(&PLANS[i]);
}

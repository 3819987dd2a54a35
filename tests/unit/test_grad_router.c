// test_grad_router.c — the MoE router (src/moe/router.h) in double precision (real = double).
//
// Forward: hand-derived golden cases for every routing mode (score functions, top-k
// scaling, group-limited routing, expert bias, ties, capacity dropping, the balance losses,
// z-loss), each also compared in full with a reference router written here from the
// header's definitions (sorting instead of repeated arg-max, no max-shifted softmax, a
// selection-based capacity pass), never with router.c's helpers.
//
// Backward: central differences of J = Σ topk_probs ⊙ R + loss_scale·router_objective
// against router_backward(dlogits, R, ...). Perturbations that change a discrete decision
// (topk_idx, kept, or the balance counts) are skipped and counted; a case fails when more
// than 5% are skipped. An element passes when |a − n| <= 1e-8 + 1e-6·(|a| + |n|).
#include <math.h>
#include <string.h>

#include "core/rng.h"
#include "moe/router.h"
#include "ops/moe_route.h"
#include "testlib.h"

#define FD_EPS 1e-6
#define FD_ATOL 1e-8
#define FD_RTOL 1e-6
#define NORM_EPS 1e-20  // the header's epsilon of the sigmoid / sqrtsoftplus normalisations

enum { MAXN = 16, MAXE = 16, MAXK = 8 };

// ---- buffers and configuration --------------------------------------------------------------

static real *alloc_normal(Rng *rng, size_t n, double scale) {
    real *x = mt_malloc((n ? n : 1) * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = (real)(scale * rng_normal(rng));
    return x;
}

static void out_alloc(RouterOutput *o, int N, int E, int k, int sequences) {
    memset(o, 0, sizeof *o);
    o->scores = mt_malloc((size_t)N * E * sizeof(real));
    o->aux_scores = mt_malloc((size_t)N * E * sizeof(real));
    o->topk_idx = mt_malloc((size_t)N * k * sizeof(int32_t));
    o->topk_probs = mt_malloc((size_t)N * k * sizeof(real));
    o->kept = mt_malloc((size_t)N * k * sizeof(int32_t));
    o->tokens_per_expert = mt_malloc(E * sizeof(int32_t));
    o->aux_counts = mt_malloc(E * sizeof(int32_t));
    o->seq_counts = mt_malloc((size_t)sequences * E * sizeof(int32_t));
    o->global_counts = mt_malloc(E * sizeof(double));
    o->group_counts = mt_malloc(E * sizeof(double));
}

static void out_free(RouterOutput *o) {
    free(o->scores), free(o->aux_scores), free(o->topk_idx), free(o->topk_probs), free(o->kept);
    free(o->tokens_per_expert), free(o->aux_counts), free(o->seq_counts), free(o->global_counts), free(o->group_counts);
    free(o->report);  // host memory router_forward allocated
}

static RouterConfig config(int E, int k, ScoreFunction score, int pre_softmax) {
    RouterConfig rc;
    memset(&rc, 0, sizeof rc);
    rc.E = E, rc.k = k, rc.score = score, rc.pre_softmax = pre_softmax;
    return rc;
}

static RouterCall call_of(int N, int seq_length) {
    RouterCall c;
    memset(&c, 0, sizeof c);
    c.N = N, c.seq_length = seq_length;
    return c;
}

// router_forward into a fresh output (caller frees)
static void route(RouterOutput *o, const real *logits, const RouterConfig *rc, const RouterCall *call) {
    out_alloc(o, call->N, rc->E, rc->k, call->N / call->seq_length);
    router_forward(o, logits, rc, call);
}

static double sig(double x) { return 1 / (1 + exp(-x)); }
static double sqrt_softplus(double x) { return sqrt(x > 20 ? x : log1p(exp(x))); }

// ---- reference router -------------------------------------------------------------------------

typedef struct {
    double scores[MAXN * MAXE], aux[MAXN * MAXE], probs[MAXN * MAXK], global_counts[MAXE];
    int idx[MAXN * MAXK], kept[MAXN * MAXK], tpe[MAXE], aux_counts[MAXE], seq_counts[MAXN * MAXE];
    int capacity, dropped;
    double balance[BALANCE_TYPES], z, objective;
} Ref;

// Indices of v (n) with mask[i] (NULL: all), sorted by value descending, stable (lowest
// index first among equal values). Returns how many.
static int sorted_desc(int *order, const double *v, const unsigned char *mask, int n) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (mask && !mask[i]) continue;
        int p = m++;
        while (p > 0 && v[order[p - 1]] < v[i]) order[p] = order[p - 1], p--;
        order[p] = i;
    }
    return m;
}

static void ref_forward(Ref *r, const real *logits, const RouterConfig *rc, const RouterCall *call) {
    int N = call->N, E = rc->E, k = rc->k, S = call->seq_length;
    memset(r, 0, sizeof *r);
    double scale = rc->topk_scaling > 0 ? rc->topk_scaling : 1;
    for (int n = 0; n < N; n++) {
        const real *l = logits + n * E;
        double *s = r->scores + n * E, *a = r->aux, total = 0, sel[MAXE];
        for (int e = 0; e < E; e++) total += exp(l[e]);
        r->z += log(total) * log(total) / N;
        for (int e = 0; e < E; e++)
            s[e] = rc->score == SCORE_SOFTMAX ? exp(l[e]) / total : rc->score == SCORE_SIGMOID ? sig(l[e]) : sqrt_softplus(l[e]);
        double ssum = 0;
        for (int e = 0; e < E; e++) ssum += s[e];
        for (int e = 0; e < E; e++) a[n * E + e] = rc->score == SCORE_SOFTMAX ? s[e] : s[e] / (ssum + NORM_EPS);
        for (int e = 0; e < E; e++)
            sel[e] = rc->score == SCORE_SOFTMAX ? (rc->pre_softmax ? s[e] : l[e])
                                                : s[e] + (call->expert_bias ? call->expert_bias[e] : 0);
        unsigned char allowed[MAXE];
        memset(allowed, 1, sizeof allowed);
        if (rc->num_groups > 0) {
            int G = rc->num_groups, size = E / G, per = k / rc->group_topk, order[MAXE];
            double gscore[MAXE];
            for (int g = 0; g < G; g++) {
                sorted_desc(order, sel + g * size, NULL, size);
                gscore[g] = 0;
                for (int i = 0; i < per; i++) gscore[g] += sel[g * size + order[i]];
            }
            sorted_desc(order, gscore, NULL, G);
            memset(allowed, 0, sizeof allowed);
            for (int i = 0; i < rc->group_topk; i++)
                for (int e = 0; e < size; e++) allowed[order[i] * size + e] = 1;
        }
        int order[MAXE];
        sorted_desc(order, sel, allowed, E);
        int *idx = r->idx + n * k;
        double *p = r->probs + n * k, denom = 0;
        for (int j = 0; j < k; j++) idx[j] = order[j];
        if (rc->score == SCORE_SOFTMAX && !rc->pre_softmax) {
            for (int j = 0; j < k; j++) denom += exp(l[idx[j]]);
            for (int j = 0; j < k; j++) p[j] = exp(l[idx[j]]) / denom;
        } else {
            for (int j = 0; j < k; j++) denom += s[idx[j]];
            int normalise = rc->score != SCORE_SOFTMAX && k > 1;
            for (int j = 0; j < k; j++) p[j] = normalise ? s[idx[j]] / (denom + NORM_EPS) : s[idx[j]];
        }
        for (int j = 0; j < k; j++) p[j] *= scale, r->kept[n * k + j] = 1;
    }
    if (rc->capacity_factor > 0) {
        int C = (int)ceil((double)k * N / E * rc->capacity_factor);
        C = C > N ? N : C;
        for (int e = 0; e < E; e++) {
            // keep C choices of e one at a time: the best remaining (largest prob, earliest
            // choice) for "probs", the earliest for "position"
            unsigned char keep[MAXN * MAXK] = {0};
            for (int c = 0; c < C; c++) {
                int best = -1;
                for (int i = 0; i < N * k; i++) {
                    if (r->idx[i] != e || keep[i]) continue;
                    if (best < 0 || (rc->drop_policy == DROP_PROBS && r->probs[i] > r->probs[best])) best = i;
                }
                if (best >= 0) keep[best] = 1;
            }
            for (int i = 0; i < N * k; i++)
                if (r->idx[i] == e && !keep[i]) r->kept[i] = 0, r->probs[i] = 0, r->dropped++;
        }
        r->capacity = rc->pad_to_capacity ? C : 0;
    }
    for (int i = 0; i < N * k; i++) r->tpe[r->idx[i]] += r->kept[i];
    // balance: counts of the top-k of ŝ, per micro-batch and per sequence
    for (int n = 0; n < N; n++) {
        int order[MAXE];
        sorted_desc(order, r->aux + n * E, NULL, E);
        for (int j = 0; j < k; j++) r->aux_counts[order[j]]++, r->seq_counts[(n / S) * E + order[j]]++;
    }
    int sequences = N / S;
    for (int e = 0; e < E; e++) {
        double before = call->global_counts_before ? call->global_counts_before[e] : 0;
        r->global_counts[e] = (before + r->aux_counts[e]) / (call->global_batches_before + 1);
        double col = 0;
        for (int n = 0; n < N; n++) col += r->aux[n * E + e];
        r->balance[BALANCE_AUX] += (double)E / (k * N * N) * r->aux_counts[e] * col;
        r->balance[BALANCE_GLOBAL_AUX] += (double)E / (k * N * N) * r->global_counts[e] * col;
        for (int b = 0; b < sequences; b++) {
            double scol = 0;
            for (int t = 0; t < S; t++) scol += r->aux[(b * S + t) * E + e];
            r->balance[BALANCE_SEQ_AUX] += (double)E / (k * S * S) * r->seq_counts[b * E + e] * scol / sequences;
        }
    }
    r->objective = rc->z_loss_coeff * r->z;
    for (int t = 0; t < BALANCE_TYPES; t++) r->objective += rc->balance_coeff[t] * r->balance[t];
}

// Every output of router_forward against the reference.
static void check_against_ref(const char *what, const real *logits, const RouterConfig *rc, const RouterCall *call) {
    int N = call->N, E = rc->E, k = rc->k, sequences = N / call->seq_length;
    MT_ASSERT(N <= MAXN && E <= MAXE && k <= MAXK);
    Ref r;
    ref_forward(&r, logits, rc, call);
    RouterOutput o;
    route(&o, logits, rc, call);
    for (int i = 0; i < N * E; i++) {
        CHECK(fabs(o.scores[i] - r.scores[i]) <= 1e-15 + 1e-13 * fabs(r.scores[i]),
              "%s: scores[%d,%d] = %.17g, expected %.17g", what, i / E, i % E, (double)o.scores[i], r.scores[i]);
        CHECK(fabs(o.aux_scores[i] - r.aux[i]) <= 1e-15 + 1e-13 * fabs(r.aux[i]),
              "%s: aux_scores[%d,%d] = %.17g, expected %.17g", what, i / E, i % E, (double)o.aux_scores[i], r.aux[i]);
    }
    for (int i = 0; i < N * k; i++) {
        CHECK(o.topk_idx[i] == r.idx[i], "%s: topk_idx[%d,%d] = %d, expected %d", what, i / k, i % k, o.topk_idx[i],
              r.idx[i]);
        CHECK(o.kept[i] == r.kept[i], "%s: kept[%d,%d] = %d, expected %d", what, i / k, i % k, o.kept[i], r.kept[i]);
        CHECK(fabs(o.topk_probs[i] - r.probs[i]) <= 1e-15 + 1e-13 * fabs(r.probs[i]),
              "%s: topk_probs[%d,%d] = %.17g, expected %.17g", what, i / k, i % k, (double)o.topk_probs[i], r.probs[i]);
    }
    for (int e = 0; e < E; e++) {
        CHECK(o.tokens_per_expert[e] == r.tpe[e], "%s: tokens_per_expert[%d] = %d, expected %d", what, e,
              o.tokens_per_expert[e], r.tpe[e]);
        CHECK(o.aux_counts[e] == r.aux_counts[e], "%s: aux_counts[%d] = %d, expected %d", what, e, o.aux_counts[e],
              r.aux_counts[e]);
        CHECK(o.global_counts[e] == r.global_counts[e], "%s: global_counts[%d] = %.17g, expected %.17g", what, e,
              o.global_counts[e], r.global_counts[e]);
        for (int b = 0; b < sequences; b++)
            CHECK(o.seq_counts[b * E + e] == r.seq_counts[b * E + e], "%s: seq_counts[%d,%d] = %d, expected %d", what,
                  b, e, o.seq_counts[b * E + e], r.seq_counts[b * E + e]);
    }
    CHECK(o.capacity == r.capacity, "%s: capacity %d, expected %d", what, o.capacity, r.capacity);
    CHECK(o.dropped == r.dropped, "%s: dropped %d, expected %d", what, o.dropped, r.dropped);
    for (int t = 0; t < BALANCE_TYPES; t++)
        CHECK(fabs(o.balance_loss[t] - r.balance[t]) <= 1e-15 + 1e-13 * fabs(r.balance[t]),
              "%s: balance_loss[%s] = %.17g, expected %.17g", what, BALANCE_TYPE_NAMES[t], o.balance_loss[t], r.balance[t]);
    CHECK(fabs(o.z_loss - r.z) <= 1e-15 + 1e-13 * r.z, "%s: z_loss = %.17g, expected %.17g", what, o.z_loss, r.z);
    double obj = router_objective(&o, rc);
    CHECK(fabs(obj - r.objective) <= 1e-15 + 1e-13 * fabs(r.objective), "%s: router_objective = %.17g, expected %.17g",
          what, obj, r.objective);
    out_free(&o);
}

// ---- golden checks: expectations spelled out by hand --------------------------------------------

static void expect_idx(const char *what, const RouterOutput *o, const int32_t *want, int n) {
    for (int i = 0; i < n; i++)
        CHECK(o->topk_idx[i] == want[i], "%s: topk_idx[%d] = %d, expected %d", what, i, o->topk_idx[i], want[i]);
}

static void expect_probs(const char *what, const RouterOutput *o, const double *want, int n) {
    for (int i = 0; i < n; i++)
        CHECK(fabs(o->topk_probs[i] - want[i]) <= 1e-15 + 1e-13 * fabs(want[i]), "%s: topk_probs[%d] = %.17g, expected %.17g",
              what, i, (double)o->topk_probs[i], want[i]);
}

static void expect_ints(const char *what, const int32_t *got, const int32_t *want, int n) {
    for (int i = 0; i < n; i++) CHECK(got[i] == want[i], "%s[%d] = %d, expected %d", what, i, got[i], want[i]);
}

static double lse(const real *l, int E) {
    double s = 0;
    for (int e = 0; e < E; e++) s += exp(l[e]);
    return log(s);
}

// E=4, N=3: a row with two clear leaders, an all-equal row and a row with a tie at the top.
static const real GOLD_L[3 * 4] = {1, 3, 2, 0.5, 0, 0, 0, 0, -1, 2, 2, 1};

static void test_softmax_post_golden(void) {
    RouterConfig rc = config(4, 2, SCORE_SOFTMAX, 0);
    RouterCall call = call_of(3, 3);
    RouterOutput o;
    route(&o, GOLD_L, &rc, &call);
    static const int32_t want[6] = {1, 2, 0, 1, 1, 2};
    double a = 1 / (1 + exp(-1.0));  // softmax(3, 2)
    double p[6] = {a, 1 - a, 0.5, 0.5, 0.5, 0.5};
    expect_idx("softmax post k=2", &o, want, 6);
    expect_probs("softmax post k=2", &o, p, 6);
    static const int32_t counts[4] = {1, 3, 2, 0};
    expect_ints("softmax post aux_counts", o.aux_counts, counts, 4);
    expect_ints("softmax post tokens_per_expert", o.tokens_per_expert, counts, 4);
    for (int n = 0; n < 3; n++)
        for (int e = 0; e < 4; e++) {
            double s = exp(GOLD_L[n * 4 + e] - lse(GOLD_L + n * 4, 4));
            CHECK_CLOSE(o.scores[n * 4 + e], s, 1e-16, 1e-13, "softmax scores");
            CHECK_CLOSE(o.aux_scores[n * 4 + e], s, 1e-16, 1e-13, "softmax aux_scores");
        }
    CHECK(o.capacity == 0 && o.dropped == 0, "dropless: capacity %d dropped %d", o.capacity, o.dropped);
    for (int i = 0; i < 6; i++) CHECK(o.kept[i] == 1, "dropless kept[%d] = %d", i, o.kept[i]);
    out_free(&o);
    check_against_ref("softmax post k=2", GOLD_L, &rc, &call);
    // k = 1: the single prob is exactly 1
    rc.k = 1;
    route(&o, GOLD_L, &rc, &call);
    static const int32_t want1[3] = {1, 0, 1};
    expect_idx("softmax post k=1", &o, want1, 3);
    for (int n = 0; n < 3; n++) CHECK(o.topk_probs[n] == 1, "softmax post k=1 prob %.17g", (double)o.topk_probs[n]);
    out_free(&o);
    check_against_ref("softmax post k=1", GOLD_L, &rc, &call);
}

static void test_softmax_pre_golden(void) {
    for (int k = 1; k <= 3; k++) {
        RouterConfig rc = config(4, k, SCORE_SOFTMAX, 1);
        RouterCall call = call_of(3, 3);
        RouterOutput o;
        route(&o, GOLD_L, &rc, &call);
        static const int32_t want[3][3] = {{1, 2, 0}, {0, 1, 2}, {1, 2, 3}};
        for (int n = 0; n < 3; n++)
            for (int j = 0; j < k; j++) {
                int e = want[n][j];
                CHECK(o.topk_idx[n * k + j] == e, "softmax pre k=%d: topk_idx[%d,%d] = %d, expected %d", k, n, j,
                      o.topk_idx[n * k + j], e);
                // the full softmax's value, not renormalised over the k
                double p = exp(GOLD_L[n * 4 + e]) / exp(lse(GOLD_L + n * 4, 4));
                CHECK_CLOSE(o.topk_probs[n * k + j], p, 1e-16, 1e-13, "softmax pre prob");
            }
        CHECK_CLOSE(o.topk_probs[k], 0.25, 0, 1e-15, "softmax pre: all-equal row");
        out_free(&o);
        check_against_ref("softmax pre", GOLD_L, &rc, &call);
    }
}

// σ(2) > σ(1) > σ(0) ... ; row 1 has a tie at 0.5 (experts 2 and 3), row 2 is all equal.
static const real SIG_L[3 * 4] = {0, 1, -1, 2, 3, -2, 0.5, 0.5, -1, -1, -1, -1};

static void test_sigmoid_golden(void) {
    RouterConfig rc = config(4, 2, SCORE_SIGMOID, 0);
    RouterCall call = call_of(3, 3);
    RouterOutput o;
    route(&o, SIG_L, &rc, &call);
    static const int32_t want[6] = {3, 1, 0, 2, 0, 1};
    double d0 = sig(2) + sig(1) + NORM_EPS, d1 = sig(3) + sig(0.5) + NORM_EPS;
    double p[6] = {sig(2) / d0, sig(1) / d0, sig(3) / d1, sig(0.5) / d1, 0.5, 0.5};
    expect_idx("sigmoid k=2", &o, want, 6);
    expect_probs("sigmoid k=2", &o, p, 6);
    for (int n = 0; n < 3; n++) {
        double sum = 0;
        for (int e = 0; e < 4; e++) sum += sig(SIG_L[n * 4 + e]);
        for (int e = 0; e < 4; e++) {
            CHECK_CLOSE(o.scores[n * 4 + e], sig(SIG_L[n * 4 + e]), 1e-16, 1e-14, "sigmoid scores");
            CHECK_CLOSE(o.aux_scores[n * 4 + e], sig(SIG_L[n * 4 + e]) / (sum + NORM_EPS), 1e-16, 1e-14,
                        "sigmoid aux_scores");
        }
    }
    static const int32_t counts[4] = {2, 2, 1, 1};
    expect_ints("sigmoid aux_counts", o.aux_counts, counts, 4);
    out_free(&o);
    check_against_ref("sigmoid k=2", SIG_L, &rc, &call);
    // k = 1: not normalised
    rc.k = 1;
    route(&o, SIG_L, &rc, &call);
    static const int32_t want1[3] = {3, 0, 0};
    double p1[3] = {sig(2), sig(3), sig(-1)};
    expect_idx("sigmoid k=1", &o, want1, 3);
    expect_probs("sigmoid k=1", &o, p1, 3);
    out_free(&o);
    check_against_ref("sigmoid k=1", SIG_L, &rc, &call);
}

// Logits on both sides of softplus's threshold: 25 and 20.5 take softplus(x) = x exactly,
// 20 and 19.5 take log1p(exp(x)).
static const real SSP_L[2 * 4] = {25, 20, 0, -3, 20.5, 19.5, -30, 1};

static void test_sqrtsoftplus_golden(void) {
    RouterConfig rc = config(4, 2, SCORE_SQRTSOFTPLUS, 0);
    RouterCall call = call_of(2, 2);
    RouterOutput o;
    route(&o, SSP_L, &rc, &call);
    CHECK(o.scores[0] == 5, "sqrtsoftplus(25) = %.17g, expected exactly 5", (double)o.scores[0]);
    CHECK(o.scores[4] == sqrt(20.5), "sqrtsoftplus(20.5) = %.17g, expected exactly sqrt(20.5) = %.17g",
          (double)o.scores[4], sqrt(20.5));
    CHECK(o.scores[4] != sqrt(log1p(exp(20.5))), "sqrtsoftplus(20.5) took the log1p branch");
    double s20 = sqrt(log1p(exp(20.0))), s195 = sqrt(log1p(exp(19.5)));
    CHECK_CLOSE(o.scores[1], s20, 0, 1e-15, "sqrtsoftplus(20): log1p branch");
    CHECK_CLOSE(o.scores[2], sqrt(log(2.0)), 0, 1e-15, "sqrtsoftplus(0)");
    CHECK_CLOSE(o.scores[3], sqrt(log1p(exp(-3.0))), 0, 1e-15, "sqrtsoftplus(-3)");
    CHECK_CLOSE(o.scores[5], s195, 0, 1e-15, "sqrtsoftplus(19.5)");
    CHECK_CLOSE(o.scores[6], sqrt(log1p(exp(-30.0))), 0, 1e-14, "sqrtsoftplus(-30)");
    static const int32_t want[4] = {0, 1, 0, 1};
    double d0 = 5 + s20 + NORM_EPS, d1 = sqrt(20.5) + s195 + NORM_EPS;
    double p[4] = {5 / d0, s20 / d0, sqrt(20.5) / d1, s195 / d1};
    expect_idx("sqrtsoftplus k=2", &o, want, 4);
    expect_probs("sqrtsoftplus k=2", &o, p, 4);
    out_free(&o);
    check_against_ref("sqrtsoftplus k=2", SSP_L, &rc, &call);
    rc.k = 1;
    route(&o, SSP_L, &rc, &call);
    double p1[2] = {5, sqrt(20.5)};
    expect_idx("sqrtsoftplus k=1", &o, (const int32_t[]){0, 0}, 2);
    expect_probs("sqrtsoftplus k=1 (not normalised)", &o, p1, 2);
    // past the threshold the slope is exactly 1/(2·sqrt(x)) (σ(x) would differ by ~1e-9,
    // below what finite differences resolve); unselected experts get nothing
    real dl[8], dp[2] = {1, 1};
    router_backward(dl, dp, SSP_L, &o, &rc, &call, 1);
    CHECK_CLOSE(dl[0], 0.1, 0, 1e-15, "d sqrtsoftplus(25)");
    CHECK_CLOSE(dl[4], 0.5 / sqrt(20.5), 0, 1e-15, "d sqrtsoftplus(20.5)");
    for (int i = 0; i < 8; i++)
        if (i % 4) CHECK(dl[i] == 0, "unselected expert got dlogits[%d] = %g", i, (double)dl[i]);
    out_free(&o);
    check_against_ref("sqrtsoftplus k=1", SSP_L, &rc, &call);
}

static void test_topk_scaling_golden(void) {
    RouterCall call = call_of(3, 3);
    RouterOutput o;
    RouterConfig rc = config(4, 2, SCORE_SOFTMAX, 0);
    rc.topk_scaling = 2.5;
    route(&o, GOLD_L, &rc, &call);
    double a = 1 / (1 + exp(-1.0));
    double p[6] = {2.5 * a, 2.5 * (1 - a), 1.25, 1.25, 1.25, 1.25};
    expect_probs("softmax post × 2.5", &o, p, 6);
    out_free(&o);
    check_against_ref("softmax post × 2.5", GOLD_L, &rc, &call);
    rc = config(4, 1, SCORE_SIGMOID, 0);
    rc.topk_scaling = 0.5;
    route(&o, SIG_L, &rc, &call);
    double p1[3] = {0.5 * sig(2), 0.5 * sig(3), 0.5 * sig(-1)};
    expect_probs("sigmoid k=1 × 0.5", &o, p1, 3);
    out_free(&o);
    check_against_ref("sigmoid k=1 × 0.5", SIG_L, &rc, &call);
    rc = config(4, 2, SCORE_SOFTMAX, 1);
    rc.topk_scaling = 3;
    check_against_ref("softmax pre × 3", GOLD_L, &rc, &call);
    rc = config(4, 2, SCORE_SQRTSOFTPLUS, 0);
    rc.topk_scaling = 1.7;
    RouterCall call2 = call_of(2, 1);
    check_against_ref("sqrtsoftplus × 1.7", SSP_L, &rc, &call2);
}

static void test_expert_bias_golden(void) {
    static const real L[2 * 4] = {1, 0.5, 0, -1, 2, 1, 0, -2};
    static const real bias[4] = {0, 0, 0.75, 0};  // lifts expert 2 (σ(0) + 0.75 = 1.25) to the top
    RouterCall call = call_of(2, 2);
    RouterOutput o;
    for (int k = 1; k <= 2; k++) {
        RouterConfig rc = config(4, k, SCORE_SIGMOID, 0);
        call.expert_bias = NULL;
        route(&o, L, &rc, &call);
        static const int32_t plain[4] = {0, 1, 0, 1};
        for (int n = 0; n < 2; n++)
            for (int j = 0; j < k; j++)
                CHECK(o.topk_idx[n * k + j] == plain[n * 2 + j], "no bias k=%d: topk_idx[%d,%d] = %d", k, n, j,
                      o.topk_idx[n * k + j]);
        RouterOutput ob;
        call.expert_bias = bias;
        route(&ob, L, &rc, &call);
        if (k == 1) {
            expect_idx("bias k=1", &ob, (const int32_t[]){2, 2}, 2);
            expect_probs("bias k=1: prob is σ(0), unbiased", &ob, (const double[]){0.5, 0.5}, 2);
        } else {
            expect_idx("bias k=2", &ob, (const int32_t[]){2, 0, 2, 0}, 4);
            double d0 = 0.5 + sig(1) + NORM_EPS, d1 = 0.5 + sig(2) + NORM_EPS;
            expect_probs("bias k=2", &ob, (const double[]){0.5 / d0, sig(1) / d0, 0.5 / d1, sig(2) / d1}, 4);
        }
        // the bias touches neither the scores nor the balance statistics
        for (int i = 0; i < 8; i++)
            CHECK(ob.scores[i] == o.scores[i] && ob.aux_scores[i] == o.aux_scores[i], "bias changed score %d", i);
        for (int e = 0; e < 4; e++) CHECK(ob.aux_counts[e] == o.aux_counts[e], "bias changed aux_counts[%d]", e);
        for (int t = 0; t < BALANCE_TYPES; t++)
            CHECK(ob.balance_loss[t] == o.balance_loss[t], "bias changed %s", BALANCE_TYPE_NAMES[t]);
        out_free(&o), out_free(&ob);
        check_against_ref("sigmoid with bias", L, &rc, &call);
        rc.score = SCORE_SQRTSOFTPLUS;
        check_against_ref("sqrtsoftplus with bias", L, &rc, &call);
        rc.score = SCORE_SOFTMAX;  // softmax routing ignores the bias
        check_against_ref("softmax post ignores bias", L, &rc, &call);
        rc.pre_softmax = 1;
        check_against_ref("softmax pre ignores bias", L, &rc, &call);
    }
}

static void test_groups_golden(void) {
    // E=8 in 2 groups of 4, best 1 group, k=2: group score = sum of its top 2 selection values.
    static const real L[3 * 8] = {
        4, -3, -3, -3, 2, 2, 1, 0,     // top-2 sums 1 vs 4 (max alone would pick group 0)
        3, 2, -10, -10, 2, 2, 0, 0,    // 5 vs 4 (a sum over the whole group would pick group 1)
        1, 1, 0, 0, 1, 1, 0, 0,        // tie: group 0
    };
    RouterConfig rc = config(8, 2, SCORE_SOFTMAX, 0);
    rc.num_groups = 2, rc.group_topk = 1;
    RouterCall call = call_of(3, 3);
    RouterOutput o;
    route(&o, L, &rc, &call);
    double a = 1 / (1 + exp(-1.0));
    expect_idx("groups softmax post", &o, (const int32_t[]){4, 5, 0, 1, 0, 1}, 6);
    expect_probs("groups softmax post", &o, (const double[]){0.5, 0.5, a, 1 - a, 0.5, 0.5}, 6);
    // balance counts ignore the groups: top-2 of the logits {0,4}, {0,1}, {0,1}
    expect_ints("groups aux_counts", o.aux_counts, (const int32_t[]){3, 2, 0, 0, 1, 0, 0, 0}, 8);
    expect_ints("groups tokens_per_expert", o.tokens_per_expert, (const int32_t[]){2, 2, 0, 0, 1, 1, 0, 0}, 8);
    out_free(&o);
    check_against_ref("groups softmax post", L, &rc, &call);
    // pre-softmax selects on the probs, so group 0 now wins row 0 (e^4 + e^-3 > 2e^2)
    rc.pre_softmax = 1;
    route(&o, L, &rc, &call);
    expect_idx("groups softmax pre", &o, (const int32_t[]){0, 1, 0, 1, 0, 1}, 6);
    out_free(&o);
    check_against_ref("groups softmax pre", L, &rc, &call);

    // E=8 in 4 groups of 2, best 2 groups, k=4 (2 per group), sigmoid: group sums of σ:
    // g0 σ(3)+σ(-3) = 1, g1 2σ(1) = 1.46, g2 σ(2)+σ(0) = 1.38, g3 σ(.5)+σ(-4) = 0.64
    static const real L2[8] = {3, -3, 1, 1, 2, 0, 0.5, -4};
    rc = config(8, 4, SCORE_SIGMOID, 0);
    rc.num_groups = 4, rc.group_topk = 2;
    RouterCall c1 = call_of(1, 1);
    route(&o, L2, &rc, &c1);
    expect_idx("groups sigmoid", &o, (const int32_t[]){4, 2, 3, 5}, 4);
    double d = sig(2) + 2 * sig(1) + 0.5 + NORM_EPS;
    expect_probs("groups sigmoid", &o, (const double[]){sig(2) / d, sig(1) / d, sig(1) / d, 0.5 / d}, 4);
    out_free(&o);
    check_against_ref("groups sigmoid", L2, &rc, &c1);
    // with bias 2 on expert 6, group 3 scores 2.64 and wins; group 1 (1.46) beats group 2 (1.38)
    static const real bias[8] = {0, 0, 0, 0, 0, 0, 2, 0};
    c1.expert_bias = bias;
    route(&o, L2, &rc, &c1);
    expect_idx("groups sigmoid + bias", &o, (const int32_t[]){6, 2, 3, 7}, 4);
    d = sig(0.5) + 2 * sig(1) + sig(-4) + NORM_EPS;
    expect_probs("groups sigmoid + bias", &o, (const double[]){sig(0.5) / d, sig(1) / d, sig(1) / d, sig(-4) / d}, 4);
    expect_ints("groups + bias aux_counts", o.aux_counts, (const int32_t[]){1, 0, 1, 1, 1, 0, 0, 0}, 8);
    out_free(&o);
    check_against_ref("groups sigmoid + bias", L2, &rc, &c1);
    rc.score = SCORE_SQRTSOFTPLUS;
    check_against_ref("groups sqrtsoftplus + bias", L2, &rc, &c1);
}

static void test_ties_golden(void) {
    static const real L[3 * 5] = {1, 3, 3, 0, 3, 2, 2, 2, 2, 2, 0, -1, 5, 5, -1};
    static const int32_t want[9] = {1, 2, 4, 0, 1, 2, 2, 3, 0};
    static const ScoreFunction f[4] = {SCORE_SOFTMAX, SCORE_SOFTMAX, SCORE_SIGMOID, SCORE_SQRTSOFTPLUS};
    for (int m = 0; m < 4; m++) {
        RouterConfig rc = config(5, 3, f[m], m == 1);
        RouterCall call = call_of(3, 3);
        RouterOutput o;
        route(&o, L, &rc, &call);
        char what[64];
        snprintf(what, sizeof what, "ties mode %d", m);
        expect_idx(what, &o, want, 9);
        // an all-equal row splits evenly (softmax post: 1/3 each; pre: 1/5 each)
        double even = m == 1 ? 0.2 : 1.0 / 3;
        for (int j = 0; j < 3; j++) CHECK_CLOSE(o.topk_probs[3 + j], even, 0, 1e-15, what);
        expect_ints("ties aux_counts", o.aux_counts, (const int32_t[]){2, 2, 3, 1, 1}, 5);
        out_free(&o);
        check_against_ref(what, L, &rc, &call);
    }
}

static void test_capacity_golden(void) {
    // k=1, softmax pre, E=4, N=6: tokens 0-3 go to expert 0 with probs p(3), p(1), p(4), p(3)
    // (p(a) = e^a/(e^a+3)), token 4 to expert 1, token 5 to expert 2.
    static const real L[6 * 4] = {3, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 0};
    RouterConfig rc = config(4, 1, SCORE_SOFTMAX, 1);
    RouterCall call = call_of(6, 6);
    RouterOutput o;
    double p3 = exp(3.0) / (exp(3.0) + 3), p1 = exp(1.0) / (exp(1.0) + 3), p4 = exp(4.0) / (exp(4.0) + 3);
    double p2 = exp(2.0) / (exp(2.0) + 3);
    // C = ceil(1·6/4·1) = 2. probs: expert 0 keeps token 2 and, of the tied tokens 0 and 3,
    // token 0. position: tokens 0 and 1.
    rc.capacity_factor = 1;
    for (int policy = 0; policy < 2; policy++)
        for (int pad = 0; pad < 2; pad++) {
            rc.drop_policy = policy ? DROP_POSITION : DROP_PROBS, rc.pad_to_capacity = pad;
            route(&o, L, &rc, &call);
            const char *what = policy ? "capacity 2 position" : "capacity 2 probs";
            static const int32_t kept_probs[6] = {1, 0, 1, 0, 1, 1}, kept_pos[6] = {1, 1, 0, 0, 1, 1};
            const int32_t *kept = policy ? kept_pos : kept_probs;
            expect_ints(what, o.kept, kept, 6);
            double all[6] = {p3, p1, p4, p3, p2, p2}, want[6];
            for (int n = 0; n < 6; n++) want[n] = kept[n] ? all[n] : 0;
            expect_probs(what, &o, want, 6);
            expect_ints("capacity tokens_per_expert", o.tokens_per_expert, (const int32_t[]){2, 1, 1, 0}, 4);
            expect_ints("capacity aux_counts (all choices)", o.aux_counts, (const int32_t[]){4, 1, 1, 0}, 4);
            CHECK(o.dropped == 2, "%s: dropped %d", what, o.dropped);
            CHECK(o.capacity == (pad ? 2 : 0), "%s pad=%d: capacity %d", what, pad, o.capacity);
            out_free(&o);
            check_against_ref(what, L, &rc, &call);
        }
    // C = ceil(0.75) = 1: probs keeps token 2, position token 0
    rc.capacity_factor = 0.5, rc.pad_to_capacity = 1;
    for (int policy = 0; policy < 2; policy++) {
        rc.drop_policy = policy ? DROP_POSITION : DROP_PROBS;
        route(&o, L, &rc, &call);
        expect_ints(policy ? "capacity 1 position" : "capacity 1 probs", o.kept,
                    policy ? (const int32_t[]){1, 0, 0, 0, 1, 1} : (const int32_t[]){0, 0, 1, 0, 1, 1}, 6);
        CHECK(o.capacity == 1 && o.dropped == 3, "capacity 1: capacity %d dropped %d", o.capacity, o.dropped);
        out_free(&o);
        check_against_ref("capacity 1", L, &rc, &call);
    }
    // C = ceil(15) capped at N = 6: nothing dropped
    rc.capacity_factor = 10;
    route(&o, L, &rc, &call);
    CHECK(o.capacity == 6 && o.dropped == 0, "capacity cap: capacity %d (expected 6) dropped %d", o.capacity, o.dropped);
    out_free(&o);
    check_against_ref("capacity capped at N", L, &rc, &call);

    // k=2, softmax post, E=4, N=4, C = ceil(2·4/4) = 2. Experts 0 and 1 get 4 and 3 choices:
    // e0: t0 .731, t1 .269, t2 .881, t3 .119   e1: t0 .269, t1 .731, t2 .119   e2: t3 .881
    static const real L2[4 * 4] = {2, 1, 0, 0, 1, 2, 0, 0, 3, 1, 0, 0, 1, 0, 3, 0};
    rc = config(4, 2, SCORE_SOFTMAX, 0);
    rc.capacity_factor = 1;
    RouterCall call2 = call_of(4, 2);
    double a = sig(1), b = sig(2);
    for (int policy = 0; policy < 2; policy++) {
        rc.drop_policy = policy ? DROP_POSITION : DROP_PROBS;
        route(&o, L2, &rc, &call2);
        expect_idx("capacity k=2", &o, (const int32_t[]){0, 1, 1, 0, 0, 1, 2, 0}, 8);
        if (policy == 0) {
            expect_ints("capacity k=2 probs kept", o.kept, (const int32_t[]){1, 1, 1, 0, 1, 0, 1, 0}, 8);
            expect_probs("capacity k=2 probs", &o, (const double[]){a, 1 - a, a, 0, b, 0, b, 0}, 8);
        } else {
            expect_ints("capacity k=2 position kept", o.kept, (const int32_t[]){1, 1, 1, 1, 0, 0, 1, 0}, 8);
            expect_probs("capacity k=2 position", &o, (const double[]){a, 1 - a, a, 1 - a, 0, 0, b, 0}, 8);
        }
        expect_ints("capacity k=2 tokens_per_expert", o.tokens_per_expert, (const int32_t[]){2, 2, 1, 0}, 4);
        CHECK(o.dropped == 3, "capacity k=2: dropped %d", o.dropped);
        out_free(&o);
        check_against_ref("capacity k=2", L2, &rc, &call2);
    }
    // fractional: k=2, N=5, E=4, factor 1.1 -> C = ceil(2.75) = 3 (random logits, vs reference)
    Rng rng;
    rng_seed(&rng, 7);
    real *L3 = alloc_normal(&rng, 5 * 4, 1.5);
    rc = config(4, 2, SCORE_SIGMOID, 0);
    rc.capacity_factor = 1.1, rc.pad_to_capacity = 1, rc.topk_scaling = 2;
    RouterCall call3 = call_of(5, 5);
    route(&o, L3, &rc, &call3);
    CHECK(o.capacity == 3, "capacity ceil(2.75): %d", o.capacity);
    out_free(&o);
    for (int policy = 0; policy < 2; policy++) {
        rc.drop_policy = policy ? DROP_POSITION : DROP_PROBS;
        check_against_ref("capacity 1.1 sigmoid × 2", L3, &rc, &call3);
    }
    free(L3);
}

// E=4, N=6, k=2, two sequences of 3. Top-2 of each row (for every score function):
// {0,3} {1,0} {2,1} | {3,2} {0,3} {3,1}: counts 3,3,2,4; per sequence 2,2,1,1 and 1,1,1,3.
static const real BAL_L[6 * 4] = {1, 0, -1, 0.5, 0.2, 1.5, 0.1, -1, -0.5, 0.3, 2, 0,
                                  0, 0, 1, 2,    2.5, -1, 0, 1,    0.7, 0.8, 0.6, 0.9};

static void test_balance_losses_golden(void) {
    static const int32_t counts[4] = {3, 3, 2, 4}, seq[2][4] = {{2, 2, 1, 1}, {1, 1, 1, 3}};
    static const double before[4] = {10, 2, 7, 5};
    static const ScoreFunction f[3] = {SCORE_SOFTMAX, SCORE_SIGMOID, SCORE_SQRTSOFTPLUS};
    int E = 4, N = 6, k = 2, S = 3;
    for (int m = 0; m < 3; m++) {
        // ŝ by hand
        double sh[6 * 4];
        for (int n = 0; n < N; n++) {
            double v[4], sum = 0;
            for (int e = 0; e < E; e++) {
                double l = BAL_L[n * E + e];
                v[e] = f[m] == SCORE_SOFTMAX ? exp(l) : f[m] == SCORE_SIGMOID ? sig(l) : sqrt_softplus(l);
                sum += v[e];
            }
            for (int e = 0; e < E; e++) sh[n * E + e] = v[e] / (f[m] == SCORE_SOFTMAX ? sum : sum + NORM_EPS);
        }
        double aux = 0, global = 0, seqloss = 0, z = 0;
        for (int e = 0; e < E; e++) {
            double col = 0, col_b[2] = {0, 0};
            for (int n = 0; n < N; n++) col += sh[n * E + e], col_b[n / S] += sh[n * E + e];
            aux += counts[e] * col;
            global += (before[e] + counts[e]) / 3 * col;
            seqloss += (seq[0][e] * col_b[0] + seq[1][e] * col_b[1]);
        }
        aux *= (double)E / (k * N * N), global *= (double)E / (k * N * N);
        seqloss *= (double)E / (k * S * S) / 2;
        for (int n = 0; n < N; n++) z += lse(BAL_L + n * E, E) * lse(BAL_L + n * E, E) / N;

        RouterConfig rc = config(E, k, f[m], 0);
        rc.balance_coeff[BALANCE_AUX] = 0.01, rc.balance_coeff[BALANCE_SEQ_AUX] = 0.02;
        rc.balance_coeff[BALANCE_GLOBAL_AUX] = 0.03, rc.z_loss_coeff = 0.001;
        RouterCall call = call_of(N, S);
        call.global_counts_before = before, call.global_batches_before = 2;
        RouterOutput o;
        route(&o, BAL_L, &rc, &call);
        char what[64];
        snprintf(what, sizeof what, "balance (score %d)", (int)f[m]);
        expect_ints("balance aux_counts", o.aux_counts, counts, 4);
        expect_ints("balance seq_counts", o.seq_counts, &seq[0][0], 8);
        for (int e = 0; e < E; e++) CHECK_CLOSE(o.global_counts[e], (before[e] + counts[e]) / 3, 0, 1e-15, "global_counts");
        CHECK_CLOSE(o.balance_loss[BALANCE_AUX], aux, 1e-16, 1e-13, what);
        CHECK_CLOSE(o.balance_loss[BALANCE_SEQ_AUX], seqloss, 1e-16, 1e-13, what);
        CHECK_CLOSE(o.balance_loss[BALANCE_GLOBAL_AUX], global, 1e-16, 1e-13, what);
        CHECK_CLOSE(o.z_loss, z, 1e-16, 1e-13, what);
        CHECK_CLOSE(router_objective(&o, &rc), 0.01 * aux + 0.02 * seqloss + 0.03 * global + 0.001 * z, 1e-16, 1e-13,
                    "router_objective");
        out_free(&o);
        check_against_ref(what, BAL_L, &rc, &call);
        // the balance statistics ignore bias, groups and capacity
        if (f[m] != SCORE_SOFTMAX) {
            static const real bias[4] = {5, 0, 0, -5};
            RouterConfig rc2 = rc;
            rc2.num_groups = 2, rc2.group_topk = 1, rc2.capacity_factor = 0.5, rc2.topk_scaling = 3;
            RouterCall call2 = call;
            call2.expert_bias = bias;
            RouterOutput o2;
            route(&o, BAL_L, &rc, &call);
            route(&o2, BAL_L, &rc2, &call2);
            CHECK(o2.dropped > 0, "balance independence: nothing dropped");
            for (int e = 0; e < E; e++)
                CHECK(o2.aux_counts[e] == o.aux_counts[e] && o2.global_counts[e] == o.global_counts[e],
                      "%s: bias/groups/capacity changed the counts of expert %d", what, e);
            for (int i = 0; i < 2 * E; i++) CHECK(o2.seq_counts[i] == o.seq_counts[i], "seq_counts %d changed", i);
            for (int t = 0; t < BALANCE_TYPES; t++)
                CHECK(o2.balance_loss[t] == o.balance_loss[t], "%s: %s changed", what, BALANCE_TYPE_NAMES[t]);
            CHECK(o2.z_loss == o.z_loss, "z_loss changed");
            out_free(&o), out_free(&o2);
            check_against_ref("balance with bias, groups, capacity", BAL_L, &rc2, &call2);
        }
        // global with nothing before is the micro-batch's aux loss; one sequence: seq = aux
        RouterCall alone = call_of(N, N);
        route(&o, BAL_L, &rc, &alone);
        CHECK_CLOSE(o.balance_loss[BALANCE_GLOBAL_AUX], o.balance_loss[BALANCE_AUX], 0, 1e-15, "global alone = aux");
        CHECK_CLOSE(o.balance_loss[BALANCE_SEQ_AUX], o.balance_loss[BALANCE_AUX], 0, 1e-15, "one sequence: seq = aux");
        out_free(&o);
    }
}

// Balanced routing with uniform scores gives exactly 1 for each balance loss.
static void test_balance_uniform(void) {
    // E=4, k=1, N=4: token n's largest logit is expert n; ŝ columns all sum to the same
    static const real L[4 * 4] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
    RouterConfig rc = config(4, 1, SCORE_SOFTMAX, 0);
    RouterCall call = call_of(4, 2);
    RouterOutput o;
    route(&o, L, &rc, &call);
    CHECK_CLOSE(o.balance_loss[BALANCE_AUX], 1, 0, 1e-14, "uniform aux_loss");
    CHECK_CLOSE(o.balance_loss[BALANCE_GLOBAL_AUX], 1, 0, 1e-14, "uniform global_aux_loss");
    out_free(&o);
    check_against_ref("uniform", L, &rc, &call);
}

// ---- finite differences ---------------------------------------------------------------------------

typedef struct {
    RouterConfig rc;
    RouterCall call;
    RouterOutput out;
    real *logits, *R;
    double loss_scale;
    RouterOutput base;  // the discrete decisions of the unperturbed logits
} FdCtx;

static double fd_obj(FdCtx *c) {
    router_forward(&c->out, c->logits, &c->rc, &c->call);
    double s = 0;
    for (int i = 0; i < c->call.N * c->rc.k; i++) s += (double)c->out.topk_probs[i] * c->R[i];
    return s + c->loss_scale * router_objective(&c->out, &c->rc);
}

static int fd_changed(const FdCtx *c) {
    int N = c->call.N, E = c->rc.E, k = c->rc.k, sequences = N / c->call.seq_length;
    return memcmp(c->out.topk_idx, c->base.topk_idx, (size_t)N * k * sizeof(int32_t)) ||
           memcmp(c->out.kept, c->base.kept, (size_t)N * k * sizeof(int32_t)) ||
           memcmp(c->out.aux_counts, c->base.aux_counts, E * sizeof(int32_t)) ||
           memcmp(c->out.seq_counts, c->base.seq_counts, (size_t)sequences * E * sizeof(int32_t));
}

typedef struct {
    const char *name;
    int E, k;
    ScoreFunction score;
    int pre;
    double scaling;
    int groups, group_topk;
    int bias;                      // random expert bias
    double capacity;
    DropPolicy policy;
    double coeff[BALANCE_TYPES], z;
    int global_before;             // counts from 3 earlier micro-batches
    int big;                       // logits around softplus's threshold (away from 20 itself)
    double loss_scale;
} FdCase;

static void fd_router(const FdCase *fc, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    enum { N = 6, S = 3 };
    int E = fc->E, k = fc->k;
    FdCtx c;
    memset(&c, 0, sizeof c);
    c.rc = config(E, k, fc->score, fc->pre);
    c.rc.topk_scaling = fc->scaling;
    c.rc.num_groups = fc->groups, c.rc.group_topk = fc->group_topk;
    c.rc.capacity_factor = fc->capacity, c.rc.drop_policy = fc->policy;
    for (int t = 0; t < BALANCE_TYPES; t++) c.rc.balance_coeff[t] = fc->coeff[t];
    c.rc.z_loss_coeff = fc->z;
    c.call = call_of(N, S);
    real *bias = fc->bias ? alloc_normal(&rng, E, 0.3) : NULL;
    double before[MAXE];
    for (int e = 0; e < E; e++) before[e] = (double)rng_below(&rng, 3 * N * k / E + 1);
    c.call.expert_bias = bias;
    if (fc->global_before) c.call.global_counts_before = before, c.call.global_batches_before = 3;
    c.loss_scale = fc->loss_scale;
    c.logits = alloc_normal(&rng, (size_t)N * E, 1.5);
    if (fc->big)  // a few logits past softplus's threshold and a few just below it
        for (int i = 0; i < N * E; i += 3) c.logits[i] = (real)(i % 2 ? 19.3 + 0.5 * rng_uniform(&rng) : 20.2 + 3 * rng_uniform(&rng));
    c.R = alloc_normal(&rng, (size_t)N * k, 1);
    out_alloc(&c.out, N, E, k, N / S);
    out_alloc(&c.base, N, E, k, N / S);
    router_forward(&c.base, c.logits, &c.rc, &c.call);
    check_against_ref(fc->name, c.logits, &c.rc, &c.call);
    if (fc->capacity > 0) CHECK(c.base.dropped > 0, "%s: nothing dropped", fc->name);
    real *dl = alloc_normal(&rng, (size_t)N * E, 9);  // overwritten
    router_backward(dl, c.R, c.logits, &c.base, &c.rc, &c.call, fc->loss_scale);
    int checked = 0, skipped = 0, bad = 0;
    for (int i = 0; i < N * E; i++) {
        real saved = c.logits[i];
        c.logits[i] = saved + FD_EPS;
        double up = fd_obj(&c);
        int changed = fd_changed(&c);
        c.logits[i] = saved - FD_EPS;
        double down = fd_obj(&c);
        changed |= fd_changed(&c);
        c.logits[i] = saved;
        if (changed) {
            skipped++;
            continue;
        }
        checked++;
        double numeric = (up - down) / (2 * FD_EPS), a = dl[i];
        if (!(fabs(a - numeric) <= FD_ATOL + FD_RTOL * (fabs(a) + fabs(numeric)))) {
            if (bad < 3)
                CHECK(0, "%s: dlogits[%d,%d] analytic %.12g numeric %.12g", fc->name, i / E, i % E, a, numeric);
            bad++;
        }
    }
    if (bad > 3) CHECK(0, "%s: %d of %d elements wrong", fc->name, bad, N * E);
    if (skipped) printf("     %s: %d checked, %d skipped for discrete changes\n", fc->name, checked, skipped);
    CHECK(skipped * 20 <= checked + skipped, "%s: too many skipped: %d of %d", fc->name, skipped, checked + skipped);
    // dropped choices get no prob gradient: their dprobs do not matter at all
    if (c.base.dropped > 0) {
        real *R2 = mt_malloc((size_t)N * k * sizeof(real)), *dl2 = mt_malloc((size_t)N * E * sizeof(real));
        for (int i = 0; i < N * k; i++) R2[i] = c.base.kept[i] ? c.R[i] : 1e3 * (i + 1);
        router_backward(dl2, R2, c.logits, &c.base, &c.rc, &c.call, fc->loss_scale);
        for (int i = 0; i < N * E; i++)
            CHECK(dl2[i] == dl[i], "%s: dprobs of a dropped choice reached dlogits[%d] (%.17g vs %.17g)", fc->name, i,
                  (double)dl2[i], (double)dl[i]);
        free(R2), free(dl2);
    }
    // the loss part is linear in loss_scale and the prob part does not depend on it
    real *zero = mt_calloc((size_t)N * k, sizeof(real));
    real *g1 = mt_malloc((size_t)N * E * sizeof(real)), *g2 = mt_malloc((size_t)N * E * sizeof(real));
    real *g0 = mt_malloc((size_t)N * E * sizeof(real));
    router_backward(g1, zero, c.logits, &c.base, &c.rc, &c.call, 1);
    router_backward(g2, zero, c.logits, &c.base, &c.rc, &c.call, 2.5);
    router_backward(g0, c.R, c.logits, &c.base, &c.rc, &c.call, 0);
    for (int i = 0; i < N * E; i++) {
        CHECK_CLOSE(g2[i], 2.5 * g1[i], 1e-15, 1e-13, "loss part linear in loss_scale");
        CHECK_CLOSE(dl[i], g0[i] + fc->loss_scale * g1[i], 1e-14, 1e-12, "prob part + loss part");
    }
    free(zero), free(g1), free(g2), free(g0);
    free(dl), free(c.logits), free(c.R), free(bias);
    out_free(&c.out), out_free(&c.base);
}

static const ScoreFunction SCORE_OF[4] = {SCORE_SOFTMAX, SCORE_SOFTMAX, SCORE_SIGMOID, SCORE_SQRTSOFTPLUS};
static const char *const MODE_NAME[4] = {"softmax post", "softmax pre", "sigmoid", "sqrtsoftplus"};

// One case per routing mode (softmax post, pre, sigmoid, sqrtsoftplus) from a template.
static void fd_each_mode(const char *name, FdCase fc, uint64_t seed) {
    for (int m = 0; m < 4; m++) {
        char what[96];
        snprintf(what, sizeof what, "%s, %s", name, MODE_NAME[m]);
        fc.name = what, fc.score = SCORE_OF[m], fc.pre = m == 1, fc.big = m == 3;
        fd_router(&fc, seed + m);
    }
}

static void test_fd_softmax_post(void) {
    // k=1: the prob is constant 1, so only the losses carry a gradient
    fd_router(&(FdCase){"softmax post k=1 + losses", 8, 1, SCORE_SOFTMAX, 0, .coeff = {0.1}, .z = 0.01, .loss_scale = 1}, 201);
    fd_router(&(FdCase){"softmax post k=2", 8, 2, SCORE_SOFTMAX, 0, .loss_scale = 1}, 202);
    fd_router(&(FdCase){"softmax post k=3", 6, 3, SCORE_SOFTMAX, 0, .loss_scale = 1}, 203);
}

static void test_fd_softmax_pre(void) {
    fd_router(&(FdCase){"softmax pre k=1", 8, 1, SCORE_SOFTMAX, 1, .loss_scale = 1}, 211);
    fd_router(&(FdCase){"softmax pre k=3", 6, 3, SCORE_SOFTMAX, 1, .loss_scale = 1}, 212);
}

static void test_fd_sigmoid(void) {
    fd_router(&(FdCase){"sigmoid k=1", 8, 1, SCORE_SIGMOID, 0, .loss_scale = 1}, 221);
    fd_router(&(FdCase){"sigmoid k=3", 6, 3, SCORE_SIGMOID, 0, .loss_scale = 1}, 222);
}

static void test_fd_sqrtsoftplus(void) {
    fd_router(&(FdCase){"sqrtsoftplus k=1", 8, 1, SCORE_SQRTSOFTPLUS, 0, .loss_scale = 1}, 231);
    fd_router(&(FdCase){"sqrtsoftplus k=2", 8, 2, SCORE_SQRTSOFTPLUS, 0, .loss_scale = 1}, 232);
    fd_router(&(FdCase){"sqrtsoftplus k=1 near 20", 8, 1, SCORE_SQRTSOFTPLUS, 0, .big = 1, .loss_scale = 1}, 233);
    fd_router(&(FdCase){"sqrtsoftplus k=2 near 20", 8, 2, SCORE_SQRTSOFTPLUS, 0, .big = 1, .loss_scale = 1}, 234);
    fd_router(&(FdCase){"sqrtsoftplus k=3 near 20 + losses", 6, 3, SCORE_SQRTSOFTPLUS, 0, .big = 1, .coeff = {0.1, 0.2, 0.3},
                        .z = 0.01, .loss_scale = 0.7}, 235);
}

static void test_fd_topk_scaling(void) {
    fd_each_mode("k=2 scaling 2.5", (FdCase){.E = 8, .k = 2, .scaling = 2.5, .loss_scale = 1}, 241);
    fd_router(&(FdCase){"sigmoid k=1 scaling 0.4", 8, 1, SCORE_SIGMOID, 0, .scaling = 0.4, .loss_scale = 1}, 245);
}

static void test_fd_groups(void) {
    fd_each_mode("groups 4/2 k=4", (FdCase){.E = 8, .k = 4, .groups = 4, .group_topk = 2, .loss_scale = 1}, 251);
    fd_each_mode("groups 2/1 k=3 + bias", (FdCase){.E = 8, .k = 3, .groups = 2, .group_topk = 1, .bias = 1, .loss_scale = 1}, 255);
}

static void test_fd_expert_bias(void) {
    fd_router(&(FdCase){"sigmoid k=2 bias", 8, 2, SCORE_SIGMOID, 0, .bias = 1, .loss_scale = 1}, 261);
    fd_router(&(FdCase){"sigmoid k=1 bias", 8, 1, SCORE_SIGMOID, 0, .bias = 1, .loss_scale = 1}, 262);
    fd_router(&(FdCase){"sqrtsoftplus k=2 bias", 8, 2, SCORE_SQRTSOFTPLUS, 0, .bias = 1, .big = 1, .loss_scale = 1}, 263);
}

static void test_fd_aux_loss(void) {
    fd_each_mode("aux_loss k=2", (FdCase){.E = 8, .k = 2, .coeff = {0.3}, .loss_scale = 1}, 271);
    fd_each_mode("aux_loss k=1", (FdCase){.E = 6, .k = 1, .coeff = {0.3}, .loss_scale = 1}, 275);
}

static void test_fd_seq_aux_loss(void) {
    fd_each_mode("seq_aux_loss k=2", (FdCase){.E = 8, .k = 2, .coeff = {0, 0.3}, .loss_scale = 1}, 281);
}

static void test_fd_global_aux_loss(void) {
    fd_each_mode("global_aux_loss k=2", (FdCase){.E = 8, .k = 2, .coeff = {0, 0, 0.3}, .global_before = 1, .loss_scale = 1}, 291);
    fd_router(&(FdCase){"global_aux_loss alone", 8, 2, SCORE_SIGMOID, 0, .coeff = {0, 0, 0.3}, .loss_scale = 1}, 295);
}

static void test_fd_z_loss(void) {
    fd_each_mode("z_loss k=2", (FdCase){.E = 8, .k = 2, .z = 0.05, .loss_scale = 1}, 301);
}

static void test_fd_all_losses(void) {
    fd_each_mode("all losses", (FdCase){.E = 8, .k = 2, .coeff = {0.01, 0.02, 0.03}, .z = 0.001, .global_before = 1,
                                        .loss_scale = 1}, 311);
    fd_each_mode("all losses, groups, bias, scaling", (FdCase){.E = 8, .k = 4, .scaling = 1.5, .groups = 4, .group_topk = 2,
                                        .bias = 1, .coeff = {0.2, 0.3, 0.4}, .z = 0.02, .global_before = 1, .loss_scale = 1}, 315);
}

static void test_fd_capacity(void) {
    for (int policy = 0; policy < 2; policy++) {
        FdCase fc = {.E = 4, .k = 2, .capacity = 0.6, .policy = policy ? DROP_POSITION : DROP_PROBS, .loss_scale = 1};
        fd_each_mode(policy ? "capacity 0.6 position" : "capacity 0.6 probs", fc, 321 + 10 * policy);
        fc.coeff[BALANCE_AUX] = 0.1, fc.coeff[BALANCE_SEQ_AUX] = 0.1, fc.z = 0.01, fc.scaling = 2, fc.E = 8, fc.k = 3;
        fc.capacity = 0.5;
        fd_each_mode(policy ? "capacity 0.5 position + losses" : "capacity 0.5 probs + losses", fc, 341 + 10 * policy);
    }
}

static void test_fd_loss_scale(void) {
    FdCase fc = {.E = 8, .k = 2, .coeff = {0.1, 0.2, 0.3}, .z = 0.01, .global_before = 1, .loss_scale = 0.25};
    fd_each_mode("loss_scale 0.25", fc, 361);
    fc.loss_scale = 3;
    fc.capacity = 0.5;
    fd_each_mode("loss_scale 3 with capacity", fc, 371);
}

// ---- expert bias update -----------------------------------------------------------------------------

static void test_expert_bias_update(void) {
    // mean 2: counts above it go down, below it go up, equal to it stay (sign(0) = 0)
    real bias[4] = {0.5, -0.2, 0.1, 0};
    static const double counts[4] = {3, 1, 2, 2};
    expert_bias_update(bias, counts, 4, 0.01);
    static const double want[4] = {0.49, -0.19, 0.1, 0};
    for (int e = 0; e < 4; e++) CHECK_CLOSE(bias[e], want[e], 1e-17, 1e-15, "expert_bias_update");
    CHECK(bias[2] == (real)0.1 && bias[3] == 0, "sign(0) moved the bias: %.17g %.17g", (double)bias[2], (double)bias[3]);
    // a fractional mean 7/3: 1 and 2 are below, 4 above
    real b2[3] = {0, 0, 0};
    expert_bias_update(b2, (const double[]){1, 2, 4}, 3, 1e-3);
    CHECK(b2[0] == (real)1e-3 && b2[1] == (real)1e-3 && b2[2] == (real)-1e-3, "fractional mean: %g %g %g", (double)b2[0],
          (double)b2[1], (double)b2[2]);
    // balanced counts change nothing
    real b3[5] = {1, 2, 3, 4, 5};
    expert_bias_update(b3, (const double[]){7, 7, 7, 7, 7}, 5, 0.5);
    for (int e = 0; e < 5; e++) CHECK(b3[e] == e + 1, "balanced counts moved bias %d", e);
    // the step does not scale with the imbalance
    real b4[2] = {0, 0};
    expert_bias_update(b4, (const double[]){0, 1000}, 2, 0.1);
    CHECK(b4[0] == (real)0.1 && b4[1] == (real)-0.1, "sign step: %g %g", (double)b4[0], (double)b4[1]);
}

// route_topk against its definition, written out plainly: each round the first allowed expert
// not picked yet, then each later one whose value is larger; -1 when none is left. Ties, NaNs
// and masks, on expert counts whose picks route_topk keeps as bits and on larger ones, where it
// looks them up in the picks so far.
static void reference_topk(int32_t *idx, const double *values, const unsigned char *allowed, int E, int k) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int picked = 0;
            for (int i = 0; i < j; i++) picked |= idx[i] == e;
            if ((allowed && !allowed[e]) || picked) continue;
            if (best < 0 || values[e] > values[best]) best = e;
        }
        idx[j] = best;
    }
}

static void test_route_topk_definition(void) {
    static const int sizes[] = {1, 7, 64, ROUTE_PICKED_BITS, ROUTE_PICKED_BITS + 1, 1500};
    enum { K_MAX = 9, CASES = 4 };
    Rng rng;
    rng_seed(&rng, 21);
    int bad = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int c = 0; c < CASES; c++) {
            int E = sizes[s], k = MT_MIN(E, K_MAX);
            double *values = mt_malloc((size_t)E * sizeof(double));
            unsigned char *allowed = mt_malloc((size_t)E);
            for (int e = 0; e < E; e++) {
                values[e] = (double)rng_below(&rng, 16) / 4;  // many ties
                if (c >= 2 && rng_below(&rng, 5) == 0) values[e] = NAN;
                allowed[e] = rng_below(&rng, 3) != 0;
            }
            if (c == 3) values[0] = NAN;  // a NaN first: picked in the first round
            const unsigned char *mask = c % 2 ? allowed : NULL;
            int32_t got[K_MAX], want[K_MAX];
            route_topk(got, values, mask, E, k);
            reference_topk(want, values, mask, E, k);
            bad += memcmp(got, want, (size_t)k * sizeof(int32_t)) != 0;
            free(values), free(allowed);
        }
    CHECK(bad == 0, "route_topk differs from its definition in %d cases", bad);
}

int main(void) {
    RUN(test_softmax_post_golden);
    RUN(test_softmax_pre_golden);
    RUN(test_sigmoid_golden);
    RUN(test_sqrtsoftplus_golden);
    RUN(test_topk_scaling_golden);
    RUN(test_expert_bias_golden);
    RUN(test_groups_golden);
    RUN(test_ties_golden);
    RUN(test_capacity_golden);
    RUN(test_balance_losses_golden);
    RUN(test_balance_uniform);
    RUN(test_fd_softmax_post);
    RUN(test_fd_softmax_pre);
    RUN(test_fd_sigmoid);
    RUN(test_fd_sqrtsoftplus);
    RUN(test_fd_topk_scaling);
    RUN(test_fd_groups);
    RUN(test_fd_expert_bias);
    RUN(test_fd_aux_loss);
    RUN(test_fd_seq_aux_loss);
    RUN(test_fd_global_aux_loss);
    RUN(test_fd_z_loss);
    RUN(test_fd_all_losses);
    RUN(test_fd_capacity);
    RUN(test_fd_loss_scale);
    RUN(test_expert_bias_update);
    RUN(test_route_topk_definition);
    TESTS_DONE();
}

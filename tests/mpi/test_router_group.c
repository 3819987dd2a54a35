// test_router_group.c — the MoE router over a token group (sequence / tensor parallelism,
// src/moe/router.h), run by tests/cli/test_mpi_router.sh under mpirun -np 2, 3 and 4, built
// twice: real = float (BUILD/test_router_group) and real = double (BUILD/test_router_group_dbl).
//
// The world is laid out as token groups of `tp` consecutive ranks and count groups (the
// data-parallel ranks, for global_aux_loss) of `dp` ranks, world = tp·dp. Each token group
// routes one micro-batch of CHUNK·tp tokens that every rank can make for itself; member r
// runs router_forward / router_backward on its chunk [r·CHUNK, (r+1)·CHUNK) with the token
// group, and also on all CHUNK·tp tokens without one (the reference, the same count group).
// Every output must match the reference's (its rows of the per-token ones): integers exactly,
// real values within REAL_TOL relative, double statistics within DOUBLE_TOL, and the group's
// statistics bit-identical on its members. Sequence lengths: 2·tp (CHUNK is no multiple, so
// chunks start and end inside sequences) and the whole micro-batch (one sequence over all).
//
// Rank 0 prints "ok router_group_<float|double>_<case>_tp<T>_dp<D>_np<P>" when no rank failed;
// a failing rank prints "FAIL router_group_..._np<P>: [rank r] ...".
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "core/rng.h"
#include "moe/router.h"

enum { CHUNK = 10, EXPERTS = 8, MAX_WORLD = 4 };  // tokens per member; CHUNK % (2·tp) != 0 for tp 2..4

#ifdef MT_DOUBLE
#define REAL_TOL 1e-12
#define PRECISION "double"
#else
#define REAL_TOL 1e-6
#define PRECISION "float"
#endif
#define DOUBLE_TOL 1e-12
#define LOSS_SCALE 0.7
#define LOGIT_SCALE 2.0
#define BIAS_SCALE 0.3
#define DROPPING_FACTOR 0.5  // a capacity factor low enough that every capacity case drops
#define BATCHES_BEFORE 2     // global_aux_loss: micro-batches counted before this one

#include "mpi_check.h"

// A check named by what it routes and the layout: router_group_<precision>_<name>_tp<tp>_dp<dp>.
static void begin_router(const char *name, int tp, int dp) {
    static char full_name[128];
    snprintf(full_name, sizeof(full_name), "router_group_%s_%s_tp%d_dp%d", PRECISION, name, tp, dp);
    begin(full_name);
}

static int close_to(double a, double b, double tol) { return a == b || fabs(a - b) <= tol * fmax(fabs(a), fabs(b)); }

// ---- what is compared ------------------------------------------------------------------------

static void expect_ints(const char *what, const int32_t *got, const int32_t *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            expect(0, "%s[%zu] is %d, one process: %d", what, i, got[i], want[i]);
            return;
        }
}

static void expect_reals(const char *what, const real *got, const real *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!close_to(got[i], want[i], REAL_TOL)) {
            expect(0, "%s[%zu] is %.17g, one process: %.17g", what, i, (double)got[i], (double)want[i]);
            return;
        }
}

static void expect_doubles(const char *what, const double *got, const double *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!close_to(got[i], want[i], DOUBLE_TOL)) {
            expect(0, "%s[%zu] is %.17g, one process: %.17g", what, i, got[i], want[i]);
            return;
        }
}

// ---- router buffers ------------------------------------------------------------------------------

typedef struct {
    RouterOutput out;
    real *dlogits;
} Routed;

static void routed_alloc(Routed *r, int N, int k, int sequences) {
    int E = EXPERTS;
    memset(r, 0, sizeof *r);
    r->out.scores = mt_malloc((size_t)N * E * sizeof(real));
    r->out.aux_scores = mt_malloc((size_t)N * E * sizeof(real));
    r->out.topk_idx = mt_malloc((size_t)N * k * sizeof(int32_t));
    r->out.topk_probs = mt_malloc((size_t)N * k * sizeof(real));
    r->out.kept = mt_malloc((size_t)N * k * sizeof(int32_t));
    r->out.tokens_per_expert = mt_malloc(E * sizeof(int32_t));
    r->out.group_tokens_per_expert = mt_malloc(E * sizeof(int32_t));
    r->out.aux_counts = mt_malloc(E * sizeof(int32_t));
    r->out.seq_counts = mt_malloc((size_t)sequences * E * sizeof(int32_t));
    r->out.global_counts = mt_malloc(E * sizeof(double));
    r->out.group_counts = mt_malloc(E * sizeof(double));
    r->dlogits = mt_malloc((size_t)N * E * sizeof(real));
}

static void routed_free(Routed *r) {
    RouterOutput *o = &r->out;
    free(o->scores), free(o->aux_scores), free(o->topk_idx), free(o->topk_probs), free(o->kept);
    free(o->tokens_per_expert), free(o->group_tokens_per_expert), free(o->aux_counts), free(o->seq_counts);
    free(o->global_counts), free(o->group_counts), free(r->dlogits);
}

// ---- the cases ------------------------------------------------------------------------------------

typedef struct {
    const char *name;
    RouterConfig rc;
    int with_bias;  // random expert bias
} Case;

// Every loss on in every case, so that each one's forward and backward is compared.
#define LOSSES .balance_coeff = {1e-2, 2e-2, 3e-2}, .z_loss_coeff = 1e-3
static const Case CASES[] = {
    {"softmax", {.E = EXPERTS, .k = 2, .score = SCORE_SOFTMAX, LOSSES}, 0},
    {"softmax_pre", {.E = EXPERTS, .k = 2, .score = SCORE_SOFTMAX, .pre_softmax = 1, LOSSES}, 0},
    {"sigmoid_bias", {.E = EXPERTS, .k = 2, .score = SCORE_SIGMOID, .topk_scaling = 2.5, LOSSES}, 1},
    {"sqrtsoftplus_bias", {.E = EXPERTS, .k = 3, .score = SCORE_SQRTSOFTPLUS, LOSSES}, 1},
    {"group_limited", {.E = EXPERTS, .k = 4, .score = SCORE_SIGMOID, .num_groups = 4, .group_topk = 2, LOSSES}, 1},
    {"capacity_probs", {.E = EXPERTS, .k = 2, .capacity_factor = DROPPING_FACTOR, .drop_policy = DROP_PROBS, LOSSES}, 0},
    {"capacity_position",
     {.E = EXPERTS, .k = 2, .capacity_factor = DROPPING_FACTOR, .drop_policy = DROP_POSITION, LOSSES}, 0},
    {"capacity_probs_padded",
     {.E = EXPERTS, .k = 2, .capacity_factor = DROPPING_FACTOR, .drop_policy = DROP_PROBS, .pad_to_capacity = 1,
      LOSSES}, 0},
    {"capacity_position_padded",
     {.E = EXPERTS, .k = 3, .score = SCORE_SIGMOID, .capacity_factor = DROPPING_FACTOR, .drop_policy = DROP_POSITION,
      .pad_to_capacity = 1, LOSSES}, 1},
};

// The data of micro-batch `batch` (one per token group), the same on every rank that makes it.
typedef struct {
    real *logits, *dprobs, bias[EXPERTS];
    double counts_before[EXPERTS];
} Inputs;

static void make_inputs(Inputs *in, int N, int k, int case_index, int batch) {
    Rng rng;
    rng_seed_stream(&rng, 1000 + case_index, batch);
    in->logits = mt_malloc((size_t)N * EXPERTS * sizeof(real));
    in->dprobs = mt_malloc((size_t)N * k * sizeof(real));
    for (size_t i = 0; i < (size_t)N * EXPERTS; i++) in->logits[i] = (real)(LOGIT_SCALE * rng_normal(&rng));
    for (size_t i = 0; i < (size_t)N * k; i++) in->dprobs[i] = (real)rng_normal(&rng);
    rng_seed_stream(&rng, 1000 + case_index, MAX_WORLD);  // replicated: the same for every batch
    for (int e = 0; e < EXPERTS; e++) {
        in->bias[e] = (real)(BIAS_SCALE * rng_normal(&rng));
        in->counts_before[e] = (double)rng_below(&rng, CHUNK * MAX_WORLD);
    }
}

typedef struct {
    int tp, dp;
    Comm tokens, counts;  // this rank's token group and count group
} Layout;

// Statistics of the group must be the same bits on every member: compare with member 0's.
static void expect_same_on_members(const Layout *lay, const RouterOutput *o) {
    int E = EXPERTS;
    double mine[BALANCE_TYPES + 1 + 2 * EXPERTS], first[BALANCE_TYPES + 1 + 2 * EXPERTS];
    size_t n = 0;
    for (int t = 0; t < BALANCE_TYPES; t++) mine[n++] = o->balance_loss[t];
    mine[n++] = o->z_loss;
    for (int e = 0; e < E; e++) mine[n++] = o->global_counts[e], mine[n++] = o->group_counts[e];
    memcpy(first, mine, sizeof mine);
    comm_bcast(&lay->tokens, first, sizeof first, 0);
    expect(!memcmp(mine, first, sizeof mine), "the losses or global counts differ from token-group member 0's");
}

static void compare(const Layout *lay, const Case *c, const Routed *ref, const Routed *got, int sequences) {
    int E = EXPERTS, k = c->rc.k, first = lay->tokens.rank * CHUNK;
    const RouterOutput *r = &ref->out, *o = &got->out;
    size_t rows = (size_t)CHUNK * E, choices = (size_t)CHUNK * k;
    expect_ints("topk_idx", o->topk_idx, r->topk_idx + (size_t)first * k, choices);
    expect_ints("kept", o->kept, r->kept + (size_t)first * k, choices);
    expect_reals("topk_probs", o->topk_probs, r->topk_probs + (size_t)first * k, choices);
    expect_reals("scores", o->scores, r->scores + (size_t)first * E, rows);
    expect_reals("aux_scores", o->aux_scores, r->aux_scores + (size_t)first * E, rows);
    expect_reals("dlogits", got->dlogits, ref->dlogits + (size_t)first * E, rows);
    expect_ints("aux_counts", o->aux_counts, r->aux_counts, E);
    expect_ints("seq_counts", o->seq_counts, r->seq_counts, (size_t)sequences * E);
    expect_ints("group_tokens_per_expert", o->group_tokens_per_expert, r->tokens_per_expert, E);
    int32_t local_kept[EXPERTS] = {0};
    for (size_t i = 0; i < choices; i++) local_kept[o->topk_idx[i]] += o->kept[i];
    expect_ints("tokens_per_expert", o->tokens_per_expert, local_kept, E);
    expect_doubles("balance_loss", o->balance_loss, r->balance_loss, BALANCE_TYPES);
    expect_doubles("z_loss", &o->z_loss, &r->z_loss, 1);
    expect_doubles("global_counts", o->global_counts, r->global_counts, E);
    expect_doubles("group_counts", o->group_counts, r->group_counts, E);
    expect(o->capacity == r->capacity, "capacity %d, one process: %d", o->capacity, r->capacity);
    expect(o->group_batches == r->group_batches, "group_batches %d, one process: %d", o->group_batches,
           r->group_batches);
    int64_t dropped = o->dropped;
    comm_allreduce_sum_int64(&lay->tokens, &dropped, 1);
    expect(dropped == r->dropped, "the members dropped %lld choices, one process: %d", (long long)dropped,
           r->dropped);
    expect(c->rc.capacity_factor == 0 || r->dropped > 0, "nothing dropped: the case does not test capacity");
    expect_same_on_members(lay, o);
}

// One case at one sequence length: the reference on all tokens, then this member's chunk.
static void run_case(const Layout *lay, const Case *c, int case_index, int seq_length) {
    int N = CHUNK * lay->tp, k = c->rc.k, sequences = N / seq_length;
    Inputs in;
    make_inputs(&in, N, k, case_index, world.rank / lay->tp);
    RouterCall whole = {.N = N, .seq_length = seq_length, .expert_bias = c->with_bias ? in.bias : NULL,
                        .global_counts_before = in.counts_before, .global_batches_before = BATCHES_BEFORE,
                        .count_group = &lay->counts};
    RouterCall chunk = whole;
    chunk.N = CHUNK;
    chunk.token_group = &lay->tokens;
    chunk.token_first = lay->tokens.rank * CHUNK;
    Routed ref, got;
    routed_alloc(&ref, N, k, sequences);
    routed_alloc(&got, CHUNK, k, sequences);
    router_forward(&ref.out, in.logits, &c->rc, &whole);
    router_backward(ref.dlogits, in.dprobs, in.logits, &ref.out, &c->rc, &whole, LOSS_SCALE);
    size_t first = (size_t)chunk.token_first;
    router_forward(&got.out, in.logits + first * EXPERTS, &c->rc, &chunk);
    router_backward(got.dlogits, in.dprobs + first * k, in.logits + first * EXPERTS, &got.out, &c->rc, &chunk,
                    LOSS_SCALE);
    compare(lay, c, &ref, &got, sequences);
    routed_free(&ref);
    routed_free(&got);
    free(in.logits);
    free(in.dprobs);
}

// Token groups of tp consecutive ranks, count groups of the ranks tp apart.
static Layout make_layout(int tp, int dp) {
    Layout lay = {.tp = tp, .dp = dp};
    int tokens[MAX_WORLD], counts[MAX_WORLD], tp_rank = world.rank % tp, dp_rank = world.rank / tp;
    for (int i = 0; i < tp; i++) tokens[i] = dp_rank * tp + i;
    for (int i = 0; i < dp; i++) counts[i] = i * tp + tp_rank;
    lay.tokens = comm_group("tokens", tokens, tp);
    lay.counts = comm_group("counts", counts, dp);
    return lay;
}

static int check_layout(int tp, int dp) {
    Layout lay = make_layout(tp, dp);
    int ok = 1;
    for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); i++) {
        begin_router(CASES[i].name, tp, dp);
        run_case(&lay, &CASES[i], (int)i, 2 * tp);           // chunks split sequences (tp > 1)
        run_case(&lay, &CASES[i], (int)i, CHUNK * tp);       // one sequence over all members
        ok &= end();
    }
    comm_free(&lay.tokens);
    comm_free(&lay.counts);
    return ok;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    comm_world_init(&argc, &argv);
    world = comm_world();
    int P = world.size;
    if (P < 2 || P > MAX_WORLD) mt_die("run under mpirun -np 2, 3 or 4 (this world has %d)", P);
    int ok = check_layout(P, 1);      // one token group: sequence parallelism over the world
    ok &= check_layout(1, P);         // token groups of one: the one-process path under data parallelism
    if (P % 2 == 0 && P > 2) ok &= check_layout(P / 2, 2);  // token groups and count groups
    comm_world_finalize();
    return ok ? 0 : 1;
}

#include "moe/router.h"

#include <math.h>

#include "core/device.h"
#include "core/profile.h"
#include "moe/dispatcher.h"
#include "ops/moe_route.h"
#include "ops/ops_parallel.h"

const char *const BALANCE_TYPE_NAMES[BALANCE_TYPES] = {"aux_loss", "seq_aux_loss", "global_aux_loss"};

// ---- per-token arithmetic ------------------------------------------------------------------
// The score functions, top-k, group limit and probs are in ops/moe_route.h (shared with
// the moe_route_tokens op); here: what the statistics and the backward add.

static RouteShape route_shape(const RouterConfig *rc) {
    return (RouteShape){.E = rc->E, .k = rc->k, .score = rc->score, .pre_softmax = rc->pre_softmax,
                        .topk_scaling = rc->topk_scaling, .num_groups = rc->num_groups,
                        .group_topk = rc->group_topk};
}

// ---- the token group ---------------------------------------------------------------------------
// With a token group of P members the micro-batch is the group's N·P tokens; member r holds
// tokens [r·N, (r+1)·N). Without one (NULL or size 1) every helper reduces to this process's N.

static int token_group_size(const RouterCall *call) {
    return call->token_group && call->token_group->size > 1 ? call->token_group->size : 1;
}

static int split_over_group(const RouterCall *call) { return token_group_size(call) > 1; }

// tokens of the micro-batch (all members)
static int group_tokens(const RouterCall *call) { return call->N * token_group_size(call); }

// sequences of the micro-batch (all members)
static int group_sequences(const RouterCall *call) { return group_tokens(call) / call->seq_length; }

// global index of this member's first token
static int first_token(const RouterCall *call) { return split_over_group(call) ? call->token_first : 0; }

// In place: x (n, tensor memory) becomes its sum over the group g (rank order); nothing when
// g is NULL or alone. The collectives open tensor memory themselves (comm.c).
static void group_sum_int64(const Comm *g, int64_t *x, size_t n) {
    if (g && g->size > 1) comm_allreduce_sum_int64(g, x, n);
}

static void group_sum_double(const Comm *g, double *x, size_t n) {
    if (g && g->size > 1) comm_allreduce_sum_double(g, x, n);
}

// ---- the scratch of one call ---------------------------------------------------------------------
// Tensor memory for the statistics between the ops and the collectives, and the report the
// host downloads (8-byte words, one block).
typedef struct {
    int64_t *counts;          // (sequences + 1, E): per-sequence top-k counts of ŝ, then kept choices
    int64_t *group_counts64;  // (E) aux counts, summed over the count group
    int64_t *dropped;         // (1)
    double *columns;          // (sequences, E) Σ ŝ per sequence
    double *z;                // (1) Σ lse²
    double *before;           // (E) global_counts_before, uploaded
    double *report;           // ROUTER_REPORT_DOUBLES(E), ops_router.h
    void *block;
} RouterWork;

static RouterWork router_work(int E, int sequences) {
    size_t se = (size_t)sequences * E;
    size_t words = (se + E) + E + 1 + se + 1 + E + ROUTER_REPORT_DOUBLES(E);
    RouterWork w = {.block = device_calloc(words, sizeof(double))};
    int64_t *i = w.block;
    w.counts = i, i += se + E;
    w.group_counts64 = i, i += E;
    w.dropped = i, i += 1;
    double *d = (double *)i;
    w.columns = d, d += se;
    w.z = d, d += 1;
    w.before = d, d += E;
    w.report = d;
    return w;
}

// ---- capacity -------------------------------------------------------------------------------

// Tensor memory of the group's capacity decision: its N·P·k choices in member order (as
// gathered) and in token order, and the members' token indices (with context parallelism).
typedef struct {
    int32_t *idx_gathered, *idx, *kept, *index;
    real *probs_gathered, *probs;
    void *block;
} GroupChoices;

static GroupChoices group_choices(size_t total, int tokens) {
    size_t bytes = 3 * total * sizeof(int32_t) + (size_t)tokens * sizeof(int32_t) + 2 * total * sizeof(real);
    GroupChoices c = {.block = device_calloc(bytes, 1)};
    int32_t *i = c.block;
    c.idx_gathered = i, i += total;
    c.idx = i, i += total;
    c.kept = i, i += total;
    c.index = i, i += tokens;
    real *r = (real *)i;
    c.probs_gathered = r, r += total;
    c.probs = r;
    return c;
}

// The capacity decision over the token group's N·P·k choices: every member gathers the
// group's expert ids and probs (into token order: an op when the members' tokens interleave),
// decides the same drops, and keeps its part (an op: its tokens' rows, or its run of them).
static void apply_group_capacity(RouterOutput *out, const RouterConfig *rc, const RouterCall *call, int capacity) {
    int k = rc->k, tokens = group_tokens(call);
    size_t local = (size_t)call->N * k, total = (size_t)tokens * k;
    size_t id_row = (size_t)k * sizeof(int32_t), prob_row = (size_t)k * sizeof(real);
    GroupChoices c = group_choices(total, tokens);
    comm_allgather_int32(call->token_group, out->topk_idx, c.idx_gathered, local);
    comm_allgather(call->token_group, out->topk_probs, c.probs_gathered, local);
    if (call->token_index) {  // members' tokens interleave in the micro-batch
        comm_allgather_int32(call->token_group, call->token_index, c.index, (size_t)call->N);
        rows_scatter(c.idx, c.idx_gathered, c.index, tokens, id_row);
        rows_scatter(c.probs, c.probs_gathered, c.index, tokens, prob_row);
    } else {  // member order is token order
        rows_copy_strided(c.idx, 0, c.idx_gathered, 0, total * sizeof(int32_t), 1);
        rows_copy_strided(c.probs, 0, c.probs_gathered, 0, total * sizeof(real), 1);
    }
    moe_router_capacity(c.probs, c.kept, c.idx, (int)total, rc->E, capacity, rc->drop_policy == DROP_POSITION);
    if (call->token_index) {
        rows_gather(out->kept, c.kept, call->token_index, call->N, id_row);
        rows_gather(out->topk_probs, c.probs, call->token_index, call->N, prob_row);
    } else {
        size_t first = (size_t)first_token(call) * k;
        rows_copy_strided(out->kept, 0, c.kept + first, 0, local * sizeof(int32_t), 1);
        rows_copy_strided(out->topk_probs, 0, c.probs + first, 0, local * sizeof(real), 1);
    }
    device_free(c.block);
}

// Capacity of the group's micro-batch, drops applied to out->kept / topk_probs (all 1 / as
// routed before) and out->capacity.
static void capacity_limit(RouterOutput *out, const RouterConfig *rc, const RouterCall *call) {
    int choices = call->N * rc->k, limited = rc->capacity_factor > 0;
    int capacity = limited ? dispatch_capacity(group_tokens(call), rc->k, rc->E, rc->capacity_factor) : -1;
    out->capacity = limited && rc->pad_to_capacity ? capacity : 0;
    out->expert_limit = limited ? capacity : 0;
    if (limited && split_over_group(call)) apply_group_capacity(out, rc, call, capacity);
    else moe_router_capacity(out->topk_probs, out->kept, out->topk_idx, choices, rc->E, capacity,
                             rc->drop_policy == DROP_POSITION);
}

// ---- forward --------------------------------------------------------------------------------

// Per-token statistics of this member (an op), summed over the token group: z, the
// per-sequence counts with the kept choices, the per-sequence columns of ŝ (integers: exact;
// the doubles in rank order); then their totals (an op).
static void count_statistics(RouterWork *w, RouterOutput *out, const real *logits, const RouterConfig *rc,
                             const RouterCall *call) {
    int E = rc->E, sequences = group_sequences(call);
    const Comm *tg = split_over_group(call) ? call->token_group : NULL;
    RouterStatShape shape = {.E = E, .k = rc->k, .score = rc->score, .sequences = sequences,
                             .seq_length = call->seq_length, .token_first = first_token(call)};
    moe_router_statistics(w->z, w->counts, w->columns, out->tokens_per_expert, w->dropped, logits, out->aux_scores,
                          out->topk_idx, out->kept, call->token_index, call->N, &shape);
    group_sum_double(tg, w->z, 1);
    group_sum_int64(tg, w->counts, (size_t)(sequences + 1) * E);
    moe_router_count_totals(out->seq_counts, out->aux_counts, out->group_tokens_per_expert, w->group_counts64,
                            w->counts, sequences, E);
    group_sum_double(tg, w->columns, (size_t)sequences * E);
}

// This micro-batch's counts, summed over the data-parallel ranks running the others of the
// step when global_aux_loss needs them (integer sums: exact in any order); then global
// counts, losses and the report (an op), downloaded into out.
static void router_losses(RouterWork *w, RouterOutput *out, const RouterConfig *rc, const RouterCall *call) {
    int E = rc->E;
    const Comm *g = call->count_group;
    out->group_batches = 1;
    if (g && g->size > 1 && rc->balance_coeff[BALANCE_GLOBAL_AUX] > 0) {
        group_sum_int64(g, w->group_counts64, E);
        out->group_batches = g->size;
    }
    const double *before = NULL;
    if (call->global_counts_before) {
        device_upload(w->before, call->global_counts_before, E * sizeof(double));
        before = w->before;
    }
    RouterLossShape shape = {.E = E, .k = rc->k, .tokens = group_tokens(call), .seq_length = call->seq_length,
                             .sequences = group_sequences(call),
                             .batches = call->global_batches_before + out->group_batches};
    moe_router_losses(w->report, out->group_counts, out->global_counts, w->group_counts64, before, w->columns,
                      out->seq_counts, out->aux_counts, w->z, w->dropped, out->tokens_per_expert,
                      out->group_tokens_per_expert, &shape);
    if (!out->report) out->report = mt_malloc(ROUTER_REPORT_DOUBLES(E) * sizeof(double));
    device_download(out->report, w->report, ROUTER_REPORT_DOUBLES(E) * sizeof(double));
    for (int t = 0; t < BALANCE_TYPES; t++) out->balance_loss[t] = out->report[REPORT_AUX + t];
    out->z_loss = out->report[REPORT_Z_LOSS];
    out->dropped = (int)out->report[REPORT_DROPPED];
}

// The routers that pick over the whole micro-batch (Sinkhorn, quantile balancing) see every
// member's tokens: the group's logits (N·P, E) gathered in rank order (the picks and
// quantiles do not depend on the tokens' order), the picks chosen for all of them, each
// member keeping its own rows. Without a token group the call's own arrays.
typedef struct {
    const real *logits;  // (N·P, E)
    int32_t *picks;      // (N·P, k)
    real *gathered;      // owned when gathered, else NULL
    int32_t *group_picks;
} GroupRouting;

static GroupRouting group_routing_begin(RouterOutput *out, const real *logits, const RouterConfig *rc,
                                        const RouterCall *call) {
    GroupRouting g = {.logits = logits, .picks = out->topk_idx};
    if (!split_over_group(call)) return g;
    g.gathered = device_calloc((size_t)group_tokens(call) * rc->E, sizeof(real));
    g.group_picks = device_calloc((size_t)group_tokens(call) * rc->k, sizeof(int32_t));
    comm_allgather(call->token_group, logits, g.gathered, (size_t)call->N * rc->E);
    g.logits = g.gathered;
    g.picks = g.group_picks;
    return g;
}

// chose: the group's picks were chosen (this member's rows go to out->topk_idx).
static void group_routing_end(GroupRouting *g, RouterOutput *out, const RouterConfig *rc, const RouterCall *call,
                              int chose) {
    if (!g->gathered) return;
    size_t rows = (size_t)call->N * rc->k;
    if (chose)
        device_copy(out->topk_idx, g->group_picks + (size_t)call->token_group->rank * rows, rows * sizeof(int32_t));
    device_free(g->gathered);
    device_free(g->group_picks);
}

// Sinkhorn routing in training (unless the picks are replayed): the balanced top-k into
// out->topk_idx (an op over the group's tokens); returns whether it chose them.
static int sinkhorn_picks(RouterOutput *out, const real *logits, const RouterConfig *rc, const RouterCall *call) {
    if (!rc->sinkhorn || !call->training || call->replay) return 0;
    int N = group_tokens(call), E = rc->E;
    GroupRouting g = group_routing_begin(out, logits, rc, call);
    double *work = device_calloc((size_t)N * E + N + 2 * (size_t)E, sizeof(double));
    moe_router_sinkhorn(g.picks, work, g.logits, N, E, rc->k);
    device_free(work);
    group_routing_end(&g, out, rc, call, 1);
    return 1;
}

// Quantile balancing: the top-k of logits − bias into out->topk_idx, and in training the
// quantiles of the group's tokens into call->qb_quantile (an op); returns whether it chose
// the picks. Replayed picks stay (the op's go to scratch), but the quantiles are still taken,
// so that the bias learns as in the recording run.
static int quantile_picks(RouterOutput *out, const real *logits, const RouterConfig *rc, const RouterCall *call) {
    if (!rc->quantile || (call->replay && !call->qb_quantile)) return 0;
    int N = group_tokens(call), E = rc->E;
    GroupRouting g = group_routing_begin(out, logits, rc, call);
    int32_t *picks = g.picks, *scratch = NULL;
    if (call->replay && !g.gathered) picks = scratch = device_calloc((size_t)N * rc->k, sizeof(int32_t));
    double *work = device_calloc((size_t)N * E + N, sizeof(double));
    moe_router_quantile(picks, call->qb_quantile, work, g.logits, call->qb_bias, N, E, rc->k);
    device_free(work);
    device_free(scratch);
    group_routing_end(&g, out, rc, call, !call->replay);
    return !call->replay;
}

void router_forward(RouterOutput *out, const real *logits, const RouterConfig *rc, const RouterCall *call) {
    PROF_SCOPE(PROF_ROUTER);
    int N = call->N;
    MT_ASSERT(group_tokens(call) % call->seq_length == 0);
    MT_ASSERT(!split_over_group(call) || call->token_index || call->token_first == call->token_group->rank * N);
    // per token (an op: a kernel on a GPU): scores, ŝ, the top-k and its probs
    RouteShape shape = route_shape(rc);
    int chosen = sinkhorn_picks(out, logits, rc, call);
    chosen |= quantile_picks(out, logits, rc, call);  // also on replayed forwards: their quantiles
    shape.replay = call->replay || chosen;
    moe_route_tokens(out->scores, out->aux_scores, out->topk_idx, out->topk_probs, logits, call->expert_bias, N,
                     &shape);
    // over the tokens (ops and collectives): capacity, counts, z-loss and the balance losses
    RouterWork w = router_work(rc->E, group_sequences(call));
    capacity_limit(out, rc, call);
    count_statistics(&w, out, logits, rc, call);
    router_losses(&w, out, rc, call);
    device_free(w.block);
}

double router_objective(const RouterOutput *out, const RouterConfig *rc) {
    double total = rc->z_loss_coeff * out->z_loss;
    for (int t = 0; t < BALANCE_TYPES; t++) total += rc->balance_coeff[t] * out->balance_loss[t];
    return total;
}

// ---- backward -------------------------------------------------------------------------------

// The factors of the router backward (each × loss_scale) and where this member's tokens lie.
static RouterGradShape grad_shape(const RouterConfig *rc, const RouterCall *call, double loss_scale) {
    int N = group_tokens(call), E = rc->E, k = rc->k, S = call->seq_length, sequences = group_sequences(call);
    return (RouterGradShape){
        .route = route_shape(rc), .seq_length = S, .token_first = first_token(call),
        .aux = loss_scale * rc->balance_coeff[BALANCE_AUX] * E / ((double)k * N * N),
        .global = loss_scale * rc->balance_coeff[BALANCE_GLOBAL_AUX] * E / ((double)k * N * N),
        .seq = loss_scale * rc->balance_coeff[BALANCE_SEQ_AUX] * E / ((double)k * S * S) / sequences,
        .z_factor = loss_scale * rc->z_loss_coeff * 2.0 / group_tokens(call)};
}

void router_backward(real *dlogits, const real *dprobs, const real *logits, const RouterOutput *out,
                     const RouterConfig *rc, const RouterCall *call, double loss_scale) {
    PROF_SCOPE(PROF_ROUTER);
    RouterGradShape g = grad_shape(rc, call, loss_scale);
    moe_router_backward(dlogits, dprobs, logits, out->topk_idx, out->kept, out->aux_counts, out->global_counts,
                        out->seq_counts, call->token_index, call->N, &g);
}

void quantile_bias_update(real *bias, const double *mean_quantile, int E, double ema) {
    double *next = mt_malloc((size_t)E * sizeof(double)), mean = 0;
    for (int e = 0; e < E; e++) mean += (next[e] = ema * bias[e] + (1 - ema) * mean_quantile[e]);
    mean /= E;
    for (int e = 0; e < E; e++) bias[e] = (real)(next[e] - mean);
    free(next);
}

void expert_bias_update(real *bias, const double *counts, int E, double rate) {
    double *device_counts = device_calloc((size_t)E, sizeof(double));  // host counts, uploaded
    device_upload(device_counts, counts, (size_t)E * sizeof(double));
    moe_expert_bias_update(bias, device_counts, E, rate);
    device_free(device_counts);
}

#include "moe/router.h"

#include <math.h>
#include <string.h>

#include "core/profile.h"
#include "moe/dispatcher.h"
#include "ops/moe_route.h"

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

// index in the whole micro-batch of this member's token n
static int global_token(const RouterCall *call, int n) {
    return call->token_index ? call->token_index[n] : first_token(call) + n;
}

// sequence of this member's token n
static int sequence_of(const RouterCall *call, int n) { return global_token(call, n) / call->seq_length; }

// In place: x (n) becomes its sum over the token group (rank order); nothing without one.
static void token_group_sum_int64(const RouterCall *call, int64_t *x, size_t n) {
    if (split_over_group(call)) comm_allreduce_sum_int64(call->token_group, x, n);
}

static void token_group_sum_double(const RouterCall *call, double *x, size_t n) {
    if (split_over_group(call)) comm_allreduce_sum_double(call->token_group, x, n);
}

// ---- capacity -------------------------------------------------------------------------------

typedef struct {
    int choice;  // n·k + j
    real prob;
} Candidate;

static int by_prob_then_token(const void *a, const void *b) {
    const Candidate *x = a, *y = b;
    if (x->prob != y->prob) return x->prob > y->prob ? -1 : 1;
    return x->choice < y->choice ? -1 : x->choice > y->choice;
}

// Of the `choices` (N·k, token order) topk_idx / topk_probs, keep at most `capacity` per
// expert; the rest get kept = 0 (kept starts all 1) and prob 0.
static void apply_capacity(const int32_t *topk_idx, real *topk_probs, int32_t *kept, int choices,
                           const RouterConfig *rc, int capacity) {
    Candidate *cand = mt_malloc((size_t)choices * sizeof(Candidate));
    for (int e = 0; e < rc->E; e++) {
        int count = 0;
        for (int i = 0; i < choices; i++)  // in token order
            if (topk_idx[i] == e) cand[count++] = (Candidate){i, topk_probs[i]};
        if (count <= capacity) continue;
        if (rc->drop_policy == DROP_PROBS) qsort(cand, count, sizeof(Candidate), by_prob_then_token);
        for (int c = capacity; c < count; c++) {
            kept[cand[c].choice] = 0;
            topk_probs[cand[c].choice] = 0;
        }
    }
    free(cand);
}

// Rows of k values gathered in member order (member m's N rows, its tokens `index`
// (N·P) name) into token order, in place through `scratch` (N·P·k).
static void gathered_to_token_order(void *rows, void *scratch, const int32_t *index, int tokens, int k,
                                    size_t size) {
    size_t row = (size_t)k * size;
    for (int i = 0; i < tokens; i++) memcpy((char *)scratch + (size_t)index[i] * row, (char *)rows + i * row, row);
    memcpy(rows, scratch, (size_t)tokens * row);
}

// The capacity decision over the token group's N·P·k choices: every member gathers the
// group's expert ids and probs (into token order), decides the same drops, and keeps its part.
static void apply_group_capacity(RouterOutput *out, const RouterConfig *rc, const RouterCall *call, int capacity) {
    int k = rc->k, tokens = group_tokens(call);
    size_t local = (size_t)call->N * k, total = (size_t)tokens * k;
    int32_t *idx = mt_malloc(total * sizeof(int32_t)), *kept = mt_malloc(total * sizeof(int32_t));
    real *probs = mt_malloc(total * sizeof(real));
    comm_allgather_int32(call->token_group, out->topk_idx, idx, local);
    comm_allgather(call->token_group, out->topk_probs, probs, local);
    if (call->token_index) {  // members' tokens interleave in the micro-batch
        int32_t *index = mt_malloc((size_t)tokens * sizeof(int32_t));
        void *scratch = mt_malloc(total * MT_MAX(sizeof(int32_t), sizeof(real)));
        comm_allgather_int32(call->token_group, call->token_index, index, (size_t)call->N);
        gathered_to_token_order(idx, scratch, index, tokens, k, sizeof(int32_t));
        gathered_to_token_order(probs, scratch, index, tokens, k, sizeof(real));
        free(scratch);
        free(index);
    }
    for (size_t i = 0; i < total; i++) kept[i] = 1;
    apply_capacity(idx, probs, kept, (int)total, rc, capacity);
    for (int n = 0; n < call->N; n++) {
        size_t from = (size_t)global_token(call, n) * k, to = (size_t)n * k;
        memcpy(out->kept + to, kept + from, k * sizeof(int32_t));
        memcpy(out->topk_probs + to, probs + from, k * sizeof(real));
    }
    free(idx);
    free(kept);
    free(probs);
}

// Capacity of the group's micro-batch, drops applied to out->kept / topk_probs (all 1 / as
// routed before), out->capacity and out->dropped (this member's choices).
static void capacity_limit(RouterOutput *out, const RouterConfig *rc, const RouterCall *call) {
    size_t choices = (size_t)call->N * rc->k;
    for (size_t i = 0; i < choices; i++) out->kept[i] = 1;
    out->dropped = 0;
    out->capacity = 0;
    if (!(rc->capacity_factor > 0)) return;
    int capacity = dispatch_capacity(group_tokens(call), rc->k, rc->E, rc->capacity_factor);
    if (split_over_group(call)) apply_group_capacity(out, rc, call, capacity);
    else apply_capacity(out->topk_idx, out->topk_probs, out->kept, (int)choices, rc, capacity);
    for (size_t i = 0; i < choices; i++) out->dropped += !out->kept[i];
    if (rc->pad_to_capacity) out->capacity = capacity;
}

// ---- forward --------------------------------------------------------------------------------

// This micro-batch's counts, summed over the data-parallel ranks running the others of the
// step when global_aux_loss needs them (integer sums: exact in any order).
static void group_counts(RouterOutput *out, const RouterConfig *rc, const RouterCall *call) {
    int E = rc->E;
    const Comm *g = call->count_group;
    out->group_batches = 1;
    int64_t counts[E];
    for (int e = 0; e < E; e++) counts[e] = out->aux_counts[e];
    if (g && g->size > 1 && rc->balance_coeff[BALANCE_GLOBAL_AUX] > 0) {
        comm_allreduce_sum_int64(g, counts, E);
        out->group_batches = g->size;
    }
    for (int e = 0; e < E; e++) out->group_counts[e] = (double)counts[e];
}

// The micro-batch's per-sequence top-k counts of ŝ and kept choices per expert, summed over
// the token group (integers: exact) in one all-reduce.
static void count_balance_statistics(RouterOutput *out, const real *logits, const RouterConfig *rc,
                                     const RouterCall *call) {
    int N = call->N, E = rc->E, k = rc->k, sequences = group_sequences(call);
    // (sequences + 1, E): the per-sequence counts, then the kept choices per expert
    int64_t *counts = mt_calloc((size_t)(sequences + 1) * E, sizeof(int64_t));
    int64_t *kept_counts = counts + (size_t)sequences * E;
    int32_t idx[k];
    double s[E], aux[E];
    for (int n = 0; n < N; n++) {  // top-k of ŝ (in double, as the losses use it)
        route_score_row(s, logits + (size_t)n * E, E, rc->score);
        route_aux_score_row(aux, s, E, rc->score);
        route_topk(idx, aux, NULL, E, k);
        for (int j = 0; j < k; j++) counts[(size_t)sequence_of(call, n) * E + idx[j]]++;
    }
    for (int e = 0; e < E; e++) kept_counts[e] = out->tokens_per_expert[e];
    token_group_sum_int64(call, counts, (size_t)(sequences + 1) * E);
    memset(out->aux_counts, 0, E * sizeof(int32_t));
    for (int b = 0; b < sequences; b++)
        for (int e = 0; e < E; e++) {
            out->seq_counts[b * E + e] = (int32_t)counts[(size_t)b * E + e];
            out->aux_counts[e] += (int32_t)counts[(size_t)b * E + e];
        }
    if (out->group_tokens_per_expert)
        for (int e = 0; e < E; e++) out->group_tokens_per_expert[e] = (int32_t)kept_counts[e];
    free(counts);
    group_counts(out, rc, call);
    for (int e = 0; e < E; e++) {  // running mean over the micro-batches so far, this one included
        double before = call->global_counts_before ? call->global_counts_before[e] : 0;
        out->global_counts[e] = (before + out->group_counts[e]) / (call->global_batches_before + out->group_batches);
    }
}

// Σ_t ŝ[t,e] per sequence of the micro-batch (sequences, E), each summed in token order
// here, then over the token group (a sequence split between members: their parts in rank order).
static double *sequence_columns(const RouterOutput *out, const RouterConfig *rc, const RouterCall *call) {
    int N = call->N, E = rc->E, sequences = group_sequences(call);
    double *columns = mt_calloc((size_t)sequences * E, sizeof(double));
    for (int n = 0; n < N; n++) {
        double *column = columns + (size_t)sequence_of(call, n) * E;
        for (int e = 0; e < E; e++) column[e] += out->aux_scores[(size_t)n * E + e];
    }
    token_group_sum_double(call, columns, (size_t)sequences * E);
    return columns;
}

static void balance_loss_values(RouterOutput *out, const RouterConfig *rc, const RouterCall *call) {
    int N = group_tokens(call), E = rc->E, k = rc->k, S = call->seq_length, sequences = group_sequences(call);
    double *seq_columns = sequence_columns(out, rc, call);
    double aux = 0, global = 0, seq = 0;
    for (int e = 0; e < E; e++) {
        double column = 0;
        for (int b = 0; b < sequences; b++) {
            double seq_column = seq_columns[(size_t)b * E + e];
            seq += seq_column * out->seq_counts[b * E + e];
            column += seq_column;
        }
        aux += column * out->aux_counts[e];
        global += column * out->global_counts[e];
    }
    free(seq_columns);
    out->balance_loss[BALANCE_AUX] = aux * E / ((double)k * N * N);
    out->balance_loss[BALANCE_GLOBAL_AUX] = global * E / ((double)k * N * N);
    out->balance_loss[BALANCE_SEQ_AUX] = seq * E / ((double)k * S * S) / sequences;
}

// mean over the micro-batch's tokens (the token group's) of logsumexp(l)²
static double z_loss_value(const real *logits, const RouterCall *call, int E) {
    int N = call->N;
    double z = 0;
#pragma omp parallel for schedule(static) reduction(+ : z) if (N > 64)
    for (int n = 0; n < N; n++) {
        double lse = route_row_lse(logits + (size_t)n * E, E);
        z += lse * lse;
    }
    token_group_sum_double(call, &z, 1);
    return z / group_tokens(call);
}

void router_forward(RouterOutput *out, const real *logits, const RouterConfig *rc, const RouterCall *call) {
    PROF_SCOPE(PROF_ROUTER);
    int N = call->N, E = rc->E, k = rc->k;
    MT_ASSERT(group_tokens(call) % call->seq_length == 0);
    MT_ASSERT(!split_over_group(call) || call->token_index || call->token_first == call->token_group->rank * N);
    // per token (an op: a kernel on a GPU): scores, ŝ, the top-k and its probs
    RouteShape shape = route_shape(rc);
    moe_route_tokens(out->scores, out->aux_scores, out->topk_idx, out->topk_probs, logits, call->expert_bias, N,
                     &shape);
    // over the tokens (host): z-loss, capacity, counts and the balance losses
    out->z_loss = z_loss_value(logits, call, E);
    capacity_limit(out, rc, call);
    memset(out->tokens_per_expert, 0, E * sizeof(int32_t));
    for (int i = 0; i < N * k; i++)
        if (out->kept[i]) out->tokens_per_expert[out->topk_idx[i]]++;
    count_balance_statistics(out, logits, rc, call);
    balance_loss_values(out, rc, call);
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

void expert_bias_update(real *bias, const double *counts, int E, double rate) {
    double mean = 0;
    for (int e = 0; e < E; e++) mean += counts[e];
    mean /= E;
    for (int e = 0; e < E; e++) {
        double offset = mean - counts[e];
        bias[e] += (real)(rate * ((offset > 0) - (offset < 0)));
    }
}

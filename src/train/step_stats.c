#include "train/step_stats.h"

#include <string.h>

// max / mean kept tokens per expert
static double imbalance_of(const double *counts, int E) {
    double max = 0, sum = 0;
    for (int e = 0; e < E; e++) {
        sum += counts[e];
        max = counts[e] > max ? counts[e] : max;
    }
    return sum > 0 ? max / (sum / E) : 1;
}

void accumulate_router_stats(StepLosses *s, const Model *m, const ModelActs *a, double w) {
    const Config *c = &m->cfg;
    int i = 0, moe_layers = model_moe_layers(c);
    for (int l = 0; l < config_all_layers(c); l++) {
        if (!m->layers[l].is_moe) continue;
        int64_t *counts = s->counts + (size_t)i * c->num_experts;
        RouterStats *ls = &s->layers[i++];  // indexed over the whole model's MoE layers
        ls->layer = l;
        if (plan_layer_chunk(&m->plan, l) != a->chunk) continue;  // another chunk's or stage's
        const RouterOutput *r = &a->layers[l].moe.route;
        ls->dropped_tokens += r->dropped;
        const double *group_tokens = router_host_group_tokens_per_expert(r, c->num_experts);  // the token group's
        const double *tokens = router_host_tokens_per_expert(r);
        for (int e = 0; e < c->num_experts; e++) counts[e] += (int64_t)group_tokens[e];
        ls->load_imbalance += w * imbalance_of(tokens, c->num_experts);
        ls->dropped_frac += w * r->dropped / ((double)a->N * c->moe_router_topk);
        for (int t = 0; t < BALANCE_TYPES; t++) ls->balance[t] += w * r->balance_loss[t];
        ls->z_loss += w * r->z_loss;
        s->router.load_imbalance += w * imbalance_of(tokens, c->num_experts) / moe_layers;
    }
    for (int t = 0; t < BALANCE_TYPES; t++) s->router.balance[t] += w * a->balance_loss[t];
    s->router.z_loss += w * a->z_loss;
    s->router.dropped_frac += w * a->dropped_frac;
}


// The doubles of one RouterStats, in a fixed order, for packing.
enum { STATS_DOUBLES = 4 + BALANCE_TYPES };

static double *stats_pack(double *out, const RouterStats *r) {
    *out++ = r->load_imbalance;
    *out++ = r->dropped_frac;
    *out++ = (double)r->dropped_tokens;
    *out++ = r->z_loss;
    for (int t = 0; t < BALANCE_TYPES; t++) *out++ = r->balance[t];
    return out;
}

static const double *stats_unpack(const double *in, RouterStats *r) {
    r->load_imbalance = *in++;
    r->dropped_frac = *in++;
    r->dropped_tokens = (long)*in++;
    r->z_loss = *in++;
    for (int t = 0; t < BALANCE_TYPES; t++) r->balance[t] = *in++;
    return in;
}

void step_losses_allreduce(StepLosses *s, const Comm *dp) {
    if (dp->size == 1) return;
    size_t n_counts = (size_t)s->moe_layers * s->num_experts;
    size_t n = 3 + (size_t)s->mtp_depths + STATS_DOUBLES * (1 + (size_t)s->moe_layers) + n_counts;
    double *buf = mt_malloc(n * sizeof(double)), *p = buf;
    *p++ = s->lm_loss;
    *p++ = s->aux_objective;
    *p++ = s->mtp_objective;
    for (int k = 0; k < s->mtp_depths; k++) *p++ = s->mtp_loss[k];
    p = stats_pack(p, &s->router);
    for (int l = 0; l < s->moe_layers; l++) p = stats_pack(p, &s->layers[l]);
    for (size_t i = 0; i < n_counts; i++) *p++ = (double)s->counts[i];  // exact below 2^53
    comm_allreduce_sum_double(dp, buf, n);
    const double *q = buf;
    s->lm_loss = *q++;
    s->aux_objective = *q++;
    s->mtp_objective = *q++;
    for (int k = 0; k < s->mtp_depths; k++) s->mtp_loss[k] = *q++;
    q = stats_unpack(q, &s->router);
    for (int l = 0; l < s->moe_layers; l++) q = stats_unpack(q, &s->layers[l]);
    for (size_t i = 0; i < n_counts; i++) s->counts[i] = (int64_t)*q++;
    free(buf);
}

// The expert-bias counts of a step: each rank counted its micro-batches (the whole token
// group's with sequence parallelism), summed over the data-parallel ranks.
void router_state_allreduce(Model *m, const Comm *dp) {
    if (dp->size == 1) return;
    for (int l = 0; l < config_all_layers(&m->cfg); l++)
        if (m->layers[l].is_moe && m->cfg.moe_router_enable_expert_bias && plan_holds_layer(&m->plan, l))
            comm_allreduce_sum_double(dp, m->router_state[l].bias_counts, m->cfg.num_experts);
}

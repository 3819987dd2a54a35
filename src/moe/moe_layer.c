// moe_layer.c — the MoE feed-forward: router → dispatcher → experts → combine, plus the
// shared expert every token uses.
#include <math.h>
#include <string.h>

#include "core/rng.h"
#include "moe/expert_parallel.h"
#include "model/layers.h"
#include "ops/ops.h"

enum { NOISE_JITTER = 1, NOISE_FORCED_LOGITS = 2 };  // random streams of a layer

static ExpertShape expert_shape(const Config *c, const MoeActs *ma) {
    return (ExpertShape){.groups = c->num_experts, .H = c->hidden_size, .I = c->moe_ffn,
                         .offsets = ma->plan.expert_offsets};
}

static Rng layer_noise(const Batch *batch, int layer, int stream) {
    Rng rng;
    rng_seed_stream(&rng, batch->noise_seed, (uint64_t)layer * 16 + stream);
    return rng;
}

// router_input = ln2, or ln2 · U(1−eps, 1+eps) elementwise while training with jitter
static void router_input(const Model *m, int layer, LayerActs *la, const Batch *batch, int N) {
    MoeActs *ma = &la->moe;
    size_t n = (size_t)N * m->cfg.hidden_size;
    double eps = m->cfg.moe_input_jitter_eps;
    ma->jitter_used = batch->training && eps > 0;
    ma->router_input = la->ln2;
    if (!ma->jitter_used) return;
    Rng rng = layer_noise(batch, layer, NOISE_JITTER);
    for (size_t i = 0; i < n; i++) {
        ma->jitter[i] = (real)(1 - eps + 2 * eps * rng_uniform(&rng));
        ma->jittered_input[i] = la->ln2[i] * ma->jitter[i];
    }
    ma->router_input = ma->jittered_input;
}

// logits (N,E) = router_input · W_routerᵀ in the router dtype
static void router_logits(const Model *m, const LayerParams *lp, MoeActs *ma, int N) {
    int H = m->cfg.hidden_size, E = m->cfg.num_experts;
    const real *W = tt_param(&m->tt, lp->router);
    if (!m->cfg.router_fp64) linear_forward(ma->logits, ma->router_input, W, N, H, E);
    else moe_router_logits(ma->logits, ma->router_input, W, N, H, E);  // double accumulation
}

// Router bookkeeping across the micro-batches of a global batch (training only).
static void record_routing(const Model *m, int layer, const MoeActs *ma) {
    RouterState *rs = &m->router_state[layer];
    for (int e = 0; e < m->cfg.num_experts; e++) {
        rs->global_counts_sum[e] += ma->route.group_counts[e];
        rs->bias_counts[e] += ma->route.tokens_per_expert[e];
    }
    rs->global_micro_batches += ma->route.group_batches;
}

static void shared_expert_forward(const Model *m, const LayerParams *lp, LayerActs *la, int N) {
    const Config *c = &m->cfg;
    MoeActs *ma = &la->moe;
    int H = c->hidden_size;
    int32_t offsets[2] = {0, N};
    ExpertShape shape = {.groups = 1, .H = H, .I = c->moe_shared_expert_intermediate_size, .offsets = offsets};
    real *gate = NULL;
    if (lp->shared_expert_gate >= 0) {  // σ(x·w_gate) scales the whole shared output
        linear_forward(ma->shared_gate, la->ln2, tt_param(&m->tt, lp->shared_expert_gate), N, H, 1);
        for (int n = 0; n < N; n++) ma->shared_gate[n] = 1 / (1 + real_exp(-ma->shared_gate[n]));
        gate = ma->shared_gate;
    }
    experts_forward(ma->shared_out, &ma->shared, la->ln2, gate, &lp->shared_params, &shape);
    vec_add(la->ffn_out, ma->shared_out, (size_t)N * H);
}

static int ep_allgather(const Model *m) { return m->ep.size > 1 && m->ep.dispatcher == DISPATCH_ALLGATHER; }

// x (N,H) -> out (N,H): the routed experts' outputs combined per token, on this rank or
// across the expert-parallel group.
static void routed_experts_forward(const Model *m, const LayerParams *lp, MoeActs *ma, const real *x, real *out) {
    int H = m->cfg.hidden_size;
    if (ep_allgather(m)) {
        ep_allgather_forward(m, lp, ma, x, out);
        return;
    }
    dispatch_plan(&ma->plan, ma->route.topk_idx, ma->route.kept, ma->route.capacity);
    dispatch_forward(ma->rows_in, ma->row_probs, x, ma->route.topk_probs, &ma->plan, H);
    if (m->ep.size > 1) {
        ep_alltoall_forward(m, lp, ma, out);
        return;
    }
    ExpertShape es = expert_shape(&m->cfg, ma);
    experts_forward(ma->rows_out, &ma->experts, ma->rows_in, ma->row_probs, &lp->ffn_params, &es);
    combine_forward(out, ma->rows_out, &ma->plan, H, 0);
}

// d_out (N,H) -> a->d_norm (N,H) overwritten and a->d_choice_probs (N,k).
static void routed_experts_backward(const Model *m, const LayerParams *lp, MoeActs *ma, ModelActs *a,
                                    const real *d_out) {
    int H = m->cfg.hidden_size;
    if (ep_allgather(m)) {
        ep_allgather_backward(m, lp, ma, a, d_out);
        return;
    }
    if (m->ep.size > 1) {
        ep_alltoall_backward(m, lp, ma, a, d_out);
        return;
    }
    // combine backward = dispatch of the output gradient (probs are inside the experts)
    dispatch_forward(a->d_rows_out, NULL, d_out, NULL, &ma->plan, H);
    ExpertShape es = expert_shape(&m->cfg, ma);
    experts_backward(a->d_rows_in, a->d_row_probs, &lp->ffn_grads, a->d_rows_out, &ma->experts, ma->rows_in,
                     ma->row_probs, &lp->ffn_params, &es, a->d_gate, a->d_up, a->d_act);
    // dispatch backward = combine of the input-row gradients (and gather of the prob gradients)
    dispatch_backward(a->d_norm, a->d_choice_probs, a->d_rows_in, a->d_row_probs, &ma->plan, H);
}

void moe_forward(const Model *m, int layer, LayerActs *la, const Batch *batch) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    MoeActs *ma = &la->moe;
    int N = batch->B * batch->T, E = c->num_experts;
    router_input(m, layer, la, batch, N);
    router_logits(m, lp, ma, N);
    if (c->moe_router_force_load_balancing) {  // random logits; gradients pass straight through
        Rng rng = layer_noise(batch, layer, NOISE_FORCED_LOGITS);
        for (size_t i = 0; i < (size_t)N * E; i++) ma->logits[i] = (real)rng_normal(&rng);
    }
    const RouterState *rs = &m->router_state[layer];
    ma->call = (RouterCall){.N = N, .seq_length = batch->T,
                            .expert_bias = lp->expert_bias >= 0 ? tt_param(&m->tt, lp->expert_bias) : NULL,
                            .global_counts_before = batch->training ? rs->global_counts_sum : NULL,
                            .global_batches_before = batch->training ? rs->global_micro_batches : 0,
                            .count_group = batch->training ? m->count_group : NULL};
    router_forward(&ma->route, ma->logits, &m->router, &ma->call);
    if (batch->training) record_routing(m, layer, ma);
    ma->plan.N = N;
    routed_experts_forward(m, lp, ma, la->ln2, la->ffn_out);
    if (lp->shared_gate >= 0) shared_expert_forward(m, lp, la, N);
}

// Shared expert backward: adds its input gradient into a->d_norm.
static void shared_expert_backward(Model *m, const LayerParams *lp, LayerActs *la, ModelActs *a, const real *d_out) {
    const Config *c = &m->cfg;
    MoeActs *ma = &la->moe;
    int N = a->N, H = c->hidden_size;
    int32_t offsets[2] = {0, N};
    ExpertShape shape = {.groups = 1, .H = H, .I = c->moe_shared_expert_intermediate_size, .offsets = offsets};
    int gated = lp->shared_expert_gate >= 0;
    experts_backward(a->d_shared_in, gated ? a->d_shared_gate : NULL, &lp->shared_grads, d_out, &ma->shared, la->ln2,
                     gated ? ma->shared_gate : NULL, &lp->shared_params, &shape, a->d_gate, a->d_up, a->d_act);
    vec_add(a->d_norm, a->d_shared_in, (size_t)N * H);
    if (!gated) return;
    // gate g = σ(z), z = x·w: dz = dg·g(1−g)
    for (int n = 0; n < N; n++) a->d_shared_gate[n] *= ma->shared_gate[n] * (1 - ma->shared_gate[n]);
    linear_backward(a->d_norm, tt_grad(&m->tt, lp->shared_expert_gate), a->d_shared_gate, la->ln2,
                    tt_param(&m->tt, lp->shared_expert_gate), N, H, 1);
}

void moe_backward(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out, double loss_scale) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    MoeActs *ma = &la->moe;
    int N = a->N, H = c->hidden_size, E = c->num_experts;
    routed_experts_backward(m, lp, ma, a, d_out);
    // router: probs → logits → (router input, W_router); with forced balancing the random
    // logits pass their gradient straight through to the real ones
    router_backward(a->d_router_logits, a->d_choice_probs, ma->logits, &ma->route, &m->router, &ma->call, loss_scale);
    if (!ma->jitter_used) {  // the router read ln2 itself: its input gradient adds straight in
        linear_backward(a->d_norm, tt_grad(&m->tt, lp->router), a->d_router_logits, ma->router_input,
                        tt_param(&m->tt, lp->router), N, H, E);
    } else {                 // x̃ = ln2 ⊙ jitter: dx = (dl·W_r) ⊙ jitter
        vec_zero(a->d_router_input, (size_t)N * H);
        linear_backward(a->d_router_input, tt_grad(&m->tt, lp->router), a->d_router_logits, ma->router_input,
                        tt_param(&m->tt, lp->router), N, H, E);
        for (size_t i = 0; i < (size_t)N * H; i++) a->d_router_input[i] *= ma->jitter[i];
        vec_add(a->d_norm, a->d_router_input, (size_t)N * H);
    }
    if (lp->shared_gate >= 0) shared_expert_backward(m, lp, la, a, d_out);
}

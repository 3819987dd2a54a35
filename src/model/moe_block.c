// moe_block.c — the model's MoE feed-forward block (moe_forward / moe_backward on a layer's
// LayerActs): router → token dispatcher → experts → combine, composed from the pieces in
// moe/ as mlp.c composes the dense FFN, plus the tensor-parallel shared expert every token
// uses.
#include <math.h>
#include <string.h>

#include "core/rng.h"
#include "model/layers.h"
#include "moe/token_dispatcher.h"
#include "ops/ops.h"

enum { NOISE_JITTER = 1, NOISE_FORCED_LOGITS = 2 };  // random streams of a layer

// The first token of this rank's among the micro-batch's (sequence parallelism splits them).
static int first_local_token(const Model *m, int N_local) {
    return m->plan.sequence_parallel ? m->plan.tp_rank * N_local : 0;
}

// A layer's noise stream over the micro-batch's tokens in order, each token drawing
// `per_token` values, so that every layout draws the same values for a token: this rank
// skips the draws of the tokens that are not its own.
typedef struct {
    Rng rng;
    int stream;
    size_t per_token;
    const int32_t *token_index;  // (N_local) with context parallelism: this rank's tokens, else NULL
} LayerNoise;

static double noise_draw(LayerNoise *z) { return z->stream == NOISE_JITTER ? rng_uniform(&z->rng) : rng_normal(&z->rng); }

static void noise_skip_tokens(LayerNoise *z, size_t tokens) {
    for (size_t i = 0; i < tokens * z->per_token; i++) noise_draw(z);
}

static LayerNoise layer_noise(const Model *m, const Batch *batch, int layer, int stream, int N_local,
                              size_t per_token, const int32_t *token_index) {
    LayerNoise z = {.stream = stream, .per_token = per_token, .token_index = token_index};
    rng_seed_stream(&z.rng, batch->noise_seed, (uint64_t)layer * 16 + stream);
    if (!token_index) noise_skip_tokens(&z, (size_t)first_local_token(m, N_local));
    return z;
}

// Before the draws of this rank's token n: skip the other ranks' tokens since token n−1.
static void noise_at_token(LayerNoise *z, int n) {
    if (!z->token_index) return;
    int previous_end = n ? z->token_index[n - 1] + 1 : 0;
    noise_skip_tokens(z, (size_t)(z->token_index[n] - previous_end));
}

// router_input = ln2, or ln2 · U(1−eps, 1+eps) elementwise while training with jitter
static void router_input(const Model *m, int layer, LayerActs *la, const Batch *batch, int N,
                         const int32_t *token_index) {
    MoeActs *ma = &la->moe;
    int H = m->plan.hidden;
    double eps = m->cfg.moe_input_jitter_eps;
    ma->jitter_used = batch->training && eps > 0;
    ma->router_input = la->ln2;
    if (!ma->jitter_used) return;
    LayerNoise z = layer_noise(m, batch, layer, NOISE_JITTER, N, H, token_index);
    for (int n = 0; n < N; n++) {
        noise_at_token(&z, n);
        for (size_t i = (size_t)n * H; i < (size_t)(n + 1) * H; i++) {
            ma->jitter[i] = (real)(1 - eps + 2 * eps * noise_draw(&z));
            ma->jittered_input[i] = la->ln2[i] * ma->jitter[i];
        }
    }
    ma->router_input = ma->jittered_input;
}

// logits (N,E) = router_input · W_routerᵀ in the router dtype
static void router_logits(const Model *m, const LayerParams *lp, MoeActs *ma, int N) {
    int H = m->plan.hidden, E = m->plan.experts;
    const real *W = tt_param(&m->tt, lp->router);
    if (!m->cfg.router_fp64) linear_forward(ma->logits, ma->router_input, W, N, H, E);
    else moe_router_logits(ma->logits, ma->router_input, W, N, H, E);  // double accumulation
}

// Router bookkeeping across the micro-batches of a global batch (training only).
static void record_routing(const Model *m, int layer, const MoeActs *ma) {
    RouterState *rs = &m->router_state[layer];
    for (int e = 0; e < m->plan.experts; e++) {
        rs->global_counts_sum[e] += ma->route.group_counts[e];
        rs->bias_counts[e] += ma->route.group_tokens_per_expert[e];  // the token group's (all of them here)
    }
    rs->global_micro_batches += ma->route.group_batches;
}

// The shared expert: a dense SwiGLU on every token (tensor parallel as the dense FFN:
// gate/up column-parallel on ln2_full, down row-parallel), its output scaled per token by
// σ(ln2·w_gate) with --moe-shared-expert-gate (computed on this rank's tokens, gathered).
static void shared_expert_forward(const Model *m, const LayerParams *lp, LayerActs *la, int N) {
    MoeActs *ma = &la->moe;
    TpRegion region = model_tp_region(m);
    int H = m->plan.hidden, N_local = plan_local_tokens(&m->plan, N);
    int32_t offsets[2] = {0, N};
    ExpertShape shape = {.groups = 1, .H = H, .I = m->plan.shared_ffn, .offsets = offsets};
    real *gate = NULL;
    if (lp->shared_expert_gate >= 0) {  // σ(x·w_gate) scales the whole shared output
        linear_forward(ma->shared_gate, la->ln2, tt_param(&m->tt, lp->shared_expert_gate), N_local, H, 1);
        for (int n = 0; n < N_local; n++) ma->shared_gate[n] = 1 / (1 + real_exp(-ma->shared_gate[n]));
        tp_enter_forward(&region, ma->shared_gate, ma->shared_gate_full, N, 1);
        gate = ma->shared_gate_full;
    }
    tp_enter_forward(&region, la->ln2, la->ln2_full, N, H);
    experts_forward(la->ffn_partial, &ma->shared, la->ln2_full, gate, &lp->shared_params, &shape);
    tp_exit_forward(&region, la->ffn_partial, ma->shared_out, N, H);
    vec_add(la->ffn_out, ma->shared_out, (size_t)N_local * H);
}

// What the token dispatcher needs of the model.
static MoeDispatchContext dispatch_context(const Model *m) {
    return (MoeDispatchContext){.hidden = m->plan.hidden, .experts = m->plan.experts, .moe_ffn = m->plan.moe_ffn,
                                .ep = &m->ep, .buffers = m->ep_buffers};
}

// The backward scratch of a that the dispatcher fills or hands the experts; the routed
// experts' input gradient goes to a->d_norm.
static MoeBackwardBuffers dispatch_backward_buffers(ModelActs *a) {
    return (MoeBackwardBuffers){.d_rows_out = a->d_rows_out, .d_rows_in = a->d_rows_in, .d_row_probs = a->d_row_probs,
                                .d_gate = a->d_gate, .d_up = a->d_up, .d_act = a->d_act, .d_x = a->d_norm,
                                .d_choice_probs = a->d_choice_probs};
}

// x (N,H) -> out (N,H): the routed experts' outputs combined per token: the dispatcher
// moves the rows, the experts run here between its phases.
static void routed_experts_forward(const Model *m, const LayerParams *lp, MoeActs *ma, const real *x, real *out) {
    const TokenDispatcher *d = token_dispatcher_of(&m->ep);
    MoeDispatchContext ctx = dispatch_context(m);
    ExpertRows *rows = &ma->expert_rows;
    d->dispatch(&ctx, ma, x, rows);
    experts_forward(rows->rows_out, rows->acts, rows->rows_in, rows->row_probs, &lp->ffn_params, &rows->shape);
    d->combine(&ctx, ma, rows, out);
}

// d_out (N,H) -> a->d_norm (N,H) overwritten and a->d_choice_probs (N,k).
static void routed_experts_backward(const Model *m, const LayerParams *lp, MoeActs *ma, ModelActs *a,
                                    const real *d_out) {
    const TokenDispatcher *d = token_dispatcher_of(&m->ep);
    MoeDispatchContext ctx = dispatch_context(m);
    MoeBackwardBuffers grads = dispatch_backward_buffers(a);
    ExpertRows *rows = &ma->expert_rows;
    d->combine_backward(&ctx, ma, &grads, d_out, rows);
    experts_backward(rows->d_rows_in, rows->d_row_probs, &lp->ffn_grads, rows->d_rows_out, rows->acts, rows->rows_in,
                     rows->row_probs, &lp->ffn_params, &rows->shape, rows->scratch_gate, rows->scratch_up,
                     rows->scratch_act);
    d->dispatch_backward(&ctx, ma, &grads, rows);
}

void moe_forward(const Model *m, int layer, LayerActs *la, const Batch *batch, const int32_t *token_index) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    MoeActs *ma = &la->moe;
    int N = batch->B * batch->T, N_local = plan_local_tokens(&m->plan, N), E = m->plan.experts;
    router_input(m, layer, la, batch, N_local, token_index);
    router_logits(m, lp, ma, N_local);
    if (c->moe_router_force_load_balancing) {  // random logits; gradients pass straight through
        LayerNoise z = layer_noise(m, batch, layer, NOISE_FORCED_LOGITS, N_local, (size_t)E, token_index);
        for (int n = 0; n < N_local; n++) {
            noise_at_token(&z, n);
            for (size_t i = (size_t)n * E; i < (size_t)(n + 1) * E; i++) ma->logits[i] = (real)noise_draw(&z);
        }
    }
    const RouterState *rs = &m->router_state[layer];
    // a sequence's T tokens are T/CP here with context parallelism
    ma->call = (RouterCall){.N = N_local, .seq_length = batch->T * m->plan.cp_size,
                            .expert_bias = lp->expert_bias >= 0 ? tt_param(&m->tt, lp->expert_bias) : NULL,
                            .global_counts_before = batch->training ? rs->global_counts_sum : NULL,
                            .global_batches_before = batch->training ? rs->global_micro_batches : 0,
                            .count_group = batch->training ? m->count_group : NULL,
                            .token_group = m->plan.token_group,
                            .token_first = first_local_token(m, N_local), .token_index = token_index};
    router_forward(&ma->route, ma->logits, &m->router, &ma->call);
    if (batch->training) record_routing(m, layer, ma);
    ma->plan.N = N_local;
    routed_experts_forward(m, lp, ma, la->ln2, la->ffn_out);
    if (lp->shared_gate >= 0) shared_expert_forward(m, lp, la, N);
}

// Shared expert backward: adds its input gradient into a->d_norm (this rank's tokens).
static void shared_expert_backward(Model *m, const LayerParams *lp, LayerActs *la, ModelActs *a, const real *d_out) {
    MoeActs *ma = &la->moe;
    TpRegion region = model_tp_region(m);
    int N = a->N, N_local = a->N_local, H = m->plan.hidden;
    int32_t offsets[2] = {0, N};
    ExpertShape shape = {.groups = 1, .H = H, .I = m->plan.shared_ffn, .offsets = offsets};
    int gated = lp->shared_expert_gate >= 0;
    tp_exit_backward(&region, d_out, a->d_out_full, N, H);
    experts_backward(a->d_shared_in_full, gated ? a->d_shared_gate_full : NULL, &lp->shared_grads, a->d_out_full,
                     &ma->shared, la->ln2_full, gated ? ma->shared_gate_full : NULL, &lp->shared_params, &shape,
                     a->d_gate, a->d_up, a->d_act);
    tp_enter_backward(&region, a->d_shared_in_full, a->d_shared_in, N, H);
    vec_add(a->d_norm, a->d_shared_in, (size_t)N_local * H);
    if (!gated) return;
    // each rank's columns make part of the gate's gradient: summed over TP, this rank's tokens kept
    tp_enter_backward(&region, a->d_shared_gate_full, a->d_shared_gate, N, 1);
    // gate g = σ(z), z = x·w: dz = dg·g(1−g)
    for (int n = 0; n < N_local; n++) a->d_shared_gate[n] *= ma->shared_gate[n] * (1 - ma->shared_gate[n]);
    linear_backward(a->d_norm, tt_grad(&m->tt, lp->shared_expert_gate), a->d_shared_gate, la->ln2,
                    tt_param(&m->tt, lp->shared_expert_gate), N_local, H, 1);
}

void moe_backward(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out, double loss_scale) {
    const LayerParams *lp = &m->layers[layer];
    MoeActs *ma = &la->moe;
    int N = a->N_local, H = m->plan.hidden, E = m->plan.experts;
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

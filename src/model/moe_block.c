// moe_block.c — the model's MoE feed-forward block (moe_forward / moe_backward on a layer's
// LayerActs): router → token dispatcher → experts → combine, composed from the pieces in
// moe/ as mlp.c composes the dense FFN, plus the tensor-parallel shared expert every token
// uses; with latent MoE fc1 takes the dispatched tokens to the latent width and fc2 brings
// the combined rows back.
#include <math.h>
#include <string.h>

#include "core/device.h"
#include "core/rng.h"
#include "model/layers.h"
#include "moe/routing_trace.h"
#include "moe/token_dispatcher.h"
#include "ops/ops.h"
#include "ops/quantized_linear.h"

enum { NOISE_JITTER = 1, NOISE_FORCED_LOGITS = 2 };  // random streams of a layer

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
    if (!token_index) noise_skip_tokens(&z, (size_t)plan_first_local_token(&m->plan, N_local));
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
    ma->router_input_store = la->ln2_store;
    if (!ma->jitter_used) return;
    MT_ASSERT(la->ln2_store == STORE_FP32);  // layout.h moe_norm_store
    LayerNoise z = layer_noise(m, batch, layer, NOISE_JITTER, N, H, token_index);
    real *jitter = mt_malloc((size_t)N * H * sizeof(real));  // drawn here, uploaded in one copy
    for (int n = 0; n < N; n++) {
        noise_at_token(&z, n);
        for (size_t i = (size_t)n * H; i < (size_t)(n + 1) * H; i++)
            jitter[i] = (real)(1 - eps + 2 * eps * noise_draw(&z));
    }
    device_upload(ma->jitter, jitter, (size_t)N * H * sizeof(real));
    free(jitter);
    moe_scale_by(ma->jittered_input, la->ln2, ma->jitter, (size_t)N * H);
    ma->router_input = ma->jittered_input;
    ma->router_input_store = STORE_FP32;
}

// --moe-router-force-load-balancing: logits (N,E) replaced by normal draws of the layer's
// stream (host draws, uploaded in one copy); gradients pass straight through.
static void forced_logits(const Model *m, int layer, MoeActs *ma, const Batch *batch, int N,
                          const int32_t *token_index) {
    int E = m->plan.experts;
    LayerNoise z = layer_noise(m, batch, layer, NOISE_FORCED_LOGITS, N, (size_t)E, token_index);
    real *logits = mt_malloc((size_t)N * E * sizeof(real));
    for (int n = 0; n < N; n++) {
        noise_at_token(&z, n);
        for (size_t i = (size_t)n * E; i < (size_t)(n + 1) * E; i++) logits[i] = (real)noise_draw(&z);
    }
    device_upload(ma->logits, logits, (size_t)N * E * sizeof(real));
    free(logits);
}

// The router's GEMMs take fp32 inputs under --bf16 / --fp16 (Megatron-Core upcasts the
// router's input and weight to --moe-router-dtype): begin returns the precision to restore.
static int router_gemms_begin(void) {
    int saved = device_gemm_inputs();
    if (saved != GEMM_INPUTS_FP32) device_set_gemm_inputs(GEMM_INPUTS_FP32);
    return saved;
}

static void router_gemms_end(int saved) {
    if (saved != GEMM_INPUTS_FP32) device_set_gemm_inputs(saved);
}

// logits (N,E) = router_input · W_routerᵀ in the router dtype (a bf16-stored input read widened,
// as Megatron's router upcasts its bf16 input)
static void router_logits(const Model *m, const LayerParams *lp, MoeActs *ma, int N) {
    int H = m->plan.hidden, E = m->plan.experts;
    const real *W = tt_param(&m->tt, lp->router);
    int saved = router_gemms_begin();
    if (!m->cfg.router_fp64)
        qlinear_forward_stored(NULL, ma->logits, ma->router_input, ma->router_input_store, W, N, H, E);
    else
        moe_router_logits(ma->logits, ma->router_input, W, N, H, E);  // double accumulation (input fp32: layout.h)
    router_gemms_end(saved);
}

// Router bookkeeping across the micro-batches of a global batch (training only).
static void record_routing(const Model *m, int layer, const MoeActs *ma) {
    RouterState *rs = &m->router_state[layer];
    int E = m->plan.experts;
    const double *group_counts = router_host_group_counts(&ma->route, E);
    const double *group_tokens = router_host_group_tokens_per_expert(&ma->route, E);  // the token group's
    for (int e = 0; e < E; e++) {
        rs->global_counts_sum[e] += group_counts[e];
        rs->bias_counts[e] += group_tokens[e];
    }
    rs->global_micro_batches += ma->route.group_batches;
}

// Quantile balancing: a training forward's quantiles, added to the global batch's sums.
static void add_quantiles(const Model *m, int layer) {
    RouterState *rs = &m->router_state[layer];
    int E = m->plan.experts;
    real *q = mt_malloc((size_t)E * sizeof(real));
    device_download(q, rs->qb_quantile, (size_t)E * sizeof(real));
    for (int e = 0; e < E; e++) rs->qb_quantile_sum[e] += q[e];
    rs->qb_micro_batches++;
    free(q);
}

// --moe-enable-routing-replay: a training forward's picks (a recomputed one's too) from the
// trace, put where the router keeps its picks; returns whether it did.
static int replay_picks(const Model *m, int layer, MoeActs *ma, const Batch *batch, int N) {
    if (!batch->training || !routing_trace_replays(m->routing_trace)) return 0;
    const int32_t *picks = routing_trace_replay(m->routing_trace, batch->first_sample, layer, N);
    device_upload(ma->route.topk_idx, picks, (size_t)N * m->plan.topk * sizeof(int32_t));
    return 1;
}

// --moe-routing-trace-path (recording): a training forward's picks, before capacity dropping.
static void trace_picks(const Model *m, int layer, const MoeActs *ma, const Batch *batch, int N) {
    if (!m->routing_trace || routing_trace_replays(m->routing_trace)) return;
    int32_t *picks = mt_malloc((size_t)MT_MAX(N, 1) * m->plan.topk * sizeof(int32_t));
    device_download(picks, ma->route.topk_idx, (size_t)N * m->plan.topk * sizeof(int32_t));
    routing_trace_write(m->routing_trace, batch->iteration, batch->first_sample, layer, picks, N);
    free(picks);
}

// What the token dispatcher needs of the model, in a forward or a backward pass (each kind
// its own exchange scratch: the combined schedule overlaps a forward with a backward); its
// rows are the latent width with latent MoE.
static MoeDispatchContext dispatch_context(const Model *m, PassKind pass) {
    return (MoeDispatchContext){.hidden = m->plan.moe_hidden, .experts = m->plan.experts, .moe_ffn = m->plan.moe_ffn,
                                .ep = &m->ep, .buffers = m->ep_buffers[pass],
                                .act_shared = plan_recomputes(&m->plan, RECOMPUTE_MOE_ACT),
                                .act_store = m->plan.swiglu_act_store, .gate_up_store = m->plan.gate_up_store,
                                .rows_store = m->plan.expert_rows_store,
                                .bf16_rows = model_expert_rows_bf16(m)};
}

// Latent MoE (--moe-latent-size): the layer's routed experts work in the latent width, fc1
// before the dispatch, fc2 after the combine; the router and the shared expert read ln2.
static int latent(const LayerParams *lp) { return lp->fc1_latent_proj >= 0; }

// The backward scratch of a that the dispatcher fills or hands the experts; the routed
// experts' input gradient goes to a->d_norm (with latent MoE to a->d_latent_in, fc1's output).
static MoeBackwardBuffers dispatch_backward_buffers(const LayerParams *lp, ModelActs *a) {
    return (MoeBackwardBuffers){.d_rows_out = a->d_rows_out, .d_rows_in = a->d_rows_in, .d_row_probs = a->d_row_probs,
                                .d_gate = a->d_gate, .d_up = a->d_up, .d_act = a->d_act,
                                .d_x = latent(lp) ? a->d_latent_in : a->d_norm, .d_choice_probs = a->d_choice_probs};
}

// The rows the dispatcher moves (N,·): ln2 itself (stored as the layer keeps it), or with latent
// MoE latent_in (N,L) = ln2·W_fc1ᵀ (fp32); *store says which.
static const void *dispatch_input(const Model *m, const LayerParams *lp, LayerActs *la, int N, Storage *store) {
    *store = la->ln2_store;
    if (!latent(lp)) return la->ln2;
    qlinear_forward_stored(model_quant(m, lp->fc1_latent_proj), la->moe.latent_in, la->ln2, la->ln2_store,
                           tt_param(&m->tt, lp->fc1_latent_proj), N, m->plan.hidden, m->plan.moe_hidden);
    *store = STORE_FP32;
    return la->moe.latent_in;
}

// Where the combine writes (N,·): ffn_out, or with latent MoE latent_out (N,L), which fc2 reads.
static real *combine_output(const LayerParams *lp, LayerActs *la) {
    return latent(lp) ? la->moe.latent_out : la->ffn_out;
}

// The gradient of the combine's output: d_out (N,H) itself, or with latent MoE through fc2:
// d_latent_out (N,L) = d_out·W_fc2 and W_fc2's gradient += d_outᵀ·latent_out.
static const real *combine_output_gradient(Model *m, const LayerParams *lp, LayerActs *la, ModelActs *a,
                                           const real *d_out) {
    if (!latent(lp)) return d_out;
    int N = a->N_local, H = m->plan.hidden, L = m->plan.moe_hidden;
    vec_zero(a->d_latent_out, (size_t)N * L);
    qlinear_backward(model_quant(m, lp->fc2_latent_proj), a->d_latent_out, tt_grad(&m->tt, lp->fc2_latent_proj), d_out,
                     la->moe.latent_out, tt_param(&m->tt, lp->fc2_latent_proj), N, L, H);
    return a->d_latent_out;
}

// Latent MoE: the dispatched rows' gradient d_latent_in (N,L) through fc1 into d_norm (N,H),
// overwritten as the dispatcher overwrites it without latent MoE; W_fc1's gradient +=
// d_latent_inᵀ·ln2.
static void dispatch_input_backward(Model *m, const LayerParams *lp, LayerActs *la, ModelActs *a) {
    if (!latent(lp)) return;
    int N = a->N_local, H = m->plan.hidden, L = m->plan.moe_hidden;
    vec_zero(a->d_norm, (size_t)N * H);
    qlinear_backward_stored(model_quant(m, lp->fc1_latent_proj), a->d_norm, tt_grad(&m->tt, lp->fc1_latent_proj),
                            a->d_latent_in, la->ln2, la->ln2_store, tt_param(&m->tt, lp->fc1_latent_proj), N, H, L);
}

// --moe-shared-expert-overlap: the shared expert computes while the routed rows travel.
static int shared_overlapped(const Model *m, const LayerParams *lp) {
    return m->cfg.moe_shared_expert_overlap && lp->shared_gate >= 0;
}

// The router's view of the step's earlier micro-batches: the forward takes it from the
// router state (and keeps a copy); a recomputed forward uses that copy.
static void counts_before(const Model *m, int layer, MoeActs *ma, const Batch *batch, PassKind pass) {
    const RouterState *rs = &m->router_state[layer];
    if (!batch->training || pass == PASS_RECOMPUTE) return;
    if (!ma->counts_before) ma->counts_before = mt_malloc((size_t)m->plan.experts * sizeof(double));
    memcpy(ma->counts_before, rs->global_counts_sum, (size_t)m->plan.experts * sizeof(double));
    ma->batches_before = rs->global_micro_batches;
}

void moe_forward_begin(const Model *m, int layer, LayerActs *la, const Batch *batch, const int32_t *token_index,
                       PassKind pass) {
    const Config *c = &m->cfg;
    const LayerParams *lp = &m->layers[layer];
    MoeActs *ma = &la->moe;
    int N = batch->B * batch->T, N_local = plan_local_tokens(&m->plan, N);
    ma->pass = pass;
    router_input(m, layer, la, batch, N_local, token_index);
    router_logits(m, lp, ma, N_local);
    if (c->moe_router_force_load_balancing) forced_logits(m, layer, ma, batch, N_local, token_index);
    counts_before(m, layer, ma, batch, pass);
    // a sequence's T tokens are T/CP here with context parallelism
    ma->call = (RouterCall){.N = N_local, .seq_length = batch->T * m->plan.cp_size,
                            .expert_bias = lp->expert_bias >= 0 ? tt_param(&m->tt, lp->expert_bias) : NULL,
                            .global_counts_before = batch->training ? ma->counts_before : NULL,
                            .global_batches_before = batch->training ? ma->batches_before : 0,
                            .count_group = batch->training ? m->count_group : NULL,
                            .token_group = m->plan.token_group,
                            .token_first = plan_first_local_token(&m->plan, N_local), .token_index = token_index,
                            .training = batch->training,
                            .qb_bias = lp->qb_bias >= 0 ? tt_param(&m->tt, lp->qb_bias) : NULL,
                            .qb_quantile = lp->qb_bias >= 0 && batch->training && pass == PASS_FORWARD
                                               ? m->router_state[layer].qb_quantile : NULL};
    ma->call.replay = replay_picks(m, layer, ma, batch, N_local);
    router_forward(&ma->route, ma->logits, &m->router, &ma->call);
    if (batch->training && pass == PASS_FORWARD) {
        record_routing(m, layer, ma);
        trace_picks(m, layer, ma, batch, N_local);
    }
    if (ma->call.qb_quantile) add_quantiles(m, layer);
    ma->plan.N = N_local;
    MoeDispatchContext ctx = dispatch_context(m, pass);
    const void *x = dispatch_input(m, lp, la, N_local, &ctx.x_store);
    token_dispatcher_of(&m->ep)->dispatch(&ctx, ma, x, &ma->expert_rows);
    if (shared_overlapped(m, lp)) shared_expert_forward(m, lp, la, N);
}

void moe_forward_exchange(const Model *m, int layer, LayerActs *la) {
    const TokenDispatcher *d = token_dispatcher_of(&m->ep);
    MoeDispatchContext ctx = dispatch_context(m, la->moe.pass);
    if (d->dispatch_exchange) d->dispatch_exchange(&ctx, &la->moe);
}

void moe_forward_experts(const Model *m, int layer, LayerActs *la) {
    const LayerParams *lp = &m->layers[layer];
    MoeActs *ma = &la->moe;
    const TokenDispatcher *d = token_dispatcher_of(&m->ep);
    MoeDispatchContext ctx = dispatch_context(m, ma->pass);
    ExpertRows *rows = &ma->expert_rows;
    if (d->dispatch_finish) d->dispatch_finish(&ctx, ma, rows);
    experts_forward(rows->rows_out, rows->acts, rows->rows_in, rows->row_probs, &lp->ffn_params, &rows->shape);
    d->combine(&ctx, ma, rows, combine_output(lp, la));
}

void moe_forward_end(const Model *m, int layer, LayerActs *la, int N) {
    const LayerParams *lp = &m->layers[layer];
    const TokenDispatcher *d = token_dispatcher_of(&m->ep);
    MoeDispatchContext ctx = dispatch_context(m, la->moe.pass);
    int N_local = plan_local_tokens(&m->plan, N);
    if (d->combine_finish) d->combine_finish(&ctx, &la->moe, combine_output(lp, la));
    if (latent(lp))  // ffn_out (N,H) = latent_out·W_fc2ᵀ
        qlinear_forward(model_quant(m, lp->fc2_latent_proj), la->ffn_out, la->moe.latent_out,
                        tt_param(&m->tt, lp->fc2_latent_proj), N_local, m->plan.moe_hidden, m->plan.hidden);
    if (lp->shared_gate < 0) return;
    if (!shared_overlapped(m, lp)) shared_expert_forward(m, lp, la, N);
    vec_add(la->ffn_out, la->moe.shared_out, (size_t)N_local * m->plan.hidden);
}

void moe_forward(const Model *m, int layer, LayerActs *la, const Batch *batch, const int32_t *token_index,
                 PassKind pass) {
    moe_forward_begin(m, layer, la, batch, token_index, pass);
    moe_forward_exchange(m, layer, la);
    moe_forward_experts(m, layer, la);
    moe_forward_end(m, layer, la, batch->B * batch->T);
}

void moe_backward_begin(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out) {
    const LayerParams *lp = &m->layers[layer];
    MoeDispatchContext ctx = dispatch_context(m, PASS_BACKWARD);
    MoeBackwardBuffers grads = dispatch_backward_buffers(lp, a);
    const real *d_combined = combine_output_gradient(m, lp, la, a, d_out);
    token_dispatcher_of(&m->ep)->combine_backward(&ctx, &la->moe, &grads, d_combined, &la->moe.expert_rows);
    if (shared_overlapped(m, lp)) shared_expert_backward(m, lp, la, a, d_out);
}

// The experts' saved activations for their weight gradients: as saved, or with
// --recompute-modules moe_act the SwiGLU product again, into the data gradients' act scratch
// (free once they are done; the forward's product lived in a buffer every layer shares).
static ExpertActs acts_for_weights(const Model *m, const ExpertRows *rows) {
    ExpertActs acts = *rows->acts;
    if (!plan_recomputes(&m->plan, RECOMPUTE_MOE_ACT)) return acts;
    experts_recompute_act(rows->scratch_act, &acts, rows->row_probs, &rows->shape);
    acts.act = rows->scratch_act;
    return acts;
}

// The routed experts' data gradients, then (--delay-wgrad-compute: while the input
// gradients travel back) their weight gradients.
void moe_backward_experts(Model *m, int layer, LayerActs *la, ModelActs *a) {
    const LayerParams *lp = &m->layers[layer];
    MoeActs *ma = &la->moe;
    const TokenDispatcher *d = token_dispatcher_of(&m->ep);
    MoeDispatchContext ctx = dispatch_context(m, PASS_BACKWARD);
    MoeBackwardBuffers grads = dispatch_backward_buffers(lp, a);
    ExpertRows *rows = &ma->expert_rows;
    if (d->combine_backward_finish) d->combine_backward_finish(&ctx, ma, rows);
    experts_backward_data(rows->d_rows_in, rows->d_row_probs, rows->d_rows_out, rows->acts, rows->row_probs,
                          &lp->ffn_params, &rows->shape, rows->scratch_gate, rows->scratch_up, rows->scratch_act);
    ExpertActs acts = acts_for_weights(m, rows);
    int delayed = m->cfg.delay_wgrad_compute;
    if (!delayed)
        experts_backward_weights(&lp->ffn_grads, rows->d_rows_out, &acts, rows->rows_in, &rows->shape,
                                 rows->scratch_gate, rows->scratch_up);
    d->dispatch_backward(&ctx, ma, &grads, rows);
    if (delayed)
        experts_backward_weights(&lp->ffn_grads, rows->d_rows_out, &acts, rows->rows_in, &rows->shape,
                                 rows->scratch_gate, rows->scratch_up);
}

void moe_backward_end(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out, double loss_scale) {
    const LayerParams *lp = &m->layers[layer];
    MoeActs *ma = &la->moe;
    int N = a->N_local, H = m->plan.hidden, E = m->plan.experts;
    const TokenDispatcher *d = token_dispatcher_of(&m->ep);
    MoeDispatchContext ctx = dispatch_context(m, PASS_BACKWARD);
    MoeBackwardBuffers grads = dispatch_backward_buffers(lp, a);
    if (d->dispatch_backward_finish) d->dispatch_backward_finish(&ctx, ma, &grads);
    dispatch_input_backward(m, lp, la, a);
    // router: probs → logits → (router input, W_router); with forced balancing the random
    // logits pass their gradient straight through to the real ones
    router_backward(a->d_router_logits, a->d_choice_probs, ma->logits, &ma->route, &m->router, &ma->call, loss_scale);
    int saved = router_gemms_begin();
    if (!ma->jitter_used) {  // the router read ln2 itself: its input gradient adds straight in
        qlinear_backward_stored(NULL, a->d_norm, tt_grad(&m->tt, lp->router), a->d_router_logits, ma->router_input,
                                ma->router_input_store, tt_param(&m->tt, lp->router), N, H, E);
    } else {                 // x̃ = ln2 ⊙ jitter: dx = (dl·W_r) ⊙ jitter
        vec_zero(a->d_router_input, (size_t)N * H);
        linear_backward(a->d_router_input, tt_grad(&m->tt, lp->router), a->d_router_logits, ma->router_input,
                        tt_param(&m->tt, lp->router), N, H, E);
        moe_scale_by(a->d_router_input, a->d_router_input, ma->jitter, (size_t)N * H);
        vec_add(a->d_norm, a->d_router_input, (size_t)N * H);
    }
    router_gemms_end(saved);
    if (lp->shared_gate < 0) return;
    if (!shared_overlapped(m, lp)) shared_expert_backward(m, lp, la, a, d_out);
    shared_expert_backward_add(m, lp, la, a);
}

void moe_backward(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out, double loss_scale) {
    moe_backward_begin(m, layer, la, a, d_out);
    moe_backward_experts(m, layer, la, a);
    moe_backward_end(m, layer, la, a, d_out, loss_scale);
}

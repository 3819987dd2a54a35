// test_grad_moe.c — MoE invariances and edge cases (double precision build):
//   * 1 expert with top-1 computes exactly the dense SwiGLU MLP with the same weights,
//     forward and backward, through the whole model;
//   * an expert that receives no token: outputs match a naive per-token reference, its
//     weight gradients are exactly zero, and all other gradients match finite differences;
//   * all tokens routed to one expert (top-1): the same checks.
#include <string.h>

#include "core/config.h"
#include "core/rng.h"
#include "model/layers.h"
#include "ops/ops.h"
#include "testlib.h"

static void small_config(Config *c, int experts, int topk, const char *freq, int qk) {
    config_defaults(c);
    c->moe_router_pre_softmax = topk == 1;
    c->num_layers = 2;
    c->hidden_size = 8;
    c->num_attention_heads = 2;
    c->ffn_hidden_size = 6;
    c->seq_length = 4;
    c->vocab_size = 13;
    c->make_vocab_size_divisible_by = 1;
    c->qk_layernorm = qk;
    c->num_experts = experts;
    c->moe_ffn_hidden_size = 6;
    c->moe_router_topk = topk;
    strcpy(c->moe_layer_freq, freq);
    strcpy(c->moe_aux_loss_coeff, "0.1");
    config_validate(c);
}

static void fill_random(Model *m, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    for (size_t i = 0; i < m->tt.total; i++) m->tt.params[i] = 0.4 * rng_normal(&rng);
}

// A fixed micro-batch of 2 × 4 tokens (ids below the small vocabulary).
static Batch eight_tokens(void) {
    static const int32_t tokens[8] = {1, 5, 7, 2, 12, 0, 3, 3}, targets[8] = {5, 7, 2, 12, 0, 3, 3, 9};
    return (Batch){.B = 2, .T = 4, .tokens = tokens, .targets = targets};
}

// Both models' activations for the batch, and both forwards.
static void forward_pair(Model *a, ModelActs *acts_a, Model *b, ModelActs *acts_b, const Batch *batch) {
    acts_alloc(acts_a, a, batch->B, batch->T);
    acts_alloc(acts_b, b, batch->B, batch->T);
    model_forward(a, acts_a, batch, NULL, 0);
    model_forward(b, acts_b, batch, NULL, 0);
}

// ---- 1 expert, top-1 == dense -------------------------------------------------------------

static void test_one_expert_top1_equals_dense_mlp(void) {
    Config cm, cd;
    small_config(&cm, 1, 1, "1", 1);  // top-1 softmax needs pre-softmax (as in Megatron)
    small_config(&cd, 0, 1, "1", 1);  // dense Qwen3 layers of the same width
    Model moe, dense;
    model_build(&moe, &cm);
    model_build(&dense, &cd);
    fill_random(&moe, 3);
    // copy every shared tensor by name; the expert's weights become the dense MLP's
    for (int i = 0; i < dense.tt.count; i++) {
        const char *name = dense.tt.descs[i].name;
        char expert_name[MT_NAME_MAX];
        snprintf(expert_name, sizeof(expert_name), "%s", name);
        char *mlp = strstr(expert_name, "mlp.");
        TensorId src = tt_find(&moe.tt, name);
        if (src < 0 && mlp) {
            char tail[64];
            snprintf(tail, sizeof(tail), "%s", mlp + 4);  // gate_proj.weight ...
            snprintf(mlp, sizeof(expert_name) - (mlp - expert_name), "mlp.experts.0.%s", tail);
            src = tt_find(&moe.tt, expert_name);
        }
        CHECK(src >= 0, "no source for %s", name);
        if (src < 0) return;
        memcpy(tt_param(&dense.tt, i), tt_param(&moe.tt, src), dense.tt.descs[i].numel * sizeof(real));
    }
    Batch batch = eight_tokens();
    ModelActs am, ad;
    forward_pair(&moe, &am, &dense, &ad, &batch);
    CHECK(memcmp(am.logits, ad.logits, 8 * cm.padded_vocab_size * sizeof(real)) == 0, "logits differ");
    CHECK(am.lm_loss == ad.lm_loss, "loss %.17g vs %.17g", am.lm_loss, ad.lm_loss);
    model_backward(&moe, &am, &batch, 1.0);
    model_backward(&dense, &ad, &batch, 1.0);
    CHECK(memcmp(tt_grad(&dense.tt, dense.embed), tt_grad(&moe.tt, moe.embed),
                 dense.tt.descs[dense.embed].numel * sizeof(real)) == 0, "embedding gradients differ");
    // the single expert's router gets no gradient: softmax over one expert is constant
    TensorId router = moe.layers[0].router;
    real *g = tt_grad(&moe.tt, router);
    for (size_t i = 0; i < moe.tt.descs[router].numel; i++) CHECK(g[i] == 0, "router grad %zu = %g", i, g[i]);
    acts_free(&am);
    acts_free(&ad);
    model_free(&moe);
    model_free(&dense);
}

// ---- crafted routing on one MoE layer ------------------------------------------------------

typedef struct {
    Model m;
    ModelActs a;
    real *x, *R;  // layer input (N,H) and the random functional of its output
    int N;
} MoeFixture;

// Column 0 of every token is +3; a router row with w[0] = bias pushes an expert's logit
// by 3·bias for every token: -5 kills expert `dead`, +5 makes expert `hot` win always.
static void fixture_with(MoeFixture *f, int experts, int topk, int dead, int hot, double capacity, int pad) {
    Config c;
    small_config(&c, experts, topk, "1", 1);
    c.num_layers = 1;
    c.moe_expert_capacity_factor = capacity;
    c.moe_pad_expert_input_to_capacity = pad;
    config_validate(&c);
    model_build(&f->m, &c);
    fill_random(&f->m, 11);
    f->N = 2 * c.seq_length;
    acts_alloc(&f->a, &f->m, 2, c.seq_length);
    f->a.B = 2;
    f->a.T = c.seq_length;
    f->a.N = f->N;
    Rng rng;
    rng_seed(&rng, 5);
    int H = c.hidden_size;
    f->x = f->a.layers[0].ln2;
    f->R = mt_malloc((size_t)f->N * H * sizeof(real));
    for (int n = 0; n < f->N; n++)
        for (int h = 0; h < H; h++) {
            f->x[n * H + h] = h == 0 ? 3 : rng_normal(&rng);
            f->R[n * H + h] = rng_normal(&rng);
        }
    real *wr = tt_param(&f->m.tt, f->m.layers[0].router);
    for (int e = 0; e < experts; e++) {
        wr[e * H] = e == dead ? -5 : e == hot ? 5 : 0;
        for (int h = 1; h < H; h++) wr[e * H + h] *= 0.3;
    }
}

static void fixture(MoeFixture *f, int experts, int topk, int dead, int hot) {
    fixture_with(f, experts, topk, dead, hot, 0, 0);
}

static void fixture_capacity(MoeFixture *f, double factor, int pad) { fixture_with(f, 4, 2, -1, 1, factor, pad); }

static void fixture_free(MoeFixture *f) {
    free(f->R);
    acts_free(&f->a);
    model_free(&f->m);
}

static double moe_objective(MoeFixture *f) {
    LayerActs *la = &f->a.layers[0];
    Batch batch = {.B = 2, .T = f->N / 2};
    moe_forward(&f->m, 0, la, &batch, NULL, PASS_FORWARD);
    int H = f->m.cfg.hidden_size;
    double s = 0;
    for (int i = 0; i < f->N * H; i++) s += la->ffn_out[i] * f->R[i];
    return s + router_objective(&la->moe.route, &f->m.router);
}

// Σ_j p_j · down(silu(gate x) · up x) for token n, straight from the weights.
static void naive_moe_token(const Model *m, const LayerActs *la, int n, real *out) {
    const Config *c = &m->cfg;
    int H = c->hidden_size, I = c->moe_ffn, k = c->moe_router_topk;
    const real *x = la->ln2 + n * H;
    for (int h = 0; h < H; h++) out[h] = 0;
    for (int j = 0; j < k; j++) {
        int e = la->moe.route.topk_idx[n * k + j];
        real p = la->moe.route.topk_probs[n * k + j];
        const LayerParams *lp = &m->layers[0];
        const real *wg = tt_param(&m->tt, lp->expert_gate[e]), *wu = tt_param(&m->tt, lp->expert_up[e]);
        const real *wd = tt_param(&m->tt, lp->expert_down[e]);
        for (int i = 0; i < I; i++) {
            double g = 0, u = 0;
            for (int h = 0; h < H; h++) {
                g += wg[i * H + h] * x[h];
                u += wu[i * H + h] * x[h];
            }
            double act = g / (1 + exp(-g)) * u * p;
            for (int h = 0; h < H; h++) out[h] += act * wd[h * I + i];
        }
    }
}

static void check_layer_against_reference_and_fd(MoeFixture *f, int dead_expert) {
    const Config *c = &f->m.cfg;
    LayerActs *la = &f->a.layers[0];
    int H = c->hidden_size;
    moe_objective(f);
    real ref[64];
    for (int n = 0; n < f->N; n++) {
        naive_moe_token(&f->m, la, n, ref);
        for (int h = 0; h < H; h++) CHECK_CLOSE(la->ffn_out[n * H + h], ref[h], 1e-12, 1e-10, "moe output vs naive");
    }
    // backward: d(ffn_out) = R, input gradient into d_norm
    vec_zero(f->m.tt.grads, f->m.tt.total);
    moe_backward(&f->m, 0, la, &f->a, f->R, 1.0);
    real *dx = mt_malloc((size_t)f->N * H * sizeof(real));
    memcpy(dx, f->a.d_norm, (size_t)f->N * H * sizeof(real));
    if (dead_expert >= 0) {
        CHECK(la->moe.route.tokens_per_expert[dead_expert] == 0, "expert %d got tokens", dead_expert);
        const LayerParams *lp = &f->m.layers[0];
        TensorId ids[3] = {lp->expert_gate[dead_expert], lp->expert_up[dead_expert], lp->expert_down[dead_expert]};
        for (int t = 0; t < 3; t++)
            for (size_t i = 0; i < f->m.tt.descs[ids[t]].numel; i++)
                CHECK(tt_grad(&f->m.tt, ids[t])[i] == 0, "dead expert gradient non-zero");
    }
    const double eps = 1e-6;
    for (int i = 0; i < f->N * H; i++) {  // input gradient
        real saved = f->x[i];
        f->x[i] = saved + eps;
        double up = moe_objective(f);
        f->x[i] = saved - eps;
        double down = moe_objective(f);
        f->x[i] = saved;
        CHECK_CLOSE(dx[i], (up - down) / (2 * eps), 1e-8, 1e-6, "d input");
    }
    for (int t = 0; t < f->m.tt.count; t++) {  // every MoE weight gradient
        const TensorDesc *d = &f->m.tt.descs[t];
        if (!(d->flags & (TENSOR_EXPERT | TENSOR_ROUTER))) continue;
        real *p = tt_param(&f->m.tt, t), *g = tt_grad(&f->m.tt, t);
        for (size_t i = 0; i < d->numel; i++) {
            real saved = p[i];
            p[i] = saved + eps;
            double up = moe_objective(f);
            p[i] = saved - eps;
            double down = moe_objective(f);
            p[i] = saved;
            CHECK_CLOSE(g[i], (up - down) / (2 * eps), 1e-8, 1e-6, d->name);
        }
    }
    free(dx);
}

static void test_expert_without_tokens(void) {
    MoeFixture f;
    fixture(&f, 4, 2, 2, -1);
    check_layer_against_reference_and_fd(&f, 2);
    fixture_free(&f);
}

static void test_all_tokens_to_one_expert(void) {
    MoeFixture f;
    fixture(&f, 4, 1, -1, 1);
    moe_objective(&f);
    CHECK(f.a.layers[0].moe.route.tokens_per_expert[1] == f.N, "expert 1 got %d of %d tokens",
          f.a.layers[0].moe.route.tokens_per_expert[1], f.N);
    check_layer_against_reference_and_fd(&f, 0);  // the others all receive nothing
    fixture_free(&f);
}

// A capacity no expert reaches drops nothing: the same outputs and gradients as dropless
// (bit for bit), and with padding the padded rows change nothing either.
static void test_capacity_above_load_equals_dropless(void) {
    MoeFixture dropless, roomy, padded;
    fixture_capacity(&dropless, 0, 0);
    fixture_capacity(&roomy, 4.0, 0);   // C = ceil(k·N/E · 4) ≥ N: every load fits
    fixture_capacity(&padded, 4.0, 1);
    double a = moe_objective(&dropless), b = moe_objective(&roomy), p = moe_objective(&padded);
    int hot = dropless.a.layers[0].moe.route.tokens_per_expert[1];
    CHECK(hot == dropless.N, "expert 1 should carry every token, got %d", hot);  // the largest load is N
    CHECK(a == b, "objective %.17g vs %.17g", a, b);
    CHECK_CLOSE(p, a, 1e-12, 1e-12, "padded objective");
    CHECK(roomy.a.layers[0].moe.route.dropped == 0 && padded.a.layers[0].moe.route.dropped == 0, "tokens dropped");
    CHECK(padded.a.layers[0].moe.plan.expert_offsets[4] == 4 * padded.a.layers[0].moe.route.capacity,
          "padding should give every expert its capacity of rows");
    size_t n = (size_t)dropless.N * dropless.m.cfg.hidden_size;
    CHECK(memcmp(dropless.a.layers[0].ffn_out, roomy.a.layers[0].ffn_out, n * sizeof(real)) == 0, "outputs differ");
    fixture_free(&dropless);
    fixture_free(&roomy);
    fixture_free(&padded);
}

// --moe-router-padding-for-quantization's rows (tokens that did not pick the expert, at
// probability 0) change nothing without a quantizer: a whole model's logits, loss and every
// gradient equal the unpadded model's (as values: a sum may differ in the sign of a zero).
static void test_aligned_padding_rows_change_nothing(void) {
    Config c;
    small_config(&c, 4, 2, "1", 1);
    Model plain, aligned;
    model_build(&plain, &c);
    model_build(&aligned, &c);
    aligned.plan.expert_row_align = 3;  // what the flag's recipe sets (16 and up) is above these 8 tokens
    fill_random(&plain, 21);
    memcpy(aligned.tt.params, plain.tt.params, plain.tt.total * sizeof(real));
    Batch batch = eight_tokens();
    ModelActs ap, aa;
    forward_pair(&plain, &ap, &aligned, &aa, &batch);
    int padded_layers = 0;
    for (int l = 0; l < c.num_layers; l++) padded_layers += aa.layers[l].moe.plan.rows > ap.layers[l].moe.plan.rows;
    CHECK(padded_layers == c.num_layers, "only %d of %d layers got padding rows", padded_layers, c.num_layers);
    for (int l = 0; l < c.num_layers; l++)
        for (int e = 0; e < 4; e++)
            CHECK(aa.layers[l].moe.plan.host_rows_per_expert[e] % 3 == 0 || aa.layers[l].moe.plan.host_rows_per_expert[e] == 8,
                  "layer %d expert %d has %d rows", l, e, aa.layers[l].moe.plan.host_rows_per_expert[e]);
    size_t logits = 8 * (size_t)c.padded_vocab_size;
    for (size_t i = 0; i < logits; i++) CHECK(aa.logits[i] == ap.logits[i], "logit %zu differs", i);
    CHECK(aa.lm_loss == ap.lm_loss, "loss %.17g vs %.17g", aa.lm_loss, ap.lm_loss);
    model_backward(&plain, &ap, &batch, 1.0);
    model_backward(&aligned, &aa, &batch, 1.0);
    size_t differ = 0;
    for (size_t i = 0; i < plain.tt.total; i++) differ += aligned.tt.grads[i] != plain.tt.grads[i];
    CHECK(differ == 0, "%zu gradients differ", differ);
    acts_free(&ap);
    acts_free(&aa);
    model_free(&plain);
    model_free(&aligned);
}

int main(void) {
    RUN(test_one_expert_top1_equals_dense_mlp);
    RUN(test_expert_without_tokens);
    RUN(test_all_tokens_to_one_expert);
    RUN(test_capacity_above_load_equals_dropless);
    RUN(test_aligned_padding_rows_change_nothing);
    TESTS_DONE();
}

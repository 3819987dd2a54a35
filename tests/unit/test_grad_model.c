// test_grad_model.c — finite-difference gradient checks of the whole model, every
// parameter tensor, in double precision (the library is compiled with real = double).
// Objective = lm_loss + Σ_layers coeff·aux + the multi-token-prediction losses' share,
// exactly what training minimises.
#include <string.h>

#include "core/config.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "model/model.h"
#include "testlib.h"

typedef struct {
    const char *moe_layer_freq;
    int qk_layernorm, untie, pre_softmax, topk, experts, group_query, masked;
    double aux_coeff;
    void (*router_features)(Config *c);  // extra router settings, or NULL
    int training;                        // forward in training mode (input jitter)
    int documents;                       // packed documents: --reset-position-ids and --reset-attention-mask
} Variant;

static void tiny_config(Config *c, const Variant *v) {
    config_defaults(c);
    c->num_layers = 2;
    c->hidden_size = 8;
    c->num_attention_heads = 2;
    c->group_query_attention = v->group_query;
    c->num_query_groups = 1;
    c->kv_channels = 4;
    c->ffn_hidden_size = 10;
    c->seq_length = 5;
    c->vocab_size = 11;
    c->make_vocab_size_divisible_by = 4;
    c->qk_layernorm = v->qk_layernorm;
    c->untie_embeddings_and_output_weights = v->untie;
    c->num_experts = v->experts;
    c->moe_ffn_hidden_size = 6;
    c->moe_router_topk = v->topk;
    strcpy(c->moe_layer_freq, v->moe_layer_freq);
    c->moe_router_pre_softmax = v->pre_softmax;
    snprintf(c->moe_aux_loss_coeff, sizeof(c->moe_aux_loss_coeff), "%g", v->aux_coeff);
    if (v->router_features) v->router_features(c);
    config_validate(c);
}

static double objective(Model *m, ModelActs *a, const Batch *b) {
    model_end_global_batch(m, 1);  // each evaluation starts a fresh global batch (global aux counts)
    model_forward(m, a, b, NULL, 0);
    return a->lm_loss + a->aux_objective + a->mtp_objective;
}

// A variant with dropout: its objective differs from the same model's without (so the masks
// are really applied), and not in evaluation (batch.training = 0: no dropout there).
static void dropout_changes_objective(Model *m, ModelActs *a, Batch *batch) {
    double with = objective(m, a, batch), hidden = m->cfg.hidden_dropout, attention = m->cfg.attention_dropout;
    m->cfg.hidden_dropout = m->cfg.attention_dropout = 0;
    double without = objective(m, a, batch);
    batch->training = 0;
    double eval_without = objective(m, a, batch);
    m->cfg.hidden_dropout = hidden;
    m->cfg.attention_dropout = attention;
    double eval_with = objective(m, a, batch);
    batch->training = 1;
    CHECK(with != without, "dropout changed nothing: %.17g", with);
    CHECK(eval_with == eval_without, "dropout in evaluation: %.17g vs %.17g", eval_with, eval_without);
}

// Routing decisions of every MoE layer, to detect a perturbation that flips a top-k.
static void routing_snapshot(const Model *m, const ModelActs *a, int32_t *out) {
    size_t at = 0;
    for (int l = 0; l < config_all_layers(&m->cfg); l++)
        if (m->layers[l].is_moe) {
            size_t n = (size_t)a->N * m->cfg.moe_router_topk;
            memcpy(out + at, a->layers[l].moe.route.topk_idx, n * sizeof(int32_t));
            at += n;
        }
}

static void check_variant(const Variant *v) {
    Config c;
    tiny_config(&c, v);
    Model m;
    model_build(&m, &c);
    // Random weights, norms included, with a larger scale than training init so every
    // path carries signal.
    Rng rng;
    rng_seed(&rng, 7);
    for (size_t i = 0; i < m.tt.total; i++) m.tt.params[i] = 0.5 * rng_normal(&rng);
    for (int t = 0; t < m.tt.count; t++)
        if (m.tt.descs[t].flags & TENSOR_NORM) {
            real *p = tt_param(&m.tt, t);
            for (size_t i = 0; i < m.tt.descs[t].numel; i++) p[i] = 1 + 0.3 * rng_normal(&rng);
        }
    int B = 2, T = c.seq_length, N = B * T;
    int32_t tokens[10], targets[10];
    real mask[10];
    for (int n = 0; n < N; n++) {
        tokens[n] = rng_below(&rng, c.vocab_size);
        targets[n] = rng_below(&rng, c.vocab_size);
        mask[n] = v->masked ? (n % 3 != 1) : 1;
    }
    int32_t positions[10], key_start[10];
    if (v->documents) {  // end-of-document tokens inside both rows: three documents per row at most
        const int32_t eod = c.vocab_size - 1;
        tokens[1] = tokens[T + 2] = tokens[T + 3] = eod;
        for (int b = 0; b < B; b++) document_layout(tokens + b * T, T, eod, key_start + b * T, positions + b * T);
    }
    Batch batch = {.B = B, .T = T, .tokens = tokens, .targets = targets, .loss_mask = mask,
                   .training = v->training, .noise_seed = 99, .positions = v->documents ? positions : NULL,
                   .key_start = v->documents ? key_start : NULL};
    ModelActs a;
    acts_alloc(&a, &m, B, T);
    if (c.hidden_dropout > 0 || c.attention_dropout > 0) dropout_changes_objective(&m, &a, &batch);
    objective(&m, &a, &batch);
    memset(m.tt.grads, 0, m.tt.total * sizeof(real));
    model_backward(&m, &a, &batch, 1.0);

    int32_t routing0[4096], routing1[4096];
    routing_snapshot(&m, &a, routing0);
    size_t routing_len = 0;
    for (int l = 0; l < config_all_layers(&c); l++) routing_len += m.layers[l].is_moe ? (size_t)N * c.moe_router_topk : 0;
    const double eps = 1e-6;
    int checked = 0, skipped = 0, worst_tensor = -1, tensor_failures = 0;
    double worst = 0;
    for (int t = 0; t < m.tt.count; t++) {
        const TensorDesc *d = &m.tt.descs[t];
        real *p = tt_param(&m.tt, t), *g = tt_grad(&m.tt, t);
        for (size_t i = 0; i < d->numel; i++) {
            real saved = p[i];
            p[i] = saved + eps;
            double up = objective(&m, &a, &batch);
            routing_snapshot(&m, &a, routing1);
            int flipped = memcmp(routing0, routing1, routing_len * sizeof(int32_t)) != 0;
            p[i] = saved - eps;
            double down = objective(&m, &a, &batch);
            routing_snapshot(&m, &a, routing1);
            flipped |= memcmp(routing0, routing1, routing_len * sizeof(int32_t)) != 0;
            p[i] = saved;
            if (flipped) {
                skipped++;
                continue;
            }
            double numeric = (up - down) / (2 * eps), analytic = g[i];
            // FD round-off is ~1e-16·|loss|/eps ≈ 1e-10 absolute: allow 1e-8 plus 1e-5 relative
            double err = fabs(numeric - analytic) / (1e-3 + fabs(numeric) + fabs(analytic));
            int bad = fabs(numeric - analytic) > 1e-8 + 1e-5 * (fabs(numeric) + fabs(analytic));
            if (err > worst) {
                worst = err;
                worst_tensor = t;
            }
            if (bad && tensor_failures++ == 0)
                CHECK(0, "%s[%zu]: analytic %.10g numeric %.10g", d->name, i, analytic, numeric);
            checked++;
        }
        tensor_failures = 0;
    }
    CHECK(skipped * 50 <= checked, "too many routing flips: %d skipped of %d", skipped, checked);
    CHECK(checked > 0, "nothing checked");
    if (worst_tensor >= 0 && worst > 1e-7)
        printf("     worst relative error %.2e in %s (%d checked, %d skipped)\n", worst,
               m.tt.descs[worst_tensor].name, checked, skipped);
    acts_free(&a);
    model_free(&m);
}

static void test_grad_qwen3_mixed_dense_moe(void) {
    Variant v = {"[0,1]", 1, 1, 0, 2, 4, 1, 1, 0.1, NULL, 0, 0};
    check_variant(&v);
}

static void test_grad_qwen3_pre_softmax_tied_top1(void) {
    Variant v = {"1", 1, 0, 1, 1, 3, 0, 0, 0.05, NULL, 0, 0};
    check_variant(&v);
}

static void test_grad_mixtral_untied_no_aux(void) {
    Variant v = {"1", 0, 1, 0, 2, 4, 1, 0, 0.0, NULL, 0, 0};
    check_variant(&v);
}

static void test_grad_mixtral_top3_of_5_masked(void) {
    Variant v = {"1", 0, 0, 0, 3, 5, 0, 1, 0.3, NULL, 0, 0};
    check_variant(&v);
}

// Every router feature that changes the function: sigmoid scores with expert bias and
// groups, scaling, capacity dropping, shared expert with gate, all balance losses, z-loss,
// fp64 router logits.
static void all_router_features(Config *c) {
    strcpy(c->moe_router_score_function, "sigmoid");
    c->moe_router_enable_expert_bias = 1;
    c->moe_router_num_groups = 2;
    c->moe_router_group_topk = 1;
    c->moe_router_topk_scaling_factor = 1.7;
    c->moe_expert_capacity_factor = 1.0;
    c->moe_shared_expert_intermediate_size = 5;
    c->moe_shared_expert_gate = 1;
    strcpy(c->moe_router_load_balancing_type, "aux_loss,seq_aux_loss,global_aux_loss");
    strcpy(c->moe_aux_loss_coeff, "0.1,0.2,0.3");
    c->moe_z_loss_coeff = 0.05;
    strcpy(c->moe_router_dtype, "fp64");
}

// sqrtsoftplus scores, padding to capacity with the position policy, and input jitter
// in training mode.
static void jitter_padding_features(Config *c) {
    strcpy(c->moe_router_score_function, "sqrtsoftplus");
    c->moe_expert_capacity_factor = 0.75;
    strcpy(c->moe_token_drop_policy, "position");
    c->moe_pad_expert_input_to_capacity = 1;
    c->moe_input_jitter_eps = 0.1;
    c->moe_shared_expert_intermediate_size = 3;
}

static void test_grad_router_features(void) {
    Variant v = {"[0,1]", 1, 1, 0, 2, 4, 1, 1, 0.0, all_router_features, 0, 0};
    check_variant(&v);
}

static void test_grad_jitter_padding_training(void) {
    Variant v = {"1", 1, 0, 0, 2, 4, 0, 0, 0.1, jitter_padding_features, 1, 0};
    check_variant(&v);
}

// OLMoE attention: one RMSNorm over each whole q and k projection, then clamping of q, k, v.
static void olmoe_attention(Config *c) {
    strcpy(c->qk_layernorm_scope, "projection");
    c->clip_qkv = 1.2;
}

static void test_grad_olmoe_clip_qkv(void) {
    Variant v = {"1", 1, 0, 1, 2, 4, 1, 0, 0.1, olmoe_attention, 0, 0};
    check_variant(&v);
}

// DeepSeek-V3: Multi-Latent Attention with low-rank queries and interleaved RoPE, sigmoid
// router with expert bias, groups (2 of the top experts per group), scaling, shared
// expert, first layer dense.
static void deepseek_v3(Config *c) {
    c->multi_latent_attention = 1;
    c->group_query_attention = 0;
    c->q_lora_rank = 5;
    c->kv_lora_rank = 6;
    c->qk_head_dim = 3;
    c->qk_pos_emb_head_dim = 4;
    c->v_head_dim = 5;
    c->rotary_interleaved = 1;
    strcpy(c->moe_router_score_function, "sigmoid");
    c->moe_router_enable_expert_bias = 1;
    c->moe_router_num_groups = 2;
    c->moe_router_group_topk = 1;
    c->moe_router_topk_scaling_factor = 2.5;
    c->moe_shared_expert_intermediate_size = 12;
}

// Multi-Latent Attention with full-rank queries, rotate-half RoPE, under a softmax router.
static void mla_full_rank_queries(Config *c) {
    c->multi_latent_attention = 1;
    c->group_query_attention = 0;
    c->kv_lora_rank = 7;
    c->qk_head_dim = 4;
    c->qk_pos_emb_head_dim = 2;
    c->v_head_dim = 3;
}

// MLA with YaRN past its original context of 2 positions (the sequence has 5): the scaled
// frequencies, the cos/sin scale and the softmax correction.
static void mla_yarn(Config *c) {
    mla_full_rank_queries(c);
    c->qk_pos_emb_head_dim = 4;
    strcpy(c->rope_type, "yarn");
    c->rotary_scaling_factor = 4;
    c->original_max_position_embeddings = 2;
    c->beta_slow = 0.25;
    c->mscale = 0.9;
    c->mscale_all_dim = 0.7;
}

static void test_grad_mla_yarn(void) {
    Variant v = {"1", 0, 0, 0, 2, 4, 0, 0, 0.1, mla_yarn, 0, 0};
    check_variant(&v);
}

static void test_grad_deepseek_v3_mla(void) {
    Variant v = {"[0,1]", 0, 1, 0, 2, 4, 0, 1, 0.0, deepseek_v3, 0, 0};
    check_variant(&v);
}

static void test_grad_mla_full_rank_queries(void) {
    Variant v = {"1", 0, 0, 0, 2, 4, 0, 0, 0.1, mla_full_rank_queries, 0, 0};
    check_variant(&v);
}

static void test_grad_packed_documents(void) {
    Variant v = {"1", 1, 0, 0, 2, 4, 1, 0, 0.1, NULL, 0, 1};
    check_variant(&v);
}

static void test_grad_packed_documents_mla(void) {
    Variant v = {"[0,1]", 0, 1, 0, 2, 4, 0, 1, 0.0, deepseek_v3, 0, 1};
    check_variant(&v);
}

// Multi-token prediction: two depths, weighed as much as the main loss.
static void mtp_two_depths(Config *c) {
    c->mtp_num_layers = 2;
    c->mtp_loss_scaling_factor = 2.0;
}

static void deepseek_v3_mtp(Config *c) {
    deepseek_v3(c);
    c->mtp_num_layers = 1;
    c->mtp_loss_scaling_factor = 0.7;
}

// MoE depths (the last decoder layer's kind), untied head, masked tokens rolled along.
static void test_grad_mtp_moe_depths(void) {
    Variant v = {"[0,1]", 1, 1, 0, 2, 4, 1, 1, 0.1, mtp_two_depths, 0, 0};
    check_variant(&v);
}

// Dense depths with a tied embedding and head.
static void test_grad_mtp_dense_depths_tied(void) {
    Variant v = {"[1,0]", 1, 0, 0, 2, 4, 1, 0, 0.1, mtp_two_depths, 0, 0};
    check_variant(&v);
}

static void test_grad_mtp_deepseek_v3(void) {
    Variant v = {"[0,1]", 0, 1, 0, 2, 4, 0, 1, 0.0, deepseek_v3_mtp, 0, 0};
    check_variant(&v);
}

// Latent MoE: fc1 takes the routed experts' tokens from hidden 8 to 5, the experts are 5 wide,
// fc2 brings the combined rows back; a gated shared expert on the full width beside them,
// the router on ln2 with input jitter in training (fc1 reads ln2 without it).
static void latent_moe(Config *c) {
    c->moe_latent_size = 5;
    c->moe_shared_expert_intermediate_size = 4;
    c->moe_shared_expert_gate = 1;
    c->moe_input_jitter_eps = 0.1;
}

// Latent MoE with a latent width above the hidden size, capacity dropping, every layer MoE.
static void latent_moe_wide(Config *c) {
    c->moe_latent_size = 11;
    c->moe_expert_capacity_factor = 1.0;
}

// Both features: a latent MoE depth of multi-token prediction.
static void latent_moe_mtp(Config *c) {
    latent_moe(c);
    c->mtp_num_layers = 1;
    c->mtp_loss_scaling_factor = 1.5;
}

static void test_grad_latent_moe(void) {
    const Variant variants[] = {{"[0,1]", 1, 1, 0, 2, 4, 1, 1, 0.1, latent_moe, 1, 0},
                                {"1", 0, 0, 1, 2, 3, 0, 0, 0.2, latent_moe_wide, 0, 0},
                                {"[0,1]", 1, 0, 0, 2, 4, 1, 0, 0.1, latent_moe_mtp, 1, 0}};
    for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) check_variant(&variants[i]);
}

// --hidden-dropout (and, with attention_dropout, --attention-dropout) in training: for a fixed
// noise_seed the masks are fixed, so the objective is a smooth function of the parameters.
static void hidden_dropout(Config *c) { c->hidden_dropout = 0.3; }
static void hidden_dropout_shared_mtp(Config *c) {
    hidden_dropout(c);
    c->moe_shared_expert_intermediate_size = 4;
    c->mtp_num_layers = 1;
    c->mtp_loss_scaling_factor = 0.5;
}

static void attention_dropout(Config *c) { c->attention_dropout = 0.4; }
static void both_dropouts_mla(Config *c) {
    mla_full_rank_queries(c);
    hidden_dropout(c);
    attention_dropout(c);
}

static void test_grad_hidden_dropout(void) {
    const Variant variants[] = {{"1", 1, 1, 0, 2, 0, 1, 1, 0.0, hidden_dropout, 1, 0},
                                {"[0,1]", 1, 0, 0, 2, 4, 1, 1, 0.1, hidden_dropout_shared_mtp, 1, 0}};
    for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) check_variant(&variants[i]);
}

// GQA with packed documents; MLA (queries wider than values) with both dropouts.
static void test_grad_attention_dropout(void) {
    const Variant variants[] = {{"[0,1]", 1, 1, 0, 2, 4, 1, 1, 0.1, attention_dropout, 1, 1},
                                {"1", 0, 1, 0, 2, 4, 0, 1, 0.1, both_dropouts_mla, 1, 0}};
    for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) check_variant(&variants[i]);
}

static void test_grad_dense_qwen3(void) {
    Variant v = {"1", 1, 1, 0, 2, 0, 1, 1, 0.0, NULL, 0, 0};
    check_variant(&v);
}

int main(void) {
    RUN(test_grad_qwen3_mixed_dense_moe);
    RUN(test_grad_qwen3_pre_softmax_tied_top1);
    RUN(test_grad_mixtral_untied_no_aux);
    RUN(test_grad_mixtral_top3_of_5_masked);
    RUN(test_grad_dense_qwen3);
    RUN(test_grad_router_features);
    RUN(test_grad_jitter_padding_training);
    RUN(test_grad_olmoe_clip_qkv);
    RUN(test_grad_deepseek_v3_mla);
    RUN(test_grad_mla_full_rank_queries);
    RUN(test_grad_mla_yarn);
    RUN(test_grad_packed_documents);
    RUN(test_grad_packed_documents_mla);
    RUN(test_grad_mtp_moe_depths);
    RUN(test_grad_mtp_dense_depths_tied);
    RUN(test_grad_mtp_deepseek_v3);
    RUN(test_grad_latent_moe);
    RUN(test_grad_hidden_dropout);
    RUN(test_grad_attention_dropout);
    TESTS_DONE();
}

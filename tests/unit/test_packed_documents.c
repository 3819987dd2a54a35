// test_packed_documents.c — with --reset-position-ids and --reset-attention-mask a
// document packed after others in a row is computed exactly as if it stood alone at the
// start of a row: same logits (every attention kind), as Megatron-Core's document masks
// intend. Without them the packed document sees its predecessors and differs.
#include <string.h>

#include "core/config.h"
#include "data/dataset.h"
#include "model/model.h"
#include "testlib.h"

enum { FIRST = 6, SECOND = 9, T = FIRST + SECOND };

typedef void (*Variant)(Config *c);

static double max_logit_diff(Variant variant, int reset) {
    Config c;
    config_defaults(&c);
    c.num_layers = 2;
    c.hidden_size = 32;
    c.num_attention_heads = 4;
    c.group_query_attention = 1;
    c.num_query_groups = 2;
    c.seq_length = T;
    c.num_experts = 4;
    c.moe_ffn_hidden_size = 24;
    c.init_method_std = 0.2;
    if (variant) variant(&c);
    config_validate(&c);
    Model m;
    model_build(&m, &c);
    model_init_weights(&m, 3);
    int32_t packed[T], positions[T], key_start[T];
    for (int t = 0; t < T; t++) packed[t] = (t * 53 + 7) % 250;
    packed[FIRST - 1] = BYTE_EOD_TOKEN;  // the first document ends the first part
    document_layout(packed, T, BYTE_EOD_TOKEN, key_start, positions);
    ModelActs whole, alone;
    acts_alloc(&whole, &m, 1, T);
    acts_alloc(&alone, &m, 1, SECOND);
    Batch b_packed = {.B = 1, .T = T, .tokens = packed, .positions = reset ? positions : NULL,
                      .key_start = reset ? key_start : NULL};
    Batch b_alone = {.B = 1, .T = SECOND, .tokens = packed + FIRST};
    model_forward(&m, &whole, &b_packed, NULL, 0);
    model_forward(&m, &alone, &b_alone, NULL, 0);
    int V = c.padded_vocab_size;
    double worst = 0;
    for (int t = 0; t < SECOND; t++)
        for (int v = 0; v < V; v++)
            worst = fmax(worst, fabs(whole.logits[(size_t)(FIRST + t) * V + v] - alone.logits[(size_t)t * V + v]));
    acts_free(&whole);
    acts_free(&alone);
    model_free(&m);
    return worst;
}

static void olmoe(Config *c) {
    c->qk_layernorm = 1;
    strcpy(c->qk_layernorm_scope, "projection");
    c->clip_qkv = 0.5;
}

static void mla(Config *c) {
    c->multi_latent_attention = 1;
    c->group_query_attention = 0;
    c->q_lora_rank = 8;
    c->kv_lora_rank = 12;
    c->qk_head_dim = 6;
    c->qk_pos_emb_head_dim = 4;
    c->v_head_dim = 10;
    c->rotary_interleaved = 1;
}

static void check(const char *what, Variant variant) {
    double with = max_logit_diff(variant, 1), without = max_logit_diff(variant, 0);
    CHECK(with < 2e-5, "%s: the packed document's logits differ from the document alone by %g", what, with);
    CHECK(without > 1e-3, "%s: without the resets the packed document should see its predecessor (diff %g)", what,
          without);
}

static void test_packed_gqa(void) { check("GQA", NULL); }
static void test_packed_olmoe(void) { check("OLMoE attention", olmoe); }
static void test_packed_mla(void) { check("Multi-Latent Attention", mla); }

int main(void) {
    RUN(test_packed_gqa);
    RUN(test_packed_olmoe);
    RUN(test_packed_mla);
    TESTS_DONE();
}

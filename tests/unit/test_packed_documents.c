// test_packed_documents.c — with --reset-position-ids and --reset-attention-mask a
// document packed after others in a row is computed exactly as if it stood alone at the
// start of a row: same logits (every attention kind), as Megatron-Core's document masks
// intend. Without them the packed document sees its predecessors and differs.
#include "core/config.h"
#include "data/dataset.h"
#include "model/model.h"
#include "testlib.h"
#include "tiny_models.h"

enum { FIRST = 6, SECOND = 9, T = FIRST + SECOND };

static double max_logit_diff(ConfigVariant variant, int reset) {
    Config c;
    tiny_moe_config(&c, T, 0, 1, variant);
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

static void check(const char *what, ConfigVariant variant) {
    double with = max_logit_diff(variant, 1), without = max_logit_diff(variant, 0);
    CHECK(with < 2e-5, "%s: the packed document's logits differ from the document alone by %g", what, with);
    CHECK(without > 1e-3, "%s: without the resets the packed document should see its predecessor (diff %g)", what,
          without);
}

static void test_packed_gqa(void) { check("GQA", NULL); }
static void test_packed_olmoe(void) { check("OLMoE attention", variant_olmoe); }
static void test_packed_mla(void) { check("Multi-Latent Attention", variant_mla_q_lora); }

int main(void) {
    RUN(test_packed_gqa);
    RUN(test_packed_olmoe);
    RUN(test_packed_mla);
    TESTS_DONE();
}

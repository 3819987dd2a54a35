// test_kv_cache.c — generation with a KV cache computes the same logits as a full
// forward over the whole sequence: a prefill of the first tokens, then one token at a
// time against the cache (every attention variant: GQA, QK-norm per head or per
// projection, clip_qkv, Multi-Latent Attention with and without the query low rank).
#include "core/config.h"
#include "model/model.h"
#include "testlib.h"
#include "tiny_models.h"

static void check_cache_matches_full_forward(int qk_layernorm, int group_query, ConfigVariant variant) {
    Config c;
    tiny_moe_config(&c, 12, qk_layernorm, group_query, variant);
    Model m;
    model_build(&m, &c);
    model_init_weights(&m, 42);
    enum { T = 12, PREFILL = 5 };
    int32_t tokens[T];
    for (int t = 0; t < T; t++) tokens[t] = (t * 37 + 11) % 257;
    int V = c.padded_vocab_size;

    ModelActs full;
    acts_alloc(&full, &m, 1, T);
    Batch whole = {.B = 1, .T = T, .tokens = tokens};
    model_forward(&m, &full, &whole, NULL, 0);

    KvCache *kv = kv_caches_new(&m);
    ModelActs prefill, step;
    acts_alloc(&prefill, &m, 1, PREFILL);
    acts_alloc(&step, &m, 1, 1);
    Batch first = {.B = 1, .T = PREFILL, .tokens = tokens};
    model_forward(&m, &prefill, &first, kv, 0);
    double worst = 0;
    for (int t = 0; t < PREFILL; t++)
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs(prefill.logits[t * V + v] - full.logits[t * V + v]));
    for (int t = PREFILL; t < T; t++) {
        Batch one = {.B = 1, .T = 1, .tokens = tokens + t};
        model_forward(&m, &step, &one, kv, t);
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs(step.logits[v] - full.logits[t * V + v]));
    }
    CHECK(worst < 2e-5, "cached logits differ from the full forward by %g", worst);
    kv_caches_free(kv, &m);
    acts_free(&full);
    acts_free(&prefill);
    acts_free(&step);
    model_free(&m);
}

static void test_kv_cache_mixtral_mha(void) { check_cache_matches_full_forward(0, 0, NULL); }
static void test_kv_cache_qwen3_gqa(void) { check_cache_matches_full_forward(1, 1, NULL); }
static void test_kv_cache_olmoe_clip(void) { check_cache_matches_full_forward(1, 1, variant_olmoe); }
static void test_kv_cache_mla(void) { check_cache_matches_full_forward(0, 0, variant_mla); }
static void test_kv_cache_mla_q_lora(void) { check_cache_matches_full_forward(0, 0, variant_mla_q_lora); }

int main(void) {
    RUN(test_kv_cache_mixtral_mha);
    RUN(test_kv_cache_qwen3_gqa);
    RUN(test_kv_cache_olmoe_clip);
    RUN(test_kv_cache_mla);
    RUN(test_kv_cache_mla_q_lora);
    TESTS_DONE();
}

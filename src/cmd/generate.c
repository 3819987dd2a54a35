// generate.c — `moetron generate`: continue a prompt with a KV cache.
// The prompt is encoded as bytes and run through the model once (prefill); each new
// token is then a single-position forward against the cached keys and values.
// Sampling: temperature (0 = greedy), optional top-k, over the real vocabulary only
// (never the padding rows); stops at end-of-document.
#include <math.h>
#include <string.h>

#include "cmd/commands.h"
#include "cmd/load_model.h"
#include "core/rng.h"
#include "data/dataset.h"

static int sample_token(const real *logits, int vocab, double temperature, int top_k, Rng *rng) {
    int best = 0;
    for (int v = 1; v < vocab; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0) return best;
    // threshold = k-th largest logit when top_k is set
    double threshold = -INFINITY;
    if (top_k > 0 && top_k < vocab) {
        double *sorted = mt_malloc(vocab * sizeof(double));
        for (int v = 0; v < vocab; v++) sorted[v] = logits[v];
        for (int i = 0; i < top_k; i++)  // partial selection sort: top_k is small
            for (int j = i + 1; j < vocab; j++)
                if (sorted[j] > sorted[i]) {
                    double x = sorted[i];
                    sorted[i] = sorted[j];
                    sorted[j] = x;
                }
        threshold = sorted[top_k - 1];
        free(sorted);
    }
    double total = 0;
    for (int v = 0; v < vocab; v++)
        if (logits[v] >= threshold) total += exp((logits[v] - logits[best]) / temperature);
    double r = rng_uniform(rng) * total;
    for (int v = 0; v < vocab; v++) {
        if (logits[v] < threshold) continue;
        r -= exp((logits[v] - logits[best]) / temperature);
        if (r <= 0) return v;
    }
    return best;
}

int generate_main(Config *c) {
    Model m;
    load_model_for_inference(&m, c);
    int prompt_len = (int)strlen(c->prompt);
    if (prompt_len == 0) mt_die("--prompt is empty; give some text to continue");
    if (prompt_len + c->max_new_tokens > c->max_positions)
        mt_die("--prompt (%d bytes) plus --max-new-tokens %d exceed the model's %d positions", prompt_len,
               c->max_new_tokens, c->max_positions);
    int32_t *tokens = mt_malloc((size_t)(prompt_len + c->max_new_tokens + 1) * sizeof(int32_t));
    for (int i = 0; i < prompt_len; i++) tokens[i] = (unsigned char)c->prompt[i];
    KvCache *kv = kv_caches_new(&m);
    ModelActs prefill, step;
    acts_alloc(&prefill, &m, 1, prompt_len);
    acts_alloc(&step, &m, 1, 1);
    Rng rng;
    rng_seed_stream(&rng, (uint64_t)c->seed, 0x6E4E);
    Batch batch = {.B = 1, .T = prompt_len, .tokens = tokens};
    model_forward(&m, &prefill, &batch, kv, 0);
    const real *last_logits = prefill.logits + (size_t)(prompt_len - 1) * c->padded_vocab_size;
    int vocab = MT_MIN(c->vocab_size, c->padded_vocab_size);
    fwrite(c->prompt, 1, prompt_len, stdout);
    int n = prompt_len;
    for (int i = 0; i < c->max_new_tokens; i++) {
        int next = sample_token(last_logits, vocab, c->temperature, c->top_k, &rng);
        if (next == BYTE_EOD_TOKEN) break;
        if (next < 256) fputc(next, stdout);
        fflush(stdout);
        tokens[n] = next;
        Batch one = {.B = 1, .T = 1, .tokens = tokens + n};
        model_forward(&m, &step, &one, kv, n);
        n++;
        last_logits = step.logits;
    }
    fputc('\n', stdout);
    acts_free(&prefill);
    acts_free(&step);
    kv_caches_free(kv, &m);
    free(tokens);
    model_free(&m);
    return 0;
}

// generate.c — `moetron generate`: continue a prompt with a KV cache.
// The prompt is encoded with the tokenizer (--tokenizer-model, by default the tokenizer.json
// of the --load directory) or, without one, as bytes, and run through the model once
// (prefill); each new token is then a single-position forward against the cached keys and
// values. Sampling: temperature (0 = greedy), then optional top-k, then optional top-p
// (nucleus), over the real vocabulary only (never the padding rows); stops at
// end-of-document (the byte model's BYTE_EOD_TOKEN, or the tokenizer's end-of-text tokens)
// or after --max-new-tokens, and says which on stderr. stdout is the text only, always
// valid UTF-8 (tokenizer/utf8_stream.h).
#include <math.h>
#include <string.h>

#include "cmd/commands.h"
#include "cmd/load_model.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8_stream.h"

// Sampling weights of the tokens at or above the top-k threshold (0 for the others):
// exp((logit - max) / temperature), unnormalised.
static void tempered_weights(const real *logits, int vocab, int best, double temperature, int top_k, double *w) {
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
    for (int v = 0; v < vocab; v++) w[v] = logits[v] >= threshold ? exp((logits[v] - logits[best]) / temperature) : 0;
}

static const double *g_weights;  // what by_weight_descending compares (qsort has no context)

// More probable first; equal weights in token order.
static int by_weight_descending(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (g_weights[x] != g_weights[y]) return g_weights[x] > g_weights[y] ? -1 : 1;
    return x - y;
}

// Nucleus filtering (transformers' TopPLogitsWarper): keeps, from the most probable down,
// every token whose more probable tokens hold less than top_p of the probability (so at
// least one); the others get weight 0.
static void keep_top_p(double *w, int vocab, double top_p) {
    int *order = mt_malloc(vocab * sizeof(int));
    double total = 0;
    for (int v = 0; v < vocab; v++) order[v] = v, total += w[v];
    g_weights = w;
    qsort(order, vocab, sizeof(int), by_weight_descending);
    double mass_before = 0;
    for (int i = 0; i < vocab; i++) {
        double p = w[order[i]];
        if (i > 0 && mass_before >= top_p * total) w[order[i]] = 0;
        mass_before += p;
    }
    free(order);
}

static int sample_token(const real *logits, int vocab, const Config *c, double *w, Rng *rng) {
    int best = 0;
    for (int v = 1; v < vocab; v++)
        if (logits[v] > logits[best]) best = v;
    if (c->temperature <= 0) return best;
    tempered_weights(logits, vocab, best, c->temperature, c->top_k, w);
    if (c->top_p < 1) keep_top_p(w, vocab, c->top_p);
    double total = 0;
    for (int v = 0; v < vocab; v++) total += w[v];
    double r = rng_uniform(rng) * total;
    for (int v = 0; v < vocab; v++) {
        if (w[v] == 0) continue;
        r -= w[v];
        if (r <= 0) return v;
    }
    return best;
}

// The ids that end generation (the tokenizer's end-of-text tokens); returns their count.
static int stop_ids(const Tokenizer *tok, int32_t *ids) {
    if (tok) return tokenizer_end_of_text_ids(tok, ids);
    ids[0] = BYTE_EOD_TOKEN;
    return 1;
}

static int is_stop(int token, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        if (ids[i] == token) return 1;
    return 0;
}

// Writes a generated token: its bytes, or the byte itself for the byte model (a character
// split across tokens comes out once its last byte is written).
static void print_token(Utf8Stream *out, const Tokenizer *tok, int token) {
    if (!tok) {
        unsigned char byte = (unsigned char)token;
        if (token < 256) utf8_stream_write(out, &byte, 1);
        return;
    }
    size_t len;
    const char *bytes = tokenizer_token_bytes(tok, token, &len);
    utf8_stream_write(out, bytes, len);
}

// The prompt's token ids (malloc'ed, room for max_new more); sets *len.
static int32_t *encode_prompt(const Config *c, const Tokenizer *tok, int *len) {
    size_t bytes = strlen(c->prompt);
    if (bytes == 0) mt_die("--prompt is empty; give some text to continue");
    int32_t *ids = NULL;
    int n = (int)bytes;
    if (tok) {
        n = tokenizer_encode(tok, c->prompt, bytes, &ids);
        if (n == 0) mt_die("--prompt encodes to no tokens with this tokenizer");
    } else {
        ids = mt_malloc(bytes * sizeof(int32_t));
        for (int i = 0; i < n; i++) ids[i] = (unsigned char)c->prompt[i];
    }
    if ((int64_t)n + c->max_new_tokens > c->max_positions) {
        free(ids);
        mt_die("--prompt (%d %s) plus --max-new-tokens %d exceed the model's %d positions", n, tok ? "tokens" : "bytes",
               c->max_new_tokens, c->max_positions);
    }
    ids = mt_realloc(ids, (size_t)(n + c->max_new_tokens + 1) * sizeof(int32_t));
    *len = n;
    return ids;
}

int generate_main(Config *c) {
    Model m;
    load_model_for_inference(&m, c);
    // --tokenizer-model, which --load sets to the checkpoint's tokenizer.json unless given
    Tokenizer *tok = c->tokenizer_model[0] ? tokenizer_load(c->tokenizer_model) : NULL;
    if (tok && tokenizer_vocab_size(tok) > c->vocab_size)
        mt_die("tokenizer %s has %d tokens but the model's vocabulary (--vocab-size) is %d; use the tokenizer the "
               "model was trained with", c->tokenizer_model, tokenizer_vocab_size(tok), c->vocab_size);
    int32_t stop[TOKENIZER_MAX_END_IDS];
    int n_stop = stop_ids(tok, stop);
    int prompt_len;
    int32_t *tokens = encode_prompt(c, tok, &prompt_len);
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
    Utf8Stream out;
    utf8_stream_init(&out, stdout);
    utf8_stream_write(&out, c->prompt, strlen(c->prompt));
    double *weights = mt_malloc((size_t)vocab * sizeof(double));
    int n = prompt_len, new_tokens = 0, ended = 0;
    for (; new_tokens < c->max_new_tokens; new_tokens++) {
        int next = sample_token(last_logits, vocab, c, weights, &rng);
        if ((ended = is_stop(next, stop, n_stop))) break;
        print_token(&out, tok, next);
        fflush(stdout);
        tokens[n] = next;
        Batch one = {.B = 1, .T = 1, .tokens = tokens + n};
        model_forward(&m, &step, &one, kv, n);
        n++;
        last_logits = step.logits;
    }
    utf8_stream_finish(&out);
    fputc('\n', stdout);
    fflush(stdout);
    fprintf(stderr, "generate: stopped after %d new tokens: %s\n", new_tokens,
            ended ? "end-of-document token" : "--max-new-tokens reached");
    free(weights);
    acts_free(&prefill);
    acts_free(&step);
    kv_caches_free(kv, &m);
    free(tokens);
    tokenizer_free(tok);
    model_free(&m);
    return 0;
}

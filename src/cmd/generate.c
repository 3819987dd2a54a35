// generate.c — `moetron generate`: continue a prompt with a KV cache.
// The prompt is encoded with the tokenizer (--tokenizer-model, by default the tokenizer.json
// of the --load directory) or, without one, as bytes, and run through the model once
// (prefill); each new token is then a single-position forward against the cached keys and
// values. Sampling: temperature (0 = greedy), then optional top-k, then optional top-p
// (nucleus), over the real vocabulary only (never the padding rows); stops at
// end-of-document (the byte model's BYTE_EOD_TOKEN, or the tokenizer's end-of-text tokens)
// or after --max-new-tokens, and says which on stderr. stdout is the text only, always
// valid UTF-8 (tokenizer/utf8_stream.h).
#include <string.h>

#include "cmd/commands.h"
#include "cmd/load_model.h"
#include "core/device.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "ops/ops_state.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_type.h"
#include "tokenizer/utf8_stream.h"

// The next token from one position's logits (tensor memory): the sampling op on the device
// (ops_state.h), then one download of the token. The uniform draw is taken only when sampling
// (temperature > 0), as it always was.
typedef struct {
    int32_t *token;  // (1) tensor memory
    double *work;    // (2·vocab) the op's scratch
    int32_t *order;  // (vocab)
    int vocab;
} Sampler;

static void sampler_init(Sampler *s, int vocab) {
    s->vocab = vocab;
    s->token = device_calloc(1, sizeof(int32_t));
    s->work = device_calloc(2 * (size_t)vocab, sizeof(double));
    s->order = device_calloc((size_t)vocab, sizeof(int32_t));
}

static void sampler_free(Sampler *s) {
    device_free(s->token);
    device_free(s->work);
    device_free(s->order);
}

static int sample_token(Sampler *s, const real *logits, const Config *c, Rng *rng) {
    SampleParams p = {.temperature = c->temperature, .top_k = c->top_k, .top_p = c->top_p};
    if (c->temperature > 0) p.u = rng_uniform(rng);
    sample_next_token(s->token, logits, s->vocab, &p, s->work, s->order);
    int32_t next;
    device_download(&next, s->token, sizeof(next));
    return next;
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
    // --tokenizer-type / --tokenizer-model; --load sets the model to the checkpoint's tokenizer unless given
    Tokenizer *tok = config_has_tokenizer(c) ? tokenizer_open_config(c, NULL) : NULL;
    char source[MT_PATH_MAX + 32];
    if (tok && tokenizer_vocab_size(tok) > c->vocab_size)
        mt_die("tokenizer %s has %d tokens but the model's vocabulary (--vocab-size) is %d; use the tokenizer the "
               "model was trained with", tokenizer_source(c, source, sizeof source), tokenizer_vocab_size(tok),
               c->vocab_size);
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
    Sampler sampler;
    sampler_init(&sampler, vocab);
    int n = prompt_len, new_tokens = 0, ended = 0;
    for (; new_tokens < c->max_new_tokens; new_tokens++) {
        int next = sample_token(&sampler, last_logits, c, &rng);
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
    sampler_free(&sampler);
    acts_free(&prefill);
    acts_free(&step);
    kv_caches_free(kv, &m);
    free(tokens);
    tokenizer_free(tok);
    model_free(&m);
    return 0;
}

// data.c — `moetron data`: build the Megatron-Core sample order for --data-path (or
// --train-data-path) and dump the first --num-samples training samples to safetensors as
// tensor "tokens", I32 [K, seq_length + 1]: the token sequences Megatron-Core's
// GPTDataset / BlendedDataset yield for the same data, split, seq_length and seed
// (tokens are sample[:-1], labels sample[1:]). docs/data.md describes the order. Token ids are
// checked against --vocab-size (or --tokenizer-model) as `moetron train` checks them.
#include <stdio.h>
#include <string.h>

#include "cmd/commands.h"
#include "core/common.h"
#include "core/safetensors.h"
#include "core/timer.h"
#include "data/megatron_data.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_type.h"

// The vocabulary the token ids are checked against: --vocab-size when given, else the size of
// --tokenizer-model; without either the ids are not checked (there is no model to fit).
static TokenVocab data_vocab(const Config *c, char *source, size_t n) {
    if (config_flag_given(c, "vocab-size")) {
        snprintf(source, n, "--vocab-size %d", c->vocab_size);
        return (TokenVocab){c->vocab_size, source};
    }
    if (!config_has_tokenizer(c)) return (TokenVocab){0, ""};
    Tokenizer *tok = tokenizer_open_config(c, NULL);
    int size = tokenizer_vocab_size(tok);
    tokenizer_free(tok);
    char named[MT_PATH_MAX + 32];
    snprintf(source, n, "%s (%d tokens)", tokenizer_source(c, named, sizeof named), size);
    return (TokenVocab){size, source};
}

int data_main(Config *c) {
    if (!c->data_path[0] && !c->train_data_path[0])
        mt_die("moetron data needs --data-path PREFIX (or --train-data-path PREFIX): Megatron .bin/.idx datasets");
    if (c->num_samples <= 0) mt_die("moetron data needs --num-samples K > 0 (the training samples to dump)");
    if (!c->dump[0]) mt_die("moetron data needs --dump OUT.safetensors");
    double start = now_seconds();
    int64_t asked[3] = {c->num_samples, 0, 0};
    char source[MT_PATH_MAX + 64];
    TokenVocab vocab = data_vocab(c, source, sizeof source);
    MegatronData *d = megatron_data_open(c, asked, &vocab);
    int64_t K = c->num_samples, width = (int64_t)c->seq_length + 1;
    if (megatron_data_size(d, DATA_TRAIN) < K) mt_die("the training split holds no samples; check --split");
    int32_t *tokens = mt_malloc(mt_size_product(K * width, sizeof *tokens));  // K · width: bounded by config_validate
    for (int64_t i = 0; i < K; i++) megatron_data_sample(d, DATA_TRAIN, i, tokens + i * width);

    StWriter w;
    stw_init(&w);
    stw_add(&w, "tokens", ST_I32, 2, (int64_t[]){K, width}, tokens);
    char value[32], err[512];
    snprintf(value, sizeof value, "%d", c->seq_length);
    stw_meta(&w, "seq_length", value);
    snprintf(value, sizeof value, "%d", c->seed);
    stw_meta(&w, "seed", value);
    if (stw_finish(&w, c->dump, err, sizeof err)) mt_die("--dump %s: %s", c->dump, err);
    printf("moetron data: wrote %lld samples of %lld tokens (tokens I32 [%lld, %lld]) to %s in %.2fs\n", (long long)K,
           (long long)width, (long long)K, (long long)width, c->dump, now_seconds() - start);
    free(tokens);
    megatron_data_free(d);
    return 0;
}

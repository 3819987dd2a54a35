// fuzz_sentencepiece_model.c — tokenizer_parse_sentencepiece (src/tokenizer/sp_model.c, the
// protobuf reader; tokenizer_sentencepiece.c; sp_normalizer.c with its character-map trie;
// unigram.c) on a SentencePiece .model of arbitrary bytes; a model that loads then encodes a
// fixed text and the input itself, every id within the vocabulary, and decodes the ids.
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const uint8_t *data;
    size_t size;
} Input;

static const char sample[] = "Hello  world, it's 2024! <sep> caf\xc3\xa9 e\xcc\x81 \xe6\x97\xa5\xe6\x9c\xac "
                             "\xf0\x9f\x98\x80\r\n\n  x\xff\xfe \xef\xbc\xa6\xef\xbd\x95";

static void body(void *ctx) {
    const Input *in = ctx;
    Tokenizer *t = tokenizer_parse_sentencepiece(in->data, in->size, "fuzz.model");
    fuzz_tokenizer_round_trip(t, sample, sizeof sample - 1);
    fuzz_tokenizer_round_trip(t, (const char *)in->data, in->size);
    int32_t end_ids[TOKENIZER_MAX_END_IDS];
    int n_end = tokenizer_end_of_text_ids(t, end_ids);
    for (int i = 0; i < n_end; i++)
        if (end_ids[i] < 0 || end_ids[i] >= tokenizer_vocab_size(t)) fuzz_fail("end-of-text id %d", end_ids[i]);
    tokenizer_bos_id(t);
    tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in = {data, size};
    fuzz_run(body, &in);
    return 0;
}

// fuzz_tokenizer_json.c — tokenizer_load (src/tokenizer/tokenizer_load.c) on a tokenizer.json
// of arbitrary bytes; a tokenizer that loads then encodes a fixed text and the input itself,
// decodes the ids, and answers every lookup.
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const uint8_t *data;
    size_t size;
} Input;

static const char sample[] = "Hello world, it's 2024! <|endoftext|> <s> caf\xc3\xa9 e\xcc\x81 \xe6\x97\xa5\xe6\x9c\xac "
                             "\xf0\x9f\x98\x80\r\n\n  x\xff\xfe";

static void body(void *ctx) {
    const Input *in = ctx;
    const char *path = fuzz_write("tokenizer.json", in->data, in->size);
    Tokenizer *t = tokenizer_load(path);
    fuzz_tokenizer_round_trip(t, sample, sizeof sample - 1);
    fuzz_tokenizer_round_trip(t, (const char *)in->data, in->size);
    int vocab = tokenizer_vocab_size(t);
    if (vocab <= 0) fuzz_fail("vocabulary size %d", vocab);
    for (int32_t id = -1; id <= vocab && id < 4096; id++) {
        size_t len;
        tokenizer_token_bytes(t, id, &len);
        tokenizer_is_special(t, id);
    }
    size_t len;
    tokenizer_token_bytes(t, vocab - 1, &len);
    int32_t end_ids[TOKENIZER_MAX_END_IDS];
    int n_end = tokenizer_end_of_text_ids(t, end_ids);
    for (int i = 0; i < n_end; i++)
        if (end_ids[i] < 0 || end_ids[i] >= vocab) fuzz_fail("end-of-text id %d out of range", end_ids[i]);
    tokenizer_end_of_text_id(t);
    tokenizer_token_id(t, "a");
    tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in = {data, size};
    fuzz_run(body, &in);
    return 0;
}

// tokenizer_null.c — Megatron's NullTokenizer: the text is already token ids, written in
// decimal and separated by whitespace; --vocab-size N ids, the end of document N - 1.
// Decoding writes each id as " <id>" and drops the first space, so that decode(encode(x))
// gives the ids back separated by single spaces.
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "tokenizer/tokenizer_internal.h"

#define NULL_MAX_VOCAB (1 << 24)

Tokenizer *tokenizer_null(int vocab_size) {
    if (vocab_size < 1 || vocab_size > NULL_MAX_VOCAB)
        mt_die("NullTokenizer needs --vocab-size in 1..%d (got %d)", NULL_MAX_VOCAB, vocab_size);
    Tokenizer *t = tokenizer_new(TOKENIZER_NULL);
    t->vocab_size = vocab_size;
    t->eos_id = vocab_size - 1;
    t->decode = DECODE_NULL;
    t->decode_strip_space = 1;
    tokenizer_index_added(t);
    tokenizer_build_decode_table(t);
    return t;
}

static int is_separator(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

void null_tokenizer_encode(const Tokenizer *t, const char *text, size_t len, IdVec *out) {
    size_t pos = 0;
    for (;;) {
        while (pos < len && is_separator(text[pos])) pos++;
        if (pos == len) return;
        size_t start = pos;
        int64_t id = 0;
        while (pos < len && text[pos] >= '0' && text[pos] <= '9' && id < t->vocab_size) id = 10 * id + (text[pos++] - '0');
        if (pos == start || (pos < len && !is_separator(text[pos])) || id >= t->vocab_size) {
            size_t end = start;
            while (end < len && !is_separator(text[end]) && end - start < 24) end++;
            mt_die("NullTokenizer: \"%.*s\" is not a token id below --vocab-size %d (the text must be ids in decimal "
                   "separated by spaces)", (int)(end - start), text + start, t->vocab_size);
        }
        idvec_push(out, (int32_t)id);
    }
}

// prepare.h — the input reading of `moetron prepare` (prepare.c), shared with training on
// a text file (--data-path FILE with a tokenizer).
#pragma once
#include <stdint.h>

#include "tokenizer/tokenizer.h"

// Tokenizes the file at path as `moetron prepare --append-eod` reads it — .jsonl / .json:
// one JSON object per line, the value of json_key (one key); anything else: plain text,
// one document per paragraph — into one stream of the documents in order, each followed
// by eod (nothing between them when eod < 0). Bad input is fatal with one line naming
// flag and path. Returns the token count and sets *tokens (malloc'ed; NULL when empty).
int64_t prepare_tokenize_stream(const char *path, const char *flag, const char *json_key, const Tokenizer *tok,
                                int32_t eod, int workers, int32_t **tokens);

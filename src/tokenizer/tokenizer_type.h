// tokenizer_type.h — Megatron-LM's --tokenizer-type: which tokenizer a run's flags name and
// how it is opened, in one place for train, prepare, data and generate.
//   (none)                      --tokenizer-model tokenizer.json (moetron's behaviour before the flag)
//   HuggingFaceTokenizer        --tokenizer-model DIR (its tokenizer.json) or tokenizer.json
//   GPT2BPETokenizer            --vocab-file vocab.json --merge-file merges.txt
//   SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer
//                               --tokenizer-model x.model (or DIR with tokenizer.model)
//   NullTokenizer               --vocab-size N
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "tokenizer/tokenizer.h"

typedef enum {
    TOKENIZER_TYPE_DEFAULT,
    TOKENIZER_TYPE_HUGGINGFACE,
    TOKENIZER_TYPE_GPT2BPE,
    TOKENIZER_TYPE_SENTENCEPIECE,
    TOKENIZER_TYPE_NULL,
} TokenizerType;

// The type --tokenizer-type names; an unknown name is fatal with one line listing the
// supported ones.
TokenizerType tokenizer_type_of(const Config *c);
// Whether the flags name a tokenizer (else the run reads bytes).
int config_has_tokenizer(const Config *c);

// What a checkpoint keeps of the tokenizer: the file's bytes under its name in the
// checkpoint directory (NULL bytes: nothing, NullTokenizer).
typedef struct {
    uint8_t *bytes;
    size_t len;
    const char *name;   // "tokenizer.json" or "tokenizer.model"
    char path[MT_PATH_MAX];  // the file read (for messages and the companion files beside it)
} TokenizerFile;

// Opens the tokenizer the flags name (fatal with one line naming the flag and the fix:
// missing flags or files, a directory without the file, a malformed file). file, when
// not NULL, receives what a checkpoint keeps (free file->bytes).
Tokenizer *tokenizer_open_config(const Config *c, TokenizerFile *file);
// A short description for messages: "--tokenizer-model PATH", "--vocab-file PATH", ...
const char *tokenizer_source(const Config *c, char *buf, size_t cap);

// run_tokenizer.h — the tokenizer of a training run, read once at start-up from the flags
// that name it (tokenizer_type.h; by default the tokenizer.json of --load): it tokenizes --data-path
// text, every checkpoint carries the bytes read here (never the path again: --load may
// point into an iteration directory that --keep-checkpoints prunes), and config.json /
// generation_config.json name its end-of-text and beginning-of-text ids.
#pragma once
#include "core/config.h"
#include "tokenizer/tokenizer.h"

// The Hugging Face files that go with a tokenizer.json, carried when they are beside it.
enum { COMPANION_TOKENIZER_CONFIG, COMPANION_SPECIAL_TOKENS_MAP, COMPANION_GENERATION_CONFIG, TOKENIZER_COMPANION_COUNT };
extern const char *const tokenizer_companion_files[TOKENIZER_COMPANION_COUNT];

typedef struct {
    uint8_t *bytes;  // NULL: the file is absent
    size_t len;
} FileBytes;

typedef struct RunTokenizer {
    char path[MT_PATH_MAX];  // the file that was read (for messages)
    Tokenizer *tok;
    FileBytes json;          // the tokenizer file as read (tokenizer.json or tokenizer.model); NULL: none
    const char *file_name;   // its name in a checkpoint directory
    FileBytes companions[TOKENIZER_COMPANION_COUNT];  // as tokenizer_companion_files
    int32_t end_ids[TOKENIZER_MAX_END_IDS];  // the end-of-text tokens: generation stops at any
    int n_end_ids;
    int32_t eos_id;          // the first of them; -1: none
    int32_t bos_id;          // the post-processor's leading token, else eos_id
} RunTokenizer;

// Reads and validates the tokenizer the flags name and the companion files beside it (fatal
// with one line naming the flag and the fix: missing, unreadable, a directory, not a
// tokenizer.json), and sets c->run_tokenizer. In a run without --load and without
// --vocab-size, --vocab-size becomes the tokenizer's vocabulary (padded to a multiple of
// --make-vocab-size-divisible-by by config_validate, as Megatron-LM does). Returns NULL,
// changing nothing, when the run has no tokenizer (byte-level).
RunTokenizer *run_tokenizer_open(Config *c);
void run_tokenizer_free(RunTokenizer *rt);  // NULL is fine

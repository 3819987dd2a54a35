// bpe_train.h — training a byte-level BPE vocabulary (as `tokenizers`' BpeTrainer with the
// ByteLevel pre-tokenizer does) and saving it as a Hugging Face tokenizer.json.
//
//   BpeWordCounts wc; bpe_counts_init(&wc);
//   bpe_counts_add_text(&wc, text, len);          // for every document (streamed)
//   BpeVocab v; bpe_train(&wc, 599, &v);          // 256 bytes + up to 343 merged tokens
//   bpe_save_tokenizer_json(&v, "<|endoftext|>", "tok.json", err, sizeof err);
//
// The rule (documented in docs/data.md): the text is pre-tokenised with the GPT-2 pattern
// (ByteLevel(use_regex=true), no prefix space) and each distinct piece ("word") counted.
// The vocabulary starts as the 256 one-byte tokens, ids in the order of their byte-level
// characters' code points ('!' = 0 ... '~' = 93, then U+00A1.., then U+0100 = byte 0x00
// ...). Each step merges the adjacent pair (left, right) with the largest count summed over
// all words (count of the word × occurrences in it, counted left to right without
// overlap); ties go to the pair with the smaller left id, then the smaller right id. The
// merged token gets the next id, unless its bytes are already a token (then that id is
// reused and the vocabulary does not grow). Training stops when the vocabulary has the
// target size or no pair is left. This is the rule of `tokenizers`' BpeTrainer (ByteLevel,
// the whole byte alphabet, no min_frequency): both give the same merges
// (tests/conformance/prepare_conformance.py).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/strmap.h"

// Distinct pre-tokenised pieces (raw bytes) and how often each occurred.
typedef struct {
    StrMap words;       // piece -> index into counts
    int64_t *counts;
    size_t cap;
} BpeWordCounts;

void bpe_counts_init(BpeWordCounts *c);
void bpe_counts_free(BpeWordCounts *c);
// Pre-tokenises text[0..len) with the GPT-2 pattern and counts each piece.
void bpe_counts_add_text(BpeWordCounts *c, const char *text, size_t len);
// Adds every count of from into into.
void bpe_counts_merge(BpeWordCounts *into, const BpeWordCounts *from);
size_t bpe_counts_distinct(const BpeWordCounts *c);

// A trained vocabulary: token i is bytes[offset[i] .. offset[i + 1]) (raw bytes, not the
// byte-level alphabet); merges[k] = {left id, right id} of rank k.
typedef struct {
    int n_tokens;
    char *bytes;
    size_t *offset;      // [n_tokens + 1]
    int n_merges;
    int32_t (*merges)[2];
} BpeVocab;

// Trains until the vocabulary has target_tokens tokens (at least 256) or no pair is left.
void bpe_train(const BpeWordCounts *c, int target_tokens, BpeVocab *out);
void bpe_vocab_free(BpeVocab *v);

// tokenizer_save.c: writes v as a tokenizer.json to path, atomically: model BPE (vocab in
// the byte-level alphabet, merges as [left, right] pairs), pre_tokenizer ByteLevel
// (add_prefix_space=false, use_regex=true), decoder ByteLevel, no normalizer and no
// post-processor, and `special` as an added special token with id n_tokens (also in the
// vocabulary, as GPT-2's <|endoftext|>). Returns 0, or -1 with err filled.
int bpe_save_tokenizer_json(const BpeVocab *v, const char *special, const char *path, char *err, size_t errlen);

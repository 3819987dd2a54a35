// tokenizer_internal.h — the Tokenizer structure, shared by tokenizer_load.c (which fills
// it from tokenizer.json) and tokenizer.c (encode/decode).
#pragma once
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    char *content;      // UTF-8 text matched in the input
    size_t length;
    int32_t id;
    int special;
    int normalized;     // matched in the normalized text (else in the raw text)
    int lstrip, rstrip; // the match takes in the whitespace to its left / right
} AddedToken;

// The added tokens of one matching pass, indexed by first byte for a quick scan.
typedef struct {
    const AddedToken **tokens;  // longest first within each first byte
    int count;
    int first[257];             // tokens[first[b] .. first[b+1]) start with byte b
} AddedTokenSet;

struct Tokenizer {
    BpeModel bpe;
    int nfc;                    // normalizer NFC (else none)
    PretokPattern split;        // Split regex run before ByteLevel; PRETOK_NONE: none
    int add_prefix_space;       // ByteLevel: prepend ' ' to a piece that does not start with one
    int use_regex;              // ByteLevel: split each piece with the GPT-2 pattern

    AddedToken *added;
    int added_count;
    AddedTokenSet raw_set, normalized_set;  // normalized=false / normalized=true tokens

    int32_t *prefix_ids, *suffix_ids;  // post-processor tokens around the sequence
    int prefix_count, suffix_count;

    int vocab_size;             // largest id + 1
    unsigned char *ids_seen;    // while loading the vocabulary: a bit per id given
    char *decoded;              // bytes of every id, back to back
    size_t *decoded_offset;     // [vocab_size + 1]
};

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
    int single_word;    // matches only where no word character (\w) is beside it
} AddedToken;

// The added tokens of one matching pass, indexed by first byte for a quick scan.
typedef struct {
    const AddedToken **tokens;  // longest first within each first byte
    int count;
    int first[257];             // tokens[first[b] .. first[b+1]) start with byte b
} AddedTokenSet;

// One step of a normalizer Sequence, applied in order to each stretch of text between
// added tokens.
typedef enum { NORM_NFC, NORM_PREPEND, NORM_REPLACE } NormKind;
typedef struct {
    NormKind kind;
    char *text;          // PREPEND: what goes before a non-empty stretch; REPLACE: the string replaced
    size_t text_len;
    char *content;       // REPLACE: what replaces it
    size_t content_len;
} NormStep;

// The pre-tokenizer after the Splits: how the pieces become model input.
typedef enum {
    PRE_NONE,        // the pieces as they are (Llama-2's normalizer-based tokenizer.json, SentencePiece)
    PRE_BYTE_LEVEL,  // ByteLevel: bytes through the GPT-2 alphabet (fused into the byte-level BPE)
    PRE_METASPACE,   // Metaspace: ' ' -> replacement, a leading replacement, split before each
} PreKind;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } PrependScheme;

// How an id becomes bytes.
typedef enum {
    DECODE_BYTE_LEVEL,  // each character through the byte alphabet
    DECODE_METASPACE,   // U+2581 -> ' ', "<0xXX>" byte-fallback tokens -> the byte, CONTROL ids -> ""
    DECODE_NULL,        // NullTokenizer: " " + the id in decimal
} DecodeKind;

#define TOKENIZER_MAX_SPLITS 4
#define TOKENIZER_MAX_NORM_STEPS 8

typedef enum { TOKENIZER_HF, TOKENIZER_SENTENCEPIECE, TOKENIZER_NULL } TokenizerKind;

typedef struct SpNormalizer SpNormalizer;
typedef struct UnigramModel UnigramModel;

struct Tokenizer {
    TokenizerKind kind;
    BpeModel bpe;
    UnigramModel *unigram;      // non-NULL: a Unigram model in place of bpe
    NormStep norm[TOKENIZER_MAX_NORM_STEPS];
    int n_norm;
    SpNormalizer *sp_norm;      // SentencePiece's normalizer in place of norm[]
    PretokPattern splits[TOKENIZER_MAX_SPLITS];  // Split regexes, each on the pieces of the one before
    int n_splits;
    PreKind pre;
    int add_prefix_space;       // ByteLevel: prepend ' ' to a piece that does not start with one
    int use_regex;              // ByteLevel: split each piece with the GPT-2 pattern
    char metaspace[8];          // Metaspace's replacement character (UTF-8)
    size_t metaspace_len;
    PrependScheme prepend_scheme;
    int metaspace_split;        // Metaspace split=true: a piece starts at each replacement
    DecodeKind decode;
    char decode_space[8];       // DECODE_METASPACE: the character that decodes to ' '
    size_t decode_space_len;
    int decode_byte_fallback;   // DECODE_METASPACE: "<0xXX>" tokens decode to their byte
    int decode_strip_space;     // decoding drops one ' ' at the start of the text
    char *unk_surface;          // SentencePiece: what the unknown id decodes to; NULL otherwise
    size_t unk_surface_len;

    AddedToken *added;
    int added_count;
    AddedTokenSet raw_set, normalized_set;  // normalized=false / normalized=true tokens

    int32_t *prefix_ids, *suffix_ids;  // post-processor tokens around the sequence
    int prefix_count, suffix_count;

    int vocab_size;             // largest id + 1
    int32_t bos_id, eos_id;     // SentencePiece's; -1 otherwise (see tokenizer_bos_id)
    void *sp_model_pieces;      // while building from a SentencePiece model: its pieces array (freed with t)
    unsigned char *control;     // [vocab_size]: 1 for ids that decode to nothing (SentencePiece CONTROL); may be NULL
    unsigned char *ids_seen;    // while loading the vocabulary: a bit per id given
    char *decoded;              // bytes of every id, back to back
    size_t *decoded_offset;     // [vocab_size + 1]
};

// NullTokenizer (tokenizer_null.c): the text's whitespace-separated decimal ids appended to
// out; anything else, or an id outside the vocabulary, is fatal with one line.
void null_tokenizer_encode(const Tokenizer *t, const char *text, size_t len, IdVec *out);
// A byte-fallback token's text "<0xXX>" (upper-case hex, n bytes): its byte, else -1
// (tokenizer_load.c).
int tokenizer_fallback_byte(const char *s, size_t n);
// Fills t->decoded / decoded_offset: the bytes each id decodes to (tokenizer_load.c).
void tokenizer_build_decode_table(Tokenizer *t);
// Sorts the added tokens into raw_set / normalized_set (tokenizer_load.c).
void tokenizer_index_added(Tokenizer *t);
// The longest token of set that starts at s[pos], or NULL (tokenizer.c).
const AddedToken *added_token_at(const AddedTokenSet *set, const char *s, size_t len, size_t pos);
// An empty tokenizer of that kind (no model yet; bos/eos -1).
Tokenizer *tokenizer_new(TokenizerKind kind);

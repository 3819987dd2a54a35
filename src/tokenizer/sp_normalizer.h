// sp_normalizer.h — SentencePiece's normalizer (its normalizer.cc), applied to the whole
// text before the model:
//   * the precompiled character map (the nmt_nfkc / nfkc rules of a model): at each
//     position the longest rule matching there (a Darts-clone double-array trie) replaces
//     its bytes; a character no rule matches stays, an invalid UTF-8 byte becomes U+FFFD;
//     user-defined pieces are matched first and never rewritten;
//   * remove_extra_whitespaces: leading and trailing spaces dropped, runs of spaces as one;
//   * add_dummy_prefix: one space before the text (when anything is left of it);
//   * escape_whitespaces: ' ' written as U+2581 '▁'.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct SpNormalizer SpNormalizer;

typedef struct {
    int add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces;
} SpNormalizerFlags;

// A normalizer with flags and the precompiled charsmap blob (empty: none); the blob is
// copied. Returns NULL with a one-line reason in err when the blob is malformed.
SpNormalizer *sp_normalizer_new(SpNormalizerFlags flags, const uint8_t *charsmap, size_t charsmap_len, char *err,
                                size_t errlen);
// user_defined (an AddedTokenSet of tokenizer_internal.h, or NULL): pieces matched before
// the character map.
void sp_normalizer_set_user_defined(SpNormalizer *n, const void *user_defined);
void sp_normalizer_free(SpNormalizer *n);  // NULL is fine

// The normalized text of s[0..len): malloc'ed, NUL-terminated, its length in *out_len.
char *sp_normalize(const SpNormalizer *n, const char *s, size_t len, size_t *out_len);

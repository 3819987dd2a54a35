// mock.h — the built-in training corpus (--mock-data): short generated documents of
// several kinds (arithmetic, copy, reverse, sort, brackets, grammar, count, recall),
// each with a fixed, learnable format whose answer part is fully determined by its
// prompt part. Tokens are bytes 0..255; documents are separated by an end-of-document
// token chosen by the caller. Everything is deterministic from the seed.
#pragma once
#include <stdint.h>

#include "core/rng.h"

#define MOCK_DOC_MIN 10   // every document has at least this many bytes
#define MOCK_DOC_MAX 200  // ... and at most this many (excluding the NUL)

// Number of document kinds and their names (for docs and tests). Kinds are 0..count-1.
int mock_kind_count(void);
const char *mock_kind_name(int kind);

// Write one document of the given kind as bytes into buf (capacity cap, NUL-terminated)
// and return its length in bytes. Documents are MOCK_DOC_MIN..MOCK_DOC_MAX bytes of
// printable ASCII plus '\n'. The draws taken from rng do not depend on cap; with
// cap <= MOCK_DOC_MAX the document is cut to cap-1 bytes (cap <= 0: nothing written,
// returns 0).
int mock_document(Rng *rng, int kind, char *buf, int cap);

// Fill tokens[0..n_tokens) with documents (kinds drawn uniformly per document from an
// Rng seeded from `seed`), each followed by `eod`; the last document is cut at
// n_tokens. Deterministic from (seed, n_tokens), and the first m tokens of a longer
// corpus equal the corpus of length m.
void mock_corpus(uint64_t seed, int64_t n_tokens, int32_t eod, int32_t *tokens);

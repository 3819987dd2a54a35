// unigram.h — SentencePiece's Unigram model: a text becomes the sequence of pieces with the
// highest total score (Viterbi over the byte positions, as unigram_model.cc's optimized
// encoder, in float like it). A character that starts no piece of its own length is an
// unknown node scored min_score - 10; with byte fallback an unknown character becomes its
// bytes' "<0xXX>" pieces, else a run of them is one unknown id. User-defined pieces score length * max_score - 0.1.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/bpe.h"
#include "tokenizer/strmap.h"

typedef struct UnigramModel {
    StrMap pieces;            // piece -> id: the NORMAL and USER_DEFINED pieces
    float *score;             // [n_ids]
    unsigned char *user_defined;  // [n_ids]
    int n_ids;
    size_t max_piece_len;     // bytes
    float min_score, max_score;
    int32_t unk_id;
    int byte_fallback;
    int32_t byte_id[256];     // "<0xXX>" pieces; -1 when absent
} UnigramModel;

// An empty model for ids 0..n_ids-1 (add pieces, then set the rest).
UnigramModel *unigram_new(int n_ids);
// Adds a piece (NORMAL or USER_DEFINED); returns 0 when the text is already a piece.
int unigram_add_piece(UnigramModel *m, const char *text, size_t len, int32_t id, float score, int user_defined);
void unigram_free(UnigramModel *m);  // NULL is fine

// Appends the ids of s[0..len) (normalized text) to out.
void unigram_encode(const UnigramModel *m, const char *s, size_t len, IdVec *out);

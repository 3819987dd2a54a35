// bpe.h — the BPE model: vocabulary, merge ranks, the GPT-2 byte alphabet and the merge
// loop that turns one pre-tokenised piece into token ids. A byte-level model starts from
// the piece's bytes (through the alphabet); a character-level one (SentencePiece-style, as
// Llama-2 and Mixtral) from its UTF-8 characters, with byte fallback for the unknown ones.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/strmap.h"

// A growable array of token ids.
typedef struct {
    int32_t *v;
    size_t n, cap;
} IdVec;
void idvec_push(IdVec *a, int32_t id);

// (left id, right id) -> (rank, merged id), open addressing on the packed 64-bit pair.
typedef struct {
    uint64_t *keys;     // (left << 32 | right) + 1; 0 marks an empty slot
    int32_t *ranks, *merged;
    size_t count, slot_count;
} MergeMap;

typedef struct {
    StrMap vocab;            // token string (byte-level alphabet) -> id
    MergeMap merges;
    int32_t byte_id[256];    // id of the one-character token of each byte; -1 when absent
    int32_t unk_id;          // -1 without unk_token
    int fuse_unk;            // consecutive unknown characters become one unk
    int ignore_merges;       // a piece that is itself a vocabulary token is not merged
    int char_level;          // symbols are the piece's characters, not its bytes
    int byte_fallback;       // char_level: an unknown character becomes its bytes' "<0xXX>" tokens
    int32_t fallback_id[256];  // the id of "<0xXX>" for each byte; -1 when absent
} BpeModel;

// GPT-2's byte -> character alphabet: bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand for
// themselves; the other 68 bytes, in increasing order, become U+0100 + n (so the space
// 0x20 is U+0120 'Ġ' and the newline 0x0A is U+010A 'Ċ').
uint32_t byte_level_char(unsigned char byte);
// The byte a character of the alphabet stands for, or -1 for any other character.
int byte_level_byte(uint32_t cp);

void bpe_model_init(BpeModel *m);
void bpe_model_free(BpeModel *m);
// Adds merge (left, right) -> merged with the given rank; a later duplicate of a pair
// replaces the earlier one (as Hugging Face's map construction does).
void bpe_add_merge(BpeModel *m, int32_t left, int32_t right, int32_t rank, int32_t merged);
// Fills byte_id and fallback_id from the vocabulary (call after the vocabulary is complete).
void bpe_index_bytes(BpeModel *m);

// Working memory of bpe_encode_piece, reused from piece to piece.
typedef struct BpeScratch BpeScratch;
BpeScratch *bpe_scratch_new(void);
void bpe_scratch_free(BpeScratch *s);

// Appends the ids of one piece (raw bytes) to out: each byte (char_level: each character)
// starts as its token, then the adjacent pair of lowest merge rank is merged (the leftmost among equal
// ranks) until no pair has a merge. O(n log n) in the piece length.
void bpe_encode_piece(const BpeModel *m, const unsigned char *bytes, size_t n, BpeScratch *s, IdVec *out);

// tokenizer.h — the tokenizers of Megatron's --tokenizer-type: Hugging Face tokenizer.json
// (byte-level BPE as GPT-2 / Llama-3 / Qwen2 / DeepSeek-V3, and SentencePiece-style BPE with
// byte fallback as Llama-2 / Mixtral), SentencePiece .model files (BPE and Unigram) and
// NullTokenizer; encode and decode with the same ids as the `tokenizers` and
// `sentencepiece` libraries.
//
// What a tokenizer.json may hold (anything else is rejected with one line naming the file):
//   model          {"type": "BPE", "vocab": {token: id}, "merges": ["a b", ...] or [["a", "b"], ...],
//                   "ignore_merges", "unk_token", "fuse_unk", "byte_fallback"; no dropout,
//                   no continuing_subword_prefix / end_of_word_suffix}
//   normalizer     null, NFC, Prepend{prepend}, Replace{pattern: {String}, content}, or a
//                  Sequence of them (Llama-2: [Prepend "▁", Replace " " -> "▁"])
//   pre_tokenizer  null, ByteLevel{add_prefix_space, use_regex},
//                  Metaspace{replacement, prepend_scheme | add_prefix_space, split}, or
//                  Sequence[Split{Regex: a supported pattern, Isolated}..., ByteLevel|Metaspace]
//                  (supported patterns: GPT-2, Llama-3, Qwen2, DeepSeek-V3's three; pretokenize.h)
//                  Without ByteLevel the BPE starts from characters (byte fallback for unknown ones).
//   added_tokens   [{id, content, special, normalized, lstrip, rstrip, single_word}]
//   post_processor null, ByteLevel, TemplateProcessing (its "single" template), or a Sequence
//   decoder        ByteLevel, Metaspace, or Sequence[Replace "▁" -> " ", ByteFallback, Fuse, Strip " " 1 0]
//
// Encoding follows the library: added tokens are found first (leftmost, longest; those with
// normalized=false in the raw text, the others in the normalized text), the text between
// them is normalized, pre-tokenised and BPE-merged piece by piece, then the post-processor's
// tokens (e.g. a BOS) are added.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;

// Loads path; any problem (unreadable, malformed, unsupported) is fatal via mt_die with
// one line naming the file and what is wrong.
Tokenizer *tokenizer_load(const char *path);
// The same from the text of a tokenizer.json already read; path names it in messages.
Tokenizer *tokenizer_parse(const char *json, size_t len, const char *path);
// A SentencePiece model file (tokenizer.model: BPE or Unigram, see sp_model.h and
// tokenizer_sentencepiece.c); problems are fatal with one line naming the file.
Tokenizer *tokenizer_load_sentencepiece(const char *path);
Tokenizer *tokenizer_parse_sentencepiece(const uint8_t *bytes, size_t len, const char *path);
// Megatron's NullTokenizer: ids written in decimal, end of document vocab_size - 1.
Tokenizer *tokenizer_null(int vocab_size);
// GPT-2's vocab.json + merges.txt as the text of the tokenizer.json that `tokenizers`'
// ByteLevelBPETokenizer(vocab, merges) is (ByteLevel pre-tokenizer and decoder, no added
// tokens); malloc'ed, its length in *len. A malformed merges.txt is fatal with one line
// naming the file and line.
char *tokenizer_json_from_gpt2_files(const char *vocab_path, const char *merges_path, size_t *len);
void tokenizer_free(Tokenizer *t);  // NULL is fine

// Encodes text[0..len) (UTF-8; invalid bytes are kept as bytes) with the post-processor's
// special tokens, as `tokenizers`' encode(text).ids. Returns the count and sets *ids to a
// malloc'ed array (free it; non-NULL even for 0 ids).
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids);

// The bytes id decodes to (ByteLevel decoder: each character of the token through the byte
// alphabet, or the token's own UTF-8 when it has characters outside it). *len = 0 and ""
// for an id that is not in the vocabulary. Decoding a sequence is the concatenation.
const char *tokenizer_token_bytes(const Tokenizer *t, int32_t id, size_t *len);
// Decodes ids into out (at most cap bytes, NUL-terminated when cap > 0); returns the full
// decoded length, as snprintf does.
size_t tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n, char *out, size_t cap);

// Largest id + 1, over the model vocabulary and the added tokens.
int tokenizer_vocab_size(const Tokenizer *t);
// The id of a token given by its string (an added token's content or a vocabulary entry
// in the byte-level alphabet), or -1.
int tokenizer_token_id(const Tokenizer *t, const char *token);
// End-of-text tokens: those of <|endoftext|>, </s>, <|im_end|>, <|end_of_text|>, <|eot_id|>
// the tokenizer has, in that order (at most TOKENIZER_MAX_END_IDS); returns their count.
#define TOKENIZER_MAX_END_IDS 5
int tokenizer_end_of_text_ids(const Tokenizer *t, int32_t *ids);
// The end-of-document id: the first of those, or -1.
int tokenizer_end_of_text_id(const Tokenizer *t);
// The beginning-of-text id: the special token the post-processor puts before every
// sequence (TemplateProcessing "<s> $A"), or -1 when it adds none.
int tokenizer_bos_id(const Tokenizer *t);
// 1 when id is an added token marked special.
int tokenizer_is_special(const Tokenizer *t, int32_t id);

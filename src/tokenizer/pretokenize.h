// pretokenize.h — the pre-tokenisation regexes of byte-level BPE tokenizers, as
// hand-written matchers (no regex library). Each pattern is an alternation tried left to
// right at the current position (the first alternative that matches wins, with the
// backtracking of a Perl-style engine); every character is covered by some alternative,
// so a text splits into consecutive pieces with no gaps. DeepSeek-V3's three patterns do not
// cover every character: as a Split with behavior Isolated, the text between two matches is
// a piece of its own.
#pragma once
#include <stddef.h>

typedef enum {
    PRETOK_NONE,    // no split: the whole text is one piece
    PRETOK_GPT2,    // GPT-2 / ByteLevel(use_regex=true)
    PRETOK_LLAMA3,  // Llama-3 (and tiktoken cl100k): numbers in groups of up to three
    PRETOK_QWEN2,   // Qwen2 / Qwen2.5 / Qwen3: as Llama-3, but one digit per piece
    PRETOK_DEEPSEEK_DIGITS,  // DeepSeek-V3, first Split: \p{N}{1,3}
    PRETOK_DEEPSEEK_CJK,     // second: runs of CJK ideographs (U+4E00-U+9FA5), hiragana, katakana
    PRETOK_DEEPSEEK_WORDS,   // third: words, punctuation and symbol runs, whitespace (pretokenize.c)
} PretokPattern;

// The pattern whose exact regex source (as tokenizer.json stores it) is `regex`, or
// PRETOK_NONE when it is none of the supported ones.
PretokPattern pretok_pattern_from_regex(const char *regex);
// The regex source of a pattern ("" for PRETOK_NONE).
const char *pretok_pattern_regex(PretokPattern p);

// The end (byte offset) of the piece that starts at s[pos] (pos < len). Pieces never
// span the end of s: `\s+(?!\S)` treats len as the end of the text.
size_t pretok_next(PretokPattern p, const char *s, size_t len, size_t pos);

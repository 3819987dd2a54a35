// pretokenize.c — the GPT-2, Llama-3 and Qwen2 pre-tokenisation patterns, matched by hand.
//
// GPT-2 (also what ByteLevel(use_regex=true) runs):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Llama-3 (Qwen2 has \p{N} in place of \p{N}{1,3}):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// DeepSeek-V3 (three Splits, each on the pieces of the one before):
//   \p{N}{1,3}
//   [一-龥぀-ゟ゠-ヿ]+                  (U+4E00-U+9FA5, U+3040-U+309F, U+30A0-U+30FF)
//   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//   ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// \s is the White_Space property (unicode.c). The apostrophe is ASCII 0x27 only. Under
// (?i) Oniguruma also matches U+017F LATIN SMALL LETTER LONG S for s (its case folding),
// and no other non-ASCII character for these letters.
#include "tokenizer/pretokenize.h"

#include <string.h>

#include "tokenizer/unicode.h"

static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char LLAMA3_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char DEEPSEEK_DIGITS_REGEX[] = "\\p{N}{1,3}";
static const char DEEPSEEK_CJK_REGEX[] = "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+";
static const char DEEPSEEK_WORDS_REGEX[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char *const pattern_regex[] = {
    [PRETOK_NONE] = "", [PRETOK_GPT2] = GPT2_REGEX, [PRETOK_LLAMA3] = LLAMA3_REGEX, [PRETOK_QWEN2] = QWEN2_REGEX,
    [PRETOK_DEEPSEEK_DIGITS] = DEEPSEEK_DIGITS_REGEX, [PRETOK_DEEPSEEK_CJK] = DEEPSEEK_CJK_REGEX,
    [PRETOK_DEEPSEEK_WORDS] = DEEPSEEK_WORDS_REGEX};
#define PATTERN_COUNT ((int)(sizeof pattern_regex / sizeof pattern_regex[0]))

PretokPattern pretok_pattern_from_regex(const char *regex) {
    for (int p = PRETOK_NONE + 1; p < PATTERN_COUNT; p++)
        if (!strcmp(regex, pattern_regex[p])) return (PretokPattern)p;
    return PRETOK_NONE;
}

const char *pretok_pattern_regex(PretokPattern p) { return (int)p < PATTERN_COUNT ? pattern_regex[p] : ""; }

#define AT_END (-1)

// The class of the character at s[pos] (AT_END past the text); *next is where it ends.
static int class_at(const char *s, size_t len, size_t pos, size_t *next) {
    if (pos >= len) {
        *next = pos;
        return AT_END;
    }
    uint32_t cp;
    *next = pos + utf8_decode(s + pos, len - pos, &cp);
    return (int)uc_class(cp);
}

// End of the run of characters of class cls that starts at pos.
static size_t run_end(const char *s, size_t len, size_t pos, int cls) {
    size_t next;
    while (class_at(s, len, pos, &next) == cls) pos = next;
    return pos;
}

static int is_newline(char c) { return c == '\r' || c == '\n'; }

static int ascii_lower(int c) { return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c; }

// The letter at s[pos] as a lower-case ASCII letter for the contraction alternatives:
// exact bytes when case-sensitive; under (?i) any case, and U+017F (bytes C5 BF) as 's'.
// Sets *width to its byte length; 0 when there is no character.
static int contraction_letter(const char *s, size_t len, size_t pos, int fold, size_t *width) {
    *width = 1;
    if (pos >= len) return 0;
    if (!fold) return (unsigned char)s[pos];
    if (pos + 1 < len && (unsigned char)s[pos] == 0xC5 && (unsigned char)s[pos + 1] == 0xBF) {
        *width = 2;
        return 's';
    }
    return ascii_lower((unsigned char)s[pos]);
}

// 's|'t|'re|'ve|'m|'ll|'d at pos (fold: case-insensitively): the end, or 0.
static size_t contraction(const char *s, size_t len, size_t pos, int fold) {
    if (s[pos] != '\'') return 0;
    size_t w1, w2;
    int a = contraction_letter(s, len, pos + 1, fold, &w1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 1 + w1;
    int b = contraction_letter(s, len, pos + 1 + w1, fold, &w2);
    if (((a == 'r' || a == 'v') && b == 'e') || (a == 'l' && b == 'l')) return pos + 1 + w1 + w2;
    return 0;
}

// \s+(?!\S)|\s+ at a whitespace character: the whole run when it ends the text or is one
// character long; otherwise the run less its last character (which then starts the next
// piece, so that " word" keeps its space).
static size_t space_run(const char *s, size_t len, size_t pos) {
    size_t end = pos, last = pos, next;
    while (class_at(s, len, end, &next) == UC_SPACE) {
        last = end;
        end = next;
    }
    return end == len || last == pos ? end : last;
}

// ` ?X+` for X = \p{L}, \p{N} or [^\s\p{L}\p{N}], tried with the optional space first: the
// end, or 0 when no such alternative applies (the text at pos is whitespace).
static size_t optional_space_run(const char *s, size_t len, size_t pos) {
    size_t start = s[pos] == ' ' && pos + 1 < len ? pos + 1 : pos, next;
    int cls = class_at(s, len, start, &next);
    if (cls == UC_SPACE) return 0;
    return run_end(s, len, next, cls);
}

static size_t next_gpt2(const char *s, size_t len, size_t pos) {
    size_t end = contraction(s, len, pos, 0);
    if (!end) end = optional_space_run(s, len, pos);
    return end ? end : space_run(s, len, pos);
}

// \s*[\r\n]+|\s+(?!\S)|\s+ at a whitespace character: the whitespace run up to and including
// its last \r or \n, else space_run. (The bytes of a multi-byte character are >= 0x80, so a
// byte scan finds exactly the \r and \n characters.)
static size_t newline_or_space_run(const char *s, size_t len, size_t pos) {
    size_t run = run_end(s, len, pos, UC_SPACE);
    for (size_t j = run; j > pos; j--)
        if (is_newline(s[j - 1])) return j;
    return space_run(s, len, pos);
}

// Llama-3 / Qwen2: max_digits is 3 or 1.
static size_t next_llama3(const char *s, size_t len, size_t pos, int max_digits) {
    size_t end = contraction(s, len, pos, 1), next, after;
    if (end) return end;
    int cls = class_at(s, len, pos, &next);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (cls == UC_LETTER) return run_end(s, len, next, UC_LETTER);
    if (cls != UC_NUMBER && !is_newline(s[pos]) && class_at(s, len, next, &after) == UC_LETTER)
        return run_end(s, len, after, UC_LETTER);
    // \p{N}{1,max_digits}
    if (cls == UC_NUMBER) {
        for (int i = 1; i < max_digits && class_at(s, len, next, &after) == UC_NUMBER; i++) next = after;
        return next;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    size_t start = s[pos] == ' ' && pos + 1 < len ? pos + 1 : pos;
    if (class_at(s, len, start, &next) == UC_OTHER) {
        end = run_end(s, len, next, UC_OTHER);
        while (end < len && is_newline(s[end])) end++;
        return end;
    }
    return newline_or_space_run(s, len, pos);
}

// ---- DeepSeek-V3 ---------------------------------------------------------------------
// Each matcher returns the end of the match at pos, or pos when the pattern does not match
// there.

static uint32_t cp_at(const char *s, size_t len, size_t pos, size_t *next) {
    uint32_t cp = UC_INVALID;
    *next = pos < len ? pos + utf8_decode(s + pos, len - pos, &cp) : pos;
    return cp;
}

static int is_ascii_letter(uint32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_ascii_punct(uint32_t c) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
}
static int is_letter_or_mark(uint32_t c) { return uc_class(c) == UC_LETTER || uc_is_mark(c); }
static int is_punct_or_symbol(uint32_t c) { return uc_is_punct(c) || uc_is_symbol(c); }
static int is_deepseek_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x309F) || (c >= 0x30A0 && c <= 0x30FF);
}

// The end of the run of characters with property `in` that starts at pos.
static size_t run_while(const char *s, size_t len, size_t pos, int (*in)(uint32_t)) {
    size_t next;
    while (pos < len && in(cp_at(s, len, pos, &next))) pos = next;
    return pos;
}

#define DEEPSEEK_MAX_DIGITS 3

static size_t match_deepseek_digits(const char *s, size_t len, size_t pos) {
    size_t next;
    for (int i = 0; i < DEEPSEEK_MAX_DIGITS && class_at(s, len, pos, &next) == UC_NUMBER; i++) pos = next;
    return pos;
}

static size_t match_deepseek_cjk(const char *s, size_t len, size_t pos) {
    return run_while(s, len, pos, is_deepseek_cjk);
}

static size_t match_deepseek_words(const char *s, size_t len, size_t pos) {
    size_t next, after;
    uint32_t c = cp_at(s, len, pos, &next);
    // [ASCII punctuation][A-Za-z]+
    if (is_ascii_punct(c) && is_ascii_letter(cp_at(s, len, next, &after)))
        return run_while(s, len, next, is_ascii_letter);
    // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
    if (is_letter_or_mark(c)) return run_while(s, len, pos, is_letter_or_mark);
    if (c != '\r' && c != '\n' && !is_punct_or_symbol(c) && is_letter_or_mark(cp_at(s, len, next, &after)))
        return run_while(s, len, next, is_letter_or_mark);
    // ` ?[\p{P}\p{S}]+[\r\n]*`
    size_t start = c == ' ' ? next : pos;
    if (is_punct_or_symbol(cp_at(s, len, start, &after))) {
        size_t end = run_while(s, len, start, is_punct_or_symbol);
        while (end < len && is_newline(s[end])) end++;
        return end;
    }
    return uc_class(c) == UC_SPACE ? newline_or_space_run(s, len, pos) : pos;
}

// Split(behavior=Isolated) with a pattern that may not match at pos: the match there, else
// the unmatched text up to the next position where the pattern matches.
static size_t isolated_piece(const char *s, size_t len, size_t pos, size_t (*match)(const char *, size_t, size_t)) {
    size_t end = match(s, len, pos), next;
    if (end > pos) return end;
    for (end = pos; end < len && match(s, len, end) == end; end = next) class_at(s, len, end, &next);
    return end;
}

size_t pretok_next(PretokPattern p, const char *s, size_t len, size_t pos) {
    switch (p) {
    case PRETOK_GPT2: return next_gpt2(s, len, pos);
    case PRETOK_LLAMA3: return next_llama3(s, len, pos, 3);
    case PRETOK_QWEN2: return next_llama3(s, len, pos, 1);
    case PRETOK_DEEPSEEK_DIGITS: return isolated_piece(s, len, pos, match_deepseek_digits);
    case PRETOK_DEEPSEEK_CJK: return isolated_piece(s, len, pos, match_deepseek_cjk);
    case PRETOK_DEEPSEEK_WORDS: return isolated_piece(s, len, pos, match_deepseek_words);
    default: return len;
    }
}

// pretokenize.c — the GPT-2, Llama-3 and Qwen2 pre-tokenisation patterns, matched by hand.
//
// GPT-2 (also what ByteLevel(use_regex=true) runs):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Llama-3 (Qwen2 has \p{N} in place of \p{N}{1,3}):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
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

PretokPattern pretok_pattern_from_regex(const char *regex) {
    if (!strcmp(regex, GPT2_REGEX)) return PRETOK_GPT2;
    if (!strcmp(regex, LLAMA3_REGEX)) return PRETOK_LLAMA3;
    if (!strcmp(regex, QWEN2_REGEX)) return PRETOK_QWEN2;
    return PRETOK_NONE;
}

const char *pretok_pattern_regex(PretokPattern p) {
    switch (p) {
    case PRETOK_GPT2: return GPT2_REGEX;
    case PRETOK_LLAMA3: return LLAMA3_REGEX;
    case PRETOK_QWEN2: return QWEN2_REGEX;
    default: return "";
    }
}

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
    // \s*[\r\n]+ : the whitespace run up to and including its last \r or \n. (The bytes of a
    // multi-byte character are >= 0x80, so a byte scan finds exactly the \r and \n characters.)
    size_t run = run_end(s, len, pos, UC_SPACE);
    for (size_t j = run; j > pos; j--)
        if (is_newline(s[j - 1])) return j;
    return space_run(s, len, pos);
}

size_t pretok_next(PretokPattern p, const char *s, size_t len, size_t pos) {
    switch (p) {
    case PRETOK_GPT2: return next_gpt2(s, len, pos);
    case PRETOK_LLAMA3: return next_llama3(s, len, pos, 3);
    case PRETOK_QWEN2: return next_llama3(s, len, pos, 1);
    default: return len;
    }
}

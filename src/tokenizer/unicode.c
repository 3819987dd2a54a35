// unicode.c — UTF-8 decoding/encoding and the character classes \p{L}, \p{N}, \s.
#include "tokenizer/unicode.h"

size_t utf8_decode(const char *s, size_t len, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned char b = u[0];
    *cp = UC_INVALID;
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t n;
    uint32_t value, min;
    if (b >= 0xC2 && b <= 0xDF) n = 2, value = b & 0x1F, min = 0x80;
    else if (b >= 0xE0 && b <= 0xEF) n = 3, value = b & 0x0F, min = 0x800;
    else if (b >= 0xF0 && b <= 0xF4) n = 4, value = b & 0x07, min = 0x10000;
    else return 1;  // continuation byte, 0xC0/0xC1 (always overlong) or > 0xF4
    if (len < n) return 1;
    for (size_t i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return 1;
        value = value << 6 | (u[i] & 0x3F);
    }
    if (value < min || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 1;
    *cp = value;
    return n;
}

size_t utf8_encode(uint32_t cp, char *out) {
    unsigned char *u = (unsigned char *)out;
    if (cp < 0x80) {
        u[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        u[0] = (unsigned char)(0xC0 | cp >> 6);
        u[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | cp >> 12);
        u[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    u[0] = (unsigned char)(0xF0 | cp >> 18);
    u[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    u[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    u[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

// Binary search over sorted, disjoint {first, last, ...} rows of `stride` uint32 values
// each: the row holding cp, or NULL.
static const uint32_t *find_row(const uint32_t *rows, size_t n, size_t stride, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const uint32_t *row = rows + mid * stride;
        if (cp < row[0]) hi = mid;
        else if (cp > row[1]) lo = mid + 1;
        else return row;
    }
    return NULL;
}

static int in_ranges(const UcRange *r, size_t n, uint32_t cp) {
    return find_row(&r[0].first, n, sizeof(UcRange) / sizeof(uint32_t), cp) != NULL;
}

// \s of Oniguruma and Rust regex (what Hugging Face tokenizers run): the White_Space
// property. Note it is not Python's str.isspace(), which adds U+001C..U+001F.
static int is_white_space(uint32_t cp) {
    switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
        return 1;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

static UcClass ascii_class(uint32_t cp) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return UC_LETTER;
    if (cp >= '0' && cp <= '9') return UC_NUMBER;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return UC_SPACE;
    return UC_OTHER;
}

UcClass uc_class(uint32_t cp) {
    if (cp < 0x80) return ascii_class(cp);
    if (cp == UC_INVALID) return UC_OTHER;
    if (is_white_space(cp)) return UC_SPACE;
    if (in_ranges(uc_letter_ranges, uc_letter_ranges_count, cp)) return UC_LETTER;
    if (in_ranges(uc_number_ranges, uc_number_ranges_count, cp)) return UC_NUMBER;
    return UC_OTHER;
}

int uc_is_punct(uint32_t cp) { return in_ranges(uc_punct_ranges, uc_punct_ranges_count, cp); }
int uc_is_symbol(uint32_t cp) { return in_ranges(uc_symbol_ranges, uc_symbol_ranges_count, cp); }
int uc_is_mark(uint32_t cp) { return in_ranges(uc_mark_ranges, uc_mark_ranges_count, cp); }

#define ZERO_WIDTH_NON_JOINER 0x200C
#define ZERO_WIDTH_JOINER 0x200D

int uc_is_word(uint32_t cp) {
    if (cp == ZERO_WIDTH_NON_JOINER || cp == ZERO_WIDTH_JOINER) return 1;
    return uc_class(cp) == UC_LETTER || uc_is_mark(cp) ||
           in_ranges(uc_word_extra_ranges, uc_word_extra_ranges_count, cp);
}

int uc_combining_class(uint32_t cp) {
    if (cp < 0x300 || cp == UC_INVALID) return 0;  // U+0300 is the first non-starter
    const uint32_t *row =
        find_row(&uc_ccc_ranges[0].first, uc_ccc_ranges_count, sizeof(UcClassRange) / sizeof(uint32_t), cp);
    return row ? (int)row[2] : 0;
}

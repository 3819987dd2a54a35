// sp_normalizer.c — SentencePiece's normalizer (see sp_normalizer.h).
//
// The precompiled charsmap blob: a little-endian uint32 trie size T, T bytes of a
// Darts-clone double array (little-endian uint32 units), then the replacement strings, each
// NUL-terminated, that the trie's values index by byte offset. A unit u holds:
//   has_leaf = u >> 8 & 1, value = u & 0x7FFFFFFF, label = u & 0x800000FF,
//   offset = (u >> 10) << ((u & 0x200) >> 6).
// A trie index or replacement offset outside the blob counts as no rule (no read outside it).
#include "tokenizer/sp_normalizer.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"

static const char SPACE_SYMBOL[] = "\xE2\x96\x81";  // U+2581
#define SPACE_SYMBOL_LEN 3
static const char REPLACEMENT_CHAR[] = "\xEF\xBF\xBD";  // U+FFFD
#define TRIE_SIZE_BYTES 4

struct SpNormalizer {
    SpNormalizerFlags flags;
    uint32_t *units;   // the double array; NULL without a charsmap
    size_t n_units;
    char *replacements;
    size_t replacements_len;
    const AddedTokenSet *user_defined;
};

static uint32_t read_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

SpNormalizer *sp_normalizer_new(SpNormalizerFlags flags, const uint8_t *charsmap, size_t charsmap_len, char *err,
                                size_t errlen) {
    SpNormalizer *n = mt_calloc(1, sizeof *n);
    n->flags = flags;
    if (!charsmap_len) return n;
    uint32_t trie_bytes = charsmap_len > TRIE_SIZE_BYTES ? read_le32(charsmap) : 0;
    if (charsmap_len <= TRIE_SIZE_BYTES || !trie_bytes || trie_bytes % 4 ||
        trie_bytes >= charsmap_len - TRIE_SIZE_BYTES) {
        snprintf(err, errlen, "normalizer_spec.precompiled_charsmap is malformed (trie size %u of a %zu-byte blob)",
                 trie_bytes, charsmap_len);
        free(n);
        return NULL;
    }
    n->n_units = trie_bytes / 4;
    n->units = mt_malloc(trie_bytes);
    for (size_t i = 0; i < n->n_units; i++) n->units[i] = read_le32(charsmap + TRIE_SIZE_BYTES + 4 * i);
    n->replacements_len = charsmap_len - TRIE_SIZE_BYTES - trie_bytes;
    n->replacements = mt_malloc(n->replacements_len);
    memcpy(n->replacements, charsmap + TRIE_SIZE_BYTES + trie_bytes, n->replacements_len);
    return n;
}

void sp_normalizer_set_user_defined(SpNormalizer *n, const void *user_defined) { n->user_defined = user_defined; }

void sp_normalizer_free(SpNormalizer *n) {
    if (!n) return;
    free(n->units);
    free(n->replacements);
    free(n);
}

// ---- the character map ---------------------------------------------------------------

static int unit_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static uint32_t unit_value(uint32_t u) { return u & 0x7FFFFFFFu; }
static uint32_t unit_label(uint32_t u) { return u & 0x800000FFu; }
static size_t unit_offset(uint32_t u) { return (size_t)(u >> 10) << ((u & 0x200) >> 6); }

// The longest rule matching at s[0..len): its length (0: none) and replacement.
static size_t longest_rule(const SpNormalizer *n, const char *s, size_t len, const char **replacement,
                           size_t *replacement_len) {
    size_t best = 0, id = 0;
    if (!n->units) return 0;
    id ^= unit_offset(n->units[0]);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!c) break;
        id ^= c;
        if (id >= n->n_units || unit_label(n->units[id]) != c) break;
        uint32_t unit = n->units[id];
        id ^= unit_offset(unit);
        if (id >= n->n_units) break;
        if (!unit_has_leaf(unit)) continue;
        size_t at = unit_value(n->units[id]);
        const char *end = at < n->replacements_len ? memchr(n->replacements + at, 0, n->replacements_len - at) : NULL;
        if (!end) continue;
        best = i + 1;
        *replacement = n->replacements + at;
        *replacement_len = (size_t)(end - *replacement);
    }
    return best;
}

// What the text at s[0..len) (len > 0) normalizes to: *out, *out_len; returns the bytes consumed.
static size_t normalize_prefix(const SpNormalizer *n, const char *s, size_t len, const char **out, size_t *out_len) {
    if (n->user_defined) {
        const AddedToken *tok = added_token_at(n->user_defined, s, len, 0);
        if (tok) {
            *out = s, *out_len = tok->length;
            return tok->length;
        }
    }
    size_t rule = longest_rule(n, s, len, out, out_len);
    if (rule) return rule;
    uint32_t cp;
    size_t width = utf8_decode(s, len, &cp);
    if (cp == UC_INVALID) {
        *out = REPLACEMENT_CHAR, *out_len = sizeof REPLACEMENT_CHAR - 1;
        return 1;
    }
    *out = s, *out_len = width;
    return width;
}

// ---- the text ------------------------------------------------------------------------

typedef struct {
    char *v;
    size_t n, cap;
} Text;

static void text_append(Text *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        t->cap = 2 * (t->n + n + 1);
        t->v = mt_realloc(t->v, t->cap);
    }
    memcpy(t->v + t->n, s, n);
    t->n += n;
    t->v[t->n] = 0;
}

static void append_space(const SpNormalizer *n, Text *t) {
    if (n->flags.escape_whitespaces) text_append(t, SPACE_SYMBOL, SPACE_SYMBOL_LEN);
    else text_append(t, " ", 1);
}

char *sp_normalize(const SpNormalizer *n, const char *s, size_t len, size_t *out_len) {
    Text t = {0};
    text_append(&t, "", 0);
    const char *piece;
    size_t piece_len, pos = 0;
    int remove_extra = n->flags.remove_extra_whitespaces;
    while (remove_extra && pos < len) {  // leading spaces
        size_t used = normalize_prefix(n, s + pos, len - pos, &piece, &piece_len);
        if (piece_len != 1 || piece[0] != ' ') break;
        pos += used;
    }
    if (pos < len && n->flags.add_dummy_prefix) append_space(n, &t);
    int previous_space = remove_extra;
    while (pos < len) {
        pos += normalize_prefix(n, s + pos, len - pos, &piece, &piece_len);
        while (previous_space && piece_len && piece[0] == ' ') piece++, piece_len--;
        if (piece_len) {
            for (size_t i = 0; i < piece_len; i++)
                if (piece[i] == ' ') append_space(n, &t);
                else text_append(&t, piece + i, 1);
            previous_space = piece[piece_len - 1] == ' ';
        }
        if (!remove_extra) previous_space = 0;
    }
    size_t space_len = n->flags.escape_whitespaces ? SPACE_SYMBOL_LEN : 1;
    const char *space = n->flags.escape_whitespaces ? SPACE_SYMBOL : " ";
    while (remove_extra && t.n >= space_len && !memcmp(t.v + t.n - space_len, space, space_len)) t.n -= space_len;
    t.v[t.n] = 0;
    *out_len = t.n;
    return t.v;
}

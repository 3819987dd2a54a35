// nfc.c — Unicode Normalization Form C (UAX #15): full canonical decomposition, canonical
// ordering of combining marks, then canonical composition. Hangul syllables decompose and
// compose algorithmically; everything else comes from the tables in unicode_tables.c.
// Known difference: Hugging Face tokenizers normalizes with an older Unicode database
// (the unicode-normalization-alignments crate), so combining marks added to Unicode since
// then (e.g. U+1DF9) are reordered here and not there. Text without such marks matches.
#include <string.h>

#include "core/common.h"
#include "tokenizer/unicode.h"

// Hangul syllable arithmetic (Unicode §3.12).
enum {
    S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7,
    L_COUNT = 19, V_COUNT = 21, T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT,
};

// An invalid UTF-8 byte b travels through the codepoint buffers as RAW_BYTE + b: a
// starter with no decomposition that composes with nothing.
#define RAW_BYTE 0x110000u

typedef struct {
    uint32_t *cp;
    size_t n, cap;
} CpBuf;

static void cp_push(CpBuf *b, uint32_t cp) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->cp = mt_realloc(b->cp, b->cap * sizeof(uint32_t));
    }
    b->cp[b->n++] = cp;
}

static const UcDecomposition *find_decomposition(uint32_t cp) {
    size_t lo = 0, hi = uc_decompositions_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (uc_decompositions[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < uc_decompositions_count && uc_decompositions[lo].cp == cp ? &uc_decompositions[lo] : NULL;
}

// Appends the full canonical decomposition of cp.
static void decompose(CpBuf *out, uint32_t cp) {
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
        uint32_t s = cp - S_BASE;
        cp_push(out, L_BASE + s / N_COUNT);
        cp_push(out, V_BASE + s % N_COUNT / T_COUNT);
        if (s % T_COUNT) cp_push(out, T_BASE + s % T_COUNT);
        return;
    }
    const UcDecomposition *d = cp < RAW_BYTE ? find_decomposition(cp) : NULL;
    if (!d) {
        cp_push(out, cp);
        return;
    }
    decompose(out, d->first);
    if (d->second) decompose(out, d->second);
}

static int ccc_of(uint32_t cp) { return cp >= RAW_BYTE ? 0 : uc_combining_class(cp); }

// Stable sort of one run of non-starters by combining class (0 < class < 256): insertion
// sort for the short runs of real text, a counting sort for long ones, so that a text of
// thousands of alternating marks costs linear time, not quadratic.
static void sort_run(uint32_t *cp, size_t n, uint32_t **tmp, size_t *tmp_cap) {
    if (n <= 32) {
        for (size_t i = 1; i < n; i++) {
            uint32_t c = cp[i];
            int ccc = ccc_of(c);
            size_t j = i;
            while (j > 0 && ccc_of(cp[j - 1]) > ccc) {
                cp[j] = cp[j - 1];
                j--;
            }
            cp[j] = c;
        }
        return;
    }
    if (*tmp_cap < n) {
        *tmp_cap = n;
        *tmp = mt_realloc(*tmp, n * sizeof(uint32_t));
    }
    size_t start[257] = {0};
    for (size_t i = 0; i < n; i++) start[(ccc_of(cp[i]) & 255) + 1]++;
    for (int c = 0; c < 256; c++) start[c + 1] += start[c];
    for (size_t i = 0; i < n; i++) (*tmp)[start[ccc_of(cp[i]) & 255]++] = cp[i];
    memcpy(cp, *tmp, n * sizeof(uint32_t));
}

// Canonical ordering: every maximal run of non-starters sorted by combining class.
static void canonical_order(CpBuf *b) {
    uint32_t *tmp = NULL;
    size_t tmp_cap = 0;
    for (size_t i = 0; i < b->n;) {
        if (!ccc_of(b->cp[i])) {
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < b->n && ccc_of(b->cp[j])) j++;
        sort_run(b->cp + i, j - i, &tmp, &tmp_cap);
        i = j;
    }
    free(tmp);
}

// The primary composite of (a, b), or 0 when there is none.
static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    size_t lo = 0, hi = uc_compositions_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const UcComposition *c = &uc_compositions[mid];
        if (c->first < a || (c->first == a && c->second < b)) lo = mid + 1;
        else hi = mid;
    }
    if (lo < uc_compositions_count && uc_compositions[lo].first == a && uc_compositions[lo].second == b)
        return uc_compositions[lo].composite;
    return 0;
}

// Canonical composition in place: a character combines with the last starter unless a
// character between them is a starter or has a class >= its own (it is "blocked").
static void compose(CpBuf *b) {
    size_t starter = 0, out = 0;
    int have_starter = 0, last_ccc = 0;  // text may open with marks: nothing to compose into
    for (size_t i = 0; i < b->n; i++) {
        uint32_t cp = b->cp[i];
        int ccc = ccc_of(cp);
        if (have_starter && (last_ccc < ccc || last_ccc == 0)) {
            uint32_t composite = compose_pair(b->cp[starter], cp);
            if (composite) {
                b->cp[starter] = composite;
                continue;
            }
        }
        if (ccc == 0) starter = out, have_starter = 1;
        last_ccc = ccc;
        b->cp[out++] = cp;
    }
    b->n = out;
}

// Text whose characters are all below U+0300 is already NFC: no such character
// decomposes to something else, and every non-starter and composable second is above.
static int trivially_nfc(const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += utf8_decode(s + i, len - i, &cp);
        if (cp >= 0x300) return 0;
    }
    return 1;
}

char *uc_nfc(const char *s, size_t len, size_t *out_len) {
    if (trivially_nfc(s, len)) {
        char *copy = mt_malloc(len + 1);
        memcpy(copy, s, len);
        copy[len] = 0;
        *out_len = len;
        return copy;
    }
    CpBuf b = {0};
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t n = utf8_decode(s + i, len - i, &cp);
        decompose(&b, cp == UC_INVALID ? RAW_BYTE + (unsigned char)s[i] : cp);
        i += n;
    }
    canonical_order(&b);
    compose(&b);
    char *out = mt_malloc(4 * b.n + 1);
    size_t n = 0;
    for (size_t i = 0; i < b.n; i++) {
        if (b.cp[i] >= RAW_BYTE) out[n++] = (char)(b.cp[i] - RAW_BYTE);
        else n += utf8_encode(b.cp[i], out + n);
    }
    out[n] = 0;
    *out_len = n;
    free(b.cp);
    return out;
}

// tokenizer.c — encode and decode with a loaded tokenizer.json (see tokenizer.h).
//
// encode(text):
//   1. added tokens with normalized=false are found in the raw text (leftmost, longest
//      first); lstrip/rstrip widen a match over the whitespace beside it;
//   2. each stretch between them is normalized (NFC or nothing), and added tokens with
//      normalized=true are found in it the same way;
//   3. each remaining stretch is split by the Split pattern (if any), each piece gets the
//      ByteLevel treatment (a prefix space when add_prefix_space and the piece does not
//      start with one; the GPT-2 pattern when use_regex), and each final piece is BPE-merged;
//   4. the post-processor's tokens go before and after.
#include <string.h>

#include "core/common.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"

typedef struct {
    const Tokenizer *t;
    BpeScratch *scratch;
    IdVec ids;
    char *prefixed;  // a piece with the ByteLevel prefix space
    size_t prefixed_cap;
} Encoder;

typedef void (*StretchFn)(Encoder *e, const char *s, size_t len);

// ---- steps 3 and 2 -------------------------------------------------------------------

static void bpe_piece(Encoder *e, const char *s, size_t len) {
    bpe_encode_piece(&e->t->bpe, (const unsigned char *)s, len, e->scratch, &e->ids);
}

static void byte_level_piece(Encoder *e, const char *s, size_t len) {
    const Tokenizer *t = e->t;
    if (!len) return;
    if (t->add_prefix_space && s[0] != ' ') {
        if (e->prefixed_cap < len + 1) {
            e->prefixed_cap = 2 * (len + 1);
            e->prefixed = mt_realloc(e->prefixed, e->prefixed_cap);
        }
        e->prefixed[0] = ' ';
        memcpy(e->prefixed + 1, s, len);
        s = e->prefixed;
        len++;
    }
    if (!t->use_regex) {
        bpe_piece(e, s, len);
        return;
    }
    for (size_t pos = 0, end; pos < len; pos = end) {
        end = pretok_next(PRETOK_GPT2, s, len, pos);
        bpe_piece(e, s + pos, end - pos);
    }
}

// A normalized stretch without added tokens: Split, then ByteLevel.
static void plain_stretch(Encoder *e, const char *s, size_t len) {
    if (e->t->split == PRETOK_NONE) {
        byte_level_piece(e, s, len);
        return;
    }
    for (size_t pos = 0, end; pos < len; pos = end) {
        end = pretok_next(e->t->split, s, len, pos);
        byte_level_piece(e, s + pos, end - pos);
    }
}

// ---- added tokens --------------------------------------------------------------------

// The leftmost position >= from where a token of set matches, with the longest such token
// in *tok; len when there is none.
static size_t find_added(const AddedTokenSet *set, const char *s, size_t len, size_t from, const AddedToken **tok) {
    if (!set->count) return len;
    for (size_t i = from; i < len; i++) {
        unsigned char b = (unsigned char)s[i];
        for (int k = set->first[b]; k < set->first[b + 1]; k++) {
            const AddedToken *a = set->tokens[k];
            if (a->length <= len - i && !memcmp(s + i, a->content, a->length)) {
                *tok = a;
                return i;
            }
        }
    }
    return len;
}

static int is_space_at(const char *s, size_t len, size_t pos, size_t *next) {
    uint32_t cp;
    *next = pos + utf8_decode(s + pos, len - pos, &cp);
    return uc_class(cp) == UC_SPACE;
}

// lstrip: where the whitespace that ends s[from..to) begins.
static size_t whitespace_tail_start(const char *s, size_t from, size_t to) {
    size_t start = from, next;
    for (size_t pos = from; pos < to; pos = next)
        if (!is_space_at(s, to, pos, &next)) start = next;
    return start;
}

// rstrip: the end of the whitespace that starts at s[pos].
static size_t whitespace_run_end(const char *s, size_t len, size_t pos) {
    size_t next;
    while (pos < len && is_space_at(s, len, pos, &next)) pos = next;
    return pos;
}

// Emits the added tokens of set found in s and hands the stretches between them to gap.
static void split_added(Encoder *e, const AddedTokenSet *set, const char *s, size_t len, StretchFn gap) {
    size_t done = 0;  // end of the last match
    for (;;) {
        const AddedToken *tok = NULL;
        size_t start = find_added(set, s, len, done, &tok);
        if (start == len) break;
        size_t stop = start + tok->length;
        if (tok->lstrip) start = whitespace_tail_start(s, done, start);
        if (tok->rstrip) stop = whitespace_run_end(s, len, stop);
        if (done < start) gap(e, s + done, start - done);
        idvec_push(&e->ids, tok->id);
        done = stop;
    }
    if (done < len) gap(e, s + done, len - done);
}

// A stretch of raw text between added tokens of the first pass.
static void raw_stretch(Encoder *e, const char *s, size_t len) {
    const Tokenizer *t = e->t;
    if (!t->nfc) {
        split_added(e, &t->normalized_set, s, len, plain_stretch);
        return;
    }
    size_t n;
    char *normalized = uc_nfc(s, len, &n);
    split_added(e, &t->normalized_set, normalized, n, plain_stretch);
    free(normalized);
}

// ---- public --------------------------------------------------------------------------

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids) {
    Encoder e = {.t = t, .scratch = bpe_scratch_new()};
    for (int i = 0; i < t->prefix_count; i++) idvec_push(&e.ids, t->prefix_ids[i]);
    split_added(&e, &t->raw_set, text, len, raw_stretch);
    for (int i = 0; i < t->suffix_count; i++) idvec_push(&e.ids, t->suffix_ids[i]);
    bpe_scratch_free(e.scratch);
    free(e.prefixed);
    if (e.ids.n > INT32_MAX) mt_die("tokenizer: the text is too long (%zu tokens)", e.ids.n);
    if (!e.ids.v) e.ids.v = mt_malloc(sizeof(int32_t));
    *ids = e.ids.v;
    return (int)e.ids.n;
}

const char *tokenizer_token_bytes(const Tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->vocab_size) {
        *len = 0;
        return "";
    }
    *len = t->decoded_offset[id + 1] - t->decoded_offset[id];
    return t->decoded + t->decoded_offset[id];
}

size_t tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n, char *out, size_t cap) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t len;
        const char *bytes = tokenizer_token_bytes(t, ids[i], &len);
        if (total < cap) memcpy(out + total, bytes, MT_MIN(len, cap - total));
        total += len;
    }
    if (cap) out[MT_MIN(total, cap - 1)] = 0;
    return total;
}

int tokenizer_vocab_size(const Tokenizer *t) { return t->vocab_size; }

int tokenizer_token_id(const Tokenizer *t, const char *token) {
    size_t len = strlen(token);
    for (int i = 0; i < t->added_count; i++)
        if (t->added[i].length == len && !memcmp(t->added[i].content, token, len)) return t->added[i].id;
    return strmap_get(&t->bpe.vocab, token, len);
}

int tokenizer_is_special(const Tokenizer *t, int32_t id) {
    for (int i = 0; i < t->added_count; i++)
        if (t->added[i].id == id) return t->added[i].special;
    return 0;
}

int tokenizer_end_of_text_ids(const Tokenizer *t, int32_t *ids) {
    static const char *const names[TOKENIZER_MAX_END_IDS] = {"<|endoftext|>", "</s>", "<|im_end|>", "<|end_of_text|>",
                                                             "<|eot_id|>"};
    int n = 0;
    for (int i = 0; i < TOKENIZER_MAX_END_IDS; i++) {
        int id = tokenizer_token_id(t, names[i]);
        if (id >= 0) ids[n++] = id;
    }
    return n;
}

int tokenizer_end_of_text_id(const Tokenizer *t) {
    int32_t ids[TOKENIZER_MAX_END_IDS];
    return tokenizer_end_of_text_ids(t, ids) ? ids[0] : -1;
}

int tokenizer_bos_id(const Tokenizer *t) { return t->prefix_count ? t->prefix_ids[0] : -1; }

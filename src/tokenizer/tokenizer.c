// tokenizer.c — encode and decode with a loaded tokenizer (see tokenizer.h).
//
// encode(text):
//   1. added tokens with normalized=false are found in the raw text (leftmost, longest
//      first); lstrip/rstrip widen a match over the whitespace beside it, single_word drops
//      a match with a word character beside it;
//   2. each stretch between them is normalized (the normalizer's steps, or SentencePiece's
//      normalizer), and added tokens with normalized=true (SentencePiece's user-defined
//      pieces) are found in it the same way;
//   3. each remaining stretch is split by the Split patterns (each on the pieces of the one
//      before), each piece gets the final pre-tokenizer (ByteLevel: a prefix space when
//      add_prefix_space and the piece does not start with one, the GPT-2 pattern when
//      use_regex; Metaspace: spaces replaced, the replacement prepended, a piece per word),
//      and each final piece goes through the model (BPE merges or Unigram's best path);
//   4. the post-processor's tokens go before and after.
// NullTokenizer's text is its ids in decimal (tokenizer_null.c).
#include <string.h>

#include "core/common.h"
#include "tokenizer/sp_normalizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unigram.h"

typedef struct {
    const Tokenizer *t;
    BpeScratch *scratch;
    IdVec ids;
    char *piece;  // a piece rewritten by the pre-tokenizer (prefix space, metaspace)
    size_t piece_cap;
} Encoder;

// starts_text: the stretch begins at the first byte of the text (Metaspace's "first").
typedef void (*StretchFn)(Encoder *e, const char *s, size_t len, int starts_text);

// ---- step 3 --------------------------------------------------------------------------

static void model_piece(Encoder *e, const char *s, size_t len) {
    if (!len) return;
    if (e->t->unigram) unigram_encode(e->t->unigram, s, len, &e->ids);
    else bpe_encode_piece(&e->t->bpe, (const unsigned char *)s, len, e->scratch, &e->ids);
}

// e->piece with room for n bytes.
static char *piece_buffer(Encoder *e, size_t n) {
    if (e->piece_cap < n) {
        e->piece_cap = 2 * n;
        e->piece = mt_realloc(e->piece, e->piece_cap);
    }
    return e->piece;
}

static void byte_level_piece(Encoder *e, const char *s, size_t len) {
    const Tokenizer *t = e->t;
    if (!len) return;
    if (t->add_prefix_space && s[0] != ' ') {
        char *p = piece_buffer(e, len + 1);
        p[0] = ' ';
        memcpy(p + 1, s, len);
        s = p;
        len++;
    }
    if (!t->use_regex) {
        model_piece(e, s, len);
        return;
    }
    for (size_t pos = 0, end; pos < len; pos = end) {
        end = pretok_next(PRETOK_GPT2, s, len, pos);
        model_piece(e, s + pos, end - pos);
    }
}

// Metaspace: every ' ' becomes the replacement, which is prepended (scheme "always", or
// "first" on the text's first stretch) unless the piece starts with it; with split=true a
// new piece starts at each replacement.
static void metaspace_piece(Encoder *e, const char *s, size_t len, int starts_text) {
    const Tokenizer *t = e->t;
    const char *rep = t->metaspace;
    size_t rep_len = t->metaspace_len, spaces = 0;
    if (!len) return;
    for (size_t i = 0; i < len; i++) spaces += s[i] == ' ';
    char *p = piece_buffer(e, len + (spaces + 1) * rep_len);
    size_t n = 0;
    int starts_with_rep = (len >= rep_len && !memcmp(s, rep, rep_len)) || s[0] == ' ';
    int prepend = !starts_with_rep && (t->prepend_scheme == PREPEND_ALWAYS ||
                                       (t->prepend_scheme == PREPEND_FIRST && starts_text));
    if (prepend) memcpy(p, rep, rep_len), n = rep_len;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') memcpy(p + n, rep, rep_len), n += rep_len;
        else p[n++] = s[i];
    }
    if (!t->metaspace_split) {
        model_piece(e, p, n);
        return;
    }
    size_t start = 0;
    for (size_t i = rep_len; i + rep_len <= n; i++)
        if (!memcmp(p + i, rep, rep_len)) {
            model_piece(e, p + start, i - start);
            start = i;
        }
    model_piece(e, p + start, n - start);
}

static void final_piece(Encoder *e, const char *s, size_t len, int starts_text) {
    switch (e->t->pre) {
    case PRE_BYTE_LEVEL: byte_level_piece(e, s, len); break;
    case PRE_METASPACE: metaspace_piece(e, s, len, starts_text); break;
    default: model_piece(e, s, len); break;
    }
}

// The Split patterns from `level` on, then the final pre-tokenizer.
static void split_level(Encoder *e, int level, const char *s, size_t len, int starts_text) {
    if (level >= e->t->n_splits || level >= TOKENIZER_MAX_SPLITS) {
        final_piece(e, s, len, starts_text);
        return;
    }
    for (size_t pos = 0, end; pos < len; pos = end) {
        end = pretok_next(e->t->splits[level], s, len, pos);
        split_level(e, level + 1, s + pos, end - pos, starts_text && pos == 0);
    }
}

// A normalized stretch without added tokens.
static void plain_stretch(Encoder *e, const char *s, size_t len, int starts_text) {
    split_level(e, 0, s, len, starts_text);
}

// ---- added tokens --------------------------------------------------------------------

// The leftmost position >= from where a token of set matches, with the longest such token
// in *tok; len when there is none.
static size_t find_added(const AddedTokenSet *set, const char *s, size_t len, size_t from, const AddedToken **tok) {
    if (!set->count) return len;
    for (size_t i = from; i < len; i++)
        if ((*tok = added_token_at(set, s, len, i))) return i;
    return len;
}

const AddedToken *added_token_at(const AddedTokenSet *set, const char *s, size_t len, size_t pos) {
    if (pos >= len) return NULL;
    unsigned char b = (unsigned char)s[pos];
    for (int k = set->first[b]; k < set->first[b + 1]; k++) {
        const AddedToken *a = set->tokens[k];
        if (a->length <= len - pos && !memcmp(s + pos, a->content, a->length)) return a;
    }
    return NULL;
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

// The last character of s[0..end) is a word character (\\w).
static int word_before(const char *s, size_t end) {
    if (!end) return 0;
    size_t start = end - 1;
    while (start > 0 && end - start < 4 && ((unsigned char)s[start] & 0xC0) == 0x80) start--;
    uint32_t cp;
    if (start + utf8_decode(s + start, end - start, &cp) != end) cp = UC_INVALID;
    return uc_is_word(cp);
}

static int word_after(const char *s, size_t len, size_t pos) {
    uint32_t cp;
    if (pos >= len) return 0;
    utf8_decode(s + pos, len - pos, &cp);
    return uc_is_word(cp);
}

// Emits the added tokens of set found in s and hands the stretches between them to gap. A
// single_word match with a word character beside it is no match, and the search goes on
// after it (as the library's non-overlapping scan does).
static void split_added(Encoder *e, const AddedTokenSet *set, const char *s, size_t len, int starts_text,
                        StretchFn gap) {
    size_t done = 0, from = 0;  // end of the last match; where the search goes on
    for (;;) {
        const AddedToken *tok = NULL;
        size_t start = find_added(set, s, len, from, &tok);
        if (start == len) break;
        size_t stop = start + tok->length;
        from = stop;
        if (tok->single_word && (word_before(s, start) || word_after(s, len, stop))) continue;
        if (tok->lstrip) start = whitespace_tail_start(s, done, start);
        if (tok->rstrip) stop = whitespace_run_end(s, len, stop);
        if (done < start) gap(e, s + done, start - done, starts_text && done == 0);
        idvec_push(&e->ids, tok->id);
        done = from = stop;
    }
    if (done < len) gap(e, s + done, len - done, starts_text && done == 0);
}

// a[0..na) followed by b[0..nb), malloc'ed and NUL-terminated; *len its length.
static char *str_concat(const char *a, size_t na, const char *b, size_t nb, size_t *len) {
    char *out = mt_malloc(na + nb + 1);
    memcpy(out, a, na);
    memcpy(out + na, b, nb);
    out[*len = na + nb] = 0;
    return out;
}

// s[0..n) with every occurrence of from (non-empty; left to right, not overlapping) replaced
// by to; malloc'ed and NUL-terminated, *len its length.
static char *str_replace_all(const char *s, size_t n, const char *from, size_t from_len, const char *to, size_t to_len,
                             size_t *len) {
    size_t count = 0;
    for (size_t i = 0; i + from_len <= n;)
        if (!memcmp(s + i, from, from_len)) count++, i += from_len;
        else i++;
    char *out = mt_malloc(n + count * to_len + 1), *o = out;
    for (size_t i = 0; i < n;)
        if (i + from_len <= n && !memcmp(s + i, from, from_len)) memcpy(o, to, to_len), o += to_len, i += from_len;
        else *o++ = s[i++];
    *o = 0;
    *len = (size_t)(o - out);
    return out;
}

// The normalizer's steps on s[0..len): a malloc'ed, NUL-terminated result in *out_len.
static char *normalize_steps(const Tokenizer *t, const char *s, size_t len, size_t *out_len) {
    char *text = mt_malloc(len + 1);
    memcpy(text, s, len);
    text[len] = 0;
    for (int i = 0; i < t->n_norm; i++) {
        const NormStep *step = &t->norm[i];
        char *next = NULL;
        if (step->kind == NORM_NFC) next = uc_nfc(text, len, &len);
        else if (step->kind == NORM_PREPEND && len) next = str_concat(step->text, step->text_len, text, len, &len);
        else if (step->kind == NORM_REPLACE)
            next = str_replace_all(text, len, step->text, step->text_len, step->content, step->content_len, &len);
        if (next) free(text), text = next;
    }
    *out_len = len;
    return text;
}

// A stretch of raw text between added tokens of the first pass.
static void raw_stretch(Encoder *e, const char *s, size_t len, int starts_text) {
    const Tokenizer *t = e->t;
    if (!t->n_norm && !t->sp_norm) {
        split_added(e, &t->normalized_set, s, len, starts_text, plain_stretch);
        return;
    }
    size_t n;
    char *normalized = t->sp_norm ? sp_normalize(t->sp_norm, s, len, &n) : normalize_steps(t, s, len, &n);
    split_added(e, &t->normalized_set, normalized, n, starts_text, plain_stretch);
    free(normalized);
}

// ---- public --------------------------------------------------------------------------

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids) {
    Encoder e = {.t = t};
    if (t->kind == TOKENIZER_NULL) {
        null_tokenizer_encode(t, text, len, &e.ids);
    } else {
        e.scratch = bpe_scratch_new();
        for (int i = 0; i < t->prefix_count; i++) idvec_push(&e.ids, t->prefix_ids[i]);
        split_added(&e, &t->raw_set, text, len, 1, raw_stretch);
        for (int i = 0; i < t->suffix_count; i++) idvec_push(&e.ids, t->suffix_ids[i]);
        bpe_scratch_free(e.scratch);
        free(e.piece);
    }
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
        if (t->decode_strip_space && !total && len && bytes[0] == ' ') bytes++, len--;
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
    if (t->eos_id >= 0) {  // SentencePiece's eos_id, NullTokenizer's vocab_size - 1
        ids[0] = t->eos_id;
        return 1;
    }
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

int tokenizer_bos_id(const Tokenizer *t) { return t->prefix_count ? t->prefix_ids[0] : t->bos_id; }

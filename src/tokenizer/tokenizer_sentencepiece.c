// tokenizer_sentencepiece.c — a Tokenizer from a SentencePiece model file (sp_model.h), for
// --tokenizer-type SentencePieceTokenizer / Llama2Tokenizer. Encoding follows the
// sentencepiece library:
//   * the text is normalized as a whole (sp_normalizer.h);
//   * user-defined pieces are matched first, as added tokens of the normalized text;
//   * BPE: symbols start as characters and the adjacent pair whose concatenation is the
//     piece of highest score merges first (the leftmost among equal scores). That is the
//     BPE merge loop of bpe.c with a merge (left, right) -> piece for every split of every
//     piece into two pieces, ranked by the piece's score;
//   * UNIGRAM: the best path over the piece scores (unigram.h);
//   * an unknown character is the UNKNOWN piece (one for a run of them), or with
//     byte_fallback its bytes' pieces.
// Refused with one line: WORD / CHAR models, treat_whitespace_as_suffix, UNUSED pieces in a
// BPE model, duplicate pieces, a model without an UNKNOWN piece.
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "tokenizer/sp_model.h"
#include "tokenizer/sp_normalizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unigram.h"

#define SP_DIE(path, fmt, ...) mt_die("tokenizer %s: " fmt, path, ##__VA_ARGS__)
static const char SPACE_SYMBOL[] = "\xE2\x96\x81";  // U+2581, what escape_whitespaces writes for ' '

static const char *shown(const SpPiece *p, char *buf, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < p->len && n + 4 < cap; i++) buf[n++] = (unsigned char)p->text[i] < 0x20 ? '?' : p->text[i];
    buf[n] = 0;
    return buf;
}

static int is_vocab_piece(int type) { return type == SP_NORMAL || type == SP_USER_DEFINED; }

static void add_user_defined(Tokenizer *t, const SpPiece *p, int32_t id) {
    t->added = mt_realloc(t->added, (size_t)(t->added_count + 1) * sizeof(AddedToken));
    AddedToken *a = &t->added[t->added_count++];
    *a = (AddedToken){.content = mt_malloc(p->len + 1), .length = p->len, .id = id, .normalized = 1};
    memcpy(a->content, p->text, p->len);
    a->content[p->len] = 0;
}

static void add_piece(Tokenizer *t, const SpModelProto *m, int32_t id, const char *path) {
    const SpPiece *p = &m->pieces[id];
    char buf[64];
    if (p->type < SP_NORMAL || p->type > SP_BYTE) SP_DIE(path, "piece %d has an unknown type", id);
    if (!p->len) SP_DIE(path, "piece %d is empty", id);
    if (!strmap_put(&t->bpe.vocab, p->text, p->len, id))
        SP_DIE(path, "piece \"%s\" appears twice", shown(p, buf, sizeof buf));
    if (is_vocab_piece(p->type) && t->unigram)
        unigram_add_piece(t->unigram, p->text, p->len, id, p->score, p->type == SP_USER_DEFINED);
    if (p->type == SP_USER_DEFINED) add_user_defined(t, p, id);
    if (p->type == SP_CONTROL) t->control[id] = 1;
    if (p->type == SP_UNUSED && !t->unigram)
        SP_DIE(path, "piece \"%s\" is UNUSED, which moetron supports only in Unigram models", shown(p, buf, sizeof buf));
    if (p->type == SP_UNKNOWN) {
        if (t->bpe.unk_id >= 0) SP_DIE(path, "more than one UNKNOWN piece (%d and %d)", t->bpe.unk_id, id);
        t->bpe.unk_id = id;
    }
    if (p->type == SP_BYTE) {
        int b = tokenizer_fallback_byte(p->text, p->len);
        if (b < 0) SP_DIE(path, "BYTE piece \"%s\" is not of the form <0xXX>", shown(p, buf, sizeof buf));
        t->bpe.fallback_id[b] = id;
    }
}

typedef struct {
    float score;
    int32_t id;
} Ranked;

static int by_score(const void *x, const void *y) {
    const Ranked *a = x, *b = y;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return a->id - b->id;
}

// BPE: a merge for each split of each vocabulary piece into two vocabulary pieces, ranked by
// the piece's score (equal scores, equal rank).
static void derive_merges(Tokenizer *t, const SpModelProto *m) {
    Ranked *order = mt_malloc((size_t)m->n_pieces * sizeof(Ranked));
    int n = 0;
    for (int32_t id = 0; id < m->n_pieces; id++)
        if (is_vocab_piece(m->pieces[id].type)) order[n++] = (Ranked){m->pieces[id].score, id};
    qsort(order, (size_t)n, sizeof(Ranked), by_score);
    int32_t rank = 0;
    for (int i = 0; i < n; i++) {
        if (i && order[i].score != order[i - 1].score) rank = i;
        const SpPiece *p = &m->pieces[order[i].id];
        uint32_t cp;
        for (size_t k = utf8_decode(p->text, p->len, &cp); k < p->len; k += utf8_decode(p->text + k, p->len - k, &cp)) {
            int32_t left = strmap_get(&t->bpe.vocab, p->text, k), right = strmap_get(&t->bpe.vocab, p->text + k, p->len - k);
            if (left >= 0 && right >= 0 && is_vocab_piece(m->pieces[left].type) && is_vocab_piece(m->pieces[right].type))
                bpe_add_merge(&t->bpe, left, right, rank, order[i].id);
        }
    }
    free(order);
}

// The id of the CONTROL or USER_DEFINED piece named text, or -1.
static int32_t special_piece(const SpModelProto *m, const char *text, size_t len) {
    for (int32_t id = 0; id < m->n_pieces; id++) {
        const SpPiece *p = &m->pieces[id];
        if ((p->type == SP_CONTROL || p->type == SP_USER_DEFINED) && p->len == len && !memcmp(p->text, text, len))
            return id;
    }
    return -1;
}

static void set_decoding(Tokenizer *t, const SpModelProto *m) {
    t->decode = DECODE_METASPACE;
    memcpy(t->decode_space, SPACE_SYMBOL, sizeof SPACE_SYMBOL - 1);
    t->decode_space_len = sizeof SPACE_SYMBOL - 1;
    t->decode_byte_fallback = 1;
    t->decode_strip_space = m->add_dummy_prefix;
    t->unk_surface = mt_malloc(m->unk_surface_len + 1);
    memcpy(t->unk_surface, m->unk_surface, m->unk_surface_len);
    t->unk_surface_len = m->unk_surface_len;
}

static void check_model(const SpModelProto *m, const char *path) {
    if (!m->n_pieces) SP_DIE(path, "the SentencePiece model has no pieces");
    if (m->model_type != SP_MODEL_BPE && m->model_type != SP_MODEL_UNIGRAM)
        SP_DIE(path, "trainer_spec.model_type %d is not supported (only UNIGRAM = 1 and BPE = 2)", m->model_type);
    if (m->treat_whitespace_as_suffix) SP_DIE(path, "trainer_spec.treat_whitespace_as_suffix=true is not supported");
}

Tokenizer *tokenizer_parse_sentencepiece(const uint8_t *bytes, size_t len, const char *path) {
    SpModelProto m;
    char err[256];
    if (sp_model_parse(bytes, len, &m, err, sizeof err)) {
        sp_model_free(&m);
        SP_DIE(path, "not a SentencePiece model file (%s)", err);
    }
    Tokenizer *t = tokenizer_new(TOKENIZER_SENTENCEPIECE);
    // Held by t from here on, so that a fatal error below leaves nothing unreachable.
    t->sp_model_pieces = m.pieces;
    check_model(&m, path);
    t->vocab_size = m.n_pieces;
    t->control = mt_calloc((size_t)m.n_pieces, 1);
    if (m.model_type == SP_MODEL_UNIGRAM) t->unigram = unigram_new(m.n_pieces);
    for (int32_t id = 0; id < m.n_pieces; id++) add_piece(t, &m, id, path);
    if (t->bpe.unk_id < 0) SP_DIE(path, "the SentencePiece model has no UNKNOWN piece");
    t->bpe.char_level = 1;
    t->bpe.fuse_unk = 1;  // a run of unknown characters is one unknown piece, as sentencepiece encodes it
    t->bpe.byte_fallback = m.byte_fallback;
    if (t->unigram) {
        t->unigram->unk_id = t->bpe.unk_id;
        t->unigram->byte_fallback = m.byte_fallback;
        memcpy(t->unigram->byte_id, t->bpe.fallback_id, sizeof t->unigram->byte_id);
    } else {
        derive_merges(t, &m);
    }
    SpNormalizerFlags flags = {m.add_dummy_prefix, m.remove_extra_whitespaces, m.escape_whitespaces};
    t->sp_norm = sp_normalizer_new(flags, m.charsmap, m.charsmap_len, err, sizeof err);
    if (!t->sp_norm) SP_DIE(path, "%s", err);
    tokenizer_index_added(t);
    sp_normalizer_set_user_defined(t->sp_norm, &t->normalized_set);
    t->bos_id = special_piece(&m, m.bos_piece, m.bos_len);
    t->eos_id = special_piece(&m, m.eos_piece, m.eos_len);
    set_decoding(t, &m);
    tokenizer_build_decode_table(t);
    t->sp_model_pieces = NULL;
    sp_model_free(&m);
    return t;
}

Tokenizer *tokenizer_load_sentencepiece(const char *path) {
    char err[256];
    size_t len;
    uint8_t *bytes = read_file_all(path, INFILE_CONFIG, &len, err, sizeof err);
    if (!bytes) SP_DIE(path, "%s", err);
    Tokenizer *t = tokenizer_parse_sentencepiece(bytes, len, path);
    free(bytes);
    return t;
}

// sp_model.c — the protobuf wire format of sentencepiece_model.proto, read by hand (see
// sp_model.h). Wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32; groups (3,
// 4) do not occur in this schema and are rejected.
#include "tokenizer/sp_model.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };
#define VARINT_MAX_BYTES 10

// ModelProto, ModelProto.SentencePiece, TrainerSpec and NormalizerSpec field numbers.
enum { MODEL_PIECES = 1, MODEL_TRAINER_SPEC = 2, MODEL_NORMALIZER_SPEC = 3 };
enum { PIECE_TEXT = 1, PIECE_SCORE = 2, PIECE_TYPE = 3 };
enum {
    TRAINER_MODEL_TYPE = 3, TRAINER_TREAT_WHITESPACE_AS_SUFFIX = 24, TRAINER_BYTE_FALLBACK = 35,
    TRAINER_UNK_SURFACE = 44, TRAINER_BOS_PIECE = 46, TRAINER_EOS_PIECE = 47
};
enum { NORM_CHARSMAP = 2, NORM_ADD_DUMMY_PREFIX = 3, NORM_REMOVE_EXTRA_WHITESPACES = 4, NORM_ESCAPE_WHITESPACES = 5 };

typedef struct {
    const uint8_t *p, *end;
    char *err;
    size_t errlen;
} Reader;

typedef struct {
    uint32_t number;
    int wire;
    uint64_t varint;        // WIRE_VARINT, WIRE_FIXED32, WIRE_FIXED64
    const uint8_t *bytes;   // WIRE_BYTES
    size_t len;
} Field;

static int fail(Reader *r, const char *what) {
    snprintf(r->err, r->errlen, "%s", what);
    return -1;
}

static int read_varint(Reader *r, uint64_t *v) {
    *v = 0;
    for (int i = 0; i < VARINT_MAX_BYTES; i++) {
        if (r->p >= r->end) return fail(r, "truncated varint");
        uint8_t b = *r->p++;
        *v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) return 0;
    }
    return fail(r, "varint longer than 10 bytes");
}

static int read_fixed(Reader *r, int bytes, uint64_t *v) {
    if (r->end - r->p < bytes) return fail(r, "truncated fixed-width field");
    *v = 0;
    for (int i = 0; i < bytes; i++) *v |= (uint64_t)r->p[i] << (8 * i);
    r->p += bytes;
    return 0;
}

// The next field of the message being read; 1 when there is one, 0 at its end, -1 on error.
static int next_field(Reader *r, Field *f) {
    if (r->p >= r->end) return 0;
    uint64_t key;
    if (read_varint(r, &key)) return -1;
    f->number = (uint32_t)(key >> 3);
    f->wire = (int)(key & 7);
    if (!f->number || key >> 32) return fail(r, "invalid field number"), -1;
    switch (f->wire) {
    case WIRE_VARINT: return read_varint(r, &f->varint) ? -1 : 1;
    case WIRE_FIXED64: return read_fixed(r, 8, &f->varint) ? -1 : 1;
    case WIRE_FIXED32: return read_fixed(r, 4, &f->varint) ? -1 : 1;
    case WIRE_BYTES:
        if (read_varint(r, &f->varint)) return -1;
        if (f->varint > (uint64_t)(r->end - r->p)) return fail(r, "length-delimited field runs past the end"), -1;
        f->bytes = r->p;
        f->len = (size_t)f->varint;
        r->p += f->len;
        return 1;
    default: return fail(r, "unsupported wire type (group)"), -1;
    }
}

static int expect_wire(Reader *r, const Field *f, int wire, const char *name) {
    if (f->wire == wire) return 0;
    char what[96];
    snprintf(what, sizeof what, "%s has the wrong wire type %d", name, f->wire);
    return fail(r, what);
}

static Reader sub_reader(const Reader *r, const Field *f) {
    return (Reader){.p = f->bytes, .end = f->bytes + f->len, .err = r->err, .errlen = r->errlen};
}

static float float_of_bits(uint32_t bits) {
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static int parse_piece(Reader *r, SpPiece *piece) {
    *piece = (SpPiece){.text = "", .type = SP_NORMAL};
    Field f;
    int more;
    while ((more = next_field(r, &f)) > 0) {
        if (f.number == PIECE_TEXT) {
            if (expect_wire(r, &f, WIRE_BYTES, "piece")) return -1;
            piece->text = (const char *)f.bytes, piece->len = f.len;
        } else if (f.number == PIECE_SCORE) {
            if (expect_wire(r, &f, WIRE_FIXED32, "score")) return -1;
            piece->score = float_of_bits((uint32_t)f.varint);
        } else if (f.number == PIECE_TYPE) {
            if (expect_wire(r, &f, WIRE_VARINT, "type")) return -1;
            piece->type = f.varint > SP_BYTE ? 0 : (int)f.varint;
        }
    }
    return more;
}

static int parse_trainer_spec(Reader *r, SpModelProto *m) {
    Field f;
    int more;
    while ((more = next_field(r, &f)) > 0) {
        switch (f.number) {
        case TRAINER_MODEL_TYPE:
            if (expect_wire(r, &f, WIRE_VARINT, "trainer_spec.model_type")) return -1;
            m->model_type = f.varint > SP_MODEL_CHAR ? 0 : (int)f.varint;
            break;
        case TRAINER_TREAT_WHITESPACE_AS_SUFFIX:
        case TRAINER_BYTE_FALLBACK:
            if (expect_wire(r, &f, WIRE_VARINT, "a trainer_spec flag")) return -1;
            *(f.number == TRAINER_BYTE_FALLBACK ? &m->byte_fallback : &m->treat_whitespace_as_suffix) = f.varint != 0;
            break;
        case TRAINER_UNK_SURFACE:
        case TRAINER_BOS_PIECE:
        case TRAINER_EOS_PIECE:
            if (expect_wire(r, &f, WIRE_BYTES, "a trainer_spec piece name")) return -1;
            if (f.number == TRAINER_UNK_SURFACE) m->unk_surface = (const char *)f.bytes, m->unk_surface_len = f.len;
            else if (f.number == TRAINER_BOS_PIECE) m->bos_piece = (const char *)f.bytes, m->bos_len = f.len;
            else m->eos_piece = (const char *)f.bytes, m->eos_len = f.len;
            break;
        default: break;
        }
    }
    return more;
}

static int parse_normalizer_spec(Reader *r, SpModelProto *m) {
    Field f;
    int more;
    while ((more = next_field(r, &f)) > 0) {
        if (f.number == NORM_CHARSMAP) {
            if (expect_wire(r, &f, WIRE_BYTES, "normalizer_spec.precompiled_charsmap")) return -1;
            m->charsmap = f.bytes, m->charsmap_len = f.len;
        } else if (f.number >= NORM_ADD_DUMMY_PREFIX && f.number <= NORM_ESCAPE_WHITESPACES) {
            if (expect_wire(r, &f, WIRE_VARINT, "a normalizer_spec flag")) return -1;
            int on = f.varint != 0;
            if (f.number == NORM_ADD_DUMMY_PREFIX) m->add_dummy_prefix = on;
            else if (f.number == NORM_REMOVE_EXTRA_WHITESPACES) m->remove_extra_whitespaces = on;
            else m->escape_whitespaces = on;
        }
    }
    return more;
}

#define MAX_PIECES (1 << 24)

int sp_model_parse(const uint8_t *data, size_t len, SpModelProto *m, char *err, size_t errlen) {
    static const char default_unk_surface[] = " \xE2\x81\x87 ";  // " ⁇ "
    *m = (SpModelProto){.model_type = SP_MODEL_UNIGRAM, .bos_piece = "<s>", .bos_len = 3, .eos_piece = "</s>",
                        .eos_len = 4, .unk_surface = default_unk_surface,
                        .unk_surface_len = sizeof default_unk_surface - 1, .add_dummy_prefix = 1,
                        .remove_extra_whitespaces = 1, .escape_whitespaces = 1};
    Reader r = {.p = data, .end = data + len, .err = err, .errlen = errlen};
    Field f;
    int more, cap = 0;
    while ((more = next_field(&r, &f)) > 0) {
        if (f.number < MODEL_PIECES || f.number > MODEL_NORMALIZER_SPEC) continue;
        if (expect_wire(&r, &f, WIRE_BYTES, "a ModelProto message")) return -1;
        Reader sub = sub_reader(&r, &f);
        if (f.number == MODEL_PIECES) {
            if (m->n_pieces == MAX_PIECES) return fail(&r, "more than 16777216 pieces");
            if (m->n_pieces == cap) {
                cap = cap ? 2 * cap : 1024;
                m->pieces = mt_realloc(m->pieces, (size_t)cap * sizeof(SpPiece));
            }
            more = parse_piece(&sub, &m->pieces[m->n_pieces++]);
        } else {
            more = f.number == MODEL_TRAINER_SPEC ? parse_trainer_spec(&sub, m) : parse_normalizer_spec(&sub, m);
        }
        if (more < 0) return -1;
    }
    return more;
}

void sp_model_free(SpModelProto *m) {
    free(m->pieces);
    m->pieces = NULL;
}

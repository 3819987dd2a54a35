// sp_model.h — SentencePiece's model file (a serialized ModelProto protobuf, the
// tokenizer.model of Llama-2 / Mistral / Mixtral), read by hand: the pieces (text, score,
// type), trainer_spec's model_type, byte_fallback and bos/eos piece names, and the
// normalizer_spec. Fields moetron does not use are skipped by their wire type.
#pragma once
#include <stddef.h>
#include <stdint.h>

// ModelProto.SentencePiece.Type
enum { SP_NORMAL = 1, SP_UNKNOWN = 2, SP_CONTROL = 3, SP_USER_DEFINED = 4, SP_UNUSED = 5, SP_BYTE = 6 };
// TrainerSpec.ModelType
enum { SP_MODEL_UNIGRAM = 1, SP_MODEL_BPE = 2, SP_MODEL_WORD = 3, SP_MODEL_CHAR = 4 };

typedef struct {
    const char *text;  // points into the file's bytes (not NUL-terminated)
    size_t len;
    float score;
    int type;
} SpPiece;

typedef struct {
    SpPiece *pieces;
    int n_pieces;
    int model_type;
    int byte_fallback;
    int treat_whitespace_as_suffix;
    const char *bos_piece, *eos_piece, *unk_surface;  // into the file's bytes, or defaults
    size_t bos_len, eos_len, unk_surface_len;
    int add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces;
    const uint8_t *charsmap;  // normalizer_spec.precompiled_charsmap (into the file's bytes)
    size_t charsmap_len;
} SpModelProto;

// Parses data[0..len) (which must outlive *m). Returns 0, or -1 with a one-line reason in
// err (a truncated or malformed protobuf, a field of the wrong wire type).
int sp_model_parse(const uint8_t *data, size_t len, SpModelProto *m, char *err, size_t errlen);
void sp_model_free(SpModelProto *m);  // the pieces array

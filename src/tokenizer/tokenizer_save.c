// tokenizer_save.c — a trained byte-level BPE vocabulary as a Hugging Face tokenizer.json
// (see bpe_train.h), loadable by `tokenizers` and by tokenizer_load.
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"
#include "tokenizer/bpe.h"
#include "tokenizer/bpe_train.h"
#include "tokenizer/unicode.h"

// Token id's bytes in the byte-level alphabet (each byte one character), into out (grown).
static const char *alphabet_text(const BpeVocab *v, int id, char **out, size_t *cap) {
    size_t n = v->offset[id + 1] - v->offset[id];
    if (*cap < 2 * n + 1) {  // every character of the alphabet takes 1 or 2 UTF-8 bytes
        *cap = 2 * n + 64;
        *out = mt_realloc(*out, *cap);
    }
    size_t len = 0;
    for (size_t i = 0; i < n; i++) len += utf8_encode(byte_level_char((unsigned char)v->bytes[v->offset[id] + i]), *out + len);
    (*out)[len] = 0;
    return *out;
}

static void write_byte_level(JsonWriter *w, const char *key, int add_prefix_space) {
    jw_key(w, key);
    jw_begin_object(w);
    jw_kv_string(w, "type", "ByteLevel");
    jw_kv_bool(w, "add_prefix_space", add_prefix_space);
    jw_kv_bool(w, "trim_offsets", 1);
    jw_kv_bool(w, "use_regex", 1);
    jw_end_object(w);
}

static void write_added_token(JsonWriter *w, int id, const char *content) {
    jw_begin_object(w);
    jw_kv_int(w, "id", id);
    jw_kv_string(w, "content", content);
    jw_kv_bool(w, "single_word", 0);
    jw_kv_bool(w, "lstrip", 0);
    jw_kv_bool(w, "rstrip", 0);
    jw_kv_bool(w, "normalized", 0);
    jw_kv_bool(w, "special", 1);
    jw_end_object(w);
}

static void write_model(JsonWriter *w, const BpeVocab *v, const char *special) {
    jw_key(w, "model");
    jw_begin_object(w);
    jw_kv_string(w, "type", "BPE");
    jw_key(w, "dropout");
    jw_null(w);
    jw_key(w, "unk_token");
    jw_null(w);
    jw_key(w, "continuing_subword_prefix");
    jw_null(w);
    jw_key(w, "end_of_word_suffix");
    jw_null(w);
    jw_kv_bool(w, "fuse_unk", 0);
    jw_kv_bool(w, "byte_fallback", 0);
    jw_kv_bool(w, "ignore_merges", 0);
    char *text = NULL;
    size_t cap = 0;
    jw_key(w, "vocab");
    jw_begin_object(w);
    for (int id = 0; id < v->n_tokens; id++) {
        jw_key(w, alphabet_text(v, id, &text, &cap));
        jw_int(w, id);
    }
    jw_kv_int(w, special, v->n_tokens);
    jw_end_object(w);
    jw_key(w, "merges");
    jw_begin_array(w);
    for (int k = 0; k < v->n_merges; k++) {
        jw_begin_array(w);
        jw_string(w, alphabet_text(v, v->merges[k][0], &text, &cap));
        jw_string(w, alphabet_text(v, v->merges[k][1], &text, &cap));
        jw_end_array(w);
    }
    jw_end_array(w);
    jw_end_object(w);
    free(text);
}

int bpe_save_tokenizer_json(const BpeVocab *v, const char *special, const char *path, char *err, size_t errlen) {
    JsonWriter w;
    jw_init_compact(&w);
    jw_begin_object(&w);
    jw_kv_string(&w, "version", "1.0");
    jw_key(&w, "truncation");
    jw_null(&w);
    jw_key(&w, "padding");
    jw_null(&w);
    jw_key(&w, "added_tokens");
    jw_begin_array(&w);
    write_added_token(&w, v->n_tokens, special);
    jw_end_array(&w);
    jw_key(&w, "normalizer");
    jw_null(&w);
    write_byte_level(&w, "pre_tokenizer", 0);
    jw_key(&w, "post_processor");
    jw_null(&w);
    write_byte_level(&w, "decoder", 1);
    write_model(&w, v, special);
    jw_end_object(&w);
    int rc = write_file_atomic(path, jw_text(&w), jw_len(&w), err, errlen);
    jw_free(&w);
    return rc;
}

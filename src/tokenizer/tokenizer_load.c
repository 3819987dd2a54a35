// tokenizer_load.c — read and check tokenizer.json (the format is summarised in
// tokenizer.h). Every problem is one fatal line: "tokenizer PATH: <what is wrong>".
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"
#include "tokenizer/sp_normalizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unigram.h"

#define MAX_TOKEN_ID (1 << 24)  // ids at or above this are rejected as out of range

#define TOK_DIE(path, fmt, ...) mt_die("tokenizer %s: " fmt, path, ##__VA_ARGS__)

// A short printable copy of s for error messages: control bytes become '?', long strings
// are cut with "...".
static const char *printable(const char *s, size_t len, char *buf, size_t cap) {
    size_t n = 0, limit = cap - 4;
    for (size_t i = 0; i < len && n < limit; i++) buf[n++] = (unsigned char)s[i] < 0x20 ? '?' : s[i];
    if (len > limit) memcpy(buf + n, "...", 3), n += 3;
    buf[n] = 0;
    return buf;
}

// ---- small typed accessors -----------------------------------------------------------

// The string at key ("" when absent or null); anything else is an error.
static const char *optional_string(const JsonValue *obj, const char *key, const char *where, const char *path) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) return "";
    if (v->type != JSON_STRING) TOK_DIE(path, "%s.%s must be a string", where, key);
    return v->string;
}

static int optional_bool(const JsonValue *obj, const char *key, int fallback, const char *where, const char *path) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) return fallback;
    if (v->type != JSON_BOOL) TOK_DIE(path, "%s.%s must be true or false", where, key);
    return v->boolean;
}

// The "type" of a component object; "" when the component is null or absent.
static const char *component_type(const JsonValue *v, const char *where, const char *path) {
    if (!v || v->type == JSON_NULL) return "";
    if (v->type != JSON_OBJECT) TOK_DIE(path, "%s must be an object or null", where);
    const char *type = json_get_string(v, "type");
    if (!type) TOK_DIE(path, "%s has no \"type\"", where);
    return type;
}

static const JsonValue *array_at(const JsonValue *obj, const char *key, const char *where, const char *path) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type != JSON_ARRAY) TOK_DIE(path, "%s.%s must be an array", where, key);
    return v;
}

// 1 when v is an integer id in 0..MAX_TOKEN_ID-1, stored in *id.
static int valid_id(const JsonValue *v, int32_t *id) {
    int64_t value;
    if (!json_as_int64(v, &value) || value < 0 || value >= MAX_TOKEN_ID) return 0;
    *id = (int32_t)value;
    return 1;
}

static int32_t token_id_value(const JsonValue *v, const char *what, const char *path) {
    int32_t id;
    if (!valid_id(v, &id)) TOK_DIE(path, "%s: the id must be an integer in 0..%d", what, MAX_TOKEN_ID - 1);
    return id;
}

// ---- model ---------------------------------------------------------------------------

static void load_vocab(Tokenizer *t, const JsonValue *vocab, const char *path) {
    if (!vocab || vocab->type != JSON_OBJECT) TOK_DIE(path, "model.vocab must be an object {token: id}");
    if (!vocab->count) TOK_DIE(path, "model.vocab is empty");
    // Ids seen so far, one bit each. Held by t so that a fatal error leaves no unreachable block.
    unsigned char *seen = t->ids_seen = mt_calloc(MAX_TOKEN_ID / 8, 1);
    char shown[96];
    for (size_t i = 0; i < vocab->count; i++) {
        const char *key = vocab->keys[i];
        size_t len = vocab->key_lengths[i];
        int32_t id;
        if (!valid_id(&vocab->items[i], &id))
            TOK_DIE(path, "model.vocab \"%s\": the id must be an integer in 0..%d",
                    printable(key, len, shown, sizeof shown), MAX_TOKEN_ID - 1);
        if (seen[id / 8] & (1 << (id % 8)))
            TOK_DIE(path, "model.vocab: id %d is given to more than one token (again to \"%s\")", id,
                    printable(key, len, shown, sizeof shown));
        seen[id / 8] |= (unsigned char)(1 << (id % 8));
        if (!strmap_put(&t->bpe.vocab, key, len, id))
            TOK_DIE(path, "model.vocab: token \"%s\" appears twice", printable(key, len, shown, sizeof shown));
        t->vocab_size = MT_MAX(t->vocab_size, id + 1);
    }
    free(seen);
    t->ids_seen = NULL;
}

// The two halves of one merge: "left right" or ["left", "right"].
static void merge_halves(const JsonValue *m, size_t index, const char **left, size_t *left_len, const char **right,
                         size_t *right_len, const char *path) {
    if (m->type == JSON_STRING) {
        const char *space = memchr(m->string, ' ', m->length);
        if (!space || memchr(space + 1, ' ', m->length - (size_t)(space + 1 - m->string)))
            TOK_DIE(path, "model.merges[%zu] must be two tokens separated by one space", index);
        *left = m->string, *left_len = (size_t)(space - m->string);
        *right = space + 1, *right_len = m->length - *left_len - 1;
        return;
    }
    if (m->type != JSON_ARRAY || m->count != 2 || m->items[0].type != JSON_STRING || m->items[1].type != JSON_STRING)
        TOK_DIE(path, "model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", index);
    *left = m->items[0].string, *left_len = m->items[0].length;
    *right = m->items[1].string, *right_len = m->items[1].length;
}

static int32_t vocab_id_or_die(const Tokenizer *t, const char *s, size_t len, size_t index, const char *path) {
    int32_t id = strmap_get(&t->bpe.vocab, s, len);
    char shown[96];
    if (id < 0)
        TOK_DIE(path, "model.merges[%zu] uses \"%s\", which is not in the vocabulary", index,
                printable(s, len, shown, sizeof shown));
    return id;
}

static void load_merges(Tokenizer *t, const JsonValue *model, const char *path) {
    const JsonValue *merges = array_at(model, "merges", "model", path);
    if (merges->count > MAX_TOKEN_ID) TOK_DIE(path, "model.merges has more than %d entries", MAX_TOKEN_ID);
    for (size_t i = 0; i < merges->count; i++) {
        const char *left, *right;
        size_t left_len, right_len;
        merge_halves(&merges->items[i], i, &left, &left_len, &right, &right_len, path);
        int32_t a = vocab_id_or_die(t, left, left_len, i, path);
        int32_t b = vocab_id_or_die(t, right, right_len, i, path);
        // left + right, on the stack unless very long (a fatal error then leaves no heap block behind)
        char small[1024];
        char *joined = left_len + right_len <= sizeof small ? small : mt_malloc(left_len + right_len);
        memcpy(joined, left, left_len);
        memcpy(joined + left_len, right, right_len);
        int32_t merged = vocab_id_or_die(t, joined, left_len + right_len, i, path);
        if (joined != small) free(joined);
        bpe_add_merge(&t->bpe, a, b, (int32_t)i, merged);
    }
}

static void check_model_options(const JsonValue *model, const char *path) {
    const JsonValue *dropout = json_get(model, "dropout");
    if (dropout && dropout->type != JSON_NULL) TOK_DIE(path, "model.dropout is not supported (only null)");
    if (*optional_string(model, "continuing_subword_prefix", "model", path))
        TOK_DIE(path, "model.continuing_subword_prefix is not supported (only null or \"\")");
    if (*optional_string(model, "end_of_word_suffix", "model", path))
        TOK_DIE(path, "model.end_of_word_suffix is not supported (only null or \"\")");
}

static void load_model(Tokenizer *t, const JsonValue *root, const char *path) {
    const JsonValue *model = json_get(root, "model");
    if (!model || model->type != JSON_OBJECT) TOK_DIE(path, "no \"model\" object");
    const char *type = json_get_string(model, "type");
    if (type && strcmp(type, "BPE")) TOK_DIE(path, "model.type is \"%s\"; only \"BPE\" is supported", type);
    check_model_options(model, path);
    load_vocab(t, json_get(model, "vocab"), path);
    load_merges(t, model, path);
    t->bpe.ignore_merges = optional_bool(model, "ignore_merges", 0, "model", path);
    t->bpe.fuse_unk = optional_bool(model, "fuse_unk", 0, "model", path);
    t->bpe.byte_fallback = optional_bool(model, "byte_fallback", 0, "model", path);
    const char *unk = optional_string(model, "unk_token", "model", path);
    if (*unk) {
        t->bpe.unk_id = strmap_get(&t->bpe.vocab, unk, strlen(unk));
        if (t->bpe.unk_id < 0) TOK_DIE(path, "model.unk_token \"%s\" is not in the vocabulary", unk);
    }
    bpe_index_bytes(&t->bpe);
}

// ---- normalizer, pre-tokenizer, post-processor, decoder -----------------------------

// A copy of the string at key, which must be present (empty allowed only when allow_empty).
static char *required_string(const JsonValue *obj, const char *key, int allow_empty, size_t *len, const char *where,
                             const char *path) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type != JSON_STRING || (!allow_empty && !v->length))
        TOK_DIE(path, "%s.%s must be a%s string", where, key, allow_empty ? "" : " non-empty");
    char *copy = mt_malloc(v->length + 1);
    memcpy(copy, v->string, v->length + 1);
    *len = v->length;
    return copy;
}

// The string of a {"String": s} pattern (Replace); a {"Regex": ...} pattern is refused.
static const JsonValue *string_pattern(const JsonValue *step, const char *where, const char *path) {
    const JsonValue *pattern = json_get(step, "pattern");
    const JsonValue *str = pattern && pattern->type == JSON_OBJECT ? json_get(pattern, "String") : NULL;
    if (!str || str->type != JSON_STRING || !str->length)
        TOK_DIE(path, "%s: only a non-empty {\"String\": ...} pattern is supported", where);
    return str;
}

static const char NORMALIZERS[] = "null, NFC, Prepend, Replace or a Sequence of them";

static void load_norm_step(Tokenizer *t, const JsonValue *n, const char *type, const char *path) {
    if (t->n_norm == TOKENIZER_MAX_NORM_STEPS)
        TOK_DIE(path, "normalizer: more than %d steps are not supported", TOKENIZER_MAX_NORM_STEPS);
    NormStep *step = &t->norm[t->n_norm];
    if (!strcmp(type, "NFC")) {
        step->kind = NORM_NFC;
    } else if (!strcmp(type, "Prepend")) {
        step->kind = NORM_PREPEND;
        step->text = required_string(n, "prepend", 0, &step->text_len, "normalizer Prepend", path);
    } else if (!strcmp(type, "Replace")) {
        step->kind = NORM_REPLACE;
        const JsonValue *from = string_pattern(n, "normalizer Replace", path);
        step->text = mt_malloc(from->length + 1);
        memcpy(step->text, from->string, from->length + 1);
        step->text_len = from->length;
        step->content = required_string(n, "content", 1, &step->content_len, "normalizer Replace", path);
    } else {
        TOK_DIE(path, "normalizer %s is not supported (only %s)", type, NORMALIZERS);
    }
    t->n_norm++;
}

static void load_normalizer(Tokenizer *t, const JsonValue *root, const char *path) {
    const JsonValue *n = json_get(root, "normalizer");
    const char *type = component_type(n, "normalizer", path);
    if (!strcmp(type, "Sequence")) {
        const JsonValue *items = array_at(n, "normalizers", "normalizer", path);
        for (size_t i = 0; i < items->count; i++)
            load_norm_step(t, &items->items[i], component_type(&items->items[i], "normalizer.normalizers[]", path),
                           path);
    } else if (*type) {
        load_norm_step(t, n, type, path);
    }
}

static void load_byte_level(Tokenizer *t, const JsonValue *b, const char *where, const char *path) {
    t->pre = PRE_BYTE_LEVEL;
    t->add_prefix_space = optional_bool(b, "add_prefix_space", 1, where, path);
    t->use_regex = optional_bool(b, "use_regex", 1, where, path);
}

// One character of at most 4 bytes (Metaspace's replacement), copied into buf.
static size_t one_character(const JsonValue *obj, const char *key, char *buf, const char *where, const char *path) {
    const JsonValue *v = json_get(obj, key);
    uint32_t cp;
    if (!v || v->type != JSON_STRING || !v->length || utf8_decode(v->string, v->length, &cp) != v->length)
        TOK_DIE(path, "%s.%s must be one character", where, key);
    memcpy(buf, v->string, v->length);
    return v->length;
}

// Metaspace{replacement, prepend_scheme "always" | "first" | "never" (older files:
// add_prefix_space), split}.
static void load_metaspace(Tokenizer *t, const JsonValue *m, const char *path) {
    static const char where[] = "pre_tokenizer Metaspace";
    t->pre = PRE_METASPACE;
    t->metaspace_len = one_character(m, "replacement", t->metaspace, where, path);
    const char *scheme = optional_string(m, "prepend_scheme", where, path);
    if (!*scheme) t->prepend_scheme = optional_bool(m, "add_prefix_space", 1, where, path) ? PREPEND_ALWAYS
                                                                                          : PREPEND_NEVER;
    else if (!strcmp(scheme, "always")) t->prepend_scheme = PREPEND_ALWAYS;
    else if (!strcmp(scheme, "first")) t->prepend_scheme = PREPEND_FIRST;
    else if (!strcmp(scheme, "never")) t->prepend_scheme = PREPEND_NEVER;
    else TOK_DIE(path, "%s.prepend_scheme \"%s\" is not one of always, first, never", where, scheme);
    t->metaspace_split = optional_bool(m, "split", 1, where, path);
}

static void load_split(Tokenizer *t, const JsonValue *s, const char *path) {
    const JsonValue *pattern = json_get(s, "pattern");
    const char *regex = pattern ? json_get_string(pattern, "Regex") : NULL;
    if (!regex) TOK_DIE(path, "pre_tokenizer Split: only a {\"Regex\": ...} pattern is supported");
    if (t->n_splits == TOKENIZER_MAX_SPLITS)
        TOK_DIE(path, "pre_tokenizer: more than %d Splits are not supported", TOKENIZER_MAX_SPLITS);
    PretokPattern p = t->splits[t->n_splits++] = pretok_pattern_from_regex(regex);
    char shown[400];
    if (p == PRETOK_NONE)
        TOK_DIE(path, "pre_tokenizer Split pattern \"%s\" is not supported (only the GPT-2, Llama-3, Qwen2 and "
                "DeepSeek-V3 patterns)",
                printable(regex, strlen(regex), shown, sizeof shown));
    const char *behavior = json_get_string(s, "behavior");
    if (!behavior || strcmp(behavior, "Isolated"))
        TOK_DIE(path, "pre_tokenizer Split behavior must be \"Isolated\"");
    if (optional_bool(s, "invert", 0, "pre_tokenizer Split", path))
        TOK_DIE(path, "pre_tokenizer Split invert=true is not supported");
}

static const char PRE_TOKENIZERS[] = "null, ByteLevel, Metaspace, or a Sequence of Splits then ByteLevel or Metaspace";

// A pre-tokenizer that ends the sequence (or stands alone); 0 when type is none of them.
static int load_final_pre(Tokenizer *t, const JsonValue *p, const char *type, const char *path) {
    if (!strcmp(type, "ByteLevel")) load_byte_level(t, p, "pre_tokenizer ByteLevel", path);
    else if (!strcmp(type, "Metaspace")) load_metaspace(t, p, path);
    else return 0;
    return 1;
}

static void load_pre_tokenizer(Tokenizer *t, const JsonValue *root, const char *path) {
    const JsonValue *p = json_get(root, "pre_tokenizer");
    const char *type = component_type(p, "pre_tokenizer", path);
    if (!*type || load_final_pre(t, p, type, path)) return;
    if (strcmp(type, "Sequence")) TOK_DIE(path, "pre_tokenizer %s is not supported (only %s)", type, PRE_TOKENIZERS);
    const JsonValue *items = array_at(p, "pretokenizers", "pre_tokenizer", path);
    for (size_t i = 0; i < items->count; i++) {
        const char *item = component_type(&items->items[i], "pre_tokenizer.pretokenizers[]", path);
        if (t->pre != PRE_NONE) TOK_DIE(path, "pre_tokenizer Sequence: %s after %s is not supported (only %s)", item,
                                        t->pre == PRE_BYTE_LEVEL ? "ByteLevel" : "Metaspace", PRE_TOKENIZERS);
        if (!strcmp(item, "Split")) load_split(t, &items->items[i], path);
        else if (!load_final_pre(t, &items->items[i], item, path))
            TOK_DIE(path, "pre_tokenizer %s is not supported (only %s)", item, PRE_TOKENIZERS);
    }
}

static void append_ids(const Tokenizer *t, int32_t **ids, int *count, const JsonValue *arr, const char *what,
                       const char *path) {
    if (!arr || arr->type != JSON_ARRAY) TOK_DIE(path, "%s.ids must be an array", what);
    for (size_t i = 0; i < arr->count; i++) {
        int32_t id = token_id_value(&arr->items[i], what, path);
        if (id >= t->vocab_size) TOK_DIE(path, "%s: id %d is not in the vocabulary", what, id);
        *ids = mt_realloc(*ids, (size_t)(*count + 1) * sizeof(int32_t));
        (*ids)[(*count)++] = id;
    }
}

// TemplateProcessing: the "single" template, e.g. [{SpecialToken <s>}, {Sequence A}].
static void load_template(Tokenizer *t, const JsonValue *p, const char *path) {
    const JsonValue *single = array_at(p, "single", "post_processor", path);
    const JsonValue *specials = json_get(p, "special_tokens");
    int seen_sequence = 0;
    for (size_t i = 0; i < single->count; i++) {
        const JsonValue *item = &single->items[i];
        const JsonValue *special = json_get(item, "SpecialToken"), *sequence = json_get(item, "Sequence");
        const char *name = json_get_string(special ? special : sequence, "id");
        if (!name)
            TOK_DIE(path, "post_processor.single[%zu] must be {\"SpecialToken\"|\"Sequence\": {\"id\": ...}}", i);
        if (sequence) {
            if (strcmp(name, "A") || seen_sequence) TOK_DIE(path, "post_processor.single must hold Sequence A once");
            seen_sequence = 1;
            continue;
        }
        const JsonValue *entry = json_get(specials, name);
        if (!entry) TOK_DIE(path, "post_processor.special_tokens has no \"%s\"", name);
        char what[160];
        snprintf(what, sizeof what, "post_processor.special_tokens \"%s\"", name);
        if (seen_sequence) append_ids(t, &t->suffix_ids, &t->suffix_count, json_get(entry, "ids"), what, path);
        else append_ids(t, &t->prefix_ids, &t->prefix_count, json_get(entry, "ids"), what, path);
    }
    if (!seen_sequence) TOK_DIE(path, "post_processor.single has no Sequence A");
}

static void load_processor(Tokenizer *t, const JsonValue *p, const char *path) {
    const char *type = component_type(p, "post_processor", path);
    if (!*type || !strcmp(type, "ByteLevel")) return;  // ByteLevel only adjusts offsets
    if (!strcmp(type, "TemplateProcessing")) {
        load_template(t, p, path);
    } else if (!strcmp(type, "Sequence")) {
        const JsonValue *items = array_at(p, "processors", "post_processor", path);
        for (size_t i = 0; i < items->count; i++) load_processor(t, &items->items[i], path);
    } else {
        TOK_DIE(path, "post_processor %s is not supported (only ByteLevel, TemplateProcessing or null)", type);
    }
}

static const char DECODERS[] =
    "ByteLevel, Metaspace, or a Sequence of Replace(\"\u2581\" -> \" \"), ByteFallback, Fuse, Strip(\" \", 1, 0)";

// The replacement character that decodes to ' ': Replace's pattern (content must be " ").
static void load_replace_decoder(Tokenizer *t, const JsonValue *d, const char *path) {
    const JsonValue *from = string_pattern(d, "decoder Replace", path);
    const char *content = json_get_string(d, "content");
    uint32_t cp;
    if (!content || strcmp(content, " ") || utf8_decode(from->string, from->length, &cp) != from->length)
        TOK_DIE(path, "decoder Replace is supported only from one character to \" \" (only %s)", DECODERS);
    memcpy(t->decode_space, from->string, from->length);
    t->decode_space_len = from->length;
    t->decode = DECODE_METASPACE;
}

static void load_strip_decoder(Tokenizer *t, const JsonValue *d, const char *path) {
    const char *content = json_get_string(d, "content");
    int64_t start = -1, stop = -1;
    if (!content || strcmp(content, " ") || !json_get_int64(d, "start", &start) || !json_get_int64(d, "stop", &stop) ||
        start < 0 || start > 1 || stop != 0)
        TOK_DIE(path, "decoder Strip is supported only as Strip(\" \", start 0 or 1, stop 0) (only %s)", DECODERS);
    t->decode_strip_space = (int)start;
}

static void load_decoder_item(Tokenizer *t, const JsonValue *d, const char *type, const char *path) {
    if (!strcmp(type, "Replace")) load_replace_decoder(t, d, path);
    else if (!strcmp(type, "ByteFallback")) t->decode_byte_fallback = 1;
    else if (!strcmp(type, "Strip")) load_strip_decoder(t, d, path);
    else if (strcmp(type, "Fuse")) TOK_DIE(path, "decoder %s is not supported (only %s)", type, DECODERS);
}

static void load_decoder(Tokenizer *t, const JsonValue *root, const char *path) {
    const JsonValue *d = json_get(root, "decoder");
    const char *type = component_type(d, "decoder", path);
    if (!strcmp(type, "ByteLevel")) {
        t->decode = DECODE_BYTE_LEVEL;
    } else if (!strcmp(type, "Metaspace")) {
        t->decode = DECODE_METASPACE;
        t->decode_space_len = one_character(d, "replacement", t->decode_space, "decoder Metaspace", path);
        const char *scheme = optional_string(d, "prepend_scheme", "decoder Metaspace", path);
        t->decode_strip_space = *scheme ? strcmp(scheme, "never") != 0
                                        : optional_bool(d, "add_prefix_space", 1, "decoder Metaspace", path);
    } else if (!strcmp(type, "Sequence")) {
        const JsonValue *items = array_at(d, "decoders", "decoder", path);
        for (size_t i = 0; i < items->count; i++)
            load_decoder_item(t, &items->items[i], component_type(&items->items[i], "decoder.decoders[]", path), path);
        if (t->decode != DECODE_METASPACE) TOK_DIE(path, "decoder Sequence without Replace (only %s)", DECODERS);
    } else {
        TOK_DIE(path, "decoder %s is not supported (only %s)", *type ? type : "null", DECODERS);
    }
}

// truncation and padding change what encode returns; only their absence is supported
// (padding to the longest of a batch is harmless for one text).
static void check_truncation_padding(const JsonValue *root, const char *path) {
    const JsonValue *truncation = json_get(root, "truncation"), *padding = json_get(root, "padding");
    if (truncation && truncation->type != JSON_NULL) TOK_DIE(path, "truncation is not supported (only null)");
    if (!padding || padding->type == JSON_NULL) return;
    const char *strategy = json_get_string(padding, "strategy");
    if (!strategy || strcmp(strategy, "BatchLongest")) TOK_DIE(path, "padding to a fixed length is not supported");
}

// ---- added tokens ------------------------------------------------------------------

static void load_added_token(Tokenizer *t, const JsonValue *a, size_t index, const char *path) {
    char where[48];
    snprintf(where, sizeof where, "added_tokens[%zu]", index);
    const JsonValue *content = json_get(a, "content");
    if (!content || content->type != JSON_STRING || !content->length)
        TOK_DIE(path, "%s.content must be a non-empty string", where);
    const JsonValue *id = json_get(a, "id");
    if (!id) TOK_DIE(path, "%s has no id", where);
    AddedToken *tok = &t->added[t->added_count++];
    tok->id = token_id_value(id, where, path);
    tok->content = mt_malloc(content->length + 1);
    memcpy(tok->content, content->string, content->length + 1);
    tok->length = content->length;
    tok->special = optional_bool(a, "special", 0, where, path);
    tok->normalized = optional_bool(a, "normalized", !tok->special, where, path);
    tok->lstrip = optional_bool(a, "lstrip", 0, where, path);
    tok->rstrip = optional_bool(a, "rstrip", 0, where, path);
    tok->single_word = optional_bool(a, "single_word", 0, where, path);
    for (int i = 0; i < t->added_count - 1; i++)
        if (t->added[i].id == tok->id) TOK_DIE(path, "%s: id %d is given to another added token too", where, tok->id);
    t->vocab_size = MT_MAX(t->vocab_size, tok->id + 1);
}

static int compare_added(const void *x, const void *y) {
    const AddedToken *a = *(const AddedToken *const *)x, *b = *(const AddedToken *const *)y;
    int fa = (unsigned char)a->content[0], fb = (unsigned char)b->content[0];
    if (fa != fb) return fa - fb;
    return a->length < b->length ? 1 : a->length > b->length ? -1 : 0;  // longest first
}

static void build_added_set(AddedTokenSet *set, const Tokenizer *t, int normalized) {
    free(set->tokens);
    set->tokens = mt_malloc((size_t)(t->added_count + 1) * sizeof(AddedToken *));
    set->count = 0;
    for (int i = 0; i < t->added_count; i++)
        if (t->added[i].normalized == normalized) set->tokens[set->count++] = &t->added[i];
    qsort(set->tokens, (size_t)set->count, sizeof(AddedToken *), compare_added);
    int k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < set->count && (unsigned char)set->tokens[k]->content[0] < b) k++;
        set->first[b] = k;
    }
}

static void load_added_tokens(Tokenizer *t, const JsonValue *root, const char *path) {
    const JsonValue *added = json_get(root, "added_tokens");
    if (added && added->type != JSON_NULL) {
        if (added->type != JSON_ARRAY) TOK_DIE(path, "added_tokens must be an array");
        t->added = mt_calloc(added->count + 1, sizeof(AddedToken));
        for (size_t i = 0; i < added->count; i++) load_added_token(t, &added->items[i], i, path);
    }
    tokenizer_index_added(t);
}

void tokenizer_index_added(Tokenizer *t) {
    build_added_set(&t->raw_set, t, 0);
    build_added_set(&t->normalized_set, t, 1);
}

// ---- decode table --------------------------------------------------------------------

typedef struct {
    char *v;
    size_t len, cap;
} DecodeBuf;

static void reserve(Tokenizer *t, DecodeBuf *b, size_t n) {
    if (b->len + n <= b->cap) return;
    b->cap = MT_MAX(2 * b->cap, b->len + n + 4096);
    b->v = t->decoded = mt_realloc(t->decoded, b->cap);
}

// ByteLevel: the token's characters through the byte alphabet, or its own bytes when a
// character is outside the alphabet.
static void append_byte_level(Tokenizer *t, DecodeBuf *b, const char *s, size_t n) {
    reserve(t, b, n);
    size_t start = b->len;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += utf8_decode(s + i, n - i, &cp);
        int byte = cp == UC_INVALID ? -1 : byte_level_byte(cp);
        if (byte < 0) {  // not all in the alphabet: the raw bytes
            memcpy(b->v + start, s, n);
            b->len = start + n;
            return;
        }
        b->v[b->len++] = (char)byte;
    }
}

int tokenizer_fallback_byte(const char *s, size_t n) {
    static const char hex[] = "0123456789ABCDEF";
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    const char *hi = memchr(hex, s[3], 16), *lo = memchr(hex, s[4], 16);
    return hi && lo && s[3] && s[4] ? (int)((hi - hex) * 16 + (lo - hex)) : -1;
}

// Metaspace / SentencePiece: the replacement character as ' ', a byte-fallback token as its byte.
static void append_metaspace(Tokenizer *t, DecodeBuf *b, const char *s, size_t n) {
    int byte = t->decode_byte_fallback ? tokenizer_fallback_byte(s, n) : -1;
    reserve(t, b, n);
    if (byte >= 0) {
        b->v[b->len++] = (char)byte;
        return;
    }
    size_t rep = t->decode_space_len;
    for (size_t i = 0; i < n;)
        if (rep && i + rep <= n && !memcmp(s + i, t->decode_space, rep)) b->v[b->len++] = ' ', i += rep;
        else b->v[b->len++] = s[i++];
}

static void append_decoded(Tokenizer *t, DecodeBuf *b, int32_t id, const char *s, size_t n) {
    if (t->control && t->control[id]) return;
    if (t->unk_surface && id == t->bpe.unk_id) {
        reserve(t, b, t->unk_surface_len);
        memcpy(b->v + b->len, t->unk_surface, t->unk_surface_len);
        b->len += t->unk_surface_len;
    } else if (t->decode == DECODE_NULL) {
        reserve(t, b, 16);
        b->len += (size_t)snprintf(b->v + b->len, 16, " %d", id);
    } else if (t->decode == DECODE_METASPACE) {
        append_metaspace(t, b, s, n);
    } else {
        append_byte_level(t, b, s, n);
    }
}

void tokenizer_build_decode_table(Tokenizer *t) {
    const char **text = mt_calloc((size_t)t->vocab_size, sizeof(char *));
    size_t *text_len = mt_calloc((size_t)t->vocab_size, sizeof(size_t));
    for (size_t i = 0; i < t->bpe.vocab.count; i++) {
        int32_t id = t->bpe.vocab.entries[i].value;
        text[id] = strmap_key(&t->bpe.vocab, i, &text_len[id]);
    }
    for (int i = 0; i < t->added_count; i++) {  // an added token's content wins, as in the library
        text[t->added[i].id] = t->added[i].content;
        text_len[t->added[i].id] = t->added[i].length;
    }
    t->decoded_offset = mt_malloc((size_t)(t->vocab_size + 1) * sizeof(size_t));
    DecodeBuf b = {0};
    for (int id = 0; id < t->vocab_size; id++) {
        t->decoded_offset[id] = b.len;
        if (text[id] || t->decode == DECODE_NULL) append_decoded(t, &b, id, text[id], text_len[id]);
    }
    t->decoded_offset[t->vocab_size] = b.len;
    free(text);
    free(text_len);
}

// ---- entry point ---------------------------------------------------------------------

Tokenizer *tokenizer_load(const char *path) {
    char err[256];
    size_t len;
    char *text = (char *)read_file_all(path, INFILE_CONFIG, &len, err, sizeof err);
    if (!text) TOK_DIE(path, "%s", err);
    Tokenizer *t = tokenizer_parse(text, len, path);
    free(text);
    return t;
}

Tokenizer *tokenizer_parse(const char *json, size_t len, const char *path) {
    char err[256];
    JsonValue *root = json_parse(json, len, err, sizeof err);
    if (!root) TOK_DIE(path, "%s", err);
    if (root->type != JSON_OBJECT) TOK_DIE(path, "the file must hold a JSON object");
    Tokenizer *t = tokenizer_new(TOKENIZER_HF);
    load_model(t, root, path);
    load_normalizer(t, root, path);
    load_pre_tokenizer(t, root, path);
    t->bpe.char_level = t->pre != PRE_BYTE_LEVEL;
    load_added_tokens(t, root, path);
    load_processor(t, json_get(root, "post_processor"), path);
    load_decoder(t, root, path);
    check_truncation_padding(root, path);
    json_free(root);
    tokenizer_build_decode_table(t);
    return t;
}

Tokenizer *tokenizer_new(TokenizerKind kind) {
    Tokenizer *t = mt_calloc(1, sizeof(Tokenizer));
    t->kind = kind;
    bpe_model_init(&t->bpe);
    t->bos_id = t->eos_id = -1;
    return t;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    bpe_model_free(&t->bpe);
    unigram_free(t->unigram);
    sp_normalizer_free(t->sp_norm);
    for (int i = 0; i < t->n_norm; i++) free(t->norm[i].text), free(t->norm[i].content);
    free(t->control);
    free(t->sp_model_pieces);
    free(t->unk_surface);
    for (int i = 0; i < t->added_count; i++) free(t->added[i].content);
    free(t->added);
    free(t->raw_set.tokens);
    free(t->normalized_set.tokens);
    free(t->prefix_ids);
    free(t->suffix_ids);
    free(t->decoded);
    free(t->decoded_offset);
    free(t);
}

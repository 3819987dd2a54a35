// tokenizer_load.c — read and check tokenizer.json (the format is summarised in
// tokenizer.h). Every problem is one fatal line: "tokenizer PATH: <what is wrong>".
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"

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
    if (optional_bool(model, "byte_fallback", 0, "model", path))
        TOK_DIE(path, "model.byte_fallback=true is not supported (byte-level BPE needs no byte fallback)");
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
    const char *unk = optional_string(model, "unk_token", "model", path);
    if (*unk) {
        t->bpe.unk_id = strmap_get(&t->bpe.vocab, unk, strlen(unk));
        if (t->bpe.unk_id < 0) TOK_DIE(path, "model.unk_token \"%s\" is not in the vocabulary", unk);
    }
    bpe_index_bytes(&t->bpe);
}

// ---- normalizer, pre-tokenizer, post-processor, decoder -----------------------------

static void load_normalizer(Tokenizer *t, const JsonValue *root, const char *path) {
    const JsonValue *n = json_get(root, "normalizer");
    const char *type = component_type(n, "normalizer", path);
    if (!strcmp(type, "Sequence")) {
        const JsonValue *items = array_at(n, "normalizers", "normalizer", path);
        for (size_t i = 0; i < items->count; i++) {
            const char *item = component_type(&items->items[i], "normalizer.normalizers[]", path);
            if (strcmp(item, "NFC"))
                TOK_DIE(path, "normalizer %s is not supported (only null or NFC)", item);
            t->nfc = 1;
        }
    } else if (!strcmp(type, "NFC")) {
        t->nfc = 1;
    } else if (*type) {
        TOK_DIE(path, "normalizer %s is not supported (only null or NFC)", type);
    }
}

static void load_byte_level(Tokenizer *t, const JsonValue *b, const char *where, const char *path) {
    t->add_prefix_space = optional_bool(b, "add_prefix_space", 1, where, path);
    t->use_regex = optional_bool(b, "use_regex", 1, where, path);
}

static void load_split(Tokenizer *t, const JsonValue *s, const char *path) {
    const JsonValue *pattern = json_get(s, "pattern");
    const char *regex = pattern ? json_get_string(pattern, "Regex") : NULL;
    if (!regex) TOK_DIE(path, "pre_tokenizer Split: only a {\"Regex\": ...} pattern is supported");
    t->split = pretok_pattern_from_regex(regex);
    char shown[400];
    if (t->split == PRETOK_NONE)
        TOK_DIE(path, "pre_tokenizer Split pattern \"%s\" is not supported (only the GPT-2, Llama-3 and Qwen2 "
                "patterns)",
                printable(regex, strlen(regex), shown, sizeof shown));
    const char *behavior = json_get_string(s, "behavior");
    if (!behavior || strcmp(behavior, "Isolated"))
        TOK_DIE(path, "pre_tokenizer Split behavior must be \"Isolated\"");
    if (optional_bool(s, "invert", 0, "pre_tokenizer Split", path))
        TOK_DIE(path, "pre_tokenizer Split invert=true is not supported");
}

static void load_pre_tokenizer(Tokenizer *t, const JsonValue *root, const char *path) {
    static const char expected[] = "ByteLevel or Sequence[Split, ByteLevel]";
    const JsonValue *p = json_get(root, "pre_tokenizer");
    const char *type = component_type(p, "pre_tokenizer", path);
    if (!strcmp(type, "ByteLevel")) {
        load_byte_level(t, p, "pre_tokenizer", path);
        return;
    }
    if (strcmp(type, "Sequence"))
        TOK_DIE(path, "pre_tokenizer %s is not supported (only %s)", *type ? type : "null", expected);
    const JsonValue *items = array_at(p, "pretokenizers", "pre_tokenizer", path);
    size_t n = items->count;
    if (n < 1 || n > 2) TOK_DIE(path, "pre_tokenizer Sequence of %zu items is not supported (only %s)", n, expected);
    if (n == 2) {
        if (strcmp(component_type(&items->items[0], "pre_tokenizer.pretokenizers[0]", path), "Split"))
            TOK_DIE(path, "pre_tokenizer Sequence must be [Split, ByteLevel]");
        load_split(t, &items->items[0], path);
    }
    if (strcmp(component_type(&items->items[n - 1], "pre_tokenizer.pretokenizers[]", path), "ByteLevel"))
        TOK_DIE(path, "pre_tokenizer Sequence must end with ByteLevel (only %s)", expected);
    load_byte_level(t, &items->items[n - 1], "pre_tokenizer ByteLevel", path);
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

static void load_decoder(const JsonValue *root, const char *path) {
    const char *type = component_type(json_get(root, "decoder"), "decoder", path);
    if (strcmp(type, "ByteLevel")) TOK_DIE(path, "decoder %s is not supported (only ByteLevel)", *type ? type : "null");
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
    if (optional_bool(a, "single_word", 0, where, path)) TOK_DIE(path, "%s: single_word=true is not supported", where);
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
    build_added_set(&t->raw_set, t, 0);
    build_added_set(&t->normalized_set, t, 1);
}

// ---- decode table --------------------------------------------------------------------

// Appends the ByteLevel decoding of one token string: its characters through the byte
// alphabet, or its own bytes when a character is outside the alphabet.
static void append_decoded(Tokenizer *t, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n > *cap) {
        *cap = MT_MAX(2 * *cap, *len + n + 4096);
        t->decoded = mt_realloc(t->decoded, *cap);
    }
    size_t start = *len;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += utf8_decode(s + i, n - i, &cp);
        int b = cp == UC_INVALID ? -1 : byte_level_byte(cp);
        if (b < 0) {  // not all in the alphabet: the raw bytes
            memcpy(t->decoded + start, s, n);
            *len = start + n;
            return;
        }
        t->decoded[(*len)++] = (char)b;
    }
}

static void build_decode_table(Tokenizer *t) {
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
    size_t len = 0, cap = 0;
    for (int id = 0; id < t->vocab_size; id++) {
        t->decoded_offset[id] = len;
        if (text[id]) append_decoded(t, &len, &cap, text[id], text_len[id]);
    }
    t->decoded_offset[t->vocab_size] = len;
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
    Tokenizer *t = mt_calloc(1, sizeof(Tokenizer));
    bpe_model_init(&t->bpe);
    load_model(t, root, path);
    load_normalizer(t, root, path);
    load_pre_tokenizer(t, root, path);
    load_added_tokens(t, root, path);
    load_processor(t, json_get(root, "post_processor"), path);
    load_decoder(root, path);
    check_truncation_padding(root, path);
    json_free(root);
    build_decode_table(t);
    return t;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    bpe_model_free(&t->bpe);
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

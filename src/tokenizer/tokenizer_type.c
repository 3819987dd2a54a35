// tokenizer_type.c — --tokenizer-type (see tokenizer_type.h).
#include "tokenizer/tokenizer_type.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"

static const struct {
    const char *name;
    TokenizerType type;
} type_names[] = {
    {"HuggingFaceTokenizer", TOKENIZER_TYPE_HUGGINGFACE},     {"GPT2BPETokenizer", TOKENIZER_TYPE_GPT2BPE},
    {"SentencePieceTokenizer", TOKENIZER_TYPE_SENTENCEPIECE}, {"GPTSentencePieceTokenizer", TOKENIZER_TYPE_SENTENCEPIECE},
    {"Llama2Tokenizer", TOKENIZER_TYPE_SENTENCEPIECE},        {"NullTokenizer", TOKENIZER_TYPE_NULL},
};
#define TYPE_COUNT (sizeof type_names / sizeof type_names[0])

TokenizerType tokenizer_type_of(const Config *c) {
    if (!c->tokenizer_type[0]) return TOKENIZER_TYPE_DEFAULT;
    char list[256] = "";
    for (size_t i = 0; i < TYPE_COUNT; i++) {
        if (!strcmp(c->tokenizer_type, type_names[i].name)) return type_names[i].type;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", type_names[i].name);
    }
    mt_die("--tokenizer-type %s is not supported; use one of %s", c->tokenizer_type, list);
}

int config_has_tokenizer(const Config *c) { return c->tokenizer_model[0] || c->tokenizer_type[0]; }

const char *tokenizer_source(const Config *c, char *buf, size_t cap) {
    switch (tokenizer_type_of(c)) {
    case TOKENIZER_TYPE_GPT2BPE: snprintf(buf, cap, "--vocab-file %s", c->vocab_file); break;
    case TOKENIZER_TYPE_NULL: snprintf(buf, cap, "NullTokenizer"); break;
    default: snprintf(buf, cap, "--tokenizer-model %s", c->tokenizer_model); break;
    }
    return buf;
}

static void require_flag(const char *value, const char *type, const char *flag, const char *what) {
    if (!value[0]) mt_die("--tokenizer-type %s needs --%s %s", type, flag, what);
}

// --tokenizer-model as the file to read: a directory stands for its file `name`.
static void model_path(const Config *c, const char *name, char *path) {
    struct stat s;
    const char *given = c->tokenizer_model;
    if (stat(given, &s)) mt_die("--tokenizer-model %s: cannot open it: %s", given, strerror(errno));
    if (!S_ISDIR(s.st_mode)) {
        snprintf(path, MT_PATH_MAX, "%s", given);
        return;
    }
    if (!c->tokenizer_type[0]) mt_die("--tokenizer-model %s is a directory; give its tokenizer.json file", given);
    if (snprintf(path, MT_PATH_MAX, "%s/%s", given, name) >= MT_PATH_MAX)
        mt_die("--tokenizer-model %s: the path of its %s is too long", given, name);
    if (stat(path, &s)) mt_die("--tokenizer-model %s is a directory without %s; give the file", given, name);
}

static uint8_t *read_model(const char *path, size_t *len) {
    char err[256];
    uint8_t *bytes = read_file_all(path, INFILE_CONFIG, len, err, sizeof err);
    if (!bytes) mt_die("--tokenizer-model %s: cannot read it: %s", path, err);
    return bytes;
}

// The text of a tokenizer.json: refused in one line when it is not a JSON object with a
// "model" (a file given by mistake), before the tokenizer's own checks.
static void check_tokenizer_json(const Config *c, const TokenizerFile *f) {
    const char *what = config_flag_given(c, "tokenizer-model") ? "--tokenizer-model" : "--load's tokenizer.json";
    char err[512];
    JsonValue *root = json_parse((const char *)f->bytes, f->len, err, sizeof(err));
    if (!root || root->type != JSON_OBJECT || !json_get(root, "model"))
        mt_die("%s %s is not a tokenizer.json (%s); give the tokenizer.json file of a Hugging Face tokenizer", what,
               f->path, root ? "no \"model\" object" : err);
    json_free(root);
}

Tokenizer *tokenizer_open_config(const Config *c, TokenizerFile *file) {
    TokenizerType type = tokenizer_type_of(c);
    TokenizerFile local = {0};
    TokenizerFile *f = file ? file : &local;
    memset(f, 0, sizeof *f);
    Tokenizer *t = NULL;
    const char *name = c->tokenizer_type;
    switch (type) {
    case TOKENIZER_TYPE_NULL:
        if (!config_flag_given(c, "vocab-size") && !c->load[0])
            mt_die("--tokenizer-type NullTokenizer needs --vocab-size N (ids 0..N-1, end of document N-1)");
        return tokenizer_null(c->vocab_size);
    case TOKENIZER_TYPE_GPT2BPE:
        require_flag(c->vocab_file, name, "vocab-file", "vocab.json (GPT-2's)");
        require_flag(c->merge_file, name, "merge-file", "merges.txt (GPT-2's)");
        snprintf(f->path, sizeof f->path, "%s", c->vocab_file);
        f->bytes = (uint8_t *)tokenizer_json_from_gpt2_files(c->vocab_file, c->merge_file, &f->len);
        f->name = "tokenizer.json";
        t = tokenizer_parse((const char *)f->bytes, f->len, c->vocab_file);
        break;
    case TOKENIZER_TYPE_SENTENCEPIECE:
        require_flag(c->tokenizer_model, name, "tokenizer-model", "tokenizer.model (a SentencePiece model)");
        model_path(c, "tokenizer.model", f->path);
        f->bytes = read_model(f->path, &f->len);
        f->name = "tokenizer.model";
        t = tokenizer_parse_sentencepiece(f->bytes, f->len, f->path);
        break;
    default:
        require_flag(c->tokenizer_model, name, "tokenizer-model", "tokenizer.json (or its directory)");
        model_path(c, "tokenizer.json", f->path);
        f->bytes = read_model(f->path, &f->len);
        f->name = "tokenizer.json";
        check_tokenizer_json(c, f);
        t = tokenizer_parse((const char *)f->bytes, f->len, f->path);
        break;
    }
    if (!file) free(local.bytes);
    return t;
}

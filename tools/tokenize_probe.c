// tokenize_probe.c — moetron's tokenizer on a file, for tests/conformance/tokenizer_conformance.py
// and the encoding benchmark of bench/RESULTS.md.
//
// usage: tokenize_probe TOKENIZER.json TEXT_FILE            ids of the text, one line, space separated
//        tokenize_probe --decode TOKENIZER.json IDS_FILE    the bytes the ids (whitespace separated) decode to
//        tokenize_probe --bench N TOKENIZER.json TEXT_FILE  encode N times; prints "MB/s <speed> tokens <count>"
//        tokenize_probe --json TOKENIZER.json TEXTS.json    TEXTS.json is a JSON array of strings; prints one
//                                                           line per text: "<ids space separated>|<hex of the
//                                                           bytes the ids decode to>"
// TOKENIZER is a tokenizer.json, or sp:MODEL (a SentencePiece .model), gpt2:VOCAB,MERGES
// (GPT-2's vocab.json and merges.txt), null:N (NullTokenizer with N ids).
// Errors (an unusable tokenizer file included) are one line on stderr and exit status 1.
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/timer.h"
#include "tokenizer/tokenizer.h"

static Tokenizer *open_tokenizer(const char *spec) {
    if (!strncmp(spec, "sp:", 3)) return tokenizer_load_sentencepiece(spec + 3);
    if (!strncmp(spec, "null:", 5)) return tokenizer_null(atoi(spec + 5));
    if (strncmp(spec, "gpt2:", 5)) return tokenizer_load(spec);
    char vocab[4096];
    const char *comma = strchr(spec + 5, ',');
    if (!comma || comma - (spec + 5) >= (long)sizeof vocab) mt_die("%s: expected gpt2:VOCAB,MERGES", spec);
    snprintf(vocab, sizeof vocab, "%.*s", (int)(comma - (spec + 5)), spec + 5);
    size_t len;
    char *json = tokenizer_json_from_gpt2_files(vocab, comma + 1, &len);
    Tokenizer *t = tokenizer_parse(json, len, vocab);
    free(json);
    return t;
}

static char *read_or_die(const char *path, size_t *len) {
    char err[256];
    char *text = (char *)read_file_all(path, INFILE_TEXT, len, err, sizeof err);
    if (!text) mt_die("%s: %s", path, err);
    return text;
}

static int encode_file(const char *tokenizer_path, const char *text_path) {
    Tokenizer *t = open_tokenizer(tokenizer_path);
    size_t len;
    char *text = read_or_die(text_path, &len);
    int32_t *ids;
    int n = tokenizer_encode(t, text, len, &ids);
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    free(ids);
    free(text);
    tokenizer_free(t);
    return 0;
}

static int decode_file(const char *tokenizer_path, const char *ids_path) {
    Tokenizer *t = open_tokenizer(tokenizer_path);
    size_t len;
    char *text = read_or_die(ids_path, &len);
    int32_t *ids = mt_malloc((len / 2 + 1) * sizeof(int32_t));  // ids are at least "0 " apart
    int n = 0;
    char *p = text, *end;
    for (long id = strtol(p, &end, 10); end != p; id = strtol(p, &end, 10)) {
        ids[n++] = (int32_t)id;
        p = end;
    }
    while (*p == ' ' || *p == '\n') p++;
    if (*p) mt_die("%s: expected token ids separated by whitespace", ids_path);
    size_t size = tokenizer_decode(t, ids, n, NULL, 0);
    char *out = mt_malloc(size + 1);
    tokenizer_decode(t, ids, n, out, size + 1);
    fwrite(out, 1, size, stdout);
    free(out);
    free(ids);
    free(text);
    tokenizer_free(t);
    return 0;
}

static int bench_file(int repeat, const char *tokenizer_path, const char *text_path) {
    Tokenizer *t = open_tokenizer(tokenizer_path);
    size_t len;
    char *text = read_or_die(text_path, &len);
    int n = 0;
    double start = now_seconds();
    for (int r = 0; r < repeat; r++) {
        int32_t *ids;
        n = tokenizer_encode(t, text, len, &ids);
        free(ids);
    }
    double seconds = now_seconds() - start;
    printf("MB/s %.2f tokens %d\n", (double)len * repeat / seconds / 1e6, n);
    free(text);
    tokenizer_free(t);
    return 0;
}

static int encode_json_texts(const char *tokenizer_path, const char *texts_path) {
    Tokenizer *t = open_tokenizer(tokenizer_path);
    char err[256];
    JsonValue *texts = json_parse_file(texts_path, err, sizeof err);
    if (!texts) mt_die("%s: %s", texts_path, err);
    if (texts->type != JSON_ARRAY) mt_die("%s: expected a JSON array of strings", texts_path);
    for (size_t k = 0; k < texts->count; k++) {
        const JsonValue *text = &texts->items[k];
        if (text->type != JSON_STRING) mt_die("%s: item %zu is not a string", texts_path, k);
        int32_t *ids;
        int n = tokenizer_encode(t, text->string, text->length, &ids);
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        putchar('|');
        for (int i = 0; i < n; i++) {
            size_t len;
            const unsigned char *bytes = (const unsigned char *)tokenizer_token_bytes(t, ids[i], &len);
            for (size_t b = 0; b < len; b++) printf("%02x", bytes[b]);
        }
        putchar('\n');
        free(ids);
    }
    json_free(texts);
    tokenizer_free(t);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--decode")) return decode_file(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "--bench")) return bench_file(MT_MAX(1, atoi(argv[2])), argv[3], argv[4]);
    if (argc == 4 && !strcmp(argv[1], "--json")) return encode_json_texts(argv[2], argv[3]);
    if (argc == 3) return encode_file(argv[1], argv[2]);
    fprintf(stderr, "usage: tokenize_probe [--decode | --json | --bench N] TOKENIZER.json FILE\n");
    return 2;
}

// tokenizer_gpt2_files.c — GPT-2's vocab.json and merges.txt (--tokenizer-type
// GPT2BPETokenizer --vocab-file --merge-file) written as the tokenizer.json of
// `tokenizers`' ByteLevelBPETokenizer(vocab, merges): a BPE model with ByteLevel
// pre-tokenizer, post-processor and decoder, no added tokens. The text is then loaded like
// any tokenizer.json (and checkpoints carry it as their tokenizer.json).
//
// merges.txt: one merge "left right" per line (exactly one space); lines starting with
// "#version" are skipped, as the library's reader does; a blank line is an error there too.
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"
#include "tokenizer/tokenizer.h"

static char *read_or_die(const char *flag, const char *path, size_t *len) {
    char err[256];
    char *text = (char *)read_file_all(path, INFILE_CONFIG, len, err, sizeof err);
    if (!text) mt_die("%s %s: %s", flag, path, err);
    return text;
}

// The merges of merges.txt as a JSON array of "left right" strings.
static void write_merges(JsonWriter *w, const char *text, size_t len, const char *path) {
    static const char version[] = "#version";
    jw_begin_array(w);
    size_t line = 0;
    for (size_t pos = 0; pos < len;) {
        const char *start = text + pos, *nl = memchr(start, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - start) : len - pos;
        pos += n + (nl != NULL);
        line++;
        if (n && start[n - 1] == '\r') n--;
        if (n >= sizeof version - 1 && !memcmp(start, version, sizeof version - 1)) continue;
        const char *space = memchr(start, ' ', n);
        if (!space || space == start || space == start + n - 1 || memchr(space + 1, ' ', n - (size_t)(space + 1 - start)))
            mt_die("--merge-file %s line %zu: expected two tokens separated by one space (GPT-2's merges.txt)", path,
                   line);
        jw_string_n(w, start, n);
    }
    jw_end_array(w);
}

char *tokenizer_json_from_gpt2_files(const char *vocab_path, const char *merges_path, size_t *len) {
    size_t vocab_len, merges_len;
    char *vocab = read_or_die("--vocab-file", vocab_path, &vocab_len);
    char err[256];
    JsonValue *parsed = json_parse(vocab, vocab_len, err, sizeof err);
    if (!parsed || parsed->type != JSON_OBJECT)
        mt_die("--vocab-file %s is not GPT-2's vocab.json (%s)", vocab_path, parsed ? "not a JSON object" : err);
    json_free(parsed);
    char *merges = read_or_die("--merge-file", merges_path, &merges_len);
    JsonWriter w;
    jw_init_compact(&w);
    write_merges(&w, merges, merges_len, merges_path);
    free(merges);
    static const char byte_level[] =
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}";
    static const char head[] = "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[],"
                               "\"normalizer\":null,\"pre_tokenizer\":%s,\"post_processor\":%s,\"decoder\":%s,"
                               "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
                               "\"continuing_subword_prefix\":\"\",\"end_of_word_suffix\":\"\",\"fuse_unk\":false,"
                               "\"byte_fallback\":false,\"vocab\":";
    size_t head_cap = sizeof head + 3 * sizeof byte_level;
    char *out = mt_malloc(head_cap + vocab_len + jw_len(&w) + 32);
    size_t n = (size_t)snprintf(out, head_cap, head, byte_level, byte_level, byte_level);
    memcpy(out + n, vocab, vocab_len);
    n += vocab_len;
    n += (size_t)sprintf(out + n, ",\"merges\":");
    memcpy(out + n, jw_text(&w), jw_len(&w));
    n += jw_len(&w);
    n += (size_t)sprintf(out + n, "}}");
    jw_free(&w);
    free(vocab);
    *len = n;
    return out;
}

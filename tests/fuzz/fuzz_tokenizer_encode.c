// fuzz_tokenizer_encode.c — encoding arbitrary text (src/tokenizer/tokenizer.c, bpe.c,
// pretokenize.c, nfc.c, unicode.c) with fixed small tokenizers, built once: a byte-level BPE
// trained by bpe_train on a fixed text and saved by bpe_save_tokenizer_json (as `moetron
// prepare --vocab-size` does), and variants of its tokenizer.json. The first input byte picks
// the tokenizer, the rest is the text.
//   0: as saved (GPT-2 ByteLevel, no prefix space): decode(encode(text)) must equal text
//   1: NFC, Split with the Llama-3 pattern, ByteLevel with a prefix space and no regex,
//      TemplateProcessing with a BOS, added tokens with lstrip / rstrip / normalized
//   2: Split with the Qwen2 pattern, ByteLevel without regex, ignore_merges: round trip too
// Also: each pre-tokenisation pattern splits the text into consecutive non-empty pieces,
// and NFC is idempotent.
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/json.h"
#include "fuzz.h"
#include "tokenizer/bpe_train.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

#define N_TOKENIZERS 3
static Tokenizer *tokenizers[N_TOKENIZERS];

static const char training_text[] =
    "The quick brown fox jumps over the lazy dog. It's 12:45 and we've 3.14159 reasons; "
    "they'll say \"hello\" 1234567890 times.\r\n\r\n  Indented   line\twith tabs\n"
    "Caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 "
    "\xf0\x9f\x98\x80\xf0\x9f\x98\x80 e\xcc\x81 <|endoftext|> the the the of and in to is was";

// text with `from` replaced by `to` (exactly one occurrence expected)
static char *replace(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    if (!at) fuzz_fail("tokenizer.json from bpe_save_tokenizer_json has no %s", from);
    size_t head = (size_t)(at - text), n = strlen(from), m = strlen(to), tail = strlen(at + n);
    char *out = malloc(head + m + tail + 1);
    memcpy(out, text, head);
    memcpy(out + head, to, m);
    memcpy(out + head + m, at + n, tail + 1);
    return out;
}

static char *split_sequence(PretokPattern pattern, int add_prefix_space) {
    JsonWriter w;
    jw_init_compact(&w);
    jw_begin_object(&w);
    jw_kv_string(&w, "type", "Sequence");
    jw_key(&w, "pretokenizers");
    jw_begin_array(&w);
    jw_begin_object(&w);
    jw_kv_string(&w, "type", "Split");
    jw_key(&w, "pattern");
    jw_begin_object(&w);
    jw_kv_string(&w, "Regex", pretok_pattern_regex(pattern));
    jw_end_object(&w);
    jw_kv_string(&w, "behavior", "Isolated");
    jw_kv_bool(&w, "invert", 0);
    jw_end_object(&w);
    jw_begin_object(&w);
    jw_kv_string(&w, "type", "ByteLevel");
    jw_kv_bool(&w, "add_prefix_space", add_prefix_space);
    jw_kv_bool(&w, "trim_offsets", 0);
    jw_kv_bool(&w, "use_regex", 0);
    jw_end_object(&w);
    jw_end_array(&w);
    jw_end_object(&w);
    char *s = malloc(jw_len(&w) + 64);
    snprintf(s, jw_len(&w) + 64, "\"pre_tokenizer\":%s", jw_text(&w));
    jw_free(&w);
    return s;
}

static Tokenizer *load_text(const char *json) {
    const char *path = fuzz_write("fixed_tokenizer.json", json, strlen(json));
    return tokenizer_load(path);  // outside fuzz_run: a failure here exits, as it should
}

static void build_tokenizers(void) {
    BpeWordCounts wc;
    bpe_counts_init(&wc);
    bpe_counts_add_text(&wc, training_text, sizeof training_text - 1);
    BpeVocab v;
    bpe_train(&wc, 420, &v);
    bpe_counts_free(&wc);
    char err[256];
    const char *path = fuzz_path("trained_tokenizer.json");
    if (bpe_save_tokenizer_json(&v, "<|endoftext|>", path, err, sizeof err)) fuzz_fail("%s", err);
    int n = v.n_tokens;
    bpe_vocab_free(&v);
    size_t len;
    char *saved = (char *)read_file_all(path, INFILE_CONFIG, &len, err, sizeof err);
    if (!saved) fuzz_fail("%s", err);
    tokenizers[0] = load_text(saved);

    static const char byte_level[] =
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}";
    char added[1024], post[512];
    snprintf(added, sizeof added,
             "\"added_tokens\":[{\"id\":%d,\"content\":\"<|endoftext|>\",\"special\":true,\"normalized\":false},"
             "{\"id\":%d,\"content\":\"<s>\",\"special\":true,\"normalized\":false,\"lstrip\":true,\"rstrip\":true},"
             "{\"id\":%d,\"content\":\"caf\\u00e9\",\"special\":false,\"normalized\":true,\"lstrip\":true},"
             "{\"id\":%d,\"content\":\" the\",\"special\":false,\"normalized\":true,\"rstrip\":true}],",
             n, n + 1, n + 2, n + 3);
    snprintf(post, sizeof post,
             "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
             "{\"Sequence\":{\"id\":\"A\"}},{\"SpecialToken\":{\"id\":\"<|endoftext|>\"}}],\"special_tokens\":"
             "{\"<s>\":{\"ids\":[%d]},\"<|endoftext|>\":{\"ids\":[%d]}}}",
             n + 1, n);
    char *split = split_sequence(PRETOK_LLAMA3, 1);
    char *a = replace(saved, byte_level, split);
    char *b = replace(a, "\"normalizer\":null", "\"normalizer\":{\"type\":\"NFC\"}");
    char *c = replace(b, "\"post_processor\":null", post);
    const char *added_at = strstr(c, "\"added_tokens\":[");
    const char *added_end = added_at ? strstr(added_at, "],") : NULL;
    if (!added_end) fuzz_fail("no added_tokens in the saved tokenizer.json");
    char *old_added = strndup(added_at, (size_t)(added_end + 2 - added_at));
    char *d = replace(c, old_added, added);
    tokenizers[1] = load_text(d);
    free(split), free(a), free(b), free(c), free(d), free(old_added);

    split = split_sequence(PRETOK_QWEN2, 0);
    a = replace(saved, byte_level, split);
    b = replace(a, "\"ignore_merges\":false", "\"ignore_merges\":true");
    tokenizers[2] = load_text(b);
    free(split), free(a), free(b);
    free(saved);
}

typedef struct {
    const char *text;
    size_t len;
    int which;
} Ctx;

static void check_pieces(const char *s, size_t len) {
    for (int p = PRETOK_GPT2; p <= PRETOK_QWEN2; p++)
        for (size_t pos = 0, end; pos < len; pos = end) {
            end = pretok_next((PretokPattern)p, s, len, pos);
            if (end <= pos || end > len)
                fuzz_fail("pattern %d: the piece at %zu ends at %zu (text of %zu bytes)", p, pos, end, len);
        }
}

static void body(void *ctx) {
    const Ctx *x = ctx;
    const Tokenizer *t = tokenizers[x->which];
    check_pieces(x->text, x->len);
    size_t n1, n2;
    char *once = uc_nfc(x->text, x->len, &n1);
    char *twice = uc_nfc(once, n1, &n2);
    if (n1 != n2 || memcmp(once, twice, n1)) fuzz_fail("NFC is not idempotent on this text");
    free(once);
    free(twice);

    int32_t *ids;
    int n = tokenizer_encode(t, x->text, x->len, &ids);
    int vocab = tokenizer_vocab_size(t);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) fuzz_fail("id %d out of the vocabulary (%d)", ids[i], vocab);
    size_t need = tokenizer_decode(t, ids, n, NULL, 0);
    char *out = malloc(need + 1);
    size_t got = tokenizer_decode(t, ids, n, out, need + 1);
    if (got != need) fuzz_fail("tokenizer_decode gave %zu bytes, then %zu", need, got);
    if (x->which != 1 && (got != x->len || memcmp(out, x->text, got)))
        fuzz_fail("tokenizer %d: decode(encode(text)) differs from the text (%zu -> %zu bytes)", x->which, x->len, got);
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tokenizers[0]) build_tokenizers();
    if (size < 1) return 0;
    Ctx x = {(const char *)data + 1, size - 1, data[0] % N_TOKENIZERS};
    fuzz_run(body, &x);
    return 0;
}

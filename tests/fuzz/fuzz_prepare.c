// fuzz_prepare.c — the input side of `moetron prepare` (src/cmd/prepare.c): reading a .jsonl
// or .txt file in batches of whole records (read_batch), splitting it into documents and
// sequences (process_jsonl: one JSON object per line, the --json-keys values as strings or
// arrays of strings; process_text: paragraphs) and tokenizing them, or counting the GPT-2
// words for BPE training. Those are static functions, so prepare.c is compiled into this
// target (prepare_main and prepare_tokenize_stream renamed away); run_pass's loop is repeated here without the worker
// threads and the output files.
// Input: one byte of settings, then the file. Bits of the settings byte: 0 .txt (else
// .jsonl), 1 --append-eod, 2 the counting pass (else encoding), 3-4 --json-keys (text;
// text,meta; a; text,text,x... rejected).
#define prepare_main fuzz_prepare_main_unused
#define prepare_tokenize_stream fuzz_prepare_tokenize_stream_unused
#include "cmd/prepare.c"
#undef prepare_tokenize_stream
#undef prepare_main

#include "fuzz.h"

static Tokenizer *tokenizer;

static const char training_text[] =
    "The quick brown fox jumps over the lazy dog. It's 12:45 and we've 3.14159 reasons.\n\n"
    "Caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e {\"text\": \"a\"} the the of and";

static void build_tokenizer(void) {
    BpeWordCounts wc;
    bpe_counts_init(&wc);
    bpe_counts_add_text(&wc, training_text, sizeof training_text - 1);
    BpeVocab v;
    bpe_train(&wc, 320, &v);
    bpe_counts_free(&wc);
    char err[256];
    const char *path = fuzz_path("prepare_tokenizer.json");
    if (bpe_save_tokenizer_json(&v, EOD_TOKEN, path, err, sizeof err)) fuzz_fail("%s", err);
    bpe_vocab_free(&v);
    tokenizer = tokenizer_load(path);
}

typedef struct {
    int settings;
    FILE *fp;
    int64_t size;
} Ctx;

// What encode_document promises: per key, meta holds for every document its sequence
// count and then that many positive lengths, which add up to the tokens.
static void check_batch(const Prep *p, const Batch *b) {
    int vocab = tokenizer_vocab_size(p->tok);
    for (int k = 0; k < p->n_keys; k++) {
        size_t tokens = 0, i = 0;
        const IdVec *meta = &b->meta[k];
        while (i < meta->n) {
            int32_t sequences = meta->v[i++];
            if (sequences < 0 || (size_t)sequences > meta->n - i) fuzz_fail("key %d: bad sequence count %d", k, sequences);
            for (int32_t s = 0; s < sequences; s++) {
                int32_t n = meta->v[i++];
                if (n <= 0) fuzz_fail("key %d: sequence of %d tokens", k, n);
                tokens += (size_t)n;
            }
        }
        if (tokens != b->tokens[k].n) fuzz_fail("key %d: lengths add up to %zu, tokens %zu", k, tokens, b->tokens[k].n);
        for (size_t j = 0; j < b->tokens[k].n; j++)
            if (b->tokens[k].v[j] < 0 || b->tokens[k].v[j] >= vocab) fuzz_fail("token %d out of range", b->tokens[k].v[j]);
    }
}

static void body(void *ctx) {
    Ctx *x = ctx;
    static const char *const keys[] = {"text", "text,meta", "a", "text,text"};
    Prep p;
    memset(&p, 0, sizeof p);
    p.kind = x->settings & 1 ? INPUT_TEXT : INPUT_JSONL;
    p.input = p.kind == INPUT_TEXT ? "fuzz.txt" : "fuzz.jsonl";
    parse_keys(&p, keys[(x->settings >> 3) & 3]);
    if (p.kind == INPUT_TEXT && p.n_keys != 1) p.n_keys = 1;
    p.workers = 1;
    p.append_eod = (x->settings >> 1) & 1;
    p.tok = tokenizer;
    p.eod = p.append_eod ? end_of_document_id(tokenizer, "prepare_tokenizer.json") : -1;
    p.pass = (x->settings >> 2) & 1 ? PASS_COUNT : PASS_ENCODE;
    p.fp = x->fp;
    p.total_bytes = x->size;
    bpe_counts_init(&p.counts);
    rewind_input(&p);
    Batch b;
    memset(&b, 0, sizeof b);
    bpe_counts_init(&b.counts);
    for (;;) {
        reset_batch(&b);
        if (!read_batch(&p, &b)) break;
        if (b.text[b.len] != 0) fuzz_fail("a batch is not NUL-terminated");
        if (p.kind == INPUT_JSONL) process_jsonl(&p, &b);
        else process_text(&p, &b);
        if (b.error[0]) mt_die("%s", b.error);
        if (p.pass == PASS_ENCODE) check_batch(&p, &b);
        p.documents += b.documents;
        if (p.pass == PASS_COUNT) bpe_counts_merge(&p.counts, &b.counts);
    }
    free(b.text);
    for (int k = 0; k < MAX_KEYS; k++) free(b.tokens[k].v), free(b.meta[k].v);
    bpe_counts_free(&b.counts);
    bpe_counts_free(&p.counts);
    free(p.carry);
    if (!p.documents) mt_die("--input %s holds no document; there is nothing to prepare", p.input);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tokenizer) build_tokenizer();
    if (size < 1) return 0;
    Ctx x = {data[0], NULL, (int64_t)size - 1};
    // the FILE is opened outside fuzz_run: its memory belongs to stdio, not to the parser
    static char empty[1];
    x.fp = fmemopen(size > 1 ? (void *)(data + 1) : empty, size > 1 ? size - 1 : 0, "rb");
    if (!x.fp) return 0;
    setvbuf(x.fp, NULL, _IONBF, 0);  // no stdio buffer allocated inside fuzz_run either
    fuzz_run(body, &x);
    fclose(x.fp);
    return 0;
}

// prepare.c — `moetron prepare`: tokenize a .jsonl or .txt file into Megatron-Core indexed
// datasets (PREFIX_<key>_document.bin/.idx), training a byte-level BPE first when asked.
//
// Input (docs/data.md):
//   .jsonl / .json  one JSON object per line; each key of --json-keys gives one document
//                   per line to the dataset of that key. A key's value is a string (one
//                   sequence) or an array of strings (one sequence each, as Megatron's
//                   preprocess_data.py). Lines holding only whitespace are skipped.
//   .txt            one document per paragraph: a maximal run of non-blank lines (a blank
//                   line holds only spaces, tabs, \r, \v, \f). The document is the bytes of
//                   the paragraph as in the file, without the line break after its last
//                   line. One dataset, named by the single --json-keys key (default text).
// --append-eod ends every non-empty document with the end-of-document token.
//
// The file is read in batches of whole records (about BATCH_BYTES); --workers threads
// parse and tokenize batches while the main thread reads the next ones and appends the
// finished ones to the builders strictly in input order, so the output does not depend on
// the number of workers and memory stays bounded (a few batches per worker).
//
// With --vocab-size N and no --tokenizer-model a first pass counts the GPT-2 pre-tokenised
// words (in parallel, one count map per batch, merged in order), bpe_train learns N - 1
// tokens, and <|endoftext|> is added as id N - 1 (bpe_train.h has the rule).
//
// Nothing appears at the output prefix until everything succeeded: the builders and the
// tokenizer write under "<name>.prepare-<pid>" names that are renamed at the end; on any
// error those are removed (atexit), so a failed run leaves no file behind.
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd/commands.h"
#include "cmd/prepare.h"
#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/timer.h"
#include "data/indexed.h"
#include "tokenizer/bpe.h"
#include "tokenizer/bpe_train.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_type.h"

#define MAX_KEYS 16
#define BATCH_BYTES (256 << 10)   // a batch ends at the first record boundary past this
#define READ_CHUNK (256 << 10)
#define EOD_TOKEN "<|endoftext|>"
#define MAX_VOCAB (1 << 24)

typedef enum { INPUT_JSONL, INPUT_TEXT } InputKind;
typedef enum { PASS_COUNT, PASS_ENCODE } Pass;

typedef struct {
    char *text;              // whole records (lines / paragraphs) of the input
    size_t len, cap;
    int64_t first_line;      // line number of text[0]
    // PASS_ENCODE results, per key: the tokens of every document back to back, and
    // meta = for each document its sequence count followed by the sequence lengths
    IdVec tokens[MAX_KEYS], meta[MAX_KEYS];
    int64_t documents;
    BpeWordCounts counts;    // PASS_COUNT result
    char error[768];         // the first error in the batch: the run dies with it in order
    int done;
} Batch;

typedef struct {
    // settings
    const char *input;
    const char *input_flag;  // how messages name the input: --input, or --data-path
    int quiet;               // no progress lines
    InputKind kind;
    char keys[MAX_KEYS][128];
    int n_keys;
    int workers, append_eod, train_vocab;
    char out_prefix[MT_PATH_MAX];
    // reading
    FILE *fp;
    int64_t total_bytes;
    char *carry;             // bytes read past the last batch's end
    size_t carry_len, carry_cap;
    int eof;
    int64_t next_line;
    // tokenizing
    Pass pass;
    const Tokenizer *tok;
    int32_t eod;
    BpeWordCounts counts;    // PASS_COUNT: all words so far
    IndexedBuilder *builders[MAX_KEYS];
    IdVec *stream;           // prepare_tokenize_stream: every token in memory instead of builders
    int64_t documents, tokens[MAX_KEYS];
    // the worker pool
    pthread_mutex_t mu;
    pthread_cond_t ready_cv, done_cv;
    Batch *slots;
    int n_slots;
    int64_t n_filled, n_claimed;
    int stop;
} Prep;

// ---- leaving no partial output ------------------------------------------------------------

// Files named "<name>.prepare-<pid>" or "<name>.prepare-<pid>.*" in the output directory
// are this run's temporary files; they are removed unless the run finished.
static char g_tmp_dir[MT_PATH_MAX];
static char g_tmp_names[MAX_KEYS + 1][MT_PATH_MAX];
static int g_tmp_count, g_finished;

// A path printed into out (MT_PATH_MAX bytes); too long a path is an error.
static void path_printf(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void path_printf(char *out, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, MT_PATH_MAX, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= MT_PATH_MAX) mt_die("--output-prefix: the path %.80s... is too long", out);
}

static void remove_temporaries(void) {
    if (g_finished || !g_tmp_count) return;
    DIR *dir = opendir(g_tmp_dir);
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir)))
        for (int i = 0; i < g_tmp_count; i++) {
            size_t n = strlen(g_tmp_names[i]);
            if (strncmp(e->d_name, g_tmp_names[i], n) || (e->d_name[n] && e->d_name[n] != '.')) continue;
            char path[2 * MT_PATH_MAX + 2];
            if (snprintf(path, sizeof path, "%s/%s", g_tmp_dir, e->d_name) < (int)sizeof path) unlink(path);
        }
    closedir(dir);
}

// The temporary name of final path into tmp ("<path>.prepare-<pid>"), registered for removal.
static void temporary_path(const char *final_path, char *tmp) {
    path_printf(tmp, "%s.prepare-%ld", final_path, (long)getpid());
    const char *slash = strrchr(tmp, '/');
    path_printf(g_tmp_names[g_tmp_count++], "%s", slash ? slash + 1 : tmp);
}

static void rename_or_die(const char *from, const char *to) {
    if (rename(from, to)) mt_die("cannot rename %s to %s: %s", from, to, strerror(errno));
}

// ---- settings ---------------------------------------------------------------------------

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static void parse_keys(Prep *p, const char *list) {
    for (const char *s = list; *s;) {
        const char *comma = strchr(s, ',');
        size_t n = comma ? (size_t)(comma - s) : strlen(s);
        if (!n) mt_die("--json-keys '%s': empty key", list);
        if (p->n_keys == MAX_KEYS) mt_die("--json-keys: at most %d keys", MAX_KEYS);
        if (n >= sizeof p->keys[0]) mt_die("--json-keys: key '%.*s' is too long", (int)n, s);
        memcpy(p->keys[p->n_keys], s, n);
        p->keys[p->n_keys][n] = 0;
        if (memchr(s, '/', n)) mt_die("--json-keys: key '%s' names output files and cannot hold '/'", p->keys[p->n_keys]);
        for (int k = 0; k < p->n_keys; k++)
            if (!strcmp(p->keys[k], p->keys[p->n_keys])) mt_die("--json-keys: key '%s' is given twice", p->keys[k]);
        p->n_keys++;
        s += n + (comma != NULL);
    }
    if (!p->n_keys) mt_die("--json-keys needs at least one key");
}

// The directory of --output-prefix DIR/name, created (with its parents) when missing.
static void prepare_output_directory(const char *prefix) {
    const char *slash = strrchr(prefix, '/');
    if (slash == prefix) path_printf(g_tmp_dir, "/");
    else if (slash) path_printf(g_tmp_dir, "%.*s", (int)(slash - prefix), prefix);
    else path_printf(g_tmp_dir, ".");
    if (slash && !slash[1]) mt_die("--output-prefix %s ends with '/'; give a file name prefix (DIR/name)", prefix);
    struct stat st;
    if (make_directories(g_tmp_dir) || stat(g_tmp_dir, &st) || !S_ISDIR(st.st_mode))
        mt_die("--output-prefix %s: cannot create the directory %s: %s", prefix, g_tmp_dir, strerror(errno));
    if (access(g_tmp_dir, W_OK)) mt_die("--output-prefix %s: directory %s is not writable", prefix, g_tmp_dir);
}

static void open_input(Prep *p) {
    char err[512];
    uint64_t size;
    p->fp = open_input_stream(p->input, INFILE_DATA, &size, err, sizeof err);
    if (!p->fp) mt_die("%s %s: %s", p->input_flag, p->input, err);
    p->total_bytes = (int64_t)size;
}

static int is_jsonl_name(const char *path) { return ends_with(path, ".jsonl") || ends_with(path, ".json"); }

static void configure(Prep *p, const Config *c) {
    if (!c->input[0]) mt_die("moetron prepare needs --input FILE (.jsonl with one JSON object per line, or .txt)");
    if (!c->output_prefix[0]) mt_die("moetron prepare needs --output-prefix PREFIX (writes PREFIX_<key>_document.bin/.idx)");
    p->input = c->input;
    p->input_flag = "--input";
    if (is_jsonl_name(c->input)) p->kind = INPUT_JSONL;
    else if (ends_with(c->input, ".txt")) p->kind = INPUT_TEXT;
    else mt_die("--input %s: unknown format; name it .jsonl (one JSON object per line) or .txt (plain text)", c->input);
    parse_keys(p, c->json_keys);
    if (p->kind == INPUT_TEXT && p->n_keys != 1)
        mt_die("--input %s is plain text, which makes one dataset: give one --json-keys name (default text)", c->input);
    // NullTokenizer takes its vocabulary from --vocab-size; otherwise the flag trains a BPE
    p->train_vocab = config_flag_given(c, "vocab-size") && tokenizer_type_of(c) != TOKENIZER_TYPE_NULL;
    if (p->train_vocab && config_has_tokenizer(c))
        mt_die("--vocab-size trains a new tokenizer; with --tokenizer-model %s leave it out", c->tokenizer_model);
    if (!p->train_vocab && !config_has_tokenizer(c))
        mt_die("moetron prepare needs a tokenizer: --tokenizer-model tokenizer.json, or --vocab-size N to train a "
               "byte-level BPE on the input");
    if (p->train_vocab && (c->vocab_size < 257 || c->vocab_size > MAX_VOCAB))
        mt_die("--vocab-size %d: a byte-level BPE needs 257..%d (256 bytes + %s)", c->vocab_size, MAX_VOCAB, EOD_TOKEN);
    if (c->workers < 1 || c->workers > 256) mt_die("--workers %d: use 1..256", c->workers);
    p->workers = c->workers;
    p->append_eod = c->append_eod;
    snprintf(p->out_prefix, sizeof p->out_prefix, "%s", c->output_prefix);
    open_input(p);
    prepare_output_directory(p->out_prefix);  // once the input is known to be readable
}

// ---- reading batches of whole records ----------------------------------------------------

static int blank_line(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\v\f", s[i]) || !s[i]) return 0;
    return 1;
}

static void reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return;
    *cap = MT_MAX(need, 2 * *cap);
    *buf = mt_realloc(*buf, *cap);
}

static void rewind_input(Prep *p) {
    if (fseek(p->fp, 0, SEEK_SET)) mt_die("--input %s: cannot seek: %s", p->input, strerror(errno));
    p->carry_len = 0;
    p->eof = 0;
    p->next_line = 1;
}

// Fills b with the next records (at least BATCH_BYTES when the file has them); 0 at the end.
// Records end after a newline (jsonl) or after a blank line (txt), or at the end of the file.
static int read_batch(Prep *p, Batch *b) {
    reserve(&b->text, &b->cap, MT_MAX(p->carry_len, BATCH_BYTES + READ_CHUNK) + 1);
    if (p->carry_len) memcpy(b->text, p->carry, p->carry_len);  // carry is NULL before the first batch
    b->len = p->carry_len;
    b->first_line = p->next_line;
    size_t cut = 0, scanned = 0;  // last record end found; start of the first unexamined line
    for (;;) {
        for (char *nl; scanned < b->len && (nl = memchr(b->text + scanned, '\n', b->len - scanned));) {
            size_t end = (size_t)(nl - b->text);
            if (p->kind == INPUT_JSONL || blank_line(b->text + scanned, end - scanned)) cut = end + 1;
            scanned = end + 1;
        }
        if (cut >= BATCH_BYTES || (cut && p->eof)) break;
        if (p->eof) {
            cut = b->len;
            break;
        }
        reserve(&b->text, &b->cap, b->len + READ_CHUNK + 1);
        size_t got = fread(b->text + b->len, 1, READ_CHUNK, p->fp);
        if (ferror(p->fp)) mt_die("--input %s: read error: %s", p->input, strerror(errno));
        if (got < READ_CHUNK) p->eof = 1;
        b->len += got;
    }
    p->carry_len = b->len - cut;
    reserve(&p->carry, &p->carry_cap, p->carry_len + 1);
    memcpy(p->carry, b->text + cut, p->carry_len);
    b->len = cut;
    b->text[cut] = 0;
    for (const char *s = b->text, *e = b->text + cut; (s = memchr(s, '\n', (size_t)(e - s))); s++) p->next_line++;
    return cut > 0;
}

// ---- one batch (worker threads) ----------------------------------------------------------

// Appends one document of key k: the given texts as sequences (empty ones dropped), the
// end-of-document token after the last when asked.
static void encode_document(Prep *p, Batch *b, int k, const char *const *texts, const size_t *lens, int n) {
    if (p->pass == PASS_COUNT) {
        for (int i = 0; i < n; i++) bpe_counts_add_text(&b->counts, texts[i], lens[i]);
        return;
    }
    IdVec *tokens = &b->tokens[k], *meta = &b->meta[k];
    size_t count_at = meta->n, first = tokens->n;
    idvec_push(meta, 0);
    for (int i = 0; i < n; i++) {
        int32_t *ids;
        int m = tokenizer_encode(p->tok, texts[i], lens[i], &ids);
        for (int j = 0; j < m; j++) idvec_push(tokens, ids[j]);
        free(ids);
        if (!m) continue;
        meta->v[count_at]++;
        idvec_push(meta, m);
    }
    if (p->append_eod && tokens->n > first) {
        idvec_push(tokens, p->eod);
        meta->v[meta->n - 1]++;
    }
}

static const char *type_name(JsonType t) {
    static const char *const names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return names[t];
}

// One JSON line; returns 0 with b->error set on a problem.
static int encode_json_line(Prep *p, Batch *b, const char *line, size_t len, int64_t line_no) {
    char err[256];
    JsonValue *obj = json_parse(line, len, err, sizeof err);
    const char *where = p->input;
    if (!obj) {
        const char *what = strncmp(err, "line 1 ", 7) ? err : err + 7;
        snprintf(b->error, sizeof b->error, "%s line %lld: invalid JSON (%s); every line must be one JSON object",
                 where, (long long)line_no, what);
        return 0;
    }
    if (obj->type != JSON_OBJECT) {
        snprintf(b->error, sizeof b->error, "%s line %lld: %s, not a JSON object; every line must be one object",
                 where, (long long)line_no, type_name(obj->type));
        json_free(obj);
        return 0;
    }
    for (int k = 0; k < p->n_keys; k++) {
        const JsonValue *v = json_get(obj, p->keys[k]);
        if (!v) {
            char have[256] = "";
            for (size_t i = 0; i < obj->count && strlen(have) < 200; i++)
                snprintf(have + strlen(have), sizeof have - strlen(have), "%s\"%.40s\"", i ? ", " : "", obj->keys[i]);
            snprintf(b->error, sizeof b->error,
                     "%s line %lld: no key \"%s\" (the line has %s); give --json-keys with keys that every line has",
                     where, (long long)line_no, p->keys[k], obj->count ? have : "none");
            break;
        }
        int n = v->type == JSON_ARRAY ? (int)v->count : 1;
        const char **texts = mt_malloc((size_t)MT_MAX(n, 1) * sizeof(char *));
        size_t *lens = mt_malloc((size_t)MT_MAX(n, 1) * sizeof(size_t));
        const JsonValue *items = v->type == JSON_ARRAY ? v->items : v;
        for (int i = 0; i < n && !b->error[0]; i++) {
            if (items[i].type != JSON_STRING)
                snprintf(b->error, sizeof b->error, "%s line %lld: \"%s\" is %s; it must be a string or an array of strings",
                         where, (long long)line_no, p->keys[k], type_name(items[i].type));
            texts[i] = items[i].string;
            lens[i] = items[i].length;
        }
        if (!b->error[0]) encode_document(p, b, k, texts, lens, n);
        free(texts);
        free(lens);
        if (b->error[0]) break;
    }
    json_free(obj);
    return !b->error[0];
}

static void process_jsonl(Prep *p, Batch *b) {
    int64_t line_no = b->first_line;
    for (size_t pos = 0; pos < b->len; line_no++) {
        const char *nl = memchr(b->text + pos, '\n', b->len - pos);
        size_t end = nl ? (size_t)(nl - b->text) : b->len;
        if (!blank_line(b->text + pos, end - pos)) {
            if (!encode_json_line(p, b, b->text + pos, end - pos, line_no)) return;
            b->documents++;
        }
        pos = end + 1;
    }
}

static void process_text(Prep *p, Batch *b) {
    size_t start = 0, stop = 0;  // the current paragraph's bytes
    int open = 0;
    for (size_t pos = 0; pos <= b->len;) {
        const char *nl = pos < b->len ? memchr(b->text + pos, '\n', b->len - pos) : NULL;
        size_t end = nl ? (size_t)(nl - b->text) : b->len;
        int blank = pos == b->len || blank_line(b->text + pos, end - pos);
        if (!blank) {
            if (!open) start = pos, open = 1;
            stop = nl && end > pos && b->text[end - 1] == '\r' ? end - 1 : end;
        } else if (open) {
            const char *text = b->text + start;
            size_t len = stop - start;
            encode_document(p, b, 0, &text, &len, 1);
            b->documents++;
            open = 0;
        }
        if (pos == b->len) break;
        pos = nl ? end + 1 : b->len;
    }
}

static void *worker_main(void *arg) {
    Prep *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->n_claimed == p->n_filled) pthread_cond_wait(&p->ready_cv, &p->mu);
        if (p->stop) break;
        Batch *b = &p->slots[p->n_claimed++ % p->n_slots];
        pthread_mutex_unlock(&p->mu);
        if (p->kind == INPUT_JSONL) process_jsonl(p, b);
        else process_text(p, b);
        pthread_mutex_lock(&p->mu);
        b->done = 1;
        pthread_cond_broadcast(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

// ---- one pass over the input ---------------------------------------------------------------

static void reset_batch(Batch *b) {
    for (int k = 0; k < MAX_KEYS; k++) b->tokens[k].n = b->meta[k].n = 0;
    b->documents = 0;
    b->error[0] = 0;
    b->done = 0;
    bpe_counts_free(&b->counts);
    bpe_counts_init(&b->counts);
}

static void consume_batch(Prep *p, Batch *b) {
    p->documents += b->documents;
    if (p->pass == PASS_COUNT) {
        bpe_counts_merge(&p->counts, &b->counts);
        return;
    }
    if (p->stream) {  // one key: its tokens, documents back to back
        for (size_t i = 0; i < b->tokens[0].n; i++) idvec_push(p->stream, b->tokens[0].v[i]);
        p->tokens[0] += (int64_t)b->tokens[0].n;
        return;
    }
    for (int k = 0; k < p->n_keys; k++) {
        const int32_t *tokens = b->tokens[k].v, *meta = b->meta[k].v;
        for (size_t i = 0; i < b->meta[k].n;) {
            int32_t sequences = meta[i++];
            for (int32_t s = 0; s < sequences; s++) {
                int32_t n = meta[i++];
                indexed_builder_add(p->builders[k], tokens, n);
                tokens += n;
                p->tokens[k] += n;
            }
            indexed_builder_end_document(p->builders[k]);
        }
    }
}

static void run_pass(Prep *p, Pass pass, const char *what) {
    p->pass = pass;
    p->documents = 0;
    rewind_input(p);
    p->n_slots = 2 * p->workers + 2;
    p->slots = mt_calloc((size_t)p->n_slots, sizeof(Batch));
    p->n_filled = p->n_claimed = 0;
    p->stop = 0;
    pthread_t *threads = mt_malloc((size_t)p->workers * sizeof(pthread_t));
    for (int i = 0; i < p->workers; i++)
        if (pthread_create(&threads[i], NULL, worker_main, p)) mt_die("cannot start a worker thread");
    Progress pg;
    progress_begin(&pg, what, "MB", BYTES_PER_MB, (double)p->total_bytes, PROGRESS_ALWAYS);
    int64_t written = 0, bytes_done = 0;
    for (;;) {
        while (p->n_filled - written < p->n_slots) {
            Batch *b = &p->slots[p->n_filled % p->n_slots];
            reset_batch(b);
            if (!read_batch(p, b)) break;
            pthread_mutex_lock(&p->mu);
            p->n_filled++;
            pthread_cond_signal(&p->ready_cv);
            pthread_mutex_unlock(&p->mu);
        }
        if (written == p->n_filled) break;
        Batch *b = &p->slots[written % p->n_slots];
        pthread_mutex_lock(&p->mu);
        while (!b->done) pthread_cond_wait(&p->done_cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
        if (b->error[0]) {
            if (pg.tty && pg.shown) fputc('\n', stdout);
            mt_die("%s", b->error);
        }
        consume_batch(p, b);
        bytes_done += (int64_t)b->len;
        written++;
        if (!p->quiet) progress_update(&pg, (double)bytes_done);
    }
    if (!p->quiet) progress_end(&pg);
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->ready_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->workers; i++) pthread_join(threads[i], NULL);
    free(threads);
    for (int i = 0; i < p->n_slots; i++) {
        Batch *b = &p->slots[i];
        free(b->text);
        for (int k = 0; k < MAX_KEYS; k++) free(b->tokens[k].v), free(b->meta[k].v);
        bpe_counts_free(&b->counts);
    }
    free(p->slots);
    p->slots = NULL;
    if (!p->documents)
        mt_die("%s %s holds no document (%s); there is nothing to %s", p->input_flag, p->input,
               p->kind == INPUT_JSONL ? "a .jsonl file needs one JSON object per line"
                                      : "a .txt file needs text, one document per paragraph",
               p->stream ? "train on" : "prepare");
}

// ---- the command ---------------------------------------------------------------------------

// Trains a tokenizer of vocab_size tokens (fewer when the input runs out of pairs) on the
// input and writes it to tmp_path.
static void train_tokenizer(Prep *p, int vocab_size, const char *tmp_path) {
    bpe_counts_init(&p->counts);
    run_pass(p, PASS_COUNT, "counting");
    double start = now_seconds();
    BpeVocab v;
    bpe_train(&p->counts, vocab_size - 1, &v);
    printf("prepare: trained a byte-level BPE on %zu distinct words in %.2f s: %d tokens (%d merges) + %s\n",
           bpe_counts_distinct(&p->counts), now_seconds() - start, v.n_tokens, v.n_merges, EOD_TOKEN);
    if (v.n_tokens < vocab_size - 1)
        printf("prepare: note: the input has no more pairs to merge; the vocabulary is %d, not %d\n", v.n_tokens + 1,
               vocab_size);
    bpe_counts_free(&p->counts);
    char err[256];
    if (bpe_save_tokenizer_json(&v, EOD_TOKEN, tmp_path, err, sizeof err))
        mt_die("cannot write %s: %s", tmp_path, err);
    bpe_vocab_free(&v);
}

static int32_t end_of_document_id(const Tokenizer *t, const char *path) {
    int id = tokenizer_end_of_text_id(t);
    if (id < 0)
        mt_die("tokenizer %s has no end-of-document token (<|endoftext|>, </s>, <|im_end|>, <|end_of_text|> or "
               "<|eot_id|>); drop --append-eod or add one to its added_tokens", path);
    return id;
}

int prepare_main(Config *c) {
    Prep p;
    memset(&p, 0, sizeof p);
    configure(&p, c);
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.ready_cv, NULL);
    pthread_cond_init(&p.done_cv, NULL);
    atexit(remove_temporaries);
    double start = now_seconds();

    char tok_final[MT_PATH_MAX], tok_tmp[MT_PATH_MAX];
    char source[MT_PATH_MAX + 32];
    const char *tok_path = tokenizer_source(c, source, sizeof source);
    Tokenizer *tok;
    if (p.train_vocab) {
        path_printf(tok_final, "%s_tokenizer.json", p.out_prefix);
        temporary_path(tok_final, tok_tmp);
        train_tokenizer(&p, c->vocab_size, tok_tmp);
        tok = tokenizer_load(tok_tmp);
        tok_path = tok_final;
    } else {
        tok = tokenizer_open_config(c, NULL);
    }
    p.tok = tok;
    p.eod = p.append_eod ? end_of_document_id(tok, tok_path) : -1;
    int vocab = tokenizer_vocab_size(tok);
    IndexedDtype dtype = indexed_dtype_for_vocab(vocab);

    char final_prefix[MAX_KEYS][MT_PATH_MAX], tmp_prefix[MAX_KEYS][MT_PATH_MAX];
    for (int k = 0; k < p.n_keys; k++) {
        path_printf(final_prefix[k], "%s_%s_document", p.out_prefix, p.keys[k]);
        temporary_path(final_prefix[k], tmp_prefix[k]);
        p.builders[k] = indexed_builder_new(tmp_prefix[k], dtype);
    }
    run_pass(&p, PASS_ENCODE, "tokenizing");
    for (int k = 0; k < p.n_keys; k++) {
        if (!p.tokens[k])  // Megatron-Core cannot even open a dataset with an empty .bin
            mt_die("--input %s: every \"%s\" is empty, which would make an empty dataset; leave the key out of "
                   "--json-keys", p.input, p.keys[k]);
        indexed_builder_finish(p.builders[k]);
    }

    // everything is complete: move it into place, as indexed_builder_finish does (an old
    // .idx goes first, the new .idx comes last, so a crash never pairs old and new files)
    for (int k = 0; k < p.n_keys; k++) {
        char from[MT_PATH_MAX], to[MT_PATH_MAX];
        path_printf(to, "%s.idx", final_prefix[k]);
        if (unlink(to) && errno != ENOENT) mt_die("cannot remove the old %s: %s", to, strerror(errno));
        for (int e = 0; e < 2; e++) {
            const char *ext = e ? ".idx" : ".bin";
            path_printf(from, "%s%s", tmp_prefix[k], ext);
            path_printf(to, "%s%s", final_prefix[k], ext);
            rename_or_die(from, to);
        }
    }
    if (p.train_vocab) rename_or_die(tok_tmp, tok_final);
    fsync_dir_of(final_prefix[0]);
    g_finished = 1;

    double seconds = now_seconds() - start;
    for (int k = 0; k < p.n_keys; k++)
        printf("prepare: %s.bin/.idx: %lld documents, %lld tokens (%s)\n", final_prefix[k], (long long)p.documents,
               (long long)p.tokens[k], dtype == IDX_UINT16 ? "uint16" : "int32");
    if (p.train_vocab) printf("prepare: %s: vocabulary %d\n", tok_final, vocab);
    printf("prepare: %.1f MB in %.2f s (%.1f MB/s, %d worker%s)\n", p.total_bytes / 1e6, seconds,
           seconds > 0 ? p.total_bytes / 1e6 / seconds : 0.0, p.workers, p.workers == 1 ? "" : "s");
    tokenizer_free(tok);
    fclose(p.fp);
    free(p.carry);
    return 0;
}

int64_t prepare_tokenize_stream(const char *path, const char *flag, const char *json_key, const Tokenizer *tok,
                                int32_t eod, int workers, int32_t **tokens) {
    Prep p;
    memset(&p, 0, sizeof p);
    p.input = path;
    p.input_flag = flag;
    p.quiet = 1;
    p.kind = is_jsonl_name(path) ? INPUT_JSONL : INPUT_TEXT;
    parse_keys(&p, json_key);
    if (p.n_keys != 1) mt_die("--json-keys %s: training reads one key of %s; give one", json_key, path);
    p.workers = workers;
    p.tok = tok;
    p.eod = eod;
    p.append_eod = eod >= 0;
    IdVec stream = {0};
    p.stream = &stream;
    open_input(&p);
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.ready_cv, NULL);
    pthread_cond_init(&p.done_cv, NULL);
    run_pass(&p, PASS_ENCODE, "tokenizing");
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.ready_cv);
    pthread_cond_destroy(&p.done_cv);
    fclose(p.fp);
    free(p.carry);
    *tokens = stream.v;
    return (int64_t)stream.n;
}

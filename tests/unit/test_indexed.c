// test_indexed.c — Megatron indexed datasets (.bin/.idx): writer/reader round trip for every
// dtype at its extreme values, empty sequences and documents, an empty dataset, many
// documents and a sequence larger than the write buffer, the exact byte layout, merging
// (add_index), crash-safe naming, every validation failure with its message, tokens that
// do not fit (on write and on read), truncation of both files at every offset and random
// byte flips. Fatal paths run in a forked child: it must exit 1 with one
// "moetron: error:" line, never crash or read out of bounds (run under SANITIZE=1 too).
#include "core/common.h"
#include "core/rng.h"
#include "data/indexed.h"
#include "testlib.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

// ---------------------------------------------------------------------------
// Helpers

// A fresh directory under /tmp; the prefix PATH/ds inside it.
static void make_prefix(char *prefix, size_t n, const char *tag) {
    char dir[200];
    snprintf(dir, sizeof dir, "/tmp/moetron_test_indexed_%ld_%s", (long)getpid(), tag);
    mkdir(dir, 0700);
    snprintf(prefix, n, "%s/ds", dir);
}

// The number of entries in the directory of prefix (temporary files would show up here);
// with remove_all, removes them and the directory.
static int dir_entries(const char *prefix, int remove_all) {
    char dir[256], path[600];
    snprintf(dir, sizeof dir, "%s", prefix);
    *strrchr(dir, '/') = '\0';
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            n++;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (remove_all) remove(path);
        }
    closedir(d);
    if (remove_all) rmdir(dir);
    return n;
}

static void remove_file(const char *prefix, const char *ext) {
    char path[512];
    snprintf(path, sizeof path, "%s%s", prefix, ext);
    remove(path);
}

static int exists(const char *prefix, const char *ext) {
    char path[512];
    snprintf(path, sizeof path, "%s%s", prefix, ext);
    struct stat st;
    return stat(path, &st) == 0;
}

static uint8_t *load(const char *prefix, const char *ext, size_t *size) {
    char path[512];
    snprintf(path, sizeof path, "%s%s", prefix, ext);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        *size = 0;
        return NULL;
    }
    fseek(fp, 0, SEEK_END);
    *size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *bytes = malloc(*size + 1);
    if (fread(bytes, 1, *size, fp) != *size) *size = 0;
    fclose(fp);
    return bytes;
}

static void store(const char *prefix, const char *ext, const void *bytes, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s%s", prefix, ext);
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        printf("cannot write %s\n", path);
        exit(1);
    }
    if (size) fwrite(bytes, 1, size, fp);
    fclose(fp);
}

// Runs fn(arg) in a child with stderr captured. Returns 0 when the child returned normally,
// 1 when it died through mt_die (status 1, output exactly one "moetron: error: ..." line),
// -1 for anything else (a signal, a sanitizer report, several lines). msg gets the output.
static int run_child(void (*fn)(const void *), const void *arg, char *msg, size_t msglen) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t got;
    char chunk[256];
    while ((got = read(fds[0], chunk, sizeof chunk)) > 0) {  // keeps what fits, drains the rest
        size_t keep = MT_MIN((size_t)got, msglen - 1 - n);
        memcpy(msg + n, chunk, keep);
        n += keep;
    }
    msg[n] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status)) return -1;
    if (WEXITSTATUS(status) == 0) return n == 0 ? 0 : -1;
    const char *nl = strchr(msg, '\n');
    int one_line = nl && nl[1] == '\0';
    return WEXITSTATUS(status) == 1 && strncmp(msg, "moetron: error: ", 16) == 0 && one_line ? 1 : -1;
}

// Opens the dataset and reads every token of it.
static void open_and_read_all(const void *arg) {
    IndexedDataset d;
    indexed_open(&d, (const char *)arg);
    for (int64_t i = 0; i < d.n_sequences; i++) {
        int32_t *out = malloc((size_t)d.sequence_lengths[i] * 4 + 4);
        indexed_read(&d, i, 0, d.sequence_lengths[i], out);
        free(out);
    }
    indexed_close(&d);
}

// The dataset at prefix must be rejected with a message that names `file` and says `expect`.
#define CHECK_REJECTED(prefix, file_ext, expect)                                              \
    do {                                                                                      \
        char tl_msg[1024], tl_file[512];                                                      \
        int tl_rc = run_child(open_and_read_all, (prefix), tl_msg, sizeof tl_msg);            \
        snprintf(tl_file, sizeof tl_file, "%s%s", (prefix), (file_ext));                      \
        CHECK(tl_rc == 1 && strstr(tl_msg, tl_file) && strstr(tl_msg, (expect)),             \
              "expected a clean error naming %s with \"%s\"; rc %d: %s", tl_file, (expect), tl_rc, tl_msg); \
    } while (0)

// Datasets are described by specs: "[1 2][];;[3]" is a document of the sequences [1 2] and
// [], an empty document, and the sequence [3] left open (finish makes it a document).
enum { SPEC_MAX_TOKENS = 64 };

// The next item of a spec: 'S' for a sequence (its tokens in tokens[0..*n)), 'D' for the end
// of a document, 0 at the end of the spec.
static int next_item(const char **spec, int32_t *tokens, int *n) {
    const char *p = *spec;
    while (*p == ' ') p++;
    int item = *p == ';' ? 'D' : *p == '[' ? 'S' : 0;
    if (item) p++;
    for (*n = 0; item == 'S' && *p != ']';) {
        char *end;
        tokens[(*n)++] = (int32_t)strtol(p, &end, 10);
        for (p = end; *p == ' '; p++) {}
    }
    *spec = item == 'S' ? p + 1 : p;
    return item;
}

static void add_spec(IndexedBuilder *b, const char *spec) {
    int32_t tokens[SPEC_MAX_TOKENS];
    int n, item;
    while ((item = next_item(&spec, tokens, &n)))
        if (item == 'S') indexed_builder_add(b, tokens, n);
        else indexed_builder_end_document(b);
}

static void build(const char *prefix, IndexedDtype dtype, const char *spec) {
    IndexedBuilder *b = indexed_builder_new(prefix, dtype);
    add_spec(b, spec);
    indexed_builder_finish(b);
}

// The dataset at prefix must be exactly the spec: dtype, lengths, pointers, document indices,
// every token (and a read from the middle of each sequence of 3 or more), both file sizes.
static void check_spec(const char *prefix, IndexedDtype dtype, const char *spec) {
    IndexedDataset d;
    indexed_open(&d, prefix);
    CHECK(d.dtype == dtype && d.elem_size == indexed_dtype_size(dtype), "%s: dtype %d", spec, d.dtype);
    int32_t want[SPEC_MAX_TOKENS], out[SPEC_MAX_TOKENS];
    int64_t i = 0, j = 0, pointer = 0;
    int n, item, ok = 1;
    while (ok && (item = next_item(&spec, want, &n))) {
        if (item == 'D') {
            ok = ++j <= d.n_documents && d.document_indices[j] == i;
            CHECK(ok, "document %lld should end at sequence %lld", (long long)j - 1, (long long)i);
            continue;
        }
        ok = i < d.n_sequences && d.sequence_lengths[i] == n && d.sequence_pointers[i] == pointer;
        CHECK(ok, "sequence %lld: length or pointer differ (want %d at %lld)", (long long)i, n, (long long)pointer);
        if (!ok) break;
        indexed_read(&d, i, 0, n, out);
        CHECK(memcmp(out, want, (size_t)n * sizeof *out) == 0, "tokens of sequence %lld differ", (long long)i);
        if (n >= 3) {
            indexed_read(&d, i, 1, 2, out);
            CHECK(out[0] == want[1] && out[1] == want[2], "partial read of sequence %lld", (long long)i);
        }
        pointer += (int64_t)n * d.elem_size;
        i++;
    }
    if (ok && d.document_indices[j] != i) j++;  // sequences left open at finish
    CHECK(d.n_sequences == i && d.n_documents == j, "%lld sequences, %lld documents; want %lld, %lld",
          (long long)d.n_sequences, (long long)d.n_documents, (long long)i, (long long)j);
    CHECK(d.bin_size == (size_t)pointer, ".bin has %zu bytes, want %lld", d.bin_size, (long long)pointer);
    size_t idx_size;
    free(load(prefix, ".idx", &idx_size));
    CHECK(idx_size == (size_t)(34 + 12 * i + 8 * (j + 1)), ".idx has %zu bytes", idx_size);
    indexed_close(&d);
}

// A spec of three documents (the second one empty) with an empty sequence, over values[0..5].
static void small_spec(char *spec, size_t n, const int32_t *v) {
    snprintf(spec, n, "[%d %d %d][];;[%d][%d %d %d %d][%d %d];", v[0], v[1], v[2], v[3], v[4], v[5], v[0], v[1],
             v[2], v[3]);
}

// ---------------------------------------------------------------------------
// Cases

static void test_dtype_table(void) {
    const char *names[] = {NULL, "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"};
    const int sizes[] = {0, 1, 1, 2, 4, 8, 8, 4, 2};
    for (int code = 0; code <= 9; code++) {
        const char *want = code <= 8 ? names[code] : NULL;
        const char *got = indexed_dtype_name(code);
        CHECK((want == NULL && got == NULL) || (want && got && strcmp(want, got) == 0), "name of %d", code);
        CHECK(indexed_dtype_size(code) == (code <= 8 ? sizes[code] : 0), "size of %d", code);
        IndexedDtype back;
        if (want) CHECK(indexed_dtype_from_name(want, &back) && (int)back == code, "from name %s", want);
    }
    IndexedDtype x;
    CHECK(!indexed_dtype_from_name("int", &x) && !indexed_dtype_from_name("", &x), "unknown names accepted");
    CHECK(indexed_dtype_for_vocab(257) == IDX_UINT16 && indexed_dtype_for_vocab(65499) == IDX_UINT16, "uint16");
    CHECK(indexed_dtype_for_vocab(65500) == IDX_INT32 && indexed_dtype_for_vocab(151936) == IDX_INT32, "int32");
}

static void test_round_trip_every_dtype(void) {
    char prefix[256];
    make_prefix(prefix, sizeof prefix, "rt");
    for (int code = 1; code <= 8; code++) {
        IndexedDtype dtype = (IndexedDtype)code;
        int32_t values[6];
        switch (dtype) {
        case IDX_UINT8: memcpy(values, (int32_t[]){0, 255, 1, 128, 7, 254}, sizeof values); break;
        case IDX_INT8: memcpy(values, (int32_t[]){-128, 127, 0, -1, 5, 100}, sizeof values); break;
        case IDX_INT16: memcpy(values, (int32_t[]){-32768, 32767, 0, -1, 300, 12345}, sizeof values); break;
        case IDX_UINT16: memcpy(values, (int32_t[]){0, 65535, 65499, 256, 1, 50000}, sizeof values); break;
        case IDX_FLOAT32: memcpy(values, (int32_t[]){-16777216, 16777216, 0, -1, 3, 65537}, sizeof values); break;
        default: memcpy(values, (int32_t[]){INT32_MIN, INT32_MAX, 0, -1, 65536, 151935}, sizeof values); break;
        }
        char spec[256];
        small_spec(spec, sizeof spec, values);
        build(prefix, dtype, spec);
        check_spec(prefix, dtype, spec);
    }
    dir_entries(prefix, 1);
}

// The exact bytes of a small uint16 dataset (what Megatron-Core writes for it).
static void test_byte_layout(void) {
    char prefix[256];
    make_prefix(prefix, sizeof prefix, "bytes");
    build(prefix, IDX_UINT16, "[1 258][];[65535];");
    static const uint8_t want_idx[] = {
        'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,  // magic
        1, 0, 0, 0, 0, 0, 0, 0,                   // version
        8,                                        // uint16
        3, 0, 0, 0, 0, 0, 0, 0,                   // sequences
        3, 0, 0, 0, 0, 0, 0, 0,                   // document indices
        2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0,       // lengths
        0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0,  // pointers
        0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0,  // documents
    };
    static const uint8_t want_bin[] = {1, 0, 2, 1, 255, 255};
    size_t ni, nb;
    uint8_t *idx = load(prefix, ".idx", &ni), *bin = load(prefix, ".bin", &nb);
    CHECK(ni == sizeof want_idx && memcmp(idx, want_idx, ni) == 0, ".idx bytes differ (%zu bytes)", ni);
    CHECK(nb == sizeof want_bin && memcmp(bin, want_bin, nb) == 0, ".bin bytes differ (%zu bytes)", nb);
    free(idx);
    free(bin);
    dir_entries(prefix, 1);
}

static void test_empty_datasets(void) {
    char prefix[256];
    make_prefix(prefix, sizeof prefix, "empty");
    const char *specs[] = {"", ";;", "[][];[];", "[]", ";[-5 6];;"};  // no tokens at all, then empty documents
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        build(prefix, IDX_INT16, specs[k]);
        check_spec(prefix, IDX_INT16, specs[k]);
    }
    IndexedDataset d;
    build(prefix, IDX_UINT8, "[][];[];");
    indexed_open(&d, prefix);
    CHECK(d.bin_size == 0 && d.bin_map == NULL && d.n_sequences == 3, "sequences without tokens");
    indexed_read(&d, 2, 0, 0, NULL);  // an empty read of an unmapped .bin
    indexed_close(&d);
    dir_entries(prefix, 1);
}

// 20000 documents of 0-40 random tokens each and one sequence of 700k tokens (larger than
// the 1 MiB write buffer), read back exactly.
static void test_many_documents(void) {
    char prefix[256];
    make_prefix(prefix, sizeof prefix, "many");
    enum { DOCS = 20000, BIG = 700000 };
    Rng rng;
    rng_seed(&rng, 7);
    int32_t *big = malloc(BIG * sizeof *big);
    for (int k = 0; k < BIG; k++) big[k] = (int32_t)rng_below(&rng, 151936);
    IndexedBuilder *b = indexed_builder_new(prefix, IDX_INT32);
    int32_t tokens[40];
    rng_seed(&rng, 8);
    for (int j = 0; j < DOCS; j++) {
        int n_seq = (int)rng_below(&rng, 3);
        for (int q = 0; q < n_seq; q++) {
            int n = (int)rng_below(&rng, 41);
            for (int t = 0; t < n; t++) tokens[t] = (int32_t)rng_below(&rng, 151936);
            indexed_builder_add(b, tokens, n);
        }
        if (j == DOCS / 2) indexed_builder_add(b, big, BIG);
        indexed_builder_end_document(b);
    }
    indexed_builder_finish(b);

    IndexedDataset d;
    indexed_open(&d, prefix);
    CHECK(d.n_documents == DOCS, "%lld documents", (long long)d.n_documents);
    rng_seed(&rng, 8);
    int32_t *out = malloc(BIG * sizeof *out);
    int wrong = 0;
    int64_t i = 0;
    for (int j = 0; j < DOCS && !wrong; j++) {
        wrong += d.document_indices[j] != i;
        int n_seq = (int)rng_below(&rng, 3);
        for (int q = 0; q < n_seq; q++, i++) {
            int n = (int)rng_below(&rng, 41);
            for (int t = 0; t < n; t++) tokens[t] = (int32_t)rng_below(&rng, 151936);
            wrong += d.sequence_lengths[i] != n;
            if (d.sequence_lengths[i] == n) {
                indexed_read(&d, i, 0, n, out);
                wrong += memcmp(out, tokens, (size_t)n * 4) != 0;
            }
        }
        if (j == DOCS / 2) {
            wrong += d.sequence_lengths[i] != BIG;
            if (d.sequence_lengths[i] == BIG) {
                indexed_read(&d, i, 0, BIG, out);
                wrong += memcmp(out, big, BIG * sizeof *out) != 0;
            }
            i++;
        }
    }
    CHECK(wrong == 0 && d.n_sequences == i, "%d mismatches, %lld sequences", wrong, (long long)d.n_sequences);
    indexed_close(&d);
    free(out);
    free(big);
    dir_entries(prefix, 1);
}

// Sequences after the last end_document form one more document at finish.
static void test_finish_ends_open_document(void) {
    char prefix[256];
    make_prefix(prefix, sizeof prefix, "open");
    build(prefix, IDX_INT32, "[1 2];[3][4]");
    check_spec(prefix, IDX_INT32, "[1 2];[3][4];");
    dir_entries(prefix, 1);
}

// add_index appends a dataset's tokens, sequences and documents; sequences added before it
// without end_document join its first document (as in Megatron's add_index).
static void test_add_index(void) {
    char a[256], out[256];
    make_prefix(a, sizeof a, "merge_a");
    make_prefix(out, sizeof out, "merge_out");
    build(a, IDX_INT16, "[10 11][12];[13 14 15];");
    IndexedBuilder *b = indexed_builder_new(out, IDX_INT16);
    add_spec(b, "[1];[2 3]");  // the open document joins a's first one
    indexed_builder_add_index(b, a);
    indexed_builder_add_index(b, a);
    indexed_builder_finish(b);
    check_spec(out, IDX_INT16, "[1];[2 3][10 11][12];[13 14 15];[10 11][12];[13 14 15];");
    dir_entries(a, 1);
    dir_entries(out, 1);
}

// Until finish, neither final name exists (and an older pair is untouched); finish replaces
// the pair; abort leaves the older pair; no temporary file is left behind either way.
static void test_crash_safe_names(void) {
    char prefix[256];
    make_prefix(prefix, sizeof prefix, "atomic");
    IndexedBuilder *b = indexed_builder_new(prefix, IDX_UINT8);
    add_spec(b, "[1 2 3];");
    CHECK(!exists(prefix, ".bin") && !exists(prefix, ".idx"), "final names exist before finish");
    CHECK(dir_entries(prefix, 0) == 1, "expected one temporary file");
    indexed_builder_finish(b);
    CHECK(dir_entries(prefix, 0) == 2, "temporary files left behind");

    b = indexed_builder_new(prefix, IDX_UINT8);
    add_spec(b, "[9];");
    indexed_builder_abort(b);
    CHECK(dir_entries(prefix, 0) == 2, "abort left files behind");
    check_spec(prefix, IDX_UINT8, "[1 2 3];");

    b = indexed_builder_new(prefix, IDX_UINT8);
    add_spec(b, "[9];");
    check_spec(prefix, IDX_UINT8, "[1 2 3];");  // still the old pair
    indexed_builder_finish(b);
    check_spec(prefix, IDX_UINT8, "[9];");
    CHECK(dir_entries(prefix, 0) == 2, "temporary files left behind");
    dir_entries(prefix, 1);
}

// ---------------------------------------------------------------------------
// Rejections

// small_spec as int16: 5 sequences (lengths 3 0 1 4 2), 3 documents; the .idx layout offsets.
enum { N_SEQ = 5, LEN_AT = 34, PTR_AT = 34 + 4 * N_SEQ, DOC_AT = 34 + 12 * N_SEQ, IDX_BYTES = DOC_AT + 8 * 4 };

typedef struct {
    char good[256], bad[300];
    uint8_t *idx, *bin;
    size_t idx_size, bin_size;
} Fixture;

static void fixture_init(Fixture *f, const char *tag) {
    make_prefix(f->good, sizeof f->good, tag);
    snprintf(f->bad, sizeof f->bad, "%s_bad", f->good);
    char spec[256];
    small_spec(spec, sizeof spec, (int32_t[]){-3, 700, 9, -3, 700, 9});
    build(f->good, IDX_INT16, spec);
    f->idx = load(f->good, ".idx", &f->idx_size);
    f->bin = load(f->good, ".bin", &f->bin_size);
}

static void fixture_free(Fixture *f) {
    free(f->idx);
    free(f->bin);
    dir_entries(f->good, 1);
}

// Writes the bad pair: the good .idx cut or zero-extended to idx_size bytes with the
// `width` bytes at `at` replaced by `value` (little-endian), and the good .bin cut or
// zero-extended to bin_size bytes.
static void write_bad(const Fixture *f, size_t idx_size, size_t bin_size, int at, int width, int64_t value) {
    uint8_t *idx = calloc(idx_size + 64, 1), *bin = calloc(bin_size + 64, 1);
    memcpy(idx, f->idx, MT_MIN(idx_size, f->idx_size));
    memcpy(bin, f->bin, MT_MIN(bin_size, f->bin_size));
    memcpy(idx + at, &value, (size_t)width);
    store(f->bad, ".idx", idx, idx_size);
    store(f->bad, ".bin", bin, bin_size);
    free(idx);
    free(bin);
}

// One corrupted pair and the error it must give: the field (offset and width in the .idx)
// and its new value, bytes added to (or cut from) each file, the file the message names.
typedef struct {
    int at, width;
    int64_t value;
    int idx_extra, bin_extra;
    const char *file, *expect;
} Corruption;
#define LENGTH(i) LEN_AT + 4 * (i), 4
#define POINTER(i) PTR_AT + 8 * (i), 8
#define DOCUMENT(i) DOC_AT + 8 * (i), 8
#define NO_EDIT 0, 0, 0

static const Corruption CORRUPTIONS[] = {
    {0, 1, 'm', 0, 0, ".idx", "does not start with MMIDIDX"},
    {8, 1, ' ', 0, 0, ".idx", "does not start with MMIDIDX"},
    {9, 8, 2, 0, 0, ".idx", "index version 2"},
    {17, 1, 0, 0, 0, ".idx", "unknown token dtype code 0"},
    {17, 1, 9, 0, 0, ".idx", "unknown token dtype code 9"},
    {17, 1, IDX_UINT8, 0, 0, ".idx", "pointers not consistent with lengths"},  // byte pointers 0 6 6 8 16
    {17, 1, IDX_INT32, 0, 0, ".idx", "sequence 1 has pointer 6: negative or not a multiple of the 4-byte int32"},
    {18, 8, 6, 0, 0, ".idx", "header says 6 sequences and 4 document indices"},
    {18, 8, INT64_MAX, 0, 0, ".idx", "do not match the file length"},
    {26, 8, 5, 0, 0, ".idx", "do not match the file length"},
    {26, 8, 0, 0, 0, ".idx", "document count 0"},
    {NO_EDIT, N_SEQ, 0, ".idx", "multimodal"},
    {NO_EDIT, 1, 0, ".idx", "do not match the file length"},
    {NO_EDIT, -1, 0, ".idx", "do not match the file length"},
    {LENGTH(1), -1, 0, 0, ".idx", "sequence 1 has negative length -1"},
    {POINTER(2), 7, 0, 0, ".idx", "sequence 2 has pointer 7: negative or not a multiple of the 2-byte int16"},
    {POINTER(0), -2, 0, 0, ".idx", "negative or not a multiple"},
    {POINTER(3), 4, 0, 0, ".idx", "sequence pointers are not monotone: sequence 3 starts at byte 4"},
    {POINTER(0), 2, 0, 0, ".idx", "sequence 0 starts at byte 2, but the lengths before it end at byte 0"},
    {LENGTH(0), 2, 0, 0, ".idx", "sequence 1 starts at byte 6, but the lengths before it end at byte 4"},
    {LENGTH(4), 3, 0, 0, ".bin", "has 20 bytes, but sequence 4 of"},
    {LENGTH(4), INT32_MAX, 0, 0, ".bin", "truncated, or not the .bin of this .idx"},
    {NO_EDIT, 0, -2, ".bin", "has 18 bytes, but sequence 4"},
    {NO_EDIT, 0, 2, ".bin", "has 22 bytes, but the 5 sequences"},
    {DOCUMENT(0), 1, 0, 0, ".idx", "document indices start at 1, not 0"},
    {DOCUMENT(2), 1, 0, 0, ".idx", "document indices are not monotone: entry 2 is 1, after 2"},
    {DOCUMENT(3), 4, 0, 0, ".idx", "document indices end at 4, not at the sequence count 5"},
    {DOCUMENT(3), 6, 0, 0, ".idx", "document indices end at 6"},
};

static void test_rejections(void) {
    Fixture f;
    fixture_init(&f, "reject");
    CHECK(f.idx_size == IDX_BYTES && f.bin_size == 20, "fixture: %zu %zu", f.idx_size, f.bin_size);
    const char *p = f.bad;
    CHECK_REJECTED(p, ".idx", "cannot open");  // nothing written yet
    char msg[1024];
    write_bad(&f, f.idx_size, f.bin_size, NO_EDIT);
    CHECK(run_child(open_and_read_all, p, msg, sizeof msg) == 0, "the unmodified copy is rejected: %s", msg);
    remove_file(p, ".bin");
    CHECK_REJECTED(p, ".bin", "cannot open");

    for (size_t k = 0; k < sizeof CORRUPTIONS / sizeof CORRUPTIONS[0]; k++) {
        const Corruption *c = &CORRUPTIONS[k];
        write_bad(&f, f.idx_size + c->idx_extra, f.bin_size + c->bin_extra, c->at, c->width, c->value);
        CHECK_REJECTED(p, c->file, c->expect);
    }

    char too_long[1100];
    memset(too_long, 'a', sizeof too_long - 1);
    too_long[sizeof too_long - 1] = '\0';
    CHECK(run_child(open_and_read_all, too_long, msg, sizeof msg) == 1 && strstr(msg, "prefix is too long"), "%s",
          msg);
    fixture_free(&f);
}

// Values stored in int64/float datasets that are not int32 token ids fail at read time.
static void write_raw_dataset(const char *prefix, IndexedDtype dtype, const void *tokens, int n) {
    IndexedBuilder *b = indexed_builder_new(prefix, dtype);
    int32_t zeros[8] = {0};
    indexed_builder_add(b, zeros, n);
    indexed_builder_end_document(b);
    indexed_builder_finish(b);
    store(prefix, ".bin", tokens, (size_t)n * indexed_dtype_size(dtype));
}

static void test_read_rejects_non_int32_values(void) {
    char prefix[256];
    make_prefix(prefix, sizeof prefix, "values");
    write_raw_dataset(prefix, IDX_INT64, (int64_t[]){1, (int64_t)INT32_MAX + 1}, 2);
    CHECK_REJECTED(prefix, ".bin", "token 1 of sequence 0 is 2147483648, not an int32 token id");
    write_raw_dataset(prefix, IDX_INT64, (int64_t[]){INT64_MIN, 0}, 2);
    CHECK_REJECTED(prefix, ".bin", "token 0 of sequence 0 is -9.22");
    write_raw_dataset(prefix, IDX_INT64, (int64_t[]){INT32_MIN, INT32_MAX}, 2);
    char msg[1024];
    CHECK(run_child(open_and_read_all, prefix, msg, sizeof msg) == 0, "int32 extremes in int64 rejected: %s", msg);
    write_raw_dataset(prefix, IDX_FLOAT32, (float[]){1, 2, 0.5f}, 3);
    CHECK_REJECTED(prefix, ".bin", "token 2 of sequence 0 is 0.5,");
    write_raw_dataset(prefix, IDX_FLOAT64, (double[]){NAN}, 1);
    CHECK_REJECTED(prefix, ".bin", "is nan");
    write_raw_dataset(prefix, IDX_FLOAT64, (double[]){4294967296.0}, 1);
    CHECK_REJECTED(prefix, ".bin", "not an int32 token id");
    write_raw_dataset(prefix, IDX_FLOAT32, (float[]){-INFINITY}, 1);
    CHECK_REJECTED(prefix, ".bin", "is -inf");
    dir_entries(prefix, 1);
}

// The id range of every dtype (negative ids included), the empty dataset, saturation beyond
// int64, and the first token outside [0, limit) located by document, sequence and position
// (empty documents and sequences before it included).
static void test_token_range_and_first_outside(void) {
    char prefix[256], spec[256];
    make_prefix(prefix, sizeof prefix, "range");
    const IndexedDtype dtypes[] = {IDX_UINT8, IDX_INT8, IDX_INT16, IDX_INT32, IDX_INT64, IDX_FLOAT64, IDX_FLOAT32,
                                   IDX_UINT16};
    for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++) {
        int negative = dtypes[k] != IDX_UINT8 && dtypes[k] != IDX_UINT16;
        snprintf(spec, sizeof spec, "[5 7];;[][9 %d 3];[120 2 1]", negative ? -4 : 0);
        build(prefix, dtypes[k], spec);
        IndexedDataset d;
        indexed_open(&d, prefix);
        int64_t lo, hi;
        indexed_token_range(&d, &lo, &hi);
        CHECK(lo == (negative ? -4 : 0) && hi == 120, "%s: range [%lld, %lld]", indexed_dtype_name(dtypes[k]),
              (long long)lo, (long long)hi);
        IndexedToken bad;
        const char *name = indexed_dtype_name(dtypes[k]);
        CHECK(indexed_find_token_outside(&d, 9, &bad) && bad.document == 2 && bad.sequence == 2 &&
                  bad.position == 0 && bad.value == 9,
              "%s: 9 is in document %lld sequence %lld token %lld (%g)", name, (long long)bad.document,
              (long long)bad.sequence, (long long)bad.position, bad.value);
        int found = indexed_find_token_outside(&d, 121, &bad);
        if (negative)  // -4 is outside [0, 121) too
            CHECK(found && bad.document == 2 && bad.position == 1 && bad.value == -4, "%s: -4 not found", name);
        else
            CHECK(!found, "%s: all below 121, but %g found", name, bad.value);
        indexed_close(&d);
    }
    IndexedDataset d;
    int64_t lo, hi;
    build(prefix, IDX_UINT16, "[][];");
    indexed_open(&d, prefix);
    indexed_token_range(&d, &lo, &hi);
    CHECK(lo == 0 && hi == -1, "no tokens: [%lld, %lld]", (long long)lo, (long long)hi);
    indexed_close(&d);

    write_raw_dataset(prefix, IDX_FLOAT64, (double[]){1e300, -1e300}, 2);
    indexed_open(&d, prefix);
    indexed_token_range(&d, &lo, &hi);
    CHECK(lo == INT64_MIN && hi == INT64_MAX, "saturation: [%lld, %lld]", (long long)lo, (long long)hi);
    indexed_close(&d);
    dir_entries(prefix, 1);
}

typedef struct {
    const char *prefix;
    IndexedDtype dtype;
    int32_t token;
    int64_t n;
} WriteCase;

static void write_one(const void *arg) {
    const WriteCase *w = arg;
    IndexedBuilder *b = indexed_builder_new(w->prefix, w->dtype);
    indexed_builder_add(b, &w->token, w->n);
    indexed_builder_finish(b);
}

static void read_out_of_range(const void *arg) {
    const int64_t *r = arg;  // sequence, offset, length
    IndexedDataset d;
    indexed_open(&d, "/tmp/moetron_test_indexed_range");
    int32_t out[8];
    indexed_read(&d, r[0], r[1], r[2], out);
}

static void test_writer_and_reader_refuse_bad_requests(void) {
    char prefix[256], msg[1024];
    make_prefix(prefix, sizeof prefix, "refuse");
    const struct {
        IndexedDtype dtype;
        int32_t token;
        int64_t n;
        const char *expect;
    } cases[] = {
        {IDX_UINT8, 256, 1, "token 256 does not fit the dataset dtype uint8 (0 to 255)"},
        {IDX_UINT8, -1, 1, "does not fit"},
        {IDX_INT8, -129, 1, "int8 (-128 to 127)"},
        {IDX_INT16, 32768, 1, "int16"},
        {IDX_UINT16, 65536, 1, "uint16 (0 to 65535); use int32"},
        {IDX_FLOAT32, 16777217, 1, "float32"},
        {IDX_INT32, 0, -1, "a sequence of -1 tokens cannot be stored"},
        {(IndexedDtype)9, 0, 0, "unknown indexed dataset dtype code 9"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        WriteCase w = {prefix, cases[c].dtype, cases[c].token, cases[c].n};
        int rc = run_child(write_one, &w, msg, sizeof msg);
        CHECK(rc == 1 && strstr(msg, cases[c].expect), "case %zu: rc %d: %s", c, rc, msg);
    }
    CHECK(!exists(prefix, ".bin") && !exists(prefix, ".idx"), "a refused write left final files");
    dir_entries(prefix, 1);

    build("/tmp/moetron_test_indexed_range", IDX_INT32, "[1 2 3]");
    const int64_t bad[][3] = {{1, 0, 1}, {-1, 0, 1}, {0, 2, 2}, {0, -1, 1}, {0, 0, -1}, {0, 4, 0}};
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        int rc = run_child(read_out_of_range, bad[c], msg, sizeof msg);
        CHECK(rc == 1 && (strstr(msg, "out of range") || strstr(msg, "does not exist")), "read %zu: rc %d: %s", c,
              rc, msg);
    }
    const int64_t fine[3] = {0, 3, 0};
    CHECK(run_child(read_out_of_range, fine, msg, sizeof msg) == 0, "empty read at the end refused: %s", msg);
    remove_file("/tmp/moetron_test_indexed_range", ".bin");
    remove_file("/tmp/moetron_test_indexed_range", ".idx");
}

// Every truncation of either file is an error, never a crash.
static void test_truncation_at_every_offset(void) {
    Fixture f;
    fixture_init(&f, "trunc");
    int accepted = 0, crashed = 0;
    char msg[1024];
    for (size_t len = 0; len < f.idx_size + f.bin_size; len++) {
        int cut_idx = len < f.idx_size;
        write_bad(&f, cut_idx ? len : f.idx_size, cut_idx ? f.bin_size : len - f.idx_size, NO_EDIT);
        int rc = run_child(open_and_read_all, f.bad, msg, sizeof msg);
        accepted += rc == 0;
        if (rc < 0 && crashed++ == 0) printf("     crash at %s length %zu: %s\n", cut_idx ? "idx" : "bin", len, msg);
    }
    CHECK(accepted == 0 && crashed == 0, "%d truncated pairs accepted, %d crashed", accepted, crashed);
    fixture_free(&f);
}

// Random byte changes in either file: a clean error or a valid dataset, never a crash.
static void test_random_byte_flips(void) {
    Fixture f;
    fixture_init(&f, "flip");
    Rng rng;
    rng_seed(&rng, 11);
    int crashed = 0, rejected = 0;
    char msg[1024];
    uint8_t *idx = malloc(f.idx_size), *bin = malloc(f.bin_size);
    for (int trial = 0; trial < 1500; trial++) {
        memcpy(idx, f.idx, f.idx_size);
        memcpy(bin, f.bin, f.bin_size);
        int flips = 1 + (int)rng_below(&rng, 3);
        for (int k = 0; k < flips; k++) {
            size_t at = rng_below(&rng, f.idx_size + f.bin_size);
            uint8_t x = (uint8_t)(1 + rng_below(&rng, 255));
            if (at < f.idx_size) idx[at] ^= x;
            else bin[at - f.idx_size] ^= x;
        }
        store(f.bad, ".idx", idx, f.idx_size);
        store(f.bad, ".bin", bin, f.bin_size);
        int rc = run_child(open_and_read_all, f.bad, msg, sizeof msg);
        rejected += rc == 1;
        if (rc < 0 && crashed++ == 0) printf("     crash in trial %d: %s\n", trial, msg);
    }
    CHECK(crashed == 0, "%d crashes", crashed);
    CHECK(rejected > 500, "only %d of 1500 corrupted pairs rejected", rejected);
    free(idx);
    free(bin);
    fixture_free(&f);
}

int main(void) {
    RUN(test_dtype_table);
    RUN(test_round_trip_every_dtype);
    RUN(test_byte_layout);
    RUN(test_empty_datasets);
    RUN(test_token_range_and_first_outside);
    RUN(test_many_documents);
    RUN(test_finish_ends_open_document);
    RUN(test_add_index);
    RUN(test_crash_safe_names);
    RUN(test_rejections);
    RUN(test_read_rejects_non_int32_values);
    RUN(test_writer_and_reader_refuse_bad_requests);
    RUN(test_truncation_at_every_offset);
    RUN(test_random_byte_flips);
    TESTS_DONE();
}

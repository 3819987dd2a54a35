// indexed.c — Megatron-Core's MMIDIDX indexed dataset: a validating memory-mapped reader
// and a streaming, crash-safe writer (the layout is in indexed.h and docs/data.md).
// All multi-byte fields are little-endian; loads go through memcpy so that no access
// depends on the alignment of the data in the files.
#include "data/indexed.h"

#include "core/common.h"
#include "core/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "indexed.c reads and writes the little-endian files of Megatron-Core with host-order loads"
#endif

#define INDEX_MAGIC "MMIDIDX\0\0"
#define INDEX_MAGIC_BYTES 9
#define INDEX_VERSION 1
#define INDEX_HEADER_BYTES 34  // magic 9 + version 8 + dtype 1 + sequence count 8 + document count 8
#define RECREATE "re-create the dataset (moetron prepare, or Megatron's tools/preprocess_data.py)"

// Megatron-Core's DType enum: the code is the index. min/max: the token ids the dtype holds
// exactly (float32 is exact for integers up to 2^24).
static const struct {
    const char *name;
    int size;
    int64_t min, max;
} DTYPES[] = {
    [IDX_UINT8] = {"uint8", 1, 0, UINT8_MAX},
    [IDX_INT8] = {"int8", 1, INT8_MIN, INT8_MAX},
    [IDX_INT16] = {"int16", 2, INT16_MIN, INT16_MAX},
    [IDX_INT32] = {"int32", 4, INT32_MIN, INT32_MAX},
    [IDX_INT64] = {"int64", 8, INT32_MIN, INT32_MAX},
    [IDX_FLOAT64] = {"float64", 8, INT32_MIN, INT32_MAX},
    [IDX_FLOAT32] = {"float32", 4, -(1 << 24), 1 << 24},
    [IDX_UINT16] = {"uint16", 2, 0, UINT16_MAX},
};
#define N_DTYPE_CODES ((int)(sizeof DTYPES / sizeof DTYPES[0]))
// The C type of each code, for the conversion loops.
#define FOR_EACH_DTYPE(X)                                                                  \
    X(IDX_UINT8, uint8_t) X(IDX_INT8, int8_t) X(IDX_INT16, int16_t) X(IDX_INT32, int32_t)  \
    X(IDX_INT64, int64_t) X(IDX_FLOAT64, double) X(IDX_FLOAT32, float) X(IDX_UINT16, uint16_t)

int indexed_dtype_size(int code) {
    return code > 0 && code < N_DTYPE_CODES ? DTYPES[code].size : 0;
}

const char *indexed_dtype_name(int code) {
    return code > 0 && code < N_DTYPE_CODES ? DTYPES[code].name : NULL;
}

int indexed_dtype_from_name(const char *name, IndexedDtype *out) {
    for (int code = 1; code < N_DTYPE_CODES; code++)
        if (strcmp(name, DTYPES[code].name) == 0) {
            *out = (IndexedDtype)code;
            return 1;
        }
    return 0;
}

// DType.optimal_dtype: the ids of a vocabulary below 65500 fit uint16.
IndexedDtype indexed_dtype_for_vocab(int64_t vocab_size) {
    return vocab_size < 65500 ? IDX_UINT16 : IDX_INT32;
}

static void path_with(char *out, const char *prefix, const char *ext) {
    if (snprintf(out, MT_PATH_MAX, "%s%s", prefix, ext) >= MT_PATH_MAX)
        mt_die("%.60s...: dataset prefix is too long (at most %d characters)", prefix, MT_PATH_MAX - 5);
}

// One fatal line: the file, what is wrong with it, and how to get a good one.
__attribute__((format(printf, 2, 3), noreturn)) static void corrupt(const char *path, const char *fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    mt_die("%s: %s; %s", path, why, RECREATE);
}

static uint64_t load_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

// ---------------------------------------------------------------------------
// Reader

// Maps the whole file read-only; an empty file maps to NULL with *size 0. *mtime_ns: when the
// mapped file was last modified.
static void *map_file(const char *path, size_t *size, int64_t *mtime_ns) {
    char err[512];
    uint64_t bytes;
    int fd = open_input_file(path, INFILE_DATA, &bytes, err, sizeof err);
    if (fd < 0)
        mt_die("%s: %s; a Megatron dataset PREFIX is the pair PREFIX.bin + PREFIX.idx: check the prefix (without "
               ".bin/.idx)", path, err);
    *size = (size_t)bytes;
    struct stat st;
    *mtime_ns = fstat(fd, &st) == 0 ? (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec : 0;
    void *map = NULL;
    if (*size > 0) {
        map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            mt_die("%s: cannot memory-map %zu bytes (%s)", path, *size, strerror(e));
        }
    }
    close(fd);
    return map;
}

static void unmap(void *map, size_t size) {
    if (map) munmap(map, size);
}

// Header fields, and the array sizes they imply checked against the file length.
static void read_header(IndexedDataset *d, const char *idx_path, const uint8_t *p, size_t size) {
    if (size < INDEX_HEADER_BYTES)
        corrupt(idx_path, "truncated: %zu bytes, shorter than the %d-byte header", size, INDEX_HEADER_BYTES);
    if (memcmp(p, INDEX_MAGIC, INDEX_MAGIC_BYTES) != 0)
        corrupt(idx_path, "not a Megatron indexed dataset index (the file does not start with MMIDIDX\\0\\0)");
    uint64_t version = load_u64(p + 9);
    if (version != INDEX_VERSION)
        corrupt(idx_path, "index version %llu, but version 1 is the only one", (unsigned long long)version);
    int code = p[17];
    if (!indexed_dtype_size(code))
        corrupt(idx_path, "unknown token dtype code %d (Megatron-Core's codes are 1 to 8)", code);
    uint64_t n_seq = load_u64(p + 18), n_doc_entries = load_u64(p + 26);
    if (n_doc_entries == 0)
        corrupt(idx_path, "document count 0: the document indices always hold at least the leading 0");
    // Bound the counts by the file length first so that the size computation cannot overflow.
    uint64_t body = size - INDEX_HEADER_BYTES;
    uint64_t need = n_seq <= body / 12 && n_doc_entries <= body / 8 ? INDEX_HEADER_BYTES + 12 * n_seq + 8 * n_doc_entries
                                                                     : UINT64_MAX;
    if (need != size) {
        if (need != UINT64_MAX && need + n_seq == size)
            corrupt(idx_path, "%llu bytes of sequence modes follow the index: a multimodal dataset, which moetron "
                    "does not read", (unsigned long long)n_seq);
        corrupt(idx_path, "header says %llu sequences and %llu document indices, which do not match the file "
                "length %zu bytes (truncated or corrupted)", (unsigned long long)n_seq,
                (unsigned long long)n_doc_entries, size);
    }
    d->dtype = (IndexedDtype)code;
    d->elem_size = indexed_dtype_size(code);
    d->n_sequences = (int64_t)n_seq;
    d->n_documents = (int64_t)n_doc_entries - 1;
}

// Lengths non-negative; pointers start at 0, are multiples of the token size and each
// follows the previous sequence; the last ends exactly at the end of the .bin.
static void check_sequences(const IndexedDataset *d, const char *idx_path, const char *bin_path) {
    uint64_t end = 0;  // where the next sequence must start, <= bin_size
    for (int64_t i = 0; i < d->n_sequences; i++) {
        int32_t len = d->sequence_lengths[i];
        int64_t ptr = d->sequence_pointers[i];
        if (len < 0) corrupt(idx_path, "sequence %lld has negative length %d", (long long)i, len);
        if (ptr < 0 || ptr % d->elem_size != 0)
            corrupt(idx_path, "sequence %lld has pointer %lld: negative or not a multiple of the %d-byte %s token",
                    (long long)i, (long long)ptr, d->elem_size, DTYPES[d->dtype].name);
        if (i > 0 && ptr < d->sequence_pointers[i - 1])
            corrupt(idx_path, "sequence pointers are not monotone: sequence %lld starts at byte %lld, before "
                    "sequence %lld at byte %lld", (long long)i, (long long)ptr, (long long)(i - 1),
                    (long long)d->sequence_pointers[i - 1]);
        if ((uint64_t)ptr != end)
            corrupt(idx_path, "sequence %lld starts at byte %lld, but the lengths before it end at byte %llu "
                    "(pointers not consistent with lengths)", (long long)i, (long long)ptr,
                    (unsigned long long)end);
        end += (uint64_t)len * (uint64_t)d->elem_size;
        if (end > d->bin_size)
            corrupt(bin_path, "has %zu bytes, but sequence %lld of %s ends at byte %llu (truncated, or not the "
                    ".bin of this .idx)", d->bin_size, (long long)i, idx_path, (unsigned long long)end);
    }
    if (end != d->bin_size)
        corrupt(bin_path, "has %zu bytes, but the %lld sequences of %s end at byte %llu (the .bin and .idx do "
                "not belong together)", d->bin_size, (long long)d->n_sequences, idx_path,
                (unsigned long long)end);
}

static void check_documents(const IndexedDataset *d, const char *idx_path) {
    const int64_t *doc = d->document_indices;
    if (doc[0] != 0) corrupt(idx_path, "document indices start at %lld, not 0", (long long)doc[0]);
    for (int64_t j = 1; j <= d->n_documents; j++)
        if (doc[j] < doc[j - 1])
            corrupt(idx_path, "document indices are not monotone: entry %lld is %lld, after %lld", (long long)j,
                    (long long)doc[j], (long long)doc[j - 1]);
    if (doc[d->n_documents] != d->n_sequences)
        corrupt(idx_path, "document indices end at %lld, not at the sequence count %lld",
                (long long)doc[d->n_documents], (long long)d->n_sequences);
}

void indexed_open(IndexedDataset *d, const char *prefix) {
    memset(d, 0, sizeof *d);
    char idx_path[MT_PATH_MAX], bin_path[MT_PATH_MAX];
    path_with(idx_path, prefix, ".idx");
    path_with(bin_path, prefix, ".bin");
    snprintf(d->prefix, sizeof d->prefix, "%s", prefix);

    d->idx_map = map_file(idx_path, &d->idx_size, &d->idx_mtime_ns);
    const uint8_t *idx = d->idx_map;
    read_header(d, idx_path, idx, d->idx_size);
    d->bin_map = map_file(bin_path, &d->bin_size, &d->bin_mtime_ns);

    // Copy the arrays to aligned memory: 8-byte ones first, then the lengths.
    size_t n = (size_t)d->n_sequences, n_doc = (size_t)d->n_documents + 1;
    uint8_t *arrays = mt_malloc(n * 12 + n_doc * 8);
    const uint8_t *src = idx + INDEX_HEADER_BYTES;
    memcpy(arrays + n * 8 + n_doc * 8, src, n * 4);
    memcpy(arrays, src + n * 4, n * 8);
    memcpy(arrays + n * 8, src + n * 12, n_doc * 8);
    d->arrays = arrays;
    d->sequence_pointers = (const int64_t *)arrays;
    d->document_indices = (const int64_t *)(arrays + n * 8);
    d->sequence_lengths = (const int32_t *)(arrays + n * 8 + n_doc * 8);
    unmap(d->idx_map, d->idx_size);
    d->idx_map = NULL;

    check_sequences(d, idx_path, bin_path);
    check_documents(d, idx_path);
}

void indexed_close(IndexedDataset *d) {
    unmap(d->idx_map, d->idx_size);
    unmap(d->bin_map, d->bin_size);
    free(d->arrays);
    memset(d, 0, sizeof *d);
}

// Every value is checked (NaN and fractions included); for the narrow types the check is
// always true and cheap.
#define DECODE_CASE(code, T)                                                              \
    case code:                                                                            \
        for (int64_t k = 0; k < n; k++) {                                                 \
            T v;                                                                          \
            memcpy(&v, src + k * (int64_t)sizeof v, sizeof v);                            \
            double x = (double)v;                                                         \
            if (!(x >= INT32_MIN && x <= INT32_MAX && x == floor(x))) {                   \
                *bad_value = x;                                                           \
                return k;                                                                 \
            }                                                                             \
            out[k] = (int32_t)v;                                                          \
        }                                                                                 \
        break;

// Converts n tokens to int32; returns n, or the index of the first token that is not an
// int32 value (its value in *bad_value).
static int64_t decode(IndexedDtype dtype, const uint8_t *src, int64_t n, int32_t *out, double *bad_value) {
    switch (dtype) { FOR_EACH_DTYPE(DECODE_CASE) }
    return n;
}

void indexed_read(const IndexedDataset *d, int64_t i, int64_t offset, int64_t length, int32_t *out) {
    if (i < 0 || i >= d->n_sequences)
        mt_die("%s: sequence %lld does not exist (the dataset has %lld)", d->prefix, (long long)i,
               (long long)d->n_sequences);
    if (offset < 0 || length < 0 || offset > d->sequence_lengths[i] - length)
        mt_die("%s: tokens [%lld, %lld) of sequence %lld are out of range (it has %d)", d->prefix,
               (long long)offset, (long long)offset + length, (long long)i, d->sequence_lengths[i]);
    if (length == 0) return;  // an empty .bin is not mapped at all
    const uint8_t *src = (const uint8_t *)d->bin_map + d->sequence_pointers[i] + offset * d->elem_size;
    double bad = 0;
    int64_t k = decode(d->dtype, src, length, out, &bad);
    if (k < length)
        mt_die("%s.bin: token %lld of sequence %lld is %.17g, not an int32 token id; %s", d->prefix,
               (long long)(offset + k), (long long)i, bad, RECREATE);
}

// ---------------------------------------------------------------------------
// Token id range

#define PARALLEL_SCAN_TOKENS (1 << 20)  // below this, one thread scans

// x as an int64 id: beyond the int64 range (or NaN, which no id is) saturates to the side given.
static int64_t saturated_id(double x, int64_t nan_as) {
    if (x != x) return nan_as;
    if (x <= (double)INT64_MIN) return INT64_MIN;
    if (x >= (double)INT64_MAX) return INT64_MAX;
    return (int64_t)x;
}

// The .bin is mapped at a page boundary and every token lies at a multiple of its size from
// the start (check_sequences), so the tokens are read as an aligned array of the dtype.
#define RANGE_CASE(code, T)                                                                                \
    case code: {                                                                                           \
        const T *tok = (const T *)d->bin_map;                                                              \
        T lo = tok[0], hi = tok[0];                                                                        \
        _Pragma("omp parallel for simd reduction(min : lo) reduction(max : hi) if (n > PARALLEL_SCAN_TOKENS)") \
        for (int64_t k = 0; k < n; k++) {                                                                  \
            lo = tok[k] < lo ? tok[k] : lo;                                                                \
            hi = tok[k] > hi ? tok[k] : hi;                                                                \
        }                                                                                                  \
        *min_id = saturated_id((double)lo, INT64_MIN);                                                     \
        *max_id = saturated_id((double)hi, INT64_MAX);                                                     \
        break;                                                                                             \
    }

void indexed_token_range(const IndexedDataset *d, int64_t *min_id, int64_t *max_id) {
    int64_t n = (int64_t)(d->bin_size / (size_t)d->elem_size);
    *min_id = 0;
    *max_id = -1;
    if (n == 0) return;
    switch (d->dtype) { FOR_EACH_DTYPE(RANGE_CASE) }
}

// The index of the first of n tokens at src outside [0, limit) (NaN included), or n.
#define FIND_CASE(code, T)                                           \
    case code:                                                       \
        for (int64_t k = 0; k < n; k++) {                            \
            double x = (double)((const T *)src)[k];                  \
            if (!(x >= 0 && x < (double)limit)) {                    \
                *value = x;                                          \
                return k;                                            \
            }                                                        \
        }                                                            \
        break;

static int64_t first_outside(IndexedDtype dtype, const void *src, int64_t n, int64_t limit, double *value) {
    switch (dtype) { FOR_EACH_DTYPE(FIND_CASE) }
    return n;
}

// The document holding sequence i: the last one that starts at or before it (empty documents
// start where the next one does).
static int64_t document_of(const IndexedDataset *d, int64_t i) {
    int64_t lo = 0, hi = d->n_documents - 1;  // document_indices[lo] <= i always
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (d->document_indices[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

int indexed_find_token_outside(const IndexedDataset *d, int64_t limit, IndexedToken *where) {
    for (int64_t i = 0; i < d->n_sequences; i++) {
        int64_t n = d->sequence_lengths[i];
        if (n == 0) continue;
        const uint8_t *src = (const uint8_t *)d->bin_map + d->sequence_pointers[i];
        int64_t k = first_outside(d->dtype, src, n, limit, &where->value);
        if (k < n) {
            where->sequence = i;
            where->position = k;
            where->document = document_of(d, i);
            return 1;
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------
// Writer

#define WRITE_BUFFER_BYTES (1 << 20)

// A temporary file filled through a fixed buffer.
typedef struct {
    AtomicFile af;
    char path[MT_PATH_MAX];
    uint8_t *buf;
    size_t used;
} BufferedFile;

static void bf_open(BufferedFile *f, const char *prefix, const char *ext) {
    path_with(f->path, prefix, ext);
    char err[256];
    if (atomic_open(&f->af, f->path, err, sizeof err)) mt_die("%s: %s", f->path, err);
    f->buf = mt_malloc(WRITE_BUFFER_BYTES);
    f->used = 0;
}

static void bf_flush(BufferedFile *f) {
    char err[256];
    if (atomic_write(&f->af, f->buf, f->used, err, sizeof err)) mt_die("%s: %s", f->path, err);
    f->used = 0;
}

static void bf_write(BufferedFile *f, const void *data, size_t len) {
    if (len == 0) return;
    if (f->used + len > WRITE_BUFFER_BYTES) bf_flush(f);
    if (len > WRITE_BUFFER_BYTES) {
        char err[256];
        if (atomic_write(&f->af, data, len, err, sizeof err)) mt_die("%s: %s", f->path, err);
        return;
    }
    memcpy(f->buf + f->used, data, len);
    f->used += len;
}

// Returns 0, or -1 with err filled (the temporary file is removed either way on failure).
static int bf_commit(BufferedFile *f, char *err, size_t errlen) {
    int rc = atomic_write(&f->af, f->buf, f->used, err, errlen) || atomic_commit(&f->af, err, errlen) ? -1 : 0;
    free(f->buf);
    f->buf = NULL;
    return rc;
}

static void bf_abort(BufferedFile *f) {
    atomic_abort(&f->af);
    free(f->buf);
    f->buf = NULL;
}

struct IndexedBuilder {
    char prefix[MT_PATH_MAX];
    IndexedDtype dtype;
    int elem_size;
    BufferedFile bin;
    int32_t *lengths;
    int64_t n_sequences, cap_sequences;
    int64_t *doc;  // document indices so far, starting with 0
    int64_t n_doc, cap_doc;
};

static void push_length(IndexedBuilder *b, int32_t len) {
    if (b->n_sequences == b->cap_sequences) {
        b->cap_sequences = b->cap_sequences ? 2 * b->cap_sequences : 1024;
        b->lengths = mt_realloc(b->lengths, (size_t)b->cap_sequences * sizeof *b->lengths);
    }
    b->lengths[b->n_sequences++] = len;
}

static void push_document(IndexedBuilder *b, int64_t end) {
    if (b->n_doc == b->cap_doc) {
        b->cap_doc = b->cap_doc ? 2 * b->cap_doc : 1024;
        b->doc = mt_realloc(b->doc, (size_t)b->cap_doc * sizeof *b->doc);
    }
    b->doc[b->n_doc++] = end;
}

IndexedBuilder *indexed_builder_new(const char *prefix, IndexedDtype dtype) {
    if (!indexed_dtype_size((int)dtype)) mt_die("%s: unknown indexed dataset dtype code %d", prefix, (int)dtype);
    IndexedBuilder *b = mt_calloc(1, sizeof *b);
    snprintf(b->prefix, sizeof b->prefix, "%s", prefix);
    b->dtype = dtype;
    b->elem_size = indexed_dtype_size((int)dtype);
    bf_open(&b->bin, prefix, ".bin");
    push_document(b, 0);
    return b;
}

#define ENCODE_CASE(code, T)                                                              \
    case code:                                                                            \
        for (int64_t k = 0; k < n; k++) {                                                 \
            T v = (T)tokens[k];                                                           \
            memcpy(dst + k * (int64_t)sizeof v, &v, sizeof v);                            \
        }                                                                                 \
        break;

// n tokens (already checked to fit) in the dtype's bytes.
static void encode(IndexedDtype dtype, const int32_t *tokens, int64_t n, uint8_t *dst) {
    switch (dtype) { FOR_EACH_DTYPE(ENCODE_CASE) }
}

void indexed_builder_add(IndexedBuilder *b, const int32_t *tokens, int64_t n) {
    if (n < 0 || n > INT32_MAX)
        mt_die("%s: a sequence of %lld tokens cannot be stored (the index holds int32 lengths); split it",
               b->bin.path, (long long)n);
    int64_t lo = DTYPES[b->dtype].min, hi = DTYPES[b->dtype].max;
    for (int64_t k = 0; k < n; k++)
        if (tokens[k] < lo || tokens[k] > hi)
            mt_die("%s: token %d does not fit the dataset dtype %s (%lld to %lld); use int32 (the dtype for "
                   "vocabularies of 65500 or more)", b->bin.path, tokens[k], DTYPES[b->dtype].name,
                   (long long)lo, (long long)hi);
    int64_t per_chunk = WRITE_BUFFER_BYTES / b->elem_size;
    for (int64_t done = 0; done < n;) {
        int64_t room = (int64_t)(WRITE_BUFFER_BYTES - b->bin.used) / b->elem_size;
        if (room == 0) {
            bf_flush(&b->bin);
            room = per_chunk;
        }
        int64_t k = MT_MIN(room, n - done);
        encode(b->dtype, tokens + done, k, b->bin.buf + b->bin.used);
        b->bin.used += (size_t)(k * b->elem_size);
        done += k;
    }
    push_length(b, (int32_t)n);
}

void indexed_builder_end_document(IndexedBuilder *b) {
    push_document(b, b->n_sequences);
}

void indexed_builder_add_index(IndexedBuilder *b, const char *prefix) {
    IndexedDataset d;
    indexed_open(&d, prefix);
    if (d.dtype != b->dtype)
        mt_die("%s: tokens are %s, but %s is being written as %s; merge datasets of one dtype", prefix,
               DTYPES[d.dtype].name, b->bin.path, DTYPES[b->dtype].name);
    int64_t offset = b->n_sequences;
    for (int64_t i = 0; i < d.n_sequences; i++) push_length(b, d.sequence_lengths[i]);
    for (int64_t j = 1; j <= d.n_documents; j++) push_document(b, offset + d.document_indices[j]);
    bf_write(&b->bin, d.bin_map, d.bin_size);
    indexed_close(&d);
}

static void free_builder(IndexedBuilder *b) {
    free(b->lengths);
    free(b->doc);
    free(b);
}

// The index through a buffered temporary file: header, lengths, pointers, document indices.
static void write_index(const IndexedBuilder *b, BufferedFile *idx) {
    uint8_t header[INDEX_HEADER_BYTES];
    uint64_t version = INDEX_VERSION, n_seq = (uint64_t)b->n_sequences, n_doc = (uint64_t)b->n_doc;
    memcpy(header, INDEX_MAGIC, INDEX_MAGIC_BYTES);
    memcpy(header + 9, &version, 8);
    header[17] = (uint8_t)b->dtype;
    memcpy(header + 18, &n_seq, 8);
    memcpy(header + 26, &n_doc, 8);
    bf_write(idx, header, sizeof header);
    bf_write(idx, b->lengths, (size_t)b->n_sequences * sizeof *b->lengths);
    int64_t pointer = 0;
    for (int64_t i = 0; i < b->n_sequences; i++) {
        bf_write(idx, &pointer, sizeof pointer);
        pointer += (int64_t)b->lengths[i] * b->elem_size;
    }
    bf_write(idx, b->doc, (size_t)b->n_doc * sizeof *b->doc);
}

void indexed_builder_finish(IndexedBuilder *b) {
    if (b->doc[b->n_doc - 1] != b->n_sequences) indexed_builder_end_document(b);
    BufferedFile idx;
    bf_open(&idx, b->prefix, ".idx");
    write_index(b, &idx);
    // An old PREFIX.idx goes first: until the new one is renamed into place there is no
    // index, so a crash in between never pairs an old index with a new .bin.
    char err[256];
    if (remove(idx.path) != 0 && errno != ENOENT) {
        snprintf(err, sizeof err, "cannot remove the old file: %s", strerror(errno));
        bf_abort(&b->bin);
        bf_abort(&idx);
        mt_die("%s: %s", idx.path, err);
    }
    if (bf_commit(&b->bin, err, sizeof err)) {
        bf_abort(&idx);
        mt_die("%s: %s", b->bin.path, err);
    }
    if (bf_commit(&idx, err, sizeof err)) mt_die("%s: %s", idx.path, err);
    free_builder(b);
}

void indexed_builder_abort(IndexedBuilder *b) {
    bf_abort(&b->bin);
    free_builder(b);
}

// safetensors.c — safetensors reader (maps the file, validates the header
// completely before anything is handed out, and reads a tensor's bytes only when
// asked) and writer (streams the header and tensors into an atomic temp file).
#include "safetensors.h"

#include "device.h"
#include "fileio.h"
#include "float_formats.h"
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (tensor bytes are copied as is)"
#endif

// ===========================================================================
// dtypes

static const struct {
    const char *name;
    size_t size;
} dtype_info[ST_DTYPE_COUNT] = {
    [ST_F64] = {"F64", 8},         [ST_F32] = {"F32", 4},         [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},       [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_I64] = {"I64", 8},         [ST_I32] = {"I32", 4},         [ST_I16] = {"I16", 2},
    [ST_I8] = {"I8", 1},           [ST_U8] = {"U8", 1},           [ST_BOOL] = {"BOOL", 1},
};

static int dtype_valid(StDtype dtype) { return (int)dtype >= 0 && dtype < ST_DTYPE_COUNT; }

const char *st_dtype_name(StDtype dtype) { return dtype_valid(dtype) ? dtype_info[dtype].name : "?"; }

size_t st_dtype_size(StDtype dtype) { return dtype_valid(dtype) ? dtype_info[dtype].size : 0; }

int st_dtype_from_name(const char *name, StDtype *out) {
    for (int d = 0; d < ST_DTYPE_COUNT; d++) {
        if (strcmp(name, dtype_info[d].name) == 0) {
            *out = (StDtype)d;
            return 1;
        }
    }
    return 0;
}

// ===========================================================================
// Helpers shared by reader and writer

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

// Element count of a shape, or 0 with *overflow set when it exceeds uint64_t.
static uint64_t shape_numel(int ndim, const int64_t *shape, int *overflow) {
    uint64_t n = 1;
    *overflow = 0;
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > UINT64_MAX / d) {
            *overflow = 1;
            return 0;
        }
        n *= d;
    }
    return n;
}

// Byte size of a dense tensor, 0 with *overflow set when it does not fit.
static uint64_t tensor_nbytes(StDtype dtype, int ndim, const int64_t *shape, int *overflow) {
    uint64_t numel = shape_numel(ndim, shape, overflow);
    uint64_t size = st_dtype_size(dtype);
    if (*overflow || (numel != 0 && numel > UINT64_MAX / size)) {
        *overflow = 1;
        return 0;
    }
    return numel * size;
}

typedef struct {
    const char *name;
    int index;
} NameIndex;

static int compare_name_index(const void *a, const void *b) {
    return strcmp(((const NameIndex *)a)->name, ((const NameIndex *)b)->name);
}

// Sorts (name, index) pairs by name in place and returns a name that occurs
// twice, or NULL.
static const char *sort_and_find_duplicate(NameIndex *names, int n) {
    if (n <= 0) return NULL;
    qsort(names, (size_t)n, sizeof *names, compare_name_index);
    for (int i = 1; i < n; i++)
        if (strcmp(names[i - 1].name, names[i].name) == 0) return names[i].name;
    return NULL;
}

static NameIndex *new_name_index(int n) { return mt_malloc((size_t)(n > 0 ? n : 1) * sizeof(NameIndex)); }

// ===========================================================================
// Reader: header validation

static uint64_t load_u64_le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

// A JSON integer literal >= 0 (2.0 and 1e3 are not accepted, as in the Python package).
static int as_nonneg_integer(const JsonValue *v, uint64_t *out) {
    if (!v || v->type != JSON_NUMBER || !v->has_int64 || v->integer < 0) return 0;
    *out = (uint64_t)v->integer;
    return 1;
}

static int parse_dtype(const char *name, const JsonValue *entry, StTensor *t, char *err, size_t errlen) {
    const JsonValue *dtype = json_get(entry, "dtype");
    if (!dtype || dtype->type != JSON_STRING)
        return fail(err, errlen, "tensor \"%.80s\": missing or non-string \"dtype\"", name);
    if (strlen(dtype->string) != dtype->length || !st_dtype_from_name(dtype->string, &t->dtype))
        return fail(err, errlen, "tensor \"%.80s\": unknown dtype \"%.20s\"", name, dtype->string);
    return 0;
}

static int parse_shape(const char *name, const JsonValue *entry, StTensor *t, char *err, size_t errlen) {
    const JsonValue *shape = json_get(entry, "shape");
    if (!shape || shape->type != JSON_ARRAY)
        return fail(err, errlen, "tensor \"%.80s\": \"shape\" is missing or not an array", name);
    if (shape->count > ST_MAX_DIMS)
        return fail(err, errlen, "tensor \"%.80s\": shape has %zu dimensions (at most %d)", name,
                    shape->count, ST_MAX_DIMS);
    t->ndim = (int)shape->count;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t d;
        if (!as_nonneg_integer(&shape->items[i], &d))
            return fail(err, errlen, "tensor \"%.80s\": shape must hold non-negative integers", name);
        t->shape[i] = (int64_t)d;
    }
    return 0;
}

static int parse_offsets(const char *name, const JsonValue *entry, StTensor *t, char *err, size_t errlen) {
    const JsonValue *offsets = json_get(entry, "data_offsets");
    if (!offsets || offsets->type != JSON_ARRAY || offsets->count != 2 ||
        !as_nonneg_integer(&offsets->items[0], &t->begin) ||
        !as_nonneg_integer(&offsets->items[1], &t->end) || t->begin > t->end)
        return fail(err, errlen,
                    "tensor \"%.80s\": \"data_offsets\" must be [begin, end] with integers 0 <= begin <= end",
                    name);
    int overflow;
    uint64_t need = tensor_nbytes(t->dtype, t->ndim, t->shape, &overflow);
    if (overflow) return fail(err, errlen, "tensor \"%.80s\": shape is too large", name);
    if (t->end - t->begin != need)
        return fail(err, errlen,
                    "tensor \"%.80s\": data_offsets span %llu bytes but its shape and dtype need %llu",
                    name, (unsigned long long)(t->end - t->begin), (unsigned long long)need);
    return 0;
}

// Fills t from one header entry {"dtype": ..., "shape": [...], "data_offsets": [b, e]}.
static int parse_tensor_entry(const char *name, const JsonValue *entry, StTensor *t, char *err, size_t errlen) {
    if (entry->type != JSON_OBJECT) return fail(err, errlen, "tensor \"%.80s\": entry is not an object", name);
    if (parse_dtype(name, entry, t, err, errlen) || parse_shape(name, entry, t, err, errlen) ||
        parse_offsets(name, entry, t, err, errlen))
        return -1;
    t->name = mt_strdup(name);
    return 0;
}

static int parse_metadata(StFile *f, const JsonValue *meta, char *err, size_t errlen) {
    if (meta->type != JSON_OBJECT) return fail(err, errlen, "__metadata__ is not an object");
    f->meta_keys = mt_calloc(meta->count ? meta->count : 1, sizeof *f->meta_keys);
    f->meta_values = mt_calloc(meta->count ? meta->count : 1, sizeof *f->meta_values);
    for (size_t i = 0; i < meta->count; i++) {
        const JsonValue *value = &meta->items[i];
        if (value->type != JSON_STRING)
            return fail(err, errlen, "__metadata__ value for \"%.80s\" is not a string", meta->keys[i]);
        if (strlen(meta->keys[i]) != meta->key_lengths[i] || strlen(value->string) != value->length)
            return fail(err, errlen, "__metadata__ entry \"%.80s\" contains a NUL byte", meta->keys[i]);
        f->meta_keys[i] = mt_strdup(meta->keys[i]);
        f->meta_values[i] = mt_strdup(value->string);
        f->n_meta = (int)i + 1;
    }
    NameIndex *keys = new_name_index(f->n_meta);
    for (int i = 0; i < f->n_meta; i++) keys[i] = (NameIndex){f->meta_keys[i], i};
    const char *duplicate = sort_and_find_duplicate(keys, f->n_meta);
    int rc = duplicate ? fail(err, errlen, "duplicate __metadata__ key \"%.80s\"", duplicate) : 0;
    free(keys);
    return rc;
}

// Walks the header object: one "__metadata__" entry plus one entry per tensor.
static int parse_header_entries(StFile *f, const JsonValue *header, char *err, size_t errlen) {
    if (header->count > (size_t)INT32_MAX) return fail(err, errlen, "header has too many entries");
    f->tensors = mt_calloc(header->count ? header->count : 1, sizeof *f->tensors);
    int seen_metadata = 0;
    for (size_t i = 0; i < header->count; i++) {
        const char *key = header->keys[i];
        if (strlen(key) != header->key_lengths[i]) return fail(err, errlen, "a header key contains a NUL byte");
        if (strcmp(key, "__metadata__") == 0) {
            if (seen_metadata++) return fail(err, errlen, "duplicate \"__metadata__\" entry");
            if (parse_metadata(f, &header->items[i], err, errlen)) return -1;
            continue;
        }
        if (parse_tensor_entry(key, &header->items[i], &f->tensors[f->n_tensors], err, errlen)) return -1;
        f->n_tensors++;
    }
    return 0;
}

static int check_unique_names(StFile *f, char *err, size_t errlen) {
    NameIndex *sorted = new_name_index(f->n_tensors);
    for (int i = 0; i < f->n_tensors; i++) sorted[i] = (NameIndex){f->tensors[i].name, i};
    const char *duplicate = sort_and_find_duplicate(sorted, f->n_tensors);
    if (duplicate) {
        int rc = fail(err, errlen, "duplicate tensor name \"%.80s\"", duplicate);
        free(sorted);
        return rc;
    }
    f->by_name = mt_malloc((size_t)(f->n_tensors > 0 ? f->n_tensors : 1) * sizeof *f->by_name);
    for (int i = 0; i < f->n_tensors; i++) f->by_name[i] = sorted[i].index;
    free(sorted);
    return 0;
}

typedef struct {
    uint64_t begin, end;
    int index;
} Extent;

static int compare_extent(const void *a, const void *b) {
    const Extent *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

// Sorted by begin, the tensors must cover [0, total) exactly once.
static int check_tiling(const StFile *f, uint64_t *total, char *err, size_t errlen) {
    int n = f->n_tensors;
    Extent *extents = mt_malloc((size_t)(n > 0 ? n : 1) * sizeof *extents);
    for (int i = 0; i < n; i++) extents[i] = (Extent){f->tensors[i].begin, f->tensors[i].end, i};
    qsort(extents, (size_t)n, sizeof *extents, compare_extent);
    uint64_t cursor = 0;
    int last = -1;  // the tensor that ends at cursor
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const Extent *e = &extents[i];
        if (e->begin < cursor)
            rc = fail(err, errlen, "tensors \"%.80s\" and \"%.80s\" overlap", f->tensors[last].name,
                      f->tensors[e->index].name);
        else if (e->begin > cursor)
            rc = fail(err, errlen, "hole in the data: bytes %llu..%llu belong to no tensor",
                      (unsigned long long)cursor, (unsigned long long)e->begin);
        else if (e->end > cursor) {
            cursor = e->end;
            last = e->index;
        }
    }
    free(extents);
    *total = cursor;
    return rc;
}

static int validate(StFile *f, char *err, size_t errlen) {
    if (f->size < 8)
        return fail(err, errlen, "file is only %zu bytes; a safetensors file starts with an 8-byte header length",
                    f->size);
    uint64_t header_len = load_u64_le(f->bytes);
    if (header_len > ST_MAX_HEADER_BYTES)
        return fail(err, errlen, "header length %llu exceeds the limit of %llu bytes (corrupt or not safetensors)",
                    (unsigned long long)header_len, ST_MAX_HEADER_BYTES);
    if (header_len > f->size - 8)
        return fail(err, errlen, "truncated: the header is %llu bytes but only %zu bytes follow the length",
                    (unsigned long long)header_len, f->size - 8);
    char json_err[200];
    JsonValue *header = json_parse((const char *)f->bytes + 8, (size_t)header_len, json_err, sizeof json_err);
    if (!header) return fail(err, errlen, "header is not valid JSON: %s", json_err);
    int rc = 0;
    if (header->type != JSON_OBJECT) rc = fail(err, errlen, "header is not a JSON object");
    else rc = parse_header_entries(f, header, err, errlen);
    json_free(header);
    if (rc || check_unique_names(f, err, errlen)) return -1;
    uint64_t total;
    if (check_tiling(f, &total, err, errlen)) return -1;
    f->data_start = 8 + (size_t)header_len;
    uint64_t available = f->size - f->data_start;
    if (total > available)
        return fail(err, errlen, "truncated: the tensors need %llu data bytes but the file has %llu",
                    (unsigned long long)total, (unsigned long long)available);
    if (total < available)
        return fail(err, errlen, "trailing bytes: %llu bytes after the last tensor",
                    (unsigned long long)(available - total));
    return 0;
}

// Maps the file read-only: only the pages a caller touches (the header, the tensors it
// reads) become resident, so opening a file costs nothing like its size in memory.
static int map_file(StFile *f, const char *path, char *err, size_t errlen) {
    uint64_t size;
    int fd = open_input_file(path, INFILE_WEIGHTS, &size, err, errlen);  // a regular file, bounded
    if (fd < 0) return -1;
    int rc = 0;
    if (size < 8)
        rc = fail(err, errlen, "file is only %llu bytes; a safetensors file starts with an 8-byte header length",
                  (unsigned long long)size);
    if (rc == 0) {
        void *bytes = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (bytes == MAP_FAILED) rc = fail(err, errlen, "cannot map: %s", strerror(errno));
        else f->bytes = bytes, f->size = (size_t)size;
    }
    close(fd);
    return rc;
}

int st_open(StFile *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    if (err && errlen) err[0] = '\0';
    if (map_file(f, path, err, errlen)) return -1;
    f->path = mt_strdup(path);
    if (validate(f, err, errlen)) {
        st_close(f);
        return -1;
    }
    return 0;
}

void st_close(StFile *f) {
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->by_name);
    if (f->bytes) munmap(f->bytes, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

// ===========================================================================
// Reader: lookups and conversion

const StTensor *st_find(const StFile *f, const char *name) {
    int lo = 0, hi = f->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const StTensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(t->name, name);
        if (c == 0) return t;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

const char *st_meta(const StFile *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

int64_t st_numel(const StTensor *t) {
    // st_open checked that the product fits the file, but only when no dimension is 0:
    // [2^32, 2^31, 0] is a valid empty tensor whose partial products overflow int64
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

const void *st_data(const StFile *f, const StTensor *t) { return f->bytes + f->data_start + t->begin; }

// Hands the file pages of bytes [begin, end) of the data back: they leave the process's
// resident memory (a later read maps them in again from the file).
static void release_pages(const StFile *f, uint64_t begin, uint64_t end) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t from = (f->data_start + (size_t)begin) / page * page, to = f->data_start + (size_t)end;
    if (to > from) madvise(f->bytes + from, to - from, MADV_DONTNEED);
}

static int convert_to_real(const StFile *f, const StTensor *t, real *out);

int st_read_real(const StFile *f, const StTensor *t, real *out) {
    int rc = convert_to_real(f, t, out);
    release_pages(f, t->begin, t->end);
    return rc;
}

static int convert_to_real(const StFile *f, const StTensor *t, real *out) {
    const uint8_t *src = st_data(f, t);
    int64_t n = st_numel(t);
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case ST_F64: {
            double v;
            memcpy(&v, src + 8 * i, 8);
            out[i] = (real)v;
            break;
        }
        case ST_F32: {
            float v;
            memcpy(&v, src + 4 * i, 4);
            out[i] = (real)v;
            break;
        }
        case ST_F16: {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = (real)f16_to_float(h);
            break;
        }
        case ST_BF16: {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = (real)bf16_to_float(h);
            break;
        }
        case ST_F8_E4M3: out[i] = (real)e4m3_to_float(src[i]); break;
        case ST_F8_E5M2: out[i] = (real)e5m2_to_float(src[i]); break;
        default: return -1;  // integer and bool tensors are not real-valued
        }
    }
    return 0;
}

// ===========================================================================
// Writer

void stw_init(StWriter *w) { memset(w, 0, sizeof *w); }

static StWriterTensor *push_tensor(StWriter *w, const char *name, StDtype dtype, int ndim, const int64_t *shape) {
    if (!name || strcmp(name, "__metadata__") == 0)
        mt_die("safetensors writer: invalid tensor name \"%s\"", name ? name : "(null)");
    if (!dtype_valid(dtype)) mt_die("safetensors writer: tensor \"%s\" has an invalid dtype", name);
    if (ndim < 0 || ndim > ST_MAX_DIMS)
        mt_die("safetensors writer: tensor \"%s\" has %d dimensions (0..%d allowed)", name, ndim, ST_MAX_DIMS);
    if (w->n_tensors == w->cap_tensors) {
        w->cap_tensors = w->cap_tensors ? 2 * w->cap_tensors : 16;
        w->tensors = mt_realloc(w->tensors, (size_t)w->cap_tensors * sizeof *w->tensors);
    }
    StWriterTensor *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    t->name = mt_strdup(name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) mt_die("safetensors writer: tensor \"%s\" has a negative dimension", name);
        t->shape[i] = shape[i];
    }
    int overflow;
    t->nbytes = tensor_nbytes(dtype, ndim, t->shape, &overflow);
    if (overflow) mt_die("safetensors writer: tensor \"%s\" is too large", name);
    return t;
}

void stw_add(StWriter *w, const char *name, StDtype dtype, int ndim, const int64_t *shape, const void *data) {
    StWriterTensor *t = push_tensor(w, name, dtype, ndim, shape);
    t->data = data;
}

void stw_add_real_view(StWriter *w, const char *name, StDtype dtype, int ndim, const int64_t *shape,
                       const real *data) {
    if (dtype != ST_F32 && dtype != ST_BF16)
        mt_die("safetensors writer: tensor \"%s\": real values are written as F32 or BF16 only", name);
    StWriterTensor *t = push_tensor(w, name, dtype, ndim, shape);
    t->reals = data;
}

void stw_add_download(StWriter *w, const char *name, StDtype dtype, int ndim, const int64_t *shape,
                      const void *tensor) {
    StWriterTensor *t = push_tensor(w, name, dtype, ndim, shape);
    t->owned_bytes = mt_malloc(t->nbytes ? (size_t)t->nbytes : 1);
    device_download(t->owned_bytes, tensor, (size_t)t->nbytes);
    t->data = t->owned_bytes;
}

void stw_add_real_download(StWriter *w, const char *name, int ndim, const int64_t *shape, const real *tensor) {
    StWriterTensor *t = push_tensor(w, name, ST_F32, ndim, shape);
    size_t n = (size_t)(t->nbytes / sizeof(float));
    t->owned_copy = mt_malloc((n ? n : 1) * sizeof(real));
    device_download(t->owned_copy, tensor, n * sizeof(real));
    t->reals = t->owned_copy;
}

void stw_add_real(StWriter *w, const char *name, int ndim, const int64_t *shape, const real *data) {
    StWriterTensor *t = push_tensor(w, name, ST_F32, ndim, shape);
    size_t n = (size_t)(t->nbytes / sizeof(float));
    t->owned_copy = mt_malloc((n ? n : 1) * sizeof(real));
    if (n) memcpy(t->owned_copy, data, n * sizeof(real));
    t->reals = t->owned_copy;
}

uint16_t st_float_to_bf16(float v) { return bf16_from_float(v); }

void stw_meta(StWriter *w, const char *key, const char *value) {
    for (int i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta_keys[i], key) == 0) {
            free(w->meta_values[i]);
            w->meta_values[i] = mt_strdup(value);
            return;
        }
    }
    if (w->n_meta == w->cap_meta) {
        w->cap_meta = w->cap_meta ? 2 * w->cap_meta : 8;
        w->meta_keys = mt_realloc(w->meta_keys, (size_t)w->cap_meta * sizeof *w->meta_keys);
        w->meta_values = mt_realloc(w->meta_values, (size_t)w->cap_meta * sizeof *w->meta_values);
    }
    w->meta_keys[w->n_meta] = mt_strdup(key);
    w->meta_values[w->n_meta] = mt_strdup(value);
    w->n_meta++;
}

void stw_discard(StWriter *w) {
    if (w->streaming && w->file.fp) atomic_abort(&w->file);
    for (int i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].owned_copy);
        free(w->tensors[i].owned_bytes);
    }
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->tensors);
    free(w->meta_keys);
    free(w->meta_values);
    memset(w, 0, sizeof *w);
}

// {"__metadata__":{"format":"pt",...},"name":{"dtype":"F32","shape":[..],"data_offsets":[b,e]},...}
static void build_header(const StWriter *w, JsonWriter *jw) {
    jw_init_compact(jw);
    jw_begin_object(jw);
    jw_key(jw, "__metadata__");
    jw_begin_object(jw);
    const char *format = "pt";
    for (int i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta_keys[i], "format") == 0) format = w->meta_values[i];
    jw_kv_string(jw, "format", format);
    for (int i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta_keys[i], "format") != 0) jw_kv_string(jw, w->meta_keys[i], w->meta_values[i]);
    jw_end_object(jw);
    uint64_t offset = 0;
    for (int i = 0; i < w->n_tensors; i++) {
        const StWriterTensor *t = &w->tensors[i];
        jw_key(jw, t->name);
        jw_begin_object(jw);
        jw_kv_string(jw, "dtype", st_dtype_name(t->dtype));
        jw_key(jw, "shape");
        jw_begin_array(jw);
        for (int d = 0; d < t->ndim; d++) jw_int(jw, t->shape[d]);
        jw_end_array(jw);
        jw_key(jw, "data_offsets");
        jw_begin_array(jw);
        jw_int(jw, (int64_t)offset);
        jw_int(jw, (int64_t)(offset + t->nbytes));
        jw_end_array(jw);
        jw_end_object(jw);
        offset += t->nbytes;
    }
    jw_end_object(jw);
}

// Writes n real values as F32 or BF16, converting a piece at a time (F32 from float memory
// is written as it is).
static void write_reals(AtomicFile *af, StDtype dtype, const real *values, size_t n, char *err, size_t errlen) {
    size_t elem = st_dtype_size(dtype);
    if (dtype == ST_F32 && sizeof(real) == sizeof(float)) {
        atomic_write(af, values, n * elem, err, errlen);
        return;
    }
    enum { CHUNK = 4096 };
    union {
        float f32[CHUNK];
        uint16_t bf16[CHUNK];
    } buf;
    for (size_t start = 0; start < n; start += CHUNK) {
        size_t count = MT_MIN((size_t)CHUNK, n - start);
        for (size_t i = 0; i < count; i++) {
            float v = (float)values[start + i];
            if (dtype == ST_F32) buf.f32[i] = v;
            else buf.bf16[i] = st_float_to_bf16(v);
        }
        atomic_write(af, &buf, count * elem, err, errlen);
    }
}

static int check_unique_tensor_names(const StWriter *w, char *err, size_t errlen) {
    NameIndex *sorted = new_name_index(w->n_tensors);
    for (int i = 0; i < w->n_tensors; i++) sorted[i] = (NameIndex){w->tensors[i].name, i};
    const char *duplicate = sort_and_find_duplicate(sorted, w->n_tensors);
    int rc = duplicate ? fail(err, errlen, "duplicate tensor name \"%.80s\"", duplicate) : 0;
    free(sorted);
    return rc;
}

// [length][header + space padding] into a new atomic file; the tensor bytes follow.
static int write_header(StWriter *w, const char *path, char *err, size_t errlen) {
    if (check_unique_tensor_names(w, err, errlen)) return -1;
    JsonWriter jw;
    build_header(w, &jw);
    size_t padded = (jw_len(&jw) + 7) / 8 * 8;
    if (padded > ST_MAX_HEADER_BYTES) {
        jw_free(&jw);
        return fail(err, errlen, "header would be %zu bytes (limit %llu)", padded, ST_MAX_HEADER_BYTES);
    }
    uint8_t length_bytes[8];
    for (int i = 0; i < 8; i++) length_bytes[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    if (atomic_open(&w->file, path, err, errlen)) {
        jw_free(&jw);
        return -1;
    }
    atomic_write(&w->file, length_bytes, 8, err, errlen);
    atomic_write(&w->file, jw_text(&jw), jw_len(&jw), err, errlen);
    atomic_write(&w->file, "        ", padded - jw_len(&jw), err, errlen);
    jw_free(&jw);
    w->streaming = 1;
    return 0;
}

void stw_declare(StWriter *w, const char *name, StDtype dtype, int ndim, const int64_t *shape) {
    push_tensor(w, name, dtype, ndim, shape);
}

int stw_stream_open(StWriter *w, const char *path, char *err, size_t errlen) {
    if (write_header(w, path, err, errlen) == 0) return 0;
    stw_discard(w);
    return -1;
}

// The tensor the next of n elements belong to and how many of them it takes (*take).
static const StWriterTensor *stream_tensor(const StWriter *w, size_t n, size_t *take) {
    MT_ASSERT(w->streaming && w->next_tensor < w->n_tensors);
    const StWriterTensor *t = &w->tensors[w->next_tensor];
    uint64_t numel = t->nbytes / st_dtype_size(t->dtype);
    *take = (size_t)MT_MIN((uint64_t)n, numel - w->next_element);
    return t;
}

// take elements of the current tensor written; on to the next tensor when it is complete
// (tensors of no elements complete without values).
static void stream_advance(StWriter *w, size_t take) {
    w->next_element += take;
    const StWriterTensor *t = &w->tensors[w->next_tensor];
    if (w->next_element == t->nbytes / st_dtype_size(t->dtype)) w->next_tensor++, w->next_element = 0;
    while (w->next_tensor < w->n_tensors && w->tensors[w->next_tensor].nbytes == 0) w->next_tensor++;
}

void stw_stream_values(StWriter *w, const real *values, size_t n) {
    MT_ASSERT(w->streaming);
    while (n > 0) {
        size_t take;
        const StWriterTensor *t = stream_tensor(w, n, &take);
        MT_ASSERT(t->dtype == ST_F32 || t->dtype == ST_BF16);
        write_reals(&w->file, t->dtype, values, take, NULL, 0);
        values += take, n -= take;
        stream_advance(w, take);
    }
    while (w->next_tensor < w->n_tensors && w->tensors[w->next_tensor].nbytes == 0) w->next_tensor++;
}

void stw_stream_raw(StWriter *w, const void *elements, size_t n) {
    const uint8_t *bytes = elements;
    while (n > 0) {
        size_t take;
        const StWriterTensor *t = stream_tensor(w, n, &take);
        size_t size = st_dtype_size(t->dtype);
        atomic_write(&w->file, bytes, take * size, NULL, 0);
        bytes += take * size, n -= take;
        stream_advance(w, take);
    }
}

int stw_stream_close(StWriter *w, char *err, size_t errlen) {
    MT_ASSERT(w->streaming);
    stw_stream_values(w, NULL, 0);
    int rc;
    if (w->next_tensor < w->n_tensors) {
        atomic_abort(&w->file);
        rc = fail(err, errlen, "internal error: tensor \"%.80s\" was not given all its values",
                  w->tensors[w->next_tensor].name);
    } else {
        rc = atomic_commit(&w->file, err, errlen);
    }
    stw_discard(w);
    return rc;
}

// The header, then every tensor's bytes in order.
static int write_file(StWriter *w, const char *path, char *err, size_t errlen) {
    if (write_header(w, path, err, errlen)) return -1;
    for (int i = 0; i < w->n_tensors; i++) {
        const StWriterTensor *t = &w->tensors[i];
        if (t->reals) write_reals(&w->file, t->dtype, t->reals, (size_t)(t->nbytes / st_dtype_size(t->dtype)), err, errlen);
        else atomic_write(&w->file, t->data, (size_t)t->nbytes, err, errlen);
    }
    return atomic_commit(&w->file, err, errlen);
}

int stw_finish(StWriter *w, const char *path, char *err, size_t errlen) {
    int rc = write_file(w, path, err, errlen);
    stw_discard(w);
    return rc;
}

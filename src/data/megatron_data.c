// megatron_data.c — training samples from Megatron .bin/.idx datasets in Megatron-Core's
// order (megatron_data.h): the blend lists (blend.h), one GPTDataset per dataset and split
// (gpt_samples.h), the BlendedDataset over them, and the index caches.
//
// Caches: every GPTDataset's document/sample/shuffle indices and every BlendedDataset's
// dataset/sample indices go to one file each in --data-cache-path (default: a "cache"
// directory beside the first dataset), named "<hash>-GPTDataset-train.moetron-indices"
// and the like. The hash covers everything the indices depend on (the dataset's path,
// the sizes and modification times of its .idx and .bin, the sequence range of the split,
// the sample count, --seq-length, --seed and the cache format), so a changed dataset or
// setting gets a file of its own. A file is used only when its header, the description it
// was built for, its array sizes and a checksum of its contents all match; otherwise it is
// rebuilt and replaced atomically.
#include "data/megatron_data.h"

#include "core/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "data/blend.h"
#include "data/gpt_samples.h"
#include "data/indexed.h"

#define CACHE_MAGIC "MTIDXC\r\n"
#define CACHE_FORMAT 1
#define CACHE_MAX_ARRAYS 3
#define CACHE_SUFFIX ".moetron-indices"
#define IDENTITY_MAX (PATH_MAX + 256)

static const char *SPLIT_NAMES[3] = {"train", "valid", "test"};

// A cache file mapped read-only (or nothing: the arrays were built in memory).
typedef struct {
    void *map;
    size_t size;
} Mapping;

// One GPTDataset: a sequence range of one dataset and its indices.
typedef struct {
    const IndexedDataset *ds;
    GptIndex index;
    Mapping mapping;
} GptPart;

typedef struct {
    int n_parts;
    GptPart *parts;
    // BlendedDataset (n_parts > 1, or weights given with --data-path): which part and which
    // of its samples each sample is. NULL for a split made of one GPTDataset.
    int16_t *dataset_index;
    int64_t *dataset_sample_index;
    Mapping mapping;
    int64_t size;
} SplitData;

struct MegatronData {
    int seq_length;
    uint32_t seed;
    int n_datasets;
    IndexedDataset *datasets;
    char (*identity)[IDENTITY_MAX];  // per dataset: path, sizes and times of its files
    SplitData split[3];
    char cache_dir[MT_PATH_MAX];
    int cache_unwritable;  // warned once; indices are then only kept in memory
    int built, reused;     // cache files written / used, for the summary line
    int ids_scanned, ids_cached;  // datasets whose token id range was scanned / read from the cache
    const char *split_string;  // --split, for messages
};

// ---------------------------------------------------------------------------
// Files and paths

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int prefix_file_exists(const char *prefix, const char *ext) {
    char path[MT_PATH_MAX + 8];
    snprintf(path, sizeof path, "%s%s", prefix, ext);
    return file_exists(path);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static void default_cache_dir(char *out, const char *prefix) {
    const char *slash = strrchr(prefix, '/');
    if (!slash) snprintf(out, MT_PATH_MAX, "cache");
    else if (slash == prefix) snprintf(out, MT_PATH_MAX, "/cache");
    else snprintf(out, MT_PATH_MAX, "%.*s/cache", (int)(slash - prefix), prefix);
}

// ---------------------------------------------------------------------------
// Opening the datasets

// The dataset named by prefix, opened once however often the lists name it. d->datasets
// grows here, so all of them are opened (collect_datasets) before any part points at one.
static const IndexedDataset *open_dataset(MegatronData *d, const char *prefix, const char *flag) {
    for (int i = 0; i < d->n_datasets; i++)
        if (strcmp(d->datasets[i].prefix, prefix) == 0) return &d->datasets[i];
    if (!prefix_file_exists(prefix, ".idx") || !prefix_file_exists(prefix, ".bin")) {
        const char *exts[] = {".bin", ".idx"};
        for (int e = 0; e < 2; e++)
            if (ends_with(prefix, exts[e]))
                mt_die("--%s %s: give the dataset prefix without %s (the prefix of PREFIX.bin and PREFIX.idx)", flag,
                       prefix, exts[e]);
        mt_die("--%s %s: %s.%s not found; a Megatron dataset prefix names the pair PREFIX.bin + PREFIX.idx "
               "(moetron prepare makes them)",
               flag, prefix, prefix, prefix_file_exists(prefix, ".idx") ? "bin" : "idx");
    }
    if (d->n_datasets >= 32766) mt_die("--%s names more than 32766 datasets (Megatron's BlendedDataset limit)", flag);
    d->datasets = mt_realloc(d->datasets, (size_t)(d->n_datasets + 1) * sizeof *d->datasets);
    d->identity = mt_realloc(d->identity, (size_t)(d->n_datasets + 1) * sizeof *d->identity);
    IndexedDataset *ds = &d->datasets[d->n_datasets];
    char *id = d->identity[d->n_datasets];
    d->n_datasets++;
    indexed_open(ds, prefix);
    // The identity of the files as they were mapped (sizes and times from their descriptors).
    char resolved[PATH_MAX], idx_path[MT_PATH_MAX + 8];
    snprintf(idx_path, sizeof idx_path, "%s.idx", prefix);
    const int64_t ns = 1000000000;
    snprintf(id, IDENTITY_MAX, "%s idx %lld@%lld.%09lld bin %lld@%lld.%09lld",
             realpath(idx_path, resolved) ? resolved : idx_path, (long long)ds->idx_size,
             (long long)(ds->idx_mtime_ns / ns), (long long)(ds->idx_mtime_ns % ns), (long long)ds->bin_size,
             (long long)(ds->bin_mtime_ns / ns), (long long)(ds->bin_mtime_ns % ns));
    return ds;
}

static const char *dataset_identity(const MegatronData *d, const IndexedDataset *ds) {
    return d->identity[ds - d->datasets];
}

// ---------------------------------------------------------------------------
// Cache files: header, description, arrays (each padded to 8 bytes).

typedef struct {
    char magic[8];
    uint64_t format;
    uint64_t description_bytes;
    uint64_t n_arrays;
    uint64_t elem_size[CACHE_MAX_ARRAYS];
    uint64_t count[CACHE_MAX_ARRAYS];
    uint64_t checksum;  // of the arrays, padding included
} CacheHeader;

typedef struct {
    int n;
    size_t elem_size[CACHE_MAX_ARRAYS];
    int64_t count[CACHE_MAX_ARRAYS];
    void *data[CACHE_MAX_ARRAYS];
} CacheArrays;

static size_t padded(size_t n) { return (n + 7) & ~(size_t)7; }

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

// Word-wise checksum of a buffer whose length is a multiple of 8, continuing h.
static uint64_t checksum_words(uint64_t h, const void *data, size_t bytes) {
    const uint8_t *p = data;
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, sizeof w);
        h = (h ^ w) * 0x100000001b3ull + (h >> 29);
    }
    return h;
}

static uint64_t checksum_tail(uint64_t h, const void *data, size_t bytes) {
    uint64_t last = 0;
    size_t whole = bytes / 8 * 8;
    h = checksum_words(h, data, whole);
    if (bytes > whole) {
        memcpy(&last, (const uint8_t *)data + whole, bytes - whole);
        h = checksum_words(h, &last, 8);
    }
    return h;
}

// tag: the split the file is for ("train"), or "all" for a whole dataset.
static void cache_path(char *out, const MegatronData *d, const char *description, const char *kind, const char *tag) {
    snprintf(out, MT_PATH_MAX + 64, "%s/%016" PRIx64 "-%s-%s" CACHE_SUFFIX, d->cache_dir, fnv1a(description), kind,
             tag);
}

static void unmap(Mapping *m) {
    if (m->map) munmap(m->map, m->size);
    m->map = NULL;
    m->size = 0;
}

// Maps path and points a->data at its arrays when it holds exactly the arrays described by
// a (sizes and counts) for this description. Returns 1 on success; 0 when absent; -1 with
// why filled when the file is there but unusable.
static int cache_load(const char *path, const char *description, CacheArrays *a, Mapping *m, char *why,
                      size_t whylen) {
    uint64_t size;
    int fd = open_input_file(path, INFILE_DATA, &size, why, whylen);
    if (fd < 0) return errno == ENOENT ? 0 : -1;
    size_t desc_len = strlen(description);
    size_t want = sizeof(CacheHeader) + padded(desc_len);
    for (int i = 0; i < a->n; i++) want += padded(a->elem_size[i] * (size_t)a->count[i]);
    if (size != want) {
        snprintf(why, whylen, "%llu bytes where %zu were expected", (unsigned long long)size, want);
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, want, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(why, whylen, "cannot map it (%s)", strerror(errno));
        return -1;
    }
    const CacheHeader *h = map;
    const char *desc = (const char *)map + sizeof *h;
    int ok = memcmp(h->magic, CACHE_MAGIC, 8) == 0 && h->format == CACHE_FORMAT &&
             h->description_bytes == desc_len && (int)h->n_arrays == a->n && memcmp(desc, description, desc_len) == 0;
    for (int i = 0; ok && i < a->n; i++)
        ok = h->elem_size[i] == a->elem_size[i] && h->count[i] == (uint64_t)a->count[i];
    if (!ok) {
        snprintf(why, whylen, "its header does not match the indices it should hold");
        munmap(map, want);
        return -1;
    }
    uint8_t *at = (uint8_t *)map + sizeof *h + padded(desc_len);
    uint64_t sum = 0;
    for (int i = 0; i < a->n; i++) {
        size_t bytes = padded(a->elem_size[i] * (size_t)a->count[i]);
        a->data[i] = at;
        sum = checksum_words(sum, at, bytes);
        at += bytes;
    }
    if (sum != h->checksum) {
        snprintf(why, whylen, "its checksum does not match its contents");
        munmap(map, want);
        return -1;
    }
    m->map = map;
    m->size = want;
    return 1;
}

static int write_or_fail(AtomicFile *af, const void *data, size_t n, char *err, size_t errlen) {
    static const uint8_t zeros[8];
    if (atomic_write(af, data, n, err, errlen)) return -1;
    return padded(n) > n ? atomic_write(af, zeros, padded(n) - n, err, errlen) : 0;
}

// Writes the arrays of a atomically (counting the file in *built); warns once and carries on
// when the directory is not writable.
static void cache_store(MegatronData *d, const char *path, const char *description, const CacheArrays *a,
                        int *built) {
    if (d->cache_unwritable) return;
    char err[256];
    CacheHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CACHE_MAGIC, 8);
    h.format = CACHE_FORMAT;
    h.description_bytes = strlen(description);
    h.n_arrays = (uint64_t)a->n;
    for (int i = 0; i < a->n; i++) {
        h.elem_size[i] = a->elem_size[i];
        h.count[i] = (uint64_t)a->count[i];
        h.checksum = checksum_tail(h.checksum, a->data[i], a->elem_size[i] * (size_t)a->count[i]);
    }
    AtomicFile af;
    int failed = make_directories(d->cache_dir) != 0;
    if (failed) snprintf(err, sizeof err, "%s", strerror(errno));
    else failed = atomic_open(&af, path, err, sizeof err) != 0;
    if (!failed) {
        failed = write_or_fail(&af, &h, sizeof h, err, sizeof err) ||
                 write_or_fail(&af, description, (size_t)h.description_bytes, err, sizeof err);
        for (int i = 0; !failed && i < a->n; i++)
            failed = write_or_fail(&af, a->data[i], a->elem_size[i] * (size_t)a->count[i], err, sizeof err);
        failed = atomic_commit(&af, err, sizeof err) != 0 || failed;
    }
    if (failed) {
        fprintf(stderr,
                "moetron: warning: cannot write the index cache in %s (%s); the indices are rebuilt on every run "
                "(set --data-cache-path to a writable directory)\n",
                d->cache_dir, err);
        d->cache_unwritable = 1;
        return;
    }
    (*built)++;
}

// Loads the arrays from the cache; 1 when they came from there (counted in *reused). A damaged
// file is reported.
static int cache_fetch(const char *path, const char *description, CacheArrays *a, Mapping *m, int *reused) {
    char why[512];
    int got = cache_load(path, description, a, m, why, sizeof why);
    if (got < 0) fprintf(stderr, "moetron: note: index cache %s is unusable (%s); rebuilding it\n", path, why);
    if (got > 0) (*reused)++;
    return got > 0;
}

// ---------------------------------------------------------------------------
// Token ids: each dataset's smallest and largest id, scanned once and cached under the
// dataset's identity (so a changed or touched file is scanned again), checked against the
// vocabulary before any index is built.

#define TOKEN_RANGE_FIELDS 2  // min, max

// [min, max] of ds's token ids, from the cache or a scan of its .bin (then cached).
static void dataset_token_range(MegatronData *d, const IndexedDataset *ds, int64_t range[TOKEN_RANGE_FIELDS]) {
    char description[IDENTITY_MAX + 128], path[MT_PATH_MAX + 64];
    snprintf(description, sizeof description, "moetron token id range, cache format %d\ndataset %s\n", CACHE_FORMAT,
             dataset_identity(d, ds));
    cache_path(path, d, description, "TokenIds", "all");
    CacheArrays a = {1, {sizeof(int64_t)}, {TOKEN_RANGE_FIELDS}, {0}};
    Mapping m = {0};
    if (cache_fetch(path, description, &a, &m, &d->ids_cached)) {
        memcpy(range, a.data[0], TOKEN_RANGE_FIELDS * sizeof *range);
        unmap(&m);
        return;
    }
    indexed_token_range(ds, &range[0], &range[1]);
    d->ids_scanned++;
    a.data[0] = range;
    int stored = 0;
    cache_store(d, path, description, &a, &stored);
}

// Every dataset's ids inside [0, vocab->size); otherwise one line naming the .bin and the first
// offending document.
static void check_token_ids(MegatronData *d, const TokenVocab *vocab) {
    if (vocab->size <= 0) return;
    for (int i = 0; i < d->n_datasets; i++) {
        const IndexedDataset *ds = &d->datasets[i];
        int64_t range[TOKEN_RANGE_FIELDS];
        dataset_token_range(d, ds, range);
        IndexedToken bad;
        if (range[0] >= 0 && range[1] < vocab->size) continue;
        if (!indexed_find_token_outside(ds, vocab->size, &bad)) continue;  // a stale cached range: all inside
        mt_die("%s.bin: document %lld (sequence %lld, token %lld) holds id %.17g, outside the vocabulary of %s "
               "(ids 0..%lld); give the vocabulary of the tokenizer the data was prepared with, or re-create the "
               "data with the run's tokenizer (moetron prepare)",
               ds->prefix, (long long)bad.document, (long long)bad.sequence, (long long)bad.position, bad.value,
               vocab->source, (long long)vocab->size - 1);
    }
    printf("megatron data: token ids of %d dataset%s inside the vocabulary of %s: %d scanned, %d from the cache\n",
           d->n_datasets, d->n_datasets == 1 ? "" : "s", vocab->source, d->ids_scanned, d->ids_cached);
}

// ---------------------------------------------------------------------------
// GPTDataset parts

// The description a part's indices are cached under: everything they depend on.
static void part_description(char *out, size_t n, const MegatronData *d, const GptPart *p, int split, int64_t first,
                             int64_t count, int64_t num_samples) {
    snprintf(out, n,
             "moetron GPTDataset indices, cache format %d\ndataset %s\nsplit %s\nsequences %lld+%lld\n"
             "num_samples %lld\nseq_length %d\nseed %u\n",
             CACHE_FORMAT, dataset_identity(d, p->ds), SPLIT_NAMES[split], (long long)first, (long long)count,
             (long long)num_samples, d->seq_length, d->seed);
}

// Builds (or loads) a GPTDataset over sequences [first, first + count) of ds for num_samples
// samples (< 0: one epoch). what names the data for messages ("--data-path A, split valid").
static void part_build(MegatronData *d, GptPart *p, const IndexedDataset *ds, int split, int64_t first,
                       int64_t count, int64_t num_samples, const char *what, char *description, size_t desc_cap) {
    p->ds = ds;
    int64_t tokens = gpt_tokens_in_range(ds->sequence_lengths, first, count);
    if (count == 0 || tokens == 0)
        mt_die("%s has no %s in the %s split (%lld documents in the dataset, --split decides the share) but "
               "samples are asked of it; use more data or change --split",
               what, count ? "tokens" : "documents", SPLIT_NAMES[split], (long long)ds->n_sequences);
    part_description(description, desc_cap, d, p, split, first, count, num_samples);
    char path[MT_PATH_MAX + 64];
    cache_path(path, d, description, "GPTDataset", SPLIT_NAMES[split]);
    gpt_plan_epochs(&p->index, tokens, num_samples, d->seq_length);
    CacheArrays a = {3,
                     {sizeof(int32_t), sizeof(int64_t), sizeof(int64_t)},
                     {p->index.num_epochs * count, 2 * (p->index.n_samples + 1), p->index.n_samples},
                     {0}};
    if (cache_fetch(path, description, &a, &p->mapping, &d->reused)) {
        p->index.n_documents = a.count[0];
        p->index.document_index = a.data[0];
        p->index.sample_index = a.data[1];
        p->index.shuffle_index = a.data[2];
        return;
    }
    gpt_index_build(&p->index, ds->sequence_lengths, first, count, num_samples, d->seq_length, d->seed);
    a.data[0] = p->index.document_index;
    a.data[1] = p->index.sample_index;
    a.data[2] = p->index.shuffle_index;
    MT_ASSERT(a.count[0] == p->index.n_documents);
    cache_store(d, path, description, &a, &d->built);
}

static void part_free(GptPart *p) {
    if (p->mapping.map) unmap(&p->mapping);
    else gpt_index_free(&p->index);
}

// ---------------------------------------------------------------------------
// Splits

// The BlendedDataset over the parts of a split: its size and weights, then the dataset
// index and dataset sample index (cached), then Megatron's check that no part is oversampled.
// norm: the normalised list weights (NULL without weights); target: each part's share.
static void split_blend(MegatronData *d, int s, const BlendList *list, const char *flag, const double *norm,
                        const int64_t *target, int64_t asked, const char *blend_desc_head) {
    SplitData *sd = &d->split[s];
    int n = sd->n_parts;
    double *raw = mt_malloc((size_t)n * sizeof *raw), *weights = mt_malloc((size_t)n * sizeof *weights);
    if (norm) {
        sd->size = 0;
        for (int i = 0; i < n; i++) {
            sd->size += target[i];
            raw[i] = norm[i];
        }
    } else {
        // No weights: each dataset once, weighted by its number of samples.
        int64_t total = 0;
        for (int i = 0; i < n; i++) {
            int64_t have = sd->parts[i].index.n_samples;
            if (have == 0)
                mt_die("--%s %s: its %s split holds fewer than --seq-length + 1 = %d tokens, so it adds no sample "
                       "to the blend; remove it or use a shorter --seq-length",
                       flag, list->prefixes[i], SPLIT_NAMES[s], d->seq_length + 1);
            raw[i] = (double)have;
            total += have;
        }
        if (total < asked)
            mt_die("--%s without weights uses every dataset once (Megatron's blend by size): %lld %s samples, but "
                   "%lld are needed; give weights (e.g. 0.5 A 0.5 B) to repeat the data, or add data",
                   flag, (long long)total, SPLIT_NAMES[s], (long long)asked);
        sd->size = asked;
    }
    blend_normalize(raw, n, weights);  // BlendedDataset normalises (again, with weights)

    size_t cap = strlen(blend_desc_head) + (size_t)n * 40 + 64;
    char *desc = mt_malloc(cap);
    int at = snprintf(desc, cap, "%s", blend_desc_head);
    for (int i = 0; i < n; i++) at += snprintf(desc + at, cap - (size_t)at, "weight %.17g\n", weights[i]);
    snprintf(desc + at, cap - (size_t)at, "size %lld\n", (long long)sd->size);
    char path[MT_PATH_MAX + 64];
    cache_path(path, d, desc, "BlendedDataset", SPLIT_NAMES[s]);
    CacheArrays a = {2, {sizeof(int16_t), sizeof(int64_t)}, {sd->size, sd->size}, {0}};
    if (cache_fetch(path, desc, &a, &sd->mapping, &d->reused)) {
        sd->dataset_index = a.data[0];
        sd->dataset_sample_index = a.data[1];
    } else {
        sd->dataset_index = mt_malloc((size_t)(sd->size ? sd->size : 1) * sizeof *sd->dataset_index);
        sd->dataset_sample_index = mt_malloc((size_t)(sd->size ? sd->size : 1) * sizeof *sd->dataset_sample_index);
        blend_build_indices(weights, n, sd->size, sd->dataset_index, sd->dataset_sample_index);
        a.data[0] = sd->dataset_index;
        a.data[1] = sd->dataset_sample_index;
        cache_store(d, path, desc, &a, &d->built);
    }
    int64_t *used = mt_calloc((size_t)n, sizeof *used);
    for (int64_t i = 0; i < sd->size; i++) {
        int k = sd->dataset_index[i];
        MT_ASSERT(k >= 0 && k < n);
        used[k] = MT_MAX(used[k], sd->dataset_sample_index[i] + 1);
    }
    for (int i = 0; i < n; i++)
        if (used[i] > sd->parts[i].index.n_samples)
            mt_die("--%s: the %s blend draws %lld samples from %s, which has %lld (Megatron's 0.5%% surplus is too "
                   "small for these weights); change the weights or the number of samples",
                   flag, SPLIT_NAMES[s], (long long)used[i], list->prefixes[i],
                   (long long)sd->parts[i].index.n_samples);
    free(used);
    free(desc);
    free(raw);
    free(weights);
}

// One split from one blend list. matrix is the --split book-ends (blend mode, --data-path)
// or NULL when the list is the split's own (--train-data-path ...: the whole datasets).
// BlendedMegatronDatasetBuilder: one prefix without weights (or any single prefix of a
// per-split list) is a plain GPTDataset; otherwise each prefix gets a GPTDataset, sized by
// its weight plus Megatron's surplus (or one epoch without weights), blended together.
static void split_build(MegatronData *d, int s, const BlendList *list, const char *flag, const SplitMatrix *matrix,
                        int64_t asked) {
    SplitData *sd = &d->split[s];
    if (asked <= 0 || list->n == 0) return;
    if (matrix && !matrix->present[s]) {  // --split gives it no share: Megatron's None
        if (s == GPT_SPLIT_TRAIN)
            mt_die("--split '%s' gives the training split no share of --data-path; give it a positive first part",
                   d->split_string);
        return;
    }
    int n = list->n;
    int single = n == 1 && (!list->weights || !matrix);
    sd->n_parts = n;
    sd->parts = mt_calloc((size_t)n, sizeof *sd->parts);
    double *norm = list->weights ? mt_malloc((size_t)n * sizeof *norm) : NULL;
    int64_t *target = mt_calloc((size_t)n, sizeof *target);
    if (norm) blend_normalize(list->weights, n, norm);
    size_t head_cap = 128 + (size_t)n * 32, part_cap = IDENTITY_MAX + 512;
    char *head = mt_malloc(head_cap), *part_desc = mt_malloc(part_cap);
    int at = snprintf(head, head_cap, "moetron BlendedDataset indices, cache format %d\nsplit %s\n", CACHE_FORMAT,
                      SPLIT_NAMES[s]);
    for (int i = 0; i < n; i++) {
        const IndexedDataset *ds = open_dataset(d, list->prefixes[i], flag);
        int64_t first = 0, count = ds->n_sequences, samples = asked;
        if (matrix) gpt_split_range(matrix, s, ds->n_sequences, &first, &count);
        if (!single && norm) {
            target[i] = blend_dataset_samples(norm[i], asked, 0.0);
            samples = blend_dataset_samples(norm[i], asked, BLEND_MID_LEVEL_SURPLUS);
        } else if (!single) {
            samples = -1;  // Megatron's None: one epoch
        }
        char what[MT_PATH_MAX + 64];
        snprintf(what, sizeof what, "--%s %s", flag, list->prefixes[i]);
        part_build(d, &sd->parts[i], ds, s, first, count, samples, what, part_desc, part_cap);
        at += snprintf(head + at, head_cap - (size_t)at, "dataset %016" PRIx64 "\n", fnv1a(part_desc));
    }
    if (single) sd->size = sd->parts[0].index.n_samples;
    else split_blend(d, s, list, flag, norm, target, asked, head);
    free(norm);
    free(target);
    free(head);
    free(part_desc);
}

static void split_free(SplitData *sd) {
    for (int i = 0; i < sd->n_parts; i++) part_free(&sd->parts[i]);
    free(sd->parts);
    if (sd->mapping.map) unmap(&sd->mapping);
    else {
        free(sd->dataset_index);
        free(sd->dataset_sample_index);
    }
    memset(sd, 0, sizeof *sd);
}

// ---------------------------------------------------------------------------
// The API

static const char *const LIST_FLAGS[3] = {"train-data-path", "valid-data-path", "test-data-path"};

static const char *split_list(const Config *c, int s) {
    return s == 0 ? c->train_data_path : s == 1 ? c->valid_data_path : c->test_data_path;
}

int megatron_data_requested(const Config *c) {
    for (int s = 0; s < 3; s++)
        if (split_list(c, s)[0]) return 1;
    if (!c->data_path[0]) return 0;
    BlendList b;
    blend_parse(&b, c->data_path, "data-path");
    // One path: a prefix when PREFIX.idx or PREFIX.bin exists, and also when it names one of
    // them (PREFIX.bin) so that the error says to drop the extension; else a text file.
    const char *p = b.prefixes[0];
    char stripped[MT_PATH_MAX];
    size_t keep = MT_MIN(strlen(p) > 4 ? strlen(p) - 4 : 0, sizeof stripped - 1);
    memcpy(stripped, p, keep);
    stripped[keep] = 0;
    int names_file = (ends_with(p, ".bin") || ends_with(p, ".idx")) && prefix_file_exists(stripped, ".idx") &&
                     prefix_file_exists(stripped, ".bin");
    int yes = b.weights || b.n > 1 || names_file || prefix_file_exists(p, ".idx") || prefix_file_exists(p, ".bin");
    blend_free(&b);
    return yes;
}

// Opens every dataset the lists name before any part points into d->datasets (which grows).
static void collect_datasets(MegatronData *d, BlendList lists[3], const char *flags[3]) {
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < lists[s].n; i++) open_dataset(d, lists[s].prefixes[i], flags[s]);
}

MegatronData *megatron_data_open(const Config *c, const int64_t num_samples[3], const TokenVocab *vocab) {
    if (c->seed < 0) mt_die("--seed %d: Megatron datasets need a seed in [0, 2^32)", c->seed);
    if (c->seq_length < 1) mt_die("--seq-length must be positive");
    int blend_mode = c->data_path[0] != 0;
    if (blend_mode)
        for (int s = 0; s < 3; s++)
            if (split_list(c, s)[0])
                mt_die("--data-path and --%s exclude each other: give --data-path with --split, or per-split paths",
                       LIST_FLAGS[s]);
    MegatronData *d = mt_calloc(1, sizeof *d);
    d->seq_length = c->seq_length;
    d->seed = (uint32_t)c->seed;

    BlendList lists[3];
    const char *flags[3];
    memset(lists, 0, sizeof lists);
    if (blend_mode) {
        blend_parse(&lists[0], c->data_path, "data-path");
        flags[0] = flags[1] = flags[2] = "data-path";
    } else {
        for (int s = 0; s < 3; s++) {
            blend_parse(&lists[s], split_list(c, s), LIST_FLAGS[s]);
            flags[s] = LIST_FLAGS[s];
        }
    }
    if (num_samples[0] > 0 && !lists[0].n)
        mt_die("no training data: give --data-path PREFIX (with --split) or --train-data-path PREFIX");
    collect_datasets(d, lists, flags);
    const char *first_prefix = NULL;
    for (int s = 0; s < 3 && !first_prefix; s++)
        if (lists[s].n) first_prefix = lists[s].prefixes[0];
    if (c->data_cache_path[0]) snprintf(d->cache_dir, sizeof d->cache_dir, "%s", c->data_cache_path);
    else if (first_prefix) default_cache_dir(d->cache_dir, first_prefix);
    check_token_ids(d, vocab);

    SplitMatrix matrix;
    d->split_string = c->split;
    if (blend_mode) gpt_split_matrix(c->split, &matrix);
    for (int s = 0; s < 3; s++)
        split_build(d, s, blend_mode ? &lists[0] : &lists[s], flags[s], blend_mode ? &matrix : NULL, num_samples[s]);
    for (int s = 0; s < 3; s++) blend_free(&lists[s]);
    printf("megatron data: %lld/%lld/%lld train/valid/test samples of %d tokens from %d dataset%s; index cache %s: "
           "%d reused, %d built\n",
           (long long)d->split[0].size, (long long)d->split[1].size, (long long)d->split[2].size, d->seq_length + 1,
           d->n_datasets, d->n_datasets == 1 ? "" : "s", d->cache_dir, d->reused, d->built);
    return d;
}

void megatron_data_free(MegatronData *d) {
    if (!d) return;
    for (int s = 0; s < 3; s++) split_free(&d->split[s]);
    for (int i = 0; i < d->n_datasets; i++) indexed_close(&d->datasets[i]);
    free(d->datasets);
    free(d->identity);
    free(d);
}

int64_t megatron_data_size(const MegatronData *d, DataSplit split) {
    MT_ASSERT(split >= DATA_TRAIN && split <= DATA_TEST);
    return d->split[split].size;
}

void megatron_data_sample(const MegatronData *d, DataSplit split, int64_t i, int32_t *tokens) {
    MT_ASSERT(split >= DATA_TRAIN && split <= DATA_TEST);
    const SplitData *sd = &d->split[split];
    MT_ASSERT(i >= 0 && i < sd->size);
    int part = 0;
    int64_t j = i;
    if (sd->dataset_index) {
        part = sd->dataset_index[i];
        j = sd->dataset_sample_index[i];
    }
    const GptPart *p = &sd->parts[part];
    gpt_sample(&p->index, p->ds, d->seq_length, j, tokens);
}

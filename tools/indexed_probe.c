// indexed_probe.c — moetron's Megatron indexed dataset reader and writer (src/data/indexed.h)
// from the command line, for tests/conformance/megatron_indexed.py.
//
// usage: indexed_probe write PREFIX DTYPE < DOCS.json   DOCS.json: a list of documents, each a list
//                                                        of sequences (lists of token ids); DTYPE a
//                                                        NumPy name (uint8 int8 int16 int32 int64
//                                                        float64 float32 uint16)
//        indexed_probe read PREFIX                      one line of JSON: {"dtype", "sequence_lengths",
//                                                        "sequence_pointers", "document_indices",
//                                                        "documents": [[[tokens of a sequence] ...] ...]}
//        indexed_probe merge OUT PREFIX...              OUT = the datasets one after another (add_index)
//        indexed_probe dtype-for-vocab N                the dtype name indexed_dtype_for_vocab picks
// Errors are one line on stderr and exit status 1.
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/json.h"
#include "data/indexed.h"

static IndexedDtype dtype_or_die(const char *name) {
    IndexedDtype dtype;
    if (!indexed_dtype_from_name(name, &dtype))
        mt_die("unknown dtype '%s' (uint8 int8 int16 int32 int64 float64 float32 uint16)", name);
    return dtype;
}

static const JsonValue *array_or_die(const JsonValue *v, const char *what) {
    if (!v || v->type != JSON_ARRAY) mt_die("stdin: %s must be a JSON list", what);
    return v;
}

static int write_dataset(const char *prefix, const char *dtype_name) {
    IndexedDtype dtype = dtype_or_die(dtype_name);
    char err[256];
    size_t len;
    char *text = (char *)read_fd_all(STDIN_FILENO, INFILE_CONFIG, &len, err, sizeof err);
    if (!text) mt_die("stdin: %s", err);
    JsonValue *docs = json_parse(text, len, err, sizeof err);
    if (!docs) mt_die("stdin: %s", err);
    array_or_die(docs, "the input");
    IndexedBuilder *b = indexed_builder_new(prefix, dtype);
    int32_t *tokens = NULL;
    for (size_t j = 0; j < docs->count; j++) {
        const JsonValue *doc = array_or_die(json_at(docs, j), "a document");
        for (size_t s = 0; s < doc->count; s++) {
            const JsonValue *seq = array_or_die(json_at(doc, s), "a sequence");
            tokens = mt_realloc(tokens, (seq->count + 1) * sizeof *tokens);
            for (size_t k = 0; k < seq->count; k++) {
                int64_t v;
                if (!json_as_int64(json_at(seq, k), &v) || v < INT32_MIN || v > INT32_MAX)
                    mt_die("stdin: document %zu sequence %zu token %zu is not an int32", j, s, k);
                tokens[k] = (int32_t)v;
            }
            indexed_builder_add(b, tokens, (int64_t)seq->count);
        }
        indexed_builder_end_document(b);
    }
    indexed_builder_finish(b);
    free(tokens);
    json_free(docs);
    free(text);
    return 0;
}

static void int_array(JsonWriter *w, const char *key, const void *values, int64_t n, int is64) {
    jw_key(w, key);
    jw_begin_array(w);
    for (int64_t i = 0; i < n; i++)
        jw_int(w, is64 ? ((const int64_t *)values)[i] : ((const int32_t *)values)[i]);
    jw_end_array(w);
}

static int read_dataset(const char *prefix) {
    IndexedDataset d;
    indexed_open(&d, prefix);
    JsonWriter w;
    jw_init_compact(&w);
    jw_begin_object(&w);
    jw_kv_string(&w, "dtype", indexed_dtype_name(d.dtype));
    int_array(&w, "sequence_lengths", d.sequence_lengths, d.n_sequences, 0);
    int_array(&w, "sequence_pointers", d.sequence_pointers, d.n_sequences, 1);
    int_array(&w, "document_indices", d.document_indices, d.n_documents + 1, 1);
    jw_key(&w, "documents");
    jw_begin_array(&w);
    for (int64_t j = 0; j < d.n_documents; j++) {
        jw_begin_array(&w);
        for (int64_t i = d.document_indices[j]; i < d.document_indices[j + 1]; i++) {
            int32_t n = d.sequence_lengths[i];
            int32_t *tokens = mt_malloc((size_t)n * sizeof *tokens);
            indexed_read(&d, i, 0, n, tokens);
            jw_begin_array(&w);
            for (int32_t k = 0; k < n; k++) jw_int(&w, tokens[k]);
            jw_end_array(&w);
            free(tokens);
        }
        jw_end_array(&w);
    }
    jw_end_array(&w);
    jw_end_object(&w);
    puts(jw_text(&w));
    jw_free(&w);
    indexed_close(&d);
    return 0;
}

static int merge_datasets(const char *out, int n, char **prefixes) {
    IndexedDataset first;
    indexed_open(&first, prefixes[0]);
    IndexedBuilder *b = indexed_builder_new(out, first.dtype);
    indexed_close(&first);
    for (int i = 0; i < n; i++) indexed_builder_add_index(b, prefixes[i]);
    indexed_builder_finish(b);
    return 0;
}

int main(int argc, char **argv) {
    const char *cmd = argc > 1 ? argv[1] : "";
    if (strcmp(cmd, "write") == 0 && argc == 4) return write_dataset(argv[2], argv[3]);
    if (strcmp(cmd, "read") == 0 && argc == 3) return read_dataset(argv[2]);
    if (strcmp(cmd, "merge") == 0 && argc >= 4) return merge_datasets(argv[2], argc - 3, argv + 3);
    if (strcmp(cmd, "dtype-for-vocab") == 0 && argc == 3) {
        puts(indexed_dtype_name(indexed_dtype_for_vocab(strtoll(argv[2], NULL, 10))));
        return 0;
    }
    fprintf(stderr, "usage: indexed_probe write PREFIX DTYPE < DOCS.json | read PREFIX | merge OUT PREFIX... | "
                    "dtype-for-vocab N\n");
    return 2;
}

// fuzz_indexed.c — Megatron .idx/.bin (src/data/indexed.c): indexed_open on a pair of files
// made from the input, then indexed_read of every sequence, whole and in part.
// Input: u32 little-endian n, then n bytes of PREFIX.idx, then the bytes of PREFIX.bin
// (n is cut to what the input holds). tests/fuzz/corpus/indexed/ has datasets written by
// moetron prepare in this layout (tests/fuzz/make_seeds.py).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "data/indexed.h"
#include "fuzz.h"

typedef struct {
    const uint8_t *data;
    size_t size;
    IndexedDataset d;
} Ctx;

static void body(void *ctx) {
    Ctx *x = ctx;
    FuzzPair files = fuzz_split(x->data, x->size);
    fuzz_write("ds.idx", files.first, files.first_size);
    fuzz_write("ds.bin", files.second, files.second_size);
    char prefix[700];
    snprintf(prefix, sizeof prefix, "%s/ds", fuzz_dir());
    IndexedDataset *d = &x->d;
    indexed_open(d, prefix);
    // what indexed_open promises
    if (d->document_indices[0] != 0 || d->document_indices[d->n_documents] != d->n_sequences)
        fuzz_fail("document indices do not run from 0 to the sequence count");
    for (int64_t j = 1; j <= d->n_documents; j++)
        if (d->document_indices[j] < d->document_indices[j - 1]) fuzz_fail("document indices not monotone");
    for (int64_t i = 0; i < d->n_sequences; i++) {
        int64_t len = d->sequence_lengths[i];
        if (len < 0 || d->sequence_pointers[i] < 0 ||
            (uint64_t)d->sequence_pointers[i] + (uint64_t)len * (uint64_t)d->elem_size > d->bin_size)
            fuzz_fail("sequence %lld lies outside the .bin", (long long)i);
        int32_t *tokens = malloc((size_t)(len ? len : 1) * sizeof(int32_t));
        indexed_read(d, i, 0, len, tokens);
        if (len > 1) indexed_read(d, i, 1, len - 2, tokens);
        indexed_read(d, i, len, 0, tokens);
        free(tokens);
    }
    indexed_close(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Ctx x;
    x.data = data;
    x.size = size;
    if (fuzz_run(body, &x) == FUZZ_DIED) {
        // the die left the mappings (fuzz_run freed the heap blocks, where it tracks them)
        if (x.d.idx_map) munmap(x.d.idx_map, x.d.idx_size);
        if (x.d.bin_map) munmap(x.d.bin_map, x.d.bin_size);
    }
    memset(&x.d, 0, sizeof x.d);
    return 0;
}

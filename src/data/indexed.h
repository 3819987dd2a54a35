// indexed.h — Megatron-Core's indexed dataset, byte-compatible both ways:
//   PREFIX.idx  header "MMIDIDX\0\0", version, dtype code, sequence count, document count,
//               sequence lengths (int32), sequence pointers (int64 byte offsets into .bin),
//               document indices (int64: the sequence each document starts at, plus the end)
//   PREFIX.bin  the tokens of every sequence back to back, in the dtype
// Files are memory-mapped and validated on open (magic, version, dtype, sizes against the
// file lengths, monotone pointers); every failure is one fatal line naming the file.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"

// Megatron-Core's DType codes.
typedef enum {
    IDX_UINT8 = 1, IDX_INT8 = 2, IDX_INT16 = 3, IDX_INT32 = 4, IDX_INT64 = 5,
    IDX_FLOAT64 = 6, IDX_FLOAT32 = 7, IDX_UINT16 = 8,
} IndexedDtype;

typedef struct {
    char prefix[MT_PATH_MAX];
    IndexedDtype dtype;
    int elem_size;                      // bytes per token
    int64_t n_sequences;
    int64_t n_documents;                // document_indices has n_documents + 1 entries
    const int32_t *sequence_lengths;    // (n_sequences) tokens
    const int64_t *sequence_pointers;   // (n_sequences) byte offsets into .bin
    const int64_t *document_indices;    // (n_documents + 1)
    // mappings (private)
    void *idx_map, *bin_map;
    size_t idx_size, bin_size;
} IndexedDataset;

void indexed_open(IndexedDataset *d, const char *prefix);
void indexed_close(IndexedDataset *d);
// Tokens [offset, offset + length) of sequence i as int32.
void indexed_read(const IndexedDataset *d, int64_t i, int64_t offset, int64_t length, int32_t *out);

// The smallest dtype Megatron-Core's tools pick for a vocabulary: uint16 below 65500, else int32.
IndexedDtype indexed_dtype_for_vocab(int64_t vocab_size);

// Writing, streamed: tokens go to PREFIX.bin as they come; the index is written at the end.
typedef struct IndexedBuilder IndexedBuilder;
IndexedBuilder *indexed_builder_new(const char *prefix, IndexedDtype dtype);
void indexed_builder_add(IndexedBuilder *b, const int32_t *tokens, int64_t n);  // one sequence
void indexed_builder_end_document(IndexedBuilder *b);
// Write PREFIX.idx and close; both files appear complete or not at all.
void indexed_builder_finish(IndexedBuilder *b);

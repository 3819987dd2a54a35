// indexed.h — Megatron-Core's indexed dataset, byte-compatible both ways:
//   PREFIX.idx  header "MMIDIDX\0\0", version (u64 1), dtype code (u8), sequence count (u64),
//               document count (u64: the entries of document indices, documents + 1),
//               sequence lengths (int32), sequence pointers (int64 byte offsets into .bin),
//               document indices (int64: the sequence each document starts at, plus the end)
//   PREFIX.bin  the tokens of every sequence back to back, in the dtype
// Files are memory-mapped and validated on open (magic, version, dtype, sizes against the
// file lengths, monotone pointers); every failure is one fatal line naming the file.
// docs/data.md describes the format and every check.
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
    // Modification times of the files as opened (fstat of the descriptors that were mapped).
    int64_t idx_mtime_ns, bin_mtime_ns;
    // The three arrays above, copied out of the .idx on open: in the file they start at byte
    // 34, which is not aligned for int32/int64 access. idx_map is unmapped after the copy.
    void *arrays;
} IndexedDataset;

void indexed_open(IndexedDataset *d, const char *prefix);
void indexed_close(IndexedDataset *d);
// Tokens [offset, offset + length) of sequence i as int32.
void indexed_read(const IndexedDataset *d, int64_t i, int64_t offset, int64_t length, int32_t *out);

// The smallest and largest token value in the whole .bin, in one vectorised pass over the mapping
// (min 0, max -1 when it holds no token); values beyond int64 saturate. Float values count as
// they are: fractions, NaN and infinities are reported by indexed_read.
void indexed_token_range(const IndexedDataset *d, int64_t *min_id, int64_t *max_id);
// Where the first token outside [0, limit) is, in file order.
typedef struct {
    int64_t document, sequence, position;  // position: the token's index in its sequence
    double value;
} IndexedToken;
// 1 with *where filled when some token is outside [0, limit); 0 when all are inside.
int indexed_find_token_outside(const IndexedDataset *d, int64_t limit, IndexedToken *where);

// The smallest dtype Megatron-Core's tools pick for a vocabulary: uint16 below 65500, else int32.
IndexedDtype indexed_dtype_for_vocab(int64_t vocab_size);
// Bytes per token of a dtype code and its NumPy name ("uint16"); 0 / NULL for an unknown code.
int indexed_dtype_size(int code);
const char *indexed_dtype_name(int code);
// The dtype named by its NumPy name; 0 when the name is unknown.
int indexed_dtype_from_name(const char *name, IndexedDtype *out);

// Writing, streamed: tokens go to PREFIX.bin as they come; the index is written at the end.
typedef struct IndexedBuilder IndexedBuilder;
// Both files are written as PREFIX.{bin,idx}.tmp.<pid> and renamed at finish. Memory use is
// 4 bytes per sequence and 8 per document, whatever the number of tokens. A token that does
// not fit the dtype (300 in uint8, 2^24 + 1 in float32) is a fatal error.
IndexedBuilder *indexed_builder_new(const char *prefix, IndexedDtype dtype);
void indexed_builder_add(IndexedBuilder *b, const int32_t *tokens, int64_t n);  // one sequence
void indexed_builder_end_document(IndexedBuilder *b);
// Append a whole dataset of the same dtype (Megatron's IndexedDatasetBuilder.add_index): its
// tokens, sequences and documents; sequences added since the last end_document join its
// first document, as in Megatron.
void indexed_builder_add_index(IndexedBuilder *b, const char *prefix);
// Write PREFIX.idx and close; both files appear complete or not at all. Sequences added
// after the last end_document form one more document.
void indexed_builder_finish(IndexedBuilder *b);
// Give up: remove the temporary files and free the builder; existing PREFIX files are untouched.
void indexed_builder_abort(IndexedBuilder *b);

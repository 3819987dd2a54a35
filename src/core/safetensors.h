// safetensors.h — read and write the safetensors checkpoint format (the format
// of Hugging Face model weights), validating every header field on load.
//
// File layout:
//   [u64 little-endian N][N bytes of JSON header][data bytes]
// Header:
//   {"__metadata__": {"format": "pt", <string>: <string>, ...},
//    "<tensor name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]},
//    ...}
// Offsets are relative to the start of the data section (8 + N), end exclusive.
// Tensors are dense row-major, little-endian, and must tile the data section
// exactly: no overlaps, no holes, no trailing bytes.
#pragma once
#include "common.h"
#include "fileio.h"

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER_BYTES 100000000ULL  // larger headers are rejected (as the Python package does)

typedef enum {
    ST_F64, ST_F32, ST_F16, ST_BF16, ST_F8_E4M3, ST_F8_E5M2,
    ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL,
    ST_DTYPE_COUNT
} StDtype;

const char *st_dtype_name(StDtype dtype);             // "F32", "BF16", ...; "?" if out of range
int st_dtype_from_name(const char *name, StDtype *out);  // 1 if known, 0 otherwise
size_t st_dtype_size(StDtype dtype);                  // bytes per element; 0 if out of range

// ---------------------------------------------------------------------------
// Reader

typedef struct {
    char *name;
    StDtype dtype;
    int ndim;                      // 0 for a scalar
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;           // byte range within the data section
} StTensor;

typedef struct {
    char *path;
    uint8_t *bytes;                // the whole file, mapped read-only (pages load as they are read)
    size_t size;
    size_t data_start;             // 8 + N
    int n_tensors;
    StTensor *tensors;             // [n_tensors] in header order
    int n_meta;                    // "__metadata__" entries, in header order
    char **meta_keys;
    char **meta_values;
    int *by_name;                  // private: tensor indices sorted by name (for st_find)
} StFile;

// Reads and validates the whole file. Returns 0 on success; otherwise nonzero
// with a one-line reason in err (without the path; the caller prefixes it) and
// *f left empty (st_close on it is harmless).
int st_open(StFile *f, const char *path, char *err, size_t errlen);
void st_close(StFile *f);

const StTensor *st_find(const StFile *f, const char *name);  // NULL if absent
const char *st_meta(const StFile *f, const char *key);       // NULL if absent
int64_t st_numel(const StTensor *t);                          // product of the shape (1 for a scalar)

// Converts the tensor's elements (F64, F32, F16, BF16, F8_E4M3, F8_E5M2) into
// out[st_numel(t)]. Returns 0 on success, nonzero for integer/bool dtypes. Only t's
// bytes are read, and their pages are released afterwards: reading a file tensor by
// tensor holds no more of it in memory than one tensor.
int st_read_real(const StFile *f, const StTensor *t, real *out);
// The raw little-endian bytes (t->end - t->begin of them). Aligned to the
// element size only when the writer aligned it (files from stw_finish and from
// the Python package usually are); use memcpy when in doubt.
const void *st_data(const StFile *f, const StTensor *t);

// ---------------------------------------------------------------------------
// Writer: collect tensors and metadata, then write the file in one go.
//   StWriter w; stw_init(&w);
//   stw_add_real(&w, "wte", 2, (int64_t[]){vocab, dim}, wte);
//   stw_meta(&w, "step", "1000");
//   if (stw_finish(&w, "model.safetensors", err, sizeof err)) mt_die("%s", err);
// Tensors are written in the order added; "__metadata__" comes first and always
// holds "format": "pt". The header is padded with spaces to a multiple of 8.
// stw_add and stw_add_real_view reference the caller's memory (nothing is copied:
// writing a model costs no second copy of it); stw_add_real copies.

typedef struct {
    char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;   // stw_add: the caller's bytes, written as they are
    const real *reals;  // stw_add_real(_view): converted to dtype while the file is written
    real *owned_copy;   // stw_add_real's copy (reals points to it)
    void *owned_bytes;  // stw_add_download's host copy (data points to it)
    uint64_t nbytes;    // bytes in the file
} StWriterTensor;

typedef struct StWriter {
    int n_tensors, cap_tensors;
    StWriterTensor *tensors;
    int n_meta, cap_meta;
    char **meta_keys;
    char **meta_values;
    AtomicFile file;        // the file being written
    int streaming;          // stw_stream_open has written the header
    int next_tensor;        // streaming: the tensor the next values belong to
    uint64_t next_element;  // ... and the first of its elements not yet written
} StWriter;

void stw_init(StWriter *w);
// Adds a tensor whose bytes stay owned by the caller and must stay valid until
// stw_finish. Dies on a bad ndim or negative dimension (a bug in the caller).
void stw_add(StWriter *w, const char *name, StDtype dtype, int ndim, const int64_t *shape, const void *data);
// Adds a tensor stored as F32, copied from real now (data may change or go away after).
void stw_add_real(StWriter *w, const char *name, int ndim, const int64_t *shape, const real *data);
// Adds a tensor of tensor memory (core/device.h), copied to the host now with one
// device_download: stw_add_download's bytes are dtype's as they are (I32 from int32_t),
// stw_add_real_download's real values are stored as F32 (as stw_add_real).
void stw_add_download(StWriter *w, const char *name, StDtype dtype, int ndim, const int64_t *shape,
                      const void *tensor);
void stw_add_real_download(StWriter *w, const char *name, int ndim, const int64_t *shape, const real *tensor);
// Adds a tensor stored as dtype (ST_F32 or ST_BF16), converted from the caller's real
// values in small pieces while the file is written; data must stay valid until stw_finish.
void stw_add_real_view(StWriter *w, const char *name, StDtype dtype, int ndim, const int64_t *shape,
                       const real *data);
// Adds a metadata entry; setting a key again replaces its value.
void stw_meta(StWriter *w, const char *key, const char *value);
// Writes the file atomically (temp file + fsync + rename) and frees everything,
// also on failure. Returns 0 on success; nonzero with err filled (for instance a
// duplicate tensor name, or an I/O error).
int stw_finish(StWriter *w, const char *path, char *err, size_t errlen);
// Frees everything without writing (a stream not closed yet is abandoned: no file).
void stw_discard(StWriter *w);

// Streaming: a file whose tensors' values are not all in memory at once. The header comes
// from the declared names, dtypes and shapes alone; then the values arrive in order.
//   stw_declare(&w, "a", ST_BF16, 2, shape_a); stw_declare(&w, "b", ST_F32, 1, shape_b);
//   if (stw_stream_open(&w, path, err, n)) ...;      // writes the header
//   stw_stream_values(&w, a_part1, n1); stw_stream_values(&w, a_part2, n2); ...  // a, then b
//   if (stw_stream_close(&w, err, n)) ...;           // commits the atomic file
// The bytes are those stw_finish writes for the same tensors. Values may come in pieces of
// any size and a piece may run from one tensor into the next. stw_stream_open and
// stw_stream_close free everything on failure; an I/O error while streaming is reported
// by stw_stream_close. An F32 or BF16 tensor takes real values (stw_stream_values), converted
// as they come; a tensor of any dtype takes its elements as they are stored (stw_stream_raw:
// F8_E4M3 codes, F32 floats, little-endian), and a stream may mix both, tensor by tensor.
void stw_declare(StWriter *w, const char *name, StDtype dtype, int ndim, const int64_t *shape);
int stw_stream_open(StWriter *w, const char *path, char *err, size_t errlen);
void stw_stream_values(StWriter *w, const real *values, size_t n);
void stw_stream_raw(StWriter *w, const void *elements, size_t n);  // n elements of the tensors' dtype
int stw_stream_close(StWriter *w, char *err, size_t errlen);

// float -> bfloat16 bits, rounding to nearest even (as torch does); NaN stays NaN
// (quiet, sign kept), infinities stay infinite, overflow rounds to infinity.
uint16_t st_float_to_bf16(float v);

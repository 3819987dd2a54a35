// dropout_math.h — the dropout mask as a pure function of its coordinates, written once for
// the cpu backend (src/ops/cpu/dropout.c, src/ops/cpu/attention.c), the cuda backend's kernels
// (src/ops/cuda/dropout.cu, attention.cu, as device code) and the host code that seeds it
// (model/dropout.c): both backends draw bit-identical masks, in any order, with no state.
//
// An element (row, col) of a dropout stream is kept when the top 32 bits of
//     dropout_hash(stream, row, col) = splitmix64(splitmix64(stream ^ row) ^ col)
// are ≥ threshold = floor(p·2³²), and a kept value x becomes x·scale, scale = (real)(1/(1−p)).
// The integer comparison and one rounded product make the result exact on every device.
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#define DROPOUT_FN static inline __host__ __device__
#else
#define DROPOUT_FN static inline
#endif

// Vigna's splitmix64 finaliser: a bijection of 64-bit words that mixes every bit.
DROPOUT_FN uint64_t dropout_splitmix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// The hash of one row of a stream (hoisted out of loops over columns).
DROPOUT_FN uint64_t dropout_row_key(uint64_t stream, uint64_t row) { return dropout_splitmix(stream ^ row); }

// 1 when column col of the row (row_key from dropout_row_key) is kept.
DROPOUT_FN int dropout_kept(uint64_t row_key, uint64_t col, uint32_t threshold) {
    return (uint32_t)(dropout_splitmix(row_key ^ col) >> 32) >= threshold;
}

// Attention dropout (ops.h AttentionShape): the row of query `position` of head `head`
// (global index) of batch row b; its columns are the keys' positions.
DROPOUT_FN uint64_t dropout_attention_row(int b, int head, int position) {
    return ((uint64_t)b * 65536u + (uint64_t)head) << 32 | (uint32_t)position;
}

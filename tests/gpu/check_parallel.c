// check_parallel.c — the backend under test's ops of ops_parallel.h (tensor/context-parallel gathers, slices, partial sums)
// against the cpu backend (op_check.h).
#include <stdio.h>
#include <string.h>

#include "op_check.h"

#include "ops/cpu/cpu_ops.h"

static const OpsBackend *cpu(void) { return &ops_cpu_backend; }

// One CP chunk (outer, C, width) out of local tokens (outer, 2C, width), then back into other tokens.
static void check_rows_copy_strided(int outer, int C, int width, int c) {
    char name[96];
    snprintf(name, sizeof(name), "rows_copy_strided outer=%d C=%d width=%d chunk=%d", outer, C, width, c);
    size_t run = (size_t)C * width, local_n = (size_t)outer * 2 * run, chunk_n = (size_t)outer * run;
    float *local = check_random(local_n, -1, 1), *chunk = check_random(chunk_n, -1, 1);
    float *back = check_random(local_n, -1, 1), *d_back = check_to_device(back, local_n);
    float *d_chunk = check_device_nan(chunk_n);
    size_t bytes = run * sizeof(float);
    cpu()->rows_copy_strided(chunk, bytes, local + c * run, 2 * bytes, bytes, outer);
    under()->rows_copy_strided(d_chunk, bytes, check_to_device(local, local_n) + c * run, 2 * bytes, bytes, outer);
    cpu()->rows_copy_strided(back + c * run, 2 * bytes, chunk, bytes, bytes, outer);
    under()->rows_copy_strided(d_back + c * run, 2 * bytes, d_chunk, bytes, bytes, outer);
    check_compare(name, "chunk", chunk, d_chunk, chunk_n, 0);
    check_compare(name, "back", back, d_back, local_n, 0);
    check_free_all();
}

// A permutation of 0..n-1 (Fisher–Yates on the check's random ints).
static int32_t *random_permutation(int n) {
    int32_t *perm = check_random_ints((size_t)n, 0, 1), *pick = check_random_ints((size_t)n, 0, 1 << 30);
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = pick[i] % (i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    return perm;
}

// rows_scatter then rows_gather with the same permutation: rows of `width` bytes (whole words
// or not) into token order and back out of it, compared bit for bit (as int32 words; the
// outputs start as −1 words, which no random word equals, so an unwritten byte shows).
static void check_rows_indexed(int rows, int width) {
    char name[96];
    snprintf(name, sizeof(name), "rows_scatter/rows_gather rows=%d width=%d bytes", rows, width);
    size_t words = ((size_t)rows * width + 3) / 4, whole = (size_t)rows * width / 4;
    int32_t *perm = random_permutation(rows), *d_perm = check_ints_to_device(perm, (size_t)rows);
    int32_t *src = check_random_ints(words, 0, 1 << 30), *ordered = check_random_ints(words, 0, 1 << 30);
    int32_t *back = check_random_ints(words, 0, 1 << 30);
    int32_t *d_ordered = check_device_unset_ints(words), *d_back = check_device_unset_ints(words);
    cpu()->rows_scatter(ordered, src, perm, rows, (size_t)width);
    under()->rows_scatter(d_ordered, check_ints_to_device(src, words), d_perm, rows, (size_t)width);
    cpu()->rows_gather(back, ordered, perm, rows, (size_t)width);
    under()->rows_gather(d_back, d_ordered, d_perm, rows, (size_t)width);
    check_compare_ints(name, "scattered", ordered, d_ordered, whole);  // the words every row byte covers
    check_compare_ints(name, "gathered", back, d_back, whole);
    check_compare_ints(name, "round trip", src, d_back, whole);
    check_free_all();
}

// batched_transpose of (batch, rows, cols), exact.
static void check_batched_transpose(int batch, int rows, int cols) {
    char name[96];
    snprintf(name, sizeof(name), "batched_transpose batch=%d rows=%d cols=%d", batch, rows, cols);
    size_t n = (size_t)batch * rows * cols;
    float *src = check_random(n, -1, 1), *dst = check_random(n, -1, 1), *d_dst = check_device_nan(n);
    cpu()->batched_transpose(dst, src, batch, rows, cols);
    under()->batched_transpose(d_dst, check_to_device(src, n), batch, rows, cols);
    check_compare(name, "dst", dst, d_dst, n, 0);
    check_free_all();
}

// heads_sum: the rotary-key part (columns off..off+width) of (rows, heads, pitch) summed over heads.
static void check_heads_sum(int rows, int heads, int pitch, int off, int width) {
    char name[96];
    snprintf(name, sizeof(name), "heads_sum rows=%d heads=%d pitch=%d width=%d", rows, heads, pitch, width);
    size_t src_n = (size_t)rows * heads * pitch, dst_n = (size_t)rows * width;
    float *src = check_random(src_n, -1, 1), *dst = check_random(dst_n, -1, 1), *d_dst = check_device_nan(dst_n);
    cpu()->heads_sum(dst, src + off, rows, heads, pitch, width);
    under()->heads_sum(d_dst, check_to_device(src, src_n) + off, rows, heads, pitch, width);
    check_compare(name, "dst", dst, d_dst, dst_n, 1e-6);
    check_free_all();
}

// lse_reset: every element −∞.
static void check_lse_reset(size_t n) {
    float *lse = check_random(n, -1, 1), *d_lse = check_device_nan(n);
    cpu()->lse_reset(lse, n);
    under()->lse_reset(d_lse, n);
    check_compare("lse_reset", "lse", lse, d_lse, n, 0);
    check_free_all();
}

void check_parallel_ops(void) {
    check_lse_reset(37);
    check_rows_copy_strided(3, 5, 7, 0);
    check_rows_copy_strided(2, 4, 1, 1);
    check_rows_indexed(37, 8);   // int32 pairs (k = 2)
    check_rows_indexed(11, 12);  // fp32 triples
    check_rows_indexed(9, 3);    // bytes
    check_batched_transpose(2, 4, 37);
    check_batched_transpose(3, 33, 5);
    check_heads_sum(5, 4, 20, 8, 12);
    check_heads_sum(3, 1, 8, 0, 8);
    // Past GRID_CAP elements: more than one element a thread of a full cuda grid (cuda_blocks
    // caps it at 65535·16 blocks of 256 for grid-stride loops; a kernel without the loop leaves
    // the tail unwritten). Device backends only: about 4 GB of host memory and seconds.
    enum { GRID_CAP = 65535 * 16 * 256 };
    if (check_backend() != &check_backend_cpu) {
        check_lse_reset((size_t)GRID_CAP + 4096);
        check_batched_transpose(1, 4097, 65520);        // 268,435,440 elements
        check_heads_sum(GRID_CAP / 64 + 2, 1, 64, 0, 64);  // 268,431,488
        check_rows_indexed(GRID_CAP / 4 + 64, 16);      // 268,431,616 words
    }
}

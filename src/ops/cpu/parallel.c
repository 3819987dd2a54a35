// parallel.c — cpu ops of ops_parallel.h (tensor/context-parallel gathers, slices, partial sums).
#include <math.h>
#include <string.h>

#include "ops/cpu/cpu_ops.h"

void cpu_rows_copy_strided(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width, int rows) {
    for (int r = 0; r < rows; r++) memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
}

void cpu_rows_gather(void *dst, const void *src, const int32_t *index, int rows, size_t width) {
    for (int i = 0; i < rows; i++) memcpy((char *)dst + i * width, (const char *)src + (size_t)index[i] * width, width);
}

void cpu_rows_scatter(void *dst, const void *src, const int32_t *index, int rows, size_t width) {
    for (int i = 0; i < rows; i++) memcpy((char *)dst + (size_t)index[i] * width, (const char *)src + i * width, width);
}

void cpu_lse_reset(real *lse, size_t n) {
    for (size_t j = 0; j < n; j++) lse[j] = -INFINITY;
}

void cpu_batched_transpose(real *dst, const real *src, int batch, int rows, int cols) {
    size_t plane = (size_t)rows * cols;
    for (int b = 0; b < batch; b++)
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) dst[b * plane + (size_t)c * rows + r] = src[b * plane + (size_t)r * cols + c];
}

void cpu_heads_sum(real *dst, const real *src, int rows, int heads, size_t head_pitch, int width) {
    for (int n = 0; n < rows; n++) {
        real *row = dst + (size_t)n * width;
        memset(row, 0, width * sizeof(real));
        for (int h = 0; h < heads; h++) {
            const real *x = src + ((size_t)n * heads + h) * head_pitch;
            for (int i = 0; i < width; i++) row[i] += x[i];
        }
    }
}

// row_reduce.h — max and sum of a row in LANES interleaved partial results, combined in
// a fixed order: the compiler vectorizes them (a plain running sum or max is one serial
// chain it may not reorder), and the result depends only on the row, not on threads.
#pragma once
#include <string.h>

#include "core/common.h"

enum { ROW_LANES = 8 };

// The lanes of row_max: ROW_MAX_VECTORS vectors of ROW_LANES reals.
typedef real row_vec __attribute__((vector_size(ROW_LANES * sizeof(real))));
enum { ROW_MAX_VECTORS = 4 };

// The largest element (n >= 1), each element taken as `x > max ? x : max` from max = x[0]: a
// NaN past the first element is passed over, a NaN first is the result; the scalar loop's
// value (of +0 and -0 tied, the one the fixed order of the lanes meets first).
static inline real row_max(const real *x, int n) {
    enum { STRIDE = ROW_MAX_VECTORS * ROW_LANES };
    real first[ROW_LANES];
    for (int l = 0; l < ROW_LANES; l++) first[l] = x[0];
    row_vec part[ROW_MAX_VECTORS];
    for (int v = 0; v < ROW_MAX_VECTORS; v++) memcpy(&part[v], first, sizeof part[v]);
    int i = 0;
    for (; i + STRIDE <= n; i += STRIDE)
        for (int v = 0; v < ROW_MAX_VECTORS; v++) {
            row_vec xv;
            memcpy(&xv, x + i + v * ROW_LANES, sizeof xv);
            // the scalar `x > m ? x : m` on every lane (the compiler leaves that ternary scalar
            // without -ffinite-math-only): a compare and a blend; kept inline, as a function
            // taking vectors would have an ABI of its own on CPUs without wide registers
            __typeof__(xv > part[v]) greater = xv > part[v];
            part[v] = (row_vec)((greater & (__typeof__(greater))xv) | (~greater & (__typeof__(greater))part[v]));
        }
    real mx = x[0];
    for (int v = 0; v < ROW_MAX_VECTORS; v++)
        for (int l = 0; l < ROW_LANES; l++) mx = part[v][l] > mx ? part[v][l] : mx;
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

// Σ x, accumulated in double
static inline double row_sum(const real *x, int n) {
    double part[ROW_LANES] = {0};
    int i = 0;
    for (; i + ROW_LANES <= n; i += ROW_LANES)
        for (int l = 0; l < ROW_LANES; l++) part[l] += x[i + l];
    double sum = 0;
    for (int l = 0; l < ROW_LANES; l++) sum += part[l];
    for (; i < n; i++) sum += x[i];
    return sum;
}

// Σ x·y, accumulated in double
static inline double row_dot(const real *x, const real *y, int n) {
    double part[ROW_LANES] = {0};
    int i = 0;
    for (; i + ROW_LANES <= n; i += ROW_LANES)
        for (int l = 0; l < ROW_LANES; l++) part[l] += (double)x[i + l] * y[i + l];
    double sum = 0;
    for (int l = 0; l < ROW_LANES; l++) sum += part[l];
    for (; i < n; i++) sum += (double)x[i] * y[i];
    return sum;
}

// Σ x·y·z, accumulated in double (each product ((double)x·y)·z)
static inline double row_dot3(const real *x, const real *y, const real *z, int n) {
    double part[ROW_LANES] = {0};
    int i = 0;
    for (; i + ROW_LANES <= n; i += ROW_LANES)
        for (int l = 0; l < ROW_LANES; l++) part[l] += (double)x[i + l] * y[i + l] * z[i + l];
    double sum = 0;
    for (int l = 0; l < ROW_LANES; l++) sum += part[l];
    for (; i < n; i++) sum += (double)x[i] * y[i] * z[i];
    return sum;
}

// Σ e^(x − shift), accumulated in double. The exponentials of ROW_EXP_BLOCK elements at a
// time first (a loop of reals alone vectorizes at the register's full width), then added to
// the lanes in the same order as one element at a time.
enum { ROW_EXP_BLOCK = 8 * ROW_LANES };
static inline double row_sum_exp(const real *x, int n, real shift) {
    double part[ROW_LANES] = {0};
    int i = 0;
    for (; i + ROW_EXP_BLOCK <= n; i += ROW_EXP_BLOCK) {
        real e[ROW_EXP_BLOCK];
        for (int j = 0; j < ROW_EXP_BLOCK; j++) e[j] = real_exp(x[i + j] - shift);
        for (int j = 0; j < ROW_EXP_BLOCK; j += ROW_LANES)
            for (int l = 0; l < ROW_LANES; l++) part[l] += e[j + l];
    }
    for (; i + ROW_LANES <= n; i += ROW_LANES)
        for (int l = 0; l < ROW_LANES; l++) part[l] += real_exp(x[i + l] - shift);
    double sum = 0;
    for (int l = 0; l < ROW_LANES; l++) sum += part[l];
    for (; i < n; i++) sum += real_exp(x[i] - shift);
    return sum;
}

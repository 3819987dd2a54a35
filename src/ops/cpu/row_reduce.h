// row_reduce.h — max and sum of a row in LANES interleaved partial results, combined in
// a fixed order: the compiler vectorizes them (a plain running sum or max is one serial
// chain it may not reorder), and the result depends only on the row, not on threads.
#pragma once
#include "core/common.h"

enum { ROW_LANES = 8 };

static inline real row_max(const real *x, int n) {
    real part[ROW_LANES];
    for (int l = 0; l < ROW_LANES; l++) part[l] = x[0];
    int i = 0;
    for (; i + ROW_LANES <= n; i += ROW_LANES)
        for (int l = 0; l < ROW_LANES; l++) part[l] = x[i + l] > part[l] ? x[i + l] : part[l];
    real mx = part[0];
    for (int l = 1; l < ROW_LANES; l++) mx = part[l] > mx ? part[l] : mx;
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

// Σ e^(x − shift), accumulated in double
static inline double row_sum_exp(const real *x, int n, real shift) {
    double part[ROW_LANES] = {0};
    int i = 0;
    for (; i + ROW_LANES <= n; i += ROW_LANES)
        for (int l = 0; l < ROW_LANES; l++) part[l] += real_exp(x[i + l] - shift);
    double sum = 0;
    for (int l = 0; l < ROW_LANES; l++) sum += part[l];
    for (; i < n; i++) sum += real_exp(x[i] - shift);
    return sum;
}

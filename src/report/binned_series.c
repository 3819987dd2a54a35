// binned_series.c — see binned_series.h.
#include "report/binned_series.h"

#include <math.h>
#include <string.h>

#include "core/common.h"

void binned_init(BinnedSeries *s, int dims, int max_columns) {
    MT_ASSERT(dims > 0 && max_columns >= 2 && max_columns % 2 == 0);
    memset(s, 0, sizeof(*s));
    s->dims = dims;
    s->max_columns = max_columns;
    s->width = 1;
    s->step_first = mt_calloc((size_t)max_columns, sizeof(double));
    s->step_last = mt_calloc((size_t)max_columns, sizeof(double));
    s->sums = mt_calloc((size_t)max_columns * (size_t)dims, sizeof(double));
    s->counts = mt_calloc((size_t)max_columns * (size_t)dims, sizeof(int));
}

void binned_free(BinnedSeries *s) {
    free(s->step_first);
    free(s->step_last);
    free(s->sums);
    free(s->counts);
    memset(s, 0, sizeof(*s));
}

// Columns 2c and 2c+1 become column c, for every pair; each column then spans twice the points.
static void merge_pairs(BinnedSeries *s) {
    size_t dims = (size_t)s->dims;
    for (int c = 0; c < s->columns / 2; c++) {
        int a = 2 * c, b = 2 * c + 1;
        s->step_first[c] = s->step_first[a];
        s->step_last[c] = s->step_last[b];
        for (size_t d = 0; d < dims; d++) {
            s->sums[c * dims + d] = s->sums[a * dims + d] + s->sums[b * dims + d];
            s->counts[c * dims + d] = s->counts[a * dims + d] + s->counts[b * dims + d];
        }
    }
    s->columns /= 2;
    memset(s->sums + (size_t)s->columns * dims, 0, (size_t)s->columns * dims * sizeof(double));
    memset(s->counts + (size_t)s->columns * dims, 0, (size_t)s->columns * dims * sizeof(int));
    s->width *= 2;
}

void binned_add(BinnedSeries *s, double step, const double *values) {
    long column = s->points / s->width;
    if (column == s->max_columns) {  // full: every column is whole, so pairs merge evenly
        merge_pairs(s);
        column = s->points / s->width;
    }
    if (column == s->columns) {  // the first point of a new column
        s->columns++;
        s->step_first[column] = step;
    }
    s->step_last[column] = step;
    size_t at = (size_t)column * (size_t)s->dims;
    for (int d = 0; d < s->dims; d++) {
        if (!isfinite(values[d])) continue;
        s->sums[at + d] += values[d];
        s->counts[at + d]++;
    }
    s->points++;
}

double binned_mean(const BinnedSeries *s, int c, int d) {
    size_t at = (size_t)c * (size_t)s->dims + (size_t)d;
    return s->counts[at] ? s->sums[at] / s->counts[at] : NAN;
}

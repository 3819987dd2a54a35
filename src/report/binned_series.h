// binned_series.h — a series of points (a step and one or more values) held in at most
// max_columns columns however many points arrive: once the columns are full, neighbouring
// pairs merge and every later column takes twice as many points. A column's value is the
// mean of its points' finite values, so a plot of a long run keeps its shape in bounded
// memory, and a short run (fewer points than columns) keeps every point as it is.
#pragma once

typedef struct {
    int dims;            // values per point (1: a line; E: a MoE layer's tokens per expert)
    int max_columns;     // an even number of columns at most
    int columns;         // columns in use (the last may hold fewer than width points)
    long width;          // points per column (a power of two)
    long points;         // points added
    double *step_first;  // [max_columns] the first and last step of each column's points
    double *step_last;
    double *sums;        // [max_columns * dims] each column's sum of finite values, per dimension
    int *counts;         // [max_columns * dims] how many finite values each sum holds
} BinnedSeries;

void binned_init(BinnedSeries *s, int dims, int max_columns);
void binned_free(BinnedSeries *s);
// Adds the point (step, values[0..dims)); NaN and infinite values are left out of the means.
void binned_add(BinnedSeries *s, double step, const double *values);
// The mean of dimension d over column c's finite values; NaN when it has none.
double binned_mean(const BinnedSeries *s, int c, int d);

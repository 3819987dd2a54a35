// run_log.h — a --log-jsonl file read for `moetron report` (docs/metrics.md, "moetron
// report"). Every numeric key of its step and evaluation records becomes a binned series
// (binned_series.h); an array of numbers (a MoE layer's tokens_per_expert) becomes a series
// of that many values per point. Scalar series also keep the exact values the summary
// shows: the last, the largest, the mean.
//
// A last line without its newline that does not parse is a record the run is still writing:
// it is left out (cut_short). Any other line that is not a JSON object with an integer
// "step" is fatal: one line naming the file and the line.
#pragma once
#include "report/binned_series.h"

#define RUN_LOG_LINE_COLUMNS 1024   // at most this many points per line-chart series
#define RUN_LOG_ARRAY_COLUMNS 256   // at most this many columns per heatmap (array series)

typedef struct {
    char *key;           // the JSONL key: "loss", "eval_loss", "moe/layer_1/tokens_per_expert"
    int is_array;        // values came as arrays of bins.dims numbers
    BinnedSeries bins;
    // scalar series only (NaN until a finite value arrives):
    double first;        // the first finite value
    double last;         // the latest finite value, at step last_step
    double last_step;
    double max;          // the largest finite value, first reached at step max_step
    double max_step;
    double sum;          // the finite values' sum, and their count
    long finite;
} LogSeries;

typedef struct {
    char *path;
    long step_records;   // records with training metrics
    long eval_records;   // records with "eval_loss"
    long first_step, last_step;  // of the step records (0 without any)
    int cut_short;       // the last line, cut short by a run still writing it, was left out
    LogSeries *series;   // in the order their keys first appeared
    int count, capacity;
} RunLog;

// Reads path whole (fatal with one line on a missing or damaged file).
void run_log_read(RunLog *log, const char *path);
void run_log_free(RunLog *log);
// The series of a key, or NULL when no record had it.
const LogSeries *run_log_find(const RunLog *log, const char *key);

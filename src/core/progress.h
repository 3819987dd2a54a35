// progress.h — a progress line with an ETA for a long operation (prepare's passes, building
// a sample index, saving and loading a checkpoint, evaluation), on stdout (of the rank that reports):
//
//   prepare      512.0 / 2048.0 MB  25% |   85.3 MB/s | ETA 18s
//
// On a terminal the line is redrawn in place (at most PROGRESS_REDRAW_HZ times a second);
// otherwise one line is printed as each quarter (25, 50, 75 %) is passed, and a last one
// with the time taken. An operation that is usually quick (PROGRESS_WHEN_SLOW) says nothing
// unless it is still running after PROGRESS_QUIET_S seconds. MOETRON_PROGRESS=always makes
// every operation report (what the tests use: the lines then follow the work, not the
// clock), MOETRON_PROGRESS=never silences them all.
#pragma once
#include <stddef.h>

typedef enum { PROGRESS_ALWAYS, PROGRESS_WHEN_SLOW } ProgressPolicy;

#define BYTES_PER_MB 1e6

typedef struct {
    const char *what, *unit;  // "prepare", "MB"
    double total, scale;      // total, in raw units; shown as raw / scale unit
    double done, start_s, drawn_s;
    int tty, quarters, shown;  // quarters passed; whether a line was printed
    ProgressPolicy policy;
} Progress;

// "13s", "4m05s", "2h03m"
void format_duration(char *out, size_t cap, double seconds);

void progress_begin(Progress *p, const char *what, const char *unit, double scale, double total,
                    ProgressPolicy policy);
// done of total raw units are complete.
void progress_update(Progress *p, double done);
// The operation ended: the last line (with the time taken) when any was shown.
void progress_end(Progress *p);

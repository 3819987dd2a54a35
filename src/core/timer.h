// timer.h — wall-clock seconds from a monotonic clock.
#pragma once
#include <time.h>

static inline double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Seconds since the Unix epoch (the calendar clock: it may step), for time stamps in files.
static inline double unix_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * ts.tv_nsec;
}

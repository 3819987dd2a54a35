// op_profile.c — calls and time per op (op_profile.h).
#include "ops/op_profile.h"

#include <stdio.h>

#include "core/profile.h"
#include "core/timer.h"
#include "ops/backend.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static double g_seconds[OPS_COUNT];
static long g_calls[OPS_COUNT];

enum { NOT_RECORDED = -1, WALL_CLOCK = -2 };

// Ops timed by queue marks whose seconds are not known yet.
enum { PENDING_MAX = 4096 };
static struct {
    OpId op[PENDING_MAX];
    int from[PENDING_MAX], to[PENDING_MAX];
    int count;
} g_pending;

static const BackendTimer *queue_timer(void) { return ops_active()->timer; }

// Adds the pending ops' seconds (waiting for the last of their marks) and frees the marks.
static void resolve_pending(void) {
    const BackendTimer *t = queue_timer();
    if (!t) return;
    for (int i = 0; i < g_pending.count; i++) g_seconds[g_pending.op[i]] += t->seconds(g_pending.from[i], g_pending.to[i]);
    g_pending.count = 0;
    t->reset();
}

OpStamp op_profile_start(void) {
    OpStamp none = {.seconds = 0, .mark = NOT_RECORDED};
    if (!prof_enabled()) return none;
#ifdef _OPENMP
    if (omp_in_parallel()) return none;
#endif
    const BackendTimer *t = queue_timer();
    if (!t) return (OpStamp){.seconds = now_seconds(), .mark = WALL_CLOCK};
    int mark = t->mark();
    if (mark < 0) {  // every mark in use: settle them and start again
        resolve_pending();
        mark = t->mark();
    }
    return (OpStamp){.seconds = 0, .mark = mark < 0 ? NOT_RECORDED : mark};
}

void op_profile_stop(OpId op, OpStamp started) {
    if (started.mark == NOT_RECORDED) return;
    g_calls[op]++;
    if (started.mark == WALL_CLOCK) {
        g_seconds[op] += now_seconds() - started.seconds;
        return;
    }
    int end = queue_timer()->mark();
    if (end < 0 || g_pending.count == PENDING_MAX) {
        g_calls[op]--;  // no room to time it: left out rather than guessed
        resolve_pending();
        return;
    }
    g_pending.op[g_pending.count] = op;
    g_pending.from[g_pending.count] = started.mark;
    g_pending.to[g_pending.count++] = end;
}

void op_profile_reset(void) {
    resolve_pending();
    for (int op = 0; op < OPS_COUNT; op++) {
        g_seconds[op] = 0;
        g_calls[op] = 0;
    }
}

void op_profile_print(double total_s) {
    resolve_pending();
    int order[OPS_COUNT], n = 0;
    for (int op = 0; op < OPS_COUNT; op++)
        if (g_calls[op] > 0) order[n++] = op;
    for (int i = 1; i < n; i++)  // insertion sort, most time first
        for (int j = i; j > 0 && g_seconds[order[j]] > g_seconds[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    double share = total_s > 0 ? 100 / total_s : 0;
    printf("  per op:%*s calls  seconds  share  us/call\n", 16, "");
    for (int i = 0; i < n; i++) {
        int op = order[i];
        printf("  %-22s %7ld %8.3f %5.1f%% %8.1f\n", op_name(op), g_calls[op], g_seconds[op], g_seconds[op] * share,
               1e6 * g_seconds[op] / g_calls[op]);
    }
}

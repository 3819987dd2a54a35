// op_profile.c — calls and time per op (op_profile.h).
#include "ops/op_profile.h"

#include <stdio.h>

#include "core/profile.h"
#include "core/timer.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static double g_seconds[OPS_COUNT];
static long g_calls[OPS_COUNT];

double op_profile_start(void) {
    if (!prof_enabled()) return -1;
#ifdef _OPENMP
    if (omp_in_parallel()) return -1;
#endif
    return now_seconds();
}

void op_profile_stop(OpId op, double started) {
    if (started < 0) return;
    g_seconds[op] += now_seconds() - started;
    g_calls[op]++;
}

void op_profile_reset(void) {
    for (int op = 0; op < OPS_COUNT; op++) {
        g_seconds[op] = 0;
        g_calls[op] = 0;
    }
}

void op_profile_print(double total_s) {
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

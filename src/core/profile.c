#include "core/profile.h"

#include <stdio.h>

#include "core/timer.h"
#ifdef _OPENMP
#include <omp.h>
#endif

enum { MAX_DEPTH = 16 };

static int g_enabled;
static double g_seconds[PROF_KINDS];
static int g_stack[MAX_DEPTH];  // open kinds, innermost last
static int g_depth;
static double g_since;          // when the innermost open kind last started to be charged

static const char *const KIND_NAMES[PROF_KINDS] = {
    "gemm", "attention", "norm", "rope", "activation", "router", "dispatch",
    "embedding", "loss", "optimizer", "grad_sync", "expert_comm", "data_wait"};

void prof_enable(int on) { g_enabled = on; }
int prof_enabled(void) { return g_enabled; }

static int recording(void) {
#ifdef _OPENMP
    if (omp_in_parallel()) return 0;
#endif
    return g_enabled;
}

// Charge the time since g_since to the innermost open kind.
static void charge(double now) {
    if (g_depth > 0) g_seconds[g_stack[g_depth - 1]] += now - g_since;
    g_since = now;
}

ProfScope prof_scope_begin(ProfKind kind) {
    if (!recording() || g_depth == MAX_DEPTH) return (ProfScope){-1};
    charge(now_seconds());
    g_stack[g_depth++] = kind;
    return (ProfScope){kind};
}

void prof_scope_end(ProfScope *scope) {
    if (scope->kind < 0) return;
    charge(now_seconds());
    g_depth--;
}

void prof_seconds(double out[PROF_KINDS]) {
    for (int k = 0; k < PROF_KINDS; k++) out[k] = g_seconds[k];
}

void prof_reset(void) {
    for (int k = 0; k < PROF_KINDS; k++) g_seconds[k] = 0;
}

const char *prof_kind_name(ProfKind kind) { return KIND_NAMES[kind]; }

void prof_print(double total_s) {
    int order[PROF_KINDS], n = 0;
    double claimed = 0;
    for (int k = 0; k < PROF_KINDS; k++) {
        claimed += g_seconds[k];
        if (g_seconds[k] > 0) order[n++] = k;
    }
    for (int i = 1; i < n; i++)  // insertion sort, largest first
        for (int j = i; j > 0 && g_seconds[order[j]] > g_seconds[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    double share = total_s > 0 ? 100 / total_s : 0;
    for (int i = 0; i < n; i++)
        printf("  %-12s %9.3f s  %5.1f%%\n", KIND_NAMES[order[i]], g_seconds[order[i]], g_seconds[order[i]] * share);
    double other = total_s > claimed ? total_s - claimed : 0;
    printf("  %-12s %9.3f s  %5.1f%%\n", "other", other, other * share);
}

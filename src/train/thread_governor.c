#include "train/thread_governor.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum {
    WARM_UP_STEPS = 2,         // not timed: allocation and first touches
    FIRST_PROBE_INTERVAL = 4,  // steps between probes after a change
    LONGEST_PROBE_INTERVAL = 64,
};
static const double FASTER = 0.9;   // a probe this much faster than the current count wins
static const double CHANGED = 0.3;  // a step this much off the current median: the machine changed

static void set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

void thread_governor_init(ThreadGovernor *g, int enabled) {
    memset(g, 0, sizeof(*g));
#ifdef _OPENMP
    g->max_threads = omp_get_max_threads();
#else
    g->max_threads = 1;
#endif
    g->enabled = enabled && g->max_threads > 1;
    g->threads = g->max_threads;
    g->probe_down = 1;
    g->probe_interval = FIRST_PROBE_INTERVAL;
    g->next_probe = WARM_UP_STEPS + GOVERNOR_HISTORY;
}

static double median_of_history(const ThreadGovernor *g) {
    double v[GOVERNOR_HISTORY];
    memcpy(v, g->history, sizeof(v));
    for (int i = 1; i < g->n_history; i++)  // insertion sort of at most GOVERNOR_HISTORY values
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[g->n_history / 2];
}

static void remember(ThreadGovernor *g, double seconds) {
    if (g->n_history == GOVERNOR_HISTORY) memmove(g->history, g->history + 1, sizeof(double) * (GOVERNOR_HISTORY - 1));
    else g->n_history++;
    g->history[g->n_history - 1] = seconds;
}

// The count a probe tries: a thread fewer or more, alternating where both exist.
static int probe_count(ThreadGovernor *g) {
    int down = g->threads > 1 && (g->probe_down || g->threads == g->max_threads);
    g->probe_down = !down;
    return down ? g->threads - 1 : g->threads + 1;
}

void thread_governor_before_step(ThreadGovernor *g) {
    if (!g->enabled) return;
    g->probe_threads = 0;
    if (g->steps_seen >= g->next_probe && g->n_history > 0) g->probe_threads = probe_count(g);
    set_threads(g->probe_threads ? g->probe_threads : g->threads);
}

void thread_governor_after_step(ThreadGovernor *g, double seconds) {
    if (!g->enabled) return;
    long step = ++g->steps_seen;
    if (step <= WARM_UP_STEPS) return;
    if (g->probe_threads) {
        int faster = seconds < FASTER * median_of_history(g);
        if (faster) {  // the probe's count from now on
            g->threads = g->probe_threads;
            g->n_history = 0;
            g->probe_interval = FIRST_PROBE_INTERVAL;
            remember(g, seconds);
        } else if (g->probe_interval < LONGEST_PROBE_INTERVAL) {
            g->probe_interval *= 2;
        }
        g->next_probe = step + g->probe_interval;
        g->probe_threads = 0;
        return;
    }
    if (g->n_history == GOVERNOR_HISTORY) {
        double median = median_of_history(g);
        if (seconds > (1 + CHANGED) * median || seconds < (1 - CHANGED) * median) {
            g->probe_interval = FIRST_PROBE_INTERVAL;  // probe soon, once the new speed is known
            if (g->next_probe > step + GOVERNOR_HISTORY) g->next_probe = step + GOVERNOR_HISTORY;
            g->n_history = 0;
        }
    }
    remember(g, seconds);
}

int thread_governor_step_threads(const ThreadGovernor *g) {
    return g->probe_threads ? g->probe_threads : g->threads;
}

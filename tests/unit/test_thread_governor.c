// test_thread_governor.c — the thread governor (src/train/thread_governor.c) driven with
// step times from a model of the machine, never a clock: on two cores a step takes 1 s
// with two threads and 1.9 s with one while the machine is quiet; beside a competing
// process, 4 s with two threads and 2 s with one.
#include "train/thread_governor.h"
#include "testlib.h"

typedef struct {
    int busy;
} Machine;

static double step_seconds(const Machine *m, int threads) {
    if (m->busy) return threads == 2 ? 4.0 : 2.0;
    return threads == 2 ? 1.0 : 1.9;
}

// Runs `steps` steps; returns how many of them used one thread.
static int run_steps(ThreadGovernor *g, const Machine *m, int steps, int *last_threads) {
    int one = 0;
    for (int i = 0; i < steps; i++) {
        thread_governor_before_step(g);
        int threads = thread_governor_step_threads(g);
        one += threads == 1;
        thread_governor_after_step(g, step_seconds(m, threads));
        *last_threads = threads;
    }
    return one;
}

static ThreadGovernor two_threads(void) {
    ThreadGovernor g;
    thread_governor_init(&g, 1);
    g.max_threads = g.threads = 2;  // the model machine, whatever this one has
    g.enabled = 1;
    return g;
}

static void test_quiet_machine_keeps_every_thread(void) {
    ThreadGovernor g = two_threads();
    Machine m = {0};
    int last, probes = run_steps(&g, &m, 1000, &last);
    CHECK(last == 2 && g.threads == 2, "quiet: %d threads", g.threads);
    CHECK(probes >= 3 && probes <= 25, "%d one-thread probe steps in 1000 (a few, ever rarer)", probes);
}

static void test_busy_machine_moves_to_one_thread_and_back(void) {
    ThreadGovernor g = two_threads();
    Machine m = {0};
    int last;
    run_steps(&g, &m, 50, &last);
    m.busy = 1;
    run_steps(&g, &m, 20, &last);
    CHECK(g.threads == 1, "busy: still %d threads 20 steps after the machine got busy", g.threads);
    int one = run_steps(&g, &m, 200, &last);
    CHECK(one >= 190, "busy: only %d of 200 steps with one thread", one);
    m.busy = 0;
    run_steps(&g, &m, 80, &last);
    CHECK(g.threads == 2, "quiet again: %d threads 80 steps later", g.threads);
}

static void test_disabled_never_changes(void) {
    ThreadGovernor g = two_threads();
    g.enabled = 0;
    Machine m = {1};
    int last, one = run_steps(&g, &m, 100, &last);
    CHECK(one == 0 && g.threads == 2, "--no-adapt-threads: %d one-thread steps", one);
}

int main(void) {
    RUN(test_quiet_machine_keeps_every_thread);
    RUN(test_busy_machine_moves_to_one_thread_and_back);
    RUN(test_disabled_never_changes);
    return tl_failed_cases != 0;
}

// thread_governor.h — how many OpenMP threads the training steps use, adapted to a machine
// that other programs share (--adapt-threads, on by default).
//
// With every core busy computing, a step runs fastest with all of OpenMP's threads. When
// another program competes for the cores, the scheduler keeps descheduling one of them and
// every parallel region waits for it: with one busy process on two cores, one thread ran
// the default model 2x faster than two (bench/RESULTS.md, "A busy machine"). The governor
// times the steps and now and then runs one step with a thread fewer or more (a probe);
// a probe clearly faster than the steps before it becomes the new thread count. A step
// much slower or faster than those before it (the machine changed) brings the next probe
// forward; probes that confirm the count grow further apart, so a quiet machine pays
// about one slower step in sixty-four.
//
// Results do not depend on it: every op gives the same bits for any thread count
// (docs/architecture.md, "Determinism").
#pragma once

#define GOVERNOR_HISTORY 3  // steps at the current count whose median is its time per step

typedef struct {
    int enabled;
    int max_threads;        // OpenMP's team size at start (OMP_NUM_THREADS or the cores)
    int threads;            // the count the steps use
    int probe_threads;      // the count of the step under way when it is a probe, else 0
    int probe_down;         // the direction of the next probe: a thread fewer (1) or more (0)
    long steps_seen;        // steps timed so far (the first ones are warm-up)
    long next_probe;        // the step count at which the next probe runs
    long probe_interval;    // steps from one probe to the next, doubled when a probe confirms
    double history[GOVERNOR_HISTORY];  // the last step times at `threads`
    int n_history;
} ThreadGovernor;

void thread_governor_init(ThreadGovernor *g, int enabled);
// Sets the thread count for the step about to run (a probe or the current count).
void thread_governor_before_step(ThreadGovernor *g);
// The threads of the step under way (before thread_governor_after_step).
int thread_governor_step_threads(const ThreadGovernor *g);
// The step took `seconds` of wall time (its compute and communication, without evaluation
// or saving).
void thread_governor_after_step(ThreadGovernor *g, double seconds);

// thread_env.c — OpenMP's defaults for a machine that other programs share.
//
// By default OpenMP's idle threads spin at every barrier, waiting for the slowest thread.
// On a machine where another process competes for the cores, the slowest thread is often
// descheduled, and the spinning ones burn the time it needs: throughput fell tenfold and
// erratically with one busy process on two cores. Waiting threads that sleep instead
// (OMP_WAIT_POLICY=passive) give their core to the thread the barrier waits for; on a quiet
// machine the cost is a wake-up per parallel region (bench/RESULTS.md, "A busy machine").
//
// The OpenMP runtime reads its environment once, as it is loaded, before main() runs; the
// executable's pre-initialisers run earlier still, so the default is set there. A value the
// user set (OMP_WAIT_POLICY=active for a dedicated machine) is kept.
#include <stdlib.h>

static void default_omp_wait_policy(int argc, char **argv, char **envp) {
    (void)argc, (void)argv, (void)envp;
    setenv("OMP_WAIT_POLICY", "passive", 0);
}

__attribute__((used, section(".preinit_array"))) static void (*const run_before_libraries)(int, char **,
                                                                                           char **) =
    default_omp_wait_policy;

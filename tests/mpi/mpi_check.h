// mpi_check.h — the checks of the multi-process test programs (tests/mpi/*.c, included
// once by each): begin a named check, expect conditions on this rank, end it collectively.
// Rank 0 prints "ok <check>_np<P>" when no rank failed; a failing rank prints
// "FAIL <check>_np<P>: [rank r] why" for its first failure of the check.
#pragma once
#include <stdarg.h>
#include <stdio.h>

#include "parallel/comm.h"
#include "../unit/mix64.h"  // mix64: values every rank can compute for every index

static Comm world;               // set by the program's main (comm_world())
static const char *check_name;
static int check_failures;       // on this rank, in the check running
static int failed_checks;        // on any rank, so far

static void begin(const char *name) {
    check_name = name;
    check_failures = 0;
}

static void expect(int ok, const char *fmt, ...) {
    if (ok) return;
    if (check_failures++ == 0) {
        char why[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        printf("FAIL %s_np%d: [rank %d] %s\n", check_name, world.size, world.rank, why);
        fflush(stdout);
    }
}

// Collective over the world: 1 when no rank failed the check.
static int end(void) {
    int64_t failures = check_failures;
    comm_allreduce_sum_int64(&world, &failures, 1);
    if (world.rank == 0 && failures == 0) printf("ok %s_np%d\n", check_name, world.size);
    fflush(stdout);
    failed_checks += failures > 0;
    return failures == 0;
}

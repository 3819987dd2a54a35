// testlib.h — the unit-test harness: each test file is its own program whose
// main() calls RUN(test_fn) for every case. A case prints "ok <name>" or
// "FAIL <name>: <why>"; tests/run.sh counts those lines across all programs.
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int tl_failed_cases = 0;
static int tl_case_failed = 0;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            if (!tl_case_failed) printf("FAIL ");                                \
            else printf("     ");                                                \
            printf("%s:%d: ", __FILE__, __LINE__);                               \
            printf(__VA_ARGS__);                                                 \
            printf("\n");                                                        \
            tl_case_failed = 1;                                                  \
        }                                                                        \
    } while (0)

// |a - b| <= atol + rtol * |b|
#define CHECK_CLOSE(a, b, atol, rtol, what)                                      \
    do {                                                                         \
        double tl_a = (double)(a), tl_b = (double)(b);                           \
        CHECK(fabs(tl_a - tl_b) <= (atol) + (rtol) * fabs(tl_b) && !isnan(tl_a), \
              "%s: got %.9g expected %.9g", (what), tl_a, tl_b);                 \
    } while (0)

#define RUN(fn)                                                                  \
    do {                                                                         \
        tl_case_failed = 0;                                                      \
        fn();                                                                    \
        if (tl_case_failed) tl_failed_cases++;                                   \
        else printf("ok %s\n", #fn);                                             \
        fflush(stdout);                                                          \
    } while (0)

#define TESTS_DONE() return tl_failed_cases ? 1 : 0

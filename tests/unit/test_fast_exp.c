// test_fast_exp.c — the vectorizable e^x of the float build (core/fast_exp.h) against
// libm's double exp: relative error, the clamped ends, exact values, and the row
// reductions built on it (ops/cpu/row_reduce.h).
#include <math.h>

#include "core/fast_exp.h"
#include "ops/cpu/row_reduce.h"
#include "testlib.h"

static void test_relative_error(void) {
    double worst = 0, worst_x = 0;
    for (int i = 0; i <= 4000000; i++) {  // every ~44e-6 over the whole unclamped range
        float x = (float)(-87.3 + 175.6 * i / 4000000.0);
        double err = fabs(fast_expf(x) - exp((double)x)) / exp((double)x);
        if (err > worst) worst = err, worst_x = x;
    }
    CHECK(worst < 3e-7, "relative error %.3g at x = %.9g (documented bound 3e-7)", worst, worst_x);
}

static void test_exact_points_and_ends(void) {
    CHECK(fast_expf(0.0f) == 1.0f, "e^0 = %.9g", (double)fast_expf(0.0f));
    CHECK_CLOSE(fast_expf(1.0f), M_E, 0, 3e-7, "e^1");
    float tiny = fast_expf(-1000.0f), huge = fast_expf(1000.0f);
    CHECK(tiny > 0 && tiny < 1.3e-38f, "e^-1000 clamps to the smallest normal, got %g", (double)tiny);
    CHECK(isfinite(huge) && huge > 2e38f, "e^1000 clamps to e^88.3, got %g", (double)huge);
    CHECK(fast_expf(-INFINITY) == tiny, "e^-inf clamps like a large negative input");
}

static void test_row_reductions(void) {
    enum { n = 37 };  // four full groups of lanes and a remainder
    real x[n], y[n];
    double sum = 0, dot = 0, sum_exp = 0;
    real mx = -1e30f;
    for (int i = 0; i < n; i++) {
        x[i] = (real)sin(0.7 * i) * 3;
        y[i] = (real)cos(0.3 * i);
        sum += x[i], dot += (double)x[i] * y[i];
        mx = x[i] > mx ? x[i] : mx;
    }
    for (int i = 0; i < n; i++) sum_exp += exp((double)x[i] - mx);
    CHECK(row_max(x, n) == mx, "row_max %.9g vs %.9g", (double)row_max(x, n), (double)mx);
    CHECK_CLOSE(row_sum(x, n), sum, 1e-12, 1e-12, "row_sum");
    CHECK_CLOSE(row_dot(x, y, n), dot, 1e-12, 1e-12, "row_dot");
    CHECK_CLOSE(row_sum_exp(x, n, mx), sum_exp, 0, 1e-6, "row_sum_exp");
    CHECK(row_max(x + 3, 5) == row_max(x + 3, 5) && row_sum(x, 0) == 0, "short rows");
}

// row_max equals the scalar loop `x > max ? x : max` from max = x[0] whatever the length (the
// vector lanes and the remainder) and wherever the largest element, a NaN (first: the result;
// later: passed over), a zero or an infinity lies. (Between +0 and -0, equal, which one comes
// back follows the lanes: either.)
static void test_row_max_is_the_scalar_loop(void) {
    enum { LONGEST = 100 };
    const real specials[] = {NAN, -0.0f, 0.0f, INFINITY, -INFINITY, 7.5f};
    real x[LONGEST];
    int cases = 0;
    for (int n = 1; n <= LONGEST; n++)
        for (int at = 0; at < n; at += 1 + n / 9)
            for (size_t k = 0; k < 2 * sizeof specials / sizeof specials[0]; k++) {
                int negative = k % 2;  // every other row below zero, so that a zero is its largest
                real special = specials[k / 2];
                for (int i = 0; i < n; i++) x[i] = negative ? -1 - (real)fabs(sin(1.3 * i + n)) : (real)sin(1.3 * i + n) * 2;
                x[at] = special;
                if (special == 0) x[(at + 1 + n / 3) % n] = -special;  // both zeros: which one is kept
                real want = x[0];
                for (int i = 1; i < n; i++) want = x[i] > want ? x[i] : want;
                real got = row_max(x, n);
                CHECK(got == want || (isnan(got) && isnan(want)), "n %d, case %zu at %d: %g, the loop %g", n, k,
                      at, (double)got, (double)want);
                cases++;
            }
    CHECK(cases > 1000, "only %d cases", cases);
}

// row_dot3 sums ((double)x·y)·z over the row.
static void test_row_dot3(void) {
    enum { n = 45 };
    real x[n], y[n], z[n];
    double want = 0;
    for (int i = 0; i < n; i++) {
        x[i] = (real)sin(0.9 * i), y[i] = (real)cos(0.4 * i), z[i] = (real)(i % 7) - 3;
        want += (double)x[i] * y[i] * z[i];
    }
    CHECK_CLOSE(row_dot3(x, y, z, n), want, 1e-12, 1e-12, "row_dot3");
}

// row_sum_exp adds e^(x - shift) to its ROW_LANES partial sums one element at a time, lane by
// lane in row order, whatever blocks it computes the exponentials in: bit for bit the plain
// loop below, for lengths around and across the blocks (ROW_EXP_BLOCK) and their remainders.
static void test_row_sum_exp_order(void) {
    enum { LONGEST = 3 * ROW_EXP_BLOCK + ROW_LANES + 3 };
    real x[LONGEST];
    for (int i = 0; i < LONGEST; i++) x[i] = (real)(sin(0.37 * i) * 9 + cos(1.7 * i));
    for (int n = 1; n <= LONGEST; n++) {
        double part[ROW_LANES] = {0}, want = 0;
        int i = 0;
        for (; i + ROW_LANES <= n; i += ROW_LANES)
            for (int l = 0; l < ROW_LANES; l++) part[l] += fast_expf(x[i + l] - 1.5f);
        for (int l = 0; l < ROW_LANES; l++) want += part[l];
        for (; i < n; i++) want += fast_expf(x[i] - 1.5f);
        double got = row_sum_exp(x, n, 1.5f);
        CHECK(got == want, "n %d: %.17g, the loop %.17g", n, got, want);
    }
}

int main(void) {
    RUN(test_relative_error);
    RUN(test_exact_points_and_ends);
    RUN(test_row_reductions);
    RUN(test_row_max_is_the_scalar_loop);
    RUN(test_row_dot3);
    RUN(test_row_sum_exp_order);
    return tl_failed_cases != 0;
}

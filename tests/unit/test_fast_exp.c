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

int main(void) {
    RUN(test_relative_error);
    RUN(test_exact_points_and_ends);
    RUN(test_row_reductions);
    return tl_failed_cases != 0;
}

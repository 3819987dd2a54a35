// test_vec_zero.c — the cpu backend's vec_zero: every element of the range zero and nothing
// outside it touched, on buffers below and above the size it writes past the caches
// (ZERO_STREAMED_BYTES, 64 MiB: non-temporal stores), at start addresses off the 16-byte
// boundary those stores need and lengths that leave a remainder, on one and two threads.
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "ops/cpu/cpu_ops.h"
#include "testlib.h"

enum { GUARD = 64, STREAMED_REALS = (64 << 20) / sizeof(real) };

// Zeroes n reals at `offset` reals into a buffer of guards filled with a marker, and checks.
static void zero_and_check(size_t n, size_t offset) {
    const unsigned char marker = 0xA5;
    size_t total = offset + n + GUARD;
    unsigned char *bytes = mt_malloc(total * sizeof(real));
    memset(bytes, marker, total * sizeof(real));
    real *x = (real *)bytes + offset;
    cpu_vec_zero(x, n);
    size_t nonzero = 0, touched = 0;
    for (size_t i = 0; i < n; i++) nonzero += x[i] != 0;
    for (size_t b = 0; b < offset * sizeof(real); b++) touched += bytes[b] != marker;
    for (size_t b = (offset + n) * sizeof(real); b < total * sizeof(real); b++) touched += bytes[b] != marker;
    CHECK(nonzero == 0 && touched == 0, "n %zu at offset %zu: %zu elements not zero, %zu guard bytes touched", n,
          offset, nonzero, touched);
    free(bytes);
}

static void test_sizes_and_offsets(void) {
    const size_t sizes[] = {1, 3, 4096, (1 << 16) * 5 + 7, STREAMED_REALS - 1, STREAMED_REALS, STREAMED_REALS + 37};
    const size_t offsets[] = {0, 1, 3};  // a 16-byte start, and 4 and 12 bytes past one
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (size_t o = 0; o < sizeof offsets / sizeof offsets[0]; o++) zero_and_check(sizes[s], offsets[o]);
}

static void test_threads(void) {
#ifdef _OPENMP
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        zero_and_check(STREAMED_REALS + 5, 1);
    }
#endif
}

int main(void) {
    RUN(test_sizes_and_offsets);
    RUN(test_threads);
    return tl_failed_cases != 0;
}

// test_np_random.c — NumPy's legacy RandomState (core/np_random.h) against numbers NumPy
// 2.4 printed; the comment above each case names the Python call that produced it.
#include "core/np_random.h"
#include "testlib.h"

#include <stdlib.h>
#include <string.h>

// Order-sensitive checksum: sum over i of (i + 1) * (a[i] + 1) mod 2^64.
static uint64_t checksum(const int64_t *a, int64_t n) {
    uint64_t s = 0;
    for (int64_t i = 0; i < n; i++) s += (uint64_t)(i + 1) * (uint64_t)(a[i] + 1);
    return s;
}

// rs = numpy.random.RandomState(seed); rs.get_state()[1] and
// rs.randint(0, 2**32, size=5, dtype=numpy.uint32) (raw 32-bit draws), then the 2005th draw.
static void test_seed_and_raw_draws(void) {
    struct {
        uint32_t seed, key1, key2, key623, draws[5], draw2005;
    } cases[] = {
        {0, 1, 1812433255u, 1796872496u, {2357136044u, 2546248239u, 3071714933u, 3626093760u, 2588848963u}, 2043657930u},
        {1234, 3159640283u, 4062961311u, 3064478787u, {822569775u, 2137449171u, 2671936806u, 3512589365u, 1880026316u}, 2213351889u},
        {4294967295u, 1340201581u, 3941791902u, 3413567280u, {419326371u, 479346978u, 3918654476u, 2416749639u, 3388880820u}, 1380450931u},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        NpRandomState rs;
        np_random_seed(&rs, cases[c].seed);
        CHECK(rs.key[0] == cases[c].seed && rs.key[1] == cases[c].key1 && rs.key[2] == cases[c].key2 &&
                  rs.key[623] == cases[c].key623,
              "seed %u: state differs from RandomState's", cases[c].seed);
        for (int i = 0; i < 5; i++) {
            uint32_t v = np_random_next32(&rs);
            CHECK(v == cases[c].draws[i], "seed %u draw %d: %u, numpy %u", cases[c].seed, i, v, cases[c].draws[i]);
        }
        uint32_t v = 0;
        for (int i = 5; i < 2005; i++) v = np_random_next32(&rs);
        CHECK(v == cases[c].draw2005, "seed %u draw 2005: %u, numpy %u", cases[c].seed, v, cases[c].draw2005);
    }
}

// RandomState(7): randint(0, 2**40, dtype=uint64) is next_uint64 & (2^40 - 1), the first
// 32-bit draw in the high half.
static void test_next64_order(void) {
    NpRandomState rs;
    np_random_seed(&rs, 7);
    uint64_t v = np_random_next64(&rs) & ((1ull << 40) - 1);
    CHECK(v == 752595690692ull, "next64 %llu, numpy 752595690692", (unsigned long long)v);
}

// The bounded draw: RandomState(5).randint(0, max + 1, size=k) uses the same masked
// rejection as shuffle's random_interval, 32-bit below 2^32 and 64-bit above.
static void test_interval(void) {
    struct {
        uint64_t max;
        int n;
        uint64_t want[6];
    } cases[] = {
        {1000, 6, {867, 206, 701, 998, 118, 400}},
        {(1ull << 31), 4, {953453411, 236996814, 887852006, 1562238070}},
        {5 * (1ull << 32) + 6, 4, {13121898702ull, 4206684233ull, 385778404ull, 14405913200ull}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        NpRandomState rs;
        np_random_seed(&rs, 5);
        for (int i = 0; i < cases[c].n; i++) {
            uint64_t v = np_random_interval(&rs, cases[c].max);
            CHECK(v == cases[c].want[i], "interval(%llu) draw %d: %llu, numpy %llu",
                  (unsigned long long)cases[c].max, i, (unsigned long long)v, (unsigned long long)cases[c].want[i]);
        }
    }
    NpRandomState rs;
    np_random_seed(&rs, 5);
    CHECK(np_random_interval(&rs, 0) == 0 && rs.pos == NP_MT_N, "interval(0) must not draw");
}

// a = numpy.arange(n, dtype=DT); numpy.random.RandomState(seed).shuffle(a):
// the first 8 elements, the last, and checksum(a).
static void test_shuffle(void) {
    struct {
        uint32_t seed;
        int64_t n;
        size_t elem;
        int64_t head[8], last;
        uint64_t sum;
    } cases[] = {
        {1234, 10, 4, {7, 2, 9, 1, 0, 8, 4, 5}, 3, 297},
        {0, 1, 4, {0}, 0, 1},
        {3, 2, 8, {1, 0}, 0, 4},
        {1234, 1000, 4, {681, 990, 155, 768, 438, 363, 688, 555}, 815, 252398022ull},
        {42, 70000, 4, {46730, 48393, 41416, 34506, 43725, 11615, 24656, 22411}, 15795, 85617447933264ull},
        {4294967295u, 65537, 8, {24985, 35173, 15998, 9385, 5951, 32499, 13203, 16681}, 27043, 70466426991014ull},
        {1234, 300001, 4, {251411, 166698, 106982, 101959, 23927, 62435, 165731, 222505}, 165158, 6750501246683984ull},
        {9, 200, 2, {84, 60, 54, 109, 156, 140, 39, 116}, 126, 2079841ull},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t n = cases[c].n;
        size_t elem = cases[c].elem;
        unsigned char *raw = malloc((size_t)n * elem);
        int64_t *a = malloc((size_t)n * sizeof *a);
        for (int64_t i = 0; i < n; i++) {
            if (elem == 2) ((uint16_t *)raw)[i] = (uint16_t)i;
            else if (elem == 4) ((uint32_t *)raw)[i] = (uint32_t)i;
            else ((int64_t *)raw)[i] = i;
        }
        NpRandomState rs;
        np_random_seed(&rs, cases[c].seed);
        np_random_shuffle(&rs, raw, n, elem);
        for (int64_t i = 0; i < n; i++)
            a[i] = elem == 2 ? ((uint16_t *)raw)[i] : elem == 4 ? ((uint32_t *)raw)[i] : ((int64_t *)raw)[i];
        int head_ok = 1;
        for (int64_t i = 0; i < 8 && i < n; i++) head_ok &= a[i] == cases[c].head[i];
        CHECK(head_ok, "seed %u n %lld: first elements differ (got %lld %lld ...)", cases[c].seed, (long long)n,
              (long long)a[0], (long long)(n > 1 ? a[1] : -1));
        CHECK(a[n - 1] == cases[c].last, "seed %u n %lld: last %lld, numpy %lld", cases[c].seed, (long long)n,
              (long long)a[n - 1], (long long)cases[c].last);
        uint64_t sum = checksum(a, n);
        CHECK(sum == cases[c].sum, "seed %u n %lld: checksum %llu, numpy %llu", cases[c].seed, (long long)n,
              (unsigned long long)sum, (unsigned long long)cases[c].sum);
        free(raw);
        free(a);
    }
}

// Megatron's sequence from one RandomState(1234): a 3-epoch document index
// (numpy.tile(arange(100, 150, dtype=int32), 3)) shuffled, then the two-part shuffle index
// arange(0, 77) and arange(77, 120) (uint32), each shuffled in turn.
static void test_consecutive_shuffles(void) {
    NpRandomState rs;
    np_random_seed(&rs, 1234);
    int32_t doc[150];
    uint32_t first[77], second[43];
    for (int i = 0; i < 150; i++) doc[i] = 100 + i % 50;
    for (int i = 0; i < 77; i++) first[i] = (uint32_t)i;
    for (int i = 0; i < 43; i++) second[i] = (uint32_t)(77 + i);
    np_random_shuffle(&rs, doc, 150, sizeof doc[0]);
    np_random_shuffle(&rs, first, 77, sizeof first[0]);
    np_random_shuffle(&rs, second, 43, sizeof second[0]);
    int64_t a[150];
    for (int i = 0; i < 150; i++) a[i] = doc[i];
    CHECK(a[0] == 141 && a[1] == 113 && a[7] == 135 && checksum(a, 150) == 1423238, "document index differs");
    for (int i = 0; i < 77; i++) a[i] = first[i];
    CHECK(a[0] == 42 && a[4] == 31 && checksum(a, 77) == 116165, "first shuffle part differs");
    for (int i = 0; i < 43; i++) a[i] = second[i];
    CHECK(a[0] == 106 && a[4] == 87 && checksum(a, 43) == 92800, "second shuffle part differs");
}

int main(void) {
    RUN(test_seed_and_raw_draws);
    RUN(test_next64_order);
    RUN(test_interval);
    RUN(test_shuffle);
    RUN(test_consecutive_shuffles);
    TESTS_DONE();
}

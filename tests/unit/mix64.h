// mix64.h — a 64-bit mix (splitmix64's finaliser) for the test programs: values every
// process can compute for any index (tests/unit/tp_tables.h, tests/mpi/mpi_check.h).
#pragma once
#include <stdint.h>

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

// np_random.c — NumPy's legacy RandomState stream (MT19937) and its shuffle (np_random.h).
#include "core/np_random.h"

#include "core/common.h"

#define MT_M 397
#define MT_MATRIX_A 0x9908b0dfu
#define MT_UPPER 0x80000000u
#define MT_LOWER 0x7fffffffu

void np_random_seed(NpRandomState *rs, uint32_t seed) {
    uint32_t s = seed;
    for (int i = 0; i < NP_MT_N; i++) {
        rs->key[i] = s;
        s = 1812433253u * (s ^ (s >> 30)) + (uint32_t)(i + 1);
    }
    rs->pos = NP_MT_N;  // the first draw regenerates the whole state
}

static inline uint32_t twist(uint32_t a, uint32_t b, uint32_t far) {
    uint32_t y = (a & MT_UPPER) | (b & MT_LOWER);
    return far ^ (y >> 1) ^ ((y & 1u) ? MT_MATRIX_A : 0u);
}

static void regenerate(NpRandomState *rs) {
    uint32_t *k = rs->key;
    for (int i = 0; i < NP_MT_N; i++)
        k[i] = twist(k[i], k[(i + 1) % NP_MT_N], k[(i + MT_M) % NP_MT_N]);
    rs->pos = 0;
}

uint32_t np_random_next32(NpRandomState *rs) {
    if (rs->pos >= NP_MT_N) regenerate(rs);
    uint32_t y = rs->key[rs->pos++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

uint64_t np_random_next64(NpRandomState *rs) {
    uint64_t high = np_random_next32(rs);
    return high << 32 | np_random_next32(rs);
}

uint64_t np_random_interval(NpRandomState *rs, uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    for (int shift = 1; shift <= 32; shift *= 2) mask |= mask >> shift;
    uint64_t value;
    if (max <= 0xffffffffu) {
        do value = np_random_next32(rs) & mask;
        while (value > max);
    } else {
        do value = np_random_next64(rs) & mask;
        while (value > max);
    }
    return value;
}

#define SHUFFLE_AS(T)                                                      \
    do {                                                                   \
        T *a = data;                                                       \
        for (int64_t i = n - 1; i > 0; i--) {                              \
            int64_t j = (int64_t)np_random_interval(rs, (uint64_t)i);      \
            T t = a[j];                                                    \
            a[j] = a[i];                                                   \
            a[i] = t;                                                      \
        }                                                                  \
    } while (0)

void np_random_shuffle(NpRandomState *rs, void *data, int64_t n, size_t elem_size) {
    switch (elem_size) {
    case 1: SHUFFLE_AS(uint8_t); break;
    case 2: SHUFFLE_AS(uint16_t); break;
    case 4: SHUFFLE_AS(uint32_t); break;
    case 8: SHUFFLE_AS(uint64_t); break;
    default: MT_ASSERT(!"np_random_shuffle: element size must be 1, 2, 4 or 8");
    }
}

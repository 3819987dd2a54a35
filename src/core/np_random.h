// np_random.h — NumPy's legacy random stream, numpy.random.RandomState, as far as
// Megatron-Core's dataset code draws from it: MT19937 seeded from an integer seed and
// RandomState.shuffle of a 1-D array. Every draw is bit-identical to NumPy's:
//   numpy.random.RandomState(seed)       np_random_seed(&rs, seed)
//   rs.shuffle(a)  (1-D, any dtype)      np_random_shuffle(&rs, a, n, sizeof *a)
// Megatron's GPT dataset draws nothing else (document index and shuffle index shuffles;
// the blended dataset's indices are built greedily, without random numbers).
#pragma once
#include <stddef.h>
#include <stdint.h>

#define NP_MT_N 624

typedef struct {
    uint32_t key[NP_MT_N];
    int pos;
} NpRandomState;

// RandomState(seed) for an integer seed in [0, 2^32): Knuth's MT19937 initialisation.
void np_random_seed(NpRandomState *rs, uint32_t seed);
// The next 32 random bits (MT19937 with tempering).
uint32_t np_random_next32(NpRandomState *rs);
// 64 bits from two 32-bit draws, the first one in the high half (NumPy's next_uint64).
uint64_t np_random_next64(NpRandomState *rs);
// A uniform integer in [0, max] as NumPy's random_interval draws it: the smallest all-ones
// mask covering max, 32-bit draws while max < 2^32 (64-bit draws above), rejection of
// masked values above max.
uint64_t np_random_interval(NpRandomState *rs, uint64_t max);
// RandomState.shuffle of a 1-D array of n elements of elem_size bytes (1, 2, 4 or 8):
// for i = n-1 down to 1, swap element i with element np_random_interval(i).
void np_random_shuffle(NpRandomState *rs, void *data, int64_t n, size_t elem_size);

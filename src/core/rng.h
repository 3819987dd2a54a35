// rng.h — counter-free, explicit-state random numbers (splitmix64 seeding +
// xoshiro256**). Every consumer owns its Rng; nothing global, so runs are
// reproducible from --seed alone.
#pragma once
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} Rng;

void rng_seed(Rng *rng, uint64_t seed);
// Derive an independent stream from (seed, stream id): used so that, e.g., the
// weights of layer 3 do not depend on how many numbers layer 2 drew.
void rng_seed_stream(Rng *rng, uint64_t seed, uint64_t stream);
uint64_t rng_u64(Rng *rng);
uint64_t rng_below(Rng *rng, uint64_t n);  // uniform in [0, n), unbiased; n > 0
double rng_uniform(Rng *rng);              // uniform in [0, 1)
double rng_normal(Rng *rng);               // standard normal (Box-Muller)

// Small deterministic RNG (xoshiro256**, seeded through splitmix64). The state is a
// value the caller owns, so runs with the same seed reproduce bit for bit.
#pragma once
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} Rng;

void rng_init(Rng *r, uint64_t seed);
uint64_t rng_next_u64(Rng *r);
// Uniform in [0, 1) with 24 bits of precision.
float rng_next_float(Rng *r);
// Standard normal (Box-Muller, computed in double).
float rng_normal(Rng *r);

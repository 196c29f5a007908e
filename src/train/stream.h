// The sample stream of a training run: position k is item perm_e[k mod n] of epoch e = k / n, where
// perm_e is a permutation seeded by (seed, e), or the identity without shuffling. Stateless, so a
// resumed run picks up the same order from its step alone.
#pragma once
#include <stdint.h>

typedef struct {
    int64_t n, epoch;
    int64_t *perm;
    uint64_t seed;
    int shuffle;
} Stream;

void stream_init(Stream *s, int64_t n, uint64_t seed, int shuffle);
void stream_free(Stream *s);
int64_t stream_at(Stream *s, int64_t k);

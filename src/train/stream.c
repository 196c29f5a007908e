#include "train/stream.h"

#include <stdlib.h>

#include "base/rng.h"
#include "base/util.h"

void stream_init(Stream *s, int64_t n, uint64_t seed, int shuffle) {
    *s = (Stream){.n = n, .epoch = -1, .perm = xmalloc((size_t)n * sizeof *s->perm), .seed = seed, .shuffle = shuffle};
}

void stream_free(Stream *s) {
    free(s->perm);
    s->perm = NULL;
}

int64_t stream_at(Stream *s, int64_t k) {
    int64_t e = k / s->n;
    if (s->epoch != e) {
        s->epoch = e;
        for (int64_t i = 0; i < s->n; i++) s->perm[i] = i;
        Rng r;
        rng_init(&r, s->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(e + 1)));
        for (int64_t i = s->n - 1; s->shuffle && i > 0; i--) {
            int64_t j = (int64_t)(rng_next_u64(&r) % (uint64_t)(i + 1)), t = s->perm[i];
            s->perm[i] = s->perm[j];
            s->perm[j] = t;
        }
    }
    return s->perm[k % s->n];
}

#include "base/arena.h"

#include <stdlib.h>

#include "base/util.h"

void arena_init(Arena *a, size_t bytes) {
    a->size = (bytes + 63) & ~(size_t)63;
    a->base = aligned_alloc(64, a->size ? a->size : 64);
    if (!a->base) die("out of memory allocating a %zu-byte workspace", bytes);
    a->used = a->peak = 0;
    a->on_device = 0;
}

void arena_free(Arena *a) {
    free(a->base);
    a->base = NULL;
    a->size = a->used = 0;
}

void *arena_alloc(Arena *a, size_t bytes) {
    size_t n = (bytes + 63) & ~(size_t)63;
    if (n > a->size - a->used)
        die("workspace exhausted: %zu bytes requested, %zu of %zu in use", bytes, a->used, a->size);
    void *p = a->base + a->used;
    a->used += n;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

void arena_reset(Arena *a) { a->used = 0; }

// Bump allocator over one block sized up front: the workspace for activations now,
// for the KV cache during rollout later. Peak memory is the block size, known in advance.
#pragma once
#include <stddef.h>

typedef struct {
    char *base;
    size_t size, used, peak;
    int on_device;  // base is a device's memory (backend_arena_init), not the host's
} Arena;

void arena_init(Arena *a, size_t bytes);
void arena_free(Arena *a);
// 64-byte aligned; dies (naming the request and the capacity) when the block is exhausted.
void *arena_alloc(Arena *a, size_t bytes);
void arena_reset(Arena *a);

// Workspace layouts: the next field at base + *off (NULL when base is NULL: only measuring), after which
// *off moves past its bytes, rounded up to 64.
static inline void *layout_take(char *base, size_t *off, size_t bytes) {
    void *p = base ? base + *off : NULL;
    *off += (bytes + 63) & ~(size_t)63;
    return p;
}
// p = the next `count` elements of p's type (layout_take).
#define LAYOUT_TAKE(base, off, p, count) ((p) = layout_take((base), (off), (size_t)(count) * sizeof *(p)))

// Constrained decoding's masks cached per automaton state (see mask_cache.h): lists found by their state's key.
#include "rollout/mask_cache.h"

#include <math.h>
#include <stdlib.h>

#include "base/hash.h"
#include "base/util.h"

#define ENTRY_BYTES 64  // a kept list's own memory beyond its key and tokens (the index's slots, allocations)

struct MaskCache {
    StrMap index;    // key -> its list in lists
    MaskList *lists;
    int32_t n, cap;
    size_t bytes, max_bytes;
    int64_t hits;  // finds that found a list
};

void mask_list_add(MaskList *l, int32_t id, int64_t need) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->t = xrealloc(l->t, (size_t)l->cap * sizeof *l->t);
    }
    l->t[l->n++] = (MaskToken){id, need < INT32_MAX ? (int32_t)need : INT32_MAX};
}

void mask_list_drop(MaskList *l, int32_t id) {
    int64_t lo = 0, hi = l->n;  // the first entry at id or above is in [lo, hi]
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (l->t[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < l->n && l->t[lo].id == id) l->t[lo].need = INT32_MAX;
}

void mask_list_free(MaskList *l) {
    free(l->t);
    *l = (MaskList){0};
}

int64_t mask_list_apply(const MaskList *l, int64_t tokens_left, float *logits, int64_t V) {
    int64_t next = 0, allowed = 0;  // ids below next are done
    for (int64_t k = 0; k < l->n && l->t[k].id < V; k++) {
        for (; next < l->t[k].id; next++) logits[next] = -INFINITY;
        if (l->t[k].need < INT32_MAX && l->t[k].need <= tokens_left)
            allowed++;
        else
            logits[next] = -INFINITY;
        next++;
    }
    for (; next < V; next++) logits[next] = -INFINITY;
    return allowed;
}

MaskCache *mask_cache_new(size_t max_bytes) {
    MaskCache *c = xcalloc(1, sizeof *c);
    strmap_init(&c->index, 64);
    c->max_bytes = max_bytes;
    return c;
}

static void clear(MaskCache *c) {
    for (int32_t i = 0; i < c->n; i++) mask_list_free(&c->lists[i]);
    strmap_free(&c->index);
    strmap_init(&c->index, 64);
    c->n = 0;
    c->bytes = 0;
}

void mask_cache_free(MaskCache *c) {
    if (!c) return;
    clear(c);
    strmap_free(&c->index);
    free(c->lists);
    free(c);
}

const MaskList *mask_cache_find(MaskCache *c, const void *key, size_t n) {
    int32_t i = strmap_get(&c->index, key, n);
    c->hits += i >= 0;
    return i < 0 ? NULL : &c->lists[i];
}

int64_t mask_cache_hits(const MaskCache *c) { return c->hits; }

const MaskList *mask_cache_keep(MaskCache *c, const void *key, size_t n, MaskList *l) {
    l->t = xrealloc(l->t, (size_t)(l->n ? l->n : 1) * sizeof *l->t);  // kept as long as it is
    l->cap = l->n;
    size_t bytes = ENTRY_BYTES + n + (size_t)l->n * sizeof *l->t;
    if (c->bytes + bytes > c->max_bytes) clear(c);
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->lists = xrealloc(c->lists, (size_t)c->cap * sizeof *c->lists);
    }
    strmap_put(&c->index, key, n, c->n);
    c->lists[c->n] = *l;
    *l = (MaskList){0};
    c->bytes += bytes;
    return &c->lists[c->n++];
}

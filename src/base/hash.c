#include "base/hash.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

uint64_t hash_bytes(const void *data, size_t len) {  // FNV-1a, then a finaliser to spread low bits
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

static size_t capacity_for(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap *= 2;  // load factor <= 1/2
    return cap;
}

void strmap_init(StrMap *m, size_t expected) {
    m->cap = capacity_for(expected);
    m->count = 0;
    m->keys = xcalloc(m->cap, sizeof *m->keys);
    m->lens = xcalloc(m->cap, sizeof *m->lens);
    m->values = xcalloc(m->cap, sizeof *m->values);
}

void strmap_free(StrMap *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
    free(m->keys);
    free(m->lens);
    free(m->values);
    memset(m, 0, sizeof *m);
}

static size_t strmap_slot(const StrMap *m, const char *key, size_t len) {
    size_t i = hash_bytes(key, len) & (m->cap - 1);
    while (m->keys[i] && !(m->lens[i] == len && memcmp(m->keys[i], key, len) == 0)) i = (i + 1) & (m->cap - 1);
    return i;
}

void strmap_put(StrMap *m, const char *key, size_t len, int32_t value) {
    if (2 * (m->count + 1) > m->cap) {  // grow and rehash
        StrMap bigger;
        strmap_init(&bigger, m->cap);
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i]) {
                size_t j = strmap_slot(&bigger, m->keys[i], m->lens[i]);
                bigger.keys[j] = m->keys[i];
                bigger.lens[j] = m->lens[i];
                bigger.values[j] = m->values[i];
                bigger.count++;
            }
        free(m->keys);
        free(m->lens);
        free(m->values);
        *m = bigger;
    }
    size_t i = strmap_slot(m, key, len);
    if (!m->keys[i]) {
        m->keys[i] = xmalloc(len + 1);
        memcpy(m->keys[i], key, len);
        m->keys[i][len] = '\0';
        m->lens[i] = (uint32_t)len;
        m->count++;
    }
    m->values[i] = value;
}

int32_t strmap_get(const StrMap *m, const char *key, size_t len) {
    size_t i = strmap_slot(m, key, len);
    return m->keys[i] ? m->values[i] : -1;
}

void u64map_init(U64Map *m, size_t expected) {
    m->cap = capacity_for(expected);
    m->count = 0;
    m->keys = xmalloc(m->cap * sizeof *m->keys);
    memset(m->keys, 0xff, m->cap * sizeof *m->keys);
    m->values = xcalloc(m->cap, sizeof *m->values);
}

void u64map_free(U64Map *m) {
    free(m->keys);
    free(m->values);
    memset(m, 0, sizeof *m);
}

static size_t u64map_slot(const U64Map *m, uint64_t key) {
    size_t i = hash_bytes(&key, sizeof key) & (m->cap - 1);
    while (m->keys[i] != UINT64_MAX && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
    return i;
}

void u64map_put(U64Map *m, uint64_t key, uint64_t value) {
    if (2 * (m->count + 1) > m->cap) {
        U64Map bigger;
        u64map_init(&bigger, m->cap);
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i] != UINT64_MAX) u64map_put(&bigger, m->keys[i], m->values[i]);
        u64map_free(m);
        *m = bigger;
    }
    size_t i = u64map_slot(m, key);
    if (m->keys[i] == UINT64_MAX) {
        m->keys[i] = key;
        m->count++;
    }
    m->values[i] = value;
}

int u64map_get(const U64Map *m, uint64_t key, uint64_t *value) {
    size_t i = u64map_slot(m, key);
    if (m->keys[i] == UINT64_MAX) return 0;
    *value = m->values[i];
    return 1;
}

// Open-addressing hash maps: byte strings -> int32 (vocabularies) and u64 -> u64 (BPE merges).
#pragma once
#include <stddef.h>
#include <stdint.h>

uint64_t hash_bytes(const void *data, size_t len);

typedef struct {
    char **keys;  // owned copies, NUL-terminated; NULL = empty slot
    uint32_t *lens;
    int32_t *values;
    size_t cap, count;  // cap is a power of two
} StrMap;

void strmap_init(StrMap *m, size_t expected);
void strmap_free(StrMap *m);
// Inserts or overwrites.
void strmap_put(StrMap *m, const char *key, size_t len, int32_t value);
// The value, or -1 when absent.
int32_t strmap_get(const StrMap *m, const char *key, size_t len);

typedef struct {
    uint64_t *keys;  // UINT64_MAX = empty slot
    uint64_t *values;
    size_t cap, count;
} U64Map;

void u64map_init(U64Map *m, size_t expected);
void u64map_free(U64Map *m);
void u64map_put(U64Map *m, uint64_t key, uint64_t value);  // key must not be UINT64_MAX
// 1 and *value when present, else 0.
int u64map_get(const U64Map *m, uint64_t key, uint64_t *value);

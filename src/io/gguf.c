#include "io/gguf.h"

#include <string.h>

// GGUF's value types (gguf.h's gguf_type).
enum { T_U32 = 4, T_I32 = 5, T_F32 = 6, T_BOOL = 7, T_STR = 8, T_ARR = 9 };

static void put(Buf *b, const void *p, size_t n) { buf_append(b, p, n); }

static void put_u32(Buf *b, uint32_t v) { put(b, &v, 4); }

static void put_u64(Buf *b, uint64_t v) { put(b, &v, 8); }

static void put_str(Buf *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}

static void key(Gguf *g, const char *k, uint32_t type) {
    put_str(&g->kv, k, strlen(k));
    put_u32(&g->kv, type);
    g->n_kv++;
}

void gguf_u32(Gguf *g, const char *k, uint32_t v) {
    key(g, k, T_U32);
    put_u32(&g->kv, v);
}

void gguf_f32(Gguf *g, const char *k, float v) {
    key(g, k, T_F32);
    put(&g->kv, &v, 4);
}

void gguf_bool(Gguf *g, const char *k, int v) {
    uint8_t b = v != 0;
    key(g, k, T_BOOL);
    put(&g->kv, &b, 1);
}

void gguf_str(Gguf *g, const char *k, const char *s) {
    key(g, k, T_STR);
    put_str(&g->kv, s, strlen(s));
}

void gguf_strs(Gguf *g, const char *k, const char *const *s, const size_t *len, size_t n) {
    key(g, k, T_ARR);
    put_u32(&g->kv, T_STR);
    put_u64(&g->kv, n);
    for (size_t i = 0; i < n; i++) put_str(&g->kv, s[i], len[i]);
}

void gguf_i32s(Gguf *g, const char *k, const int32_t *v, size_t n) {
    key(g, k, T_ARR);
    put_u32(&g->kv, T_I32);
    put_u64(&g->kv, n);
    put(&g->kv, v, n * sizeof *v);
}

void gguf_f32s(Gguf *g, const char *k, const float *v, size_t n) {
    key(g, k, T_ARR);
    put_u32(&g->kv, T_F32);
    put_u64(&g->kv, n);
    put(&g->kv, v, n * sizeof *v);
}

static size_t padded(size_t n) { return (n + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN; }

size_t gguf_tensor(Gguf *g, const char *name, int64_t rows, int64_t cols, GgufType t) {
    if (t == GGUF_Q8_0 && cols % 32) die("internal: a Q8_0 tensor %s of rows of %lld", name, (long long)cols);
    size_t n = (size_t)(rows * cols);
    size_t bytes = t == GGUF_Q8_0 ? n / 32 * 34 : t == GGUF_F32 ? n * 4 : n * 2;  // Q8_0: nn/q8.h's Q8Block
    put_str(&g->info, name, strlen(name));
    put_u32(&g->info, rows > 1 ? 2 : 1);
    put_u64(&g->info, (uint64_t)cols);
    if (rows > 1) put_u64(&g->info, (uint64_t)rows);
    put_u32(&g->info, (uint32_t)t);
    put_u64(&g->info, g->data_size);
    g->data_size += padded(bytes);
    g->n_tensors++;
    return bytes;
}

void gguf_write_head(const Gguf *g, AtomicFile *f) {
    Buf h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, g->n_tensors);
    put_u64(&h, g->n_kv);
    put(&h, g->kv.data, g->kv.len);
    put(&h, g->info.data, g->info.len);
    atomic_file_write(f, h.data, h.len);
    gguf_write_pad(f, h.len);
    buf_free(&h);
}

void gguf_write_pad(AtomicFile *f, size_t bytes) {
    static const char zeros[GGUF_ALIGN];
    atomic_file_write(f, zeros, padded(bytes) - bytes);
}

void gguf_free(Gguf *g) {
    buf_free(&g->kv);
    buf_free(&g->info);
    memset(g, 0, sizeof *g);
}

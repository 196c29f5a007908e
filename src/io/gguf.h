// GGUF, llama.cpp's model file (version 3, little-endian): a header, metadata key/values, the tensors' infos
// (name, shape innermost first, type, offset), then their data, each tensor aligned to 32 bytes. A writer
// collects the metadata and the tensors' shapes first; the data is streamed after (one tensor at a time, so a
// model is never held twice).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

// ggml's tensor types that grpo writes.
typedef enum { GGUF_F32 = 0, GGUF_F16 = 1, GGUF_Q8_0 = 8, GGUF_BF16 = 30 } GgufType;

typedef struct {
    Buf kv, info;          // the encoded metadata and tensor infos
    uint64_t n_kv, n_tensors;
    uint64_t data_size;    // the tensors' bytes so far, each padded to the alignment
} Gguf;

#define GGUF_ALIGN 32

void gguf_u32(Gguf *g, const char *key, uint32_t v);
void gguf_f32(Gguf *g, const char *key, float v);
void gguf_bool(Gguf *g, const char *key, int v);
void gguf_str(Gguf *g, const char *key, const char *s);
// An array of n strings (s[i], len[i] bytes each), of n int32 or of n float32.
void gguf_strs(Gguf *g, const char *key, const char *const *s, const size_t *len, size_t n);
void gguf_i32s(Gguf *g, const char *key, const int32_t *v, size_t n);
void gguf_f32s(Gguf *g, const char *key, const float *v, size_t n);

// A tensor's info: rows x cols (rows 1: a vector) of type t, cols innermost (ggml's ne[0]); its data comes
// in this order. Returns its bytes (Q8_0: cols a multiple of 32).
size_t gguf_tensor(Gguf *g, const char *name, int64_t rows, int64_t cols, GgufType t);
// The header, metadata and infos, padded to where the first tensor's data goes.
void gguf_write_head(const Gguf *g, AtomicFile *f);
// The zeros after a tensor of `bytes` bytes, up to the next aligned offset.
void gguf_write_pad(AtomicFile *f, size_t bytes);
void gguf_free(Gguf *g);

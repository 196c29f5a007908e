// Storage dtypes of checkpoint files and model weights, and their conversion to/from fp32.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    DTYPE_F32,
    DTYPE_BF16,
    DTYPE_F16,
    DTYPE_OTHER,  // a valid safetensors dtype we cannot convert (I64, F64, U8, ...)
    DTYPE_Q8,     // no file's: nn/q8.h's Q8_0 blocks (34 bytes per 32 values), decode's int8 weights
} DType;

const char *dtype_name(DType d);
// Bytes per element of a safetensors dtype string, 0 if the string is no safetensors dtype.
size_t dtype_size_of_name(const char *name, DType *out);
size_t dtype_size(DType d);  // F32, BF16, F16 (not DTYPE_Q8: nn/q8.h's blocks)

// Inline: the conversions of 16-bit weights sit in inner loops.
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even; NaN stays NaN.
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

uint16_t f32_to_f16(float f);  // round to nearest even; overflow gives inf
float f16_to_f32(uint16_t h);
// n elements of `src` (dtype d, little-endian) to fp32 `dst`; dies for DTYPE_OTHER.
void dtype_to_f32(DType d, const void *src, float *dst, size_t n);
// n fp32 elements to `dst` in dtype d (F32, BF16 or F16), rounding to nearest even; OpenMP-parallel.
void dtype_from_f32(DType d, const float *src, void *dst, size_t n);

// Element i of an array stored as d (F32 or BF16: what model weights may be).
static inline float dtype_get(const void *p, DType d, size_t i) {
    return d == DTYPE_BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

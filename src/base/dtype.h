// Storage dtypes of checkpoint files and their conversion to/from fp32 (the compute dtype).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum {
    DTYPE_F32,
    DTYPE_BF16,
    DTYPE_F16,
    DTYPE_OTHER,  // a valid safetensors dtype we cannot convert (I64, F64, U8, ...)
} DType;

const char *dtype_name(DType d);
// Bytes per element of a safetensors dtype string, 0 if the string is no safetensors dtype.
size_t dtype_size_of_name(const char *name, DType *out);
size_t dtype_size(DType d);

float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest even, NaN stays NaN
uint16_t f32_to_f16(float f);  // round to nearest even; overflow gives inf
float f16_to_f32(uint16_t h);
// n elements of `src` (dtype d, little-endian) to fp32 `dst`; dies for DTYPE_OTHER.
void dtype_to_f32(DType d, const void *src, float *dst, size_t n);

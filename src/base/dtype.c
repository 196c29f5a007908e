#include "base/dtype.h"

#include <math.h>
#include <string.h>

#include "base/util.h"

const char *dtype_name(DType d) {
    switch (d) {
    case DTYPE_F32: return "F32";
    case DTYPE_BF16: return "BF16";
    case DTYPE_F16: return "F16";
    case DTYPE_Q8: return "Q8_0";
    default: return "unsupported";
    }
}

size_t dtype_size(DType d) {
    if (d == DTYPE_Q8) die("internal: dtype_size of Q8_0 blocks");
    return d == DTYPE_F32 ? 4 : 2;
}

size_t dtype_size_of_name(const char *name, DType *out) {
    static const struct { const char *name; DType d; size_t size; } table[] = {
        {"F32", DTYPE_F32, 4},   {"BF16", DTYPE_BF16, 2},   {"F16", DTYPE_F16, 2},       {"F64", DTYPE_OTHER, 8},
        {"I64", DTYPE_OTHER, 8}, {"U64", DTYPE_OTHER, 8},   {"I32", DTYPE_OTHER, 4},     {"U32", DTYPE_OTHER, 4},
        {"I16", DTYPE_OTHER, 2}, {"U16", DTYPE_OTHER, 2},   {"I8", DTYPE_OTHER, 1},      {"U8", DTYPE_OTHER, 1},
        {"BOOL", DTYPE_OTHER, 1}, {"F8_E4M3", DTYPE_OTHER, 1}, {"F8_E5M2", DTYPE_OTHER, 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(name, table[i].name) == 0) {
            *out = table[i].d;
            return table[i].size;
        }
    return 0;
}

uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;      // NaN
    if (a >= 0x477ff000u) return sign | 0x7c00;     // 65520 and up round to inf
    if (a < 0x38800000u) {                          // below 2^-14: a multiple of 2^-24
        float v;
        memcpy(&v, &a, 4);
        return sign | (uint16_t)nearbyintf(v * 16777216.0f);  // exact product; rounds to even
    }
    uint32_t x = a - (112u << 23);  // rebias the exponent, then round 23 mantissa bits to 10
    x += 0xfffu + ((x >> 13) & 1);
    return sign | (uint16_t)(x >> 13);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13);  // inf / nan
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        u = sign;
    } else {  // subnormal: normalise the mantissa
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while (!(mant & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void dtype_to_f32(DType d, const void *src, float *dst, size_t n) {
    const uint8_t *p = src;  // file data may be unaligned: read through memcpy
    switch (d) {
    case DTYPE_F32: memcpy(dst, src, n * 4); break;
    case DTYPE_BF16:
    case DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = d == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
        break;
    default: die("internal: dtype_to_f32 on an unsupported dtype");
    }
}

void dtype_from_f32(DType d, const float *src, void *dst, size_t n) {
    uint16_t *h = dst;
    switch (d) {
    case DTYPE_F32: memmove(dst, src, n * 4); break;
    case DTYPE_BF16:
#pragma omp parallel for schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(src[i]);
        break;
    case DTYPE_F16:
#pragma omp parallel for schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) h[i] = f32_to_f16(src[i]);
        break;
    default: die("internal: dtype_from_f32 to an unsupported dtype");
    }
}

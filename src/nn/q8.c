#include "nn/q8.h"

#include <immintrin.h>
#include <string.h>

#include "base/util.h"
#include "nn/skinny.h"

// roundf's rounding, halves away from zero: the truncation, plus the sign where the rest is a half or more.
static inline __m256 round_away(__m256 v) {
    __m256 sign = _mm256_set1_ps(-0.0f), t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    return _mm256_add_ps(t, _mm256_and_ps(up, _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f))));
}

// The block of 32 values v as llama.cpp's quantize_row_q8_0_ref makes it: the scale rounded to fp16 (to
// nearest even) is what is stored, its fp32 value what divides; q = roundf(x * (1/d)) (NaN: 127).
static void quantize_block(Q8Block *b, const __m256 v[4]) {
    __m256 sign = _mm256_set1_ps(-0.0f), m = _mm256_andnot_ps(sign, v[0]);
    for (int k = 1; k < 4; k++) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h))), d = amax / 127.0f;
    __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    b->d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    __m256i q[4];
    for (int k = 0; k < 4; k++)  // min(x, 127) is 127 for a NaN x
        q[k] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(round_away(_mm256_mul_ps(v[k], id)), hi), lo));
    // packs work within 128-bit lanes: 32-bit groups come out in the order 0 4 1 5 2 6 3 7
    __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)b->q, bytes);
}

// 8 values at p (F32 or BF16) as fp32.
static inline __m256 load8(const void *p, DType dt) {
    if (dt == DTYPE_F32) return _mm256_loadu_ps(p);
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

void q8_quantize(Q8Block *out, const void *x, DType dt, int64_t rows, int64_t C) {
    if (C % Q8_BLOCK || (dt != DTYPE_F32 && dt != DTYPE_BF16))
        die("internal: Q8_0 rows of %lld %s values", (long long)C, dtype_name(dt));
    int64_t n = rows * (C / Q8_BLOCK);
    size_t es = dtype_size(dt);
#pragma omp parallel for schedule(static) if (n >= 1024)
    for (int64_t i = 0; i < n; i++) {
        const char *p = (const char *)x + (size_t)(i * Q8_BLOCK) * es;
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = load8(p + (size_t)(8 * k) * es, dt);
        quantize_block(&out[i], v);
    }
}

void q8_quantize_inputs(Q8In *out, const float *x, int64_t rows, int64_t C) {
    if (C % Q8_BLOCK) die("internal: Q8_0 inputs of %lld values", (long long)C);
    for (int64_t i = 0; i < rows * (C / Q8_BLOCK); i++) {
        Q8Block b;
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + i * Q8_BLOCK + 8 * k);
        quantize_block(&b, v);
        memcpy(out[i].q, b.q, sizeof b.q);
        out[i].d = _cvtsh_ss(b.d);
        for (int j = 0; j < Q8_BLOCK / 4; j++)
            out[i].corr[j] = -128 * (b.q[4 * j] + b.q[4 * j + 1] + b.q[4 * j + 2] + b.q[4 * j + 3]);
    }
}

void q8_dequantize(float *out, const Q8Block *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        for (int j = 0; j < Q8_BLOCK; j++) out[i * Q8_BLOCK + j] = f16_to_f32(b[i].d) * (float)b[i].q[j];
}

void q8_matmul(float *out, const float *x, const Q8Block *w, const void *bias, DType bt, int64_t N, int64_t C,
               int64_t OC, Q8In *xq) {
    q8_quantize_inputs(xq, x, N, C);
    matmul_skinny(out, xq, w, NULL, DTYPE_Q8, N, C, OC);
    for (int64_t i = 0; bias && i < N; i++)
        for (int64_t o = 0; o < OC; o++) out[i * OC + o] += dtype_get(bias, bt, (size_t)o);
}

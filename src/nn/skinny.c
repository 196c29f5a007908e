// Few rows (decoding a small batch) are memory-bound: read each weight row once and apply it to every
// input row from cache, instead of a GEMM packing the whole weight matrix on every call.
#include "nn/skinny.h"

#include <immintrin.h>
#include <string.h>

#include "base/cpu.h"

#define PAR_MIN 32768  // as nn/ops.c: smaller products stay on one thread

// fp32: GCC/Clang vector types keep four rows' partial sums in registers (the x86-64-v3 build makes them
// AVX2), added in a fixed order.
typedef float v8f __attribute__((vector_size(32)));

static inline v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum8(v8f v) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

// Output column o of N rows in fp32.
static void skinny_column_f32(float *out, const float *inp, const float *weight, const float *bias, int64_t o,
                              int64_t N, int64_t C, int64_t OC) {
    int64_t c8 = C & ~(int64_t)7;
    const float *w = weight + o * C;
    for (int64_t b0 = 0; b0 < N; b0 += 4) {  // four input rows per pass over the weight row
        int64_t nb = N - b0 < 4 ? N - b0 : 4;
        const float *x[4];
        for (int b = 0; b < 4; b++) x[b] = inp + (b0 + (b < nb ? b : 0)) * C;
        v8f a[4] = {{0}};
        for (int64_t c = 0; c < c8; c += 8) {
            v8f wv = load8(w + c);
            for (int b = 0; b < 4; b++) a[b] += load8(x[b] + c) * wv;
        }
        for (int64_t b = 0; b < nb; b++) {
            float sum = hsum8(a[b]);
            for (int64_t c = c8; c < C; c++) sum += x[b][c] * w[c];
            out[(b0 + b) * OC + o] = sum + (bias ? bias[o] : 0.0f);
        }
    }
}

// bf16 with AVX2 + FMA: a bf16 is the upper half of its fp32, so 16 loaded bf16 widen in two instructions,
// the even ones shifted up and the odd ones masked, both multiplied with the input widened the same way:
// half the bytes of fp32 weights read, the products and fp32 sums of the bf16 contract.
static inline __m256 even_f32(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
static inline __m256 odd_f32(__m256i v) {
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Output column o of input rows b0 .. b0+NB-1 (NB 1 or 2, a literal at each call: each gets its own
// unrolled loop), from weight row w; prefetches the row `pf` (may be NULL) as it goes. One weight row
// streams at a time: on the CPUs measured, four interleaved rows read memory at a third of the speed.
static inline __attribute__((always_inline)) void skinny_rows_bf16_avx2(float *out, const uint16_t *inp,
                                                                         const uint16_t *w, const uint16_t *pf,
                                                                         const uint16_t *bias, int64_t o,
                                                                         int64_t b0, int NB, int64_t C,
                                                                         int64_t OC) {
    int64_t c16 = C & ~(int64_t)15;
    __m256 even[2], odd[2];
    for (int b = 0; b < NB; b++) even[b] = odd[b] = _mm256_setzero_ps();
    for (int64_t c = 0; c < c16; c += 16) {
        if (pf && (c & 31) == 0) _mm_prefetch((const char *)(pf + c), _MM_HINT_T0);
        __m256i wv = _mm256_loadu_si256((const __m256i *)(w + c));
        __m256 we = even_f32(wv), wo = odd_f32(wv);
        for (int b = 0; b < NB; b++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(inp + (b0 + b) * C + c));
            even[b] = _mm256_fmadd_ps(even_f32(xv), we, even[b]);
            odd[b] = _mm256_fmadd_ps(odd_f32(xv), wo, odd[b]);
        }
    }
    for (int b = 0; b < NB; b++) {
        const uint16_t *x = inp + (b0 + b) * C;
        float sum = hsum256(_mm256_add_ps(even[b], odd[b]));
        for (int64_t c = c16; c < C; c++) sum += bf16_to_f32(x[c]) * bf16_to_f32(w[c]);
        out[(b0 + b) * OC + o] = sum + (bias ? bf16_to_f32(bias[o]) : 0.0f);
    }
}

// Output columns o0 .. o0+3 (those < OC), each weight row applied to the input rows two at a time, the
// rows of the next block prefetched (their first pass only).
static void skinny_block_bf16_avx2(float *out, const uint16_t *inp, const uint16_t *weight, const uint16_t *bias,
                                   int64_t o0, int64_t N, int64_t C, int64_t OC) {
    for (int64_t o = o0; o < o0 + 4 && o < OC; o++) {
        const uint16_t *w = weight + o * C, *pf = o + 4 < OC ? w + 4 * C : NULL;
        int64_t b0 = 0;
        for (; b0 + 2 <= N; b0 += 2) skinny_rows_bf16_avx2(out, inp, w, b0 ? NULL : pf, bias, o, b0, 2, C, OC);
        if (b0 < N) skinny_rows_bf16_avx2(out, inp, w, b0 ? NULL : pf, bias, o, b0, 1, C, OC);
    }
}

void matmul_skinny(float *out, const void *inp, const void *weight, const void *bias, DType dt, int64_t N, int64_t C,
                   int64_t OC) {
    if (dt == DTYPE_F32) {
#pragma omp parallel for schedule(static) if (OC * C >= PAR_MIN)
        for (int64_t o = 0; o < OC; o++) skinny_column_f32(out, inp, weight, bias, o, N, C, OC);
        return;
    }
    void (*block)(float *, const uint16_t *, const uint16_t *, const uint16_t *, int64_t, int64_t, int64_t, int64_t) =
        cpu_level()->level >= CPU_ISA_AVX512_BF16 ? skinny_block_bf16_avx512 : skinny_block_bf16_avx2;
#pragma omp parallel for schedule(static) if (OC * C >= PAR_MIN)
    for (int64_t o = 0; o < OC; o += 4) block(out, inp, weight, bias, o, N, C, OC);
}

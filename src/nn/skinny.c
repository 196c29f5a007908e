// Few rows (decoding a small batch) are memory-bound: read each weight row once and apply it to every
// input row from cache, instead of a GEMM packing the whole weight matrix on every call.
#include "nn/skinny.h"

#include <immintrin.h>

#include "base/cpu.h"
#include "base/util.h"
#include "nn/gemm.h"
#include "nn/q8.h"

// Q8_0: |x| times w with x's sign, in 16-bit products of byte pairs added in pairs, then pairs of those
// into int32 (the 16-bit sums of two products fit: 2 x 127 x 127 < 2^15).
#define q8_w(q) (q)
static inline __m256i q8_sums_avx2(__m256i w, const Q8In *p) {
    __m256i x = _mm256_loadu_si256((const __m256i *)p->q);
    __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w, x));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}
#define q8_sums q8_sums_avx2
#include "nn/skinny_q8.h"

#define PAR_MIN 32768  // as nn/ops.c: smaller products stay on one thread

// AVX2 + FMA. bf16: a bf16 is the upper half of its fp32, so 16 loaded bf16 widen in two instructions, the
// even ones shifted up and the odd ones masked, each multiplied with the input widened the same way: half
// the bytes of fp32 weights read, the products and fp32 sums of the bf16 contract.
typedef struct {
    __m256 even, odd;
} Widened;

static inline __m256 even_f32(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
static inline __m256 odd_f32(__m256i v) {
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

static inline Widened widen_load(const uint16_t *p) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    return (Widened){even_f32(v), odd_f32(v)};
}

static inline void widen_mac(__m256 *a, Widened w, const uint16_t *p) {
    Widened x = widen_load(p);
    a[0] = _mm256_fmadd_ps(x.even, w.even, a[0]);
    a[1] = _mm256_fmadd_ps(x.odd, w.odd, a[1]);
}

static inline __m256 f32_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void f32_mac(__m256 *a, __m256 w, const float *p) { a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(p), w, a[0]); }
static inline float f32_value(float x) { return x; }

#define SKINNY_BLOCK skinny_block_bf16_avx2
#define SKINNY_ROWS skinny_rows_bf16_avx2
#define SkElem uint16_t
#define sk_f32 bf16_to_f32
#define SkVec __m256
#define sk_zero _mm256_setzero_ps
#define SK_STEP 16
#define SK_SUMS 2
#define SkW Widened
#define sk_load_w widen_load
#define sk_mac widen_mac
#define sk_reduce hsum256
#define SK_ROWS 2
#include "nn/skinny_kernel.h"

#define SKINNY_BLOCK skinny_block_f32_avx2
#define SKINNY_ROWS skinny_rows_f32_avx2
#define SkElem float
#define sk_f32 f32_value
#define SkVec __m256
#define sk_zero _mm256_setzero_ps
#define SK_STEP 8
#define SK_SUMS 1
#define SkW __m256
#define sk_load_w f32_load
#define sk_mac f32_mac
#define sk_reduce hsum256
#define SK_ROWS 2
#include "nn/skinny_kernel.h"

#define SKINNY_BLOCK skinny_block_q8_avx2
#define SKINNY_ROWS skinny_rows_q8_avx2
#define SK_ROWS 2
#include "nn/skinny_q8_kernel.h"

typedef void (*BlockQ8)(float *, const Q8In *, const Q8Block *, const Q8Block *, int64_t, int64_t, int64_t, int64_t);
typedef void (*BlockBf16)(float *, const uint16_t *, const uint16_t *, const uint16_t *, int64_t, int64_t, int64_t,
                          int64_t);
typedef void (*BlockF32)(float *, const float *, const float *, const float *, int64_t, int64_t, int64_t, int64_t);

static const char *const kernel_names[SKINNY_KERNELS] = {"avx2", "avx512", "avx512_bf16", "avx512_vnni", "onednn"};

const char *skinny_kernel_name(SkinnyKernel k) { return k >= 0 && k < SKINNY_KERNELS ? kernel_names[k] : "?"; }

int skinny_bucket_rows(int bucket) {
    static const int rows[SKINNY_BUCKETS] = {1, 3, 6, 12};
    return rows[bucket];
}

int skinny_kernel_runs(SkinnyKernel k, DType dt) {
    CpuIsa level = cpu_level()->level;
    if (dt == DTYPE_Q8) return k == SKINNY_AVX2 || (k == SKINNY_AVX512_VNNI && level >= CPU_ISA_AVX512_BF16);
    if (dt != DTYPE_F32 && dt != DTYPE_BF16) return 0;
    switch (k) {
    case SKINNY_AVX2:
    case SKINNY_ONEDNN: return 1;
    case SKINNY_AVX512: return level >= CPU_ISA_AVX512;
    case SKINNY_AVX512_BF16: return dt == DTYPE_BF16 && level >= CPU_ISA_AVX512_BF16;
    default: return 0;
    }
}

void matmul_skinny_with(SkinnyKernel k, float *out, const void *inp, const void *weight, const void *bias, DType dt,
                        int64_t N, int64_t C, int64_t OC) {
    if (!skinny_kernel_runs(k, dt)) die("skinny kernel %s cannot run %s here", skinny_kernel_name(k), dtype_name(dt));
    if (k == SKINNY_ONEDNN) {
        gemm(dt, 0, 1, N, OC, C, 1.0f, inp, C, weight, C, bias, 0, out, OC);
        return;
    }
    if (dt == DTYPE_Q8) {  // C values: C / Q8_BLOCK blocks a row
        if (bias || C % Q8_BLOCK) die("internal: a Q8_0 projection with a bias or rows of %lld", (long long)C);
        BlockQ8 block = k == SKINNY_AVX512_VNNI ? skinny_block_q8_vnni : skinny_block_q8_avx2;
#pragma omp parallel for schedule(static) if (OC * C >= PAR_MIN)
        for (int64_t o = 0; o < OC; o += 4) block(out, inp, weight, NULL, o, N, C / Q8_BLOCK, OC);
        return;
    }
    if (dt == DTYPE_F32) {
        BlockF32 block = k == SKINNY_AVX512 ? skinny_block_f32_avx512 : skinny_block_f32_avx2;
#pragma omp parallel for schedule(static) if (OC * C >= PAR_MIN)
        for (int64_t o = 0; o < OC; o += 4) block(out, inp, weight, bias, o, N, C, OC);
        return;
    }
    BlockBf16 block = k == SKINNY_AVX512_BF16 ? skinny_block_bf16_avx512bf16
                      : k == SKINNY_AVX512    ? skinny_block_bf16_avx512
                                              : skinny_block_bf16_avx2;
#pragma omp parallel for schedule(static) if (OC * C >= PAR_MIN)
    for (int64_t o = 0; o < OC; o += 4) block(out, inp, weight, bias, o, N, C, OC);
}

void matmul_skinny(float *out, const void *inp, const void *weight, const void *bias, DType dt, int64_t N, int64_t C,
                   int64_t OC) {
    matmul_skinny_with(skinny_choice(dt), out, inp, weight, bias, dt, N, C, OC);
}

// Compiled with AVX-512 F/DQ/BW/VL (CMakeLists.txt); called only when base/cpu.h's level has it: skinny.c's
// kernels (bf16 widened in registers, and fp32), 16 lanes wide.
#include <immintrin.h>

#include "nn/skinny.h"

typedef struct {
    __m512 even, odd;
} Widened;

static inline Widened widen_load(const uint16_t *p) {
    __m512i v = _mm512_loadu_si512(p);
    return (Widened){_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
                     _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)))};
}

static inline void widen_mac(__m512 *a, Widened w, const uint16_t *p) {
    Widened x = widen_load(p);
    a[0] = _mm512_fmadd_ps(x.even, w.even, a[0]);
    a[1] = _mm512_fmadd_ps(x.odd, w.odd, a[1]);
}

static inline __m512 f32_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void f32_mac(__m512 *a, __m512 w, const float *p) { a[0] = _mm512_fmadd_ps(_mm512_loadu_ps(p), w, a[0]); }
static inline float f32_value(float x) { return x; }

#define SKINNY_BLOCK skinny_block_bf16_avx512
#define SKINNY_ROWS skinny_rows_bf16_avx512
#define SkElem uint16_t
#define sk_f32 bf16_to_f32
#define SkVec __m512
#define sk_zero _mm512_setzero_ps
#define SK_STEP 32
#define SK_SUMS 2
#define SkW Widened
#define sk_load_w widen_load
#define sk_mac widen_mac
#define sk_reduce _mm512_reduce_add_ps
#define SK_ROWS 4
#include "nn/skinny_kernel.h"

#define SKINNY_BLOCK skinny_block_f32_avx512
#define SKINNY_ROWS skinny_rows_f32_avx512
#define SkElem float
#define sk_f32 f32_value
#define SkVec __m512
#define sk_zero _mm512_setzero_ps
#define SK_STEP 16
#define SK_SUMS 1
#define SkW __m512
#define sk_load_w f32_load
#define sk_mac f32_mac
#define sk_reduce _mm512_reduce_add_ps
#define SK_ROWS 4
#include "nn/skinny_kernel.h"

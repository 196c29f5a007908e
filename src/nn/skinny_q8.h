// Q8_0 (nn/q8.h) for the skinny kernel (nn/skinny_kernel.h): one block a step, on 8-lane vectors. Included
// by skinny.c (AVX2) and skinny_vnni.c, which first define
//   q8_w(q)        the weights' 32 bytes as the kernel multiplies them (once for every input row)
//   q8_sums(w, p)  the 32 products of those with input block p's, summed in fours into 8 int32 lanes
// exactly (|q| <= 127: nothing saturates). 512-bit vectors, two blocks a step, were measured slower on
// Zen 4, which runs them as two halves, and the input layout they need is larger.
#include <immintrin.h>

#include "nn/q8.h"

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

typedef struct {
    __m256i q;
    __m256 d;  // the scale in every lane
} Q8Vec;

static inline Q8Vec q8_load(const Q8Block *b) {
    return (Q8Vec){q8_w(_mm256_loadu_si256((const __m256i *)b->q)), _mm256_set1_ps(_cvtsh_ss(b->d))};
}

// a[0] += (the block's 32 products w x, in fours) * (w's scale * x's).
static inline void q8_mac(__m256 *a, Q8Vec w, const Q8In *p) {
    __m256 d = _mm256_mul_ps(w.d, _mm256_broadcast_ss(&p->d));
    a[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_sums(w.q, p)), d, a[0]);
}

// A block's value: never read (rows are whole blocks, so no tail; q8_matmul adds the biases).
#define q8_none(e) ((void)(e), 0.0f)

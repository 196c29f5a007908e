// Compiled with AVX512_VNNI and VL (CMakeLists.txt); called only when base/cpu.h's level has them: Q8_0's
// byte products summed in fours by one instruction (skinny.c's AVX2 kernel takes four), 8 lanes wide.
#include <immintrin.h>

#include "nn/q8.h"
#include "nn/skinny.h"

// The weights offset by 128 (unsigned: w + 128), their products with x summed in fours onto the input's
// -128 x (x's sum in fours): w x.
#define q8_w(q) _mm256_xor_si256((q), _mm256_set1_epi8((char)0x80))
static inline __m256i q8_sums_vnni(__m256i w, const Q8In *p) {
    __m256i x = _mm256_loadu_si256((const __m256i *)p->q);
    return _mm256_dpbusd_epi32(_mm256_loadu_si256((const __m256i *)p->corr), w, x);
}
#define q8_sums q8_sums_vnni
#include "nn/skinny_q8.h"

#define SKINNY_BLOCK skinny_block_q8_vnni
#define SKINNY_ROWS skinny_rows_q8_vnni
#define SK_ROWS 4
#include "nn/skinny_q8_kernel.h"

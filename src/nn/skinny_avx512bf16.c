// Compiled with -mavx512bf16 (CMakeLists.txt); called only when base/cpu.h's level has it: the dot-product
// instruction multiplies 32 bf16 pairs and adds them into 16 fp32 sums, nothing widened first.
#include <immintrin.h>

#include "nn/skinny.h"

static inline __m512bh bf16_load(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512(p); }
static inline void dot_mac(__m512 *a, __m512bh w, const uint16_t *p) { a[0] = _mm512_dpbf16_ps(a[0], w, bf16_load(p)); }

#define SKINNY_BLOCK skinny_block_bf16_avx512bf16
#define SKINNY_ROWS skinny_rows_bf16_avx512bf16
#define SkElem uint16_t
#define sk_f32 bf16_to_f32
#define SkVec __m512
#define sk_zero _mm512_setzero_ps
#define SK_STEP 32
#define SK_SUMS 1
#define SkW __m512bh
#define sk_load_w bf16_load
#define sk_mac dot_mac
#define sk_reduce _mm512_reduce_add_ps
#define SK_ROWS 4
#include "nn/skinny_kernel.h"

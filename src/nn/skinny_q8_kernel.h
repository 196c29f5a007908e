// The Q8_0 instance of skinny_kernel.h (skinny.c's AVX2 and skinny_vnni.c's kernels): the includer defines
// SKINNY_BLOCK, SKINNY_ROWS and SK_ROWS, and has included skinny_q8.h with its q8_sums. No include guard: one
// instance per inclusion.
#define SkElem Q8Block
#define SkIn Q8In
#define sk_f32 q8_none
#define SkVec __m256
#define sk_zero _mm256_setzero_ps
#define SK_STEP 1
#define SK_SUMS 1
#define SkW Q8Vec
#define sk_load_w q8_load
#define sk_mac q8_mac
#define sk_reduce hsum256
#include "nn/skinny_kernel.h"

// Compiled with -mavx512bf16 (CMakeLists.txt); called only when base/cpu.h's level has it.
#include <immintrin.h>

#include "nn/skinny.h"

// The dot-product instruction multiplies 32 bf16 pairs and adds them into 16 fp32 sums, so nothing is
// widened first, and four weight rows stream at once (one row alone stays below memory bandwidth).
void skinny_block_bf16_avx512(float *out, const uint16_t *inp, const uint16_t *weight, const uint16_t *bias,
                              int64_t o0, int64_t N, int64_t C, int64_t OC) {
    int64_t no = OC - o0 < 4 ? OC - o0 : 4, c32 = C & ~(int64_t)31;
    const uint16_t *w[4];
    for (int j = 0; j < 4; j++) w[j] = weight + (o0 + (j < no ? j : 0)) * C;
    for (int64_t b0 = 0; b0 < N; b0 += 4) {
        int64_t nb = N - b0 < 4 ? N - b0 : 4;
        const uint16_t *x = inp + b0 * C;
        __m512 a[4][4];
        for (int b = 0; b < 4; b++)
            for (int j = 0; j < 4; j++) a[b][j] = _mm512_setzero_ps();
        for (int64_t c = 0; c < c32; c += 32) {
            __m512bh wv[4];
            for (int j = 0; j < 4; j++) wv[j] = (__m512bh)_mm512_loadu_si512(w[j] + c);
            for (int64_t b = 0; b < nb; b++) {
                __m512bh xv = (__m512bh)_mm512_loadu_si512(x + b * C + c);
                for (int j = 0; j < 4; j++) a[b][j] = _mm512_dpbf16_ps(a[b][j], wv[j], xv);
            }
        }
        for (int64_t b = 0; b < nb; b++)
            for (int64_t j = 0; j < no; j++) {
                float sum = _mm512_reduce_add_ps(a[b][j]);
                for (int64_t c = c32; c < C; c++) sum += bf16_to_f32(x[b * C + c]) * bf16_to_f32(w[j][c]);
                out[(b0 + b) * OC + o0 + j] = sum + (bias ? bf16_to_f32(bias[o0 + j]) : 0.0f);
            }
    }
}

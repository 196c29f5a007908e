#include "nn/ops.h"

#include <math.h>
#include <string.h>

#include "base/vmath.h"
#include "nn/gemm.h"

// Loops over fewer elements than this run on one thread: splitting them costs more in waking and
// joining threads than it saves, and on a busy machine every join can wait for a descheduled thread.
#define PAR_MIN 32768
#define PAR_IF(n) if ((n) >= PAR_MIN)

void embedding_forward(float *out, const int32_t *tokens, const void *table, DType wt, int64_t N, int64_t C) {
    size_t row = (size_t)C * dtype_size(wt);  // bytes
#pragma omp parallel for PAR_IF(N * C)
    for (int64_t i = 0; i < N; i++) dtype_to_f32(wt, (const char *)table + (size_t)tokens[i] * row, out + i * C, (size_t)C);
}

void rmsnorm_forward(float *out, const float *inp, const void *weight, DType wt, int64_t N, int64_t C, float eps) {
#pragma omp parallel for PAR_IF(N * C)
    for (int64_t i = 0; i < N; i++) {
        const float *x = inp + i * C;
        float *o = out + i * C;
        double ss = 0.0;
        for (int64_t j = 0; j < C; j++) ss += (double)x[j] * x[j];
        float rstd = (float)(1.0 / sqrt(ss / (double)C + eps));
        for (int64_t j = 0; j < C; j++) o[j] = x[j] * rstd * dtype_get(weight, wt, (size_t)j);
    }
}

// Few rows (decoding a small batch) are memory-bound: read each weight row once and apply it to
// every input row from cache, instead of a GEMM packing the whole weight matrix on every call.
// GCC/Clang vector types keep four rows' partial sums in registers; bf16 operands widen to fp32 there.
#define SKINNY_MAX_ROWS 16
typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));

static inline v8f load8(const void *p, int bf16, int64_t i) {
    v8f v;
    if (bf16) {
        v8h h;
        memcpy(&h, (const uint16_t *)p + i, sizeof h);
        v8u u = __builtin_convertvector(h, v8u) << 16;
        memcpy(&v, &u, sizeof v);
    } else {
        memcpy(&v, (const float *)p + i, sizeof v);
    }
    return v;
}

static inline float hsum8(v8f v) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

// Output column o of N <= SKINNY_MAX_ROWS rows. bf16 is a literal at each call site, so each dtype gets
// its own vectorised inner loop (OpenMP outlines the parallel loop before inlining, so the constant must
// reach this function from inside it).
static inline __attribute__((always_inline)) void skinny_column(float *out, const void *inp, const void *weight,
                                                                const void *bias, int bf16, int64_t o, int64_t N,
                                                                int64_t C, int64_t OC) {
    DType dt = bf16 ? DTYPE_BF16 : DTYPE_F32;
    size_t es = dtype_size(dt);
    int64_t c8 = C & ~(int64_t)7;
    const void *w = (const char *)weight + (size_t)(o * C) * es;
    for (int64_t b0 = 0; b0 < N; b0 += 4) {  // four input rows per pass over the weight row
        int64_t nb = N - b0 < 4 ? N - b0 : 4;
        const void *x[4];
        for (int b = 0; b < 4; b++) x[b] = (const char *)inp + (size_t)((b0 + (b < nb ? b : 0)) * C) * es;
        v8f a[4] = {{0}};
        for (int64_t c = 0; c < c8; c += 8) {
            v8f wv = load8(w, bf16, c);
            for (int b = 0; b < 4; b++) a[b] += load8(x[b], bf16, c) * wv;
        }
        for (int64_t b = 0; b < nb; b++) {
            float sum = hsum8(a[b]);
            for (int64_t c = c8; c < C; c++) sum += dtype_get(x[b], dt, (size_t)c) * dtype_get(w, dt, (size_t)c);
            out[(b0 + b) * OC + o] = sum + (bias ? dtype_get(bias, dt, (size_t)o) : 0.0f);
        }
    }
}

#ifdef __AVX512BF16__
#include <immintrin.h>

// The skinny product for bf16 on CPUs with AVX512-BF16, for output columns o0..o0+3 (those < OC): the
// dot-product instruction multiplies 32 bf16 pairs and adds them into 16 fp32 sums, so nothing is
// widened first, and four weight rows stream at once (one row alone stays below memory bandwidth).
static void skinny_block_bf16(float *out, const uint16_t *inp, const uint16_t *weight, const uint16_t *bias,
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
#endif

void matmul_forward(float *out, const void *inp, const void *weight, const void *bias, DType dt, int64_t N, int64_t C,
                    int64_t OC) {
    if (N > SKINNY_MAX_ROWS) {
        gemm(dt, 0, 1, N, OC, C, 1.0f, inp, C, weight, C, bias, 0, out, OC);
        return;
    }
#ifdef __AVX512BF16__
    if (dt == DTYPE_BF16) {
#pragma omp parallel for schedule(static) PAR_IF(OC * C)
        for (int64_t o = 0; o < OC; o += 4) skinny_block_bf16(out, inp, weight, bias, o, N, C, OC);
        return;
    }
#endif
#pragma omp parallel for schedule(static) PAR_IF(OC * C)
    for (int64_t o = 0; o < OC; o++) {
        if (dt == DTYPE_BF16) skinny_column(out, inp, weight, bias, 1, o, N, C, OC);
        else skinny_column(out, inp, weight, bias, 0, o, N, C, OC);
    }
}

void rope_table(float *cs, const int32_t *pos, int64_t N, int D, double theta) {
    int half = D / 2;
#pragma omp parallel for PAR_IF(N * D * 16)
    for (int64_t i = 0; i < N; i++)
        for (int j = 0; j < half; j++) {
            // Angles in double: HF uses fp32 here, and long positions lose digits there.
            double angle = (double)pos[i] * pow(theta, -2.0 * j / D);
            cs[i * D + j] = (float)cos(angle);
            cs[i * D + half + j] = (float)sin(angle);
        }
}

// Rotates each pair (v[j], v[j + D/2]) of every head of every row by its angle; sign -1: the inverse.
static void rope_rotate(float *x, const float *cs, int64_t N, int n_heads, int D, float sign) {
    int half = D / 2;
#pragma omp parallel for PAR_IF(N * n_heads * D)
    for (int64_t i = 0; i < N; i++) {
        const float *c = cs + i * D, *s = c + half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + i * (int64_t)n_heads * D + (int64_t)h * D;
            for (int j = 0; j < half; j++) {
                float a = v[j], b = v[j + half], sj = sign * s[j];
                v[j] = a * c[j] - b * sj;
                v[j + half] = b * c[j] + a * sj;
            }
        }
    }
}

void rope_forward(float *x, const float *cs, int64_t N, int n_heads, int D) { rope_rotate(x, cs, N, n_heads, D, 1.0f); }

void swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for PAR_IF(n)
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + exp_approx(-g)) * up[i];
    }
}

void residual_forward(float *x, const float *y, int64_t n) {
#pragma omp parallel for PAR_IF(n)
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

// ---------------------------------------------------------------------------------------------
// backward

void embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int64_t N, int64_t C) {
    // Rows may repeat a token: parallel over columns so no two threads add into the same float.
#pragma omp parallel for PAR_IF(N * C)
    for (int64_t j0 = 0; j0 < C; j0 += 16) {
        int64_t j1 = j0 + 16 < C ? j0 + 16 : C;
        for (int64_t i = 0; i < N; i++) {
            float *d = dtable + (int64_t)tokens[i] * C;
            const float *g = dout + i * C;
            for (int64_t j = j0; j < j1; j++) d[j] += g[j];
        }
    }
}

void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const void *weight, DType wt,
                      int64_t N, int64_t C, float eps) {
    // y = x * r * w with r = rsqrt(mean(x^2) + eps):  dx = r * (dy*w) - x * r^3 * mean(dy*w*x)
#pragma omp parallel for PAR_IF(N * C)
    for (int64_t i = 0; i < N; i++) {
        const float *x = inp + i * C, *dy = dout + i * C;
        double ss = 0.0, dot = 0.0;
        for (int64_t j = 0; j < C; j++) {
            ss += (double)x[j] * x[j];
            dot += (double)dy[j] * dtype_get(weight, wt, (size_t)j) * x[j];
        }
        double r = 1.0 / sqrt(ss / (double)C + eps);
        float a = (float)r, b = (float)(r * r * r * dot / (double)C);
        float *dx = dinp + i * C;
        for (int64_t j = 0; j < C; j++) dx[j] += a * dy[j] * dtype_get(weight, wt, (size_t)j) - b * x[j];
    }
    // dweight sums over rows, in row order (deterministic); cheap next to the matmuls around it.
    for (int64_t i = 0; dweight && i < N; i++) {
        const float *x = inp + i * C, *dy = dout + i * C;
        double ss = 0.0;
        for (int64_t j = 0; j < C; j++) ss += (double)x[j] * x[j];
        float r = (float)(1.0 / sqrt(ss / (double)C + eps));
        for (int64_t j = 0; j < C; j++) dweight[j] += dy[j] * x[j] * r;
    }
}

void matmul_backward(float *dinp, float *dweight, float *dbias, const void *dout, const void *inp, const void *weight,
                     DType dt, int64_t N, int64_t C, int64_t OC) {
    if (dinp) gemm(dt, 0, 0, N, C, OC, 1.0f, dout, OC, weight, C, NULL, 1, dinp, C);
    if (dweight) gemm(dt, 1, 0, OC, C, N, 1.0f, dout, OC, inp, C, NULL, 1, dweight, C);
    if (dbias) {
#pragma omp parallel for PAR_IF(N * OC)
        for (int64_t o0 = 0; o0 < OC; o0 += 64) {
            int64_t o1 = o0 + 64 < OC ? o0 + 64 : OC;
            for (int64_t i = 0; i < N; i++)
                for (int64_t o = o0; o < o1; o++) dbias[o] += dtype_get(dout, dt, (size_t)(i * OC + o));
        }
    }
}

void rope_backward(float *dx, const float *cs, int64_t N, int n_heads, int D) {
    rope_rotate(dx, cs, N, n_heads, D, -1.0f);  // the transpose of a rotation is its inverse
}

void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for PAR_IF(n)
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], sig = 1.0f / (1.0f + exp_approx(-g)), d = dout[i];
        dup[i] = d * g * sig;
        dgate[i] = d * up[i] * sig * (1.0f + g * (1.0f - sig));
    }
}

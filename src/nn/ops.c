#include "nn/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "base/vmath.h"
#include "nn/gemm.h"
#include "nn/skinny.h"

// Loops over fewer elements than this run on one thread: splitting them costs more in waking and
// joining threads than it saves, and on a busy machine every join can wait for a descheduled thread.
#define PAR_MIN 32768
#define PAR_IF(n) if ((n) >= PAR_MIN)

void embedding_forward(float *out, const int32_t *tokens, const void *table, DType wt, int64_t N, int64_t C) {
    size_t row = (size_t)C * dtype_size(wt);  // bytes
#pragma omp parallel for PAR_IF(N * C)
    for (int64_t i = 0; i < N; i++) dtype_to_f32(wt, (const char *)table + (size_t)tokens[i] * row, out + i * C, (size_t)C);
}

void rmsnorm_forward(float *out, const float *inp, const void *weight, DType wt, int64_t N, int64_t C, float eps,
                     float offset) {
#pragma omp parallel for PAR_IF(N * C)
    for (int64_t i = 0; i < N; i++) {
        const float *x = inp + i * C;
        float *o = out + i * C;
        double ss = 0.0;
        for (int64_t j = 0; j < C; j++) ss += (double)x[j] * x[j];
        float rstd = (float)(1.0 / sqrt(ss / (double)C + eps));
        for (int64_t j = 0; j < C; j++) o[j] = x[j] * rstd * (offset + dtype_get(weight, wt, (size_t)j));
    }
}

void matmul_forward(float *out, const void *inp, const void *weight, const void *bias, DType dt, int64_t N, int64_t C,
                    int64_t OC) {
    if (N <= SKINNY_MAX_ROWS) matmul_skinny(out, inp, weight, bias, dt, N, C, OC);
    else gemm(dt, 0, 1, N, OC, C, 1.0f, inp, C, weight, C, bias, 0, out, OC);
}

void rope_table(float *cs, const int32_t *pos, int64_t N, int D, RopeFreqs f) {
    int half = D / 2;
#pragma omp parallel for PAR_IF(N * D * 16)
    for (int64_t i = 0; i < N; i++)
        for (int j = 0; j < half; j++) {
            // Angles in double: HF uses fp32 here, and long positions lose digits there.
            double angle = (double)pos[i] * rope_inv_freq(f, j, D);
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

void glu_forward(float *out, const float *gate, const float *up, int64_t n, GluAct act) {
#pragma omp parallel for PAR_IF(n)
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = (act == GLU_SILU ? g / (1.0f + exp_approx(-g)) : gelu_tanh(g)) * up[i];
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
                      int64_t N, int64_t C, float eps, float offset) {
    // y = x * r * w with r = rsqrt(mean(x^2) + eps) (w: offset + weight):  dx = r * (dy*w) - x * r^3 * mean(dy*w*x)
#pragma omp parallel for PAR_IF(N * C)
    for (int64_t i = 0; i < N; i++) {
        const float *x = inp + i * C, *dy = dout + i * C;
        double ss = 0.0, dot = 0.0;
        for (int64_t j = 0; j < C; j++) {
            ss += (double)x[j] * x[j];
            dot += (double)dy[j] * (offset + dtype_get(weight, wt, (size_t)j)) * x[j];
        }
        double r = 1.0 / sqrt(ss / (double)C + eps);
        float a = (float)r, b = (float)(r * r * r * dot / (double)C);
        float *dx = dinp + i * C;
        for (int64_t j = 0; j < C; j++) dx[j] += a * dy[j] * (offset + dtype_get(weight, wt, (size_t)j)) - b * x[j];
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

// A row's mean and 1 / sqrt(variance + eps), as LayerNorm normalises it.
static void row_moments(const float *x, int64_t C, float eps, double *mean, double *rstd) {
    double m = 0, var = 0;
    for (int64_t j = 0; j < C; j++) m += x[j];
    m /= (double)C;
    for (int64_t j = 0; j < C; j++) var += (x[j] - m) * (x[j] - m);
    *mean = m;
    *rstd = 1.0 / sqrt(var / (double)C + eps);
}

void layernorm_forward(float *out, const float *inp, const float *weight, const float *bias, int64_t N, int64_t C,
                       float eps) {
#pragma omp parallel for PAR_IF(N * C)
    for (int64_t r = 0; r < N; r++) {
        const float *x = inp + r * C;
        double mean, rstd;
        row_moments(x, C, eps, &mean, &rstd);
        for (int64_t j = 0; j < C; j++) out[r * C + j] = ((float)(x[j] - mean) * (float)rstd) * weight[j] + bias[j];
    }
}

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int64_t N, int64_t C, float eps) {
    // y = xh * w + b with xh = (x - mean) * rstd:  dx = rstd * (g - mean(g) - xh * mean(g * xh)), g = dy * w
    if (dinp) {
#pragma omp parallel for PAR_IF(N * C)
        for (int64_t r = 0; r < N; r++) {
            const float *x = inp + r * C, *dy = dout + r * C;
            double mean, rstd, sg = 0.0, sgx = 0.0;
            row_moments(x, C, eps, &mean, &rstd);
            for (int64_t j = 0; j < C; j++) {
                double g = (double)dy[j] * weight[j];
                sg += g;
                sgx += g * (x[j] - mean) * rstd;
            }
            double mg = sg / (double)C, mgx = sgx / (double)C;
            for (int64_t j = 0; j < C; j++)
                dinp[r * C + j] += (float)(rstd * ((double)dy[j] * weight[j] - mg - (x[j] - mean) * rstd * mgx));
        }
    }
    if (!dweight && !dbias) return;
    // dweight, dbias: sums over rows in row order (deterministic), in double
    double *sw = xcalloc((size_t)(2 * C), sizeof *sw), *sb = sw + C;
    for (int64_t r = 0; r < N; r++) {
        const float *x = inp + r * C, *dy = dout + r * C;
        double mean, rstd;
        row_moments(x, C, eps, &mean, &rstd);
        for (int64_t j = 0; j < C; j++) {
            sw[j] += dy[j] * (x[j] - mean) * rstd;
            sb[j] += dy[j];
        }
    }
    for (int64_t j = 0; j < C; j++) {
        if (dweight) dweight[j] += (float)sw[j];
        if (dbias) dbias[j] += (float)sb[j];
    }
    free(sw);
}

void gelu_forward(float *out, const float *inp, int64_t n) {
#pragma omp parallel for PAR_IF(n)
    for (int64_t i = 0; i < n; i++) out[i] = 0.5f * inp[i] * (1.0f + erff(inp[i] * 0.70710678118654752f));
}

void gelu_backward(float *dinp, const float *dout, const float *inp, int64_t n) {
#pragma omp parallel for PAR_IF(n)
    for (int64_t i = 0; i < n; i++) {  // GELU'(x) = Phi(x) + x phi(x)
        double x = inp[i], cdf = 0.5 * (1.0 + erf(x * 0.70710678118654752));
        double pdf = 0.3989422804014327 * exp(-0.5 * x * x);
        dinp[i] = dout[i] * (float)(cdf + x * pdf);
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

void glu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n,
                  GluAct act) {
#pragma omp parallel for PAR_IF(n)
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], d = dout[i];
        if (act == GLU_SILU) {
            float sig = 1.0f / (1.0f + exp_approx(-g));
            dup[i] = d * g * sig;
            dgate[i] = d * up[i] * sig * (1.0f + g * (1.0f - sig));
        } else {
            dup[i] = d * gelu_tanh(g);
            dgate[i] = d * up[i] * (float)gelu_tanh_grad(g);
        }
    }
}

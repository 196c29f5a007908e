#include "nn/ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

void embedding_forward(float *out, const int32_t *tokens, const float *table, int64_t N, int64_t C) {
#pragma omp parallel for
    for (int64_t i = 0; i < N; i++) memcpy(out + i * C, table + (int64_t)tokens[i] * C, (size_t)C * sizeof(float));
}

void rmsnorm_forward(float *out, const float *inp, const float *weight, int64_t N, int64_t C, float eps) {
#pragma omp parallel for
    for (int64_t i = 0; i < N; i++) {
        const float *x = inp + i * C;
        float *o = out + i * C;
        double ss = 0.0;
        for (int64_t j = 0; j < C; j++) ss += (double)x[j] * x[j];
        float rstd = (float)(1.0 / sqrt(ss / (double)C + eps));
        for (int64_t j = 0; j < C; j++) o[j] = x[j] * rstd * weight[j];
    }
}

void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int64_t N, int64_t C,
                    int64_t OC) {
    if (bias) {
#pragma omp parallel for
        for (int64_t i = 0; i < N; i++) memcpy(out + i * OC, bias, (size_t)OC * sizeof(float));
    }
    if (N == 1)  // one row (decoding a single sequence) is memory-bound: gemv streams the weights
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)OC, (blasint)C, 1.0f, weight, (blasint)C, inp, 1,
                    bias ? 1.0f : 0.0f, out, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)N, (blasint)OC, (blasint)C, 1.0f, inp,
                    (blasint)C, weight, (blasint)C, bias ? 1.0f : 0.0f, out, (blasint)OC);
}

void rope_forward(float *x, const int32_t *pos, int64_t N, int n_heads, int D, double theta) {
    int half = D / 2;
#pragma omp parallel for
    for (int64_t i = 0; i < N; i++) {
        for (int j = 0; j < half; j++) {
            // Angles in double: HF uses fp32 here, and long positions lose digits there.
            double angle = (double)pos[i] * pow(theta, -2.0 * j / D);
            float c = (float)cos(angle), s = (float)sin(angle);
            for (int h = 0; h < n_heads; h++) {
                float *v = x + i * (int64_t)n_heads * D + (int64_t)h * D;
                float a = v[j], b = v[j + half];
                v[j] = a * c - b * s;
                v[j + half] = b * c + a * s;
            }
        }
    }
}

void swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void residual_forward(float *x, const float *y, int64_t n) {
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

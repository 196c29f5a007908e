#include <cblas.h>
#include <math.h>

#include "nn/ops.h"

size_t logprob_scratch_floats(int64_t V) { return (size_t)LOGPROB_CHUNK * (size_t)V; }

void logprob_forward(float *out, const float *h, const float *W, const int32_t *targets, int64_t N, int64_t C,
                     int64_t V, float *scratch) {
    for (int64_t i0 = 0; i0 < N; i0 += LOGPROB_CHUNK) {
        int64_t rows = N - i0 < LOGPROB_CHUNK ? N - i0 : LOGPROB_CHUNK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)rows, (blasint)V, (blasint)C, 1.0f, h + i0 * C,
                    (blasint)C, W, (blasint)C, 0.0f, scratch, (blasint)V);
#pragma omp parallel for
        for (int64_t r = 0; r < rows; r++) {
            int32_t t = targets[i0 + r];
            if (t < 0) {
                out[i0 + r] = 0.0f;
                continue;
            }
            const float *logits = scratch + r * V;
            float mx = logits[0];
            for (int64_t j = 1; j < V; j++) mx = logits[j] > mx ? logits[j] : mx;
            double sum = 0.0;
            for (int64_t j = 0; j < V; j++) sum += expf(logits[j] - mx);
            out[i0 + r] = (float)((double)(logits[t] - mx) - log(sum));
        }
    }
}

void logprob_backward(float *dh, float *dW, float *out, const float *dlogp, const float *h, const float *W,
                      const int32_t *targets, int64_t N, int64_t C, int64_t V, float *scratch) {
    for (int64_t i0 = 0; i0 < N; i0 += LOGPROB_CHUNK) {
        int64_t rows = N - i0 < LOGPROB_CHUNK ? N - i0 : LOGPROB_CHUNK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)rows, (blasint)V, (blasint)C, 1.0f, h + i0 * C,
                    (blasint)C, W, (blasint)C, 0.0f, scratch, (blasint)V);
        // logits -> d(loss)/d(logits) = dlogp * (onehot(target) - softmax)
#pragma omp parallel for
        for (int64_t r = 0; r < rows; r++) {
            float *g = scratch + r * V;
            int32_t t = targets[i0 + r];
            float d = t >= 0 ? dlogp[i0 + r] : 0.0f;
            if (d == 0.0f && !out) {
                for (int64_t j = 0; j < V; j++) g[j] = 0.0f;
                continue;
            }
            float mx = g[0];
            for (int64_t j = 1; j < V; j++) mx = g[j] > mx ? g[j] : mx;
            double sum = 0.0;
            for (int64_t j = 0; j < V; j++) sum += expf(g[j] - mx);
            if (out) out[i0 + r] = t >= 0 ? (float)((double)(g[t] - mx) - log(sum)) : 0.0f;
            if (t < 0) d = 0.0f;
            float inv = (float)(1.0 / sum);
            for (int64_t j = 0; j < V; j++) g[j] = -d * expf(g[j] - mx) * inv;
            g[t] += d;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)rows, (blasint)C, (blasint)V, 1.0f, scratch,
                    (blasint)V, W, (blasint)C, 1.0f, dh + i0 * C, (blasint)C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)V, (blasint)C, (blasint)rows, 1.0f, scratch,
                    (blasint)V, h + i0 * C, (blasint)C, 1.0f, dW, (blasint)C);
    }
}

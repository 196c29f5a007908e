#include <cblas.h>
#include <math.h>

#include "nn/ops.h"

size_t logprob_scratch_floats(int64_t V) { return (size_t)LOGPROB_CHUNK * (size_t)V; }

// sum_j e^(z_j - mx) and, when sz is wanted (the entropy), sum_j e^(z_j - mx) (z_j - mx).
static void row_sums(const float *z, int64_t V, float mx, double *sum, double *sz) {
    double s = 0.0, w = 0.0;
    if (sz) {
        for (int64_t j = 0; j < V; j++) {
            float e = expf(z[j] - mx);
            s += e;
            w += (double)e * (double)(z[j] - mx);
        }
        *sz = w;
    } else {
        for (int64_t j = 0; j < V; j++) s += expf(z[j] - mx);
    }
    *sum = s;
}

void logprob_forward(float *out, float *ent, const float *h, const float *W, const int32_t *targets, int64_t N,
                     int64_t C, int64_t V, float *scratch) {
    for (int64_t i0 = 0; i0 < N; i0 += LOGPROB_CHUNK) {
        int64_t rows = N - i0 < LOGPROB_CHUNK ? N - i0 : LOGPROB_CHUNK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)rows, (blasint)V, (blasint)C, 1.0f, h + i0 * C,
                    (blasint)C, W, (blasint)C, 0.0f, scratch, (blasint)V);
#pragma omp parallel for
        for (int64_t r = 0; r < rows; r++) {
            int32_t t = targets[i0 + r];
            if (t < 0) {
                out[i0 + r] = 0.0f;
                if (ent) ent[i0 + r] = 0.0f;
                continue;
            }
            const float *logits = scratch + r * V;
            float mx = logits[0];
            for (int64_t j = 1; j < V; j++) mx = logits[j] > mx ? logits[j] : mx;
            double sum = 0.0, sz = 0.0;
            row_sums(logits, V, mx, &sum, ent ? &sz : NULL);
            out[i0 + r] = (float)((double)(logits[t] - mx) - log(sum));
            if (ent) ent[i0 + r] = (float)(log(sum) - sz / sum);  // H = lse - sum_j p_j z_j
        }
    }
}

void logprob_backward(float *dh, float *dW, float *out, const float *dlogp, const float *dent, const float *h,
                      const float *W, const int32_t *targets, int64_t N, int64_t C, int64_t V, float *scratch) {
    for (int64_t i0 = 0; i0 < N; i0 += LOGPROB_CHUNK) {
        int64_t rows = N - i0 < LOGPROB_CHUNK ? N - i0 : LOGPROB_CHUNK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)rows, (blasint)V, (blasint)C, 1.0f, h + i0 * C,
                    (blasint)C, W, (blasint)C, 0.0f, scratch, (blasint)V);
        // logits -> d(loss)/d(logits) = dlogp * (onehot(target) - p) - dent * p * (log p + H)
#pragma omp parallel for
        for (int64_t r = 0; r < rows; r++) {
            float *g = scratch + r * V;
            int32_t t = targets[i0 + r];
            float d = t >= 0 ? dlogp[i0 + r] : 0.0f, de = t >= 0 && dent ? dent[i0 + r] : 0.0f;
            if (t < 0 || (d == 0.0f && de == 0.0f && !out)) {  // no gradient through this row
                if (out) out[i0 + r] = 0.0f;  // (t >= 0 here only without out)
                for (int64_t j = 0; j < V; j++) g[j] = 0.0f;
                continue;
            }
            float mx = g[0];
            for (int64_t j = 1; j < V; j++) mx = g[j] > mx ? g[j] : mx;
            double sum = 0.0, sz = 0.0;
            row_sums(g, V, mx, &sum, de != 0.0f ? &sz : NULL);
            if (out) out[i0 + r] = (float)((double)(g[t] - mx) - log(sum));
            float inv = (float)(1.0 / sum), lse = (float)log(sum), H = (float)(log(sum) - sz / sum);
            if (de == 0.0f) {
                for (int64_t j = 0; j < V; j++) g[j] = -d * expf(g[j] - mx) * inv;
            } else {
                for (int64_t j = 0; j < V; j++) {
                    float lp = g[j] - mx - lse, p = expf(g[j] - mx) * inv;
                    g[j] = -d * p - de * p * (lp + H);
                }
            }
            g[t] += d;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)rows, (blasint)C, (blasint)V, 1.0f, scratch,
                    (blasint)V, W, (blasint)C, 1.0f, dh + i0 * C, (blasint)C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)V, (blasint)C, (blasint)rows, 1.0f, scratch,
                    (blasint)V, h + i0 * C, (blasint)C, 1.0f, dW, (blasint)C);
    }
}

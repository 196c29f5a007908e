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

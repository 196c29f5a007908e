#include <math.h>

#include "base/vmath.h"
#include "nn/gemm.h"
#include "nn/ops.h"

// The chunk's logits (fp32), then with bf16 weights the chunk's input rows and logit gradients in bf16.
size_t logprob_scratch_floats(int64_t V, int64_t C, DType wt) {
    size_t logits = (size_t)LOGPROB_CHUNK * (size_t)V;
    return wt == DTYPE_BF16 ? logits + (size_t)LOGPROB_CHUNK * (size_t)(C + V) / 2 + 1 : logits;
}

// The chunk's rows of h as the head's weights store them: h itself, or rounded to bf16 in scratch.
static const void *head_input(const float *h, int64_t rows, int64_t C, int64_t V, DType wt, float *scratch) {
    if (wt != DTYPE_BF16) return h;
    uint16_t *h16 = (uint16_t *)(scratch + (size_t)LOGPROB_CHUNK * (size_t)V);
    dtype_from_f32(DTYPE_BF16, h, h16, (size_t)(rows * C));
    return h16;
}

// sum_j e^(z_j - mx) and, when sz is wanted (the entropy), sum_j e^(z_j - mx) (z_j - mx).
static void row_sums(const float *z, int64_t V, float mx, double *sum, double *sz) {
    if (!sz) {
        *sum = row_exp_sum(NULL, z, V, mx, 1.0f);
        return;
    }
    double s[VMATH_LANES] = {0}, w[VMATH_LANES] = {0};
    int64_t j = 0;
    for (; j + VMATH_LANES <= V; j += VMATH_LANES)
        for (int l = 0; l < VMATH_LANES; l++) {
            float d = z[j + l] - mx, e = exp_approx(d);
            s[l] += e;
            w[l] += (double)e * (double)d;
        }
    for (int l = 0; j + l < V; l++) {
        float d = z[j + l] - mx, e = exp_approx(d);
        s[l] += e;
        w[l] += (double)e * (double)d;
    }
    *sum = *sz = 0.0;
    for (int l = 0; l < VMATH_LANES; l++) {
        *sum += s[l];
        *sz += w[l];
    }
}

void logprob_forward(float *out, float *ent, const float *h, const void *W, DType wt, const int32_t *targets,
                     int64_t N, int64_t C, int64_t V, float *scratch) {
    for (int64_t i0 = 0; i0 < N; i0 += LOGPROB_CHUNK) {
        int64_t rows = N - i0 < LOGPROB_CHUNK ? N - i0 : LOGPROB_CHUNK;
        const void *x = head_input(h + i0 * C, rows, C, V, wt, scratch);
        gemm(wt, 0, 1, rows, V, C, 1.0f, x, C, W, C, NULL, 0, scratch, V);
#pragma omp parallel for
        for (int64_t r = 0; r < rows; r++) {
            int32_t t = targets[i0 + r];
            if (t < 0) {
                out[i0 + r] = 0.0f;
                if (ent) ent[i0 + r] = 0.0f;
                continue;
            }
            const float *logits = scratch + r * V;
            float mx = row_max(logits, V);
            double sum = 0.0, sz = 0.0;
            row_sums(logits, V, mx, &sum, ent ? &sz : NULL);
            out[i0 + r] = (float)((double)(logits[t] - mx) - log(sum));
            if (ent) ent[i0 + r] = (float)(log(sum) - sz / sum);  // H = lse - sum_j p_j z_j
        }
    }
}

void logprob_backward(float *dh, float *dW, float *out, const float *dlogp, const float *dent, const float *h,
                      const void *W, DType wt, const int32_t *targets, int64_t N, int64_t C, int64_t V,
                      float *scratch) {
    for (int64_t i0 = 0; i0 < N; i0 += LOGPROB_CHUNK) {
        int64_t rows = N - i0 < LOGPROB_CHUNK ? N - i0 : LOGPROB_CHUNK;
        const void *x = head_input(h + i0 * C, rows, C, V, wt, scratch);
        gemm(wt, 0, 1, rows, V, C, 1.0f, x, C, W, C, NULL, 0, scratch, V);
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
            float mx = row_max(g, V);
            double sum = 0.0, sz = 0.0;
            row_sums(g, V, mx, &sum, de != 0.0f ? &sz : NULL);
            if (out) out[i0 + r] = (float)((double)(g[t] - mx) - log(sum));
            float inv = (float)(1.0 / sum), lse = (float)log(sum), H = (float)(log(sum) - sz / sum);
            if (de == 0.0f) {
                for (int64_t j = 0; j < V; j++) g[j] = -d * exp_approx(g[j] - mx) * inv;
            } else {
                for (int64_t j = 0; j < V; j++) {
                    float lp = g[j] - mx - lse, p = exp_approx(g[j] - mx) * inv;
                    g[j] = -d * p - de * p * (lp + H);
                }
            }
            g[t] += d;
        }
        const void *g = scratch;
        if (wt == DTYPE_BF16) {  // after the bf16 input rows
            uint16_t *g16 = (uint16_t *)(scratch + (size_t)LOGPROB_CHUNK * (size_t)V) + (size_t)LOGPROB_CHUNK * (size_t)C;
            dtype_from_f32(DTYPE_BF16, scratch, g16, (size_t)(rows * V));
            g = g16;
        }
        gemm(wt, 0, 0, rows, C, V, 1.0f, g, V, W, C, NULL, 1, dh + i0 * C, C);
        if (dW) gemm(wt, 1, 0, V, C, rows, 1.0f, g, V, x, C, NULL, 1, dW, C);
    }
}

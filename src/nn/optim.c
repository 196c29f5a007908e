#include "nn/optim.h"

#include <math.h>

void adamw_update(const AdamW *o, float *p, const float *g, float *m, float *v, size_t n, double wd, int64_t t) {
    // The same float operations, in the same order, as torch's single-tensor AdamW.
    AdamWConstants k = adamw_constants(o, wd, t);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        p[i] *= k.decay;
        m[i] = m[i] * k.b1 + k.a1 * g[i];
        v[i] = v[i] * k.b2 + k.a2 * g[i] * g[i];
        p[i] += -k.step * (m[i] / (sqrtf(v[i]) / k.bc2_sqrt + k.eps));
    }
}

double grad_norm(const float *g, size_t n) {
    double ss = 0.0;
#pragma omp parallel for reduction(+ : ss)
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    return sqrt(ss);
}

void grad_scale(float *g, size_t n, float s) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) g[i] *= s;
}

int grad_all_finite(const float *g, size_t n) {
    int ok = 1;
#pragma omp parallel for reduction(& : ok)
    for (size_t i = 0; i < n; i++) ok &= isfinite(g[i]) != 0;
    return ok;
}

void round_to_dtype(float *dst, const float *src, size_t n, DType d) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = src[i];
        if (d == DTYPE_BF16) x = bf16_to_f32(f32_to_bf16(x));
        else if (d == DTYPE_F16) x = f16_to_f32(f32_to_f16(x));
        dst[i] = x;
    }
}

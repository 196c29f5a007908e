#include "nn/optim.h"

#include <math.h>

void adamw_update(const AdamW *o, float *p, const float *g, float *m, float *v, size_t n, double wd, int64_t t) {
    // The same float operations, in the same order, as torch's single-tensor AdamW.
    float decay = (float)(1.0 - o->lr * wd), b1 = (float)o->beta1, b2 = (float)o->beta2;
    float a1 = (float)(1.0 - o->beta1), a2 = (float)(1.0 - o->beta2);
    double bc1 = 1.0 - pow(o->beta1, (double)t), bc2 = 1.0 - pow(o->beta2, (double)t);
    float step = (float)(o->lr / bc1), bc2_sqrt = (float)sqrt(bc2), eps = (float)o->eps;
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        p[i] *= decay;
        m[i] = m[i] * b1 + a1 * g[i];
        v[i] = v[i] * b2 + a2 * g[i] * g[i];
        p[i] += -step * (m[i] / (sqrtf(v[i]) / bc2_sqrt + eps));
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

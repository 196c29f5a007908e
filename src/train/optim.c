#include "train/optim.h"

#include <math.h>
#include <string.h>

int lr_schedule_parse(const char *s, LrSchedule *out) {
    static const char *names[] = {"constant", "linear", "cosine"};
    for (int i = 0; i < 3; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (LrSchedule)i;
            return 1;
        }
    return 0;
}

double lr_at(LrSchedule s, double base_lr, int64_t warmup, int64_t total, int64_t step) {
    if (step < warmup) return base_lr * (double)step / (double)(warmup > 1 ? warmup : 1);
    double span = (double)(total - warmup > 1 ? total - warmup : 1);
    switch (s) {
    case LR_LINEAR: return base_lr * fmax(0.0, (double)(total - step) / span);
    case LR_COSINE: return base_lr * fmax(0.0, 0.5 * (1.0 + cos(3.14159265358979323846 * (double)(step - warmup) / span)));
    default: return base_lr;
    }
}

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

void loss_scaler_update(LossScaler *s, int overflow) {
    if (s->window == 0) return;
    if (overflow) {
        s->scale /= 2.0;
        s->good = 0;
    } else if (++s->good == s->window) {
        s->scale *= 2.0;
        s->good = 0;
    }
}

void round_to_dtype(float *dst, const float *src, size_t n, DType d) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++)
        dst[i] = d == DTYPE_BF16 ? bf16_to_f32(f32_to_bf16(src[i])) : d == DTYPE_F16 ? f16_to_f32(f32_to_f16(src[i])) : src[i];
}

// The optimiser's arithmetic over flat float slabs (the CPU backend's optimizer ops): AdamW, the
// gradient's norm, finiteness and scaling, and rounding a slab's values to bf16/fp16.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
} AdamW;

// torch.optim.AdamW on n floats: p *= 1 - lr*wd; m, v moments; bias-corrected update.
// t is the 1-based step; wd is passed per tensor (0 for biases and norms).
void adamw_update(const AdamW *o, float *p, const float *g, float *m, float *v, size_t n, double wd, int64_t t);

// The floats of one AdamW step (adamw_update's, and a device's kernel): per element
//   p *= decay; m = m b1 + a1 g; v = v b2 + a2 g g; p += -step (m / (sqrt(v) / bc2_sqrt + eps)).
typedef struct {
    float decay, b1, b2, a1, a2, step, bc2_sqrt, eps;
} AdamWConstants;

static inline AdamWConstants adamw_constants(const AdamW *o, double wd, int64_t t) {
    double bc1 = 1.0 - pow(o->beta1, (double)t), bc2 = 1.0 - pow(o->beta2, (double)t);
    AdamWConstants k = {(float)(1.0 - o->lr * wd), (float)o->beta1, (float)o->beta2, (float)(1.0 - o->beta1),
                        (float)(1.0 - o->beta2), (float)(o->lr / bc1), (float)sqrt(bc2), (float)o->eps};
    return k;
}

// L2 norm of the slab (accumulated in double).
double grad_norm(const float *g, size_t n);
void grad_scale(float *g, size_t n, float s);
int grad_all_finite(const float *g, size_t n);

// dst = src rounded to bf16 / f16 (kept as fp32 values: the CPU backend's sgemm is fp32), or copied for F32.
void round_to_dtype(float *dst, const float *src, size_t n, DType d);

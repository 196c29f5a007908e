// The optimiser's arithmetic over flat float slabs (the CPU backend's optimizer ops): AdamW, the
// gradient's norm, finiteness and scaling, and rounding a slab's values to bf16/fp16.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
} AdamW;

// torch.optim.AdamW on n floats: p *= 1 - lr*wd; m, v moments; bias-corrected update.
// t is the 1-based step; wd is passed per tensor (0 for biases and norms).
void adamw_update(const AdamW *o, float *p, const float *g, float *m, float *v, size_t n, double wd, int64_t t);

// L2 norm of the slab (accumulated in double).
double grad_norm(const float *g, size_t n);
void grad_scale(float *g, size_t n, float s);
int grad_all_finite(const float *g, size_t n);

// dst = src rounded to bf16 / f16 (kept as fp32 values: the CPU backend's sgemm is fp32), or copied for F32.
void round_to_dtype(float *dst, const float *src, size_t n, DType d);

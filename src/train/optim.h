// Optimiser machinery over flat float slabs: AdamW, global-norm clipping, LR schedules,
// the fp16 loss-scale manager and the low-precision compute copy of the weights.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

typedef enum { LR_CONSTANT, LR_LINEAR, LR_COSINE } LrSchedule;

// Parses "constant" | "linear" | "cosine"; returns 0 when unknown.
int lr_schedule_parse(const char *s, LrSchedule *out);
// Hugging Face's get_{constant,linear,cosine}_schedule_with_warmup: the multiplier at the 0-based
// optimiser step `step` of `total` (so with warmup the first step runs at lr 0, as in HF).
double lr_at(LrSchedule s, double base_lr, int64_t warmup, int64_t total, int64_t step);

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

// Dynamic loss scaling for fp16: halve on overflow, double after `window` clean steps
// (window 0: static scale).
typedef struct {
    double scale;
    int64_t window, good;
} LossScaler;
void loss_scaler_update(LossScaler *s, int overflow);

// dst = src rounded to bf16 / f16 (kept as fp32 values: the CPU backend's sgemm is fp32), or copied for F32.
void round_to_dtype(float *dst, const float *src, size_t n, DType d);

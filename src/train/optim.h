// The optimiser's schedule and state: LR schedules and the fp16 loss-scale manager (the arithmetic over
// slabs is the backend's: nn/optim.h on the CPU).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "nn/optim.h"  // AdamW

typedef enum { LR_CONSTANT, LR_LINEAR, LR_COSINE } LrSchedule;

// Parses "constant" | "linear" | "cosine"; returns 0 when unknown.
int lr_schedule_parse(const char *s, LrSchedule *out);
// Hugging Face's get_{constant,linear,cosine}_schedule_with_warmup: the multiplier at the 0-based
// optimiser step `step` of `total` (so with warmup the first step runs at lr 0, as in HF).
double lr_at(LrSchedule s, double base_lr, int64_t warmup, int64_t total, int64_t step);

// Dynamic loss scaling for fp16: halve on overflow, double after `window` clean steps
// (window 0: static scale).
typedef struct {
    double scale;
    int64_t window, good;
} LossScaler;
void loss_scaler_update(LossScaler *s, int overflow);

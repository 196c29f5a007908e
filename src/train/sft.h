// Supervised fine-tuning: the training core (forward/backward, accumulation, clipping, AdamW,
// mixed precision, checkpoints) driven by a dataset of prompt/completion pairs.
#pragma once
#include <stdint.h>

#include "base/dtype.h"
#include "train/optim.h"
#include "train/trainer.h"

typedef struct {
    const char *model_dir, *data_path, *out_dir;
    const char *device;  // where training runs: cpu, cuda[:N], emu
    int64_t steps;  // 0: one epoch
    int64_t batch_size, micro_batch_size, warmup, save_every, keep, max_length, max_skips;
    int filter_overlong;  // skip rows whose prompt alone reaches max_length (else an error)
    int64_t min_pixels, max_pixels;  // a vision-language model's resize bounds (0: its preprocessor_config.json)
    AdamW adam;     // lr, betas, eps, weight decay
    double clip;    // 0: off
    LrSchedule schedule;
    uint64_t seed;
    DType save_dtype, precision;  // precision: the compute copy's format (F32: none)
    double loss_scale;            // fp16: initial scale
    int64_t loss_scale_window;    // fp16: clean steps before the scale doubles; 0 = static
    int resume, recompute, shuffle;
    int offload_params;           // a device's fp32 master and optimizer on the host (Trainer.params_on_host)
    int force;                    // replace a previous run in out_dir (its checkpoints and files)
    double dist_timeout_s;        // under mpirun: see grpo train's dist.* and compression.* keys
    int zero, pin_cpu;            // pin_cpu: 1 = "block"
    double topk_ratio;            // 0: dense all-reduce
    TrainerLora lora;             // rank 0 and no adapter: full fine-tuning
} SftConfig;

// Under `mpirun -np N` every rank calls it: rank r trains on the r-th N-th of every batch, gradients
// are averaged over the ranks, rank 0 alone prints and writes files.
void sft_run(const SftConfig *cfg);

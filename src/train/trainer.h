// The optimiser side of a training step, shared by SFT and GRPO: fp32 master weights with an
// optional bf16/fp16 compute copy, the gradient slab, Adam moments, loss scaling, the
// non-finite check that skips a step, global-norm clipping and AdamW.
//
//   const Decoder *cm = trainer_begin_step(&t);   // compute weights; grads zeroed
//   ... forward/backward of each micro-batch into t.grads, dlogp multiplied by t.scaler.scale ...
//   double norm = trainer_apply(&t, lr, loss_finite);   // NAN when the step was skipped
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "parallel/comm.h"
#include "parallel/topk.h"
#include "model/lora.h"
#include "model/decoder.h"
#include "model/vision.h"
#include "train/checkpoint.h"
#include "train/optim.h"

// LoRA training (TrainerLora.spec.rank > 0 or an adapter to start from): the base is loaded frozen in
// base_dtype and the adapters are what the optimiser trains.
typedef struct {
    LoraSpec spec;        // rank 0 and no adapter: full fine-tuning
    DType base_dtype;     // the frozen base's storage: DTYPE_F32 or DTYPE_BF16
    const char *adapter;  // start from this PEFT adapter directory (its adapter_config.json sets spec), or NULL
    uint64_t seed;        // of A's initialisation
} TrainerLora;

typedef struct {
    const Backend *be;  // where the passes run: the compute weights and the gradients (the master's backend unless
                        // params_on_host)
    int params_on_host; // a device run's fp32 master, its moments and AdamW on the host (the CPU backend): the
                        // device holds the compute copy and the gradients, downloaded into hgrads for each step
    float *hgrads;      // params_on_host: the gradients on the host, where the optimizer steps with them
    AdamW adam;
    double clip;      // 0: off
    DType precision;  // compute copy: F32 (none), BF16 or F16
    Decoder master, compute;  // with LoRA, master is the frozen base with the adapters attached
    int compute_stale;     // the master changed since compute was last rounded from it
    int has_lora;
    Lora lora;             // the adapters (has_lora)
    float *w;              // the trained fp32 slab: master's weights, or the adapters
    float *grads, *m, *v;  // w's layout
    size_t n;              // elements of w
    DecoderTensor *tensors;  // w's tensors: AdamW's weight-decay groups, checkpoint names
    int n_tensors;
    LossScaler scaler;     // scale 1 unless fp16
    TrainState st;         // step counters and loss-scale state, as checkpointed
    int offloaded, offload_fd;  // m and v live off the backend's memory (trainer_offload_init)
    float *offload_map;         // there: m then v. A host run's is a file-backed mapping (fd offload_fd), m and v
                                // point into it; a device's is pinned host memory (m, v NULL), which AdamW streams
                                // through stage
    float *stage[2];            // a device's two staging buffers: TRAINER_OFFLOAD_CHUNK floats of m, then of v
    // Data parallelism (trainer_set_dist): gradients are averaged over comm's ranks before the step.
    Comm *comm;            // NULL: one process
    int zero;              // 0: full moments on every rank; 1: each rank keeps and updates only its
                           // shard [lo, hi) of the moments and parameters, then the parameters are
                           // all-gathered; 2: as 1, and gradients are reduce-scattered, not all-reduced
    size_t lo, hi;         // this rank's shard of the slab ([0, n) without ZeRO); m, v hold hi - lo
    float *gshard;         // ZeRO-2: the reduce-scattered gradient shard
    TopK topk;             // compression.type topk (ratio 0: off); its residual is not checkpointed
    double topk_scale;     // the loss scale topk.residual was made at
    int nccl;              // a device's ranks average and gather through its own collectives (Backend.dist_*)
    float *host;           // else a device's gradients and parameters cross processes through host memory (MPI):
                           // n floats, then a shard (ZeRO-2's reduce-scatter); NULL on the CPU or in one process
} Trainer;

// be: where the slabs live and the passes and optimizer run (the backend must have every training op: refused in
// one line before any work otherwise). lora: NULL or rank 0 without an adapter for full fine-tuning (precision must
// be F32 with LoRA). params_on_host: a device's full fine-tuning keeps the fp32 master and the optimizer on the host
// (Trainer.params_on_host; not with LoRA or a trained merger).
// train_merger: a VL model's tower whose patch merger is trained too (its tensors join the slab after the
// language model's: DecoderConfig.merger_in), or NULL (full fine-tuning only).
void trainer_init(Trainer *t, const Backend *be, const char *model_dir, AdamW adam, double clip, DType precision,
                  double loss_scale, int64_t loss_scale_window, const TrainerLora *lora,
                  const VisionConfig *train_merger, int params_on_host);
void trainer_free(Trainer *t);
// Makes the trainer one of comm's ranks: ZeRO stage 0, 1 or 2 (see Trainer.zero) and top-k gradient
// compression with error feedback at topk_ratio (0: off; only with ZeRO 0). Before trainer_load and
// trainer_offload_init. With comm->size 1 only the compression applies (to one rank's gradient).
// Dies with one line naming `option` (which asked for the master on the host) when it cannot apply: a CPU run (its
// master is host memory already; `device` names the option that chose it), LoRA (no master: a frozen base and small
// adapters) or a trained merger.
void trainer_check_params_on_host(const Backend *be, const char *device, const char *option, int lora,
                                  int train_merger);
void trainer_set_dist(Trainer *t, Comm *comm, int zero, double topk_ratio);
// Moves the Adam moments into a shared mapping of an (unlinked) temporary file in dir, so that
// trainer_offload can give their memory back while they are not needed (GRPO's rollout). On a device they leave
// device memory for good, for pinned host memory (dir unused): AdamW streams them through two staging buffers
// (Backend.adamw_host_moments), the copies overlapping the device's AdamW.
#define TRAINER_OFFLOAD_CHUNK ((size_t)1 << 24)
void trainer_offload_init(Trainer *t, const char *dir);
// Writes the moments to their file and drops them from memory and the page cache; the next AdamW
// reads them back on first touch. No-op without trainer_offload_init, or on a device.
void trainer_offload(Trainer *t);
// A compute copy of precision p (F32, BF16 or F16) is stored as compute_storage(p): bf16 in 2 bytes a
// parameter; fp16 values in fp32 (the CPU has no fast fp16 products), rounded to fp16.
DType compute_storage(DType precision);
// dst (built with compute_storage(precision)) = master's fp32 weights rounded to precision (dst's n_params of
// them: a reference without the master's trained merger). dst may be on a device and master on the host: rounded
// there a chunk at a time, then uploaded.
void compute_copy_round(Decoder *dst, const Decoder *master, DType precision);
// The weights forward passes must use: the master, or the compute copy refreshed from it.
const Decoder *trainer_weights(Trainer *t);
// The base with any adapters switched off (GRPO's reference under LoRA): a view of master's weights.
Decoder trainer_base(const Trainer *t);
// trainer_weights, with the gradients zeroed for a new step.
const Decoder *trainer_begin_step(Trainer *t);
// Ends a step (st.step += 1): averages the gradients over the ranks, skips the step when the loss
// (on any rank) or any gradient is not finite, else unscales, clips and applies AdamW at lr.
// Returns the pre-clip gradient norm, NAN for a skipped step. Collective: every rank calls it.
double trainer_apply(Trainer *t, double lr, int loss_finite);
// Collective, once per step: the SIGINT/SIGTERM any rank received (stop_signal), 0 if none, so every
// rank stops after the same step.
int trainer_stop_signal(Trainer *t);
// After signal sig: a checkpoint of the step just finished (trainer_save), and on rank 0 a line saying
// where it is and how to go on (`step`: the loop's count of steps done; `resume`: the option that
// continues). Collective.
void trainer_save_on_signal(Trainer *t, int sig, int64_t step, const char *cmd, const char *resume,
                            const char *out, DType save_dtype, const char *model_dir, int64_t keep);
// Collective; rank 0 writes (ZeRO moments are gathered to it first), so a checkpoint's files are those
// of a single-process run. Loading reads the whole moments on every rank, then keeps its shard.
void trainer_save(Trainer *t, const char *out, DType save_dtype, const char *model_dir, int64_t keep);
// Restores weights, moments and st from a checkpoint directory.
void trainer_load(Trainer *t, const char *dir);
// The trained result into dir: a Hugging Face model (weights in save_dtype), or with LoRA the PEFT
// adapter files (fp32). Tokenizer files are the caller's (copy_model_extras).
void trainer_save_result(const Trainer *t, const char *dir, DType save_dtype, const char *model_dir);

// Training checkpoints: OUT/checkpoint-<step>/ holds the model as a Hugging Face directory
// (config.json, model.safetensors, tokenizer files; with LoRA the PEFT adapter files instead) plus optimizer.safetensors (Adam moments,
// and the fp32 master weights when the model file is bf16) and trainer_state.json.
// Written into OUT/.checkpoint-<step>.tmp, fsync'd, then renamed: a crash leaves the previous
// checkpoints intact and at worst a .tmp (or .del) directory, which the next save removes.
#pragma once
#include <stdint.h>

#include "base/dtype.h"
#include "model/decoder.h"

typedef struct {
    int64_t step;          // optimiser steps taken (skipped ones included)
    int64_t iteration;     // GRPO steps (rollout + update) completed; 0 for SFT
    int64_t adam_t;        // AdamW updates applied (its bias-correction count)
    int64_t skips_in_row;  // consecutive skipped steps
    double loss_scale;
    int64_t good_steps;    // clean steps since the loss scale last changed
    int64_t prompts_seen;  // GRPO: positions of the prompt stream used (dynamic sampling can take more a step)
    // The run's identity, checked on resume.
    uint64_t seed;
    int64_t batch_size, data_lines;
    int shuffle;
} TrainState;

// lora: NULL, or the adapters being trained (with master their frozen base): the checkpoint then holds
// the PEFT adapter files instead of the model, and the moments are the adapters'. m, v: host memory; master and
// lora may be a device's (their weights are downloaded for the files).
void checkpoint_save(const char *out, const Decoder *master, const Lora *lora, const float *m, const float *v,
                     DType save_dtype, const char *model_dir, const TrainState *s, int64_t keep);
// The trained tensors (malloc'd; *n their count): master's, or with LoRA the adapters' (PEFT names).
DecoderTensor *checkpoint_tensors(const Decoder *master, const Lora *lora, int *n);
// Deletes all but the newest `keep` checkpoints.
void checkpoint_prune(const char *out, int64_t keep);
// The newest OUT/checkpoint-<N> (malloc'd), or NULL when there is none.
char *checkpoint_latest(const char *out);
// Restores master weights (or lora's adapters; either may be in a device's memory: staged through the host), the
// moments m and v (host memory) and state; dies naming the file and tensor/key on any mismatch.
void checkpoint_load(const char *dir, Decoder *master, Lora *lora, float *m, float *v, TrainState *s);
// How a command names its options, for messages: {"--out", "--resume", "--force", "--model"} or
// {"trainer.out_dir", "trainer.resume=true", "trainer.overwrite=true", "model.path"}.
typedef struct {
    const char *out, *resume, *force, *model;
} RunDirOpts;
// Makes OUT ready for a run; returns the newest checkpoint to resume from (malloc'd) when resuming, else
// NULL. Dies when OUT is model_dir, when resuming finds no checkpoint, and when a new run would replace a
// previous one (checkpoints, a trained model or adapter, metrics.jsonl) unless force: then, when
// `remove` (the rank that writes), that run's checkpoints and files are deleted first. Other files stay.
char *run_dir_claim(const char *out, const char *model_dir, int resume, int force, int remove,
                    const RunDirOpts *o);
// The run a checkpoint was made by (saved) against this one (now): dies naming the first of seed, batch
// size, data file and shuffle that differs, with both values. keys: the command's names for those four.
void checkpoint_check_run(const char *ckpt, const TrainState *saved, const TrainState *now,
                          const char *const keys[4]);
// Copies the tokenizer, generation, chat template and image processor files of a model directory into another.
void copy_model_extras(const char *from_dir, const char *to_dir);
// On resume: drops the records of metrics.jsonl at `path` whose "step" is past `step` (about to be redone).
void metrics_truncate(const char *path, int64_t step);

// GRPO, fully colocated: one process holds the policy (trainer), the frozen reference and the
// rollout engine, which reads the policy's own weight buffers. One step:
// rollout -> rewards -> group advantages -> reference logprobs -> clipped-ratio update -> metrics.
#pragma once
#include <stdint.h>

#include "base/dtype.h"
#include "model/decoder.h"
#include "rl/grpo_loss.h"
#include "rl/reward.h"
#include "rl/reward_judge.h"
#include "nn/sampler.h"
#include "train/grpo/config.h"
#include "train/optim.h"
#include "train/trainer.h"

typedef struct {
    const GrpoConfig *config;    // what was resolved (saved to OUT/config.yaml)
    const char *model_dir, *out_dir;
    const char *device;          // trainer.device
    const char *const *train_files, *const *val_files;  // data.train_file, data.val_file: paths
    int n_train_files, n_val_files;
    int filter_overlong;         // data.filter_overlong_prompts: skip longer prompts (else an error)
    int by_data_source;          // reward.by_data_source: each row's data_source picks gsm8k or boxed
    const char *prompt_key, *answer_key, *image_key;
    int64_t min_pixels, max_pixels;  // data.min_pixels, data.max_pixels: a VL model's resize bounds (0: its own)
    int chat_template;           // render prompts as a user turn of the chat template (else raw)
    int enable_thinking;         // Qwen3 templates: 0 opens the answer with an empty think block
    const char *chat_template_kwargs;  // JSON of an object: more template variables
    int64_t train_batch_size;    // prompts per step
    int64_t gen_batch_size;      // dynamic sampling: prompts per generation batch
    int64_t max_num_gen_batches; // dynamic sampling: generation batches a step may take (0: no limit)
    int G;                       // samples per prompt (rollout.n)
    int64_t max_prompt_length, max_response_length;
    SamplerConfig sampler;
    SamplerConfig val_sampler;   // rollout.val_kwargs
    int val_n;
    int rollout_int8;            // rollout.weight_dtype: int8 (decode reads Q8_0 copies of the policy)
    RewardSpec rewards[REWARD_MAX_SPECS];
    int n_rewards;
    int norm_adv_by_std, dynamic_sampling, use_kl_in_reward, mask_truncated;
    int filter_acc;              // dynamic sampling compares correctness (else the reward)
    AdvEstimator adv_estimator;
    int rollout_is;              // algorithm.rollout_correction.rollout_is: 0 off, 1 token, 2 sequence
    double rollout_is_threshold;
    int rollout_is_batch_normalize;
    RolloutRs rollout_rs;        // algorithm.rollout_correction.rollout_rs (n 0: off)
    int64_t overlong_buffer;     // DAPO soft overlong penalty: last N tokens before the limit (0: off)
    double overlong_penalty;     // penalty at the limit
    GrpoLossConfig loss;         // clip ratios, dual clip, kl coef (in the loss) / estimator, aggregation
    int64_t ppo_epochs, mini_batch_size, micro_batch_size;  // in sequences
    AdamW adam;
    double grad_clip;
    LrSchedule schedule;
    int64_t warmup, steps;       // steps 0: `epochs` passes over the prompts
    int64_t epochs;
    DType precision, ref_dtype, save_dtype;
    double loss_scale;           // fp16
    int64_t loss_scale_window, max_skips;
    int recompute, offload_optimizer, offload_params, shuffle;
    int train_merger;            // actor.vision.train_merger
    uint64_t seed;
    int64_t save_every, keep, val_every;
    int val_before_train;
    int dump_samples;            // write every step's samples to OUT/samples.jsonl
    int resume, overwrite;       // overwrite: replace a previous run in out_dir
    const char *const *stop;     // rollout stop strings
    int n_stop;
    const char *tools_file;      // multi-turn rollout with tools (NULL: single turn)
    int max_turns, max_parallel_calls;
    double tool_timeout_s, tool_memory_mb;
    double dist_timeout_s;       // data parallel under mpirun (dist.*, compression.*)
    int zero, pin_cpu;
    double topk_ratio;           // 0: dense all-reduce
    TrainerLora lora;            // actor.lora.*, model.adapter (rank 0, no adapter: full fine-tuning)
    const char *rm_path;         // reward.reward_model (NULL: none)
    double rm_weight;
    DType rm_dtype;
    int64_t rm_max_length, rm_micro;  // tokens a conversation (the user's or the default), conversations a forward
    int rm_length_asked;              // rm_max_length is the user's
    RewardJudgeConfig judge;     // reward.judge (model_path NULL: none; max_length resolved)
    double judge_weight;
} GrpoSettings;

// The loop's view of a configuration: verl-style keys resolved into what one step needs (mini-batches
// in sequences, reward specs, which KL goes where). Points into c, which must outlive s.
void grpo_settings_resolve(GrpoSettings *s, const GrpoConfig *c);
// LoRA is on (actor.lora.rank > 0 or model.adapter).
int grpo_has_lora(const GrpoSettings *s);

// The run's memory plan, in bytes. Fixed slabs live for the whole run; one workspace arena is the
// KV cache (+ decode activations) during rollout and the training activations during scoring and
// the update, so the peak is fixed + max(rollout, update), not fixed + rollout + update.
typedef struct {
    size_t policy, compute, grads, moments, reference;  // fixed slabs (compute: the bf16/fp16 copy; 0 in f32;
                                                         // grads include ZeRO-2's shard buffer and
                                                         // top-k's residual; LoRA: policy is the frozen
                                                         // base + adapters, the rest the adapters', and
                                                         // the reference 0: the base, adapters off)
    size_t rollout, update;  // the workspace's two uses, at the configured batch and length limits
    size_t workspace;        // max(rollout, update)
    size_t fixed, peak, sum; // the fixed slabs; fixed + workspace; fixed + rollout + update
    size_t offloaded;        // moments held in a file-backed mapping during rollout (actor.offload_optimizer)
    size_t host;             // actor.offload_params on a device: the master, its moments and the optimizer's
                             // gradients in host memory (not in policy, moments or grads)
    size_t vision;           // a VL model's frozen vision tower (fp32; in fixed)
    size_t images;           // and beside the workspace: a step's image features (one image a prompt at the
                             // processor's max_pixels) + the tower's forward on one such image (in peak)
    size_t backend;          // a device backend's own buffers (Backend.memory_own; in fixed)
    size_t int8;             // rollout.weight_dtype int8: the policy's Q8_0 copies and their scratch (in fixed)
    size_t reward_model;     // reward.reward_model and reward.judge: their weights and workspaces (in fixed); on a
    size_t reward_model_host;  // device, where they stay in host memory, here instead
} GrpoMemPlan;
// Per process, when s's batch is shared by `ranks` processes (1: one process); ZeRO divides the moments. be: where
// the model runs (its workspaces' scratch is the backend's).
void grpo_memory_plan(const GrpoSettings *s, const DecoderConfig *c, const Backend *be, int ranks, GrpoMemPlan *p);
// The plan in GiB as one line: "policy 0.92 + compute copy ... -> peak 10.55 (not shared: 10.74)" (malloc'd).
char *grpo_plan_text(const GrpoMemPlan *p);
// The run; under `mpirun -np N` every rank calls it: rank r takes the r-th N-th of each step's prompts
// (and of each mini-batch), gradients are averaged over the ranks, rank 0 alone prints and writes files.
void grpo_run(const GrpoSettings *s);

// GRPO, fully colocated: one process holds the policy (trainer), the frozen reference and the
// rollout engine, which reads the policy's own weight buffers. One step:
// rollout -> rewards -> group advantages -> reference logprobs -> clipped-ratio update -> metrics.
#pragma once
#include <stdint.h>

#include "base/dtype.h"
#include "rl/grpo_loss.h"
#include "rl/reward.h"
#include "rollout/sampler.h"
#include "train/grpo_config.h"
#include "train/optim.h"

typedef struct {
    const char *model_dir, *train_file, *val_file, *out_dir;
    const char *prompt_key, *answer_key;
    int chat_template;           // render prompts as a user turn of the chat template (else raw)
    int64_t train_batch_size;    // prompts per step
    int G;                       // samples per prompt (rollout.n)
    int64_t max_prompt_length, max_response_length;
    SamplerConfig sampler;
    RewardSpec rewards[REWARD_MAX_SPECS];
    int n_rewards;
    int norm_adv_by_std, dynamic_sampling, use_kl_in_reward, mask_truncated;
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
    int recompute, shuffle;
    uint64_t seed;
    int64_t save_every, keep, val_every;
    int val_before_train;
    int dump_samples;            // write every step's samples to OUT/samples.jsonl
    int resume;
    const char *const *stop;     // rollout stop strings
    int n_stop;
} GrpoSettings;

// The loop's view of a configuration: verl-style keys resolved into what one step needs (mini-batches
// in sequences, reward specs, which KL goes where). Points into c, which must outlive s.
void grpo_settings_resolve(GrpoSettings *s, const GrpoConfig *c);
void grpo_run(const GrpoSettings *s);

// The configuration of `grpo train`: one table of keys (name, type, default, allowed values, doc)
// read from a YAML file plus dotted key=value overrides, the convention of verl and MindSpeed-RL:
//
//   grpo train --config gsm8k.yaml actor.lr=2e-6 rollout.stop='["</answer>"]'
//
// The table is the single source of the reference documentation (`grpo_config_print_markdown`).
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "base/dtype.h"
#include "train/optim.h"

typedef struct {
    char **items;
    int n;
} GrpoStrList;

// Enum values are the positions of their spellings in the table ("k1", "k2", "k3").
typedef enum { GRPO_KL_K1, GRPO_KL_K2, GRPO_KL_K3 } GrpoKlEstimator;
typedef enum {
    GRPO_LOSS_AGG_TOKEN_MEAN,               // "token-mean"
    GRPO_LOSS_AGG_SEQ_MEAN_TOKEN_MEAN,      // "seq-mean-token-mean"
    GRPO_LOSS_AGG_SEQ_MEAN_TOKEN_SUM_NORM,  // "seq-mean-token-sum-norm" (Dr. GRPO)
} GrpoLossAgg;

// Strings are owned (freed by grpo_config_free); NULL where the key is null. Integer keys whose
// null means "automatic" (trainer.steps, actor.mini_batch_size, ...) hold 0 for null.
typedef struct {
    GrpoStrList train_file, val_file;  // one path or several
    char *prompt_key, *answer_key, *image_key;
    int chat_template, enable_thinking, shuffle, filter_overlong_prompts;
    char *chat_template_kwargs;  // JSON of an object
    int64_t train_batch_size, max_prompt_length, max_response_length, epochs, val_max_samples;
    int64_t gen_batch_size;  // 0: train_batch_size
    int64_t min_pixels, max_pixels;  // 0: the model's preprocessor_config.json
} GrpoDataConfig;

typedef struct {
    char *path;
    DType ref_dtype;  // DTYPE_F32 or DTYPE_BF16
    char *adapter;    // PEFT LoRA adapter to continue from (NULL: none)
} GrpoModelConfig;

typedef struct {
    int64_t n, top_k;
    double temperature, top_p;
    int weight_dtype;  // 0: the policy's weights; 1: int8 copies (GrpoSettings.rollout_int8)
    GrpoStrList stop;
    struct {
        int64_t n, top_k;
        double temperature, top_p;
    } val_kwargs;  // validation's sampling (verl's rollout.val_kwargs)
    struct {
        char *tools_file;  // NULL: single-turn rollout
        int64_t max_turns, max_parallel_calls;
        double tool_timeout_s, tool_memory_mb;
    } multi_turn;
} GrpoRolloutConfig;

typedef enum { GRPO_GSM8K_STRICT, GRPO_GSM8K_FLEXIBLE } GrpoGsm8kMethod;

// A reward kind is on when its weight is non-zero; the reward is the weighted sum. The options are
// those of rl/reward.h's RewardSpec (verl's compute_score arguments).
typedef struct {
    struct {
        double weight, score, format_score;
        GrpoGsm8kMethod method;
        int64_t clip_chars;  // 0: search the whole response
    } gsm8k;
    struct {
        double weight, score, format_score;
    } boxed;
    struct {
        double weight;
        char *regex;
        int dotall;
    } format;
    struct {
        double weight;
    } exact;
    struct {
        double weight, timeout_s, grace_s, memory_mb;
        char *command;
    } program;
    struct {
        char *model_path;  // NULL: no reward model
        double weight;
        DType dtype;       // DTYPE_F32 or DTYPE_BF16
        int64_t max_length, micro_batch_size;  // max_length 0: the data's limits + 256
    } reward_model;
    struct {
        char *model_path;  // NULL: no judge
        double weight, failure_score;
        DType dtype;
        char *rubric, *regex;
        int64_t max_new_tokens, max_length, micro_batch_size;  // max_length 0: the data's limits + 512 + new tokens
    } judge;
    struct {
        int64_t len;  // 0: off
        double penalty_factor;
    } overlong_buffer;
    int strip_think;  // gsm8k, boxed, exact score what follows the last </think>
    int by_data_source;  // each row's data_source chooses gsm8k or boxed (verl's default scorer)
} GrpoRewardConfig;

// What dynamic sampling tests for flat groups (verl's algorithm.filter_groups.metric).
typedef enum { GRPO_FILTER_ACC, GRPO_FILTER_SEQ_REWARD, GRPO_FILTER_SEQ_FINAL_REWARD } GrpoFilterMetric;

typedef struct {
    int norm_adv_by_std, dynamic_sampling, mask_truncated, use_kl_in_reward;
    GrpoFilterMetric filter_metric;
    int64_t max_num_gen_batches;  // 0: no limit
    int adv_estimator;  // AdvEstimator (rl/grpo_loss.h), in its order
    struct {
        int rollout_is;  // 0 off, 1 token, 2 sequence
        double rollout_is_threshold;
        int rollout_is_batch_normalize;
        char *rollout_rs, *rollout_rs_threshold;  // NULL: off (rl/grpo_loss.h: rollout_rs_parse)
    } rollout_correction;
    double kl_coef;
    GrpoKlEstimator kl_penalty;
} GrpoAlgorithmConfig;

typedef struct {
    int64_t ppo_epochs, mini_batch_size, micro_batch_size;  // mini: prompts; micro: responses; 0: all
    double clip_ratio_low, clip_ratio_high, clip_ratio_c;   // clip_ratio_c 0: no dual clip
    struct {
        int loss_mode;  // PolicyLossMode (rl/grpo_loss.h), in its order
        double clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio, ppo_kl_coef;  // clip_cov, kl_cov
    } policy_loss;
    double tau_pos, tau_neg;  // sapo
    GrpoLossAgg loss_agg_mode;
    double entropy_coeff;
    int use_kl_loss;
    double kl_loss_coef;
    GrpoKlEstimator kl_loss_type;
    double lr, weight_decay, beta1, beta2, adam_eps, grad_clip;
    LrSchedule lr_schedule;
    int64_t lr_warmup_steps;
    DType precision;  // DTYPE_F32, DTYPE_BF16 or DTYPE_F16
    double loss_scale;
    int64_t loss_scale_window;
    int recompute, offload_optimizer, offload_params;
    struct {
        int train_merger;
    } vision;
    struct {
        int64_t rank;  // 0: off
        double alpha, dropout;
        GrpoStrList target_modules;  // empty: all-linear
        DType base_dtype;            // DTYPE_F32 or DTYPE_BF16
    } lora;
} GrpoActorConfig;

typedef struct {
    int64_t steps;  // 0: data.epochs passes over the training prompts
    uint64_t seed;
    char *out_dir;
    char *device;  // where training runs: cpu, cuda[:N], emu
    int resume, overwrite;
    int64_t save_every, keep;
    DType save_dtype;
    int64_t val_every;
    int val_before_train, dump_samples;
    int64_t max_skips;
} GrpoTrainerConfig;

typedef enum { GRPO_PIN_NONE, GRPO_PIN_BLOCK } GrpoPinCpu;
typedef enum { GRPO_COMPRESSION_NONE, GRPO_COMPRESSION_TOPK } GrpoCompression;

typedef struct {
    double timeout_s;
    int64_t zero;
    int pin_cpu;  // GrpoPinCpu
} GrpoDistConfig;

typedef struct {
    int type;  // GrpoCompression
    double ratio;
} GrpoCompressionConfig;

typedef struct {
    GrpoDataConfig data;
    GrpoModelConfig model;
    GrpoRolloutConfig rollout;
    GrpoRewardConfig reward;
    GrpoAlgorithmConfig algorithm;
    GrpoActorConfig actor;
    GrpoTrainerConfig trainer;
    GrpoDistConfig dist;
    GrpoCompressionConfig compression;
} GrpoConfig;

// Every key at its default. The strings are heap copies: free with grpo_config_free.
void grpo_config_defaults(GrpoConfig *c);
// Applies the YAML file (NULL: none), then the overrides "dotted.key=value" in order (each value
// read as YAML: a scalar, [a, b] or {k: v}), on top of what c holds (grpo_config_defaults, or an
// earlier load), then checks the keys against each other. Dies with one line naming the file:line
// or the override for an unknown key (and the closest known one), a bad value or a conflict.
void grpo_config_load(GrpoConfig *c, const char *yaml_path, char **overrides, int n_overrides);
// The whole configuration as one line of JSON (nested like the YAML, no newline). It reads back
// with --config as it is: JSON is YAML.
void grpo_config_print_json(const GrpoConfig *c, FILE *f);
// The whole configuration as block YAML, one key a line, nested two spaces a section; strings
// double-quoted (yaml_write_string), floats with a '.' ("1.0e-06"), so that both libyaml (--config)
// and YAML 1.1 readers such as PyYAML read the values grpo_config_print_json holds.
void grpo_config_print_yaml(const GrpoConfig *c, FILE *f);
// The reference table of every key, in Markdown.
void grpo_config_print_markdown(FILE *f);
// The table as JSON (name, type, default, allowed values, bounds, nullable, doc), for tests.
void grpo_config_print_schema(FILE *f);
void grpo_config_free(GrpoConfig *c);

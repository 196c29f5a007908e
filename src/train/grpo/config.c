#include "train/grpo/config.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "base/yaml.h"
#include "model/lora.h"
#include "rl/grpo_loss.h"
#include "rl/reward_judge.h"

typedef enum { KEY_INT, KEY_FLOAT, KEY_BOOL, KEY_STRING, KEY_ENUM, KEY_LIST, KEY_MAP } KeyType;

typedef struct {
    const char *name;
    KeyType type;
    size_t offset;        // of the field in GrpoConfig: int64_t, double, int, char * (a map: its JSON),
                          // enum (int) or GrpoStrList
    const char *def;      // the default, as it would be written in YAML; NULL: null (or [] for a list)
    int64_t imin, imax;   // KEY_INT
    double fmin, fmax;    // KEY_FLOAT
    int fmin_open;        // KEY_FLOAT: fmin itself is not allowed
    const char *values;   // KEY_ENUM: the spellings, '|'-separated, in the order of the C enum
    const char *aliases;  // KEY_ENUM: other spellings accepted, "alias=value|...", e.g. verl's names
    int nullable;         // null allowed (KEY_INT: stored as 0, so imin must be above 0)
    const char *doc;
} ConfigKey;

// Enum keys store the position of their spelling straight into these fields.
_Static_assert(sizeof(GrpoKlEstimator) == sizeof(int) && sizeof(GrpoLossAgg) == sizeof(int), "enum size");
_Static_assert(sizeof(GrpoGsm8kMethod) == sizeof(int) && sizeof(GrpoFilterMetric) == sizeof(int), "enum size");
_Static_assert(sizeof(DType) == sizeof(int) && sizeof(LrSchedule) == sizeof(int), "enum size");
_Static_assert(DTYPE_F32 == 0 && DTYPE_BF16 == 1 && DTYPE_F16 == 2, "fp32|bf16|fp16 order");
_Static_assert(LR_CONSTANT == 0 && LR_LINEAR == 1 && LR_COSINE == 2, "constant|linear|cosine order");
_Static_assert(sizeof(uint64_t) == sizeof(int64_t), "trainer.seed is set as an int64_t");
_Static_assert(PG_VANILLA == 0 && PG_KL_COV == 6, "actor.policy_loss.loss_mode's spellings are PolicyLossMode's order");
_Static_assert(ADV_GRPO == 0 && ADV_REINFORCE_PP_BASELINE == 5, "algorithm.adv_estimator's are AdvEstimator's");

#define F(field) offsetof(GrpoConfig, field)
#define NOMAX INT64_MAX
#define BIG 1e30
#define VERL_KL_NAMES "kl=k1|mse=k2|low_var_kl=k3"
#define KINT(name_, field, def_, lo, hi, doc_) \
    { name_, KEY_INT, F(field), def_, .imin = lo, .imax = hi, .doc = doc_ }
#define KINT_NULL(name_, field, lo, hi, doc_) \
    { name_, KEY_INT, F(field), NULL, .imin = lo, .imax = hi, .nullable = 1, .doc = doc_ }
#define KFLOAT(name_, field, def_, lo, hi, doc_) \
    { name_, KEY_FLOAT, F(field), def_, .fmin = lo, .fmax = hi, .doc = doc_ }
#define KFLOAT_POS(name_, field, def_, hi, doc_) \
    { name_, KEY_FLOAT, F(field), def_, .fmin = 0, .fmax = hi, .fmin_open = 1, .doc = doc_ }
#define KBOOL(name_, field, def_, doc_) \
    { name_, KEY_BOOL, F(field), def_, .doc = doc_ }
#define KSTR(name_, field, def_, doc_) \
    { name_, KEY_STRING, F(field), def_, .doc = doc_ }
#define KSTR_NULL(name_, field, doc_) \
    { name_, KEY_STRING, F(field), NULL, .nullable = 1, .doc = doc_ }
#define KENUM(name_, field, def_, values_, doc_) \
    { name_, KEY_ENUM, F(field), def_, .values = values_, .doc = doc_ }
#define KENUM_ALIAS(name_, field, def_, values_, aliases_, doc_) \
    { name_, KEY_ENUM, F(field), def_, .values = values_, .aliases = aliases_, .doc = doc_ }
#define KMAP(name_, field, doc_) \
    { name_, KEY_MAP, F(field), "{}", .doc = doc_ }
#define KLIST(name_, field, doc_) \
    { name_, KEY_LIST, F(field), NULL, .doc = doc_ }

// Keys that live in the same section stay together: the JSON printer nests by runs of prefixes.
static const ConfigKey KEYS[] = {
    KLIST("data.train_file", data.train_file,
          "training prompts: a JSONL or Parquet file, or a list of them (required; `grpo train` alone runs the demo)"),
    KLIST("data.val_file", data.val_file, "validation prompts for greedy pass@1, same layout (null: none)"),
    KSTR("data.prompt_key", data.prompt_key, "prompt",
         "field of a row holding the prompt: a string (GSM8K: `question`) or a list of chat messages (verl)"),
    KSTR("data.answer_key", data.answer_key, "answer",
         "field holding the ground truth the rewards compare with; dotted for nested fields (verl: "
         "`reward_model.ground_truth`)"),
    KSTR("data.image_key", data.image_key, "images",
         "field holding a vision-language row's images: files relative to the data file, each standing where "
         "the prompt has an `<image>` (verl/EasyR1 geometry3k)"),
    KINT_NULL("data.min_pixels", data.min_pixels, 1, NOMAX,
              "vision-language models: the image processor's min_pixels (null: the model's preprocessor_config.json)"),
    KINT_NULL("data.max_pixels", data.max_pixels, 1, NOMAX,
              "vision-language models: the image processor's max_pixels, which bounds an image's tokens (null: "
              "the model's)"),
    KBOOL("data.filter_overlong_prompts", data.filter_overlong_prompts, "false",
          "skip (and count) prompts longer than data.max_prompt_length instead of stopping with an error"),
    KBOOL("data.chat_template", data.chat_template, "true",
          "render each prompt as one user turn with the tokenizer's chat template; false: the raw text"),
    KBOOL("data.enable_thinking", data.enable_thinking, "true",
          "Qwen3 chat templates: false renders the assistant prompt with an empty think block (no reasoning); "
          "others ignore it"),
    KMAP("data.chat_template_kwargs", data.chat_template_kwargs,
         "more variables for the chat template, e.g. {enable_thinking: false}; each may also be given alone as "
         "data.chat_template_kwargs.NAME=VALUE (verl's data.apply_chat_template_kwargs is read the same)"),
    KINT("data.train_batch_size", data.train_batch_size, "8", 1, INT32_MAX,
         "prompts per step; each is sampled rollout.n times"),
    KINT_NULL("data.gen_batch_size", data.gen_batch_size, 1, INT32_MAX,
              "dynamic sampling: prompts per generation batch; batches are generated until data.train_batch_size "
              "groups pass the filter, the surplus dropped; a multiple of actor.mini_batch_size (null: "
              "data.train_batch_size; DAPO's scripts: 3x it)"),
    KINT("data.max_prompt_length", data.max_prompt_length, "512", 1, INT32_MAX,
         "longest prompt in tokens, after the chat template; a longer one is an error naming its line"),
    KINT("data.max_response_length", data.max_response_length, "256", 1, INT32_MAX,
         "most tokens generated per response"),
    KBOOL("data.shuffle", data.shuffle, "true", "shuffle the prompts every epoch, seeded by trainer.seed"),
    KINT("data.epochs", data.epochs, "1", 1, INT32_MAX, "passes over data.train_file when trainer.steps is null"),
    KINT_NULL("data.val_max_samples", data.val_max_samples, 1, NOMAX,
              "validate on the first N prompts of data.val_file only (null: all)"),

    KSTR_NULL(
        "model.path", model.path,
        "Hugging Face model directory (config.json, *.safetensors, tokenizer.json); required"),
    KENUM("model.ref_dtype", model.ref_dtype, "f32", "f32|bf16",
          "storage of the frozen reference weights; bf16 halves them (and scores in bf16). With LoRA there is no "
          "copy: the reference is the base with the adapters off"),
    KSTR_NULL("model.adapter", model.adapter,
              "PEFT LoRA adapter directory to continue training from (turns LoRA on; its adapter_config.json sets "
              "r, lora_alpha and target_modules)"),

    KINT("rollout.n", rollout.n, "8", 2, INT32_MAX,
         "responses sampled per prompt: the group size G (MindSpeed-RL: n_samples_per_prompt)"),
    KFLOAT("rollout.temperature", rollout.temperature, "1.0", 0, 100, "sampling temperature (0: greedy)"),
    KFLOAT_POS("rollout.top_p", rollout.top_p, "1.0", 1,
               "sample from the smallest set of tokens holding this much probability (1: off)"),
    KINT("rollout.top_k", rollout.top_k, "0", 0, INT32_MAX, "sample from the k most likely tokens (0: off)"),
    KENUM("rollout.weight_dtype", rollout.weight_dtype, "policy", "policy|int8",
          "the weights decode reads: the policy's own (actor.precision), or int8 copies of them (Q8_0: 1.06 bytes "
          "a weight, made after each update) in forwards of up to 16 rows, where decode is memory-bound: steps of "
          "up to 16 sequences (a wave's last steps, or every step when rollout.n x data.train_batch_size <= 16 per "
          "process); larger steps and prefills read the policy's; the loss's log-probs come from the training "
          "forward either way. CPU only"),
    KINT("rollout.val_kwargs.n", rollout.val_kwargs.n, "1", 1, 1024,
         "validation: responses sampled per validation prompt; metrics report mean@n, pass@k (k = 1, 2, 4, ... n) "
         "and maj@n per data_source (verl's val_kwargs)"),
    KFLOAT("rollout.val_kwargs.temperature", rollout.val_kwargs.temperature, "0.0", 0, 100,
           "validation's sampling temperature (0: greedy, verl's do_sample false)"),
    KFLOAT_POS("rollout.val_kwargs.top_p", rollout.val_kwargs.top_p, "1.0", 1, "validation's top-p (1: off)"),
    KINT("rollout.val_kwargs.top_k", rollout.val_kwargs.top_k, "0", 0, INT32_MAX, "validation's top-k (0: off)"),
    KLIST("rollout.stop", rollout.stop,
          "strings that end a response, e.g. [\"</answer>\"]; a single string is a list of one"),
    KSTR_NULL("rollout.multi_turn.tools_file", rollout.multi_turn.tools_file,
              "multi-turn rollout with tools: a JSON array of function schemas, each with its \"command\" (README: "
              "Tools); the prompts list them, a response's tool calls are answered in the same sequence (null: off)"),
    KINT("rollout.multi_turn.max_turns", rollout.multi_turn.max_turns, "5", 1, INT32_MAX,
         "tool calls a response may make; the response budget (data.max_response_length) covers the tool turns"),
    KINT("rollout.multi_turn.max_parallel_calls", rollout.multi_turn.max_parallel_calls, "4", 1, 256,
         "tool calls of different responses run side by side, up to this many (each tool started as many times)"),
    KFLOAT_POS("rollout.multi_turn.tool_timeout_s", rollout.multi_turn.tool_timeout_s, "10.0", 86400,
               "seconds a tool call may take (a tool's own \"timeout_s\" wins); past it the response reads an error"),
    KFLOAT("rollout.multi_turn.tool_memory_mb", rollout.multi_turn.tool_memory_mb, "16384", 0, 1e9,
           "address-space limit (RLIMIT_DATA) of each tool process in MiB (0: none)"),

    KFLOAT("reward.gsm8k.weight", reward.gsm8k.weight, "1.0", -BIG, BIG,
           "GSM8K (verl's gsm8k scorer): the answer after the last `####` (strict) or the last number "
           "(flexible), commas and `$` stripped, against the answer. The default reward: see the note on reward "
           "kinds"),
    KENUM("reward.gsm8k.method", reward.gsm8k.method, "strict", "strict|flexible",
          "strict: only `#### <number>` counts; flexible: the last number in the response"),
    KFLOAT("reward.gsm8k.score", reward.gsm8k.score, "1.0", -BIG, BIG, "score of a correct answer"),
    KFLOAT("reward.gsm8k.format_score", reward.gsm8k.format_score, "0.0", -BIG, BIG,
           "score when an answer is found but wrong (no answer scores 0)"),
    KINT("reward.gsm8k.clip_chars", reward.gsm8k.clip_chars, "0", 0, INT32_MAX,
         "search only the last N characters of the response (verl >= 0.4: 300) (0: all of it)"),
    KFLOAT("reward.boxed.weight", reward.boxed.weight, "0.0", -BIG, BIG,
           "the last `\\boxed{...}` (nested braces) against the answer, as normalised strings or numbers "
           "(verl's math scorer)"),
    KFLOAT("reward.boxed.score", reward.boxed.score, "1.0", -BIG, BIG, "score of a correct answer"),
    KFLOAT("reward.boxed.format_score", reward.boxed.format_score, "0.0", -BIG, BIG,
           "score when a `\\boxed{}` is found but wrong (none scores 0)"),
    KFLOAT("reward.format.weight", reward.format.weight, "0.0", -BIG, BIG,
           "1 when the whole response matches reward.format.regex, else 0"),
    KSTR("reward.format.regex", reward.format.regex, "^<think>.*?</think>\\s*<answer>.*?</answer>$",
         "PCRE2 pattern of the format reward"),
    KBOOL("reward.format.dotall", reward.format.dotall, "true", "`.` in the pattern matches newlines too"),
    KFLOAT("reward.exact.weight", reward.exact.weight, "0.0", -BIG, BIG,
           "1 when the response equals the answer, both trimmed of surrounding white space, else 0"),
    KFLOAT("reward.program.weight", reward.program.weight, "0.0", -BIG, BIG,
           "an external scorer: a line `{\"prompt\", \"response\", \"answer\"}` in, `{\"reward\": x}` out, per "
           "response"),
    KSTR_NULL("reward.program.command", reward.program.command,
              "shell command (/bin/sh -c) of the scorer, started once for the run; needed when reward.program is on"),
    KFLOAT_POS("reward.program.timeout_s", reward.program.timeout_s, "10.0", 86400,
               "seconds the scorer has per reply; a timeout, crash or bad reply scores 0, is counted, and the "
               "scorer is restarted"),
    KFLOAT("reward.program.grace_s", reward.program.grace_s, "2.0", 0, 3600,
           "at the end, seconds the scorer has to exit after its input closes, before it is killed"),
    KFLOAT("reward.program.memory_mb", reward.program.memory_mb, "16384", 0, 1e9,
           "the scorer's data-memory limit (RLIMIT_DATA) in MiB: past it its allocations fail, so a runaway "
           "scorer scores 0 instead of taking the machine's memory (0: no limit)"),
    KSTR_NULL("reward.reward_model.model_path", reward.reward_model.model_path,
              "a reward model (Qwen2, Qwen3, Llama or Mistral ...ForSequenceClassification with its tokenizer and chat "
              "template): its score "
              "of each conversation, the response as the assistant's turn, times reward.reward_model.weight, joins "
              "the reward (verl's reward_model.enable and model.path); null: none"),
    KFLOAT("reward.reward_model.weight", reward.reward_model.weight, "1.0", -BIG, BIG,
           "the reward model's weight in the reward"),
    KENUM("reward.reward_model.dtype", reward.reward_model.dtype, "bf16", "f32|bf16",
          "storage (and products) of the reward model's weights; it is frozen and runs on the CPU"),
    KINT_NULL("reward.reward_model.max_length", reward.reward_model.max_length, 1, INT32_MAX,
              "tokens of a conversation the reward model reads; a longer one keeps its last max_length, where the "
              "score is read, and is counted (null: data.max_prompt_length + data.max_response_length + 256)"),
    KINT("reward.reward_model.micro_batch_size", reward.reward_model.micro_batch_size, "8", 1, 4096,
         "conversations a forward of the reward model"),
    KSTR_NULL("reward.judge.model_path", reward.judge.model_path,
              "a generative judge (a causal LM with its tokenizer; the policy's own model.path judges with its "
              "initial weights): it answers reward.judge.rubric greedily, and the number reward.judge.regex finds in "
              "its answer, times reward.judge.weight, joins the reward; null: none"),
    KFLOAT("reward.judge.weight", reward.judge.weight, "1.0", -BIG, BIG, "the judge's weight in the reward"),
    KENUM("reward.judge.dtype", reward.judge.dtype, "bf16", "f32|bf16",
          "storage (and products) of the judge's weights; it is frozen and runs on the CPU"),
    KSTR("reward.judge.rubric", reward.judge.rubric, REWARD_JUDGE_RUBRIC,
         "the judge's user turn (its chat template's, with the generation prompt): {prompt}, {response} and "
         "{answer} are replaced by the prompt's last user message, the response's last turn and the answer"),
    KSTR("reward.judge.regex", reward.judge.regex, REWARD_JUDGE_REGEX,
         "PCRE2 pattern whose last match in the judge's answer gives the score: its first group (else the whole "
         "match) read as a number"),
    KINT("reward.judge.max_new_tokens", reward.judge.max_new_tokens, "32", 1, INT32_MAX,
         "tokens the judge's answer may take"),
    KINT_NULL("reward.judge.max_length", reward.judge.max_length, 2, INT32_MAX,
              "tokens of rubric and answer a judgement may take; a longer rubric is a failure (null: "
              "data.max_prompt_length + data.max_response_length + 512 + reward.judge.max_new_tokens)"),
    KINT("reward.judge.micro_batch_size", reward.judge.micro_batch_size, "8", 1, 4096,
         "the judge's workspace holds this many judgements of reward.judge.max_length tokens (shorter ones: more)"),
    KFLOAT("reward.judge.failure_score", reward.judge.failure_score, "0.0", -BIG, BIG,
           "the score of an answer without one (no match, not a number) or of a rubric too long; counted in "
           "judge_failures"),
    KINT("reward.overlong_buffer.len", reward.overlong_buffer.len, "0", 0, INT32_MAX,
         "DAPO's soft overlong penalty over the last len tokens before data.max_response_length (0: off)"),
    KFLOAT("reward.overlong_buffer.penalty_factor", reward.overlong_buffer.penalty_factor, "1.0", 0, BIG,
           "the penalty at the length limit; it grows linearly from 0 at the buffer's start"),
    KBOOL("reward.by_data_source", reward.by_data_source, "false",
          "each row's `data_source` chooses its rule reward as verl's default scorer does: openai/gsm8k -> gsm8k, "
          "lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500 -> boxed (weights: "
          "reward.gsm8k.weight, reward.boxed.weight, or 1 when 0); other rewards add as usual"),
    KBOOL("reward.strip_think", reward.strip_think, "false",
          "thinking models: gsm8k, boxed and exact score only what follows the last </think> "
          "(nothing when a <think> is never closed)"),

    KBOOL("algorithm.norm_adv_by_std", algorithm.norm_adv_by_std, "true",
          "A = (r - mean) / (std + 1e-6) within each group; false: A = r - mean (Dr. GRPO)"),
    KBOOL("algorithm.dynamic_sampling", algorithm.dynamic_sampling, "false",
          "drop the groups whose algorithm.filter_groups.metric is the same for every response (DAPO's "
          "filter_groups): they carry no signal"),
    KENUM("algorithm.filter_groups.metric", algorithm.filter_metric, "acc", "acc|seq_reward|seq_final_reward",
          "what dynamic sampling compares within a group (verl's names): acc, whether each answer is correct (a "
          "gsm8k, boxed or exact reward judges it, or the reward program's \"acc\"); seq_reward, the reward with the overlong penalty, so an all-wrong "
          "group whose lengths differ is kept and trains on length alone; seq_final_reward, the same here (with "
          "KL in the reward, refused)"),
    KINT("algorithm.filter_groups.max_num_gen_batches", algorithm.max_num_gen_batches, "10", 0, INT32_MAX,
         "dynamic sampling: generation batches a step may take to fill data.train_batch_size with groups that "
         "pass; past it the run stops with an error (0: no limit, verl's default; DAPO's scripts: 10)"),
    KENUM("algorithm.adv_estimator", algorithm.adv_estimator, "grpo",
          "grpo|rloo|opo|grpo_passk|reinforce_plus_plus|reinforce_plus_plus_baseline",
          "advantage of each response from the rewards (verl's estimators; README: Algorithms): grpo, (r - group "
          "mean) / (std + 1e-6) (algorithm.norm_adv_by_std); rloo, r - the mean of the group's others; opo, r - the "
          "group's length-weighted mean; grpo_passk, only the group's best gets r_max - r_second (/ std); "
          "reinforce_plus_plus, r whitened over the batch's tokens; reinforce_plus_plus_baseline, r - group mean, "
          "whitened"),
    KENUM("algorithm.rollout_correction.rollout_is", algorithm.rollout_correction.rollout_is, "off",
          "off|token|sequence",
          "rollout correction (verl's rollout_is, its null is off): each token's policy term weighed by "
          "min(p_old / p_rollout, rollout_is_threshold), the trainer's probability over the rollout's (truncated "
          "importance sampling); sequence: one weight a response, the product of its tokens' ratios. For a rollout "
          "whose numerics differ from training's (rollout.weight_dtype int8, bf16)"),
    KFLOAT_POS("algorithm.rollout_correction.rollout_is_threshold", algorithm.rollout_correction.rollout_is_threshold,
               "2.0", 1e30, "the truncation of the rollout correction's weights"),
    KBOOL("algorithm.rollout_correction.rollout_is_batch_normalize",
          algorithm.rollout_correction.rollout_is_batch_normalize, "false",
          "divide the rollout correction's weights by their mean over the batch (every rank's; sequence: the "
          "responses' weights), so that they average 1 (verl's rollout_is_batch_normalize)"),
    KSTR_NULL("algorithm.rollout_correction.rollout_rs", algorithm.rollout_correction.rollout_rs,
              "rollout rejection sampling (verl's rollout_rs): comma-separated options, each a divergence of the "
              "trainer's old log-probs from the rollout's that must stay within rollout_rs_threshold, a token "
              "failing one leaves the loss: token_k1/k2/k3 per token, seq_sum_k1/k2/k3, seq_mean_k1/k2/k3, "
              "seq_max_k2/k3 per response (all its tokens); k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r"),
    KSTR_NULL("algorithm.rollout_correction.rollout_rs_threshold", algorithm.rollout_correction.rollout_rs_threshold,
              "the bounds of algorithm.rollout_correction.rollout_rs: one for every option or one per option, "
              "comma-separated; k1 options \"lower_upper\" ratios (or an upper, the lower its reciprocal), the "
              "others an upper bound"),
    KBOOL("algorithm.mask_truncated", algorithm.mask_truncated, "false",
          "leave responses cut at data.max_response_length out of the loss (DAPO's overlong filtering)"),
    KBOOL("algorithm.use_kl_in_reward", algorithm.use_kl_in_reward, "false",
          "subtract kl_coef times the KL to the reference from the reward, instead of the KL loss (actor.use_kl_loss)"),
    KFLOAT("algorithm.kl_coef", algorithm.kl_coef, "0.001", 0, BIG,
           "the KL coefficient when algorithm.use_kl_in_reward"),
    KENUM_ALIAS("algorithm.kl_penalty", algorithm.kl_penalty, "k1", "k1|k2|k3", VERL_KL_NAMES,
                "KL estimator in the reward, as actor.kl_loss_type"),

    KINT("actor.ppo_epochs", actor.ppo_epochs, "1", 1, INT32_MAX, "passes over each step's rollout"),
    KINT_NULL(
        "actor.mini_batch_size", actor.mini_batch_size, 1, INT32_MAX,
        "prompts per optimiser step, with all their responses; divides data.train_batch_size (null: the whole batch)"),
    KINT_NULL("actor.micro_batch_size", actor.micro_batch_size, 1, INT32_MAX,
              "responses per forward/backward (gradient accumulation); divides mini_batch_size x rollout.n (null: all "
              "of them)"),
    KFLOAT("actor.clip_ratio_low", actor.clip_ratio_low, "0.2", 0, 1,
           "PPO clip: the ratio is kept above 1 - clip_ratio_low"),
    KFLOAT("actor.clip_ratio_high", actor.clip_ratio_high, "0.2", 0, 100,
           "and below 1 + clip_ratio_high (above clip_ratio_low: DAPO's clip-higher)"),
    KFLOAT("actor.clip_ratio_c", actor.clip_ratio_c, "0.0", 0, BIG,
           "dual clip: the loss of a token with negative advantage is at most -A x clip_ratio_c; 0: off, else above 1"),
    KENUM("actor.policy_loss.loss_mode", actor.policy_loss.loss_mode, "vanilla", "vanilla|gspo|geo_mean|cispo|sapo|clip_cov|kl_cov",
          "the policy term (verl's loss modes; README: Algorithms): vanilla, PPO's clipped ratio per token; gspo, one "
          "ratio a sequence (exp of the mean log-ratio), clipped (its paper: clip ratios 3e-4 / 4e-4); geo_mean "
          "(GMPO), the geometric mean of the clipped token ratios; cispo, the clipped ratio as a weight of log p, "
          "without gradient; sapo, a soft gate of the ratio (actor.tau_pos, actor.tau_neg); clip_cov, PPO's clip and "
          "a random few of the tokens of high covariance of advantage and log p lose their gradient; kl_cov, no clip "
          "and the tokens of the highest covariance get a penalty |log r|. gspo and sapo aggregate their policy term "
          "seq-mean-token-mean and geo_mean per response, whatever actor.loss_agg_mode says (verl's)"),
    KFLOAT_POS("actor.policy_loss.clip_cov_ratio", actor.policy_loss.clip_cov_ratio, "0.0002", BIG,
           "clip_cov: the fraction of a micro-batch's loss tokens that lose their gradient (at least one)"),
    KFLOAT("actor.policy_loss.clip_cov_lb", actor.policy_loss.clip_cov_lb, "1.0", -BIG, BIG,
           "clip_cov: the covariance window's lower bound (exclusive)"),
    KFLOAT("actor.policy_loss.clip_cov_ub", actor.policy_loss.clip_cov_ub, "5.0", -BIG, BIG,
           "clip_cov: and its upper bound (exclusive), above clip_cov_lb"),
    KFLOAT_POS("actor.policy_loss.kl_cov_ratio", actor.policy_loss.kl_cov_ratio, "0.0002", BIG,
           "kl_cov: the fraction of a micro-batch's loss tokens, those of the highest covariance, that get the "
           "penalty (at least one)"),
    KFLOAT("actor.policy_loss.ppo_kl_coef", actor.policy_loss.ppo_kl_coef, "0.1", 0, BIG,
           "kl_cov: the penalty's coefficient (ppo_kl_coef x |log r|)"),
    KFLOAT_POS("actor.tau_pos", actor.tau_pos, "1.0", 1e6, "sapo: the gate's temperature for A > 0"),
    KFLOAT_POS("actor.tau_neg", actor.tau_neg, "1.05", 1e6, "sapo: the gate's temperature for A <= 0"),
    KENUM("actor.loss_agg_mode", actor.loss_agg_mode, "token-mean",
          "token-mean|seq-mean-token-mean|seq-mean-token-sum-norm",
          "token-mean: over all tokens of the mini-batch; seq-mean-token-mean: per response, then over responses; "
          "seq-mean-token-sum-norm: token sums over responses x data.max_response_length (Dr. GRPO)"),
    KFLOAT("actor.entropy_coeff", actor.entropy_coeff, "0.0", 0, BIG,
           "entropy bonus: loss -= entropy_coeff * (policy entropy, aggregated like the loss)"),
    KBOOL("actor.use_kl_loss", actor.use_kl_loss, "true", "add kl_loss_coef x KL(policy || reference) to the loss"),
    KFLOAT("actor.kl_loss_coef", actor.kl_loss_coef, "0.001", 0, BIG,
           "the coefficient beta of the KL loss; 0 (or use_kl_loss false) skips the reference model entirely"),
    KENUM_ALIAS("actor.kl_loss_type", actor.kl_loss_type, "k3", "k1|k2|k3", VERL_KL_NAMES,
                "KL estimator, with x = log(policy / reference) per token: k1 = x, k2 = x^2 / 2, k3 = exp(-x) - 1 + x "
                "clamped to [-10, 10]"),
    KFLOAT("actor.lr", actor.lr, "1e-6", 0, 1e3, "peak learning rate of AdamW"),
    KENUM("actor.lr_schedule", actor.lr_schedule, "constant", "constant|linear|cosine",
          "learning-rate schedule after the warmup (Hugging Face's schedules), advanced once per GRPO step as in verl"),
    KINT("actor.lr_warmup_steps", actor.lr_warmup_steps, "0", 0, INT32_MAX, "GRPO steps of linear warmup from 0"),
    KFLOAT("actor.weight_decay", actor.weight_decay, "0.01", 0, 1e3,
           "AdamW's decoupled weight decay (not on biases and norms)"),
    KFLOAT("actor.beta1", actor.beta1, "0.9", 0, 0.999999, "AdamW beta1"),
    KFLOAT("actor.beta2", actor.beta2, "0.999", 0, 0.999999999, "AdamW beta2"),
    KFLOAT_POS("actor.adam_eps", actor.adam_eps, "1e-8", 1, "AdamW epsilon"),
    KFLOAT("actor.grad_clip", actor.grad_clip, "1.0", 0, BIG, "clip the global gradient norm to this (0: off)"),
    KENUM("actor.precision", actor.precision, "fp32", "fp32|bf16|fp16",
          "compute copy of the weights; the master weights and Adam moments stay fp32"),
    KFLOAT_POS("actor.loss_scale", actor.loss_scale, "1024", 1e38, "fp16: initial loss scale"),
    KINT("actor.loss_scale_window", actor.loss_scale_window, "1000", 0, INT32_MAX,
         "fp16: double the loss scale after this many clean steps (0: static scale)"),
    KBOOL("actor.recompute", actor.recompute, "false",
          "recompute each layer's activations in backward: less memory, about 1/3 more compute"),
    KBOOL("actor.offload_optimizer", actor.offload_optimizer, "false",
          "keep the Adam moments in a file-backed mapping (in trainer.out_dir), out of memory during rollout (on a "
          "device: in pinned host memory for the whole run, never in device memory; AdamW streams them through the "
          "device, double-buffered)"),
    KBOOL("actor.offload_params", actor.offload_params, "false",
          "a device run's full fine-tuning: the fp32 master weights, the Adam moments and AdamW on the host; the "
          "device holds the bf16 compute copy and the gradients (verl's fsdp_config.param_offload)"),
    KBOOL("actor.vision.train_merger", actor.vision.train_merger, "false",
          "a vision-language model's patch merger trains with the language model (full fine-tuning; the rest of "
          "the vision tower stays frozen)"),
    KINT("actor.lora.rank", actor.lora.rank, "0", 0, 65536,
         "LoRA rank r (0: full fine-tuning). The base is frozen and only the adapters train; the output directory "
         "holds a PEFT adapter (adapter_config.json, adapter_model.safetensors)"),
    KFLOAT("actor.lora.alpha", actor.lora.alpha, "16", -1e6, 1e6, "lora_alpha: the adapters' output is scaled by alpha / r"),
    KFLOAT("actor.lora.dropout", actor.lora.dropout, "0", 0, 0.999,
           "lora_dropout on the adapters' input; only 0 is supported"),
    KLIST("actor.lora.target_modules", actor.lora.target_modules,
          "projections to adapt: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (or q, k, ...), or "
          "all-linear; empty: all-linear"),
    KENUM("actor.lora.base_dtype", actor.lora.base_dtype, "bf16", "f32|bf16",
          "storage of the frozen base under LoRA: bf16 is 2 bytes a parameter (the adapters are fp32)"),

    KINT_NULL("trainer.steps", trainer.steps, 1, INT32_MAX,
              "GRPO steps (null: data.epochs passes over the training prompts; with dynamic sampling, until they "
              "are used up)"),
    KINT("trainer.seed", trainer.seed, "0", 0, NOMAX, "seed of the data order and of sampling"),
    KSTR("trainer.out_dir", trainer.out_dir, "runs/grpo",
         "where the final model, checkpoints, metrics.jsonl and samples go"),
    KSTR("trainer.device", trainer.device, "cpu",
         "where the policy, reference and rollout run: cpu, cuda, cuda:N or emu (a GPU computes in bf16: "
         "`actor.precision: bf16` and `model.ref_dtype: bf16`, or LoRA with `actor.lora.base_dtype: bf16`)"),
    KBOOL("trainer.resume", trainer.resume, "false", "continue from the newest checkpoint in trainer.out_dir"),
    KBOOL("trainer.overwrite", trainer.overwrite, "false",
          "replace a previous run in trainer.out_dir (its checkpoints, model, metrics); false: refuse"),
    KINT("trainer.save_every", trainer.save_every, "0", 0, INT32_MAX,
         "write a checkpoint every N steps (0: only the final model)"),
    KINT("trainer.keep", trainer.keep, "2", 1, INT32_MAX, "keep the newest K checkpoints"),
    KENUM("trainer.save_dtype", trainer.save_dtype, "f32", "f32|bf16", "dtype of the saved model weights"),
    KINT("trainer.val_every", trainer.val_every, "0", 0, INT32_MAX,
         "greedy pass@1 on the validation prompts every N steps (0: never)"),
    KBOOL("trainer.val_before_train", trainer.val_before_train, "true", "validate once before the first step"),
    KBOOL("trainer.dump_samples", trainer.dump_samples, "false",
          "append every response (prompt, its ids, the response's ids and rollout log-probs, text, reward, "
          "advantage) to trainer.out_dir/samples.jsonl"),
    KINT("trainer.max_skips", trainer.max_skips, "5", 1, INT32_MAX,
         "stop after this many consecutive steps skipped for a non-finite loss or gradient"),

    KFLOAT("dist.timeout_s", dist.timeout_s, "600", 0, BIG,
           "under mpirun: a collective that waits longer ends the job on every rank, naming it (0: wait forever)"),
    KINT("dist.zero", dist.zero, "0", 0, 2,
         "ZeRO stage: 1 shards the Adam moments and their update over the ranks, 2 also reduce-scatters gradients"),
    KENUM("dist.pin_cpu", dist.pin_cpu, "none", "none|block",
          "block: bind each rank to its block of this machine's CPUs (launch with mpirun --bind-to none)"),
    KENUM("compression.type", compression.type, "none", "none|topk",
          "topk: each rank sends only its largest gradient entries, keeping the rest for the next step"),
    KFLOAT_POS("compression.ratio", compression.ratio, "0.01", 1,
               "topk: the fraction of gradient entries each rank sends per step (1: all, the dense result)"),
};
#define N_KEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

// Reward kinds: a config file naming any of them replaces the default reward (gsm8k alone).
static const char *const REWARD_KINDS[] = {"gsm8k", "boxed", "format", "exact", "program"};
#define N_REWARD_KINDS ((int)(sizeof REWARD_KINDS / sizeof REWARD_KINDS[0]))

static const char *const BOOL_TRUE[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
static const char *const BOOL_FALSE[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};

static void *field(GrpoConfig *c, const ConfigKey *k) { return (char *)c + k->offset; }
static const void *cfield(const GrpoConfig *c, const ConfigKey *k) { return (const char *)c + k->offset; }

static const ConfigKey *key_find(const char *name) {
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(KEYS[i].name, name)) return &KEYS[i];
    return NULL;
}

// A section is a proper prefix of keys at a dot: "actor", "reward.gsm8k".
static const ConfigKey *section_first_key(const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < N_KEYS; i++)
        if (!strncmp(KEYS[i].name, name, n) && KEYS[i].name[n] == '.') return &KEYS[i];
    return NULL;
}

// The n-th spelling of an enum into buf; 0 when there is none.
static int enum_value(const ConfigKey *k, int n, char *buf, size_t size) {
    const char *s = k->values;
    for (int i = 0; i < n; i++) {
        s = strchr(s, '|');
        if (!s) return 0;
        s++;
    }
    size_t len = strcspn(s, "|");
    if (len + 1 > size) return 0;
    memcpy(buf, s, len);
    buf[len] = 0;
    return 1;
}

// The value an alias of an enum stands for ("low_var_kl" -> "k3") into buf; 0 when s is no alias.
static int enum_alias(const ConfigKey *k, const char *s, char *buf, size_t size) {
    for (const char *a = k->aliases; a && *a;) {
        size_t len = strcspn(a, "="), vlen = strcspn(a + len + 1, "|");
        if (len == strlen(s) && !strncmp(a, s, len) && vlen < size) {
            memcpy(buf, a + len + 1, vlen);
            buf[vlen] = 0;
            return 1;
        }
        a += len + 1 + vlen;
        a += *a == '|';
    }
    return 0;
}

// What a key accepts, in words: "an integer >= 1 or null", "one of k1, k2, k3".
static void key_describe(const ConfigKey *k, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = 0;
    switch (k->type) {
        case KEY_INT:
            if (k->imax >= INT32_MAX)
                n = snprintf(buf, size, "an integer >= %lld", (long long)k->imin);
            else
                n = snprintf(buf, size, "an integer in [%lld, %lld]", (long long)k->imin, (long long)k->imax);
            break;
        case KEY_FLOAT:
            if (k->fmin <= -BIG && k->fmax >= BIG)
                n = snprintf(buf, size, "a number");
            else if (k->fmax >= BIG)
                n = snprintf(buf, size, "a number %s %.12g", k->fmin_open ? ">" : ">=", k->fmin);
            else
                n = snprintf(buf, size, "a number in %c%.12g, %.12g]", k->fmin_open ? '(' : '[', k->fmin, k->fmax);
            break;
        case KEY_BOOL: n = snprintf(buf, size, "true or false"); break;
        case KEY_STRING: n = snprintf(buf, size, "a string"); break;
        case KEY_LIST: n = snprintf(buf, size, "a list of strings"); break;
        case KEY_MAP: n = snprintf(buf, size, "a mapping"); break;
        case KEY_ENUM: {
            n = snprintf(buf, size, "one of ");
            char v[64];
            for (int i = 0; enum_value(k, i, v, sizeof v) && n < size; i++)
                n += snprintf(buf + n, size - n, "%s%s", i ? ", " : "", v);
            for (const char *a = k->aliases; a && *a && n < size;) {  // " (or kl, mse, low_var_kl)"
                size_t len = strcspn(a, "=");
                n += snprintf(buf + n, size - n, "%s%.*s", a == k->aliases ? " (or " : ", ", (int)len, a);
                a += len + strcspn(a + len, "|");
                a += *a == '|';
                if (!*a && n < size) n += snprintf(buf + n, size - n, ")");
            }
            break;
        }
    }
    if (k->nullable && n < size) snprintf(buf + n, size - n, " or null");
}

static _Noreturn void bad_value(const char *where, const ConfigKey *k, const char *got) {
    char want[256];
    key_describe(k, want, sizeof want);
    die("%s%s%s: expected %s, got %s", where ? where : "", where ? ": " : "", k->name, want, got);
}

static _Noreturn void bad_scalar(const char *where, const ConfigKey *k, const char *text) {
    char got[160];
    snprintf(got, sizeof got, "\"%.120s%s\"", text, strlen(text) > 120 ? "..." : "");
    bad_value(where, k, got);
}

// Decimal integers only: YAML 1.1's octal (010), hex and sexagesimal forms are rarely meant in a config.
static int parse_int(const char *s, int64_t *out) {
    const char *p = s + (*s == '-' || *s == '+');
    if (!*p) return 0;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9') return 0;
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno) return 0;
    *out = v;
    return 1;
}

// [-+]? (digits [. digits?] | . digits) ([eE] [-+]? digits)? -- what users write, "1e-6" included
// (which YAML 1.1 itself reads as a string); no inf, nan or hex.
static int parse_float(const char *s, double *out) {
    const char *p = s + (*s == '-' || *s == '+');
    int digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    if (*p == '.') {
        p++;
        while (*p >= '0' && *p <= '9') p++, digits++;
    }
    if (!digits) return 0;
    if (*p == 'e' || *p == 'E') {
        p++;
        p += (*p == '-' || *p == '+');
        if (*p < '0' || *p > '9') return 0;
        while (*p >= '0' && *p <= '9') p++;
    }
    if (*p) return 0;
    double v = strtod(s, NULL);
    if (!isfinite(v)) return 0;
    *out = v;
    return 1;
}

static int parse_bool(const char *s, int *out) {
    for (size_t i = 0; i < sizeof BOOL_TRUE / sizeof BOOL_TRUE[0]; i++) {
        if (!strcmp(s, BOOL_TRUE[i])) return *out = 1, 1;
        if (!strcmp(s, BOOL_FALSE[i])) return *out = 0, 1;
    }
    return 0;
}

static void list_clear(GrpoStrList *l) {
    for (int i = 0; i < l->n; i++) free(l->items[i]);
    free(l->items);
    *l = (GrpoStrList){0};
}

// Sets one key from a scalar (text; NULL for null).
static void key_set_scalar(GrpoConfig *c, const ConfigKey *k, const char *text, const char *where) {
    void *p = field(c, k);
    // Only integer, string and list keys can be null (a list: the empty one).
    if (!text && (!k->nullable || k->type == KEY_FLOAT || k->type == KEY_BOOL || k->type == KEY_ENUM) &&
        k->type != KEY_LIST)
        bad_value(where, k, "null");
    switch (k->type) {
        case KEY_INT: {
            int64_t v = 0;
            if (text && (!parse_int(text, &v) || v < k->imin || v > k->imax)) bad_scalar(where, k, text);
            *(int64_t *)p = v;
            break;
        }
        case KEY_FLOAT: {
            double v;
            if (!parse_float(text, &v) || v < k->fmin || v > k->fmax || (k->fmin_open && v == k->fmin))
                bad_scalar(where, k, text);
            *(double *)p = v;
            break;
        }
        case KEY_BOOL:
            if (!parse_bool(text, (int *)p)) bad_scalar(where, k, text);
            break;
        case KEY_STRING:
            free(*(char **)p);
            *(char **)p = text ? xstrdup(text) : NULL;
            break;
        case KEY_MAP: {  // JSON (a YAML flow mapping written as JSON) of an object
            cJSON *m = json_parse_exact(text, strlen(text), NULL);
            if (!cJSON_IsObject(m)) bad_value(where, k, text);
            free(*(char **)p);
            *(char **)p = cJSON_PrintUnformatted(m);
            if (!*(char **)p) die("out of memory");
            cJSON_Delete(m);
            break;
        }
        case KEY_ENUM: {
            char v[64], canonical[64];
            const char *want = enum_alias(k, text, canonical, sizeof canonical) ? canonical : text;
            int i = 0;
            while (enum_value(k, i, v, sizeof v) && strcmp(v, want)) i++;
            if (!enum_value(k, i, v, sizeof v)) bad_scalar(where, k, text);
            *(int *)p = i;
            break;
        }
        case KEY_LIST: {
            GrpoStrList *l = p;
            list_clear(l);
            if (text) {
                l->items = xmalloc(sizeof *l->items);
                l->items[0] = xstrdup(text);
                l->n = 1;
            }
            break;
        }
    }
}

static void key_set(GrpoConfig *c, const ConfigKey *k, const YamlEntry *e, const char *where) {
    if (e->kind == YAML_ENTRY_EMPTY_MAP && k->type == KEY_MAP) return key_set_scalar(c, k, "{}", where);
    if (e->kind == YAML_ENTRY_EMPTY_MAP) bad_value(where, k, "a mapping");
    if (e->kind == YAML_ENTRY_SCALAR) {
        key_set_scalar(c, k, e->scalar.is_null ? NULL : e->scalar.text, where);
        return;
    }
    if (k->type != KEY_LIST) bad_value(where, k, "a list");
    GrpoStrList *l = field(c, k);
    list_clear(l);
    l->items = xcalloc((size_t)(e->n_items ? e->n_items : 1), sizeof *l->items);
    for (int i = 0; i < e->n_items; i++) {
        if (e->items[i].is_null) bad_value(where, k, "a list holding a null");
        l->items[l->n++] = xstrdup(e->items[i].text);
    }
}

// Optimal string alignment distance (Levenshtein plus adjacent transpositions: the common typos).
static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    int *d = xmalloc((n + 1) * (m + 1) * sizeof *d);
#define D(i, j) d[(i) * (m + 1) + (j)]
    for (size_t i = 0; i <= n; i++) D(i, 0) = (int)i;
    for (size_t j = 0; j <= m; j++) D(0, j) = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = D(i - 1, j - 1) + cost;
            if (D(i - 1, j) + 1 < v) v = D(i - 1, j) + 1;
            if (D(i, j - 1) + 1 < v) v = D(i, j - 1) + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && D(i - 2, j - 2) + 1 < v)
                v = D(i - 2, j - 2) + 1;
            D(i, j) = v;
        }
    int r = D(n, m);
#undef D
    free(d);
    return r;
}

static const char *leaf(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

// verl's and TRL's names (a key's last part, or last two) for keys whose last part here is another word.
static const struct {
    const char *theirs, *ours;
} SYNONYMS[] = {
    {"train_files", "data.train_file"}, {"val_files", "data.val_file"},
    {"model_name_or_path", "model.path"},
    {"num_generations", "rollout.n"},
    {"tool_config_path", "rollout.multi_turn.tools_file"},
    {"max_assistant_turns", "rollout.multi_turn.max_turns"},
    {"max_completion_length", "data.max_response_length"}, {"max_tokens", "data.max_response_length"},
    {"max_new_tokens", "data.max_response_length"},
    {"total_training_steps", "trainer.steps"}, {"max_steps", "trainer.steps"},
    {"total_epochs", "data.epochs"}, {"num_train_epochs", "data.epochs"},
    {"learning_rate", "actor.lr"}, {"warmup_steps", "actor.lr_warmup_steps"},
    {"warmup_style", "actor.lr_schedule"}, {"lr_scheduler_type", "actor.lr_schedule"},
    {"ppo_mini_batch_size", "actor.mini_batch_size"}, {"ppo_micro_batch_size", "actor.micro_batch_size"},
    {"ppo_micro_batch_size_per_gpu", "actor.micro_batch_size"},
    {"max_grad_norm", "actor.grad_clip"}, {"num_iterations", "actor.ppo_epochs"},
    {"beta", "actor.kl_loss_coef"}, {"epsilon", "actor.clip_ratio_low"}, {"epsilon_high", "actor.clip_ratio_high"},
    {"norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std"}, {"scale_rewards", "algorithm.norm_adv_by_std"},
    {"filter_groups.enable", "algorithm.dynamic_sampling"},
    {"reward_model.enable", "reward.reward_model.model_path"},
    {"reward_model.model.path", "reward.reward_model.model_path"},
    {"importance_sampling_level", "actor.policy_loss.loss_mode"}, {"loss_type", "actor.loss_agg_mode"},
    {"mask_truncated_completions", "algorithm.mask_truncated"},
    {"output_dir", "trainer.out_dir"}, {"default_local_dir", "trainer.out_dir"},
    {"save_freq", "trainer.save_every"}, {"save_steps", "trainer.save_every"},
    {"max_actor_ckpt_to_keep", "trainer.keep"}, {"save_total_limit", "trainer.keep"},
    {"test_freq", "trainer.val_every"}, {"eval_steps", "trainer.val_every"},
    {"resume_from_checkpoint", "trainer.resume"}, {"overwrite_output_dir", "trainer.overwrite"},
};

// Does name end in part (all of it, or after a '.')?
static int ends_with_part(const char *name, const char *part) {
    size_t n = strlen(name), p = strlen(part);
    return n >= p && strcmp(name + n - p, part) == 0 && (n == p || name[n - p - 1] == '.');
}

// How many '_'-separated words of the last part of a are words of the last part of b.
static int shared_words(const char *a, const char *b) {
    char wb[130];
    snprintf(wb, sizeof wb, "_%s_", leaf(b));
    int n = 0;
    for (const char *w = leaf(a); *w;) {
        size_t len = strcspn(w, "_");
        char word[130];
        if (len > 0 && len < sizeof word - 2) {
            snprintf(word, sizeof word, "_%.*s_", (int)len, w);
            n += strstr(wb, word) != NULL;
        }
        w += len;
        w += *w == '_';
    }
    return n;
}

// Whether a and b sit in the same section (all but their last parts equal).
static int same_section(const char *a, const char *b) {
    size_t la = (size_t)(leaf(a) - a), lb = (size_t)(leaf(b) - b);
    return la == lb && strncmp(a, b, la) == 0;
}

// A key for an unknown name, or NULL when none is close: a verl/TRL synonym of its last part; else the key
// whose last part is a typo away (at most 2 edits, and fewer than half its letters), else the one sharing
// the most words of the last part ("lr_rate": "lr"). Ties go to the same section, then the nearest name.
static const char *key_suggest(const char *name) {
    for (size_t i = 0; i < sizeof SYNONYMS / sizeof SYNONYMS[0]; i++)
        if (ends_with_part(name, SYNONYMS[i].theirs)) return SYNONYMS[i].ours;
    const char *best = NULL;
    int best_score[4] = {0};
    int len = (int)strlen(leaf(name));
    for (int i = 0; i < N_KEYS; i++) {
        const char *k = KEYS[i].name;
        int dl = edit_distance(leaf(name), leaf(k));
        int typo = dl <= 2 && 2 * dl < len;
        int words = shared_words(name, k);
        if (!typo && words == 0) continue;
        // Lexicographic, smaller is better: a typo first, then fewer edits or more shared words.
        int score[4] = {!typo, typo ? dl : -words, !same_section(name, k), edit_distance(name, k)};
        int better = best == NULL;
        for (int j = 0; j < 4 && !better; j++) {
            if (score[j] != best_score[j]) {
                better = score[j] < best_score[j];
                break;
            }
        }
        if (better) {
            best = k;
            memcpy(best_score, score, sizeof score);
        }
    }
    return best;
}

static int reward_kind(const char *key, int *exact) {
    if (strncmp(key, "reward.", 7)) return -1;
    for (int i = 0; i < N_REWARD_KINDS; i++) {
        size_t n = strlen(REWARD_KINDS[i]);
        if (!strncmp(key + 7, REWARD_KINDS[i], n) && (key[7 + n] == 0 || key[7 + n] == '.')) {
            *exact = key[7 + n] == 0;
            return i;
        }
    }
    return -1;
}

static double *reward_weight(GrpoConfig *c, int kind, const ConfigKey **k) {
    char name[64];
    snprintf(name, sizeof name, "reward.%s.weight", REWARD_KINDS[kind]);
    *k = key_find(name);
    return field(c, *k);
}

// A YAML scalar as the JSON value it means: null, a boolean, a number, else a string.
static cJSON *scalar_json(const YamlScalar *s) {
    int b;
    double x;
    if (s->is_null) return cJSON_CreateNull();
    if (parse_bool(s->text, &b)) return cJSON_CreateBool(b);
    if (parse_float(s->text, &x)) return cJSON_CreateNumber(x);
    return cJSON_CreateString(s->text);
}

// A map key's other spelling: verl's name for the template's variables.
static const char *map_alias(const char *key, size_t *n) {
    static const char verl[] = "data.apply_chat_template_kwargs";
    *n = strlen(verl);
    return !strncmp(key, verl, *n) && (key[*n] == '.' || !key[*n]) ? "data.chat_template_kwargs" : NULL;
}

// "MAPKEY.NAME: value" (a map key's entry given alone): sets NAME in the map. 0 when e is not one.
static int map_entry(GrpoConfig *c, const YamlEntry *e, const char *where, char **key_where) {
    for (int i = 0; i < N_KEYS; i++) {
        size_t n = strlen(KEYS[i].name), alias_n;
        const char *alias = map_alias(e->key, &alias_n);
        if (alias && !strcmp(alias, KEYS[i].name) && !e->key[alias_n]) {  // the whole map under verl's name
            key_set(c, &KEYS[i], e, where);
            return 1;
        }
        const char *key = alias ? alias : e->key;
        if (KEYS[i].type != KEY_MAP || strncmp(key, KEYS[i].name, n)) continue;
        const char *tail = alias ? e->key + alias_n : e->key + n;
        if (*tail != '.') continue;
        const char *name = tail + 1;
        if (strchr(name, '.') || e->kind == YAML_ENTRY_EMPTY_MAP)
            die("%s: \"%s\": %s takes NAME: value with a scalar or a list of them", where, e->key,
                KEYS[i].name);
        char **text = field(c, &KEYS[i]);
        cJSON *m = cJSON_Parse(*text);
        cJSON *v = e->kind == YAML_ENTRY_SCALAR ? scalar_json(&e->scalar) : cJSON_CreateArray();
        if (!m || !v) die("out of memory");
        for (int k = 0; e->kind == YAML_ENTRY_LIST && k < e->n_items; k++) {
            cJSON *item = scalar_json(&e->items[k]);
            if (!item) die("out of memory");
            cJSON_AddItemToArray(v, item);
        }
        cJSON_DeleteItemFromObjectCaseSensitive(m, name);
        cJSON_AddItemToObject(m, name, v);
        free(*text);
        *text = cJSON_PrintUnformatted(m);
        if (!*text) die("out of memory");
        cJSON_Delete(m);
        free(key_where[i]);
        key_where[i] = where ? xstrdup(where) : NULL;
        return 1;
    }
    return 0;
}

static void apply_entry(GrpoConfig *c, const YamlEntry *e, const char *where, char **key_where) {
    if (map_entry(c, e, where, key_where)) return;
    int exact = 0;
    int kind = reward_kind(e->key, &exact);
    if (kind >= 0 && exact) {
        // "reward.gsm8k: 0.5" is the weight; a bare "gsm8k:" or "gsm8k: {}" turns the kind on at weight 1.
        const ConfigKey *wk;
        double *w = reward_weight(c, kind, &wk);
        if (e->kind == YAML_ENTRY_EMPTY_MAP || (e->kind == YAML_ENTRY_SCALAR && e->scalar.is_null))
            *w = 1.0;
        else
            key_set(c, wk, e, where);
        free(key_where[wk - KEYS]);
        key_where[wk - KEYS] = where ? xstrdup(where) : NULL;
        return;
    }
    const ConfigKey *k = key_find(e->key);
    if (k) {
        key_set(c, k, e, where);
        free(key_where[k - KEYS]);
        key_where[k - KEYS] = where ? xstrdup(where) : NULL;
        return;
    }
    const ConfigKey *in_section = section_first_key(e->key);
    if (in_section) {
        // "actor:" with every key commented out, or "actor: {}", sets nothing.
        if (e->kind == YAML_ENTRY_EMPTY_MAP || (e->kind == YAML_ENTRY_SCALAR && e->scalar.is_null)) return;
        die("%s: \"%s\" is a section (of keys such as \"%s\"), not a value", where, e->key, in_section->name);
    }
    const char *near = key_suggest(e->key);
    if (near) die("%s: unknown key \"%s\" (did you mean \"%s\"?)", where, e->key, near);
    die("%s: unknown key \"%s\" (README.md's configuration table lists every key)", where, e->key);
}

// "WHERE: " of whichever key was set in this load, for errors about two keys.
static const char *where_of(char **key_where, const char *a, const char *b) {
    const ConfigKey *ka = key_find(a), *kb = key_find(b);
    if (ka && key_where[ka - KEYS]) return key_where[ka - KEYS];
    if (kb && key_where[kb - KEYS]) return key_where[kb - KEYS];
    return NULL;
}

#define CONFLICT(a, b, ...)                                \
    do {                                                   \
        const char *w_ = where_of(key_where, a, b);        \
        char msg_[512];                                    \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);          \
        die("%s%s%s", w_ ? w_ : "", w_ ? ": " : "", msg_); \
    } while (0)

static void check_conflicts(const GrpoConfig *c, char **key_where) {
    const GrpoActorConfig *a = &c->actor;
    int64_t mini = a->mini_batch_size ? a->mini_batch_size : c->data.train_batch_size;
    if (c->data.train_batch_size % mini)
        CONFLICT("actor.mini_batch_size", "data.train_batch_size",
                 "actor.mini_batch_size %lld does not divide data.train_batch_size %lld", (long long)mini,
                 (long long)c->data.train_batch_size);
    if (a->micro_batch_size && (mini * c->rollout.n) % a->micro_batch_size)
        CONFLICT("actor.micro_batch_size", "rollout.n",
                 "actor.micro_batch_size %lld does not divide the %lld responses of a mini-batch "
                 "(actor.mini_batch_size x rollout.n)",
                 (long long)a->micro_batch_size, (long long)(mini * c->rollout.n));
    if (c->rollout.val_kwargs.n > 1 && c->rollout.val_kwargs.temperature == 0)
        CONFLICT("rollout.val_kwargs.n", "rollout.val_kwargs.temperature",
                 "rollout.val_kwargs.n %lld samples each validation prompt greedily %lld times, alike: set "
                 "rollout.val_kwargs.temperature above 0", (long long)c->rollout.val_kwargs.n,
                 (long long)c->rollout.val_kwargs.n);
    int64_t gen = c->data.gen_batch_size;
    if (gen && !c->algorithm.dynamic_sampling && gen != c->data.train_batch_size)
        CONFLICT("data.gen_batch_size", "algorithm.dynamic_sampling",
                 "data.gen_batch_size %lld differs from data.train_batch_size %lld without algorithm.dynamic_sampling, "
                 "which alone generates more than a step trains on", (long long)gen, (long long)c->data.train_batch_size);
    if (gen && gen % mini)
        CONFLICT("data.gen_batch_size", "actor.mini_batch_size",
                 "data.gen_batch_size %lld is not a multiple of the mini-batch (%lld prompts)", (long long)gen,
                 (long long)mini);
    if (c->data.min_pixels && c->data.max_pixels && c->data.min_pixels > c->data.max_pixels)
        CONFLICT("data.min_pixels", "data.max_pixels", "data.min_pixels %lld exceeds data.max_pixels %lld",
                 (long long)c->data.min_pixels, (long long)c->data.max_pixels);
    if (a->clip_ratio_c != 0 && a->clip_ratio_c <= 1)
        CONFLICT("actor.clip_ratio_c", "", "actor.clip_ratio_c must be 0 (off) or above 1, not %g", a->clip_ratio_c);
    if (a->policy_loss.loss_mode == PG_CLIP_COV && a->policy_loss.clip_cov_lb >= a->policy_loss.clip_cov_ub)
        CONFLICT("actor.policy_loss.clip_cov_lb", "actor.policy_loss.clip_cov_ub",
                 "actor.policy_loss.clip_cov_lb (%g) must be below actor.policy_loss.clip_cov_ub (%g)",
                 a->policy_loss.clip_cov_lb, a->policy_loss.clip_cov_ub);
    if (a->clip_ratio_c != 0 && a->policy_loss.loss_mode != PG_VANILLA)
        CONFLICT("actor.clip_ratio_c", "actor.policy_loss.loss_mode",
                 "actor.clip_ratio_c is the dual clip of the vanilla loss, not of actor.policy_loss.loss_mode %s",
                 policy_loss_name((PolicyLossMode)a->policy_loss.loss_mode));
    if (a->use_kl_loss && c->algorithm.use_kl_in_reward)
        CONFLICT("algorithm.use_kl_in_reward", "actor.use_kl_loss",
                 "actor.use_kl_loss and algorithm.use_kl_in_reward are both true: the KL goes into the loss or the "
                 "reward, choose one");
    if (c->reward.overlong_buffer.len >= c->data.max_response_length)
        CONFLICT("reward.overlong_buffer.len", "data.max_response_length",
                 "reward.overlong_buffer.len %lld must be below data.max_response_length %lld",
                 (long long)c->reward.overlong_buffer.len, (long long)c->data.max_response_length);
    const GrpoRewardConfig *rw = &c->reward;
    int judged = rw->gsm8k.weight != 0 || rw->boxed.weight != 0 || rw->exact.weight != 0 || rw->by_data_source ||
                 rw->program.weight != 0;
    if (c->algorithm.dynamic_sampling && c->algorithm.filter_metric == GRPO_FILTER_ACC && !judged)
        CONFLICT("algorithm.filter_groups.metric", "algorithm.dynamic_sampling",
                 "algorithm.filter_groups.metric acc needs a reward that judges correctness (reward.gsm8k, "
                 "reward.boxed, reward.exact, reward.by_data_source, or a reward.program replying \"acc\"); filter "
                 "on seq_reward instead");
    if (c->algorithm.dynamic_sampling && c->algorithm.filter_metric == GRPO_FILTER_SEQ_FINAL_REWARD &&
        c->algorithm.use_kl_in_reward)
        CONFLICT("algorithm.filter_groups.metric", "algorithm.use_kl_in_reward",
                 "algorithm.filter_groups.metric seq_final_reward with algorithm.use_kl_in_reward: the KL is "
                 "computed for the groups kept, after the filter; filter on acc or seq_reward");
    if (c->algorithm.adv_estimator == ADV_REINFORCE_PP && c->algorithm.use_kl_in_reward)
        CONFLICT("algorithm.adv_estimator", "algorithm.use_kl_in_reward",
                 "algorithm.adv_estimator reinforce_plus_plus with algorithm.use_kl_in_reward: verl's per-token "
                 "returns-to-go of the KL rewards are not implemented (each response has one advantage here); use "
                 "actor.use_kl_loss, or another estimator");
    const char *rs = c->algorithm.rollout_correction.rollout_rs;
    const char *rs_thr = c->algorithm.rollout_correction.rollout_rs_threshold;
    RolloutRs parsed;
    char why[256];
    if (rs && !rs_thr)
        CONFLICT("algorithm.rollout_correction.rollout_rs", "algorithm.rollout_correction.rollout_rs_threshold",
                 "algorithm.rollout_correction.rollout_rs \"%.100s\" needs algorithm.rollout_correction."
                 "rollout_rs_threshold", rs);
    if (rs && !rollout_rs_parse(rs, rs_thr, &parsed, why, sizeof why))
        CONFLICT("algorithm.rollout_correction.rollout_rs", "algorithm.rollout_correction.rollout_rs_threshold",
                 "algorithm.rollout_correction.rollout_rs: %s", why);
    if (c->reward.program.weight != 0 && !c->reward.program.command)
        CONFLICT("reward.program.weight", "reward.program.command",
                 "reward.program is on but reward.program.command is null");
    int lora = a->lora.rank > 0 || c->model.adapter;
    if (lora && a->vision.train_merger)
        CONFLICT("actor.vision.train_merger", "actor.lora.rank",
                 "actor.vision.train_merger trains the merger fully: it does not combine with LoRA (actor.lora.rank, "
                 "model.adapter) yet");
    if (lora && a->precision != DTYPE_F32)
        CONFLICT("actor.precision", "actor.lora.rank",
                 "actor.precision must be fp32 with LoRA: the adapters train in fp32 and the frozen base is stored "
                 "as actor.lora.base_dtype says");
    if (lora && a->lora.dropout != 0)
        CONFLICT("actor.lora.dropout", "", "actor.lora.dropout %g: only 0 is supported (no dropout on the adapters' "
                 "input yet)", a->lora.dropout);
    if (a->lora.alpha == 0) CONFLICT("actor.lora.alpha", "", "actor.lora.alpha must not be 0");
    unsigned targets = 0;
    for (int i = 0; i < a->lora.target_modules.n; i++)
        if (!lora_targets_add(&targets, a->lora.target_modules.items[i]))
            CONFLICT("actor.lora.target_modules", "", "actor.lora.target_modules: unknown module \"%s\" (q_proj, "
                     "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj or all-linear)",
                     a->lora.target_modules.items[i]);
    const GrpoRewardConfig *r = &c->reward;
    if (r->gsm8k.weight == 0 && r->boxed.weight == 0 && r->format.weight == 0 && r->exact.weight == 0 &&
        r->program.weight == 0 && !(r->reward_model.model_path && r->reward_model.weight != 0) &&
        !(r->judge.model_path && r->judge.weight != 0))
        CONFLICT("reward.gsm8k.weight", "", "every reward weight is 0: there is nothing to learn from");
}

void grpo_config_defaults(GrpoConfig *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < N_KEYS; i++) key_set_scalar(c, &KEYS[i], KEYS[i].def, "the built-in default");
}

void grpo_config_load(GrpoConfig *c, const char *yaml_path, char **overrides, int n_overrides) {
    YamlDoc doc = {0};
    if (yaml_path) {
        file_check_readable("option --config", yaml_path);
        yaml_doc_load_file(&doc, yaml_path);
    }
    int n_file = doc.n;
    // Where each entry came from: "path:line", or the override as typed.
    char **entry_where = NULL;
    int n_where = 0;
    for (int i = 0; i < doc.n; i++) {
        entry_where = xrealloc(entry_where, (size_t)(n_where + 1) * sizeof *entry_where);
        char buf[1100];
        snprintf(buf, sizeof buf, "%s:%d", yaml_path, doc.entries[i].line);
        entry_where[n_where++] = xstrdup(buf);
    }
    for (int i = 0; i < n_overrides; i++) {
        char desc[1100];
        // Quoted in every message about it: a long one (a hostile value) is cut so the reason stays visible.
        int cut = strlen(overrides[i]) > 300;
        snprintf(desc, sizeof desc, "override \"%.300s%s\"", overrides[i], cut ? "..." : "");
        const char *eq = strchr(overrides[i], '=');
        if (!eq) die("%s: expected dotted.key=value", desc);
        if (eq == overrides[i]) die("%s: no key before \"=\"", desc);
        char *key = xmalloc((size_t)(eq - overrides[i]) + 1);
        memcpy(key, overrides[i], (size_t)(eq - overrides[i]));
        key[eq - overrides[i]] = 0;
        yaml_doc_load_value(&doc, key, eq + 1, desc, (int)(eq - overrides[i]) + 1);
        free(key);
        while (n_where < doc.n) {
            entry_where = xrealloc(entry_where, (size_t)(n_where + 1) * sizeof *entry_where);
            entry_where[n_where++] = xstrdup(desc);
        }
    }

    // A file that names reward kinds (any key under reward.<kind>) says which are on: the others go
    // to weight 0, the named ones start at 1 (their weight key, when given, then sets it). Overrides
    // only set what they name.
    int named[N_REWARD_KINDS] = {0}, any_named = 0;
    for (int i = 0; i < n_file; i++) {
        int exact, kind = reward_kind(doc.entries[i].key, &exact);
        if (kind >= 0) named[kind] = any_named = 1;
    }
    if (any_named)
        for (int i = 0; i < N_REWARD_KINDS; i++) {
            const ConfigKey *wk;
            *reward_weight(c, i, &wk) = named[i] ? 1.0 : 0.0;
        }

    char **key_where = xcalloc(N_KEYS, sizeof *key_where);
    for (int i = 0; i < doc.n; i++) apply_entry(c, &doc.entries[i], entry_where[i], key_where);
    check_conflicts(c, key_where);

    for (int i = 0; i < N_KEYS; i++) free(key_where[i]);
    free(key_where);
    for (int i = 0; i < n_where; i++) free(entry_where[i]);
    free(entry_where);
    yaml_doc_free(&doc);
}

void grpo_config_free(GrpoConfig *c) {
    for (int i = 0; i < N_KEYS; i++) {
        void *p = field(c, &KEYS[i]);
        if (KEYS[i].type == KEY_STRING || KEYS[i].type == KEY_MAP)
            free(*(char **)p);
        else if (KEYS[i].type == KEY_LIST)
            list_clear(p);
    }
    memset(c, 0, sizeof *c);
}

// The shortest decimal that reads back as the same double, always with a '.' or an exponent
// ("10.0", "0.001", "1e-06"), like Python's repr.
static void format_double(char buf[48], double x) {
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(buf, 48, "%.*e", prec - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    int exp = atoi(strchr(buf, 'e') + 1);
    if (exp >= prec && exp < 16)
        snprintf(buf, 48, "%.1f", x);  // integral: not "1e+01"
    else
        snprintf(buf, 48, "%.*g", prec, x);
    if (!strpbrk(buf, ".e")) strcat(buf, ".0");
}

static void write_double(FILE *f, double x) {
    char buf[48];
    format_double(buf, x);
    fputs(buf, f);
}

// As write_double, with a '.' before any exponent ("1.0e-06"): YAML 1.1's resolver, PyYAML's,
// reads "1e-06" as a string.
static void write_yaml_double(FILE *f, double x) {
    if (isnan(x)) {
        fputs(".nan", f);
        return;
    }
    if (isinf(x)) {
        fputs(x > 0 ? ".inf" : "-.inf", f);
        return;
    }
    char buf[48];
    format_double(buf, x);
    char *e = strchr(buf, 'e');
    if (e && !memchr(buf, '.', (size_t)(e - buf))) {
        fwrite(buf, 1, (size_t)(e - buf), f);
        fputs(".0", f);
        fputs(e, f);
    } else {
        fputs(buf, f);
    }
}

typedef enum { VALUE_JSON, VALUE_YAML } ValueSyntax;

static void write_str(FILE *f, const char *s, ValueSyntax syn) {
    if (syn == VALUE_YAML)
        yaml_write_string(f, s, strlen(s));
    else
        json_write_string(f, s, strlen(s));
}

// One value in JSON, or in YAML flow style (strings double-quoted, floats as write_yaml_double).
static void write_value(const GrpoConfig *c, const ConfigKey *k, FILE *f, ValueSyntax syn) {
    const void *p = cfield(c, k);
    char v[64];
    switch (k->type) {
        case KEY_INT:
            if (k->nullable && *(const int64_t *)p == 0)
                fputs("null", f);
            else
                fprintf(f, "%lld", (long long)*(const int64_t *)p);
            break;
        case KEY_FLOAT:
            if (syn == VALUE_YAML)
                write_yaml_double(f, *(const double *)p);
            else
                write_double(f, *(const double *)p);
            break;
        case KEY_BOOL: fputs(*(const int *)p ? "true" : "false", f); break;
        case KEY_STRING: {
            const char *s = *(char *const *)p;
            if (s)
                write_str(f, s, syn);
            else
                fputs("null", f);
            break;
        }
        case KEY_MAP: fputs(*(char *const *)p, f); break;  // JSON: a YAML flow mapping too
        case KEY_ENUM:
            enum_value(k, *(const int *)p, v, sizeof v);
            write_str(f, v, syn);
            break;
        case KEY_LIST: {
            const GrpoStrList *l = p;
            fputc('[', f);
            for (int i = 0; i < l->n; i++) {
                if (i) fputs(", ", f);
                write_str(f, l->items[i], syn);
            }
            fputc(']', f);
            break;
        }
    }
}

// Length of the section part both names share, ending at a dot ("actor.lr", "actor.beta1": 6).
static size_t common_section(const char *a, const char *b) {
    size_t n = 0;
    for (size_t i = 0; a[i] && a[i] == b[i]; i++)
        if (a[i] == '.') n = i + 1;
    return n;
}

static int count_dots(const char *s, size_t n) {
    int d = 0;
    for (size_t i = 0; i < n; i++) d += s[i] == '.';
    return d;
}

void grpo_config_print_json(const GrpoConfig *c, FILE *f) {
    const char *prev = "";
    fputc('{', f);
    for (int i = 0; i < N_KEYS; i++) {
        const char *name = KEYS[i].name;
        size_t shared = common_section(prev, name);
        // Close the sections of prev that name leaves, then open the ones it enters.
        for (int d = count_dots(prev, strlen(prev)) - count_dots(prev, shared); d > 0; d--) fputc('}', f);
        if (i) fputs(", ", f);
        const char *s = name + shared;
        for (const char *dot; (dot = strchr(s, '.')); s = dot + 1) {
            json_write_string(f, s, (size_t)(dot - s));
            fputs(": {", f);
        }
        json_write_string(f, s, strlen(s));
        fputs(": ", f);
        write_value(c, &KEYS[i], f, VALUE_JSON);
        prev = name;
    }
    for (int d = count_dots(prev, strlen(prev)); d > 0; d--) fputc('}', f);
    fputc('}', f);
}

void grpo_config_print_yaml(const GrpoConfig *c, FILE *f) {
    const char *prev = "";
    for (int i = 0; i < N_KEYS; i++) {
        const char *name = KEYS[i].name;
        size_t shared = common_section(prev, name);
        int depth = count_dots(name, shared);
        const char *s = name + shared;
        for (const char *dot; (dot = strchr(s, '.')); s = dot + 1, depth++)
            fprintf(f, "%*s%.*s:\n", 2 * depth, "", (int)(dot - s), s);
        fprintf(f, "%*s%s: ", 2 * depth, "", s);
        write_value(c, &KEYS[i], f, VALUE_YAML);
        fputc('\n', f);
        prev = name;
    }
}

// Markdown table cells: '|' would end the cell, even inside `code`.
static void md_cell(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s, f);
    }
}

void grpo_config_print_markdown(FILE *f) {
    fputs("| key | default | allowed | description |\n|---|---|---|---|\n", f);
    for (int i = 0; i < N_KEYS; i++) {
        const ConfigKey *k = &KEYS[i];
        fprintf(f, "| `%s` | ", k->name);
        if (k->type == KEY_LIST && !k->def)
            fputs("`[]`", f);
        else if (!k->def)
            fputs("`null`", f);
        else {
            fputc('`', f);
            md_cell(f, k->def);
            fputc('`', f);
        }
        fputs(" | ", f);
        char want[256];
        key_describe(k, want, sizeof want);
        md_cell(f, want);
        fputs(" | ", f);
        md_cell(f, k->doc);
        fputs(" |\n", f);
    }
}

void grpo_config_print_schema(FILE *f) {
    static const char *const type_names[] = {"int", "float", "bool", "string", "enum", "list", "map"};
    fputs("[", f);
    for (int i = 0; i < N_KEYS; i++) {
        const ConfigKey *k = &KEYS[i];
        fprintf(f, "%s\n{\"name\": \"%s\", \"type\": \"%s\", \"nullable\": %s", i ? "," : "", k->name,
                type_names[k->type], k->nullable ? "true" : "false");
        if (k->type == KEY_INT) fprintf(f, ", \"min\": %lld, \"max\": %lld", (long long)k->imin, (long long)k->imax);
        if (k->type == KEY_FLOAT) {
            fputs(", \"min\": ", f);
            write_double(f, k->fmin);
            fputs(", \"max\": ", f);
            write_double(f, k->fmax);
            fprintf(f, ", \"min_open\": %s", k->fmin_open ? "true" : "false");
        }
        if (k->type == KEY_ENUM) {
            fputs(", \"values\": [", f);
            char v[64];
            for (int j = 0; enum_value(k, j, v, sizeof v); j++) fprintf(f, "%s\"%s\"", j ? ", " : "", v);
            fputs("], \"aliases\": ", f);
            const char *a = k->aliases ? k->aliases : "";
            json_write_string(f, a, strlen(a));
        }
        fputs(", \"doc\": ", f);
        json_write_string(f, k->doc, strlen(k->doc));
        fputc('}', f);
    }
    fputs("\n]\n", f);
}

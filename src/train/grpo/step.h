// The GRPO wing's own types and the functions its files share (src/train/grpo/): a step's batch and what it
// measured, the update's workspace, and the run. The public interface is grpo.h.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "base/arena.h"
#include "model/decoder.h"
#include "model/vision.h"
#include "model/vl.h"
#include "parallel/comm.h"
#include "rl/reward_judge.h"
#include "rl/reward_model.h"
#include "rollout/rollout.h"
#include "rollout/tools.h"
#include "text/tokenizer.h"
#include "train/grpo/grpo.h"
#include "train/prompt_data.h"
#include "train/stream.h"
#include "train/trainer.h"

// One step's batch: its rollout, flattened: sample i belongs to prompt i / G. Kept samples (those that enter
// the loss) are packed in order: sequence = prompt ids + response ids; response token t of kept
// sample k sits at index resp_off[k] + t of the per-response-token arrays.
typedef struct {
    int64_t n_samples, n_kept, n_resp;
    int64_t n_dropped_groups;  // by dynamic sampling
    RolloutSample *samples;
    const int32_t **prompt_ids;
    int64_t *prompt_len;
    const PromptSample **prompt;  // per sample: its prompt's row
    float **feats;        // per prompt (sample i: i / G): its images' features, NULL for none (or a text model)
    // With a trained merger, per prompt: its merger input (vl_prompt_hidden; units rows), the features'
    // gradient while a mini-batch accumulates, and the reference's features (the initial merger's; NULL without
    // a reference: then feats serve)
    float **hidden, **dfeats, **ref_feats;
    int64_t *units;
    float *reward, *adv;  // per sample
    int *correct;         // per sample: 1, 0, or -1 when no reward judges correctness
    int64_t *kept;        // kept sample ids
    float *kept_adv;      // their advantages
    int64_t *resp_off;    // (n_kept + 1)
    int64_t *mb_start;    // (n_mini + 1): mini-batch m holds kept samples mb_start[m] .. mb_start[m+1]-1
    int64_t n_mini;
    float *old_logp, *ref_logp, *logp, *dlogp, *ent, *dent;  // (n_resp)
    uint8_t *mask;        // (n_resp) with tools: 1 for the model's tokens, 0 for the tool turns' (else NULL)
    float *rollout_logp, *is_w;  // (n_resp) with a rollout correction: the rollout's log-probs, the weights
} StepBatch;

// What one step measured, for metrics.jsonl and the progress line.
typedef struct {
    double t0, t_offload, t_roll, t_rew, t_ref, t_old, t_end;  // phase end times (t_ref, t_old 0: skipped)
    double rss_rollout;  // resident memory at the end of rollout (GiB)
    int64_t n_trunc, resp_max, tokens_total, n_acc, n_correct, n_updates;
    int64_t reward_failures;  // reward program calls that failed (scored 0)
    double rm_sum;            // the reward model's scores of the step's samples, added up
    int64_t rm_n, rm_cut;     // how many, and how many were cut at its max_length
    double judge_sum;         // the judge's scores, added up
    int64_t judge_n, judge_failures;
    int64_t n_gen_batches;    // generation batches the rollout took (dynamic sampling: until the batch is full)
    int64_t model_tokens, turns, tool_calls, tool_errors;  // with tools (model_tokens: always)
    double t_tools;           // seconds in tool calls during the rollout
    double kl_reward, norm_sum, lr;
    double probs_diff_max, probs_diff_sum, probs_diff_n;  // |p_rollout - p_old| over the loss tokens
    // the rollout correction's weights (grpo_is_stats): loss tokens, their sum and sum of squares; the ratios above
    // the threshold and below its reciprocal, of is_units (tokens; sequence: responses); the extreme weights
    double is_tokens, is_sum, is_sum2, is_high, is_low, is_units, is_max, is_min;
    double rs_tokens, rs_rejected, rs_seqs, rs_seqs_hit;  // rejection sampling: loss tokens and responses, rejected
    double is_norm;           // rollout_is_batch_normalize: the weights' batch mean they were divided by (0: none)
    GrpoLossStats loss;
} StepStats;

// The update's workspace: training activations for one micro-batch, in the run's workspace arena (the backend's
// memory, where the rollout's KV cache was), and the packed micro-batch as the host makes it.
typedef struct {
    DecoderTrain act;
    // host memory: the packed micro-batch (grpo_pack) and, per response token, the row its log-prob comes from
    int32_t *tokens, *targets;
    int64_t *seq_off, *resp_rows;
    // the backend's: the rows' log-probs and entropies and their gradients; the response tokens' values gathered
    // from (or to scatter into) them, and resp_rows uploaded (the rows to gather)
    float *rows, *drows, *ent_rows, *dent_rows, *resp;
    int64_t *resp_idx;
    int64_t micro;
} UpdateWs;

typedef struct {
    const GrpoSettings *s;  // this rank's share: train_batch_size and mini_batch_size divided by the ranks
    Comm comm;
    int64_t P_global;       // prompts per step over all ranks
    const Backend *be;      // trainer.device: where the trainer, reference and rollout run
    Trainer tr;
    Decoder ref;
    int has_ref;
    Tokenizer tok;
    VlModel vl;  // a vision-language model's frozen vision tower and image processor (has_vl)
    int has_vl;
    int train_merger;     // actor.vision.train_merger: the policy's merger is in the trainer's slab; vl's own
                          // stays the initial one, the reference's
    VisionMerger merger;  // the policy's merger (has_vl): the trainer's, or vl's
    const Backend *merger_be;  // where it runs: the trainer's backend, or vl's
    PromptData train, val;
    int has_val;
    RewardSet rewards;
    RewardModel rm;  // reward.reward_model (has_rm)
    int has_rm;
    RewardJudge judge;  // reward.judge (has_judge)
    int has_judge;
    ToolSet tools;  // multi-turn rollout (has_tools)
    int has_tools;
    ToolHook hook;
    int32_t stop_ids[16];
    int n_stop;
    FILE *metrics, *dump;
    char *metrics_path, *dump_path;  // OUT/metrics.jsonl, OUT/samples.jsonl
    int64_t steps;
    Arena workspace;  // rollout: KV cache; scoring and update: UpdateWs
    GrpoMemPlan plan;
    DecoderQ8 q8;       // rollout.weight_dtype int8: the policy's copies that the rollout decodes with
} Run;

static inline int64_t max_seq_len(const GrpoSettings *s) { return s->max_prompt_length + s->max_response_length; }

// step.c: one GRPO step and its rollout

// Samples prompts idx[0..n) x G with the rollout engine on the policy's weights `m`, in the workspace;
// prompt i is seeded as the batch's prompt pos[i]; feats[i]: its image features (prompt_features).
void grpo_generate(Run *r, const Decoder *m, const PromptData *d, const int64_t *idx, const int64_t *pos, int n, int G,
                   const SamplerConfig *sampler, float *const *feats, RolloutSample *out);
// One GRPO step, as the design's diagram: rollout, rewards, advantages, reference and old
// log-probs, update, metrics. The rollout and the update take turns in r->workspace.
void grpo_step(Run *r, Stream *stream);

// batch.c: the step's batch: rewards, which samples enter the loss, packing

// Packs kept samples [a, b) into the workspace's batch: tokens, targets (the response tokens, each
// predicted from the row before it), seq_off. Returns the number of rows.
int64_t grpo_pack(const StepBatch *sb, int64_t a, int64_t b, UpdateWs *u);
// The rewards of one sample of prompt x (text: its final answer) into *det, with `models` (grpo_model_rewards')
// added; returns the conversation's messages of a multi-turn sample (NULL for single turn), which the caller frees.
char *grpo_score_sample(const Run *r, const PromptSample *x, const RolloutSample *out, const char *text, double models,
                        RewardDetail *det);
// The rewards of models of n samples (sample i of prompt x[i]) into out: the reward model's score of the
// conversation (its response as the assistant's turn) and the judge's of the prompt, the response's last turn and
// the answer, each times its weight (0 without them). Their scores, the conversations the reward model cut at its
// max_length and the judge's failures are added to st (may be NULL).
void grpo_model_rewards(Run *r, const PromptSample *const *x, const RolloutSample *samples, int64_t n, double *out,
                        StepStats *st);
// reward.by_data_source: every row's data_source must name a rule (checked before the run starts).
void grpo_check_data_sources(const PromptData *d, const char *const *paths);
void grpo_step_batch_free(StepBatch *sb, int64_t n_prompts);
// The per-sample arrays of a batch of prompts idx (sample i: prompt i / G): prompts, rewards, advantages, correct.
void grpo_batch_alloc(const Run *r, const int64_t *idx, StepBatch *sb);
// Rewards of every sample (+ the soft overlong penalty); the reward program's failures into st.
void grpo_score_rewards(Run *r, const int64_t *idx, StepBatch *sb, StepStats *st);
// The counts metrics need of a scored batch: accuracy, truncation, lengths, turns.
void grpo_count_samples(const StepBatch *sb, StepStats *st);
// Whether group g of a scored batch passes dynamic sampling's filter: its algorithm.filter_groups.metric
// (correctness, or the reward) is not the same for every response (grpo_group_is_flat's test).
int grpo_group_passes(const GrpoSettings *s, const StepBatch *sb, int64_t g);
// Which samples enter the loss: dynamic sampling drops whole flat groups from the batch, flat in
// algorithm.filter_groups.metric (correctness, or the reward); masking keeps a truncated response's slot in
// its mini-batch (as verl's zero response mask) but not its loss.
void grpo_select_kept(const GrpoSettings *s, StepBatch *sb);
// The advantages (algorithm.adv_estimator) of every sample into sb->adv, and the kept ones' into kept_adv. opo and
// the whitened estimators weigh each kept response by its loss tokens (verl's response mask; the others 0),
// the whitening over the kept responses of every rank.
void grpo_compute_advantages(Run *r, StepBatch *sb);
// Tokens of kept samples [a, b) that enter the loss (the model's own), and how many of those samples have one.
void grpo_count_loss_tokens(const StepBatch *sb, int64_t a, int64_t b, double *n_tok, double *n_seq);
// verl's rollout_probs_diff: how far the rollout's token probabilities are from the trainer's old ones (scored
// before the update, or on-policy the update's first), over the loss tokens; after grpo_update.
void grpo_probs_diff(const StepBatch *sb, StepStats *st);
// verl's compute_is_metrics (rollout_corr_helper.py) over this process's loss tokens, after grpo_update (the weights
// of the trainer's old log-probs): token, the ratios counted before truncation and the extremes of the weights;
// sequence, each response's ratio counted once and the extremes those ratios' (the largest at most e^20).
void grpo_is_stats(const GrpoSettings *s, const StepBatch *sb, StepStats *st);
// verl's compute_rollout_correction_and_rejection_mask once the trainer's old log-probs are scored, before the
// advantages (their masks): grpo_probs_diff, the rollout correction's weights, grpo_is_stats and the weights over
// their batch mean (rollout_is_batch_normalize), then the rejection (algorithm.rollout_correction.rollout_rs):
// sb->mask's rejected tokens 0, counted in st. On-policy (nothing scored before the update) the update computes the
// weights and the step their metrics after it.
void grpo_rollout_correction(Run *r, StepBatch *sb, StepStats *st);
// verl's use_kl_in_reward: token rewards = score - beta * KL(old, ref), summed per sequence.
// Returns the sum over responses of each one's mean KL (the metric divides by the responses).
double grpo_kl_into_reward(const GrpoSettings *s, StepBatch *sb);

// images.c: image features of a VL model's prompts, and a trained merger's backward

// Each prompt's features (host memory) under merger w, which runs on be (hidden: host memory, staged through be's
// memory on a device) into feats[i] when given, else fresh; NULL without images.
float **grpo_merge_features(const Run *r, const Backend *be, const VisionMerger *w, float *const *hidden,
                            const int64_t *units, int n, float **feats);
void grpo_features_free(float **feats, int64_t n);
// The features of prompts idx[0..n) of d under the policy's merger, once per prompt; with a trained merger and
// sb, its merger input, the reference's features and room for their gradients go to sb too.
float **grpo_prompt_features(const Run *r, const PromptData *d, const int64_t *idx, int n,
                             const char *const *paths, StepBatch *sb);
// The image inputs of the micro-batch grpo_pack() made of kept samples [a, b) into *in, and u->act.vl (NULL for
// a text batch): each prompt's features (pf: per prompt), its response rows text after it; with pg (per
// prompt, feats' layout) the backward adds the features' gradients there.
void grpo_pack_images(const Run *r, const Decoder *m, const StepBatch *sb, float *const *pf, float *const *pg,
                      int64_t a, int64_t b, UpdateWs *u, DecoderVlInputs *in);
void grpo_unpack_images(UpdateWs *u, DecoderVlInputs *in);
// A trained merger's gradient (into the trainer's slab) from the features' gradients of the mini-batch just
// accumulated (sb->dfeats, zeroed again); prompts outside it have none.
void grpo_merger_backward(Run *r, StepBatch *sb);

// update.c: the update's workspace, scoring, and the mini-batch / micro-batch update

// The update's workspace on backend be: its bytes in the arena, plus its host part; init lays it out in the arena a
// (of be's memory), free releases the host part.
size_t grpo_update_ws_bytes(const GrpoSettings *s, const DecoderConfig *c, const Backend *be, int64_t micro,
                            int64_t max_seq);
void grpo_update_ws_init(UpdateWs *u, const GrpoSettings *s, const DecoderConfig *c, const Backend *be, Arena *a);
void grpo_update_ws_free(UpdateWs *u);
// Per-response-token log-probs of the kept samples under model m and image features feats (per prompt; no
// gradient), into out.
void grpo_score_kept(const Run *r, const Decoder *m, const StepBatch *sb, float *const *feats, UpdateWs *u,
                     float *out);
// ppo_epochs passes over the mini-batches; clip + AdamW after each (a trained merger's features refreshed
// before each, as its weights move).
void grpo_update(Run *r, StepBatch *sb, int need_old, UpdateWs *u, StepStats *st);

// metrics.c: metrics.jsonl, samples.jsonl and the progress line

// Validation's sums per data_source (in the order they first appear in the validation data; a row without one is
// verl's "unknown") and, last, over every prompt: VAL_N(v) values each, sums over prompts of: 1, the mean accuracy
// and reward of its samples, whether the majority answer is correct (maj@n), and pass@ks[k] (the unbiased
// estimator) for k = 1, 2, 4, ... below n, and n.
enum { VAL_PROMPTS, VAL_ACC, VAL_REWARD, VAL_MAJ, VAL_PASS };
typedef struct {
    int n_src, n, n_k;
    const char **src;
    int ks[16];
    double *sum;  // (n_src + 1) x VAL_N
} ValStats;
#define VAL_N(v) ((size_t)(VAL_PASS + (v)->n_k))

// For the data sources of d and n samples a prompt, the sums zero.
void val_stats_init(ValStats *v, const PromptData *d, int n);
// The sums of data source src (NULL: "unknown"), which val_stats_init found; the sums over every prompt.
double *val_stats_row(ValStats *v, const char *src);
double *val_stats_total(ValStats *v);
void val_stats_free(ValStats *v);

// Resident memory of this process from /proc/self/status: "VmHWM:" (peak; ru_maxrss would carry a
// launching parent's peak over exec) or "VmRSS:" (now), in GiB.
double grpo_rss_gib(const char *key);
void grpo_write_metrics(Run *r, const StepBatch *sb, const StepStats *st);
void grpo_dump_samples(Run *r, const StepBatch *sb, const int64_t *idx);
// A validation line of metrics.jsonl; step 0 is the one before training.
void grpo_write_val_metrics(Run *r, int64_t step, ValStats *v);

// plan.c: the memory plan

void grpo_print_plan(const GrpoMemPlan *p, const Comm *comm);

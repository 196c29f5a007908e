// A step's batch: every sample's rewards, the samples that enter the loss, and their packing into micro-batches.
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/json.h"
#include "base/util.h"
#include "model/lora.h"
#include "text/utf8.h"
#include "train/checkpoint.h"
#include "train/grpo/step.h"

// Packs kept samples [a, b) into the workspace's batch: tokens, targets (the response tokens, each
// predicted from the row before it), seq_off. Returns the number of rows.
int64_t grpo_pack(const StepBatch *sb, int64_t a, int64_t b, UpdateWs *u) {
    int64_t *seq_off = u->seq_off;
    seq_off[0] = 0;
    for (int64_t k = a; k < b; k++) {
        int64_t i = sb->kept[k], off = seq_off[k - a], pl = sb->prompt_len[i];
        const RolloutSample *x = &sb->samples[i];
        int32_t *tokens = u->tokens + off;
        memcpy(tokens, sb->prompt_ids[i], (size_t)pl * 4);
        memcpy(tokens + pl, x->tokens, (size_t)x->n * 4);
        for (int64_t j = 0; j < pl + x->n; j++) u->targets[off + j] = j + 1 >= pl && j + 1 < pl + x->n ? tokens[j + 1] : -1;
        seq_off[k - a + 1] = off + pl + x->n;
    }
    return seq_off[b - a];
}

// The rewards of one sample of prompt x (text: its final answer) and the models' (grpo_model_rewards) into *det;
// returns the conversation's messages of a multi-turn sample (NULL for single turn), which the caller frees.
char *grpo_score_sample(const Run *r, const PromptSample *x, const RolloutSample *out, const char *text, double models,
                        RewardDetail *det) {
    char *msgs = r->has_tools ? rollout_sample_messages(out, x->prompt, x->messages) : NULL;
    RewardRow row = {x->prompt, x->answer, msgs, x->extra_info, -1};
    if (r->s->by_data_source) row.rule = reward_rule_of_data_source(x->data_source);
    reward_score_row(&r->rewards, &row, text, det);
    det->total += models;
    return msgs;
}

// A weighted score that a float reward cannot hold ends the run in one line (the advantages would be NaN).
static double weighted(double weight, float score, const char *key) {
    double v = weight * (double)score;
    if (!isfinite((float)v)) die("%s x a score of %g is %g: not a reward a float holds", key, (double)score, v);
    return v;
}

void grpo_model_rewards(Run *r, const PromptSample *const *x, const RolloutSample *samples, int64_t n, double *out,
                        StepStats *st) {
    StepStats none = {0};
    if (!st) st = &none;
    float *score = xmalloc((size_t)(n + 1) * sizeof *score);
    char **text = xmalloc((size_t)(n + 1) * sizeof *text);
    for (int64_t i = 0; i < n; i++) out[i] = 0.0;
    if (r->has_rm) {
        for (int64_t i = 0; i < n; i++) text[i] = rollout_sample_messages(&samples[i], x[i]->prompt, x[i]->messages);
        st->rm_cut += reward_model_score(&r->rm, n, (const char *const *)text, score);
        for (int64_t i = 0; i < n; i++) {
            free(text[i]);
            out[i] += weighted(r->s->rm_weight, score[i], "reward.reward_model.weight");
            st->rm_sum += score[i];
        }
        st->rm_n += n;
    }
    if (r->has_judge) {
        const char **prompt = xmalloc((size_t)(n + 1) * sizeof *prompt);
        const char **answer = xmalloc((size_t)(n + 1) * sizeof *answer);
        for (int64_t i = 0; i < n; i++) {
            text[i] = rollout_sample_final_text(&samples[i]);
            prompt[i] = x[i]->prompt, answer[i] = x[i]->answer;
        }
        st->judge_failures += reward_judge_score(&r->judge, n, prompt, (const char *const *)text, answer, score);
        for (int64_t i = 0; i < n; i++) {
            free(text[i]);
            out[i] += weighted(r->s->judge_weight, score[i], "reward.judge.weight");
            st->judge_sum += score[i];
        }
        st->judge_n += n;
        free(prompt), free(answer);
    }
    free(score), free(text);
}

// reward.by_data_source: every row's data_source must name a rule (checked before the run starts).
void grpo_check_data_sources(const PromptData *d, const char *const *paths) {
    for (int64_t i = 0; i < d->n; i++) {
        const PromptSample *x = &d->s[i];
        if (reward_rule_of_data_source(x->data_source) >= 0) continue;
        char *shown = x->data_source ? xprintf("data_source \"%s\"", x->data_source) : xstrdup("no data_source");
        die("%s%s%lld: %s has no rule reward (reward.by_data_source knows openai/gsm8k, lighteval/MATH, "
            "DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500)", paths[x->file],
            x->parquet ? ": row " : ":", (long long)x->line, shown);
    }
}

void grpo_step_batch_free(StepBatch *sb, int64_t n_prompts) {
    grpo_features_free(sb->feats, n_prompts);
    grpo_features_free(sb->hidden, n_prompts);
    grpo_features_free(sb->dfeats, n_prompts);
    grpo_features_free(sb->ref_feats, n_prompts);
    free(sb->units);
    for (int64_t i = 0; i < sb->n_samples; i++) rollout_sample_free(&sb->samples[i]);
    free(sb->samples), free(sb->prompt_ids), free(sb->prompt_len), free(sb->prompt);
    free(sb->reward), free(sb->adv), free(sb->correct);
    free(sb->kept), free(sb->kept_adv), free(sb->resp_off), free(sb->mb_start), free(sb->old_logp), free(sb->ref_logp);
    free(sb->logp), free(sb->dlogp), free(sb->ent), free(sb->dent), free(sb->mask);
    free(sb->rollout_logp), free(sb->is_w);
}

// The per-sample arrays of a batch of prompts idx (sample i: prompt i / G): prompts, rewards, advantages, correct.
void grpo_batch_alloc(const Run *r, const int64_t *idx, StepBatch *sb) {
    int64_t n = sb->n_samples;
    sb->prompt_ids = xmalloc((size_t)n * sizeof *sb->prompt_ids), sb->prompt_len = xmalloc((size_t)n * 8);
    sb->prompt = xmalloc((size_t)n * sizeof *sb->prompt);
    sb->reward = xmalloc((size_t)n * 4), sb->adv = xmalloc((size_t)n * 4), sb->correct = xmalloc((size_t)n * sizeof(int));
    for (int64_t i = 0; i < n; i++) {
        const PromptSample *x = &r->train.s[idx[i / r->s->G]];
        sb->prompt[i] = x;
        sb->prompt_ids[i] = x->ids;
        sb->prompt_len[i] = x->len;
    }
}

// Rewards of every sample (+ the soft overlong penalty); the reward program's failures into st.
void grpo_score_rewards(Run *r, const int64_t *idx, StepBatch *sb, StepStats *st) {
    const GrpoSettings *s = r->s;
    grpo_batch_alloc(r, idx, sb);
    double *models = xmalloc(((size_t)sb->n_samples + 1) * sizeof *models);
    grpo_model_rewards(r, sb->prompt, sb->samples, sb->n_samples, models, st);
    for (int64_t i = 0; i < sb->n_samples; i++) {
        const RolloutSample *x = &sb->samples[i];
        char *text = rollout_sample_final_text(x);  // after tool turns: the model's last turn
        RewardDetail det;
        char *msgs = grpo_score_sample(r, sb->prompt[i], x, text, models[i], &det);
        double rw = det.total;
        free(text);
        free(msgs);
        int64_t lim = s->max_response_length - s->overlong_buffer;
        if (s->overlong_buffer > 0 && x->n > lim) rw -= (double)(x->n - lim) / (double)s->overlong_buffer * s->overlong_penalty;
        sb->reward[i] = (float)rw;
        sb->correct[i] = det.correct;
        st->reward_failures += det.program_failures;
    }
    free(models);
}

// The counts metrics need of a scored batch: accuracy, truncation, lengths, turns.
void grpo_count_samples(const StepBatch *sb, StepStats *st) {
    for (int64_t i = 0; i < sb->n_samples; i++) {
        const RolloutSample *x = &sb->samples[i];
        st->n_acc += sb->correct[i] >= 0, st->n_correct += sb->correct[i] == 1;
        st->n_trunc += x->finish == FINISH_LENGTH;
        int64_t own = x->n;  // the model's tokens (tool turns' not counted)
        for (int t = 0; x->mask && t < x->n; t++) own -= !x->mask[t];
        st->model_tokens += own;
        st->resp_max = own > st->resp_max ? own : st->resp_max;
        st->tokens_total += sb->prompt_len[i] + x->n;
        st->turns += x->turns;
    }
}

// Whether group g of a scored batch passes dynamic sampling's filter: its algorithm.filter_groups.metric
// (correctness, or the reward) is not the same for every response (grpo_group_is_flat's test).
int grpo_group_passes(const GrpoSettings *s, const StepBatch *sb, int64_t g) {
    if (!s->filter_acc) return !grpo_group_is_flat(sb->reward + g * s->G, s->G);
    for (int i = 0; i < s->G; i++)
        if (sb->correct[g * s->G + i] < 0)
            die("algorithm.filter_groups.metric acc: no reward judged a response's correctness (the reward program's "
                "reply has no \"acc\"); filter on seq_reward, or reply \"acc\"");
    for (int i = 1; i < s->G; i++)
        if (sb->correct[g * s->G + i] != sb->correct[g * s->G]) return 1;
    return s->G < 2;
}

// Which samples enter the loss: dynamic sampling drops whole flat groups from the batch, flat in
// algorithm.filter_groups.metric (correctness, or the reward); masking keeps a truncated response's slot in
// its mini-batch (as verl's zero response mask) but not its loss.
void grpo_select_kept(const GrpoSettings *s, StepBatch *sb) {
    int64_t n = sb->n_samples, n_slots = 0;
    sb->kept = xmalloc((size_t)n * 8), sb->kept_adv = xmalloc((size_t)n * 4), sb->resp_off = xmalloc((size_t)(n + 1) * 8);
    sb->mb_start = xmalloc((size_t)(n / s->mini_batch_size + 2) * 8);
    sb->resp_off[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        int flat = s->dynamic_sampling && !grpo_group_passes(s, sb, i / s->G);
        sb->n_dropped_groups += flat && i % s->G == 0;
        if (flat) continue;
        for (int64_t slot = n_slots++; sb->n_mini <= slot / s->mini_batch_size;) sb->mb_start[sb->n_mini++] = sb->n_kept;
        if (s->mask_truncated && sb->samples[i].finish == FINISH_LENGTH) continue;
        sb->kept[sb->n_kept] = i;
        sb->resp_off[sb->n_kept + 1] = sb->resp_off[sb->n_kept] + sb->samples[i].n;
        sb->n_kept++;
    }
    sb->mb_start[sb->n_mini] = sb->n_kept;
    sb->n_resp = sb->resp_off[sb->n_kept];
    size_t bytes = (size_t)sb->n_resp * 4 + 4;
    sb->old_logp = xmalloc(bytes), sb->ref_logp = xmalloc(bytes), sb->logp = xmalloc(bytes), sb->dlogp = xmalloc(bytes);
    sb->ent = xmalloc(bytes), sb->dent = xmalloc(bytes);
    if (s->rollout_is || s->rollout_rs.n) {
        sb->rollout_logp = xmalloc(bytes), sb->is_w = s->rollout_is ? xmalloc(bytes) : NULL;
        for (int64_t k = 0; k < sb->n_kept; k++)
            memcpy(sb->rollout_logp + sb->resp_off[k], sb->samples[sb->kept[k]].logprobs,
                   (size_t)(sb->resp_off[k + 1] - sb->resp_off[k]) * sizeof(float));
    }
    if (!sb->samples[0].mask && !s->rollout_rs.n) return;
    sb->mask = xmalloc((size_t)sb->n_resp + 1);  // rejection sampling writes its 0s here
    memset(sb->mask, 1, (size_t)sb->n_resp + 1);
    for (int64_t k = 0; k < sb->n_kept && sb->samples[0].mask; k++)
        memcpy(sb->mask + sb->resp_off[k], sb->samples[sb->kept[k]].mask, (size_t)sb->samples[sb->kept[k]].n);
}

// The advantages (algorithm.adv_estimator) of every sample into sb->adv, and the kept ones' into kept_adv. opo and
// the whitened estimators weigh each kept response by its loss tokens (verl's response mask; the others 0),
// the whitening over the kept responses of every rank.
void grpo_compute_advantages(Run *r, StepBatch *sb) {
    const GrpoSettings *s = r->s;
    int64_t n = sb->n_samples;
    double *len = xcalloc((size_t)n, sizeof *len), seqs;
    float *r_eff = xmalloc((size_t)n * sizeof *r_eff);
    memcpy(r_eff, sb->reward, (size_t)n * sizeof *r_eff);
    for (int64_t k = 0; k < sb->n_kept; k++) {
        grpo_count_loss_tokens(sb, k, k + 1, &len[sb->kept[k]], &seqs);
        int last_out = sb->mask && sb->resp_off[k + 1] > sb->resp_off[k] && !sb->mask[sb->resp_off[k + 1] - 1];
        if (s->adv_estimator == ADV_REINFORCE_PP && last_out) r_eff[sb->kept[k]] = 0.0f;  // its reward's token
    }
    outcome_advantages(s->adv_estimator, r_eff, len, n / s->G, s->G, s->norm_adv_by_std, 1e-6f, sb->adv);
    free(r_eff);
    if (adv_estimator_whitens(s->adv_estimator)) {
        double sum[3] = {0};
        for (int pass = 0; pass < 2; pass++) {  // token counts and sums; then squares about the mean
            advantages_whiten_sums(sb->adv, len, n, pass, sum);
            comm_allreduce_f64(&r->comm, sum + 2 * pass, 2 - pass, COMM_SUM, "advantage whitening");
        }
        if (!advantages_whiten(sb->adv, n, sum) && r->comm.rank == 0)
            fprintf(stderr, "grpo: warning: step %lld: %.0f loss token(s) in the batch: advantages not whitened\n",
                    (long long)r->tr.st.iteration + 1, sum[0]);
    }
    for (int64_t k = 0; k < sb->n_kept; k++) sb->kept_adv[k] = sb->adv[sb->kept[k]];
    free(len);
}

// Tokens of kept samples [a, b) that enter the loss (the model's own), and how many of those samples have one.
void grpo_count_loss_tokens(const StepBatch *sb, int64_t a, int64_t b, double *n_tok, double *n_seq) {
    *n_tok = *n_seq = 0;
    for (int64_t k = a; k < b; k++) {
        int64_t own = 0;
        for (int64_t t = sb->resp_off[k]; t < sb->resp_off[k + 1]; t++) own += !sb->mask || sb->mask[t];
        *n_tok += (double)own;
        *n_seq += own > 0;
    }
}

// verl's rollout_probs_diff: how far the rollout's token probabilities are from the trainer's old ones (the
// same weights: only the two forwards' numerics, an int8 rollout's rounding, or a disagreement between them),
// over the loss tokens.
void grpo_probs_diff(const StepBatch *sb, StepStats *st) {
    for (int64_t k = 0; k < sb->n_kept; k++) {
        const RolloutSample *x = &sb->samples[sb->kept[k]];
        for (int64_t t = sb->resp_off[k]; t < sb->resp_off[k + 1]; t++) {
            if (sb->mask && !sb->mask[t]) continue;
            double d = fabs(exp((double)x->logprobs[t - sb->resp_off[k]]) - exp((double)sb->old_logp[t]));
            st->probs_diff_max = d > st->probs_diff_max ? d : st->probs_diff_max;
            st->probs_diff_sum += d;
            st->probs_diff_n += 1.0;
        }
    }
}

// verl's rollout_is_batch_normalize: the weights' mean over every rank's loss tokens (sequence: over the responses
// with one, each its weight), and the weights divided by it when it is above 1e-8 (verl's). Returns the mean.
static double is_batch_normalize(Run *r, StepBatch *sb) {
    double sum[2] = {0};
    for (int64_t k = 0; k < sb->n_kept; k++)
        for (int64_t t = sb->resp_off[k]; t < sb->resp_off[k + 1]; t++) {
            if (sb->mask && !sb->mask[t]) continue;
            sum[0] += sb->is_w[t], sum[1] += 1.0;
            if (r->s->rollout_is == 2) break;  // one weight a response
        }
    comm_allreduce_f64(&r->comm, sum, 2, COMM_SUM, "rollout correction mean");
    double mean = sum[1] > 0 ? sum[0] / sum[1] : 0.0;
    for (int64_t t = 0; t < sb->n_resp && mean > 1e-8; t++) sb->is_w[t] = (float)(sb->is_w[t] / mean);
    return mean;
}

void grpo_rollout_correction(Run *r, StepBatch *sb, StepStats *st) {
    const GrpoSettings *s = r->s;
    grpo_probs_diff(sb, st);
    for (int64_t k = 0; k < sb->n_kept && s->rollout_is; k++)
        rollout_is_weights(s->rollout_is == 2, s->rollout_is_threshold, sb->old_logp, sb->rollout_logp, sb->mask,
                           sb->resp_off[k], sb->resp_off[k + 1], sb->is_w);
    if (s->rollout_is) grpo_is_stats(s, sb, st);
    if (s->rollout_is && s->rollout_is_batch_normalize) st->is_norm = is_batch_normalize(r, sb);
    for (int64_t k = 0; k < sb->n_kept && s->rollout_rs.n; k++) {
        double tokens, seqs;
        grpo_count_loss_tokens(sb, k, k + 1, &tokens, &seqs);
        int64_t out = rollout_rs_apply(&s->rollout_rs, sb->old_logp, sb->rollout_logp, sb->mask, sb->resp_off[k],
                                       sb->resp_off[k + 1]);
        st->rs_tokens += tokens, st->rs_rejected += (double)out, st->rs_seqs += seqs, st->rs_seqs_hit += out > 0;
    }
}

void grpo_is_stats(const GrpoSettings *s, const StepBatch *sb, StepStats *st) {
    double thr = s->rollout_is_threshold;
    st->is_max = -INFINITY, st->is_min = INFINITY;
    for (int64_t k = 0; k < sb->n_kept; k++) {
        double lr_sum = 0.0;
        int64_t own = 0;
        for (int64_t t = sb->resp_off[k]; t < sb->resp_off[k + 1]; t++) {
            if (sb->mask && !sb->mask[t]) continue;
            double lr = (double)sb->old_logp[t] - (double)sb->rollout_logp[t], w = sb->is_w[t];
            lr_sum += lr;
            own++;
            st->is_tokens += 1.0, st->is_sum += w, st->is_sum2 += w * w;
            if (s->rollout_is == 2) continue;
            double raw = exp(fmin(fmax(lr, -20.0), 20.0));
            st->is_high += raw > thr, st->is_low += raw < 1.0 / thr, st->is_units += 1.0;
            st->is_max = fmax(st->is_max, w), st->is_min = fmin(st->is_min, w);
        }
        if (s->rollout_is != 2 || !own) continue;
        st->is_high += lr_sum > log(thr), st->is_low += lr_sum < log(1.0 / thr), st->is_units += 1.0;
        st->is_max = fmax(st->is_max, exp(fmin(lr_sum, 20.0))), st->is_min = fmin(st->is_min, exp(lr_sum));
    }
}

// verl's use_kl_in_reward: token rewards = score - beta * KL(old, ref), summed per sequence.
// Returns the sum over responses of each one's mean KL (the metric divides by the responses).
double grpo_kl_into_reward(const GrpoSettings *s, StepBatch *sb) {
    double sum = 0.0;
    for (int64_t k = 0; k < sb->n_kept; k++) {
        double kl = 0.0, len = 0.0;
        for (int64_t t = sb->resp_off[k]; t < sb->resp_off[k + 1]; t++) {
            if (sb->mask && !sb->mask[t]) continue;  // a tool's token: not the policy's
            kl += kl_estimate(s->loss.kl, sb->old_logp[t], sb->ref_logp[t], NULL);
            len += 1.0;
        }
        sb->reward[sb->kept[k]] -= (float)(s->loss.kl_coef * kl);
        sum += len > 0 ? kl / len : 0.0;
    }
    return sum;
}

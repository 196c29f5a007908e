// What a step measured: metrics.jsonl, samples.jsonl and the progress line.
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

// Resident memory of this process from /proc/self/status: "VmHWM:" (peak; ru_maxrss would carry a
// launching parent's peak over exec) or "VmRSS:" (now), in GiB.
double grpo_rss_gib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, strlen(key)) == 0) kib = atoll(line + strlen(key));
    if (f) fclose(f);
    return (double)kib / 1048576.0;
}

// Sums over the ranks of what the metrics need (each rank's loss statistics are already its share).
enum { M_REWARD, M_LEN, M_TRUNC, M_ACC, M_CORRECT, M_TOKENS, M_KEPT, M_RESP, M_PG, M_CLIP, M_ENT, M_KL,
       M_KL_REWARD, M_REWARD_FAIL, M_TURNS, M_TOOL_CALLS, M_TOOL_ERRORS, M_DROPPED, M_RM_SUM, M_RM_N, M_RM_CUT,
       M_JUDGE_SUM, M_JUDGE_N, M_JUDGE_FAIL, M_N };

// , "key": x (null when x is not finite: JSON has no NaN)
static void write_key_number(FILE *f, const char *key, double x) {
    fprintf(f, ", \"%s\": ", key);
    json_write_number(f, x);
}

void grpo_write_metrics(Run *r, const StepBatch *sb, const StepStats *st) {
    const GrpoSettings *s = r->s;
    double sum[M_N] = {0}, mx[3] = {(double)st->resp_max, st->loss.ratio_max, -st->loss.ratio_min};
    for (int64_t i = 0; i < sb->n_samples; i++) sum[M_REWARD] += sb->reward[i];
    sum[M_LEN] = (double)st->model_tokens;  // with tools, the model's tokens only
    sum[M_TURNS] = (double)st->turns, sum[M_TOOL_CALLS] = (double)st->tool_calls;
    sum[M_TOOL_ERRORS] = (double)st->tool_errors;
    sum[M_TRUNC] = (double)st->n_trunc, sum[M_ACC] = (double)st->n_acc, sum[M_CORRECT] = (double)st->n_correct;
    sum[M_TOKENS] = (double)st->tokens_total, sum[M_KEPT] = (double)sb->n_kept, sum[M_RESP] = (double)sb->n_resp;
    sum[M_PG] = st->loss.pg_loss, sum[M_CLIP] = st->loss.clip_frac, sum[M_ENT] = st->loss.entropy, sum[M_KL] = st->loss.kl;
    sum[M_KL_REWARD] = st->kl_reward, sum[M_REWARD_FAIL] = (double)st->reward_failures;
    sum[M_DROPPED] = (double)sb->n_dropped_groups;
    sum[M_RM_SUM] = st->rm_sum, sum[M_RM_N] = (double)st->rm_n, sum[M_RM_CUT] = (double)st->rm_cut;
    sum[M_JUDGE_SUM] = st->judge_sum, sum[M_JUDGE_N] = (double)st->judge_n;
    sum[M_JUDGE_FAIL] = (double)st->judge_failures;
    comm_allreduce_f64(&r->comm, sum, M_N, COMM_SUM, "metrics");
    comm_allreduce_f64(&r->comm, mx, 3, COMM_MAX, "metrics");
    double diff[3] = {st->probs_diff_max, st->probs_diff_sum, st->probs_diff_n};
    comm_allreduce_f64(&r->comm, diff, 1, COMM_MAX, "metrics");
    comm_allreduce_f64(&r->comm, diff + 1, 2, COMM_SUM, "metrics");
    double is[8] = {st->is_tokens, st->is_sum, st->is_sum2, st->is_high, st->is_low, st->is_units, st->is_max,
                    -st->is_min};
    comm_allreduce_f64(&r->comm, is, 6, COMM_SUM, "metrics");
    comm_allreduce_f64(&r->comm, is + 6, 2, COMM_MAX, "metrics");
    double rs[4] = {st->rs_tokens, st->rs_rejected, st->rs_seqs, st->rs_seqs_hit};
    comm_allreduce_f64(&r->comm, rs, 4, COMM_SUM, "metrics");
    double n = (double)(sb->n_samples * r->comm.size), rmean = sum[M_REWARD] / n, rlen = sum[M_LEN] / n, rvar = 0;
    for (int64_t i = 0; i < sb->n_samples; i++) rvar += (sb->reward[i] - rmean) * (sb->reward[i] - rmean);
    comm_allreduce_f64(&r->comm, &rvar, 1, COMM_SUM, "metrics");  // two passes: exact 0 for equal rewards
    if (r->comm.rank != 0) return;

    double rstd = sqrt(rvar / n);
    double upd = (double)(s->ppo_epochs * (sb->n_mini ? sb->n_mini : 1));
    double kl = s->use_kl_in_reward ? (sum[M_KEPT] ? sum[M_KL_REWARD] / sum[M_KEPT] : 0.0) : sum[M_KL] / upd;
    double acc = sum[M_ACC] ? sum[M_CORRECT] / sum[M_ACC] : NAN;
    double t_ref = st->t_ref ? st->t_ref - st->t_rew : 0.0, t_old = st->t_old ? st->t_old - (st->t_ref ? st->t_ref : st->t_rew) : 0.0;
    double t_upd = st->t_end - (st->t_old ? st->t_old : st->t_ref ? st->t_ref : st->t_rew), dt = st->t_end - st->t0;
    double tok_s = sum[M_TOKENS] / r->comm.size / dt;  // per process (device)
    FILE *f = r->metrics;
    fprintf(f, "{\"step\": %lld, \"reward_mean\": %.6g, \"reward_std\": %.6g, \"accuracy\": ", (long long)r->tr.st.iteration,
            rmean, rstd);
    json_write_number(f, acc);
    fprintf(f, ", \"kl\": ");
    json_write_number(f, r->has_ref ? kl : NAN);
    fprintf(f, ", \"entropy\": ");
    json_write_number(f, sum[M_RESP] ? sum[M_ENT] / upd : NAN);
    fprintf(f, ", \"pg_loss\": %.6g, \"clip_frac\": %.6g, \"ratio_min\": ", sum[M_PG] / upd, sum[M_CLIP] / upd);
    json_write_number(f, -mx[2]);
    fprintf(f, ", \"ratio_max\": ");
    json_write_number(f, mx[1]);
    fprintf(f, ", \"response_length_mean\": %.6g, \"response_length_max\": %.0f, \"truncated_frac\": %.6g, \"kept\": %.0f, "
            "\"grad_norm\": ", rlen, mx[0], sum[M_TRUNC] / n, sum[M_KEPT]);
    json_write_number(f, st->n_updates ? st->norm_sum / (double)st->n_updates : NAN);
    fprintf(f, ", \"lr\": %.6g, \"time_offload_s\": %.4f, \"time_rollout_s\": %.4f, \"time_reward_s\": %.4f, "
            "\"time_reference_s\": %.4f, \"time_old_logprob_s\": %.4f, \"time_update_s\": %.4f, \"time_step_s\": %.4f, "
            "\"tokens_per_s\": %.1f, \"rss_rollout_gib\": %.3f, \"peak_rss_gib\": %.3f, \"reward_failures\": %.0f",
            st->lr, st->t_offload - st->t0, st->t_roll - st->t_offload, st->t_rew - st->t_roll, t_ref, t_old, t_upd, dt,
            tok_s, st->rss_rollout, grpo_rss_gib("VmHWM:"), sum[M_REWARD_FAIL]);
    const Backend *be = r->tr.be;
    if (be->memory_peak)  // a device's memory, measured against its plan
        fprintf(f, ", \"device_peak_bytes\": %zu, \"device_planned_bytes\": %zu", be->memory_peak(be), r->plan.peak);
    if (diff[2] > 0) {  // how far the rollout's log-probs were from the trainer's
        write_key_number(f, "rollout_probs_diff_max", diff[0]);
        write_key_number(f, "rollout_probs_diff_mean", diff[1] / diff[2]);
    }
    if (s->rollout_is && is[0] > 0) {  // verl's compute_is_metrics (its ESS: the weights over their mean + 1e-8)
        double mean = is[1] / is[0], var = is[2] / is[0] - mean * mean;
        write_key_number(f, "rollout_is_mean", mean);
        write_key_number(f, "rollout_is_std", is[0] > 1 ? sqrt(fmax(var, 0.0)) : 0.0);
        write_key_number(f, "rollout_is_max", is[6]);
        write_key_number(f, "rollout_is_min", -is[7]);
        write_key_number(f, "rollout_is_eff_sample_size", (mean + 1e-8) * (mean + 1e-8) / (is[2] / is[0]));
        write_key_number(f, "rollout_is_ratio_fraction_high", is[3] / is[5]);
        write_key_number(f, "rollout_is_ratio_fraction_low", is[4] / is[5]);
        if (s->rollout_is_batch_normalize)  // the same on every rank (allreduced)
            write_key_number(f, "rollout_is_batch_norm_factor", st->is_norm > 1e-8 ? st->is_norm : 1.0);
    }
    if (s->rollout_rs.n) {  // verl's: the loss tokens rejected, the responses with a token rejected
        write_key_number(f, "rollout_rs_masked_fraction", rs[0] > 0 ? rs[1] / rs[0] : 0.0);
        write_key_number(f, "rollout_rs_seq_masked_fraction", rs[2] > 0 ? rs[3] / rs[2] : 0.0);
    }
    if (r->has_rm) {  // every sample the step scored (dynamic sampling: every generation batch's)
        write_key_number(f, "reward_model_score_mean", sum[M_RM_N] > 0 ? sum[M_RM_SUM] / sum[M_RM_N] : NAN);
        fprintf(f, ", \"reward_model_truncated\": %.0f", sum[M_RM_CUT]);
    }
    if (r->has_judge) {  // failures count at reward.judge.failure_score
        write_key_number(f, "judge_score_mean", sum[M_JUDGE_N] > 0 ? sum[M_JUDGE_SUM] / sum[M_JUDGE_N] : NAN);
        fprintf(f, ", \"judge_failures\": %.0f", sum[M_JUDGE_FAIL]);
    }
    if (s->dynamic_sampling)
        fprintf(f, ", \"num_gen_batches\": %lld, \"groups_dropped\": %.0f", (long long)st->n_gen_batches, sum[M_DROPPED]);
    if (r->has_tools)
        fprintf(f, ", \"turns_mean\": %.6g, \"tool_calls\": %.0f, \"tool_errors\": %.0f, \"time_tools_s\": %.4f",
                sum[M_TURNS] / n, sum[M_TOOL_CALLS], sum[M_TOOL_ERRORS], st->t_tools);
    fputs("}\n", f);
    file_flush(f, r->metrics_path);
    if (sum[M_REWARD_FAIL] > 0)  // they scored 0: say so, not only in the metrics
        fprintf(stderr, "grpo: warning: step %lld: %.0f reward program call%s failed and scored 0 (last: %s)\n",
                (long long)r->tr.st.iteration, sum[M_REWARD_FAIL], sum[M_REWARD_FAIL] == 1 ? "" : "s",
                reward_last_error(&r->rewards));
    if (sum[M_RM_CUT] > 0)
        fprintf(stderr, "grpo: warning: step %lld: %.0f conversation(s) longer than reward.reward_model.max_length "
                "were cut to their last tokens\n", (long long)r->tr.st.iteration, sum[M_RM_CUT]);
    if (sum[M_JUDGE_FAIL] > 0)
        fprintf(stderr, "grpo: warning: step %lld: %.0f of %.0f judgements had no score (no match of "
                "reward.judge.regex, or a rubric past reward.judge.max_length) and scored %g\n",
                (long long)r->tr.st.iteration, sum[M_JUDGE_FAIL], sum[M_JUDGE_N], s->judge.failure_score);
    fprintf(stderr, "grpo train: step %lld/%lld | reward %.3f | acc %.3f | kl %.4g | clip %.3f | len %.1f | %.0f tok/s | %.1f s\n",
            (long long)r->tr.st.iteration, (long long)r->steps, rmean, acc, kl, sum[M_CLIP] / upd, rlen, tok_s, dt);
}

void grpo_dump_samples(Run *r, const StepBatch *sb, const int64_t *idx) {
    FILE *f = r->dump;
    for (int64_t i = 0; i < sb->n_samples; i++) {
        int64_t p = idx[i / r->s->G];
        char *text = rollout_sample_text(&sb->samples[i]);
        fprintf(f, "{\"step\": %lld, \"prompt_index\": %lld, \"sample\": %lld, \"prompt\": ", (long long)r->tr.st.iteration,
                (long long)p, (long long)(i % r->s->G));
        json_write_string(f, r->train.s[p].prompt, strlen(r->train.s[p].prompt));
        fprintf(f, ", \"prompt_ids\": [");
        for (int64_t j = 0; j < sb->prompt_len[i]; j++) fprintf(f, j ? ", %d" : "%d", sb->prompt_ids[i][j]);
        fprintf(f, "], \"response_ids\": [");
        for (int j = 0; j < sb->samples[i].n; j++) fprintf(f, j ? ", %d" : "%d", sb->samples[i].tokens[j]);
        fprintf(f, "], \"logprobs\": [");  // the rollout's, under softmax(logits / temperature)
        for (int j = 0; j < sb->samples[i].n; j++)
            fprintf(f, j ? ", %.9g" : "%.9g", (double)sb->samples[i].logprobs[j]);
        fprintf(f, "], \"response\": ");
        Buf clean = {0};  // valid UTF-8, as the reward program saw it
        utf8_append_lossy(&clean, text, strlen(text));
        json_write_string(f, clean.data ? clean.data : "", clean.len);
        buf_free(&clean);
        fprintf(f, ", \"reward\": %.9g, \"advantage\": %.9g, \"correct\": %d", (double)sb->reward[i],
                (double)sb->adv[i], sb->correct[i]);
        if (sb->samples[i].mask) {  // tools: the model's tokens (1) and the tool turns' (0), the turns taken
            fprintf(f, ", \"mask\": [");
            for (int j = 0; j < sb->samples[i].n; j++) fprintf(f, j ? ", %d" : "%d", sb->samples[i].mask[j]);
            fprintf(f, "], \"turns\": %d", sb->samples[i].turns);
        }
        fputs("}\n", f);
        free(text);
    }
    file_flush(f, r->dump_path);
}

// A validation line of metrics.jsonl; step 0 is the accuracy before training.
static const char *val_source(const char *src) { return src ? src : "unknown"; }

void val_stats_init(ValStats *v, const PromptData *d, int n) {
    *v = (ValStats){.n = n};
    v->src = xmalloc((size_t)(d->n + 1) * sizeof *v->src);
    for (int64_t i = 0; i < d->n; i++) {
        const char *src = val_source(d->s[i].data_source);
        int seen = 0;
        for (int j = 0; j < v->n_src && !seen; j++) seen = !strcmp(v->src[j], src);
        if (!seen) v->src[v->n_src++] = src;
    }
    for (int k = 1; k < n; k *= 2) v->ks[v->n_k++] = k;
    v->ks[v->n_k++] = n;
    v->sum = xcalloc((size_t)(v->n_src + 1) * VAL_N(v), sizeof *v->sum);
}

double *val_stats_row(ValStats *v, const char *src) {
    src = val_source(src);
    for (int j = 0; j < v->n_src; j++)
        if (!strcmp(v->src[j], src)) return v->sum + (size_t)j * VAL_N(v);
    die("internal: validation data source \"%s\" not counted", src);
}

double *val_stats_total(ValStats *v) { return v->sum + (size_t)v->n_src * VAL_N(v); }

void val_stats_free(ValStats *v) {
    free(v->src);
    free(v->sum);
}

// One metric "val/SOURCE/WHAT": the sum over the source's prompts, as their mean.
static void write_val_metric(FILE *f, const char *src, const char *what, double sum, double prompts) {
    char *key = xprintf("val/%s/%s", src, what);
    fputs(", ", f);
    json_write_string(f, key, strlen(key));
    fprintf(f, ": %.6g", sum / prompts);
    free(key);
}

void grpo_write_val_metrics(Run *r, int64_t step, ValStats *v) {
    FILE *f = r->metrics;
    const double *all = val_stats_total(v);
    fprintf(f, "{\"step\": %lld, \"val_accuracy\": %.6g", (long long)step, all[VAL_ACC] / all[VAL_PROMPTS]);
    for (int j = 0; j < v->n_src; j++) {
        const double *x = v->sum + (size_t)j * VAL_N(v);
        char what[64];
        snprintf(what, sizeof what, "acc/mean@%d", v->n);
        write_val_metric(f, v->src[j], what, x[VAL_ACC], x[VAL_PROMPTS]);
        snprintf(what, sizeof what, "reward/mean@%d", v->n);
        write_val_metric(f, v->src[j], what, x[VAL_REWARD], x[VAL_PROMPTS]);
        for (int k = 0; k < v->n_k; k++) {
            snprintf(what, sizeof what, "acc/pass@%d", v->ks[k]);
            write_val_metric(f, v->src[j], what, x[VAL_PASS + k], x[VAL_PROMPTS]);
        }
        snprintf(what, sizeof what, "acc/maj@%d", v->n);
        write_val_metric(f, v->src[j], what, x[VAL_MAJ], x[VAL_PROMPTS]);
    }
    fputs("}\n", f);
    file_flush(f, r->metrics_path);
}

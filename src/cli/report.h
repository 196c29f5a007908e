// grpo report's data: the metrics of a run, one row per step (duplicates merged, last one wins).
#pragma once
#include <stdint.h>
#include <stdio.h>

// Every metric the charts know, from `grpo train` and `grpo sft`; unknown keys are ignored.
#define REPORT_KEYS(X)                                                                                         \
    X(reward_mean) X(reward_std) X(accuracy) X(val_accuracy) X(kl) X(entropy) X(pg_loss) X(clip_frac)            \
    X(ratio_min) X(ratio_max) X(response_length_mean) X(response_length_max) X(truncated_frac) X(kept)         \
    X(grad_norm) X(lr) X(time_rollout_s) X(time_reward_s) X(time_reference_s) X(time_old_logprob_s)            \
    X(time_update_s) X(time_step_s) X(tokens_per_s) X(peak_rss_gib) X(loss) X(tokens) X(loss_scale)           \
    X(skipped) X(elapsed_s) X(turns_mean) X(tool_calls) X(tool_errors) X(time_tools_s)
#define REPORT_ENUM(k) REPORT_##k,
typedef enum { REPORT_KEYS(REPORT_ENUM) REPORT_N_KEYS } ReportKey;
extern const char *const report_key_names[REPORT_N_KEYS];

typedef struct {
    int64_t step;
    int64_t seq;    // line order, so that the last of duplicate steps wins
    uint64_t set;   // bit k: key k appeared (a null appears as NAN)
    double v[REPORT_N_KEYS];
} ReportRow;

typedef struct {
    ReportRow *rows;  // sorted by step, one per step
    int64_t n;
    int64_t resumes;  // times the step went back (a resumed or restarted run)
    int partial;      // the last line had no newline: a run still writing
    char *val_line;   // the validation line with per-source "val/..." keys of the latest step (NULL: none)
    size_t val_len;
    int64_t val_step;
} ReportMetrics;

// Value of key k at row i, NAN when missing or null.
double report_value(const ReportMetrics *m, int64_t i, int k);
// Writes every chart that has data as an inline <svg>; returns how many.
int report_charts(FILE *f, const ReportMetrics *m);
// Writes s[0..n) as HTML text: markup characters escaped, control characters as U+FFFD.
void report_escape(FILE *f, const char *s, size_t n);

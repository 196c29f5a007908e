#define PCRE2_CODE_UNIT_WIDTH 8
#include "rl/reward_judge.h"

#include <math.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "rl/reward_model.h"
#include "rollout/rollout.h"
#include "text/chat.h"
#include "text/utf8.h"

// A rubric of up to max_length tokens prefills in one pass.
static int64_t prefill_rows(const RewardJudgeConfig *cfg) {
    return cfg->max_length > ROLLOUT_PREFILL ? cfg->max_length : ROLLOUT_PREFILL;
}

static size_t workspace_bytes(const DecoderConfig *c, const RewardJudgeConfig *cfg) {
    return rollout_workspace_bytes(backend_cpu(), c, cfg->dtype, cfg->max_batch, cfg->max_length, prefill_rows(cfg));
}

// cfg with its max_length fitted to the judge's positions.
static RewardJudgeConfig fitted(const DecoderConfig *c, const RewardJudgeConfig *cfg) {
    RewardJudgeConfig f = *cfg;
    f.max_length = reward_length_limit(cfg->max_length, cfg->length_asked, c->max_pos, "reward.judge.max_length",
                                       cfg->model_path);
    return f;
}

size_t reward_judge_bytes(const DecoderConfig *c, const RewardJudgeConfig *cfg) {
    RewardJudgeConfig f = fitted(c, cfg);
    return decoder_layout(c, &(DecoderLayout){0}) * dtype_size(cfg->dtype) + workspace_bytes(c, &f);
}

void reward_judge_load(RewardJudge *j, const RewardJudgeConfig *cfg) {
    memset(j, 0, sizeof *j);
    j->cfg = *cfg;
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)cfg->regex, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off,
                                   NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        die("reward.judge.regex \"%s\" does not compile at offset %zu: %s", cfg->regex, (size_t)off, (char *)msg);
    }
    j->re = re;
    j->match = pcre2_match_data_create_from_pattern(re, NULL);
    if (!j->match) die("out of memory compiling reward.judge.regex");
    DecoderConfig c;
    decoder_config_load(&c, cfg->model_path);
    j->cfg = fitted(&c, cfg);
    if (j->cfg.max_length <= j->cfg.max_new_tokens)
        die("reward.judge.max_length %lld (%s's positions: %lld) leaves no room for a rubric beside "
            "reward.judge.max_new_tokens %lld", (long long)j->cfg.max_length, cfg->model_path, (long long)c.max_pos,
            (long long)j->cfg.max_new_tokens);
    tokenizer_load(&j->tok, cfg->model_path);
    if (j->tok.n_ids > c.vocab)
        die("reward.judge.model_path %s: its tokenizer has ids up to %d, its vocab_size is %lld", cfg->model_path,
            j->tok.n_ids - 1, (long long)c.vocab);
    decoder_load_config(&j->m, cfg->model_path, cfg->dtype, &c);
    j->n_stop = rollout_stop_ids(cfg->model_path, &j->tok, j->stop_ids);
    arena_init(&j->arena, workspace_bytes(&c, &j->cfg));
}

void reward_judge_free(RewardJudge *j) {
    arena_free(&j->arena);
    decoder_free(&j->m);
    tokenizer_free(&j->tok);
    pcre2_match_data_free((pcre2_match_data *)j->match);
    pcre2_code_free((pcre2_code *)j->re);
}

// The rubric with its placeholders replaced, in one pass (malloc'd).
static char *fill_rubric(const char *rubric, const char *prompt, const char *response, const char *answer) {
    static const char *const keys[3] = {"{prompt}", "{response}", "{answer}"};
    const char *vals[3] = {prompt, response, answer ? answer : ""};
    Buf b = {0};
    for (const char *p = rubric; *p;) {
        int k = 0;
        while (k < 3 && strncmp(p, keys[k], strlen(keys[k])) != 0) k++;
        if (k < 3) {
            utf8_append_lossy(&b, vals[k], strlen(vals[k]));  // a response's bytes as the reward program sees them
            p += strlen(keys[k]);
        } else {
            buf_append(&b, p++, 1);
        }
    }
    buf_append(&b, "", 1);
    return b.data;
}

// The score in the judge's answer (valid UTF-8): the last non-empty match of the regex (its first group, else all
// of it) read as a number that a float holds. Returns 0 when there is none.
static int parse_score(const RewardJudge *j, const char *text, size_t n, double *score) {
    pcre2_match_data *md = (pcre2_match_data *)j->match;
    int found = 0;
    for (PCRE2_SIZE at = 0; at <= n;) {
        int rc = pcre2_match((const pcre2_code *)j->re, (PCRE2_SPTR)text, n, at, PCRE2_NOTEMPTY | PCRE2_NO_UTF_CHECK,
                             md, NULL);
        if (rc < 0) break;  // no match, or a match limit: what was found so far stands
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        int g = rc > 1 && ov[2] != PCRE2_UNSET ? 1 : 0;
        char num[64];
        size_t len = ov[2 * g + 1] - ov[2 * g];
        snprintf(num, sizeof num, "%.*s", (int)(len < 63 ? len : 63), text + ov[2 * g]);
        char *end;
        double v = strtod(num, &end);
        found = len > 0 && len < 63 && end == num + len && isfinite((float)v);
        if (found) *score = v;
        at = ov[1];  // past a non-empty match: a character boundary
    }
    return found;
}

int64_t reward_judge_score(RewardJudge *j, int64_t n, const char *const *prompt, const char *const *response,
                           const char *const *answer, float *scores) {
    RolloutPrompt *p = xcalloc((size_t)n + 1, sizeof *p);
    RolloutSample *out = xcalloc((size_t)n + 1, sizeof *out);
    IdList *ids = xcalloc((size_t)n + 1, sizeof *ids);
    int64_t *which = xmalloc(((size_t)n + 1) * sizeof *which), m = 0, failures = 0;
    for (int64_t i = 0; i < n; i++) {
        char *rubric = fill_rubric(j->cfg.rubric, prompt[i], response[i], answer[i]);
        char *err = chat_encode_prompt(&j->tok, rubric, strlen(rubric), 1, NULL, &ids[i]);
        if (err) die("reward.judge %s: its chat template: %s", j->cfg.model_path, err);
        free(rubric);
        scores[i] = (float)j->cfg.failure_score;
        if (ids[i].n == 0 || (int64_t)ids[i].n + j->cfg.max_new_tokens > j->cfg.max_length) {  // too long: a failure
            failures++;
            continue;
        }
        p[m] = (RolloutPrompt){.ids = ids[i].ids, .n = (int64_t)ids[i].n, .max_new_tokens = (int)j->cfg.max_new_tokens};
        which[m++] = i;
    }
    // greedy: the judge answers the same way every time
    RolloutConfig rc = {.sampler = {0.0f, 0, 1.0f}, .stop_ids = j->stop_ids, .n_stop_ids = j->n_stop,
                        .prefill_tokens = prefill_rows(&j->cfg), .workspace = &j->arena};
    RolloutStats st;
    if (m > 0) rollout_generate(&j->m, &j->tok, &rc, p, (int)m, 1, out, &st, NULL, NULL);
    for (int64_t k = 0; k < m; k++) {
        int64_t i = which[k];
        double v;
        Buf said = {0};  // the judge's answer, its invalid bytes as U+FFFD (as the samples show text)
        utf8_append_lossy(&said, out[k].text.data ? out[k].text.data : "", (size_t)out[k].text_end);
        if (parse_score(j, said.data ? said.data : "", said.len, &v)) scores[i] = (float)v;
        else failures++;
        buf_free(&said);
        rollout_sample_free(&out[k]);
    }
    for (int64_t i = 0; i < n; i++) free(ids[i].ids);
    free(ids), free(which), free(out), free(p);
    return failures;
}

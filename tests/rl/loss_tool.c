// loss_tool IN.json OUT.json
// Runs the GRPO math of src/rl/grpo_loss.c on the cases of IN.json, for loss_parity.py to compare
// with PyTorch. IN.json: {"cases": [case...]}, each case one of
//   {"name", "kind": "adv", "rewards": [...], "G", "norm_by_std": bool, "eps"}
//       -> {"name", "adv": [...], "flat": [0/1 per group]}
//   {"name", "kind": "loss", "clip_low", "clip_high", "clip_c", "kl_coef", "kl": "k3", "agg": "token-mean",
//    "norm_len", "logp": [[...] per sequence], "old_logp": [[...]], "ref_logp": [[...]] (optional),
//    "adv": [per sequence], "micro": [sequences per micro-batch] (optional, default one)}
//       -> {"name", "loss", "stats": {...}, "dlogp": [[...]],                  the whole batch in one call
//           "micro_loss_sum", "micro_stats": {...}, "micro_dlogp": [[...]]}   split into micro-batches
//   {"name", "kind": "parse", "kl": [names], "agg": [names]} -> {"name", "kl": [enum or -1], "agg": [...]}
//   {"name", "kind": "rs", "rollout_rs", "thresholds", "old": [[...] per response], "rollout": [[...]],
//    "mask": [[0/1]]} -> {"name", "mask": [[0/1]], "rejected": n} or {"name", "error": "..."}   rejection sampling
// The mini-batch totals passed to grpo_loss are the whole case's: all tokens, non-empty sequences.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "rl/grpo_loss.h"

// Full double precision (json_write_number keeps 9 digits, enough for floats only).
static void write_double(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.17g", x);
    else fputs("null", f);
}

static const cJSON *need(const cJSON *obj, const char *key, const char *name) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it) die("case %s: missing \"%s\"", name, key);
    return it;
}

static const char *need_string(const cJSON *obj, const char *key, const char *name) {
    const cJSON *it = need(obj, key, name);
    if (!cJSON_IsString(it)) die("case %s: \"%s\" is not a string", name, key);
    return it->valuestring;
}

// A list of numbers -> n floats (malloc'd).
static float *floats_of(const cJSON *list, int *n, const char *key, const char *name) {
    if (!cJSON_IsArray(list)) die("case %s: \"%s\" is not a list", name, key);
    *n = cJSON_GetArraySize(list);
    float *x = xmalloc((size_t)(*n > 0 ? *n : 1) * sizeof *x);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        if (!cJSON_IsNumber(it)) die("case %s: \"%s\"[%d] is not a number", name, key, i);
        x[i++] = (float)it->valuedouble;
    }
    return x;
}

// A list of B lists packed by seq_off (B+1); the lengths must match seq_off.
static float *packed_of(const cJSON *obj, const char *key, int B, const int64_t *seq_off, const char *name) {
    const cJSON *list = need(obj, key, name);
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) != B)
        die("case %s: \"%s\" is not a list of %d lists", name, key, B);
    float *x = xmalloc((size_t)(seq_off[B] > 0 ? seq_off[B] : 1) * sizeof *x);
    for (int b = 0; b < B; b++) {
        int n;
        float *row = floats_of(cJSON_GetArrayItem(list, b), &n, key, name);
        if (n != seq_off[b + 1] - seq_off[b]) die("case %s: \"%s\"[%d] has %d values, want %lld", name, key, b, n,
                                                  (long long)(seq_off[b + 1] - seq_off[b]));
        memcpy(x + seq_off[b], row, (size_t)n * sizeof *x);
        free(row);
    }
    return x;
}

static void write_stats(FILE *f, const GrpoLossStats *s) {
    fputs("{\"loss\": ", f);
    write_double(f, s->loss);
    fputs(", \"pg_loss\": ", f);
    write_double(f, s->pg_loss);
    fputs(", \"kl\": ", f);
    write_double(f, s->kl);
    fputs(", \"entropy\": ", f);
    write_double(f, s->entropy);
    fputs(", \"clip_frac\": ", f);
    write_double(f, s->clip_frac);
    fputs(", \"clip_frac_lower\": ", f);
    write_double(f, s->clip_frac_lower);
    fputs(", \"ratio_min\": ", f);
    write_double(f, s->ratio_min);
    fputs(", \"ratio_max\": ", f);
    write_double(f, s->ratio_max);
    // Exact comparisons are made here, in C, so the JSON's decimal rounding cannot hide a miss.
    int all_one = s->ratio_min == 1.0 && s->ratio_max == 1.0;
    fprintf(f, ", \"ratio_all_one\": %s, \"n_tokens\": %lld}", all_one ? "true" : "false", (long long)s->n_tokens);
}

static void write_rows(FILE *f, const float *x, int B, const int64_t *seq_off) {
    fputc('[', f);
    for (int b = 0; b < B; b++) {
        fputs(b ? ", [" : "[", f);
        for (int64_t i = seq_off[b]; i < seq_off[b + 1]; i++) {
            if (i > seq_off[b]) fputs(", ", f);
            json_write_number(f, x[i]);
        }
        fputc(']', f);
    }
    fputc(']', f);
}

static void run_adv(FILE *f, const cJSON *c, const char *name) {
    int n;
    float *r = floats_of(need(c, "rewards", name), &n, "rewards", name);
    int G = (int)json_get_int(c, "G", name);
    if (G < 1 || n % G) die("case %s: %d rewards are not whole groups of %d", name, n, G);
    int64_t n_groups = n / G;
    float *adv = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *adv);
    // "estimator" (default grpo) and, for opo and the whitened ones, "len": each response's loss tokens
    const char *est = cJSON_GetObjectItemCaseSensitive(c, "estimator") ? need_string(c, "estimator", name) : "grpo";
    AdvEstimator e;
    if (!adv_estimator_parse(est, &e)) die("case %s: unknown advantage estimator \"%s\"", name, est);
    double *len = xcalloc((size_t)(n > 0 ? n : 1), sizeof *len);
    if (cJSON_GetObjectItemCaseSensitive(c, "len")) {
        int n_len;
        float *l = floats_of(need(c, "len", name), &n_len, "len", name);
        if (n_len != n) die("case %s: %d lengths for %d rewards", name, n_len, n);
        for (int i = 0; i < n; i++) len[i] = l[i];
        free(l);
    }
    outcome_advantages(e, r, len, n_groups, G, json_get_bool_or(c, "norm_by_std", 1, name),
                       (float)json_get_number_or(c, "eps", 1e-6, name), adv);
    double sum[3] = {0};
    advantages_whiten_sums(adv, len, n, 0, sum);
    advantages_whiten_sums(adv, len, n, 1, sum);
    if (adv_estimator_whitens(e) && !advantages_whiten(adv, n, sum)) die("case %s: fewer than 2 tokens", name);
    free(len);
    fputs(", \"adv\": [", f);
    for (int i = 0; i < n; i++) {
        if (i) fputs(", ", f);
        json_write_number(f, adv[i]);
    }
    fputs("], \"flat\": [", f);
    for (int64_t g = 0; g < n_groups; g++) fprintf(f, "%s%d", g ? ", " : "", grpo_group_is_flat(r + g * G, G));
    fputc(']', f);
    free(adv);
    free(r);
}

static void run_loss(FILE *f, const cJSON *c, const char *name) {
    GrpoLossConfig cfg = {
        .clip_low = json_get_number_or(c, "clip_low", 0.2, name),
        .clip_high = json_get_number_or(c, "clip_high", 0.2, name),
        .clip_c = json_get_number_or(c, "clip_c", 0.0, name),
        .kl_coef = json_get_number_or(c, "kl_coef", 0.0, name),
        .norm_len = json_get_number_or(c, "norm_len", 0.0, name),
        .entropy_coeff = json_get_number_or(c, "entropy_coeff", 0.0, name),
    };
    cfg.tau_pos = json_get_number_or(c, "tau_pos", 1.0, name);
    cfg.tau_neg = json_get_number_or(c, "tau_neg", 1.05, name);
    cfg.clip_cov_ratio = json_get_number_or(c, "clip_cov_ratio", 0.0002, name);
    cfg.clip_cov_lb = json_get_number_or(c, "clip_cov_lb", 1.0, name);
    cfg.clip_cov_ub = json_get_number_or(c, "clip_cov_ub", 5.0, name);
    cfg.kl_cov_ratio = json_get_number_or(c, "kl_cov_ratio", 0.0002, name);
    cfg.ppo_kl_coef = json_get_number_or(c, "ppo_kl_coef", 0.1, name);
    cfg.cov_seed = cJSON_GetObjectItemCaseSensitive(c, "cov_seed") ? (uint64_t)json_get_int(c, "cov_seed", name) : 0;
    const char *mode = cJSON_GetObjectItemCaseSensitive(c, "mode") ? need_string(c, "mode", name) : "vanilla";
    if (!policy_loss_parse(mode, &cfg.mode)) die("case %s: unknown policy loss \"%s\"", name, mode);
    const char *kl = need_string(c, "kl", name), *agg = need_string(c, "agg", name);
    if (!kl_estimator_parse(kl, &cfg.kl)) die("case %s: unknown KL estimator \"%s\"", name, kl);
    if (!loss_agg_parse(agg, &cfg.agg)) die("case %s: unknown loss aggregation \"%s\"", name, agg);

    const cJSON *lp = need(c, "logp", name);
    if (!cJSON_IsArray(lp)) die("case %s: \"logp\" is not a list", name);
    int B = cJSON_GetArraySize(lp);
    int64_t *seq_off = xcalloc((size_t)B + 1, sizeof *seq_off), n_seqs = 0;
    for (int b = 0; b < B; b++) {
        const cJSON *row = cJSON_GetArrayItem(lp, b);
        if (!cJSON_IsArray(row)) die("case %s: \"logp\"[%d] is not a list", name, b);
        seq_off[b + 1] = seq_off[b] + cJSON_GetArraySize(row);
        n_seqs += seq_off[b + 1] > seq_off[b];
    }
    int64_t N = seq_off[B];
    float *logp = packed_of(c, "logp", B, seq_off, name), *old_logp = packed_of(c, "old_logp", B, seq_off, name);
    // "mask" (verl's response_mask, multi-turn's tool tokens at 0): the totals count its 1s only
    uint8_t *mask = NULL;
    if (cJSON_GetObjectItemCaseSensitive(c, "mask")) {
        float *m = packed_of(c, "mask", B, seq_off, name);
        mask = xmalloc((size_t)(N > 0 ? N : 1));
        n_seqs = 0;
        for (int b = 0; b < B; b++) {
            int any = 0;
            for (int64_t i = seq_off[b]; i < seq_off[b + 1]; i++) any |= mask[i] = m[i] != 0.0f;
            n_seqs += any;
        }
        free(m);
    }
    double n_tok = (double)N;
    for (int64_t i = 0; mask && i < N; i++) n_tok -= !mask[i];
    const cJSON *ref_item = cJSON_GetObjectItemCaseSensitive(c, "ref_logp");
    float *ref_logp = ref_item && !cJSON_IsNull(ref_item) ? packed_of(c, "ref_logp", B, seq_off, name) : NULL;
    float *ent = cJSON_GetObjectItemCaseSensitive(c, "entropy") ? packed_of(c, "entropy", B, seq_off, name) : NULL;
    // "is_w": the rollout correction's weights, per token (verl's rollout_is_weights)
    float *is_w = cJSON_GetObjectItemCaseSensitive(c, "is_w") ? packed_of(c, "is_w", B, seq_off, name) : NULL;
    int n_adv;
    float *adv = floats_of(need(c, "adv", name), &n_adv, "adv", name);
    if (n_adv != B) die("case %s: %d advantages for %d sequences", name, n_adv, B);

    // Sentinel-filled so a token grpo_loss forgot to write shows up as NaN in the comparison.
    size_t n_alloc = (size_t)(N > 0 ? N : 1);
    float *dlogp = xmalloc(n_alloc * sizeof *dlogp), *dlogp_micro = xmalloc(n_alloc * sizeof *dlogp);
    float *dent = ent ? xmalloc(n_alloc * sizeof *dent) : NULL;
    for (int64_t i = 0; i < N; i++) dlogp[i] = dlogp_micro[i] = NAN;
    for (int64_t i = 0; dent && i < N; i++) dent[i] = NAN;
    GrpoLossStats whole;
    double loss = grpo_loss(&cfg, logp, old_logp, ref_logp, ent, mask, is_w, adv, seq_off, B, n_tok, (double)n_seqs,
                            dlogp, dent, &whole);

    // The same mini-batch in micro-batches, each seeing the whole mini-batch's totals.
    const cJSON *micro = cJSON_GetObjectItemCaseSensitive(c, "micro");
    GrpoLossStats acc;
    grpo_loss_stats_init(&acc);
    double micro_sum = 0.0;
    int b0 = 0, m = 0;
    do {
        int mb = B - b0;
        if (micro) {
            const cJSON *it = cJSON_GetArrayItem(micro, m);
            if (!cJSON_IsNumber(it)) die("case %s: \"micro\" sizes cover fewer than %d sequences", name, B);
            mb = (int)it->valuedouble;
            if (mb < 0 || mb > B - b0) die("case %s: micro-batch %d of %d sequences overruns the batch", name, m, mb);
        }
        GrpoLossStats s;
        micro_sum += grpo_loss(&cfg, logp, old_logp, ref_logp, ent, mask, is_w, adv + b0, seq_off + b0, mb, n_tok,
                               (double)n_seqs, dlogp_micro, dent, &s);
        grpo_loss_stats_add(&acc, &s);
        b0 += mb;
        m++;
    } while (b0 < B);

    fputs(", \"loss\": ", f);
    write_double(f, loss);
    fputs(", \"stats\": ", f);
    write_stats(f, &whole);
    fputs(", \"dlogp\": ", f);
    write_rows(f, dlogp, B, seq_off);
    if (dent) {
        fputs(", \"dent\": ", f);
        write_rows(f, dent, B, seq_off);
    }
    fputs(", \"micro_loss_sum\": ", f);
    write_double(f, micro_sum);
    fputs(", \"micro_stats\": ", f);
    write_stats(f, &acc);
    fputs(", \"micro_dlogp\": ", f);
    write_rows(f, dlogp_micro, B, seq_off);
    free(dlogp);
    free(dlogp_micro);
    free(ent);
    free(dent);
    free(adv);
    free(is_w);
    free(ref_logp);
    free(old_logp);
    free(logp);
    free(mask);
    free(seq_off);
}

static void run_parse(FILE *f, const cJSON *c) {
    const cJSON *it;
    fputs(", \"kl\": [", f);
    int i = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(c, "kl")) {
        KlEstimator k;
        int ok = cJSON_IsString(it) && kl_estimator_parse(it->valuestring, &k);
        fprintf(f, "%s%d", i++ ? ", " : "", ok ? (int)k : -1);
    }
    fputs("], \"agg\": [", f);
    i = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(c, "agg")) {
        LossAgg a;
        int ok = cJSON_IsString(it) && loss_agg_parse(it->valuestring, &a);
        fprintf(f, "%s%d", i++ ? ", " : "", ok ? (int)a : -1);
    }
    fputc(']', f);
}

static void run_rs(FILE *f, const cJSON *c, const char *name) {
    RolloutRs rs;
    char err[256];
    if (!rollout_rs_parse(need_string(c, "rollout_rs", name), need_string(c, "thresholds", name), &rs, err,
                          sizeof err)) {
        fputs(", \"error\": ", f);
        json_write_string(f, err, strlen(err));
        return;
    }
    const cJSON *rows = need(c, "mask", name);
    int B = cJSON_GetArraySize(rows);
    int64_t *off = xcalloc((size_t)B + 1, sizeof *off);
    for (int b = 0; b < B; b++) off[b + 1] = off[b] + cJSON_GetArraySize(cJSON_GetArrayItem(rows, b));
    float *old = packed_of(c, "old", B, off, name), *roll = packed_of(c, "rollout", B, off, name);
    float *m = packed_of(c, "mask", B, off, name);
    uint8_t *mask = xmalloc((size_t)off[B] + 1);
    for (int64_t t = 0; t < off[B]; t++) mask[t] = m[t] != 0;
    int64_t rejected = 0;
    for (int b = 0; b < B; b++) rejected += rollout_rs_apply(&rs, old, roll, mask, off[b], off[b + 1]);
    fputs(", \"mask\": [", f);
    for (int b = 0; b < B; b++) {
        fputs(b ? ", [" : "[", f);
        for (int64_t t = off[b]; t < off[b + 1]; t++) fprintf(f, "%s%d", t > off[b] ? ", " : "", mask[t]);
        fputc(']', f);
    }
    fprintf(f, "], \"rejected\": %lld", (long long)rejected);
    free(off), free(old), free(roll), free(m), free(mask);
}

int main(int argc, char **argv) {
    if (argc != 3) die("usage: loss_tool IN.json OUT.json");
    cJSON *root = json_load_file(argv[1], SIZE_MAX);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    if (!cJSON_IsArray(cases)) die("%s: \"cases\" is not a list", argv[1]);
    FILE *f = fopen(argv[2], "w");
    if (!f) die("cannot write %s", argv[2]);
    fputs("{\"cases\": [\n", f);
    int i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *name = need_string(c, "name", "?"), *kind = need_string(c, "kind", name);
        fputs(i++ ? ",\n{\"name\": " : "{\"name\": ", f);
        json_write_string(f, name, strlen(name));
        if (strcmp(kind, "adv") == 0) run_adv(f, c, name);
        else if (strcmp(kind, "loss") == 0) run_loss(f, c, name);
        else if (strcmp(kind, "parse") == 0) run_parse(f, c);
        else if (strcmp(kind, "rs") == 0) run_rs(f, c, name);
        else die("case %s: unknown kind \"%s\"", name, kind);
        fputc('}', f);
    }
    fputs("\n]}\n", f);
    if (fclose(f) != 0) die("cannot write %s", argv[2]);
    fprintf(stderr, "loss_tool: %d cases\n", i);
    cJSON_Delete(root);
    return 0;
}

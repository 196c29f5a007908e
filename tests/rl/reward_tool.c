// Scores JSONL cases with src/rl/reward.c for tests/rl/reward_test.py (not a test on its own).
//
// usage: reward_tool [CASES.jsonl]      (stdin without a file); one JSON line out per line in.
// A case is
//   {"kind": K, "params": {...}, "response": R, "answer": A, "prompt": P}       one reward, weight 1
//   {"specs": [{"kind": K, "weight": W, "params": {...}}, ...], "response": ..., ...}   a weighted sum
//   {"op": "free"}   shuts every cached set down (programs: clean shutdown), prints {"freed": n, "seconds": t}
// params values may be strings, numbers or booleans; they reach reward_spec_set as text. Sets are
// cached by their specs, so program cases with the same params share one process and its counters.
// Output: {"score", "values", "correct", "program_failures"} plus, for single-reward cases, the
// intermediate strings (gsm8k: extracted, ground_truth; boxed: last_boxed, content, strip_content,
// strip_answer, is_equiv, number_content, number_answer) and program counters (calls, failures,
// timeouts, restarts, starts, last_error).
#define _POSIX_C_SOURCE 200809L  // getline
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "rl/reward.h"
#include "base/program.h"

typedef struct {
    char *key;
    RewardSet set;
} CachedSet;

// Reward sets by their specs' JSON text.
typedef struct {
    CachedSet sets[64];
    int n;
} SetCache;

static void put_str(const char *key, const char *s) {
    printf(", \"%s\": ", key);
    if (s) json_write_string(stdout, s, strlen(s));
    else fputs("null", stdout);
}

static void put_num(const char *key, double x) {
    printf(", \"%s\": ", key);
    if (isfinite(x)) printf("%.17g", x);
    else fputs("null", stdout);
}

static const char *need_str(const cJSON *obj, const char *key, int64_t line) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it) return "";
    if (!cJSON_IsString(it)) die("cases line %lld: \"%s\" must be a string", (long long)line, key);
    return it->valuestring;
}

// Fills spec from {"kind", "weight"?, "params"?}; texts collects the strings the spec borrows.
static void spec_from_json(RewardSpec *spec, const cJSON *obj, char **texts, int *n_texts, int64_t line) {
    RewardKind kind;
    if (!reward_kind_parse(need_str(obj, "kind", line), &kind))
        die("cases line %lld: unknown kind \"%s\"", (long long)line, need_str(obj, "kind", line));
    reward_spec_defaults(spec, kind);
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(obj, "weight");
    if (w) {
        if (!cJSON_IsNumber(w)) die("cases line %lld: weight must be a number", (long long)line);
        spec->weight = w->valuedouble;
    }
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(obj, "params");
    const cJSON *p;
    cJSON_ArrayForEach(p, params) {
        char text[64];
        const char *value;
        if (cJSON_IsString(p)) value = p->valuestring;
        else if (cJSON_IsBool(p)) value = cJSON_IsTrue(p) ? "true" : "false";
        else if (cJSON_IsNumber(p)) snprintf(text, sizeof text, "%.17g", p->valuedouble), value = text;
        else die("cases line %lld: param \"%s\" must be a string, number or boolean", (long long)line, p->string);
        texts[*n_texts] = xstrdup(value);
        char err[256];
        int rc = reward_spec_set(spec, p->string, texts[(*n_texts)++], err, sizeof err);
        if (rc == 0) die("cases line %lld: %s has no param \"%s\"", (long long)line, reward_kind_name(kind), p->string);
        if (rc < 0) die("cases line %lld: %s", (long long)line, err);
    }
}

// The cached set for this case's specs, created on first use.
static RewardSet *set_for(SetCache *cache, const cJSON *root, int64_t line) {
    cJSON *key_json = cJSON_CreateArray();
    const cJSON *specs = cJSON_GetObjectItemCaseSensitive(root, "specs");
    if (specs) {
        const cJSON *s;
        cJSON_ArrayForEach(s, specs) cJSON_AddItemToArray(key_json, cJSON_Duplicate(s, 1));
    } else {
        cJSON *one = cJSON_CreateObject();
        cJSON_AddStringToObject(one, "kind", need_str(root, "kind", line));
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "params");
        if (params) cJSON_AddItemToObject(one, "params", cJSON_Duplicate(params, 1));
        cJSON_AddItemToArray(key_json, one);
    }
    char *key = cJSON_PrintUnformatted(key_json);
    for (int i = 0; i < cache->n; i++)
        if (strcmp(cache->sets[i].key, key) == 0) {
            free(key);
            cJSON_Delete(key_json);
            return &cache->sets[i].set;
        }
    if (cache->n == (int)(sizeof cache->sets / sizeof cache->sets[0])) die("cases line %lld: too many distinct reward sets", (long long)line);
    RewardSpec spec[REWARD_MAX_SPECS];
    char *texts[REWARD_MAX_SPECS * 16];
    int n = 0, n_texts = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, key_json) {
        if (n == REWARD_MAX_SPECS) die("cases line %lld: too many specs", (long long)line);
        if (cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(s, "params")) > 16)
            die("cases line %lld: too many params", (long long)line);
        spec_from_json(&spec[n++], s, texts, &n_texts, line);
    }
    CachedSet *c = &cache->sets[cache->n++];
    c->key = key;
    reward_set_init(&c->set, spec, n);
    for (int i = 0; i < n_texts; i++) free(texts[i]);
    cJSON_Delete(key_json);
    return &c->set;
}

// Frees every set (programs shut down); returns how many.
static int cache_free(SetCache *cache) {
    int n = cache->n;
    for (int i = 0; i < cache->n; i++) {
        reward_set_free(&cache->sets[i].set);
        free(cache->sets[i].key);
    }
    cache->n = 0;
    return n;
}

static void put_number_or_null(const char *key, const char *s) {
    double v;
    if (s && reward_parse_number(s, &v)) put_num(key, v);
    else printf(", \"%s\": null", key);
}

static void run_case(SetCache *cache, const cJSON *root, int64_t line) {
    const cJSON *op = cJSON_GetObjectItemCaseSensitive(root, "op");
    if (op) {
        if (!cJSON_IsString(op) || strcmp(op->valuestring, "free") != 0) die("cases line %lld: unknown op", (long long)line);
        double t0 = time_now();
        printf("{\"freed\": %d", cache_free(cache));
        put_num("seconds", time_now() - t0);
        puts("}");
        return;
    }
    RewardSet *set = set_for(cache, root, line);
    const char *response = need_str(root, "response", line), *answer = need_str(root, "answer", line);
    const char *prompt = need_str(root, "prompt", line);
    RewardDetail d;
    double total = reward_score(set, prompt, response, answer, NULL, &d);
    printf("{\"score\": ");
    printf("%.17g", total);
    printf(", \"values\": [");
    for (int i = 0; i < set->n; i++) printf("%s%.17g", i ? ", " : "", d.values[i]);
    printf("], \"correct\": %d, \"program_failures\": %d", d.correct, d.program_failures);
    if (set->n == 1) {
        const RewardSpec *s = &set->items[0].spec;
        if (s->kind == REWARD_GSM8K) {
            char *got = gsm8k_extract_solution(response, s->flexible, s->clip_chars), *gt = gsm8k_ground_truth(answer);
            put_str("extracted", got);
            put_str("ground_truth", gt);
            free(got);
            free(gt);
        } else if (s->kind == REWARD_BOXED) {
            char *last = math_last_boxed_only_string(response);
            char *content = last ? math_remove_boxed(last) : NULL;
            char *sc = content ? math_strip_string(content) : NULL, *sa = math_strip_string(answer);
            put_str("last_boxed", last);
            put_str("content", content);
            put_str("strip_content", sc);
            put_str("strip_answer", sa);
            if (content) printf(", \"is_equiv\": %s", math_is_equiv(content, answer) ? "true" : "false");
            else printf(", \"is_equiv\": null");
            put_number_or_null("number_content", sc);
            put_number_or_null("number_answer", sa);
            free(last);
            free(content);
            free(sc);
            free(sa);
        }
    }
    for (int i = 0; i < set->n; i++)
        if (set->items[i].program) {
            const Program *p = set->items[i].program;
            printf(", \"calls\": %lld, \"failures\": %lld, \"timeouts\": %lld, \"restarts\": %lld, \"starts\": %lld",
                   (long long)p->calls, (long long)p->failures, (long long)p->timeouts, (long long)p->restarts,
                   (long long)p->starts);
            put_str("last_error", p->last_error);
            break;
        }
    puts("}");
}

int main(int argc, char **argv) {
    if (argc > 2) die("usage: reward_tool [CASES.jsonl]");
    FILE *in = stdin;
    if (argc == 2 && !(in = fopen(argv[1], "rb"))) die("cannot open %s", argv[1]);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int64_t lineno = 0;
    SetCache *cache = xcalloc(1, sizeof *cache);
    while ((len = getline(&line, &cap, in)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        if (len == 0) continue;
        cJSON *root = json_parse_exact(line, (size_t)len, NULL);
        if (!cJSON_IsObject(root)) die("cases line %lld: not a JSON object", (long long)lineno);
        run_case(cache, root, lineno);
        fflush(stdout);
        cJSON_Delete(root);
    }
    free(line);
    if (in != stdin) fclose(in);
    cache_free(cache);
    free(cache);
    return 0;
}

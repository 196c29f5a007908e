// Constrained decoding's mask per step, with the cache of states' masks (src/rollout/mask_cache.c) against
// without it (the peer: every token run through the automaton each step), in the same run: a seeded walk of
// STEPS steps over the real vocabulary through JSON mode and through guided_regex "[A-Za-z ,.]+", each step
// drawing among the allowed tokens; the same walk with and without the cache (the masks are equal, bit for bit:
// tests/rollout/test_json_mask.c). Prints the median over REPEATS walks of the milliseconds a step.
// usage: mask_bench TOKENIZER_JSON [STEPS [REPEATS]]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/util.h"
#include "rollout/json_mask.h"

typedef struct {
    const Tokenizer *tok;
    const JsonSchema *schema;  // JSON mode, or
    const RegexDfa *regex;     // guided_regex
    const uint8_t *plain;
    int32_t stop;
} Constraint;

// One walk (seeded alike for every call); the seconds its masks took a step.
static double walk(const Constraint *c, int steps, MaskCache *cache, float *logits) {
    int64_t V = c->tok->n_ids;
    Rng rng;
    rng_init(&rng, 3);
    Buf text = {0};
    double spent = 0;
    int done = 0;
    for (int64_t left = steps + 1; left > 1; left--, done++) {
        for (int64_t i = 0; i < V; i++) logits[i] = 0.0f;
        const char *s = text.data ? text.data : "";
        double t0 = time_now();
        int64_t n = c->schema
                        ? json_mask(c->tok, c->schema, c->plain, cache, s, text.len, left, &c->stop, 1, logits, V)
                        : regex_mask(c->tok, c->regex, cache, s, text.len, left, &c->stop, 1, logits, V);
        spent += time_now() - t0;
        int64_t k = (int64_t)(rng_next_u64(&rng) % (uint64_t)(n > 0 ? n : 1)), id = 0;
        for (id = 0; id < V; id++)
            if (logits[id] == 0.0f && k-- == 0) break;
        if (id >= V || id == c->stop) break;
        size_t len;
        const char *b = tokenizer_id_bytes(c->tok, (int32_t)id, &len);
        buf_append(&text, b, len);
    }
    free(text.data);
    return spent / (done > 0 ? done : 1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void run(const char *name, const Constraint *c, int steps, int repeats, float *logits) {
    double *t[2] = {xmalloc((size_t)repeats * sizeof(double)), xmalloc((size_t)repeats * sizeof(double))};
    for (int r = 0; r < repeats; r++)
        for (int cached = 0; cached < 2; cached++) {  // taking turns
            MaskCache *cache = cached ? mask_cache_new(16 << 20) : NULL;  // grpo serve's bound
            t[cached][r] = walk(c, steps, cache, logits);
            mask_cache_free(cache);
        }
    for (int k = 0; k < 2; k++) qsort(t[k], (size_t)repeats, sizeof(double), cmp_double);
    double un = t[0][repeats / 2], ca = t[1][repeats / 2];
    printf("%-24s uncached %.3f ms a step, cached %.3f ms a step (%.1fx), %d steps, median of %d\n", name, un * 1e3,
           ca * 1e3, un / ca, steps, repeats);
    free(t[0]);
    free(t[1]);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) die("usage: mask_bench TOKENIZER_JSON [STEPS [REPEATS]]");
    int steps = argc > 2 ? atoi(argv[2]) : 200, repeats = argc > 3 ? atoi(argv[3]) : 5;
    if (steps < 1 || repeats < 1) die("mask_bench: STEPS and REPEATS must be positive");
    Tokenizer tok;
    tokenizer_load(&tok, argv[1]);
    uint8_t *plain = json_plain_tokens(&tok, tok.n_ids);
    cJSON *object = cJSON_Parse("{\"type\": \"object\"}");
    char *why = NULL;
    JsonSchema *schema = json_schema_compile(object, &why);
    RegexDfa regex;
    why = schema ? regex_compile("[A-Za-z ,.]+", 12, 0, NULL, &regex) : why;
    if (!schema || why) die("mask_bench: %s", why);
    float *logits = xmalloc((size_t)tok.n_ids * sizeof *logits);
    int32_t stop = tokenizer_token_id(&tok, "<|endoftext|>");
    printf("constrained masks over %lld tokens, a step's mask with and without the cache of states' masks\n",
           (long long)tok.n_ids);
    run("json_object", &(Constraint){&tok, schema, NULL, plain, stop}, steps, repeats, logits);
    run("guided_regex [A-Za-z ,.]+", &(Constraint){&tok, NULL, &regex, plain, stop}, steps, repeats, logits);
    free(logits);
    regex_free(&regex);
    json_schema_free(schema);
    cJSON_Delete(object);
    free(plain);
    tokenizer_free(&tok);
    return 0;
}

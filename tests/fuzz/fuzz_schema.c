// A response_format json_schema from a client (the whole input, at most 64 KiB): json_schema_compile compiles it
// or refuses it with a reason; a compiled one's least answer is finite, and JSON mode's mask over the tiny model's
// byte vocabulary walks it: budgeted at its least answer and 8 more tokens, every step leaves a token allowed,
// the walk (each pick drawn from the input's bytes) ends with the stop id within the budget, and what it wrote
// parses (cJSON).
#include <math.h>
#include <stdlib.h>

#include "fuzz.h"
#include "rollout/json_mask.h"

#define MAX_LEAST 512  // longer least answers are not walked (a step runs the whole vocabulary)

static Tokenizer tok;
static int32_t stop;

static void walk(const JsonSchema *s, const uint8_t *data, size_t size) {
    int64_t V = tok.n_ids, budget = json_schema_least(s) + 1 + 8;  // and the stop id
    float *logits = malloc((size_t)V * sizeof *logits);
    int64_t *allowed = malloc((size_t)V * sizeof *allowed);
    if (!logits || !allowed) fuzz_fail("out of memory");
    Buf text = {0};
    int ended = 0;
    for (int64_t left = budget, step = 0; left > 0 && !ended; left--, step++) {
        for (int64_t id = 0; id < V; id++) logits[id] = 0.0f;
        json_mask(&tok, s, NULL, NULL, text.data ? text.data : "", text.len, left, &stop, 1, logits, V);
        int64_t n = 0;
        for (int64_t id = 0; id < V; id++)
            if (logits[id] != -INFINITY) allowed[n++] = id;
        if (n == 0 || (n == 1 && allowed[0] == stop && step == 0)) fuzz_fail("no token starts or goes on");
        int64_t id = allowed[data[(size_t)step % size] % (uint64_t)n];
        if (id == stop) {
            ended = 1;
            break;
        }
        size_t len;
        const char *bytes = tokenizer_id_bytes(&tok, (int32_t)id, &len);
        buf_append(&text, bytes, len);
    }
    if (!ended) fuzz_fail("the walk did not end within its budget of %lld tokens", (long long)budget);
    cJSON *parsed = cJSON_ParseWithLength(text.data ? text.data : "", text.len);
    if (!parsed) fuzz_fail("the walk wrote what cJSON does not parse: %.200s", text.data ? text.data : "");
    cJSON_Delete(parsed);
    buf_free(&text);
    free(logits);
    free(allowed);
}

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)ctx;
    if (size == 0 || size > (64 << 10)) return;
    cJSON *j = cJSON_ParseWithLength((const char *)data, size);
    if (!j) return;
    char *why = NULL;
    JsonSchema *s = json_schema_compile(j, &why);
    if (!s) {
        if (!why || !why[0]) fuzz_fail("refused without a reason");
        free(why);
        cJSON_Delete(j);
        return;
    }
    int64_t least = json_schema_least(s);
    if (least <= 0 || least >= JS_INF) fuzz_fail("a compiled schema's least answer is %lld", (long long)least);
    if (least <= MAX_LEAST) walk(s, data, size);
    json_schema_free(s);
    cJSON_Delete(j);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    tokenizer_load(&tok, fuzz_model());
    stop = tokenizer_token_id(&tok, "<|endoftext|>");
    if (stop < 0) fuzz_fail("the tiny model's tokenizer has no <|endoftext|>");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_run(body, data, size, NULL);
    return 0;
}

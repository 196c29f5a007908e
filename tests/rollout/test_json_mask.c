// JSON mode's mask (src/rollout/json_mask.c) over the real Qwen vocabulary: random walks through JSON mode and a
// schema, each step's mask made with json_plain_tokens' shortcut and a cache of the states' masks (mask_cache.h,
// shared by the walks, small enough to be emptied) and without either must be the same, bit for bit; each walk
// ends in a complete object within its budget that cJSON (not ours) parses, and that the schema accepts (its
// patterns as the C library's POSIX regexec finds them, not ours);
// guided_regex's (regex_mask): walks made with a cache and without the same, bit for bit, the stop id allowed
// exactly when the C library's POSIX regexec (not ours) matches the text whole; and guided_choice's
// (choice_mask): walks over the same vocabulary end in one of the choices, the stop id allowed exactly when the
// text is one. usage: test_json_mask TOKENIZER_JSON
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/util.h"
#include "rollout/json_mask.h"

static int failures;

static void check(int ok, const char *what, const char *text) {
    if (!ok) fprintf(stderr, "FAIL %s: %s\n", what, text);
    failures += !ok;
}

// Whether o satisfies the second schema of main: name and tags (2 strings or more) required, id an integer,
// kind one of "a", 12, 1, null, more the same again, nothing else.
static int valid_2(const cJSON *o) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *tags = cJSON_GetObjectItemCaseSensitive(o, "tags");
    int ok = cJSON_IsObject(o) && cJSON_IsString(name) && cJSON_IsArray(tags) && cJSON_GetArraySize(tags) >= 2;
    for (const cJSON *t = tags ? tags->child : NULL; t; t = t->next) ok &= cJSON_IsString(t);
    for (const cJSON *m = o ? o->child : NULL; ok && m; m = m->next) {
        double v = m->valuedouble;
        if (!strcmp(m->string, "id")) ok = cJSON_IsNumber(m) && v == floor(v);
        else if (!strcmp(m->string, "kind"))
            ok = cJSON_IsNull(m) || (cJSON_IsNumber(m) && (v == 12 || v == 1)) ||
                 (cJSON_IsString(m) && !strcmp(m->valuestring, "a"));
        else if (!strcmp(m->string, "more")) ok = valid_2(m);
        else ok = !strcmp(m->string, "name") || !strcmp(m->string, "tags");
    }
    return ok;
}

// The third schema of main: its strings' patterns (searched for, as JSON Schema does: POSIX regexec, ERE) and
// lengths in characters, its integers' and number's bounds.
static const char *const PATTERNS[][2] = {
    {"id", "^[a-z]+-[0-9]{2}$"}, {"code", "[0-9]{3}"}, {"pre", "^(ab|cd)"}, {"quoted", "^[-\"]+x$"}};

static int valid_3(const cJSON *o) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "n"), *m = cJSON_GetObjectItemCaseSensitive(o, "m");
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "x");
    int ok = cJSON_IsObject(o) && cJSON_GetArraySize(o) == 8 && cJSON_IsNumber(n) && n->valuedouble >= -5 &&
             n->valuedouble <= 12 && n->valuedouble == floor(n->valuedouble) && cJSON_IsNumber(m) &&
             m->valuedouble > 100 && m->valuedouble == floor(m->valuedouble) && cJSON_IsNumber(x) &&
             x->valuedouble >= -2.5 && x->valuedouble < 0.3;
    for (size_t i = 0; ok && i < sizeof PATTERNS / sizeof PATTERNS[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, PATTERNS[i][0]);
        regex_t re;
        if (regcomp(&re, PATTERNS[i][1], REG_EXTENDED | REG_NOSUB)) die("regcomp %s", PATTERNS[i][1]);
        ok = cJSON_IsString(v) && regexec(&re, v->valuestring, 0, NULL, 0) == 0;
        regfree(&re);
    }
    const cJSON *word = cJSON_GetObjectItemCaseSensitive(o, "word");
    int64_t chars = 0;
    for (const char *c = cJSON_IsString(word) ? word->valuestring : ""; *c; c++) chars += (*c & 0xC0) != 0x80;
    return ok && cJSON_IsString(word) && chars >= 2 && chars <= 4;
}

// A token's logit before the mask: a different finite value for each of its neighbours.
static float logit(int64_t id) { return (float)(id % 97) * 0.01f - 0.5f; }

// One walk: tokens drawn among the allowed ones (in a string, only plain ones three times in four),
// until only the stop id is left.
static void walk(const Tokenizer *tok, const JsonSchema *schema, const uint8_t *plain, MaskCache *cache,
                 int64_t budget, Rng *rng, const char *name, int (*valid)(const cJSON *)) {
    int64_t V = tok->n_ids;
    int32_t stop = tokenizer_token_id(tok, "<|endoftext|>");
    float *a = xmalloc((size_t)V * sizeof *a), *b = xmalloc((size_t)V * sizeof *b);
    int64_t *allowed = xmalloc((size_t)V * sizeof *allowed);
    Buf text = {0};
    for (int64_t left = budget; left > 0; left--) {
        for (int64_t id = 0; id < V; id++) a[id] = b[id] = logit(id);
        const char *t = text.data ? text.data : "";
        int64_t na = json_mask(tok, schema, plain, cache, t, text.len, left, &stop, 1, a, V);
        int64_t nb = json_mask(tok, schema, NULL, NULL, t, text.len, left, &stop, 1, b, V);
        check(na == nb && !memcmp(a, b, (size_t)V * sizeof *a), "the shortcut's and cache's mask is the full one's",
              t);
        int64_t n = 0, n_plain = 0;
        for (int64_t id = 0; id < V; id++)
            if (a[id] != -INFINITY) allowed[n++] = id;
        for (int64_t i = 0; i < n; i++) n_plain += plain[allowed[i]];
        if (n == 1 && allowed[0] == stop) break;
        check(n > 0 && a[stop] == -INFINITY, "a token continues the unfinished object", t);
        if (n == 0) break;
        int only_plain = n_plain > 0 && n_plain < n && rng_next_u64(rng) % 4 != 0;
        int64_t id;
        do id = allowed[rng_next_u64(rng) % (uint64_t)n];
        while (only_plain && !plain[id]);
        size_t len;
        const char *bytes = tokenizer_id_bytes(tok, (int32_t)id, &len);
        buf_append(&text, bytes, len);
    }
    cJSON *parsed = cJSON_ParseWithLength(text.data ? text.data : "", text.len);
    check(parsed && cJSON_IsObject(parsed) && (!valid || valid(parsed)), name, text.data ? text.data : "");
    printf("%s, budget %lld: %.*s\n", name, (long long)budget, (int)text.len, text.data ? text.data : "");
    cJSON_Delete(parsed);
    free(text.data);
    free(a);
    free(b);
    free(allowed);
}

// One guided_choice walk: tokens drawn among the allowed ones until the stop id is drawn (or only it is left).
static void choice_walk(const Tokenizer *tok, const char *const *choices, int n, int64_t budget, Rng *rng) {
    int64_t V = tok->n_ids;
    int32_t stop = tokenizer_token_id(tok, "<|endoftext|>");
    float *a = xmalloc((size_t)V * sizeof *a);
    int64_t *allowed = xmalloc((size_t)V * sizeof *allowed);
    Buf text = {0};
    int is_choice = 0, tokens = 0;
    for (int64_t left = budget; left > 0; left--) {
        for (int64_t id = 0; id < V; id++) a[id] = logit(id);
        const char *t = text.data ? text.data : "";
        int64_t k = choice_mask(tok, choices, n, t, text.len, left, &stop, 1, a, V);
        is_choice = 0;
        for (int c = 0; c < n; c++)
            is_choice |= strlen(choices[c]) == text.len && !memcmp(choices[c], t, text.len);
        int64_t m = 0, kept = 1;
        for (int64_t id = 0; id < V; id++)
            if (a[id] != -INFINITY) allowed[m++] = id, kept &= a[id] == logit(id);
        check(k == m && m > 0 && kept, "the allowed tokens keep their logits", t);
        check((a[stop] != -INFINITY) == is_choice, "the stop id is allowed exactly at a choice", t);
        if (m == 0) break;
        int64_t id = allowed[rng_next_u64(rng) % (uint64_t)m];
        if (id == stop) break;
        size_t len;
        const char *bytes = tokenizer_id_bytes(tok, (int32_t)id, &len);
        buf_append(&text, bytes, len);
        tokens++;
    }
    check(is_choice && tokens < budget, "a guided_choice walk ends in a choice within its budget",
          text.data ? text.data : "");
    printf("guided_choice, budget %lld: %.*s (%d tokens)\n", (long long)budget, (int)text.len,
           text.data ? text.data : "", tokens);
    free(text.data);
    free(a);
    free(allowed);
}

// One guided_regex walk (pattern: Python re's and POSIX ERE's alike): tokens drawn among the allowed ones until
// the stop id is drawn or only it is left.
static void regex_walk_test(const Tokenizer *tok, const char *pattern, MaskCache *cache, int64_t budget, Rng *rng) {
    int64_t V = tok->n_ids;
    int32_t stop = tokenizer_token_id(tok, "<|endoftext|>");
    RegexDfa d;
    char *why = regex_compile(pattern, strlen(pattern), 0, NULL, &d);
    if (why) die("%s: %s", pattern, why);
    regex_t posix;
    char *anchored = xprintf("^(%s)$", pattern);
    if (regcomp(&posix, anchored, REG_EXTENDED | REG_NOSUB)) die("regcomp %s", anchored);
    float *a = xmalloc((size_t)V * sizeof *a), *b = xmalloc((size_t)V * sizeof *b);
    int64_t *allowed = xmalloc((size_t)V * sizeof *allowed);
    Buf text = {0};
    int matches = 0;
    for (int64_t left = budget; left > 0; left--) {
        for (int64_t id = 0; id < V; id++) a[id] = b[id] = logit(id);
        const char *t = text.data ? text.data : "";
        int64_t na = regex_mask(tok, &d, cache, t, text.len, left, &stop, 1, a, V);
        int64_t nb = regex_mask(tok, &d, NULL, t, text.len, left, &stop, 1, b, V);
        check(na == nb && !memcmp(a, b, (size_t)V * sizeof *a), "the cache's regex mask is the full one's", t);
        matches = regexec(&posix, t, 0, NULL, 0) == 0;
        check((a[stop] != -INFINITY) == matches, "the stop id is allowed exactly at a match", t);
        int64_t n = 0;
        for (int64_t id = 0; id < V; id++)
            if (a[id] != -INFINITY) allowed[n++] = id;
        check(n == na && n > 0, "a token is allowed", t);
        if (n == 0) break;
        int64_t id = allowed[rng_next_u64(rng) % (uint64_t)n];
        if (id == stop) break;
        size_t len;
        const char *bytes = tokenizer_id_bytes(tok, (int32_t)id, &len);
        buf_append(&text, bytes, len);
    }
    check(matches, "a guided_regex walk ends in a match within its budget", text.data ? text.data : "");
    printf("guided_regex %s, budget %lld: %.*s\n", pattern, (long long)budget, (int)text.len,
           text.data ? text.data : "");
    regfree(&posix);
    free(anchored);
    regex_free(&d);
    free(text.data);
    free(a);
    free(b);
    free(allowed);
}

// Whether d (may be NULL: none) takes s whole.
static int whole(const RegexDfa *d, const char *s) {
    int at = d ? regex_walk(d, 0, s, strlen(s)) : -1;
    return at >= 0 && d->dist[at] == 0;
}

// Whether the automaton of property "a" of the schema (JSON text) takes s whole.
static int takes(const char *schema_text, const char *s) {
    cJSON *j = cJSON_Parse(schema_text);
    char *why = NULL;
    JsonSchema *schema = json_schema_compile(j, &why);
    if (!schema) die("%s: %s", schema_text, why);
    const JsNode *a = &schema->nodes[json_schema_deref(schema, schema->props[schema->nodes[schema->root].first].node)];
    int ok = whole(a->re, s);
    json_schema_free(schema);
    cJSON_Delete(j);
    return ok;
}

// Integer bounds (json_schema.c's range_pattern): the automaton takes exactly the integers within, as printf
// writes them, over a grid of bounds and every integer from 15 below to 15 above; never -0, a leading zero or 16
// digits; bounds past 15 digits are the loosest ones, exclusive and fractional bounds the integers within.
static void integer_bounds(void) {
    static const int64_t edges[] = {-1100, -1000, -999, -110, -100, -20, -9, -7, -1, 0, 1, 7, 9, 10, 19, 42, 99, 100,
                                    105, 109, 199, 200, 1000, 1234, 1999};
    int n = (int)(sizeof edges / sizeof edges[0]), wrong = 0, tried = 0;
    for (int i = 0; i < n; i++)
        for (int k = i; k < n; k++) {
            char *text = xprintf("{\"properties\": {\"a\": {\"type\": \"integer\", \"minimum\": %lld, \"maximum\": "
                                 "%lld}}}", (long long)edges[i], (long long)edges[k]);
            cJSON *j = cJSON_Parse(text);
            char *why = NULL;
            JsonSchema *schema = json_schema_compile(j, &why);
            if (!schema) die("%s: %s", text, why);
            const JsNode *a = &schema->nodes[schema->props[schema->nodes[schema->root].first].node];
            for (int64_t v = edges[i] - 15; v <= edges[k] + 15; v++) {
                char s[32];
                snprintf(s, sizeof s, "%lld", (long long)v);
                wrong += whole(a->re, s) != (v >= edges[i] && v <= edges[k]);
                tried++;
            }
            wrong += whole(a->re, "-0");
            wrong += regex_walk(a->re, 0, "01", 2) >= 0;
            json_schema_free(schema);
            cJSON_Delete(j);
            free(text);
        }
    char msg[64];
    snprintf(msg, sizeof msg, "%d of %d integers", wrong, tried);
    check(wrong == 0, "bounded integers: the automaton takes exactly those within", msg);
    const char *loose = "{\"properties\": {\"a\": {\"type\": \"integer\", \"minimum\": -1e18, "
                        "\"maximum\": 9007199254740991}}}";
    check(takes(loose, "999999999999999") && takes(loose, "-999999999999999") && !takes(loose, "1000000000000000"),
          "bounds past 15 digits are the loosest", loose);
    const char *frac = "{\"properties\": {\"a\": {\"exclusiveMinimum\": 2.5, \"exclusiveMaximum\": 5}}}";
    check(!takes(frac, "2") && takes(frac, "3") && takes(frac, "4") && !takes(frac, "5"),
          "exclusive and fractional bounds: the integers within", frac);
}

// Number bounds (json_schema.c's range_pattern): over a grid of bounds, each of the four kinds of pair, the
// automaton takes a number written as printf writes it (up to 15 fraction digits, no exponent) exactly when the
// C library's strtod (not ours) parses it to a double within them, as a validator compares; -0 only where it
// is within; never an exponent, a leading zero or a bare sign or point.
static void number_bounds(Rng *rng) {
    static const double edges[] = {-1000.5, -273.15, -1, -0.1, 0, 1e-7, 0.1, 0.3, 1, 2.5, 99.99, 100, 123456.789};
    int n = (int)(sizeof edges / sizeof edges[0]), wrong = 0, tried = 0;
    char first[256] = "";
    for (int i = 0; i < n; i++)
        for (int k = i; k < n; k++)
            for (int kind = 0; kind < 4; kind++) {
                const char *lo_key = kind & 1 ? "exclusiveMinimum" : "minimum";
                const char *hi_key = kind & 2 ? "exclusiveMaximum" : "maximum";
                char *text = xprintf("{\"properties\": {\"a\": {\"type\": \"number\", \"%s\": %.17g, \"%s\": "
                                     "%.17g}}}", lo_key, edges[i], hi_key, edges[k]);
                cJSON *j = cJSON_Parse(text);
                char *why = NULL;
                JsonSchema *schema = json_schema_compile(j, &why);
                int none = edges[i] == edges[k] && kind;  // no number within
                if (!schema) {
                    wrong += !none;
                    if (!none && !*first) snprintf(first, sizeof first, "%s: %s", text, why);
                    free(why);
                }
                const JsNode *a = schema ? &schema->nodes[schema->props[schema->nodes[schema->root].first].node]
                                         : NULL;
                for (int t = 0; a && t < 400; t++) {
                    double base = edges[t % 2 ? k : i], scale = pow(10, -(double)(rng_next_u64(rng) % 16));
                    double v = base + scale * ((double)(rng_next_u64(rng) % 2001) - 1000) / 100;
                    char s[64];
                    int digits = (int)(rng_next_u64(rng) % 16), len = snprintf(s, sizeof s, "%.*f", digits, v);
                    if (digits >= 2 && rng_next_u64(rng) % 2)  // between two doubles, maybe
                        snprintf(s + len - 2, 3, "%02d", (int)(rng_next_u64(rng) % 100));
                    double x = strtod(s, NULL);
                    int above = kind & 1 ? x > edges[i] : x >= edges[i];
                    int within = above && (kind & 2 ? x < edges[k] : x <= edges[k]);
                    int took = whole(a->re, s);
                    int bad = s[0] == '-' && x == 0 ? took && !within : took != within;  // -0: maybe not taken
                    if (bad && !*first) snprintf(first, sizeof first, "%s in %s", s, text);
                    wrong += bad;
                    tried++;
                }
                static const char *const never[] = {"", "-", ".5", "-.5", "01", "-01", "1.", "1e1", "1E1", "+1"};
                for (size_t m = 0; a && m < sizeof never / sizeof never[0]; m++)
                    wrong += whole(a->re, never[m]);  // not JSON's writing, or an exponent
                json_schema_free(schema);
                cJSON_Delete(j);
                free(text);
            }
    char msg[320];
    snprintf(msg, sizeof msg, "%d of %d numbers; %s", wrong, tried, first);
    check(wrong == 0, "bounded numbers: the automaton takes exactly those a validator does", msg);
    const char *tenth = "{\"properties\": {\"a\": {\"type\": \"number\", \"minimum\": 0.1, \"maximum\": 0.3}}}";
    check(takes(tenth, "0.1") && takes(tenth, "0.3") && !takes(tenth, "0.099999999999999") &&
              !takes(tenth, "0.300000000000001") && !takes(tenth, "0.2e0"),
          "0.1 and 0.3 as bounds: their own writing is within", tenth);
    const char *below = "{\"properties\": {\"a\": {\"type\": \"number\", \"exclusiveMaximum\": 100}}}";
    check(takes(below, "99.999999999999992") && !takes(below, "99.999999999999993"),  // strtod: 100 (the midpoint
          "exclusiveMaximum 100: the most within is the last that parses below it", below);  // is ...9928946)
    const char *tie = "{\"properties\": {\"a\": {\"type\": \"number\", \"minimum\": 274877906944.00006103515625}}}";
    check(takes(tie, "274877906944.000030517578126") && !takes(tie, "274877906944.000030517578125"),
          "a bound (2^38 + 2^-14) whose midpoint is on the grid: the tie goes to the even double (2^38, below it)",
          tie);
}

int main(int argc, char **argv) {
    if (argc != 2) die("usage: test_json_mask TOKENIZER_JSON");
    Tokenizer tok;
    tokenizer_load(&tok, argv[1]);
    uint8_t *plain = json_plain_tokens(&tok, tok.n_ids);
    static const char *const schemas[] = {
        "{\"type\": \"object\"}",
        "{\"type\": \"object\", \"required\": [\"name\", \"tags\"], \"properties\": {\"name\": {\"type\": "
        "\"string\"}, \"id\": {\"type\": \"integer\"}, \"kind\": {\"enum\": [\"a\", 12, 1, null]}, \"tags\": "
        "{\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"minItems\": 2}, \"more\": {\"$ref\": \"#\"}}}",
        "{\"type\": \"object\", \"properties\": {"
        "\"id\": {\"type\": \"string\", \"pattern\": \"^[a-z]+-[0-9]{2}$\"}, "
        "\"code\": {\"pattern\": \"[0-9]{3}\"}, "
        "\"pre\": {\"type\": \"string\", \"pattern\": \"^(ab|cd)\"}, \"quoted\": {\"type\": \"string\", "
        "\"pattern\": \"^[-\\\"]+x$\"}, \"word\": {\"type\": \"string\", \"minLength\": 2, \"maxLength\": 4}, "
        "\"n\": {\"type\": \"integer\", \"minimum\": -5, \"maximum\": 12}, \"m\": {\"exclusiveMinimum\": 100}, "
        "\"x\": {\"type\": \"number\", \"minimum\": -2.5, \"exclusiveMaximum\": 0.3}}, "
        "\"required\": [\"id\", \"code\", \"pre\", \"quoted\", \"word\", \"n\", \"m\", \"x\"]}",
    };
    int (*const valid[])(const cJSON *) = {NULL, valid_2, valid_3};
    cJSON *twice = cJSON_Parse("{\"type\": \"object\", \"properties\": {\"a\": {}, \"a\": {}}}");
    char *why = NULL;
    JsonSchema *none = json_schema_compile(twice, &why);  // cJSON keeps both "a"
    check(!none && why && strstr(why, "twice"), "a property listed twice is refused", why ? why : "compiled");
    free(why);
    cJSON_Delete(twice);
    Rng rng;
    rng_init(&rng, 7);
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        cJSON *s = cJSON_Parse(schemas[i]);
        char *why = NULL;
        JsonSchema *schema = json_schema_compile(s, &why);
        if (!schema) die("schema %zu: %s", i, why);
        int64_t least = json_schema_least(schema) + 1 > 32 ? json_schema_least(schema) + 1 : 32;  // and a stop
        for (size_t bytes = 2 << 20; bytes <= 64 << 20; bytes *= 32) {  // 2 MiB: about a full list, emptied often
            MaskCache *cache = mask_cache_new(bytes);
            for (int64_t budget = least; budget <= least + 32; budget += 32)
                for (int k = 0; k < 2; k++) walk(&tok, schema, plain, cache, budget, &rng, schemas[i], valid[i]);
            if (bytes > (2 << 20))  // the small one may be emptied before any state comes again
                check(mask_cache_hits(cache) > 0, "the walks found states' masks in the cache", schemas[i]);
            mask_cache_free(cache);
        }
        json_schema_free(schema);
        cJSON_Delete(s);
    }
    static const char *const patterns[] = {"[A-Za-z ,.]+", "(yes|no|maybe)[0-9]{2,4}", "[a-z]+@[a-z]+\\.(com|org)"};
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        MaskCache *cache = mask_cache_new(64 << 20);
        for (int k = 0; k < 4; k++) regex_walk_test(&tok, patterns[i], cache, k % 2 ? 12 : 24, &rng);
        check(mask_cache_hits(cache) > 0, "the regex walks found states' masks in the cache", patterns[i]);
        mask_cache_free(cache);
    }
    integer_bounds();
    number_bounds(&rng);
    static const char *const choices[] = {"yes", "yes sir", "no", "n\xc3\xa9gatif", "maybe so", " 42"};
    for (int i = 0; i < 12; i++) choice_walk(&tok, choices, 6, i < 6 ? 9 : 16, &rng);
    free(plain);
    tokenizer_free(&tok);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}

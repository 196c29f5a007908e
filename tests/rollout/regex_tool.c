// guided_regex's automaton for tests/rollout/regex_test.py: each stdin line {"pattern": P, "strings": [S, ...]}
// (and "ecma": true: compiled as REGEX_ECMA; "and": Q: the product with Q's automaton, regex_intersect)
// gives one stdout line, {"error": why} or {"states": N, "least": the fewest bytes of a match, "walk": [the state
// after S, or -1 (no match begins so)], "dist": [that state's fewest bytes to a match, -1 for none], "longest": the
// most bytes of a match (-1: no bound)}.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "rollout/regex_dfa.h"

int main(void) {
    char *line = NULL;
    size_t cap = 0;
    int64_t lineno = 0;
    while (line_read(stdin, &line, &cap, "stdin", ++lineno) >= 0) {
        cJSON *in = cJSON_Parse(line);
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(in, "pattern");
        const cJSON *strs = cJSON_GetObjectItemCaseSensitive(in, "strings");
        if (!cJSON_IsString(pat) || !cJSON_IsArray(strs))
            die("stdin line %lld: want pattern and strings", (long long)lineno);
        RegexDfa d;
        size_t n;
        char *p = json_string_bytes(pat, 0, &n);
        int ecma = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(in, "ecma"));
        char *err = regex_compile(p, n, ecma ? REGEX_ECMA : 0, NULL, &d);
        const cJSON *and = cJSON_GetObjectItemCaseSensitive(in, "and");
        if (!err && cJSON_IsString(and)) {
            RegexDfa q, both = {0};
            err = regex_compile(and->valuestring, strlen(and->valuestring), ecma ? REGEX_ECMA : 0, NULL, &q);
            if (!err) {
                err = regex_intersect(&d, &q, NULL, &both);
                regex_free(&q);
            }
            regex_free(&d);
            d = both;
        }
        cJSON *out = cJSON_CreateObject();
        if (err) {
            cJSON_AddStringToObject(out, "error", err);
            free(err);
        } else {
            cJSON *walk = cJSON_AddArrayToObject(out, "walk"), *dist = cJSON_AddArrayToObject(out, "dist");
            cJSON_AddNumberToObject(out, "states", d.n);
            cJSON_AddNumberToObject(out, "least", (double)d.dist[0]);
            cJSON_AddNumberToObject(out, "longest", (double)regex_longest(&d));
            for (const cJSON *s = strs->child; s; s = s->next) {
                size_t len;
                char *b = json_string_bytes(s, 0, &len);
                int at = regex_walk(&d, 0, b, len);
                cJSON_AddItemToArray(walk, cJSON_CreateNumber(at));
                cJSON_AddItemToArray(dist, cJSON_CreateNumber(at < 0 ? -1.0 : (double)d.dist[at]));
                free(b);
            }
            regex_free(&d);
        }
        char *text = cJSON_PrintUnformatted(out);
        if (!text) die("out of memory");
        printf("%s\n", text);
        free(text);
        free(p);
        cJSON_Delete(out);
        cJSON_Delete(in);
    }
    free(line);
    return 0;
}

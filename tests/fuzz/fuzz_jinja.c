// The Jinja engine on arbitrary templates and variables: template, separator, a JSON object of variables
// (none: a two-message conversation). It must never crash, hang or leak: a template either parses or is
// refused with a message, and a parsed one renders or fails with a message, the same way twice.
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "fuzz.h"
#include "text/jinja.h"

static const char DEFAULT_VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"hi\"}], "
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"tools\": null}";

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)ctx;
    char *parts[2];
    size_t lens[2];
    fuzz_split(data, size, parts, lens, 2);
    char *err = NULL;
    JinjaTemplate *t = jinja_parse(parts[0], lens[0], "fuzz.jinja", &err);
    if (!t) {
        if (!err || !*err) fuzz_fail("a template refused without a message");
        free(err);
        fuzz_parts_free(parts, 2);
        return;
    }
    uint32_t nul = 0;
    cJSON *vars = lens[1] ? json_parse_line(parts[1], lens[1], &nul) : NULL;
    if (!cJSON_IsObject(vars)) {
        cJSON_Delete(vars);
        vars = cJSON_Parse(DEFAULT_VARS);
        nul = 0;
    }
    Buf a = {0}, b = {0};
    char *e1 = jinja_render(t, vars, nul, &a), *e2 = jinja_render(t, vars, nul, &b);
    if (!e1 != !e2) fuzz_fail("a render failed once and not twice");
    if (e1 && strcmp(e1, e2) != 0) fuzz_fail("a render failed two ways");
    if (!e1 && (a.len != b.len || (a.len && memcmp(a.data, b.data, a.len)))) fuzz_fail("two renders differ");
    if (e1 && a.len) fuzz_fail("a failed render left output");
    free(e1);
    free(e2);
    buf_free(&a);
    buf_free(&b);
    cJSON_Delete(vars);
    jinja_free(t);
    fuzz_parts_free(parts, 2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_run(body, data, size, NULL);
    return 0;
}

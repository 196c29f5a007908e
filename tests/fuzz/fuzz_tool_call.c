// The hermes tool-call parser on arbitrary model text (the whole input): it must never crash, and a call it
// accepts must come back the same when written as the chat templates write one and parsed again.
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "fuzz.h"
#include "text/chat.h"

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)ctx;
    uint32_t nul;
    const char *error;
    cJSON *call = chat_parse_tool_call((const char *)data, size, &nul, &error);
    if (!call) {
        if (!error) fuzz_fail("refused without a reason");
        return;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(call, "name");
    Buf args = {0}, text = {0}, again_args = {0};
    json_dump_py(&args, cJSON_GetObjectItemCaseSensitive(call, "arguments"), nul);
    buf_append(&text, "<tool_call>\n{\"name\": ", 21);
    json_dump_py(&text, name, nul);
    buf_append(&text, ", \"arguments\": ", 15);
    buf_append(&text, args.data, args.len);
    buf_append(&text, "}\n</tool_call>", 14);
    uint32_t nul2;
    cJSON *again = chat_parse_tool_call(text.data, text.len, &nul2, &error);
    if (!again) fuzz_fail("a call written back does not parse");
    json_dump_py(&again_args, cJSON_GetObjectItemCaseSensitive(again, "arguments"), nul2);
    size_t n1, n2;  // compared as bytes: a U+0000 is a different sentinel in each parse
    char *b1 = json_string_bytes(name, nul, &n1);
    char *b2 = json_string_bytes(cJSON_GetObjectItemCaseSensitive(again, "name"), nul2, &n2);
    if (n1 != n2 || memcmp(b1, b2, n1) != 0) fuzz_fail("the name changed");
    free(b1);
    free(b2);
    if (args.len != again_args.len || memcmp(args.data, again_args.data, args.len) != 0)
        fuzz_fail("the arguments changed");
    cJSON_Delete(again);
    cJSON_Delete(call);
    buf_free(&args);
    buf_free(&text);
    buf_free(&again_args);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_run(body, data, size, NULL);
    return 0;
}

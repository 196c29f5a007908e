// tokenizer.json + tokenizer_config.json, then encode and decode: the input is tokenizer.json, a
// separator line (fuzz.h), tokenizer_config.json (absent when empty), a separator, and a text that is
// encoded (raw and through the chat template), decoded back, and also decoded read as token ids.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "text/chat.h"
#include "text/tokenizer.h"

typedef struct {
    char *path, *text;
    size_t n_text;
} Input;

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)data, (void)size;
    Input *in = ctx;
    Tokenizer t;
    tokenizer_load(&t, in->path);
    IdList ids = {0};
    size_t bad = 0;
    Buf out = {0};
    if (tokenizer_encode(&t, in->text, in->n_text, &ids, &bad) == 0)
        tokenizer_decode(&t, ids.ids, ids.n, &out, &bad);
    ids.n = 0;
    free(chat_encode_prompt(&t, in->text, in->n_text, 1, NULL, &ids));  // the chat template's rendering too
    out.len = 0;
    tokenizer_decode(&t, (const int32_t *)(const void *)in->text, in->n_text / 4, &out, &bad);
    buf_free(&out);
    free(ids.ids);
    tokenizer_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *parts[3];
    size_t lens[3];
    fuzz_split(data, size, parts, lens, 3);
    Input in = {fuzz_write("tokenizer.json", parts[0], lens[0]), parts[2], lens[2]};
    char *cfg = fuzz_write("tokenizer_config.json", parts[1], lens[1]);
    if (lens[1] == 0) remove(cfg);
    free(cfg);
    // The text as token ids must be aligned.
    in.text = realloc(parts[2], lens[2] + 4);
    if (!in.text) fuzz_fail("out of memory");
    parts[2] = in.text;
    fuzz_run(body, data, size, &in);
    free(in.path);
    fuzz_parts_free(parts, 3);
    return 0;
}

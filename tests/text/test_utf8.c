// Streaming UTF-8 decode must equal decoding the whole byte string at once, however the bytes
// are split into tokens (whole-string lossy decoding itself is checked against Python and JS in
// tests/text/decode_lossy.py).
#include <stdio.h>
#include <string.h>

#include "base/rng.h"
#include "text/utf8.h"

int main(void) {
    Rng rng;
    rng_init(&rng, 11);
    // Bytes biased towards UTF-8 structure so valid, truncated and broken sequences all occur.
    static const unsigned char pool[] = {'a', ' ', 0x80, 0x8F, 0x90, 0xA0, 0xBF, 0xC2, 0xC3, 0xDF,
                                         0xE0, 0xE1, 0xED, 0xEF, 0xF0, 0xF1, 0xF4, 0xF5, 0xFF, 0xC0};
    int failures = 0;
    for (int trial = 0; trial < 20000; trial++) {
        unsigned char s[32];
        size_t n = rng_next_u64(&rng) % sizeof s;
        for (size_t i = 0; i < n; i++) s[i] = pool[rng_next_u64(&rng) % sizeof pool];
        Buf whole = {0}, streamed = {0};
        utf8_append_lossy(&whole, (const char *)s, n);
        Utf8Stream st = {0};
        for (size_t i = 0; i < n;) {
            size_t k = 1 + rng_next_u64(&rng) % 4;
            if (k > n - i) k = n - i;
            size_t before = streamed.len;
            utf8_stream_push(&st, (const char *)s + i, k, &streamed);
            // What was emitted so far is final: a prefix of the whole decode, and valid UTF-8.
            if (streamed.len && (streamed.len > whole.len || memcmp(streamed.data, whole.data, streamed.len) != 0 ||
                                 utf8_check(streamed.data + before, streamed.len - before) != streamed.len - before))
                failures++;
            i += k;
        }
        utf8_stream_finish(&st, &streamed);
        if (streamed.len != whole.len || (whole.len && memcmp(streamed.data, whole.data, whole.len) != 0)) {
            if (failures++ < 5) fprintf(stderr, "trial %d: streamed decode differs\n", trial);
        }
        buf_free(&whole);
        buf_free(&streamed);
    }
    printf("test_utf8: %s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}

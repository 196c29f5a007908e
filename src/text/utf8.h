// UTF-8 validation and lossy decoding. Invalid bytes become U+FFFD, one per "maximal subpart"
// (Unicode 3.9, the policy of WHATWG TextDecoder and Rust's from_utf8_lossy), so decoded text
// matches what Hugging Face and transformers.js produce.
#pragma once
#include <stddef.h>

#include "base/util.h"

typedef enum { UTF8_VALID, UTF8_INVALID, UTF8_INCOMPLETE } Utf8Scan;

// Classifies the sequence at s[0..n): VALID (*len = its length), INVALID (*len = bytes to
// replace by one U+FFFD), or INCOMPLETE (a valid prefix cut off by the end; *len = n).
Utf8Scan utf8_scan(const unsigned char *s, size_t n, size_t *len);
// Offset of the first invalid byte, or n when all of s is valid UTF-8.
size_t utf8_check(const char *s, size_t n);
void utf8_append_lossy(Buf *out, const char *s, size_t n);

// Streaming decode: bytes arrive token by token; only complete characters are emitted and a
// character split across tokens waits for its remaining bytes.
typedef struct {
    unsigned char pending[4];
    size_t n_pending;
} Utf8Stream;
void utf8_stream_push(Utf8Stream *st, const char *s, size_t n, Buf *out);
void utf8_stream_finish(Utf8Stream *st, Buf *out);  // a cut-off tail becomes U+FFFD

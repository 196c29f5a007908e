#include "text/utf8.h"

#include <string.h>

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

Utf8Scan utf8_scan(const unsigned char *s, size_t n, size_t *len) {
    unsigned char b = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b < 0x80) {
        *len = 1;
        return UTF8_VALID;
    } else if (b >= 0xC2 && b <= 0xDF) {
        need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0) lo = 0xA0;  // no overlong forms
        if (b == 0xED) hi = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
        *len = 1;
        return UTF8_INVALID;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *len = n;
            return UTF8_INCOMPLETE;
        }
        unsigned char c = s[i];
        if (c < (i == 1 ? lo : 0x80) || c > (i == 1 ? hi : 0xBF)) {
            *len = i;
            return UTF8_INVALID;
        }
    }
    *len = need;
    return UTF8_VALID;
}

size_t utf8_check(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, len;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        if (utf8_scan(p + i, n - i, &len) != UTF8_VALID) return i;
        i += len;
    }
    return n;
}

// Appends s[0..n) lossily; returns how many trailing bytes were an incomplete sequence left
// unconsumed (only when keep_incomplete).
static size_t append_lossy(Buf *out, const unsigned char *s, size_t n, int keep_incomplete) {
    size_t i = 0, start = 0, len;
    while (i < n) {
        Utf8Scan r = utf8_scan(s + i, n - i, &len);
        if (r == UTF8_VALID) {
            i += len;
            continue;
        }
        buf_append(out, s + start, i - start);
        if (r == UTF8_INCOMPLETE && keep_incomplete) return n - i;
        buf_append(out, REPLACEMENT, 3);
        i += len;
        start = i;
    }
    buf_append(out, s + start, i - start);
    return 0;
}

void utf8_append_lossy(Buf *out, const char *s, size_t n) { append_lossy(out, (const unsigned char *)s, n, 0); }

void utf8_stream_push(Utf8Stream *st, const char *s, size_t n, Buf *out) {
    // Complete the pending character first, byte by byte: it needs at most 3 more.
    size_t used = 0;
    while (st->n_pending && used < n) {
        st->pending[st->n_pending++] = (unsigned char)s[used++];
        size_t len;
        Utf8Scan r = utf8_scan(st->pending, st->n_pending, &len);
        if (r == UTF8_INCOMPLETE) continue;
        size_t rest = st->n_pending;
        unsigned char tmp[4];
        memcpy(tmp, st->pending, rest);
        st->n_pending = 0;
        if (r == UTF8_VALID) {
            buf_append(out, tmp, len);
        } else {  // replace the broken prefix, rescan what followed it
            buf_append(out, REPLACEMENT, 3);
            utf8_stream_push(st, (const char *)tmp + len, rest - len, out);
        }
    }
    size_t keep = append_lossy(out, (const unsigned char *)s + used, n - used, 1);
    memcpy(st->pending + st->n_pending, s + n - keep, keep);
    st->n_pending += keep;
}

void utf8_stream_finish(Utf8Stream *st, Buf *out) {
    append_lossy(out, st->pending, st->n_pending, 0);
    st->n_pending = 0;
}

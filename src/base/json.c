#define _GNU_SOURCE  // memmem, strncasecmp
#include "base/json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/util.h"

typedef struct {
    cJSON *item;
    size_t index;
} Member;

static int cmp_member(const void *a, const void *b) {
    const Member *x = a, *y = b;
    int c = strcmp(x->item->string, y->item->string);
    if (c) return c;
    return (x->index > y->index) - (x->index < y->index);
}

// Python's json and Hugging Face keep the last of an object's duplicate keys, cJSON's lookups find the
// first: drop all but the last of each name, in every object (sorted, so n log n for a hostile header).
static void keep_last_duplicates(cJSON *node) {
    size_t n = 0;
    for (cJSON *c = node->child; c; c = c->next) {
        keep_last_duplicates(c);
        n++;
    }
    if (!cJSON_IsObject(node) || n < 2) return;
    Member *m = xmalloc(n * sizeof *m);
    n = 0;
    for (cJSON *c = node->child; c; c = c->next, n++) m[n] = (Member){c, n};
    qsort(m, n, sizeof *m, cmp_member);
    for (size_t i = 0; i + 1 < n; i++)
        if (strcmp(m[i].item->string, m[i + 1].item->string) == 0)
            cJSON_Delete(cJSON_DetachItemViaPointer(node, m[i].item));
    free(m);
}

static void number_nodes(cJSON *node, cJSON ***out, size_t *n, size_t *cap) {
    for (; node; node = node->next) {
        if (cJSON_IsNumber(node)) {
            if (*n == *cap) *out = xrealloc(*out, (*cap = *cap ? 2 * *cap : 64) * sizeof **out);
            (*out)[(*n)++] = node;
        }
        number_nodes(node->child, out, n, cap);
    }
}

// The text of each number written with a fraction or an exponent, or with more than 15 digits, as its item's
// valuestring (the k-th number of the text is the k-th number item in document order).
static void keep_number_text(cJSON *root, const char *text, size_t len) {
    cJSON **nodes = NULL;
    size_t n = 0, cap = 0, k = 0;
    number_nodes(root, &nodes, &n, &cap);
    for (size_t i = 0; i < len && k < n;) {
        if (text[i] == '"') {  // a string: up to its closing quote
            for (i++; i < len && text[i] != '"'; i++) i += text[i] == '\\';
            i++;
        } else if (text[i] == '-' || (text[i] >= '0' && text[i] <= '9')) {
            size_t start = i;
            int plain = 1;
            for (; i < len && text[i] && strchr("+-.eE0123456789", text[i]); i++)
                plain &= !strchr(".eE", text[i]);
            if ((!plain || i - start > 15) && !(nodes[k]->valuestring = strndup(text + start, i - start)))
                die("out of memory");
            k++;
        } else {
            i++;
        }
    }
    free(nodes);
}

cJSON *json_parse_exact(const char *text, size_t len, size_t *error_offset) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!end) end = text;
    if (root) {  // cJSON stops after the first value; anything but whitespace after it is an error
        while ((size_t)(end - text) < len && strchr(" \t\r\n", *end) && *end) end++;
        if ((size_t)(end - text) < len) {
            cJSON_Delete(root);
            root = NULL;
        }
    }
    if (error_offset) *error_offset = (size_t)(end - text);
    if (root) keep_number_text(root, text, (size_t)(end - text));
    return root;
}

// UTF-8 of a code point in U+0800..U+FFFF (the sentinels are U+FDD0..U+FDEF).
static void utf8_of_bmp(uint32_t c, unsigned char out[3]) {
    out[0] = (unsigned char)(0xE0 | c >> 12);
    out[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
    out[2] = (unsigned char)(0x80 | (c & 0x3F));
}

int json_holds_nul(const char *text, uint32_t nul_sentinel) {
    unsigned char utf8[3];
    utf8_of_bmp(nul_sentinel, utf8);
    return nul_sentinel && memmem(text, strlen(text), utf8, sizeof utf8) != NULL;
}

cJSON *json_parse_line(const char *line, size_t len, uint32_t *nul_sentinel) {
    *nul_sentinel = 0;
    if (!memmem(line, len, "\\u0000", 6)) {
        cJSON *root = json_parse_exact(line, len, NULL);
        if (root) keep_last_duplicates(root);
        return root;
    }
    // Pick U+FDD0..U+FDEF whose hex digits appear nowhere in the line (so neither raw nor escaped).
    char hex[9];
    for (uint32_t c = 0xFDD0; c <= 0xFDEF && !*nul_sentinel; c++) {
        snprintf(hex, sizeof hex, "%04X", c);
        int seen = 0;
        for (size_t i = 0; i + 4 <= len && !seen; i++) seen = strncasecmp(line + i, hex, 4) == 0;
        unsigned char utf8[3];
        utf8_of_bmp(c, utf8);
        if (!seen && !memmem(line, len, utf8, 3)) *nul_sentinel = c;
    }
    if (!*nul_sentinel) return NULL;
    snprintf(hex, sizeof hex, "%04X", *nul_sentinel);
    char *copy = xmalloc(len + 1);
    memcpy(copy, line, len);
    copy[len] = '\0';
    for (size_t i = 0; i + 1 < len; i++) {
        if (copy[i] != '\\') continue;  // outside strings a backslash is invalid anyway
        if (i + 6 <= len && memcmp(copy + i + 1, "u0000", 5) == 0) memcpy(copy + i + 2, hex, 4);
        i++;  // skip the escaped character: "\\u0000" is a backslash and "u0000"
    }
    cJSON *root = json_parse_exact(copy, len, NULL);
    free(copy);
    if (root) keep_last_duplicates(root);
    return root;
}

void jsonl_open(JsonlReader *r, const char *path, const char *key) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->f = fopen(path, "r");
    if (!r->f) die("%s: cannot open %s: %s", key, path, strerror(errno));
}

cJSON *jsonl_next(JsonlReader *r) {
    while (line_read(r->f, &r->buf, &r->cap, r->path, r->line + 1) >= 0) {
        r->line++;
        if (strspn(r->buf, " \t\r\n") == strlen(r->buf)) continue;  // blank line
        cJSON *root = json_parse_line(r->buf, strlen(r->buf), &r->nul);
        if (!cJSON_IsObject(root)) die("%s:%lld: not a JSON object", r->path, (long long)r->line);
        return root;
    }
    if (ferror(r->f)) die("cannot read data file %s", r->path);
    return NULL;
}

void jsonl_close(JsonlReader *r) {
    if (r->f) fclose(r->f);
    free(r->buf);
    memset(r, 0, sizeof *r);
}

char *json_string_bytes(const cJSON *item, uint32_t nul_sentinel, size_t *len) {
    const char *s = item->valuestring;
    size_t n = strlen(s), out = 0;
    char *b = xmalloc(n + 1);
    unsigned char sent[3];
    utf8_of_bmp(nul_sentinel, sent);
    for (size_t i = 0; i < n; i++) {
        if (nul_sentinel && i + 3 <= n && memcmp(s + i, sent, 3) == 0) {
            b[out++] = '\0';
            i += 2;
        } else {
            b[out++] = s[i];
        }
    }
    b[out] = '\0';
    *len = out;
    return b;
}

void json_write_number(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.9g", x);
    else fputs("null", f);
}

void json_write_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

cJSON *json_load_file(const char *path, size_t max) {
    size_t len, off;
    char *text = file_read_all(path, max, &len);
    cJSON *root = json_parse_exact(text, len, &off);
    free(text);
    if (!root) die("%s: malformed JSON near byte %zu", path, off);
    keep_last_duplicates(root);
    return root;
}

int json_as_int(const cJSON *item, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(item)) return 0;
    double v = item->valuedouble;
    if (v != floor(v) || v < (double)lo || v > (double)hi) return 0;
    *out = (int64_t)v;
    return 1;
}

static const cJSON *get(const cJSON *obj, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return (it && !cJSON_IsNull(it)) ? it : NULL;
}

int64_t json_get_int_or(const cJSON *obj, const char *key, int64_t fallback, const char *where) {
    const cJSON *it = get(obj, key);
    if (!it) return fallback;
    int64_t v;
    if (!json_as_int(it, INT64_MIN / 2, INT64_MAX / 2, &v)) die("%s: key \"%s\" must be an integer", where, key);
    return v;
}

int64_t json_get_int(const cJSON *obj, const char *key, const char *where) {
    if (!get(obj, key)) die("%s: missing required key \"%s\"", where, key);
    return json_get_int_or(obj, key, 0, where);
}

double json_get_number_or(const cJSON *obj, const char *key, double fallback, const char *where) {
    const cJSON *it = get(obj, key);
    if (!it) return fallback;
    if (!cJSON_IsNumber(it)) die("%s: key \"%s\" must be a number", where, key);
    return it->valuedouble;
}

double json_get_number(const cJSON *obj, const char *key, const char *where) {
    if (!get(obj, key)) die("%s: missing required key \"%s\"", where, key);
    return json_get_number_or(obj, key, 0, where);
}

int json_get_bool_or(const cJSON *obj, const char *key, int fallback, const char *where) {
    const cJSON *it = get(obj, key);
    if (!it) return fallback;
    if (!cJSON_IsBool(it)) die("%s: key \"%s\" must be true or false", where, key);
    return cJSON_IsTrue(it);
}

void json_save_file(const char *path, const cJSON *root) {
    char *text = cJSON_Print(root);
    if (!text) die("out of memory");
    AtomicFile af;
    atomic_file_open(&af, path);
    atomic_file_write(&af, text, strlen(text));
    atomic_file_write(&af, "\n", 1);
    atomic_file_commit(&af);
    free(text);
}

static void buf_str(Buf *b, const char *s) { buf_append(b, s, strlen(s)); }

static void dump_string(Buf *out, const char *s, size_t n) {
    buf_str(out, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *short_form = NULL;
        char esc[8];
        if (c == '"') short_form = "\\\"";
        else if (c == '\\') short_form = "\\\\";
        else if (c == '\b') short_form = "\\b";
        else if (c == '\f') short_form = "\\f";
        else if (c == '\n') short_form = "\\n";
        else if (c == '\r') short_form = "\\r";
        else if (c == '\t') short_form = "\\t";
        if (short_form) {
            buf_str(out, short_form);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            buf_str(out, esc);
        } else {
            buf_append(out, s + i, 1);
        }
    }
    buf_str(out, "\"");
}

static void dump_number(Buf *out, double x) {
    char num[40];
    if (!isfinite(x)) {  // JSON text has none (cJSON reads none)
        buf_str(out, "null");
        return;
    }
    if (fabs(x) < 1e16 && x == (double)(int64_t)x) {  // the range first: a cast out of it is undefined
        snprintf(num, sizeof num, "%" PRId64, (int64_t)x);
    } else {
        for (int digits = 1; digits <= 17; digits++) {
            snprintf(num, sizeof num, "%.*g", digits, x);
            if (strtod(num, NULL) == x) break;
        }
    }
    buf_str(out, num);
}

void json_dump_py(Buf *out, const cJSON *v, uint32_t nul_sentinel) {
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        int object = cJSON_IsObject(v);
        buf_str(out, object ? "{" : "[");
        for (const cJSON *e = v->child; e; e = e->next) {
            if (e != v->child) buf_str(out, ", ");
            if (object) {
                dump_string(out, e->string, strlen(e->string));
                buf_str(out, ": ");
            }
            json_dump_py(out, e, nul_sentinel);
        }
        buf_str(out, object ? "}" : "]");
    } else if (cJSON_IsString(v)) {
        size_t n;
        char *s = json_string_bytes(v, nul_sentinel, &n);
        dump_string(out, s, n);
        free(s);
    } else if (cJSON_IsNumber(v)) {
        dump_number(out, v->valuedouble);
    } else if (cJSON_IsBool(v)) {
        buf_str(out, cJSON_IsTrue(v) ? "true" : "false");
    } else {
        buf_str(out, "null");
    }
}

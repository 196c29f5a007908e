#include "base/yaml.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "base/util.h"

// Nesting and size limits: configs are small, and aliases can otherwise expand a few lines into
// billions of keys, or loop (an alias to its own ancestor).
// Merges ("<<: [*a, *a, ...]") can also fan out exponentially while adding no new key, so the pairs
// visited are counted too.
enum { YAML_MAX_DEPTH = 64, YAML_MAX_ENTRIES = 10000, YAML_MAX_WORK = 1000000 };

typedef struct {
    YamlDoc *d;
    yaml_document_t *doc;
    const char *name;  // the file's path, or what the value came from (`override "k=v"`)
    int is_file;
    int first;  // the first entry of this load: duplicates are looked for from here on
    long work;  // mapping pairs visited, merges included
} Flatten;

typedef struct {
    yaml_node_t *key, *value;
} Pair;

typedef struct {
    Pair *p;
    int n, cap;
} PairList;

static void pairs_push(PairList *l, yaml_node_t *key, yaml_node_t *value) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->p = xrealloc(l->p, (size_t)l->cap * sizeof *l->p);
    }
    l->p[l->n++] = (Pair){key, value};
}

static int node_line(const yaml_node_t *n) { return (int)n->start_mark.line + 1; }

// Dies with "path:12: <message>" for a file, "<the value's description>: <message>" otherwise.
static _Noreturn GRPO_PRINTF(3, 4) void flatten_die(const Flatten *f, const yaml_node_t *at, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (f->is_file && at) die("%s:%d: %s", f->name, node_line(at), msg);
    die("%s: %s", f->name, msg);
}

static const char *scalar_text(const Flatten *f, const yaml_node_t *n, const char *what) {
    const char *s = (const char *)n->data.scalar.value;
    if (strlen(s) != n->data.scalar.length) flatten_die(f, n, "a NUL byte in a %s", what);
    return s;
}

static int scalar_is_null(const yaml_node_t *n) {
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *s = (const char *)n->data.scalar.value;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static int is_merge_key(const yaml_node_t *k) {
    return k->type == YAML_SCALAR_NODE && k->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           !strcmp((const char *)k->data.scalar.value, "<<");
}

static const char *key_text(const Flatten *f, const yaml_node_t *k) {
    if (k->type != YAML_SCALAR_NODE) flatten_die(f, k, "a key must be a plain string, not a list or mapping");
    const char *s = scalar_text(f, k, "key");
    if (!*s) flatten_die(f, k, "empty key");
    return s;
}

static int pairs_find(const PairList *l, const char *key) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp((const char *)l->p[i].key->data.scalar.value, key)) return i;
    return -1;
}

// The pairs of a mapping after "<<" merges, as YAML 1.1 defines them: the mapping's own keys win,
// then each merged mapping in order adds the keys not yet present (a shallow merge).
static void mapping_pairs(Flatten *f, yaml_node_t *map, const char *prefix, PairList *out, int depth) {
    if (depth > YAML_MAX_DEPTH)
        flatten_die(f, map, "nesting deeper than %d levels (a recursive alias?)", YAML_MAX_DEPTH);
    PairList merges = {0};
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        if (++f->work > YAML_MAX_WORK)
            flatten_die(f, map, "aliases and merges expand past %d keys (a YAML bomb?)", YAML_MAX_WORK);
        yaml_node_t *k = yaml_document_get_node(f->doc, p->key), *v = yaml_document_get_node(f->doc, p->value);
        if (is_merge_key(k)) {
            pairs_push(&merges, k, v);
            continue;
        }
        const char *ks = key_text(f, k);
        int prev = pairs_find(out, ks);
        if (prev >= 0) {
            const char *dot = *prefix ? "." : "";
            if (f->is_file)
                flatten_die(f, k, "duplicate key \"%s%s%s\" (first given at line %d)", prefix, dot, ks,
                            node_line(out->p[prev].key));
            flatten_die(f, k, "duplicate key \"%s%s%s\"", prefix, dot, ks);
        }
        pairs_push(out, k, v);
    }
    for (int m = 0; m < merges.n; m++) {
        yaml_node_t *v = merges.p[m].value;
        int n_src =
            v->type == YAML_SEQUENCE_NODE ? (int)(v->data.sequence.items.top - v->data.sequence.items.start) : 1;
        for (int s = 0; s < n_src; s++) {
            yaml_node_t *src =
                v->type == YAML_SEQUENCE_NODE ? yaml_document_get_node(f->doc, v->data.sequence.items.start[s]) : v;
            if (src->type != YAML_MAPPING_NODE)
                flatten_die(f, merges.p[m].key, "\"<<\" merges a mapping or a list of mappings, nothing else");
            PairList sub = {0};
            mapping_pairs(f, src, prefix, &sub, depth + 1);
            for (int i = 0; i < sub.n; i++)
                if (pairs_find(out, (const char *)sub.p[i].key->data.scalar.value) < 0)
                    pairs_push(out, sub.p[i].key, sub.p[i].value);
            free(sub.p);
        }
    }
    free(merges.p);
}

static YamlEntry *entry_add(Flatten *f, const char *key, YamlEntryKind kind, const yaml_node_t *at, int line) {
    YamlDoc *d = f->d;
    for (int i = f->first; i < d->n; i++) {
        if (strcmp(d->entries[i].key, key)) continue;
        if (f->is_file) flatten_die(f, at, "duplicate key \"%s\" (first given at line %d)", key, d->entries[i].line);
        flatten_die(f, at, "duplicate key \"%s\"", key);
    }
    if (d->n - f->first >= YAML_MAX_ENTRIES)
        flatten_die(f, at, "more than %d keys (aliases expanding without end?)", YAML_MAX_ENTRIES);
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 64;
        d->entries = xrealloc(d->entries, (size_t)d->cap * sizeof *d->entries);
    }
    YamlEntry *e = &d->entries[d->n++];
    *e = (YamlEntry){.key = xstrdup(key), .kind = kind, .line = line};
    return e;
}

static YamlScalar scalar_copy(const Flatten *f, const yaml_node_t *n) {
    return (YamlScalar){xstrdup(scalar_text(f, n, "value")), scalar_is_null(n)};
}

// `at` is the node errors point to (the key, or the root value), `line` the entry's line.
static void flatten(Flatten *f, yaml_node_t *node, const char *key, const yaml_node_t *at, int line, int depth) {
    if (depth > YAML_MAX_DEPTH)
        flatten_die(f, at, "nesting deeper than %d levels (a recursive alias?)", YAML_MAX_DEPTH);
    if (node->type == YAML_SCALAR_NODE) {
        YamlEntry *e = entry_add(f, key, YAML_ENTRY_SCALAR, at, line);
        e->scalar = scalar_copy(f, node);
    } else if (node->type == YAML_SEQUENCE_NODE) {
        int n = (int)(node->data.sequence.items.top - node->data.sequence.items.start);
        YamlScalar *items = xcalloc((size_t)(n ? n : 1), sizeof *items);
        for (int i = 0; i < n; i++) {
            yaml_node_t *it = yaml_document_get_node(f->doc, node->data.sequence.items.start[i]);
            if (it->type != YAML_SCALAR_NODE) flatten_die(f, it, "\"%s\": a list may hold only plain values", key);
            items[i] = scalar_copy(f, it);
        }
        YamlEntry *e = entry_add(f, key, YAML_ENTRY_LIST, at, line);
        e->items = items;
        e->n_items = n;
    } else if (node->type == YAML_MAPPING_NODE) {
        PairList pairs = {0};
        mapping_pairs(f, node, key, &pairs, depth);
        if (pairs.n == 0 && *key) entry_add(f, key, YAML_ENTRY_EMPTY_MAP, at, line);
        for (int i = 0; i < pairs.n; i++) {
            const char *k = (const char *)pairs.p[i].key->data.scalar.value;
            size_t n = strlen(key) + strlen(k) + 2;
            char *full = xmalloc(n);
            snprintf(full, n, "%s%s%s", key, *key ? "." : "", k);
            flatten(f, pairs.p[i].value, full, pairs.p[i].key, f->is_file ? node_line(pairs.p[i].key) : 0, depth + 1);
            free(full);
        }
        free(pairs.p);
    }
}

// One line for libyaml's complaint. Reader errors (bad UTF-8, control characters) come with a
// byte offset instead of a mark.
static _Noreturn void parser_die(const yaml_parser_t *p, const char *text, const char *name, int is_file,
                                 int col_offset) {
    if (p->error == YAML_MEMORY_ERROR) die("%s: out of memory parsing YAML", name);
    size_t line = p->problem_mark.line, col = p->problem_mark.column;
    char value[32] = "";
    if (p->error == YAML_READER_ERROR) {
        line = col = 0;
        for (size_t i = 0; i < p->problem_offset && text[i]; i++) {
            if (text[i] == '\n')
                line++, col = 0;
            else
                col++;
        }
        if (p->problem_value != -1) snprintf(value, sizeof value, " (byte 0x%02x)", p->problem_value & 0xff);
    }
    const char *problem = p->problem ? p->problem : "malformed YAML";
    char context[256] = "";
    if (p->context && is_file)
        snprintf(context, sizeof context, " (%s at line %zu)", p->context, p->context_mark.line + 1);
    else if (p->context)
        snprintf(context, sizeof context, " (%s)", p->context);
    if (is_file) die("%s:%zu:%zu: %s%s%s", name, line + 1, col + 1, problem, value, context);
    die("%s: %s%s at column %zu%s", name, problem, value, col + 1 + (size_t)col_offset, context);
}

// The line (1-based) where flow collections ([ and {) outside quotes and comments first nest deeper than
// `limit`, or 0. libyaml's parser slows down badly on deep flow nesting (100,000 "[" take 20 s) before
// our own depth limit could see it.
static int flow_too_deep(const char *text, size_t len, int limit) {
    int depth = 0, line = 1;
    char quote = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        line += c == '\n';
        if (quote) {
            if (c == '\\' && quote == '"' && i + 1 < len) i++;
            else if (c == quote) quote = 0;
        } else if (c == '"' || c == '\'') {
            quote = c;
        } else if (c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n')) {
            while (i + 1 < len && text[i + 1] != '\n') i++;
        } else if ((c == '[' || c == '{') && ++depth > limit) {
            return line;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return 0;
}

// Parses text as exactly one YAML document and flattens its root under `prefix`.
static void load(YamlDoc *d, const char *text, size_t len, const char *prefix, const char *name, int is_file,
                 int col_offset) {
    int deep = flow_too_deep(text, len, YAML_MAX_DEPTH);
    if (deep && is_file) die("%s:%d: nesting deeper than %d levels of [ ] or { }", name, deep, YAML_MAX_DEPTH);
    if (deep) die("%s: nesting deeper than %d levels of [ ] or { }", name, YAML_MAX_DEPTH);
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) die("%s: out of memory parsing YAML", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    yaml_document_t doc;
    if (!yaml_parser_load(&parser, &doc)) parser_die(&parser, text, name, is_file, col_offset);
    Flatten f = {d, &doc, name, is_file, d->n, 0};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        // A second document would be silently ignored by many readers: refuse it.
        yaml_document_t next;
        if (!yaml_parser_load(&parser, &next)) parser_die(&parser, text, name, is_file, col_offset);
        yaml_node_t *next_root = yaml_document_get_root_node(&next);
        if (next_root) {
            if (is_file) die("%s:%d: a second YAML document (a config file holds one)", name, node_line(next_root));
            die("%s: a second YAML document in the value", name);
        }
        yaml_document_delete(&next);
    }
    if (is_file && root) {
        if (root->type == YAML_SCALAR_NODE && scalar_is_null(root))
            root = NULL;  // "~": nothing set
        else if (root->type != YAML_MAPPING_NODE)
            flatten_die(&f, root, "the top level must be a mapping of keys");
    }
    if (!is_file && root && root->type == YAML_MAPPING_NODE && root->data.mapping.style != YAML_FLOW_MAPPING_STYLE)
        die("%s: the value reads as a YAML mapping (\"key: value\"); quote it to give a string", name);
    if (!is_file && root && root->type == YAML_SEQUENCE_NODE && root->data.sequence.style != YAML_FLOW_SEQUENCE_STYLE)
        die("%s: the value reads as a YAML block list (\"- item\"); quote it, or write [a, b]", name);
    if (!is_file && !root) {
        // An empty value ("key=") is a null, as "key:" is in a file.
        YamlEntry *e = entry_add(&f, prefix, YAML_ENTRY_SCALAR, NULL, 0);
        e->scalar = (YamlScalar){xstrdup(""), 1};
    } else if (root) {
        flatten(&f, root, prefix, root, is_file ? node_line(root) : 0, 0);
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
}

void yaml_doc_load_file(YamlDoc *d, const char *path) {
    size_t len;
    char *text = file_read_all(path, FILE_MAX_CONFIG, &len);
    load(d, text, len, "", path, 1, 0);
    free(text);
}

void yaml_doc_load_value(YamlDoc *d, const char *prefix, const char *text, const char *where_, int col_offset) {
    load(d, text, strlen(text), prefix, where_, 0, col_offset);
}

void yaml_doc_free(YamlDoc *d) {
    for (int i = 0; i < d->n; i++) {
        YamlEntry *e = &d->entries[i];
        free(e->key);
        free(e->scalar.text);
        for (int j = 0; j < e->n_items; j++) free(e->items[j].text);
        free(e->items);
    }
    free(d->entries);
    *d = (YamlDoc){0};
}

// Length of the UTF-8 sequence at s[0..n) and its code point; 0 when it is not UTF-8 (a stray or
// missing continuation byte, an overlong form, a surrogate, past U+10FFFF).
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    size_t len = 0;
    if (s[0] >= 0xF8) return 0;
    if (s[0] >= 0xF0) len = 4;
    else if (s[0] >= 0xE0) len = 3;
    else if (s[0] >= 0xC0) len = 2;
    if (len == 0 || len > n) return 0;
    uint32_t c = s[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return len;
}

void yaml_write_string(FILE *f, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        if (c < 0x80) {
            if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
            else if (c == '\n') fputs("\\n", f);
            else if (c == '\t') fputs("\\t", f);
            else if (c == '\r') fputs("\\r", f);
            else if (c < 0x20 || c == 0x7F) fprintf(f, "\\x%02X", c);
            else fputc(c, f);
            i++;
            continue;
        }
        uint32_t cp;
        size_t len = utf8_decode(u + i, n - i, &cp);
        if (len == 0) {
            fputs("\\uFFFD", f);
            i++;
            continue;
        }
        int escape = cp <= 0x9F || cp == 0x2028 || cp == 0x2029;  // C1 controls, NEL and the line breaks
        escape |= cp == 0xFEFF || cp == 0xFFFE || cp == 0xFFFF;      // byte-order mark, non-characters
        if (escape) fprintf(f, "\\u%04X", (unsigned)cp);
        else fwrite(u + i, 1, len, f);
        i += len;
    }
    fputc('"', f);
}

// A JSON Schema compiled into nodes for the JSON mode's automaton (see json_schema.h).
#include "rollout/json_schema.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

#define JS_MAX_NODES 4096
#define JS_MAX_NESTING 64  // schema objects within schema objects
#define JS_MAX_STRINGS 64           // strings with a pattern or format (an automaton each) at most
#define JS_PATTERN_BYTES (16 << 10)  // and their patterns' bytes (guided_regex's bound)

typedef struct {
    const cJSON *root;
    JsonSchema *s;
    int cap_nodes, cap_props, cap_lits, cap_alts;
    const cJSON **memo;  // the schema object node memo_id[i] was compiled from ($ref targets compile once)
    int *memo_id, n_memo, cap_memo;
    int *anyof;  // the anyOf nodes, checked once all are compiled, and where each is
    char **anyof_at;
    int n_anyof, cap_anyof;
    int nesting;
    int64_t work;  // the patterns' compile steps so far: one bound for the schema's (regex_compile)
    size_t pattern_bytes;  // and their bytes
    int n_strings;         // the strings with an automaton
    char *why;
} Build;

static int failed(Build *b, char *why) {
    if (!b->why)
        b->why = why;
    else
        free(why);
    return -1;
}

static void *grow(void *p, int *cap, int n, size_t size) {
    if (n < *cap) return p;
    *cap = *cap ? 2 * *cap : 16;
    return xrealloc(p, (size_t)*cap * size);
}

static int node_new(Build *b, JsKind kind) {
    JsonSchema *s = b->s;
    if (s->n_nodes == JS_MAX_NODES) return failed(b, xprintf("the schema has over %d nodes", JS_MAX_NODES));
    s->nodes = grow(s->nodes, &b->cap_nodes, s->n_nodes, sizeof *s->nodes);
    s->nodes[s->n_nodes] = (JsNode){.kind = kind, .item = -1};
    return s->n_nodes++;
}

static void memo_add(Build *b, const cJSON *sch, int id) {
    b->memo = grow(b->memo, &b->cap_memo, b->n_memo, sizeof *b->memo);
    b->memo_id = xrealloc(b->memo_id, (size_t)b->cap_memo * sizeof *b->memo_id);
    b->memo[b->n_memo] = sch;
    b->memo_id[b->n_memo++] = id;
}

static int compile(Build *b, const cJSON *sch, const char *at);

// The value a "$ref" names: "#", or "#/a/b" (a JSON pointer into the schema, ~0 and ~1 escaped).
static const cJSON *resolve(Build *b, const char *ref, const char *at) {
    if (ref[0] != '#' || (ref[1] && ref[1] != '/')) {
        failed(b, xprintf("\"$ref\" \"%.100s\" at %s: only references into this schema (\"#/...\") are supported",
                          ref, at));
        return NULL;
    }
    const cJSON *v = b->root;
    for (const char *p = ref + 1; v && *p == '/';) {
        char name[256];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            char c = *p;
            if (c == '~' && (p[1] == '0' || p[1] == '1')) c = *++p == '0' ? '~' : '/';
            if (n + 1 < sizeof name) name[n++] = c;
        }
        name[n] = 0;
        v = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, atoi(name)) : cJSON_GetObjectItemCaseSensitive(v, name);
    }
    if (!v) failed(b, xprintf("\"$ref\" \"%.100s\" at %s names nothing in the schema", ref, at));
    return v;
}

static int is_type(const cJSON *v, const char *type) {
    if (!strcmp(type, "string")) return cJSON_IsString(v);
    if (!strcmp(type, "number")) return cJSON_IsNumber(v);
    if (!strcmp(type, "integer"))
        return cJSON_IsNumber(v) && fabs(v->valuedouble) < 0x1p53 && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(type, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(type, "null")) return cJSON_IsNull(v);
    if (!strcmp(type, "object")) return cJSON_IsObject(v);
    return cJSON_IsArray(v);
}

// Whether v is of the schema's "type" (one name or a list; none: any).
static int of_type(const cJSON *v, const cJSON *type) {
    if (cJSON_IsString(type)) return is_type(v, type->valuestring);
    for (const cJSON *t = type ? type->child : NULL; t; t = t->next)
        if (cJSON_IsString(t) && is_type(v, t->valuestring)) return 1;
    return !type;
}

// "enum" or "const": their values as JSON text (those of the schema's type).
static int compile_enum(Build *b, const cJSON *sch, const char *at) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(sch, "enum");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(sch, "const");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(sch, "type");
    if (e && c) return failed(b, xprintf("%s has both \"enum\" and \"const\"", at));
    if (e && !cJSON_IsArray(e)) return failed(b, xprintf("\"enum\" at %s is not a list", at));
    int id = node_new(b, JS_ENUM);
    if (id < 0) return -1;
    JsonSchema *s = b->s;
    s->nodes[id].first = s->n_lits;
    for (const cJSON *v = e ? e->child : c; v; v = e ? v->next : NULL) {
        if (!of_type(v, type)) continue;
        if (s->n_lits == JS_MAX_NODES)
            return failed(b, xprintf("the schema has over %d enum values", JS_MAX_NODES));
        s->lits = grow(s->lits, &b->cap_lits, s->n_lits, sizeof *s->lits);
        char *text = cJSON_PrintUnformatted(v);
        if (!text) die("out of memory printing an enum value");
        s->lits[s->n_lits++] = (JsLit){text, (int)strlen(text)};
        s->nodes[id].n++;
    }
    if (!s->nodes[id].n) return failed(b, xprintf("\"%s\" at %s allows no value", e ? "enum" : "const", at));
    return id;
}

// An anyOf node, its alternatives checked once all are compiled (check).
static int anyof_new(Build *b, const char *name, const char *at) {
    int id = node_new(b, JS_ANYOF);
    if (id < 0) return -1;
    b->anyof = grow(b->anyof, &b->cap_anyof, b->n_anyof, sizeof *b->anyof);
    b->anyof_at = xrealloc(b->anyof_at, (size_t)b->cap_anyof * sizeof *b->anyof_at);
    b->anyof[b->n_anyof] = id;
    b->anyof_at[b->n_anyof++] = xprintf("\"%s\" at %s", name, at);
    return id;
}

// The nodes of a list of schemas (anyOf, oneOf, or a type list), as alternatives of node id.
static int add_alts(Build *b, int id, const int *alt, int n) {
    JsonSchema *s = b->s;
    for (int i = 0; i < n; i++) {
        s->alts = grow(s->alts, &b->cap_alts, s->n_alts, sizeof *s->alts);
        s->alts[s->n_alts++] = alt[i];
    }
    s->nodes[id].first = s->n_alts - n;
    s->nodes[id].n = n;
    return id;
}

static int compile_anyof(Build *b, const cJSON *list, const char *name, const char *at) {
    int n = cJSON_GetArraySize(list);
    if (!cJSON_IsArray(list) || n == 0)
        return failed(b, xprintf("\"%s\" at %s is not a list of schemas", name, at));
    int id = anyof_new(b, name, at);
    if (id < 0) return -1;
    int *alt = xmalloc((size_t)n * sizeof *alt), i = 0;
    for (const cJSON *v = list->child; v; v = v->next, i++) {
        char *where = xprintf("%s/%s/%d", at, name, i);
        alt[i] = compile(b, v, where);
        free(where);
        if (alt[i] < 0) break;
    }
    if (i == n) add_alts(b, id, alt, n);
    free(alt);
    return i == n ? id : -1;
}

// Whether a member before v in object o has v's name (cJSON keeps both of a duplicate).
static int named_before(const cJSON *o, const cJSON *v) {
    for (const cJSON *w = o->child; w != v; w = w->next)
        if (!strcmp(w->string, v->string)) return 1;
    return 0;
}

static int compile_object(Build *b, const cJSON *sch, const char *at) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(sch, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(sch, "required");
    const cJSON *more = cJSON_GetObjectItemCaseSensitive(sch, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return failed(b, xprintf("\"properties\" at %s is not an object", at));
    if (req && !cJSON_IsArray(req)) return failed(b, xprintf("\"required\" at %s is not a list", at));
    if (more && !cJSON_IsBool(more) && !props)
        return failed(
            b, xprintf("\"additionalProperties\" as a schema at %s is not supported (list \"properties\")", at));
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (!cJSON_IsString(r) || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return failed(b, xprintf("\"required\" at %s names \"%.100s\", which \"properties\" does not list", at,
                                     cJSON_IsString(r) ? r->valuestring : "?"));
    int n = cJSON_GetArraySize(props);
    if (b->s->n_props + n > JS_MAX_NODES)
        return failed(b, xprintf("the schema has over %d properties", JS_MAX_NODES));
    int id = node_new(b, n || cJSON_IsFalse(more) ? JS_OBJECT : JS_OBJECT_ANY);  // {} with no member allowed
    if (id < 0 || !n) return id;
    JsProp *p = xcalloc((size_t)n, sizeof *p);
    int i = 0;
    for (const cJSON *v = props->child; v; v = v->next, i++) {
        if (named_before(props, v)) {
            failed(b, xprintf("\"properties\" at %s lists \"%.100s\" twice", at, v->string));
            break;
        }
        cJSON *name = cJSON_CreateString(v->string);
        p[i].key = name ? cJSON_PrintUnformatted(name) : NULL;
        cJSON_Delete(name);
        if (!p[i].key) die("out of memory printing a property name");
        p[i].len = (int)strlen(p[i].key);
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            p[i].required |= !strcmp(r->valuestring, v->string);
        char *where = xprintf("%s/properties/%s", at, v->string);
        p[i].node = compile(b, v, where);
        free(where);
        if (p[i].node < 0) break;
    }
    JsonSchema *s = b->s;
    for (int k = 0; k < n; k++) {  // the props array is only appended to when the properties are all compiled
        if (i == n) s->props = grow(s->props, &b->cap_props, s->n_props, sizeof *s->props);
        if (i == n)
            s->props[s->n_props++] = p[k];
        else
            free(p[k].key);
    }
    free(p);
    s->nodes[id].first = s->n_props - n;
    s->nodes[id].n = n;
    return i == n ? id : -1;
}

static int get_count(Build *b, const cJSON *sch, const char *name, int64_t dflt, int64_t *out, const char *at) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(sch, name);
    *out = dflt;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6 ||
        v->valuedouble != (int64_t)v->valuedouble)
        return failed(b, xprintf("\"%s\" at %s is not a whole number in [0, 1000000]", name, at));
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int compile_array(Build *b, const cJSON *sch, const char *at) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(sch, "items");
    int64_t lo, hi;
    if (get_count(b, sch, "minItems", 0, &lo, at) || get_count(b, sch, "maxItems", INT64_MAX, &hi, at)) return -1;
    if (lo > hi)
        return failed(b, xprintf("\"minItems\" %lld > \"maxItems\" %lld at %s", (long long)lo, (long long)hi, at));
    if (cJSON_IsArray(items))
        return failed(b, xprintf("\"items\" as a list (a tuple) at %s is not supported", at));
    int id = node_new(b, JS_ARRAY);
    if (id < 0) return -1;
    b->s->nodes[id].min_items = lo;
    b->s->nodes[id].max_items = hi;
    char *where = xprintf("%s/items", at);
    int item = items ? compile(b, items, where) : 0;
    free(where);
    b->s->nodes[id].item = item;
    return item < 0 ? -1 : id;
}

// A "pattern" (ECMA-262: found anywhere in the string) as a full match's (regex_dfa.h): each top-level
// alternative's unanchored ends take any characters ([\s\S]*), its anchors (^ first, $ last) are dropped. NULL
// (and *why, malloc'd) when its groups or classes do not close, which would change what the wrapping means.
static char *full_match(const char *p, char **why) {
    Buf out = {0};
    size_t n = strlen(p), start = 0;
    int depth = 0, in_class = 0;
    *why = NULL;
    for (size_t i = 0; i <= n && !*why; i++) {
        if (i < n && p[i] == '\\') {
            if (i + 1 == n) *why = xstrdup("it ends with a lone \\");
            i++;
            continue;
        }
        if (i < n && in_class) {
            in_class = p[i] != ']';
            continue;
        }
        if (i < n && p[i] == '[') {
            in_class = 1;
            i += i + 1 < n && p[i + 1] == '^';
            i += i + 1 < n && p[i + 1] == ']';  // a ']' first is one of the class
            continue;
        }
        depth += i < n && p[i] == '(';
        depth -= i < n && p[i] == ')';
        if (depth < 0 || (i == n && (depth || in_class)))
            *why = xstrdup(in_class ? "a character class [ is not closed" : "its groups ( ) do not pair");
        if (*why || (i < n && (p[i] != '|' || depth))) continue;
        const char *a = p + start;  // an alternative: [start, i)
        size_t len = i - start, slashes = 0;  // the backslashes before its last byte
        while (slashes + 2 <= len && a[len - 2 - slashes] == '\\') slashes++;
        int lo = len > 0 && a[0] == '^';
        int hi = len > (size_t)lo && a[len - 1] == '$' && slashes % 2 == 0;
        const char *any = "[\\s\\S]*";
        buf_printf(&out, "%s(?:%s(?:%.*s)%s)", start ? "|" : "", lo ? "" : any, (int)(len - lo - hi), a + lo,
                   hi ? "" : any);
        start = i + 1;
    }
    if (*why) buf_free(&out);
    return out.data;
}

// A JSON string's bytes as it is written (json_mask.c): most as they are, '"' '\\' and the control characters
// with a short escape as two (\u escapes are not written where there is a pattern), the other controls never.
static void string_costs(int64_t cost[256]) {
    for (int c = 0; c < 256; c++) cost[c] = c >= 0x20 ? 1 : INT64_MAX;
    cost['"'] = cost['\\'] = cost['\b'] = cost['\f'] = cost['\n'] = cost['\r'] = cost['\t'] = 2;
}

#define DATE                                                                                         \
    "\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|" \
    "02-(?:0[1-9]|1\\d|2[0-8]))"
#define TIME "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,6})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)"
#define LABEL "[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
#define HOST LABEL "(?:\\." LABEL "){0,2}"
#define DAYS "(?:\\d+Y(?:\\d+M)?(?:\\d+D)?|\\d+M(?:\\d+D)?|\\d+D)"
#define HOURS "T(?:\\d+H(?:\\d+M)?(?:\\d+S)?|\\d+M(?:\\d+S)?|\\d+S)"

// A "format" as a full match (regex_dfa.h): strings of it that every validator takes (a subset where the format
// is wider: no February 29, no leap second, a time zone always, at most 3 labels to a host name, IPv6 in its
// 8 groups, http(s) URIs of a host and up to 8 path segments of 32 characters), or NULL when it is not supported.
static const char *format_pattern(const char *name) {
    static const char *const formats[][2] = {
        {"date", DATE},
        {"time", TIME},
        {"date-time", DATE "T" TIME},
        {"duration", "P(?:" DAYS "(?:" HOURS ")?|" HOURS "|\\d+W)"},
        {"email", "[a-z0-9_%+-]+(?:\\.[a-z0-9_%+-]+)*@(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\\.)+[a-z]{2,24}"},
        {"hostname", HOST},
        {"ipv4", "(?:(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"},
        {"ipv6", "[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){7}"},
        {"uri", "https?://" HOST "(?:/[A-Za-z0-9._~-]{0,32}){0,8}"},
        {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
    };
    for (size_t i = 0; name && i < sizeof formats / sizeof formats[0]; i++)
        if (!strcmp(name, formats[i][0])) return formats[i][1];
    return NULL;
}

// Narrows *all (none yet: no states) to what src (compiled with flags) also matches fully. -1 (failed) when src
// does not compile or nothing is left.
static int narrow(Build *b, RegexDfa *all, const char *src, int flags, const char *name, const char *at) {
    int first = all->n == 0;
    RegexDfa one, both;
    char *why = regex_compile(src, strlen(src), flags, &b->work, first ? all : &one);
    if (why) {
        failed(b, xprintf("\"%s\" at %s (as the full match %.200s): %s", name, at, src, why));
    } else if (!first) {
        why = regex_intersect(all, &one, &b->work, &both);
        if (why) failed(b, xprintf("\"pattern\", \"format\" and the lengths at %s together: %s", at, why));
        regex_free(&one);
        regex_free(all);
        *all = both;
    }
    int rc = why ? -1 : 0;
    free(why);
    return rc;
}

// Whether every full match of d has lo to hi characters (its bytes at most, its least characters at least).
static int implied(const RegexDfa *d, int64_t lo, int64_t hi) {
    int64_t chars[256], most = regex_longest(d);
    for (int c = 0; c < 256; c++) chars[c] = c < 0x80 || c >= 0xC0;  // a character's first byte
    int64_t *least = regex_costs(d, chars);
    int ok = least[0] >= lo && (hi == INT64_MAX || (most >= 0 && most <= hi));
    free(least);
    return ok;
}

// A string, with "pattern", "format" or "minLength"/"maxLength" (characters), any of them: the automaton of what
// they all match, which its characters walk; lengths alone are its bounds (min_items, max_items).
static int compile_string(Build *b, const cJSON *sch, const char *at) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(sch, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(sch, "format");
    int lengths = cJSON_HasObjectItem(sch, "minLength") || cJSON_HasObjectItem(sch, "maxLength");
    int64_t lo, hi;
    if (get_count(b, sch, "minLength", 0, &lo, at) || get_count(b, sch, "maxLength", INT64_MAX, &hi, at))
        return -1;
    if (pat && !cJSON_IsString(pat)) return failed(b, xprintf("\"pattern\" at %s is not a string", at));
    if (fmt && !format_pattern(cJSON_GetStringValue(fmt)))
        return failed(b, xprintf("\"format\" %.100s at %s is not supported (date, time, date-time, duration, "
                                 "email, hostname, ipv4, ipv6, uri and uuid are)",
                                 cJSON_IsString(fmt) ? fmt->valuestring : "(not a string)", at));
    if (lo > hi)
        return failed(b, xprintf("\"minLength\" %lld > \"maxLength\" %lld at %s", (long long)lo, (long long)hi,
                                 at));
    int id = node_new(b, JS_STRING);
    if (id < 0) return -1;
    b->s->nodes[id].min_items = pat || fmt ? 0 : lo;  // lengths alone: json_mask.c counts the characters
    b->s->nodes[id].max_items = pat || fmt ? INT64_MAX : hi;
    if (!pat && !fmt) return id;
    b->pattern_bytes += pat ? strlen(pat->valuestring) : 0;
    if (++b->n_strings > JS_MAX_STRINGS || b->pattern_bytes > JS_PATTERN_BYTES)
        return failed(b, xprintf("the schema has over %d strings with a pattern or format, or over %d bytes of "
                                 "patterns (at %s)", JS_MAX_STRINGS, JS_PATTERN_BYTES, at));
    char *bad = NULL;
    char *whole = pat ? full_match(pat->valuestring, &bad) : NULL;
    if (bad) {
        failed(b, xprintf("\"pattern\" at %s: %s", at, bad));
        free(bad);
        return -1;
    }
    RegexDfa all = {0};  // what the pattern, the format and the lengths all match
    int rc = whole ? narrow(b, &all, whole, REGEX_ECMA, "pattern", at) : 0;
    free(whole);
    if (!rc && fmt) rc = narrow(b, &all, format_pattern(fmt->valuestring), REGEX_ECMA, "format", at);
    if (!rc && lengths && !implied(&all, lo, hi)) {  // beside the pattern or format: their product
        if (lo > REGEX_MAX_REPEAT || (hi != INT64_MAX && hi > REGEX_MAX_REPEAT)) {
            rc = failed(b, xprintf("\"minLength\"/\"maxLength\" over %d beside a pattern or format at %s, whose "
                                   "strings can be longer, is not supported", REGEX_MAX_REPEAT, at));
        } else {
            char *any = hi == INT64_MAX ? xprintf("[\\s\\S]{%lld,}", (long long)lo)
                                        : xprintf("[\\s\\S]{%lld,%lld}", (long long)lo, (long long)hi);
            rc = narrow(b, &all, any, 0, "minLength/maxLength", at);  // [\s\S]: any character (Python's reading)
            free(any);
        }
    }
    if (rc) {
        regex_free(&all);
        return -1;
    }
    JsNode *n = &b->s->nodes[id];
    n->re = xmalloc(sizeof *n->re);
    *n->re = all;
    int64_t cost[256];
    string_costs(cost);
    n->re_cost = regex_costs(n->re, cost);
    for (int s = 0; s < n->re->n; s++) n->re_cost[s] = n->re_cost[s] < JS_INF ? n->re_cost[s] : JS_INF;
    if (n->re_cost[0] >= JS_INF)
        return failed(b, xprintf("the string at %s can only be one with control characters (not supported)", at));
    return id;
}

#define INT_MOST 999999999999999LL  // an integer's 15 digits at most (as json_mask.c writes them)
#define FRAC_DIGITS 15              // and a bounded number's fraction's
#define FRAC_ONE 1000000000000000LL // 10^FRAC_DIGITS
static const char *const BOUNDS[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", NULL};

// Appends the alternatives matching the decimal strings lo..hi, both of n digits (leading zeros kept).
static void digits_between(Buf *out, const char *lo, const char *hi, int n) {
    _Static_assert(sizeof "999999999999999" <= 16, "digits_between's nines and zeros hold INT_MOST's digits");
    if (n == 0) return;
    if (lo[0] == hi[0]) {
        buf_append(out, lo, 1);
        digits_between(out, lo + 1, hi + 1, n - 1);
        return;
    }
    int lo_rest = 1, hi_rest = 1;  // whether lo's rest is all 0s, hi's all 9s
    for (int i = 1; i < n; i++) {
        lo_rest &= lo[i] == '0';
        hi_rest &= hi[i] == '9';
    }
    char first = (char)(lo[0] + !lo_rest), last = (char)(hi[0] - !hi_rest);  // whole runs of the rest between
    buf_append(out, "(?:", 3);
    if (!lo_rest) {
        char nines[16];
        memset(nines, '9', sizeof nines);
        buf_append(out, lo, 1);
        buf_append(out, "(?:", 3);
        digits_between(out, lo + 1, nines, n - 1);
        buf_append(out, ")|", 2);
    }
    if (first <= last) buf_printf(out, "[%c-%c]\\d{%d}|", first, last, n - 1);
    if (!hi_rest) {
        char zeros[16];
        memset(zeros, '0', sizeof zeros);
        buf_append(out, hi, 1);
        buf_append(out, "(?:", 3);
        digits_between(out, zeros, hi + 1, n - 1);
        buf_append(out, ")|", 2);
    }
    out->data[out->len - 1] = ')';  // for the last '|'
}

// Appends the alternatives matching the integers lo..hi (0 <= lo <= hi), as JSON writes them.
static void naturals(Buf *out, int64_t lo, int64_t hi) {
    for (int64_t from = lo, top = 9; from <= hi; top = top * 10 + 9) {  // top: the most of from's digit count
        if (from > top) continue;
        char a[24], z[24];
        int n = snprintf(a, sizeof a, "%lld", (long long)from);
        snprintf(z, sizeof z, "%lld", (long long)(hi < top ? hi : top));
        if (out->len) buf_append(out, "|", 1);
        buf_append(out, "(?:", 3);
        digits_between(out, a, z, n);
        buf_append(out, ")", 1);
        from = top + 1;
    }
}

// Appends the integers lo..hi (|both| <= INT_MOST) as JSON writes them, as one group.
static void integers_between(Buf *out, int64_t lo, int64_t hi) {
    Buf alt = {0}, neg = {0};
    if (lo < 0) naturals(&neg, hi < 0 ? -hi : 1, -lo);
    if (neg.len) buf_printf(&alt, "-(?:%s)", neg.data);
    if (lo <= 0 && hi >= 0) buf_printf(&alt, "%s0", alt.len ? "|" : "");
    if (hi > 0) {
        Buf pos = {0};
        naturals(&pos, lo > 1 ? lo : 1, hi);
        buf_printf(&alt, "%s%s", alt.len ? "|" : "", pos.data);
        buf_free(&pos);
    }
    buf_printf(out, "(?:%s)", alt.data);
    buf_free(&neg);
    buf_free(&alt);
}

// A number on the grid of FRAC_DIGITS fraction digits: sign, whole part and fraction (in 10^-FRAC_DIGITS).
typedef struct {
    int neg;
    int64_t whole, frac;
} Grid;

static int grid_cmp(Grid a, Grid b) {
    int sa = a.neg ? -1 : a.whole || a.frac, sb = b.neg ? -1 : b.whole || b.frac;
    if (sa != sb) return sa < sb ? -1 : 1;
    int mag = a.whole != b.whole ? (a.whole < b.whole ? -1 : 1) : a.frac != b.frac ? (a.frac < b.frac ? -1 : 1) : 0;
    return a.neg ? -mag : mag;
}

// g moved one step of the grid up (dir 1) or down (-1).
static Grid grid_step(Grid g, int dir) {
    if (!g.neg && !g.whole && !g.frac && dir < 0) return (Grid){1, 0, 1};
    int more = g.neg ? dir < 0 : dir > 0;  // whether the magnitude grows
    g.frac += more ? 1 : -1;
    if (g.frac == FRAC_ONE) g.whole++, g.frac = 0;
    if (g.frac < 0) g.whole--, g.frac = FRAC_ONE - 1;
    if (!g.whole && !g.frac) g.neg = 0;
    return g;
}

// The grid value next to x (|x| < 10^15) upward (up) or downward; *on: whether x is on the grid. x is exact: a
// long double holds the midpoint of two doubles, and the C library prints its decimals exactly.
static Grid grid_of(long double x, int up, int *on) {
    _Static_assert(LDBL_MANT_DIG > DBL_MANT_DIG, "a long double holds the midpoint of two doubles");
    char s[1200];  // 15 whole digits, the point and every fraction digit a long double of |x| < 10^15 has
    snprintf(s, sizeof s, "%.1100Lf", fabsl(x));
    char *point = strchr(s, '.');
    Grid g = {x < 0, 0, 0};
    for (const char *d = s; d < point; d++) g.whole = g.whole * 10 + (*d - '0');
    for (int i = 1; i <= FRAC_DIGITS; i++) g.frac = g.frac * 10 + (point[i] - '0');
    *on = strspn(point + 1 + FRAC_DIGITS, "0") == strlen(point + 1 + FRAC_DIGITS);
    if (!g.whole && !g.frac) g.neg = 0;
    if (!*on && up != (x < 0)) g = grid_step(g, up ? 1 : -1);  // truncated toward 0: the other way
    return g;
}

// The least grid value whose double (round to nearest, ties to even) is at least the double b, or the most whose
// double is at most b (!least): a validator's comparison of the number it parses, on the grid.
static Grid grid_bound(double b, int least) {
    double next = nextafter(b, least ? -INFINITY : INFINITY);  // the double whose values b's meet
    long double mid = ((long double)next + b) / 2;
    int on = 0;
    Grid g = grid_of(mid, least, &on);
    uint64_t bits;
    memcpy(&bits, &b, sizeof bits);
    if (on && bits & 1) g = grid_step(g, least ? 1 : -1);  // the tie goes to the even neighbour
    return g;
}

// The integers within lo..hi (both on the grid): lo's ceiling to hi's floor.
static void integers_within(Buf *out, Grid lo, Grid hi, char **why) {
    int64_t a = lo.neg ? -lo.whole : lo.whole + (lo.frac != 0);
    int64_t z = hi.neg ? -hi.whole - (hi.frac != 0) : hi.whole;
    if (a > z)
        *why = xstrdup("no integer of 15 digits at most is within its bounds");
    else
        integers_between(out, a, z);
}

// Appends '.' and the fraction digits (1 to FRAC_DIGITS) whose value, zero-padded, is within a..b (in
// 10^-FRAC_DIGITS); optional when a is 0 (no fraction: the value 0).
static void fractions(Buf *out, int64_t a, int64_t b) {
    buf_append(out, "(?:\\.(?:", 8);
    size_t mark = out->len;
    int64_t rest = FRAC_ONE;  // 10^(FRAC_DIGITS - k): what k digits leave
    for (int k = 1; k <= FRAC_DIGITS; k++) {
        rest /= 10;
        int64_t lo = a / rest + (a % rest != 0), hi = b / rest;  // the k digits d with a <= d * rest <= b
        if (lo > hi || lo >= FRAC_ONE / rest) continue;
        char l[24], h[24];
        snprintf(l, sizeof l, "%0*lld", k, (long long)lo);
        snprintf(h, sizeof h, "%0*lld", k, (long long)hi);
        if (out->len > mark) buf_append(out, "|", 1);
        digits_between(out, l, h, k);
    }
    buf_printf(out, "))%s", a ? "" : "?");
}

// Appends the magnitudes a..b (a <= b; signs ignored) as JSON writes a number: integer part, fraction.
static void magnitudes(Buf *out, Grid a, Grid b) {
    buf_printf(out, "(?:%lld", (long long)a.whole);
    if (a.whole == b.whole) {
        fractions(out, a.frac, b.frac);
    } else {
        fractions(out, a.frac, FRAC_ONE - 1);
        if (a.whole + 1 < b.whole) {
            buf_append(out, "|", 1);
            integers_between(out, a.whole + 1, b.whole - 1);
            fractions(out, 0, FRAC_ONE - 1);
        }
        buf_printf(out, "|%lld", (long long)b.whole);
        fractions(out, 0, b.frac);
    }
    buf_append(out, ")", 1);
}

// A number's or integer's "minimum"/"maximum"/"exclusiveMinimum"/"exclusiveMaximum" as the full match of the
// values within, as a validator compares the double it parses (an integer: 15 digits at most; a number: those,
// FRAC_DIGITS fraction digits, no exponent); or NULL (and *why) when none is.
static char *range_pattern(const cJSON *sch, int integer, char **why) {
    const Grid most = {0, INT_MOST, FRAC_ONE - 1}, least = {1, INT_MOST, FRAC_ONE - 1};
    Grid lo = least, hi = most;  // the loosest
    *why = NULL;
    for (int k = 0; BOUNDS[k]; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(sch, BOUNDS[k]);
        if (!v) continue;
        if (!cJSON_IsNumber(v)) {
            *why = xprintf("\"%s\" must be a number (draft 4's boolean form is not supported)", BOUNDS[k]);
            return NULL;
        }
        int low = k < 2;
        double x = v->valuedouble == 0 ? 0 : v->valuedouble;  // (no -0)
        if (k % 2) x = nextafter(x, low ? INFINITY : -INFINITY);  // exclusive: the next double within
        Grid g;
        if (fabs(x) >= 1e15)  // past 15 digits: none within, or the loosest
            g = (low ? x > 0 : x < 0) ? (Grid){!low, INT_MOST + 1, 0} : low ? least : most;
        else
            g = grid_bound(x, low);
        if (low && grid_cmp(g, lo) > 0) lo = g;
        if (!low && grid_cmp(g, hi) < 0) hi = g;
    }
    Buf out = {0};
    if (integer) {
        integers_within(&out, lo, hi, why);
    } else if (grid_cmp(lo, hi) > 0) {
        *why = xstrdup("no number of 15 digits at most (and 15 fraction digits) is within its bounds");
    } else {
        if (!hi.neg) magnitudes(&out, lo.neg ? (Grid){0, 0, 0} : lo, hi);
        if (lo.neg) {  // the negative ones: '-' and their magnitudes
            buf_printf(&out, "%s-", out.len ? "|" : "");
            magnitudes(&out, hi.neg ? hi : (Grid){0, 0, 0}, lo);
        }
    }
    if (!*why) return out.data;
    buf_free(&out);
    return NULL;
}

// An integer or number with bounds (range_pattern): the automaton of the values between, which its bytes walk.
static int compile_numeric(Build *b, const cJSON *sch, JsKind kind, const char *at) {
    int id = node_new(b, kind), bounded = 0;
    for (int k = 0; BOUNDS[k]; k++) bounded |= cJSON_HasObjectItem(sch, BOUNDS[k]);
    if (id < 0 || !bounded) return id;
    char *why = NULL, *src = range_pattern(sch, kind == JS_INTEGER, &why);
    if (why) {
        failed(b, xprintf("%s (at %s)", why, at));
        free(why);
        return -1;
    }
    JsNode *n = &b->s->nodes[id];
    n->re = xmalloc(sizeof *n->re);
    why = regex_compile(src, strlen(src), 0, &b->work, n->re);
    free(src);
    if (why) {
        free(n->re);
        n->re = NULL;
        failed(b, xprintf("the bounds at %s: %s", at, why));
        free(why);
        return -1;
    }
    int64_t ones[256];
    for (int c = 0; c < 256; c++) ones[c] = 1;
    n->re_cost = regex_costs(n->re, ones);  // every state reaches a match (regex_compile cuts the others)
    return id;
}

static int compile_typed(Build *b, const cJSON *sch, const char *type, const char *at) {
    static const char *const names[] = {"boolean", "null", NULL};
    static const JsKind kinds[] = {JS_BOOLEAN, JS_NULL};
    if (cJSON_HasObjectItem(sch, "format") && strcmp(type, "string") && strcmp(type, "null"))
        return failed(b, xprintf("\"format\" at %s is supported on strings only (not on \"%.100s\")", at, type));
    if (!strcmp(type, "object")) return compile_object(b, sch, at);
    if (!strcmp(type, "array")) return compile_array(b, sch, at);
    if (!strcmp(type, "string")) return compile_string(b, sch, at);
    if (!strcmp(type, "integer")) return compile_numeric(b, sch, JS_INTEGER, at);
    if (!strcmp(type, "number")) return compile_numeric(b, sch, JS_NUMBER, at);
    for (int i = 0; names[i]; i++)
        if (!strcmp(type, names[i])) return node_new(b, kinds[i]);
    return failed(b, xprintf("\"type\" \"%.100s\" at %s is not a JSON Schema type", type, at));
}

// "type": one name, or a list of them (an anyOf of each).
static int compile_type(Build *b, const cJSON *sch, const cJSON *type, const char *at) {
    if (cJSON_IsString(type)) return compile_typed(b, sch, type->valuestring, at);
    int n = cJSON_GetArraySize(type), i = 0;
    if (!cJSON_IsArray(type) || n == 0) return failed(b, xprintf("\"type\" at %s is not a name or a list", at));
    int id = anyof_new(b, "type", at);
    int *alt = xmalloc((size_t)n * sizeof *alt);
    for (const cJSON *t = type->child; id >= 0 && t; t = t->next, i++) {
        alt[i] = cJSON_IsString(t) ? compile_typed(b, sch, t->valuestring, at)
                                   : failed(b, xprintf("\"type\" at %s lists a non-name", at));
        if (alt[i] < 0) break;
    }
    if (id >= 0 && i == n) add_alts(b, id, alt, n);
    free(alt);
    return id >= 0 && i == n ? id : -1;
}

static int compile(Build *b, const cJSON *sch, const char *at) {
    static const char *const notes[] = {"title",    "description", "default", "examples",    "$schema",
                                        "$id",      "$comment",    "$defs",   "definitions", "deprecated",
                                        "readOnly", "writeOnly",   NULL};
    static const char *const known[] = {"type",  "properties", "required",  "additionalProperties",
                                        "items", "minItems",   "maxItems",  "enum",
                                        "const", "anyOf",      "oneOf",     "$ref",
                                        "allOf", "pattern",    "minLength", "maxLength",
                                        "format", "minimum",    "maximum",   "exclusiveMinimum",
                                        "exclusiveMaximum", NULL};
    if (cJSON_IsTrue(sch)) return 0;
    if (!cJSON_IsObject(sch)) return failed(b, xprintf("the schema at %s is not an object (or true)", at));
    for (int i = 0; i < b->n_memo; i++)
        if (b->memo[i] == sch) return b->memo_id[i];
    for (const cJSON *k = sch->child; k; k = k->next)
        if (!str_listed(k->string, notes) && !str_listed(k->string, known))
            return failed(b, xprintf("keyword \"%.100s\" at %s is not supported", k->string, at));
    if (b->nesting == JS_MAX_NESTING)
        return failed(b, xprintf("the schema nests over %d deep at %s", JS_MAX_NESTING, at));
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(sch, "$ref");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(sch, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(sch, "oneOf");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(sch, "allOf");  // of one schema (as Pydantic v1 wraps $ref)
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(sch, "type");
    static const char *const of_object[] = {"properties", "required", "additionalProperties", NULL};
    static const char *const of_array[] = {"items", "minItems", "maxItems", NULL};
    static const char *const of_string[] = {"pattern", "minLength", "maxLength", "format", NULL};
    int lits = cJSON_HasObjectItem(sch, "enum") || cJSON_HasObjectItem(sch, "const");
    int shapes = !!ref + !!any + !!one + !!all + lits, known_n = 0, objects = 0, arrays = 0, strings = 0, ints = 0;
    for (const cJSON *k = sch->child; k; k = k->next) {
        known_n += str_listed(k->string, known);
        objects += str_listed(k->string, of_object);
        arrays += str_listed(k->string, of_array);
        strings += str_listed(k->string, of_string);
        ints += str_listed(k->string, BOUNDS);
    }
    if (shapes > 1 || ((ref || any || one || all) && known_n > 1) || (lits && known_n > 1 + !!type))
        return failed(b, xprintf("%s: \"$ref\", \"anyOf\", \"oneOf\" and \"allOf\" must stand alone (with "
                                 "annotations), and \"enum\"/\"const\" with \"type\" at most",
                                 at));
    if (all && (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1))
        return failed(b, xprintf("\"allOf\" at %s: only a list of one schema is supported", at));
    if (!type && !shapes && !!objects + !!arrays + !!strings + !!ints > 1)
        return failed(b, xprintf("%s has keywords of more than one of objects, arrays, strings and numbers but no "
                                 "\"type\"", at));
    b->nesting++;
    int id;
    if (ref || all) {
        id = node_new(b, JS_REF);
        if (id >= 0) memo_add(b, sch, id);
        const cJSON *to = NULL;
        if (id >= 0 && all) to = cJSON_GetArrayItem(all, 0);
        else if (id >= 0 && cJSON_IsString(ref)) to = resolve(b, ref->valuestring, at);
        else if (id >= 0) failed(b, xprintf("\"$ref\" at %s is not a string", at));
        char *where = all ? xprintf("%s/allOf/0", at) : xstrdup(cJSON_IsString(ref) ? ref->valuestring : at);
        int item = to ? compile(b, to, where) : -1;
        free(where);
        if (item >= 0) b->s->nodes[id].item = item;
        id = item < 0 ? -1 : id;
    } else if (any || one) {
        id = compile_anyof(b, any ? any : one, any ? "anyOf" : "oneOf", at);
    } else if (lits) {
        id = compile_enum(b, sch, at);
    } else if (type) {
        id = compile_type(b, sch, type, at);
    } else if (objects) {  // no type: the keywords say which (an object or array only, which they then hold)
        id = compile_object(b, sch, at);
    } else if (arrays) {
        id = compile_array(b, sch, at);
    } else if (strings) {
        id = compile_string(b, sch, at);
    } else if (ints) {  // bounds alone: an integer within them (a number of them all)
        id = compile_numeric(b, sch, JS_INTEGER, at);
    } else {
        id = 0;
    }
    b->nesting--;
    if (id >= 0 && !ref && !all) memo_add(b, sch, id);
    return id;
}

// The fewest bytes of a value of node n with room for r more containers, from the figures so far.
static int64_t node_cost(const JsonSchema *s, const JsNode *n, int r) {
    int64_t c = JS_INF;
    switch (n->kind) {
    case JS_ANY: return 1;
    case JS_NUMBER:
    case JS_INTEGER: return n->re ? n->re_cost[0] : 1;
    case JS_STRING: return js_add(2, n->re ? n->re_cost[0] : n->min_items);
    case JS_BOOLEAN:
    case JS_NULL: return 4;
    case JS_OBJECT_ANY: return r ? 2 : JS_INF;
    case JS_OBJECT:
        if (!r) return JS_INF;
        c = n->n ? s->props[n->first].rest[r - 1] : 0;
        return js_add(1, c ? c : 1);  // '{' the required members (no comma before the first) '}'
    case JS_ARRAY:
        if (!r) return JS_INF;
        if (n->min_items == 0) return 2;
        return js_add(1, js_times(n->min_items, js_add(1, s->nodes[n->item].cost[r - 1])));
    case JS_ENUM:
        for (int i = 0; i < n->n; i++) c = s->lits[n->first + i].len < c ? s->lits[n->first + i].len : c;
        return c;
    case JS_ANYOF:
        for (int i = 0; i < n->n; i++) {
            int64_t a = s->nodes[s->alts[n->first + i]].cost[r];
            c = a < c ? a : c;
        }
        return c;
    case JS_REF: return s->nodes[n->item].cost[r];
    }
    return c;
}

// Object n's properties' rests with room r for their values.
static void set_rests(JsonSchema *s, const JsNode *n, int r) {
    int64_t rest = 0;
    for (int k = n->n - 1; k >= 0; k--) {
        JsProp *p = &s->props[n->first + k];
        if (p->required) rest = js_add(rest, js_add(2 + p->len, s->nodes[p->node].cost[r]));
        p->rest[r] = rest;
    }
}

// Every node's fewest bytes with each room, the rooms in turn (a container's members have one less): a fixed
// point within a room, where $refs may recur.
static void set_costs(JsonSchema *s) {
    for (int r = 0; r <= JS_MAX_DEPTH; r++) {
        for (int i = 0; i < s->n_nodes; i++) s->nodes[i].cost[r] = JS_INF;
        if (r > 0)
            for (int i = 0; i < s->n_nodes; i++)
                if (s->nodes[i].kind == JS_OBJECT) set_rests(s, &s->nodes[i], r - 1);
        for (int round = 0, changed = 1; changed && round <= s->n_nodes + 1; round++) {
            changed = 0;
            for (int i = s->n_nodes - 1; i >= 0; i--) {  // children (mostly later ids) first
                int64_t c = node_cost(s, &s->nodes[i], r);
                changed |= c != s->nodes[i].cost[r];
                s->nodes[i].cost[r] = c;
            }
        }
    }
    for (int i = 0; i < s->n_nodes; i++)
        if (s->nodes[i].kind == JS_OBJECT) set_rests(s, &s->nodes[i], JS_MAX_DEPTH);
}

int json_schema_deref(const JsonSchema *s, int id) {
    for (int i = 0; s->nodes[id].kind == JS_REF && i <= s->n_nodes; i++) id = s->nodes[id].item;
    return id;
}

static void set_start(JsNode *n, const char *bytes) {
    for (; *bytes; bytes++) n->starts[(unsigned char)*bytes >> 3] |= (uint8_t)(1u << (*bytes & 7));
}

// Every node's first bytes: a fixed point, as anyOf and $ref take their alternatives'.
static void set_starts(JsonSchema *s) {
    for (int i = 0; i < s->n_nodes; i++) {
        JsNode *n = &s->nodes[i];
        switch (n->kind) {
        case JS_ANY: set_start(n, "\"{[-0123456789tfn"); break;
        case JS_OBJECT_ANY:
        case JS_OBJECT: set_start(n, "{"); break;
        case JS_ARRAY: set_start(n, "["); break;
        case JS_STRING: set_start(n, "\""); break;
        case JS_NUMBER:
        case JS_INTEGER:
            for (const char *c = "-0123456789"; *c; c++)  // those its bounds' automaton takes
                if (!n->re || regex_walk(n->re, 0, c, 1) >= 0) set_start(n, (char[]){*c, 0});
            break;
        case JS_BOOLEAN: set_start(n, "tf"); break;
        case JS_NULL: set_start(n, "n"); break;
        case JS_ENUM:
            for (int k = 0; k < n->n; k++) {
                char first[2] = {s->lits[n->first + k].text[0], 0};
                set_start(n, first);
            }
            break;
        case JS_ANYOF:
        case JS_REF: break;
        }
    }
    for (int round = 0, changed = 1; changed && round <= s->n_nodes + 1; round++) {
        changed = 0;
        for (int i = s->n_nodes - 1; i >= 0; i--) {  // alternatives (mostly later ids) first
            JsNode *n = &s->nodes[i];
            int k = n->kind == JS_ANYOF ? n->n : n->kind == JS_REF;
            for (int a = 0; a < k; a++) {
                const JsNode *from = &s->nodes[n->kind == JS_REF ? n->item : s->alts[n->first + a]];
                for (int b = 0; b < 32; b++) {
                    changed |= (from->starts[b] & ~n->starts[b]) != 0;
                    n->starts[b] |= from->starts[b];
                }
            }
        }
    }
}

// Whether an anyOf or $ref reaches itself through anyOfs and $refs alone (no container between: the automaton
// would choose among the same alternatives forever). state: 0 unseen, 1 on the path, 2 done.
static int cycles(const JsonSchema *s, int id, uint8_t *state) {
    const JsNode *n = &s->nodes[id];
    if (state[id]) return state[id] == 1;
    state[id] = 1;
    int k = n->kind == JS_ANYOF ? n->n : n->kind == JS_REF;
    for (int a = 0; a < k; a++)
        if (cycles(s, n->kind == JS_REF ? n->item : s->alts[n->first + a], state)) return 1;
    state[id] = 2;
    return 0;
}

// What the automaton cannot follow: anyOfs and $refs that name themselves, an anyOf whose alternatives could
// start alike, a root that is not an object, a schema no finite value satisfies.
static int check(Build *b) {
    JsonSchema *s = b->s;
    uint8_t *state = xcalloc((size_t)s->n_nodes, 1);
    int cyclic = 0;
    for (int i = 0; i < s->n_nodes && !cyclic; i++) cyclic = cycles(s, i, state);
    free(state);
    if (cyclic)
        return failed(b, xprintf("an \"anyOf\" or \"$ref\" of the schema names itself with no object or "
                                 "array between"));
    set_starts(s);
    for (int i = 0; i < b->n_anyof; i++) {
        const JsNode *n = &s->nodes[b->anyof[i]];
        for (int c = 1; c < 256; c++) {
            int k = 0;
            for (int a = 0; a < n->n; a++) k += json_schema_starts(s, s->alts[n->first + a], (unsigned char)c);
            if (k > 1)
                return failed(b, xprintf("%s: alternatives that can both start with '%c' are not supported (each "
                                         "must start differently: an object, a string, a number, null, ...)",
                                         b->anyof_at[i], c));
        }
    }
    JsKind root = s->nodes[json_schema_deref(s, s->root)].kind;
    if (root != JS_OBJECT && root != JS_OBJECT_ANY)
        return failed(b, xprintf("the schema's root must be an object (\"type\": \"object\")"));
    set_costs(s);
    if (json_schema_least(s) >= JS_INF)
        return failed(b, xprintf("no JSON value of a sane size, nested at most %d deep, satisfies the schema (a "
                                 "required property recurs, or minItems multiply)",
                                 JS_MAX_DEPTH));
    return 0;
}

JsonSchema *json_schema_compile(const cJSON *schema, char **why) {
    Build b = {.root = schema, .s = xcalloc(1, sizeof *b.s)};
    node_new(&b, JS_ANY);
    b.s->root = compile(&b, schema, "#");
    if (b.s->root >= 0) check(&b);
    free(b.memo);
    free(b.memo_id);
    for (int i = 0; i < b.n_anyof; i++) free(b.anyof_at[i]);
    free(b.anyof);
    free(b.anyof_at);
    *why = b.why;
    if (!b.why) return b.s;
    json_schema_free(b.s);
    return NULL;
}

void json_schema_free(JsonSchema *s) {
    if (!s) return;
    for (int i = 0; i < s->n_props; i++) free(s->props[i].key);
    for (int i = 0; i < s->n_lits; i++) free(s->lits[i].text);
    for (int i = 0; i < s->n_nodes; i++) {
        if (s->nodes[i].re) regex_free(s->nodes[i].re);
        free(s->nodes[i].re);
        free(s->nodes[i].re_cost);
    }
    free(s->nodes);
    free(s->props);
    free(s->lits);
    free(s->alts);
    free(s);
}

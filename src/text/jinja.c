// The Jinja engine of chat templates: a lexer that applies jinja2's whitespace rules, a recursive-descent
// parser into a tree (kept with the template), and a tree walker over values in a per-render arena.
// Errors longjmp to jinja_parse / jinja_render, which free the arena: no value outlives a render.
#define _GNU_SOURCE  // memmem
#include "text/jinja.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "base/json.h"
#include "text/utf8.h"

// The sandbox's bounds: a render that passes one is an error naming the template. Steps count statements,
// expressions, list items made, every 64 bytes of string made or searched, and every byte of a string read
// character by character (case mappings, str.isdigit, repr, tojson): a render's work is linear in them.
#ifdef GRPO_FUZZ
#define MAX_STEPS 2000000L  // the fuzz build's (ASan) renders stay well under libFuzzer's timeout
#else
#define MAX_STEPS 20000000L
#endif
#define MAX_NEST 128                   // nesting of blocks, elif chains and parentheses in the source
#define MAX_DEPTH 256                  // depth of the parsed tree (a chain a+b+c... is as deep as it is long)
#define MAX_RUN_DEPTH 1024             // nested evaluations at run time (macros, values printed or compared)
#define MAX_CALLS 64                   // nested macro calls
#define MAX_RANGE 100000               // range()'s length (jinja2's sandbox has the same)
#define MAX_OUTPUT ((size_t)64 << 20)  // bytes of a rendering or of any one string
#define MAX_MEMORY ((size_t)256 << 20)  // a render's values and a template's tree

// ---------------------------------------------------------------- values

typedef struct {
    const char *s;
    size_t n;
} Str;

typedef enum {
    T_UNDEF, T_NONE, T_BOOL, T_INT, T_FLOAT, T_STR, T_LIST, T_DICT, T_NS, T_MACRO, T_LOOP, T_FUNC
} Type;

typedef struct List List;
typedef struct Dict Dict;
typedef struct Macro Macro;
typedef struct Loop Loop;
typedef struct Func Func;

typedef struct {
    Type t;
    union {
        int b;
        int64_t i;
        double f;
        Str s;  // T_STR; T_UNDEF: the missing name
        List *l;
        Dict *d;  // T_DICT, T_NS
        Macro *m;
        Loop *lp;
        Func *fn;
    };
    const char *owner;  // T_UNDEF: the type whose attribute was missing, NULL for a variable
} Value;

struct List {
    Value *v;
    size_t n, cap;
    int tuple;
};

struct Dict {
    Value *k, *v;
    size_t n, cap;
};

typedef struct Node Node;
typedef struct Frame Frame;

struct Macro {
    const Node *def;  // S_MACRO, or the S_CALLBLOCK whose body is `caller`
    Frame *closure;
};

struct Loop {
    const List *items;
    size_t i;
};

enum { F_RANGE, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME, F_METHOD, F_CYCLE };

struct Func {
    int id;
    Value self;  // F_METHOD, F_CYCLE
    Str name;
};

struct Frame {
    Frame *parent;
    Str *names;
    Value *vals;
    size_t n, cap;
};

// ---------------------------------------------------------------- tree

enum {
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK, S_FILTERBLOCK, S_BREAK, S_CONTINUE,
    S_WITH, S_BLOCK,
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS, E_NOT, E_AND, E_OR, E_BIN,
    E_COND, E_LIST, E_TUPLE, E_DICT, E_KW, E_HOLE,
};

typedef struct {
    Node **v;
    int n, cap;
} Nodes;

// One statement or expression. a, b, c: operands (E_SLICE: start, stop, step; E_COND: then, test, else);
// args: positional arguments, elements, targets or macro parameters (an E_KW with a default);
// kw: keyword arguments (E_KW: s = name, a = value); body / orelse: a block's statements.
struct Node {
    int k, op, line;
    Str s;
    Value lit;
    Node *a, *b, *c;
    Nodes args, kw, body, orelse;
};

struct JinjaTemplate {
    void *chunks;  // the tree's arena
    Nodes body;
    char *name;
};

// ---------------------------------------------------------------- the engine's state

typedef struct Chunk {
    struct Chunk *next;
    size_t used, cap;
    max_align_t data[];
} Chunk;

typedef struct {
    Chunk *chunks;
    size_t bytes;
    jmp_buf fail;
    char *err;
    const char *name;
    int line;
    // rendering
    Buf out;
    long steps;
    int calls;
    int depth;    // nested evaluations now (MAX_RUN_DEPTH)
    char *pending;  // a malloc'd buffer to free if the render fails before it is
    int ctl;      // CTL_BREAK or CTL_CONTINUE on its way to the loop
    Value hole;   // a filter block's text, the input of its filters
    uint32_t nul;
    Frame *frame;
} J;

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

static GRPO_NORETURN void fail_msg(J *j, char *msg) {
    j->err = msg;
    longjmp(j->fail, 1);
}

static GRPO_NORETURN GRPO_PRINTF(2, 3) void fail(J *j, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *msg = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(msg, (size_t)n + 1, fmt, ap);
    va_end(ap);
    char *full = xprintf("%s line %d: %s", j->name, j->line, msg);
    free(msg);
    fail_msg(j, full);
}

static void *alloc(J *j, size_t n) {
    n = (n + 15) & ~(size_t)15;
    Chunk *c = j->chunks;
    if (c && c->cap - c->used >= n) {
        void *p = (char *)c->data + c->used;
        c->used += n;
        return p;
    }
    size_t cap = n > (16 << 10) ? n : (64 << 10);
    if (j->bytes + cap > MAX_MEMORY) fail(j, "the template needs more than %zu MiB", MAX_MEMORY >> 20);
    Chunk *fresh = malloc(sizeof *fresh + cap);
    if (!fresh) fail(j, "out of memory");
    fresh->cap = cap;
    fresh->used = n;
    j->bytes += cap;
    if (c && n > (16 << 10)) {  // a big block of its own: the current chunk stays the one to fill
        fresh->next = c->next;
        c->next = fresh;
    } else {
        fresh->next = c;
        j->chunks = fresh;
    }
    return fresh->data;
}

static void chunks_free(Chunk *c) {
    while (c) {
        Chunk *next = c->next;
        free(c);
        c = next;
    }
}

static void *grow(J *j, void *p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return p;
    size_t cap2 = *cap ? *cap * 2 : 4;
    while (cap2 < need) cap2 *= 2;
    void *q = alloc(j, cap2 * size);
    if (*cap && p) memcpy(q, p, *cap * size);
    *cap = cap2;
    return q;
}

static void step(J *j) {
    if (++j->steps > MAX_STEPS)
        fail(j, "the template runs more than %ld steps (a loop without end?)", MAX_STEPS);
}

// ---------------------------------------------------------------- strings

static Str S(const char *s) { return (Str){s, strlen(s)}; }

static int str_eq(Str a, const char *b) { return a.n == strlen(b) && !memcmp(a.s, b, a.n); }

static int str_same(Str a, Str b) { return a.n == b.n && !memcmp(a.s, b.s, a.n); }

// A growable string in the arena.
typedef struct {
    char *s;
    size_t n, cap;
} SB;

static void sb_put(J *j, SB *b, const char *s, size_t n) {
    if (b->n + n > MAX_OUTPUT) fail(j, "a string of the template grows past %zu MiB", MAX_OUTPUT >> 20);
    j->steps += (long)(((b->n + n) >> 6) - (b->n >> 6));  // a step each 64 bytes, however they arrive
    b->s = grow(j, b->s, &b->cap, b->n + n + 1, 1);
    memcpy(b->s + b->n, s, n);
    b->n += n;
}

static void sb_puts(J *j, SB *b, const char *s) { sb_put(j, b, s, strlen(s)); }

static Str sb_str(SB *b) { return (Str){b->s ? b->s : "", b->n}; }

static Str str_copy(J *j, const char *s, size_t n) {
    char *p = alloc(j, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return (Str){p, n};
}

// The code point at s[*i] (the source and JSON strings are valid UTF-8), advancing *i.
static int32_t cp_next(Str s, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k =
        utf8proc_iterate((const utf8proc_uint8_t *)s.s + *i, (utf8proc_ssize_t)(s.n - *i), &cp);
    if (k <= 0) {  // not UTF-8 (a NUL byte included): one byte as itself
        cp = (unsigned char)s.s[*i];
        k = 1;
    }
    *i += (size_t)k;
    return cp;
}

static size_t cp_count(Str s) {
    size_t n = 0;
    for (size_t i = 0; i < s.n; i++) n += ((unsigned char)s.s[i] & 0xC0) != 0x80;
    return n;
}

// Byte offsets of each code point of s, and s.n at the end (n + 1 entries).
static size_t *cp_offsets(J *j, Str s, size_t *n) {
    *n = cp_count(s);
    size_t *off = alloc(j, (*n + 1) * sizeof *off);
    size_t k = 0;
    for (size_t i = 0; i < s.n; i++)
        if (((unsigned char)s.s[i] & 0xC0) != 0x80) off[k++] = i;
    off[k] = s.n;
    return off;
}

static void sb_cp(J *j, SB *b, int32_t cp) {
    utf8proc_uint8_t u[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, u);
    sb_put(j, b, (const char *)u, (size_t)k);
}

// Python's str.isspace() for one code point.
static int py_space(int32_t c) {
    return (c >= 9 && c <= 13) || (c >= 28 && c <= 32) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

static int in_chars(J *j, int32_t c, const Str *chars) {
    if (!chars) return py_space(c);
    j->steps += (long)(chars->n >> 4);
    step(j);
    for (size_t i = 0; i < chars->n;)
        if (cp_next(*chars, &i) == c) return 1;
    return 0;
}

// str.strip / lstrip / rstrip: which: 1 left, 2 right, 3 both; chars NULL for whitespace.
static Str str_strip(J *j, Str s, int which, const Str *chars) {
    j->steps += (long)(s.n >> 6);
    size_t a = 0, b = s.n;
    while ((which & 1) && a < b) {
        size_t i = a;
        if (!in_chars(j, cp_next(s, &i), chars)) break;
        a = i;
    }
    while ((which & 2) && b > a) {
        size_t i = b - 1;
        while (i > a && ((unsigned char)s.s[i] & 0xC0) == 0x80) i--;
        size_t k = i;
        if (!in_chars(j, cp_next(s, &k), chars)) break;
        b = i;
    }
    return (Str){s.s + a, b - a};
}

// The last occurrence of sub in s[0..end) (NULL: none); its comparisons are steps.
static const char *find_last(J *j, Str s, Str sub, size_t end) {
    if (!sub.n) return s.s + end;
    if (sub.n > end) return NULL;
    for (size_t i = end - sub.n + 1; i-- > 0;) {
        if (((end - i) & 63) == 0) step(j);
        if (s.s[i] != sub.s[0]) continue;
        j->steps += (long)(sub.n >> 6);
        step(j);
        if (!memcmp(s.s + i, sub.s, sub.n)) return s.s + i;
    }
    return NULL;
}

static const char *find(Str s, Str sub, size_t from) {
    if (from > s.n) return NULL;
    if (!sub.n) return s.s + from;
    return memmem(s.s + from, s.n - from, sub.s, sub.n);
}

// ---------------------------------------------------------------- making values

static Value V(Type t) { return (Value){.t = t}; }

static Value vbool(int b) { return (Value){.t = T_BOOL, .b = !!b}; }

static Value vint(int64_t i) { return (Value){.t = T_INT, .i = i}; }

static Value vfloat(double f) { return (Value){.t = T_FLOAT, .f = f}; }

static Value vstr(Str s) { return (Value){.t = T_STR, .s = s}; }

static Value vundef(Str name, const char *owner) { return (Value){.t = T_UNDEF, .s = name, .owner = owner}; }

static Value vlist(J *j, size_t cap) {
    List *l = alloc(j, sizeof *l);
    memset(l, 0, sizeof *l);
    l->v = grow(j, NULL, &l->cap, cap, sizeof *l->v);
    return (Value){.t = T_LIST, .l = l};
}

static void list_push(J *j, List *l, Value v) {
    step(j);
    l->v = grow(j, l->v, &l->cap, l->n + 1, sizeof *l->v);
    l->v[l->n++] = v;
}

static Value vdict(J *j) {
    Dict *d = alloc(j, sizeof *d);
    memset(d, 0, sizeof *d);
    return (Value){.t = T_DICT, .d = d};
}

static int veq(J *j, const Value *a, const Value *b);

// The value of key k (the last of duplicates), NULL when absent; a linear scan, charged as steps.
static Value *dict_find(J *j, const Dict *d, const Value *k) {
    j->steps += (long)(d->n >> 4);
    for (size_t i = d->n; i-- > 0;)
        if (veq(j, &d->k[i], k)) return &d->v[i];
    return NULL;
}

// Appends a pair without looking for the key (keys known to differ: a JSON object's).
static void dict_push(J *j, Dict *d, Value k, Value v) {
    size_t cap = d->cap;
    d->k = grow(j, d->k, &cap, d->n + 1, sizeof *d->k);
    d->v = grow(j, d->v, &d->cap, d->n + 1, sizeof *d->v);
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

static void dict_set(J *j, Dict *d, Value k, Value v) {
    Value *old = dict_find(j, d, &k);
    if (old) {
        *old = v;
        return;
    }
    dict_push(j, d, k, v);
}

static const char *type_name(const Value *v) {
    static const char *const names[] = {"Undefined", "NoneType", "bool",        "int",
                                        "float",     "str",      "list",        "dict",
                                        "Namespace", "Macro",    "LoopContext", "function"};
    if (v->t == T_LIST && v->l->tuple) return "tuple";
    return names[v->t];
}

static GRPO_NORETURN void fail_undef(J *j, const Value *v) {
    if (v->owner) fail(j, "'%s object' has no attribute '%.*s'", v->owner, (int)v->s.n, v->s.s);
    fail(j, "'%.*s' is undefined", (int)v->s.n, v->s.s);
}

static int truthy(const Value *v) {
    switch (v->t) {
    case T_UNDEF: case T_NONE: return 0;
    case T_BOOL: return v->b;
    case T_INT: return v->i != 0;
    case T_FLOAT: return v->f != 0;
    case T_STR: return v->s.n > 0;
    case T_LIST: return v->l->n > 0;
    case T_DICT: return v->d->n > 0;
    default: return 1;
    }
}

static int is_num(const Value *v) { return v->t == T_INT || v->t == T_FLOAT || v->t == T_BOOL; }

static double num(const Value *v) { return v->t == T_FLOAT ? v->f : v->t == T_INT ? (double)v->i : v->b; }

// Equality as Python's ==: the same list or dict is equal to itself; values nested deeper than MAX_RUN_DEPTH
// are unequal. Each value compared is a step, 64 bytes of string one more.
static int veq_at(J *j, const Value *a, const Value *b, int depth) {
    step(j);
    if (depth > MAX_RUN_DEPTH) return 0;
    if (is_num(a) && is_num(b)) {
        if (a->t != T_FLOAT && b->t != T_FLOAT)
            return (a->t == T_INT ? a->i : a->b) == (b->t == T_INT ? b->i : b->b);
        return num(a) == num(b);
    }
    if (a->t != b->t) return 0;
    switch (a->t) {
    case T_UNDEF: case T_NONE: return 1;
    case T_STR:
        j->steps += (long)(a->s.n >> 6);
        return str_same(a->s, b->s);
    case T_LIST:
        if (a->l == b->l) return 1;
        if (a->l->n != b->l->n || a->l->tuple != b->l->tuple) return 0;
        for (size_t i = 0; i < a->l->n; i++)
            if (!veq_at(j, &a->l->v[i], &b->l->v[i], depth + 1)) return 0;
        return 1;
    case T_DICT:
        if (a->d == b->d) return 1;
        if (a->d->n != b->d->n) return 0;
        for (size_t i = 0; i < a->d->n; i++) {
            const Value *o = dict_find(j, b->d, &a->d->k[i]);
            if (!o || !veq_at(j, &a->d->v[i], o, depth + 1)) return 0;
        }
        return 1;
    default: return a->d == b->d;
    }
}

static int veq(J *j, const Value *a, const Value *b) { return veq_at(j, a, b, 0); }

// ---------------------------------------------------------------- str(), repr(), tojson

// Python's repr() of a float (the shortest digits that read back the same).
static void float_repr(J *j, SB *b, double x) {
    if (isnan(x)) return sb_puts(j, b, "nan");
    if (isinf(x)) return sb_puts(j, b, x < 0 ? "-inf" : "inf");
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    // e: [-]d[.ddd]e±XX
    char digits[24];
    size_t nd = 0;
    const char *q = e;
    int neg = *q == '-';
    q += neg;
    for (; *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) sb_puts(j, b, "-");
    if (exp < -4 || exp >= 16) {
        sb_put(j, b, digits, 1);
        if (nd > 1) {
            sb_puts(j, b, ".");
            sb_put(j, b, digits + 1, nd - 1);
        }
        char t[16];
        snprintf(t, sizeof t, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
        return sb_puts(j, b, t);
    }
    if (exp < 0) {
        sb_puts(j, b, "0.");
        for (int i = 0; i < -exp - 1; i++) sb_puts(j, b, "0");
        return sb_put(j, b, digits, nd);
    }
    for (int i = 0; i <= exp; i++) sb_put(j, b, i < (int)nd ? &digits[i] : "0", 1);
    sb_puts(j, b, ".");
    if ((int)nd > exp + 1) sb_put(j, b, digits + exp + 1, nd - (size_t)exp - 1);
    else sb_puts(j, b, "0");
}

static void int_str(J *j, SB *b, int64_t i) {
    char t[24];
    snprintf(t, sizeof t, "%lld", (long long)i);
    sb_puts(j, b, t);
}

// Python's repr() of a string: single quotes unless it holds ' and no ", non-printable characters escaped.
static void str_repr(J *j, SB *b, Str s) {
    j->steps += (long)s.n;
    char quote = memchr(s.s, '\'', s.n) && !memchr(s.s, '"', s.n) ? '"' : '\'';
    sb_put(j, b, &quote, 1);
    for (size_t i = 0; i < s.n;) {
        int32_t c = cp_next(s, &i);
        char t[16];
        if (c == quote || c == '\\') {
            t[0] = '\\', t[1] = (char)c;
            sb_put(j, b, t, 2);
        } else if (c == '\n' || c == '\r' || c == '\t') {
            sb_puts(j, b, c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t");
        } else if (c == ' ' || (c > 32 && c < 127)) {
            t[0] = (char)c;
            sb_put(j, b, t, 1);
        } else {
            utf8proc_category_t cat = utf8proc_category(c);
            int printable = c >= 0x80 && cat != UTF8PROC_CATEGORY_CC && cat != UTF8PROC_CATEGORY_CF &&
                            cat != UTF8PROC_CATEGORY_CS && cat != UTF8PROC_CATEGORY_CO &&
                            cat != UTF8PROC_CATEGORY_CN && cat != UTF8PROC_CATEGORY_ZL &&
                            cat != UTF8PROC_CATEGORY_ZP && cat != UTF8PROC_CATEGORY_ZS;
            if (printable) {
                sb_cp(j, b, c);
                continue;
            }
            snprintf(t, sizeof t, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)c);
            sb_puts(j, b, t);
        }
    }
    sb_put(j, b, &quote, 1);
}

static void to_str(J *j, SB *b, const Value *v);

static void repr(J *j, SB *b, const Value *v) {
    if (v->t == T_STR) return str_repr(j, b, v->s);
    if (v->t == T_UNDEF) return sb_puts(j, b, "Undefined");
    if (++j->depth > MAX_RUN_DEPTH)
        fail(j, "a value nested deeper than %d (does it hold itself?)", MAX_RUN_DEPTH);
    to_str(j, b, v);
    j->depth--;
}

// Python's str() of a value, as {{ }} writes it (undefined: nothing).
static void to_str(J *j, SB *b, const Value *v) {
    switch (v->t) {
    case T_UNDEF: return;
    case T_NONE: return sb_puts(j, b, "None");
    case T_BOOL: return sb_puts(j, b, v->b ? "True" : "False");
    case T_INT: return int_str(j, b, v->i);
    case T_FLOAT: return float_repr(j, b, v->f);
    case T_STR: return sb_put(j, b, v->s.s, v->s.n);
    case T_LIST:
        sb_puts(j, b, v->l->tuple ? "(" : "[");
        for (size_t i = 0; i < v->l->n; i++) {
            if (i) sb_puts(j, b, ", ");
            repr(j, b, &v->l->v[i]);
        }
        if (v->l->tuple && v->l->n == 1) sb_puts(j, b, ",");
        return sb_puts(j, b, v->l->tuple ? ")" : "]");
    case T_DICT: case T_NS:
        sb_puts(j, b, v->t == T_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v->d->n; i++) {
            if (i) sb_puts(j, b, ", ");
            repr(j, b, &v->d->k[i]);
            sb_puts(j, b, ": ");
            repr(j, b, &v->d->v[i]);
        }
        return sb_puts(j, b, v->t == T_NS ? "}>" : "}");
    case T_MACRO: return sb_puts(j, b, "<Macro>");
    case T_LOOP: return sb_puts(j, b, "<LoopContext>");
    case T_FUNC: return sb_puts(j, b, "<built-in function>");
    }
}

static Str str_of(J *j, const Value *v) {
    if (v->t == T_STR) return v->s;
    SB b = {0};
    to_str(j, &b, v);
    return sb_str(&b);
}

typedef struct {
    int ascii, indent, sort;
    Str item_sep, key_sep;
} JsonStyle;

static void json_str(J *j, SB *b, Str s, int ascii) {
    j->steps += (long)s.n;
    sb_puts(j, b, "\"");
    for (size_t i = 0; i < s.n;) {
        size_t at = i;
        int32_t c = cp_next(s, &i);
        char t[16];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (esc) {
            sb_puts(j, b, esc);
        } else if (c < 0x20 || (ascii && c > 0x7e)) {
            if (c >= 0x10000) {
                snprintf(t, sizeof t, "\\u%04x\\u%04x", 0xD800 + ((c - 0x10000) >> 10),
                         0xDC00 + ((c - 0x10000) & 0x3FF));
            } else {
                snprintf(t, sizeof t, "\\u%04x", (unsigned)c);
            }
            sb_puts(j, b, t);
        } else {
            sb_put(j, b, s.s + at, i - at);
        }
    }
    sb_puts(j, b, "\"");
}

static void json_newline(J *j, SB *b, const JsonStyle *st, int level) {
    if (st->indent < 0) return;
    sb_puts(j, b, "\n");
    for (int i = 0; i < st->indent * level; i++) sb_puts(j, b, " ");
}

static int key_cmp(const void *a, const void *b);

static void to_json(J *j, SB *b, const Value *v, const JsonStyle *st, int level) {
    step(j);
    if (level > MAX_NEST) fail(j, "tojson: nesting deeper than %d", MAX_NEST);
    switch (v->t) {
    case T_NONE: return sb_puts(j, b, "null");
    case T_BOOL: return sb_puts(j, b, v->b ? "true" : "false");
    case T_INT: return int_str(j, b, v->i);
    case T_FLOAT:
        if (isnan(v->f)) return sb_puts(j, b, "NaN");
        if (isinf(v->f)) return sb_puts(j, b, v->f < 0 ? "-Infinity" : "Infinity");
        return float_repr(j, b, v->f);
    case T_STR: return json_str(j, b, v->s, st->ascii);
    case T_LIST:
        if (!v->l->n) return sb_puts(j, b, "[]");
        sb_puts(j, b, "[");
        for (size_t i = 0; i < v->l->n; i++) {
            if (i) sb_put(j, b, st->item_sep.s, st->item_sep.n);
            json_newline(j, b, st, level + 1);
            to_json(j, b, &v->l->v[i], st, level + 1);
        }
        json_newline(j, b, st, level);
        return sb_puts(j, b, "]");
    case T_DICT: {
        if (!v->d->n) return sb_puts(j, b, "{}");
        size_t n = v->d->n, *order = alloc(j, n * sizeof *order);
        for (size_t i = 0; i < n; i++) order[i] = i;
        const Dict *d = v->d;
        for (size_t i = 0; i < n; i++)
            if (d->k[i].t != T_STR) fail(j, "tojson: keys must be strings");
        if (st->sort) {  // insertion sort by key (stable, small dicts)
            for (size_t i = 1; i < n; i++)
                for (size_t k = i; k > 0 && key_cmp(&d->k[order[k - 1]], &d->k[order[k]]) > 0; k--) {
                    size_t t = order[k];
                    order[k] = order[k - 1];
                    order[k - 1] = t;
                    step(j);
                }
        }
        sb_puts(j, b, "{");
        for (size_t i = 0; i < n; i++) {
            if (i) sb_put(j, b, st->item_sep.s, st->item_sep.n);
            json_newline(j, b, st, level + 1);
            json_str(j, b, d->k[order[i]].s, st->ascii);
            sb_put(j, b, st->key_sep.s, st->key_sep.n);
            to_json(j, b, &d->v[order[i]], st, level + 1);
        }
        json_newline(j, b, st, level);
        return sb_puts(j, b, "}");
    }
    default: fail(j, "Object of type %s is not JSON serializable", type_name(v));
    }
}

// ---------------------------------------------------------------- lexer

typedef enum {
    K_EOF,
    K_DATA,
    K_VAR,
    K_VAR_END,
    K_BLOCK,
    K_BLOCK_END,
    K_NAME,
    K_STRING,
    K_INT,
    K_FLOAT,
    K_OP
} TokKind;

typedef struct {
    TokKind k;
    int line;
    Str s;  // K_DATA, K_NAME, K_STRING (unescaped), K_OP
    int64_t i;
    double f;
} Tok;

typedef struct {
    J *j;
    const char *src;
    size_t n, pos;
    int line;
    Tok *t;
    size_t nt, cap;
} Lexer;

static Tok *tok_push(Lexer *L, TokKind k, Str s) {
    L->t = grow(L->j, L->t, &L->cap, L->nt + 1, sizeof *L->t);
    Tok *t = &L->t[L->nt++];
    memset(t, 0, sizeof *t);
    t->k = k;
    t->s = s;
    t->line = L->line;
    return t;
}

static void count_lines(Lexer *L, size_t from, size_t to) {
    for (size_t i = from; i < to; i++) L->line += L->src[i] == '\n';
}

static int ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static size_t skip_ws(Lexer *L, size_t p) {
    while (p < L->n && ws(L->src[p])) p++;
    return p;
}

static int is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

static int is_digit(char c) { return c >= '0' && c <= '9'; }

// A string literal from src[p] (the quote); returns the position after it.
static size_t lex_string(Lexer *L, size_t p) {
    J *j = L->j;
    char q = L->src[p++];
    SB b = {0};
    for (;;) {
        if (p >= L->n) fail(j, "unexpected end of template in a string");
        char c = L->src[p++];
        if (c == q) break;
        if (c == '\n') L->line++;
        if (c != '\\' || p >= L->n) {
            sb_put(j, &b, &c, 1);
            continue;
        }
        char e = L->src[p++];
        static const char from[] = "nrtbfva0\\'\"", to[] = "\n\r\t\b\f\v\a\0\\'\"";
        const char *k = memchr(from, e, sizeof from - 1);
        int hex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (k && !(e == '0' && p < L->n && is_digit(L->src[p]))) {
            sb_put(j, &b, &to[k - from], 1);
        } else if (hex) {
            int32_t cp = 0;
            for (int i = 0; i < hex; i++, p++) {
                char h = p < L->n ? L->src[p] : 0;
                int d = is_digit(h) ? h - '0' : (h | 32) >= 'a' && (h | 32) <= 'f' ? (h | 32) - 'a' + 10 : -1;
                if (d < 0) fail(j, "truncated \\%c escape in a string", e);
                cp = cp * 16 + d;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) fail(j, "escape \\%c: not a character", e);
            sb_cp(j, &b, cp);
        } else if (e >= '0' && e <= '7') {
            int32_t cp = e - '0';
            for (int i = 0; i < 2 && p < L->n && L->src[p] >= '0' && L->src[p] <= '7'; i++)
                cp = cp * 8 + L->src[p++] - '0';
            sb_cp(j, &b, cp);
        } else {
            if (e == '\n') L->line++;
            sb_put(j, &b, "\\", 1);
            sb_put(j, &b, &e, 1);
        }
    }
    Tok *t = tok_push(L, K_STRING, sb_str(&b));
    (void)t;
    return p;
}

static size_t lex_number(Lexer *L, size_t p) {
    size_t start = p;
    int is_float = 0;
    while (p < L->n && (is_digit(L->src[p]) || (L->src[p] == '_' && p + 1 < L->n && is_digit(L->src[p + 1]))))
        p++;
    if (p + 1 < L->n && L->src[p] == '.' && is_digit(L->src[p + 1])) {
        is_float = 1;
        for (p++; p < L->n && (is_digit(L->src[p]) || L->src[p] == '_'); p++) {}
    }
    if (p < L->n && (L->src[p] | 32) == 'e') {
        size_t q = p + 1;
        if (q < L->n && (L->src[q] == '+' || L->src[q] == '-')) q++;
        if (q < L->n && is_digit(L->src[q])) {
            is_float = 1;
            for (p = q; p < L->n && is_digit(L->src[p]); p++) {}
        }
    }
    char buf[64];
    size_t k = 0;
    for (size_t i = start; i < p && k < sizeof buf - 1; i++)
        if (L->src[i] != '_') buf[k++] = L->src[i];
    buf[k] = 0;
    Tok *t = tok_push(L, is_float ? K_FLOAT : K_INT, (Str){L->src + start, p - start});
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        char *end;
        unsigned long long v = strtoull(buf, &end, 10);
        if (k >= 20 || v > INT64_MAX) fail(L->j, "integer %s is too large", buf);
        t->i = (int64_t)v;
    }
    return p;
}

// The tokens of one tag from p to its end marker; returns the position after the marker (and the strip sign
// before it, '-' or '+' or 0, in *sign).
static size_t lex_tag(Lexer *L, size_t p, int block, int *sign) {
    J *j = L->j;
    int depth = 0;
    for (;;) {
        size_t q = skip_ws(L, p);
        count_lines(L, p, q);
        p = q;
        if (p >= L->n) fail(j, "unexpected end of template: a tag is not closed");
        const char *s = L->src + p;
        const char *end = block ? "%}" : "}}";
        if (depth == 0) {
            size_t left = L->n - p;
            if ((s[0] == '-' || s[0] == '+') && left >= 3 && !memcmp(s + 1, end, 2) &&
                (block || s[0] == '-')) {
                *sign = s[0];
                tok_push(L, block ? K_BLOCK_END : K_VAR_END, S(""));
                return p + 3;
            }
            if (left >= 2 && !memcmp(s, end, 2)) {
                *sign = 0;
                tok_push(L, block ? K_BLOCK_END : K_VAR_END, S(""));
                return p + 2;
            }
        }
        char c = *s;
        if (is_alpha(c)) {
            size_t q2 = p;
            while (q2 < L->n && (is_alpha(L->src[q2]) || is_digit(L->src[q2]))) q2++;
            tok_push(L, K_NAME, (Str){s, q2 - p});
            p = q2;
        } else if (is_digit(c)) {
            p = lex_number(L, p);
        } else if (c == '\'' || c == '"') {
            p = lex_string(L, p);
        } else {
            static const char *const two[] = {"//", "**", "==", "!=", "<=", ">="};
            size_t len = 0;
            for (size_t i = 0; i < sizeof two / sizeof *two; i++)
                if (L->n - p >= 2 && !memcmp(s, two[i], 2)) len = 2;
            if (!len && strchr("+-*/%~<>=.,:|()[]{}", c) && c) len = 1;
            if (!len) fail(j, "unexpected character '%c'", c);
            if (len == 1 && strchr("([{", c)) depth++;
            if (len == 1 && strchr(")]}", c) && depth > 0) depth--;
            tok_push(L, K_OP, (Str){s, len});
            p += len;
        }
    }
}

// Whether the text of src[a..b) is only spaces and tabs (and the like, not newlines).
static int blank(const char *s, size_t a, size_t b) {
    for (size_t i = a; i < b; i++)
        if (!ws(s[i]) || s[i] == '\n') return 0;
    return a < b;
}

// "{% raw %}" at p (with strip signs): its length, else 0.
static size_t raw_tag(const char *s, size_t n, size_t p, const char *word, int *lsign, int *rsign) {
    size_t q = p + 2;
    *lsign = *rsign = 0;
    if (q < n && (s[q] == '-' || s[q] == '+')) *lsign = s[q++];
    while (q < n && ws(s[q])) q++;
    size_t w = strlen(word);
    if (n - q < w || memcmp(s + q, word, w)) return 0;
    q += w;
    while (q < n && ws(s[q])) q++;
    if (q < n && (s[q] == '-' || s[q] == '+')) *rsign = s[q++];
    if (n - q < 2 || memcmp(s + q, "%}", 2)) return 0;
    return q + 2 - p;
}

static void lex(Lexer *L) {
    const char *s = L->src;
    size_t n = L->n, p = 0;
    int line_starting = 1;
    L->line = 1;
    while (p < n) {
        const char *open = NULL;
        for (const char *q = memchr(s + p, '{', n - p); q && q + 1 < s + n;
             q = memchr(q + 1, '{', (size_t)(s + n - q - 1)))
            if (q[1] == '{' || q[1] == '%' || q[1] == '#') {
                open = q;
                break;
            }
        size_t at = open ? (size_t)(open - s) : n;
        size_t text_end = at;
        char kind = open ? open[1] : 0;
        char sign = open && at + 2 < n && (s[at + 2] == '-' || s[at + 2] == '+') ? s[at + 2] : 0;
        if (sign == '-') {
            while (text_end > p && ws(s[text_end - 1])) text_end--;
        } else if (open && sign != '+' && kind != '{') {  // lstrip_blocks
            size_t l = text_end;
            while (l > p && s[l - 1] != '\n') l--;
            if ((l > p || line_starting) && blank(s, l, text_end)) text_end = l;
        }
        if (text_end > p) tok_push(L, K_DATA, (Str){s + p, text_end - p});
        count_lines(L, p, at);
        if (!open) break;
        int ls, rs;
        size_t raw = kind == '%' ? raw_tag(s, n, at, "raw", &ls, &rs) : 0;
        if (raw) {
            size_t body = at + raw, e = body, elen = 0;
            int ls2 = 0, rs2 = 0;
            for (; e + 1 < n; e++)
                if (s[e] == '{' && s[e + 1] == '%' && (elen = raw_tag(s, n, e, "endraw", &ls2, &rs2))) break;
            if (!elen) fail(L->j, "missing endraw");
            size_t b = body, t = e,
                   l = e;  // jinja2: no trim_blocks after {% raw %}, lstrip_blocks before endraw
            if (rs == '-') b = skip_ws(L, b);
            while (l > b && s[l - 1] != '\n') l--;
            if (ls2 == '-')
                while (t > b && ws(s[t - 1])) t--;
            else if (ls2 != '+' && l > b && blank(s, l, t))
                t = l;
            if (t > b) tok_push(L, K_DATA, (Str){s + b, t - b});
            count_lines(L, at, e + elen);
            p = e + elen;
            if (rs2 == '-') p = skip_ws(L, p);
            else if (rs2 != '+' && p < n && s[p] == '\n') p++;
            count_lines(L, e + elen, p);
            line_starting = s[p - 1] == '\n';
            continue;
        }
        p = at + 2 + (sign != 0);
        int end_sign = 0;
        if (kind == '#') {
            const char *e = memmem(s + p, n - p, "#}", 2);
            if (!e) fail(L->j, "missing end of comment");
            end_sign = e > s + p && (e[-1] == '-' || e[-1] == '+') ? e[-1] : 0;
            size_t after = (size_t)(e - s) + 2;
            count_lines(L, p, after);
            p = after;
        } else {
            tok_push(L, kind == '{' ? K_VAR : K_BLOCK, S(""));
            p = lex_tag(L, p, kind == '%', &end_sign);
        }
        size_t from = p;
        if (end_sign == '-') p = skip_ws(L, p);
        else if (end_sign != '+' && kind != '{' && p < n && s[p] == '\n') p++;  // trim_blocks
        count_lines(L, from, p);
        line_starting = p > 0 && s[p - 1] == '\n';
    }
    tok_push(L, K_EOF, S(""));
}

// ---------------------------------------------------------------- parser

typedef struct {
    J *j;
    Tok *t;
    size_t i;
    int nest;
    int loops;  // for loops around the statement being parsed (in this macro)
} P;

static Tok *cur(P *p) { return &p->t[p->i]; }

static Tok *adv(P *p) {
    Tok *t = &p->t[p->i];
    if (t->k != K_EOF) p->i++;
    p->j->line = p->t[p->i].line;
    return t;
}

static int is_op(P *p, const char *op) { return cur(p)->k == K_OP && str_eq(cur(p)->s, op); }

static int is_kw(P *p, const char *name) { return cur(p)->k == K_NAME && str_eq(cur(p)->s, name); }

static int skip_op(P *p, const char *op) {
    if (!is_op(p, op)) return 0;
    adv(p);
    return 1;
}

static int skip_kw(P *p, const char *name) {
    if (!is_kw(p, name)) return 0;
    adv(p);
    return 1;
}

static const char *tok_desc(const Tok *t) {
    switch (t->k) {
    case K_EOF: return "end of template";
    case K_VAR_END: return "end of print statement";
    case K_BLOCK_END: return "end of statement block";
    case K_STRING: return "string";
    case K_INT: case K_FLOAT: return "number";
    default: return NULL;
    }
}

static GRPO_NORETURN void unexpected(P *p, const char *want) {
    Tok *t = cur(p);
    const char *d = tok_desc(t);
    if (d) fail(p->j, "expected %s, got %s", want, d);
    fail(p->j, "expected %s, got '%.*s'", want, (int)t->s.n, t->s.s);
}

static void expect_op(P *p, const char *op) {
    if (!skip_op(p, op)) unexpected(p, op);
}

static Str expect_name(P *p) {
    if (cur(p)->k != K_NAME) unexpected(p, "a name");
    return adv(p)->s;
}

static void expect_block_end(P *p) {
    if (cur(p)->k != K_BLOCK_END) unexpected(p, "end of statement block");
    adv(p);
}

static Node *node(P *p, int k) {
    Node *n = alloc(p->j, sizeof *n);
    memset(n, 0, sizeof *n);
    n->k = k;
    n->line = cur(p)->line;
    return n;
}

static void push(J *j, Nodes *l, Node *n) {
    size_t cap = (size_t)l->cap;
    l->v = grow(j, l->v, &cap, (size_t)l->n + 1, sizeof *l->v);
    l->cap = (int)cap;
    l->v[l->n++] = n;
}

static void nest_in(P *p) {
    if (++p->nest > MAX_NEST) fail(p->j, "blocks or expressions nested deeper than %d", MAX_NEST);
}

static Node *parse_expr(P *p);
static Node *parse_unary(P *p, int with_filter);
static Node *parse_primary(P *p);
static Node *parse_postfix(P *p, Node *n);

static Node *bin(P *p, int op, Node *a, Node *b) {
    Node *n = node(p, E_BIN);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static int tuple_end(P *p, int for_target) {
    TokKind k = cur(p)->k;
    return k == K_VAR_END || k == K_BLOCK_END || is_op(p, ")") || (for_target && is_kw(p, "in"));
}

// Expressions separated by commas: a tuple when there is a comma (or explicit parentheses hold none).
static Node *parse_tuple(P *p, int condexpr, int parens, Node *(*one)(P *)) {
    Node *t = node(p, E_TUPLE);
    int is_tuple = 0;
    for (;;) {
        if (t->args.n) expect_op(p, ",");
        if (tuple_end(p, 0)) break;
        push(p->j, &t->args, one ? one(p) : condexpr ? parse_expr(p) : parse_unary(p, 1));
        if (is_op(p, ",")) is_tuple = 1;
        else break;
    }
    if (!is_tuple && t->args.n == 1) return t->args.v[0];
    if (!is_tuple && !parens) unexpected(p, "an expression");
    return t;
}

static void parse_call_args(P *p, Node *call) {
    expect_op(p, "(");
    while (!skip_op(p, ")")) {
        if (call->args.n + call->kw.n) expect_op(p, ",");
        if (skip_op(p, ")")) break;
        if (is_op(p, "*") || is_op(p, "**")) fail(p->j, "*args and **kwargs in calls are not supported");
        if (cur(p)->k == K_NAME && p->t[p->i + 1].k == K_OP && str_eq(p->t[p->i + 1].s, "=")) {
            Node *kw = node(p, E_KW);
            kw->s = adv(p)->s;
            adv(p);
            kw->a = parse_expr(p);
            push(p->j, &call->kw, kw);
        } else {
            if (call->kw.n) fail(p->j, "a positional argument after keyword arguments");
            push(p->j, &call->args, parse_expr(p));
        }
    }
}

static const char *const FILTERS[] = {
    "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "forceescape", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min",
    "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string",
    "sum", "title", "tojson", "trim", "unique", "upper", NULL};
static const char *const TESTS[] = {"boolean",     "callable", "defined",  "divisibleby", "eq",   "equalto",
                                    "escaped",     "even",     "false",    "float",       "ge",   "gt",
                                    "greaterthan", "in",       "integer",  "iterable",    "le",   "lessthan",
                                    "lower",       "lt",       "mapping",  "ne",          "none", "number",
                                    "odd",         "sameas",   "sequence", "string",      "true", "undefined",
                                    "upper",       "==",       "!=",       "<",           "<=",   ">",
                                    ">=",          NULL};

static int known(const char *const *names, Str s) {
    for (; *names; names++)
        if (str_eq(s, *names)) return 1;
    return 0;
}

static Node *parse_filter(P *p, Node *input) {
    Node *f = node(p, E_FILTER);
    f->a = input;
    f->s = expect_name(p);
    if (!known(FILTERS, f->s)) fail(p->j, "no filter named '%.*s'", (int)f->s.n, f->s.s);
    if (is_op(p, "(")) parse_call_args(p, f);
    return f;
}

static Node *parse_call(P *p, Node *callee) {
    Node *c = node(p, E_CALL);
    c->a = callee;
    parse_call_args(p, c);
    return c;
}

static Node *parse_filter_expr(P *p, Node *n) {
    for (;;) {
        if (skip_op(p, "|")) {
            n = parse_filter(p, n);
        } else if (skip_kw(p, "is")) {
            Node *t = node(p, E_TEST);
            t->a = n;
            t->op = skip_kw(p, "not");
            if (cur(p)->k == K_NAME) t->s = adv(p)->s;
            else if (cur(p)->k == K_OP && known(TESTS, cur(p)->s)) t->s = adv(p)->s;
            else unexpected(p, "a test name");
            if (!known(TESTS, t->s)) fail(p->j, "no test named '%.*s'", (int)t->s.n, t->s.s);
            TokKind k = cur(p)->k;
            if (is_op(p, "(")) {
                parse_call_args(p, t);
            } else if ((k == K_NAME || k == K_STRING || k == K_INT || k == K_FLOAT || is_op(p, "[") ||
                        is_op(p, "{")) &&
                       !is_kw(p, "else") && !is_kw(p, "or") && !is_kw(p, "and")) {
                if (is_kw(p, "is")) fail(p->j, "you cannot chain multiple tests with is");
                push(p->j, &t->args, parse_postfix(p, parse_primary(p)));
            }
            n = t;
        } else if (is_op(p, "(")) {
            n = parse_call(p, n);
        } else {
            return n;
        }
    }
}

static Node *parse_postfix(P *p, Node *n) {
    for (;;) {
        if (skip_op(p, ".")) {
            Node *a = node(p, E_ATTR);
            a->a = n;
            if (cur(p)->k == K_INT) {  // x.0: an item
                a->k = E_ITEM;
                a->b = node(p, E_LIT);
                a->b->lit = vint(adv(p)->i);
            } else {
                a->s = expect_name(p);
            }
            n = a;
        } else if (skip_op(p, "[")) {
            Node *parts[3] = {NULL, NULL, NULL};
            int colons = 0;
            for (;;) {
                if (is_op(p, ":")) {
                    if (++colons > 2) unexpected(p, "]");
                    adv(p);
                } else if (is_op(p, "]")) {
                    break;
                } else {
                    if (parts[colons]) unexpected(p, "]");
                    parts[colons] = parse_expr(p);
                }
            }
            adv(p);
            if (!colons && !parts[0]) fail(p->j, "expected an expression in []");
            Node *s = node(p, colons ? E_SLICE : E_ITEM);
            s->a = n;
            s->b = parts[0];
            s->c = parts[1];
            if (parts[2]) push(p->j, &s->args, parts[2]);  // a slice's step
            n = s;
        } else if (is_op(p, "(")) {
            n = parse_call(p, n);
        } else {
            return n;
        }
    }
}

static Node *lit(P *p, Value v) {
    Node *n = node(p, E_LIT);
    n->lit = v;
    return n;
}

static Node *parse_primary(P *p) {
    Tok *t = cur(p);
    nest_in(p);
    Node *n;
    if (t->k == K_NAME) {
        adv(p);
        if (str_eq(t->s, "true") || str_eq(t->s, "True")) n = lit(p, vbool(1));
        else if (str_eq(t->s, "false") || str_eq(t->s, "False")) n = lit(p, vbool(0));
        else if (str_eq(t->s, "none") || str_eq(t->s, "None")) n = lit(p, V(T_NONE));
        else (n = node(p, E_NAME))->s = t->s;
    } else if (t->k == K_STRING) {
        Str s = adv(p)->s;
        while (cur(p)->k == K_STRING) {  // adjacent literals join
            Str b = adv(p)->s;
            SB sb = {0};
            sb_put(p->j, &sb, s.s, s.n);
            sb_put(p->j, &sb, b.s, b.n);
            s = sb_str(&sb);
        }
        n = lit(p, vstr(s));
    } else if (t->k == K_INT) {
        n = lit(p, vint(adv(p)->i));
    } else if (t->k == K_FLOAT) {
        n = lit(p, vfloat(adv(p)->f));
    } else if (skip_op(p, "(")) {
        n = parse_tuple(p, 1, 1, NULL);
        expect_op(p, ")");
    } else if (skip_op(p, "[")) {
        n = node(p, E_LIST);
        while (!skip_op(p, "]")) {
            if (n->args.n) expect_op(p, ",");
            if (skip_op(p, "]")) break;
            push(p->j, &n->args, parse_expr(p));
        }
    } else if (skip_op(p, "{")) {
        n = node(p, E_DICT);
        while (!skip_op(p, "}")) {
            if (n->args.n) expect_op(p, ",");
            if (skip_op(p, "}")) break;
            push(p->j, &n->args, parse_expr(p));
            expect_op(p, ":");
            push(p->j, &n->kw, parse_expr(p));
        }
    } else {
        unexpected(p, "an expression");
    }
    p->nest--;
    return n;
}

static Node *parse_unary(P *p, int with_filter) {
    Node *n;
    nest_in(p);
    if (is_op(p, "-") || is_op(p, "+")) {
        n = node(p, is_op(p, "-") ? E_NEG : E_POS);
        adv(p);
        n->a = parse_unary(p, 0);
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filter_expr(p, n);
    p->nest--;
    return n;
}

static Node *parse_pow(P *p) {
    Node *n = parse_unary(p, 1);
    while (skip_op(p, "**")) n = bin(p, 'P', n, parse_unary(p, 1));
    return n;
}

static Node *parse_math2(P *p) {
    Node *n = parse_pow(p);
    for (;;) {
        int op = is_op(p, "*") ? '*' : is_op(p, "/") ? '/' : is_op(p, "//") ? 'F' : is_op(p, "%") ? '%' : 0;
        if (!op) return n;
        adv(p);
        n = bin(p, op, n, parse_pow(p));
    }
}

static Node *parse_concat(P *p) {
    Node *n = parse_math2(p);
    while (skip_op(p, "~")) n = bin(p, '~', n, parse_math2(p));
    return n;
}

static Node *parse_math1(P *p) {
    Node *n = parse_concat(p);
    for (;;) {
        int op = is_op(p, "+") ? '+' : is_op(p, "-") ? '-' : 0;
        if (!op) return n;
        adv(p);
        n = bin(p, op, n, parse_concat(p));
    }
}

static int cmp_op(P *p) {
    static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">="};
    static const char codes[] = "en<l>g";
    for (int i = 0; i < 6; i++)
        if (is_op(p, ops[i])) return codes[i];
    if (is_kw(p, "in")) return 'i';
    if (is_kw(p, "not") && p->t[p->i + 1].k == K_NAME && str_eq(p->t[p->i + 1].s, "in")) return 'I';
    return 0;
}

static Node *parse_compare(P *p) {
    Node *n = parse_math1(p), *prev = NULL, *chain = NULL;
    for (int op; (op = cmp_op(p));) {
        adv(p);
        if (op == 'I') adv(p);
        Node *right = parse_math1(p);
        Node *c = bin(p, op, prev ? prev : n, right);
        if (chain) {  // a < b < c: (a < b) and (b < c)
            Node *both = node(p, E_AND);
            both->a = chain;
            both->b = c;
            chain = both;
        } else {
            chain = c;
        }
        prev = right;
    }
    return chain ? chain : n;
}

static Node *parse_not(P *p) {
    if (is_kw(p, "not") && !(p->t[p->i + 1].k == K_NAME && str_eq(p->t[p->i + 1].s, "in"))) {
        Node *n = node(p, E_NOT);
        adv(p);
        nest_in(p);
        n->a = parse_not(p);
        p->nest--;
        return n;
    }
    return parse_compare(p);
}

// operand (word operand)*, left to right: `and` and `or`.
static Node *parse_logic(P *p, int kind, const char *word, Node *(*operand)(P *)) {
    Node *n = operand(p);
    while (skip_kw(p, word)) {
        Node *x = node(p, kind);
        x->a = n;
        x->b = operand(p);
        n = x;
    }
    return n;
}

static Node *parse_and(P *p) { return parse_logic(p, E_AND, "and", parse_not); }

static Node *parse_or(P *p) { return parse_logic(p, E_OR, "or", parse_and); }

static Node *parse_expr(P *p) {
    nest_in(p);
    Node *n = parse_or(p);
    while (skip_kw(p, "if")) {
        Node *c = node(p, E_COND);
        c->a = n;
        c->b = parse_or(p);
        if (skip_kw(p, "else")) c->c = parse_expr(p);
        n = c;
    }
    p->nest--;
    return n;
}

static Node *parse_no_cond(P *p) { return parse_or(p); }

static Node *parse_name_node(P *p) {
    Node *n = node(p, E_NAME);
    n->s = expect_name(p);
    return n;
}

// A for loop's or set's targets into t->args: names (a tuple of them), or one namespace attribute (set).
static void parse_targets(P *p, Node *t, int attr_ok) {
    int parens = skip_op(p, "(");
    do {
        Node *n = parse_name_node(p);
        if (attr_ok && !parens && !t->args.n && skip_op(p, ".")) {
            Node *a = node(p, E_ATTR);
            a->a = n;
            a->s = expect_name(p);
            n = a;
        }
        push(p->j, &t->args, n);
    } while (skip_op(p, ",") && !(parens && is_op(p, ")")) && !is_kw(p, "in") && !is_op(p, "="));
    if (parens) expect_op(p, ")");
    t->op = parens || t->args.n > 1;  // unpack
}

static Nodes parse_body(P *p, const char *const *ends);

static const char *const END_IF[] = {"elif", "else", "endif", NULL};

static Node *parse_if(P *p) {
    Node *n = node(p, S_IF);
    n->a = parse_expr(p);
    expect_block_end(p);
    n->body = parse_body(p, END_IF);
    if (skip_kw(p, "elif")) {  // an elif is an if in the else branch: as deep as the chain is long
        nest_in(p);
        push(p->j, &n->orelse, parse_if(p));
        p->nest--;
        return n;
    }
    if (skip_kw(p, "else")) {
        expect_block_end(p);
        static const char *const end[] = {"endif", NULL};
        n->orelse = parse_body(p, end);
    }
    adv(p);  // endif
    expect_block_end(p);
    return n;
}

static void parse_end(P *p, const char *name) {
    if (!skip_kw(p, name)) unexpected(p, name);
    expect_block_end(p);
}

static Node *parse_for(P *p) {
    Node *n = node(p, S_FOR);
    parse_targets(p, n, 0);
    if (!skip_kw(p, "in")) unexpected(p, "'in'");
    n->a = parse_tuple(p, 0, 0, parse_no_cond);
    if (skip_kw(p, "if")) n->b = parse_expr(p);
    if (is_kw(p, "recursive")) fail(p->j, "recursive loops are not supported");
    expect_block_end(p);
    static const char *const end[] = {"endfor", "else", NULL}, *const end2[] = {"endfor", NULL};
    p->loops++;
    n->body = parse_body(p, end);
    p->loops--;
    if (skip_kw(p, "else")) {
        expect_block_end(p);
        n->orelse = parse_body(p, end2);
    }
    parse_end(p, "endfor");
    return n;
}

// A filter chain applied to what a block writes (E_HOLE), for {% filter %} and block set.
static Node *parse_filter_chain(P *p, Node *hole) {
    Node *n = parse_filter(p, hole);
    while (skip_op(p, "|")) n = parse_filter(p, n);
    return n;
}

static Node *parse_set(P *p) {
    Node *n = node(p, S_SET);
    parse_targets(p, n, 1);
    if (skip_op(p, "=")) {
        n->a = parse_tuple(p, 1, 0, NULL);
        expect_block_end(p);
        return n;
    }
    n->k = S_SETBLOCK;
    if (n->args.n != 1 || n->op) fail(p->j, "a block set assigns one name");
    if (skip_op(p, "|")) n->a = parse_filter_chain(p, node(p, E_HOLE));
    expect_block_end(p);
    static const char *const end[] = {"endset", NULL};
    n->body = parse_body(p, end);
    parse_end(p, "endset");
    return n;
}

// (a, b=default, ...) into n->args as E_KW nodes (a NULL default when none).
static void parse_params(P *p, Node *n) {
    expect_op(p, "(");
    while (!skip_op(p, ")")) {
        if (n->args.n) expect_op(p, ",");
        if (skip_op(p, ")")) break;
        Node *k = node(p, E_KW);
        k->s = expect_name(p);
        if (skip_op(p, "=")) k->a = parse_expr(p);
        push(p->j, &n->args, k);
    }
}

static Node *parse_macro(P *p) {
    Node *n = node(p, S_MACRO);
    n->s = expect_name(p);
    parse_params(p, n);
    expect_block_end(p);
    static const char *const end[] = {"endmacro", NULL};
    int loops = p->loops;
    p->loops = 0;  // a macro's body is not in the loops around its definition
    n->body = parse_body(p, end);
    p->loops = loops;
    adv(p);
    if (cur(p)->k == K_NAME) adv(p);  // {% endmacro name %}
    expect_block_end(p);
    return n;
}

static Node *parse_call_block(P *p) {
    Node *n = node(p, S_CALLBLOCK);
    if (is_op(p, "(")) parse_params(p, n);
    n->a = parse_expr(p);
    if (n->a->k != E_CALL) fail(p->j, "expected a call after {%% call %%}");
    expect_block_end(p);
    static const char *const end[] = {"endcall", NULL};
    n->body = parse_body(p, end);
    parse_end(p, "endcall");
    return n;
}

static Node *parse_statement(P *p) {
    J *j = p->j;
    Str name = expect_name(p);
    Node *n;
    nest_in(p);
    if (str_eq(name, "if")) {
        n = parse_if(p);
    } else if (str_eq(name, "for")) {
        n = parse_for(p);
    } else if (str_eq(name, "set")) {
        n = parse_set(p);
    } else if (str_eq(name, "macro")) {
        n = parse_macro(p);
    } else if (str_eq(name, "call")) {
        n = parse_call_block(p);
    } else if (str_eq(name, "filter")) {
        n = node(p, S_FILTERBLOCK);
        n->a = parse_filter_chain(p, node(p, E_HOLE));
        expect_block_end(p);
        static const char *const end[] = {"endfilter", NULL};
        n->body = parse_body(p, end);
        parse_end(p, "endfilter");
    } else if (str_eq(name, "break") || str_eq(name, "continue")) {
        if (!p->loops) fail(j, "'%.*s' outside a loop", (int)name.n, name.s);
        n = node(p, str_eq(name, "break") ? S_BREAK : S_CONTINUE);
        expect_block_end(p);
    } else if (str_eq(name, "with")) {
        n = node(p, S_WITH);
        while (cur(p)->k != K_BLOCK_END) {
            if (n->kw.n) expect_op(p, ",");
            Node *k = node(p, E_KW);
            k->s = expect_name(p);
            expect_op(p, "=");
            k->a = parse_expr(p);
            push(j, &n->kw, k);
        }
        expect_block_end(p);
        static const char *const end[] = {"endwith", NULL};
        n->body = parse_body(p, end);
        parse_end(p, "endwith");
    } else if (str_eq(name, "generation")) {  // transformers' assistant-mask tag: its text as is
        n = node(p, S_BLOCK);
        expect_block_end(p);
        static const char *const end[] = {"endgeneration", NULL};
        n->body = parse_body(p, end);
        parse_end(p, "endgeneration");
    } else if (str_eq(name, "include") || str_eq(name, "import") || str_eq(name, "from") ||
               str_eq(name, "extends") || str_eq(name, "block")) {
        fail(j, "'%.*s' is not allowed in a chat template (no other files are read)", (int)name.n, name.s);
    } else {
        fail(j, "unknown tag '%.*s'", (int)name.n, name.s);
    }
    p->nest--;
    return n;
}

static Nodes parse_body(P *p, const char *const *ends) {
    Nodes body = {0};
    for (;;) {
        Tok *t = cur(p);
        if (t->k == K_EOF) {
            if (ends)
                fail(p->j, "unexpected end of template: missing '%s'", ends[0][0] == 'e' ? ends[0] : "endif");
            return body;
        }
        if (t->k == K_DATA) {
            Node *n = node(p, S_TEXT);
            n->s = adv(p)->s;
            push(p->j, &body, n);
        } else if (t->k == K_VAR) {
            adv(p);
            Node *n = node(p, S_OUT);
            n->a = parse_tuple(p, 1, 0, NULL);
            if (cur(p)->k != K_VAR_END) unexpected(p, "end of print statement");
            adv(p);
            push(p->j, &body, n);
        } else if (t->k == K_BLOCK) {
            Tok *name = &p->t[p->i + 1];
            if (ends && name->k == K_NAME && known(ends, name->s)) {
                adv(p);
                return body;
            }
            if (name->k == K_NAME && (str_eq(name->s, "endif") || str_eq(name->s, "endfor") ||
                                      str_eq(name->s, "else") || str_eq(name->s, "elif") ||
                                      (name->s.n >= 3 && !memcmp(name->s.s, "end", 3)))) {
                p->j->line = name->line;
                fail(p->j, "unexpected '%.*s'", (int)name->s.n, name->s.s);
            }
            adv(p);
            push(p->j, &body, parse_statement(p));
        } else {
            unexpected(p, "text or a tag");
        }
    }
}

// The tree's depth bounded: a chain of operators, filters or attributes is as deep as it is long, and walking
// or running a tree recurses once a level.
static void check_depth(J *j, const Node *n, int depth);

static void check_list_depth(J *j, const Nodes *l, int depth) {
    for (int i = 0; i < l->n; i++) check_depth(j, l->v[i], depth);
}

static void check_depth(J *j, const Node *n, int depth) {
    if (!n) return;
    j->line = n->line;
    if (depth > MAX_DEPTH) fail(j, "an expression or block nested deeper than %d", MAX_DEPTH);
    check_depth(j, n->a, depth + 1);
    check_depth(j, n->b, depth + 1);
    check_depth(j, n->c, depth + 1);
    check_list_depth(j, &n->args, depth + 1);
    check_list_depth(j, &n->kw, depth + 1);
    check_list_depth(j, &n->body, depth + 1);
    check_list_depth(j, &n->orelse, depth + 1);
}

JinjaTemplate *jinja_parse(const char *src, size_t n, const char *name, char **err) {
    J *j = calloc(1, sizeof *j);
    if (!j) die("out of memory");
    j->name = name;
    j->line = 1;
    *err = NULL;
    if (setjmp(j->fail)) {
        *err = j->err;
        chunks_free(j->chunks);
        free(j);
        return NULL;
    }
    size_t bad = utf8_check(src, n);
    if (bad < n) fail(j, "not UTF-8 (byte %zu)", bad);
    // jinja2 reads "\r\n" and "\r" as "\n" and drops one newline at the end (keep_trailing_newline=False)
    char *norm = alloc(j, n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            norm[m++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else {
            norm[m++] = src[i];
        }
    }
    if (m && norm[m - 1] == '\n') m--;
    Lexer L = {.j = j, .src = norm, .n = m};
    lex(&L);
    P p = {.j = j, .t = L.t};
    j->line = 1;
    Nodes body = parse_body(&p, NULL);
    check_list_depth(j, &body, 0);
    JinjaTemplate *t = xcalloc(1, sizeof *t);
    t->body = body;
    t->chunks = j->chunks;
    t->name = xstrdup(name);
    free(j);
    return t;
}

void jinja_free(JinjaTemplate *t) {
    if (!t) return;
    chunks_free(t->chunks);
    free(t->name);
    free(t);
}

// ---------------------------------------------------------------- what a template reads

typedef int (*Visit)(const Node *n, const void *arg);

static int walk(const Node *n, Visit f, const void *arg);

static int walk_list(const Nodes *l, Visit f, const void *arg) {
    for (int i = 0; i < l->n; i++)
        if (walk(l->v[i], f, arg)) return 1;
    return 0;
}

static int walk(const Node *n, Visit f, const void *arg) {
    if (!n) return 0;
    if (f(n, arg)) return 1;
    return walk(n->a, f, arg) || walk(n->b, f, arg) || walk(n->c, f, arg) || walk_list(&n->args, f, arg) ||
           walk_list(&n->kw, f, arg) || walk_list(&n->body, f, arg) || walk_list(&n->orelse, f, arg);
}

static int loops_over_content(const Node *n, const void *arg) {
    (void)arg;
    if (n->k != S_FOR) return 0;
    const Node *it = n->a;
    if (it->k == E_ATTR) return str_eq(it->s, "content");
    return it->k == E_ITEM && it->b->k == E_LIT && it->b->lit.t == T_STR && str_eq(it->b->lit.s, "content");
}

int jinja_loops_over_content(const JinjaTemplate *t) { return walk_list(&t->body, loops_over_content, NULL); }

// ---------------------------------------------------------------- frames

static Frame *frame_new(J *j, Frame *parent) {
    Frame *f = alloc(j, sizeof *f);
    memset(f, 0, sizeof *f);
    f->parent = parent;
    return f;
}

static void frame_set(J *j, Frame *f, Str name, Value v) {
    for (size_t i = 0; i < f->n; i++)
        if (str_same(f->names[i], name)) {
            f->vals[i] = v;
            return;
        }
    size_t cap = f->cap;
    f->names = grow(j, f->names, &cap, f->n + 1, sizeof *f->names);
    f->vals = grow(j, f->vals, &f->cap, f->n + 1, sizeof *f->vals);
    f->names[f->n] = name;
    f->vals[f->n++] = v;
}

static const Value *frame_get(const Frame *f, Str name) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (str_same(f->names[i], name)) return &f->vals[i];
    return NULL;
}

static Value func(J *j, int id, Value self, Str name) {
    Func *f = alloc(j, sizeof *f);
    f->id = id;
    f->self = self;
    f->name = name;
    return (Value){.t = T_FUNC, .fn = f};
}

static Value lookup(J *j, Str name) {
    const Value *v = frame_get(j->frame, name);
    if (v) return *v;
    static const char *const globals[] = {"range", "namespace", "dict", "raise_exception", "strftime_now"};
    for (int i = 0; i < 5; i++)
        if (str_eq(name, globals[i])) return func(j, i, V(T_NONE), name);
    return vundef(name, NULL);
}

// ---------------------------------------------------------------- evaluation

typedef struct {
    Value *pos;
    int np;
    Str *names;
    Value *kw;
    int nk;
} Args;

static Value eval(J *j, const Node *n);
static void exec_body(J *j, const Nodes *b);

static Args eval_args(J *j, const Node *call) {
    Args a = {0};
    a.np = call->args.n;
    a.nk = call->kw.n;
    a.pos = alloc(j, (size_t)(a.np + 1) * sizeof *a.pos);
    a.names = alloc(j, (size_t)(a.nk + 1) * sizeof *a.names);
    a.kw = alloc(j, (size_t)(a.nk + 1) * sizeof *a.kw);
    for (int i = 0; i < a.np; i++) a.pos[i] = eval(j, call->args.v[i]);
    for (int i = 0; i < a.nk; i++) {
        a.names[i] = call->kw.v[i]->s;
        a.kw[i] = eval(j, call->kw.v[i]->a);
    }
    return a;
}

// Argument i (positional) or `name` (keyword) of a call with parameters in that order; NULL when not given.
static const Value *arg(J *j, const Args *a, int i, const char *name) {
    for (int k = 0; k < a->nk; k++)
        if (str_eq(a->names[k], name)) {
            if (i < a->np) fail(j, "got multiple values for argument '%s'", name);
            return &a->kw[k];
        }
    return i < a->np ? &a->pos[i] : NULL;
}

static void check_args(J *j, const Args *a, int max_pos, const char *const *names, const char *what) {
    if (a->np > max_pos) fail(j, "%s takes at most %d positional arguments (%d given)", what, max_pos, a->np);
    for (int k = 0; k < a->nk; k++) {
        int ok = 0;
        for (const char *const *n = names; *n; n++) ok |= str_eq(a->names[k], *n);
        if (!ok)
            fail(j, "%s got an unexpected keyword argument '%.*s'", what, (int)a->names[k].n, a->names[k].s);
    }
}

static int64_t want_int(J *j, const Value *v, const char *what) {
    if (v->t == T_INT) return v->i;
    if (v->t == T_BOOL) return v->b;
    fail(j, "%s must be an integer, not %s", what, type_name(v));
}

static Str want_str(J *j, const Value *v, const char *what) {
    if (v->t != T_STR) fail(j, "%s must be a string, not %s", what, type_name(v));
    return v->s;
}

static int arg_bool(const Value *v, int fallback) { return v ? truthy(v) : fallback; }

// A value as a list of its items: a list's values, a dict's keys, a string's characters (undefined: none).
static const List *items_of(J *j, const Value *v) {
    static const List empty = {0};
    switch (v->t) {
    case T_LIST: return v->l;
    case T_UNDEF: return &empty;
    case T_DICT: {
        Value l = vlist(j, v->d->n);
        for (size_t i = 0; i < v->d->n; i++) list_push(j, l.l, v->d->k[i]);
        return l.l;
    }
    case T_STR: {
        Value l = vlist(j, v->s.n);
        for (size_t i = 0; i < v->s.n;) {
            size_t at = i;
            cp_next(v->s, &i);
            list_push(j, l.l, vstr((Str){v->s.s + at, i - at}));
        }
        return l.l;
    }
    default: fail(j, "'%s' object is not iterable", type_name(v));
    }
}

static size_t length(J *j, const Value *v) {
    switch (v->t) {
    case T_STR: j->steps += (long)(v->s.n >> 6); return cp_count(v->s);
    case T_LIST: return v->l->n;
    case T_DICT: case T_NS: return v->d->n;
    case T_UNDEF: return 0;
    default: fail(j, "object of type '%s' has no len()", type_name(v));
    }
}

// Python's ordering of two values (numbers, strings, lists); a TypeError for others.
static int compare(J *j, const Value *a, const Value *b) {
    step(j);
    if (is_num(a) && is_num(b)) {
        if (a->t == T_INT && b->t == T_INT) return (a->i > b->i) - (a->i < b->i);
        double x = num(a), y = num(b);
        return (x > y) - (x < y);
    }
    if (a->t == T_STR && b->t == T_STR) {
        size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
        j->steps += (long)(n >> 6);
        int c = memcmp(a->s.s, b->s.s, n);
        return c ? (c > 0) - (c < 0) : (a->s.n > b->s.n) - (a->s.n < b->s.n);
    }
    if (a->t == T_LIST && b->t == T_LIST) {  // the first items that differ decide
        if (++j->depth > MAX_RUN_DEPTH) fail(j, "lists compared deeper than %d", MAX_RUN_DEPTH);
        int c = 0;
        size_t i = 0;
        while (i < a->l->n && i < b->l->n && veq(j, &a->l->v[i], &b->l->v[i])) i++;
        if (i < a->l->n && i < b->l->n) c = compare(j, &a->l->v[i], &b->l->v[i]);
        else c = (a->l->n > b->l->n) - (a->l->n < b->l->n);
        j->depth--;
        return c;
    }
    if (a->t == T_UNDEF) fail_undef(j, a);
    if (b->t == T_UNDEF) fail_undef(j, b);
    fail(j, "'<' not supported between instances of '%s' and '%s'", type_name(a), type_name(b));
}

static int key_cmp(const void *a, const void *b) {
    const Value *x = a, *y = b;
    size_t n = x->s.n < y->s.n ? x->s.n : y->s.n;
    int c = memcmp(x->s.s, y->s.s, n);
    return c ? c : (x->s.n > y->s.n) - (x->s.n < y->s.n);
}

static int contains(J *j, const Value *hay, const Value *needle) {
    if (hay->t == T_STR) {
        if (needle->t != T_STR)
            fail(j, "'in <string>' requires string as left operand, not %s", type_name(needle));
        j->steps += (long)(hay->s.n >> 6);
        return find(hay->s, needle->s, 0) != NULL;
    }
    if (hay->t == T_DICT || hay->t == T_NS) {
        return dict_find(j, hay->d, needle) != NULL;
    }
    if (hay->t == T_UNDEF) return 0;
    const List *l = items_of(j, hay);
    j->steps += (long)l->n;
    for (size_t i = 0; i < l->n; i++)
        if (veq(j, &l->v[i], needle)) return 1;
    return 0;
}

static int64_t checked(J *j, int overflow, int64_t r) {
    if (overflow) fail(j, "integer overflow (grpo's integers are 64-bit)");
    return r;
}

static Value concat(J *j, Str a, Str b) {
    SB s = {0};
    sb_put(j, &s, a.s, a.n);
    sb_put(j, &s, b.s, b.n);
    return vstr(sb_str(&s));
}

static Value repeat(J *j, const Value *seq, int64_t times) {
    if (times < 0 || (seq->t == T_STR ? seq->s.n : seq->l->n) == 0) times = 0;
    if (seq->t == T_STR) {
        if (seq->s.n && (uint64_t)times > MAX_OUTPUT / seq->s.n)
            fail(j, "a string of the template grows past %zu MiB", MAX_OUTPUT >> 20);
        SB s = {0};
        for (int64_t i = 0; i < times; i++) sb_put(j, &s, seq->s.s, seq->s.n);
        return vstr(sb_str(&s));
    }
    if (seq->l->n && (uint64_t)times > MAX_OUTPUT / 16 / seq->l->n)
        fail(j, "a list of the template grows too long");
    Value r = vlist(j, seq->l->n * (size_t)times);
    for (int64_t i = 0; i < times; i++) {
        step(j);
        for (size_t k = 0; k < seq->l->n; k++) list_push(j, r.l, seq->l->v[k]);
    }
    return r;
}

static Value arith(J *j, int op, Value a, Value b) {
    if (op == '~') {  // str() of each: an undefined one is ''
        SB s = {0};
        to_str(j, &s, &a);
        to_str(j, &s, &b);
        return vstr(sb_str(&s));
    }
    if (a.t == T_UNDEF) fail_undef(j, &a);
    if (b.t == T_UNDEF) fail_undef(j, &b);
    if (is_num(&a) && is_num(&b)) {
        int ints = a.t != T_FLOAT && b.t != T_FLOAT;
        int64_t x = a.t == T_INT ? a.i : a.b, y = b.t == T_INT ? b.i : b.b, r = 0;
        double fx = num(&a), fy = num(&b);
        switch (op) {
        case '+':
            if (!ints) return vfloat(fx + fy);
            checked(j, __builtin_add_overflow(x, y, &r), 0);
            return vint(r);
        case '-':
            if (!ints) return vfloat(fx - fy);
            checked(j, __builtin_sub_overflow(x, y, &r), 0);
            return vint(r);
        case '*':
            if (!ints) return vfloat(fx * fy);
            checked(j, __builtin_mul_overflow(x, y, &r), 0);
            return vint(r);
        case '/':
            if (fy == 0) fail(j, "division by zero");
            return vfloat(fx / fy);
        case 'F': case '%':
            if (fy == 0) fail(j, op == 'F' ? "integer division or modulo by zero" : "modulo by zero");
            if (ints) {
                if (x == INT64_MIN && y == -1) checked(j, 1, 0);
                int64_t q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) q--, m += y;
                return vint(op == 'F' ? q : m);
            } else {
                double m = fmod(fx, fy);
                if (m && ((m < 0) != (fy < 0))) m += fy;
                return vfloat(op == 'F' ? floor(fx / fy) : m);
            }
        case 'P':
            if (ints && y >= 0) {
                if (x == 0 || x == 1) return vint(y == 0 ? 1 : x);
                if (x == -1) return vint(y % 2 ? -1 : 1);
                int64_t acc = 1;  // |x| >= 2: overflows within 63 steps
                for (int64_t i = 0; i < y; i++) checked(j, __builtin_mul_overflow(acc, x, &acc), 0);
                return vint(acc);
            }
            return vfloat(pow(fx, fy));
        }
    }
    if (op == '+' && a.t == T_STR && b.t == T_STR) return concat(j, a.s, b.s);
    if (op == '+' && a.t == T_LIST && b.t == T_LIST) {
        Value r = vlist(j, a.l->n + b.l->n);
        for (size_t i = 0; i < a.l->n; i++) list_push(j, r.l, a.l->v[i]);
        for (size_t i = 0; i < b.l->n; i++) list_push(j, r.l, b.l->v[i]);
        r.l->tuple = a.l->tuple;
        return r;
    }
    if (op == '*' && (a.t == T_STR || a.t == T_LIST) && (b.t == T_INT || b.t == T_BOOL))
        return repeat(j, &a, want_int(j, &b, "n"));
    if (op == '*' && (b.t == T_STR || b.t == T_LIST) && (a.t == T_INT || a.t == T_BOOL))
        return repeat(j, &b, want_int(j, &a, "n"));
    if (op == '%' && a.t == T_STR) fail(j, "%%-formatting of strings is not supported");
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    const char *ops = "+-*/F%P";
    fail(j, "unsupported operand type(s) for %s: '%s' and '%s'", names[strchr(ops, op) - ops], type_name(&a),
         type_name(&b));
}

// Python's slice of n items: the indices it picks.
static size_t slice_indices(J *j, size_t n, const Value *start, const Value *stop, const Value *stepv,
                            int64_t **out) {
    int64_t st = stepv && stepv->t != T_NONE ? want_int(j, stepv, "a slice's step") : 1;
    if (st == 0) fail(j, "slice step cannot be zero");
    int64_t len = (int64_t)n, lo, hi;
    int64_t def_lo = st > 0 ? 0 : len - 1, def_hi = st > 0 ? len : -1;
    lo = start && start->t != T_NONE ? want_int(j, start, "a slice index") : def_lo;
    hi = stop && stop->t != T_NONE ? want_int(j, stop, "a slice index") : def_hi;
    if (start && start->t != T_NONE) {
        if (lo < 0) lo += len;
        if (lo < 0) lo = st > 0 ? 0 : -1;
        if (lo > len - (st < 0)) lo = st > 0 ? len : len - 1;
    }
    if (stop && stop->t != T_NONE) {
        if (hi < 0) hi += len;
        if (hi < 0) hi = st > 0 ? 0 : -1;
        if (hi > len) hi = len;
    }
    size_t k = 0;
    *out = alloc(j, (n + 1) * sizeof **out);
    for (int64_t i = lo; st > 0 ? i < hi : i > hi;) {
        (*out)[k++] = i;
        if (__builtin_add_overflow(i, st, &i)) break;  // the next index is past any end
    }
    return k;
}

static Value slice(J *j, const Value *seq, const Value *a, const Value *b, const Value *c) {
    if (seq->t == T_UNDEF) fail_undef(j, seq);
    int64_t *idx;
    if (seq->t == T_STR) {
        j->steps += (long)(seq->s.n >> 6);
        size_t n, *off = cp_offsets(j, seq->s, &n);
        size_t k = slice_indices(j, n, a, b, c, &idx);
        SB s = {0};
        for (size_t i = 0; i < k; i++) sb_put(j, &s, seq->s.s + off[idx[i]], off[idx[i] + 1] - off[idx[i]]);
        return vstr(sb_str(&s));
    }
    if (seq->t != T_LIST) fail(j, "'%s' object is not subscriptable", type_name(seq));
    size_t k = slice_indices(j, seq->l->n, a, b, c, &idx);
    Value r = vlist(j, k);
    for (size_t i = 0; i < k; i++) list_push(j, r.l, seq->l->v[idx[i]]);
    r.l->tuple = seq->l->tuple;
    return r;
}

static const char *const STR_METHODS[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower", "title",
    "capitalize", "replace", "find", "rfind", "count", "join", "isdigit", "isalpha", "isspace", "splitlines",
    "format", NULL};
static const char *const LIST_METHODS[] = {"index",  "count", "append",  "pop",   "extend", "insert",
                                           "remove", "sort",  "reverse", "clear", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", "pop", "update", "setdefault",
                                           "clear", "copy", "popitem", NULL};

static int has_method(const Value *v, Str name) {
    if (v->t == T_STR) return known(STR_METHODS, name);
    if (v->t == T_LIST) return known(LIST_METHODS, name);
    if (v->t == T_DICT) return known(DICT_METHODS, name);
    if (v->t == T_LOOP) return str_eq(name, "cycle");
    return 0;
}

// obj.name (jinja2's getattr: an attribute or method first, then an item).
static Value getattr_(J *j, const Value *obj, Str name) {
    if (obj->t == T_UNDEF) fail_undef(j, obj);
    if (has_method(obj, name)) return func(j, obj->t == T_LOOP ? F_CYCLE : F_METHOD, *obj, name);
    if (obj->t == T_DICT || obj->t == T_NS) {
        Value k = vstr(name);
        const Value *v = dict_find(j, obj->d, &k);
        if (v) return *v;
    }
    if (obj->t == T_LOOP) {
        const Loop *lp = obj->lp;
        int64_t i = (int64_t)lp->i, n = (int64_t)lp->items->n;
        static const char *const names[] = {"index",  "index0", "revindex", "revindex0", "first",   "last",
                                            "length", "depth",  "depth0",   "previtem",  "nextitem"};
        int k = -1;
        for (int q = 0; q < 11; q++)
            if (str_eq(name, names[q])) k = q;
        switch (k) {
        case 0: return vint(i + 1);
        case 1: return vint(i);
        case 2: return vint(n - i);
        case 3: return vint(n - i - 1);
        case 4: return vbool(i == 0);
        case 5: return vbool(i == n - 1);
        case 6: return vint(n);
        case 7: return vint(1);
        case 8: return vint(0);
        case 9: return i > 0 ? lp->items->v[i - 1] : vundef(S("there is no previous item"), NULL);
        case 10: return i + 1 < n ? lp->items->v[i + 1] : vundef(S("there is no next item"), NULL);
        }
    }
    return vundef(name, type_name(obj));
}

// obj[key] (jinja2's getitem: an item first, then an attribute for a string key).
static Value getitem(J *j, const Value *obj, const Value *key) {
    if (obj->t == T_UNDEF) fail_undef(j, obj);
    if (obj->t == T_DICT) {
        const Value *v = dict_find(j, obj->d, key);
        if (v) return *v;
    } else if ((obj->t == T_LIST || obj->t == T_STR) && (key->t == T_INT || key->t == T_BOOL)) {
        int64_t i = key->t == T_INT ? key->i : key->b;
        if (obj->t == T_LIST) {
            int64_t n = (int64_t)obj->l->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) return obj->l->v[i];
        } else {
            j->steps += (long)(obj->s.n >> 6);
            if (i < 0) i += (int64_t)cp_count(obj->s);
            for (size_t at = 0, k = 0; i >= 0 && at < obj->s.n; k++) {  // the i-th character
                size_t start = at;
                cp_next(obj->s, &at);
                if ((int64_t)k == i) return vstr((Str){obj->s.s + start, at - start});
            }
        }
    }
    if (key->t == T_STR) return getattr_(j, obj, key->s);
    return vundef(S("item"), type_name(obj));
}

static Value call_value(J *j, const Value *f, Args *a);
static int test(J *j, Str name, const Value *v, const Args *a);
static Value filter(J *j, Str name, const Value *v, Args *a);

static Value split(J *j, Str s, const Value *sepv, const Value *maxv, int right) {
    j->steps += (long)(s.n >> 6);
    int64_t max = maxv && maxv->t != T_NONE ? want_int(j, maxv, "maxsplit") : -1;
    Value r = vlist(j, 4);
    if (!sepv || sepv->t == T_NONE) {  // runs of whitespace, no empty strings
        j->steps += (long)s.n;
        size_t i = 0;
        Value parts = vlist(j, 4);
        while (i < s.n) {
            size_t at = i, k = i;
            if (py_space(cp_next(s, &k))) {
                i = k;
                continue;
            }
            while (i < s.n) {
                k = i;
                if (py_space(cp_next(s, &k))) break;
                i = k;
            }
            list_push(j, parts.l, vstr((Str){s.s + at, i - at}));
        }
        if (max < 0 || (size_t)max >= parts.l->n) return parts;
        // maxsplit: the first (last) max words, then the rest as it is from (up to) the next word
        if (!right) {
            for (int64_t q = 0; q < max; q++) list_push(j, r.l, parts.l->v[q]);
            const char *rest = parts.l->v[max].s.s;
            list_push(j, r.l, vstr((Str){rest, (size_t)(s.s + s.n - rest)}));
        } else {
            size_t first = parts.l->n - (size_t)max;
            Str last = parts.l->v[first - 1].s;
            list_push(j, r.l, vstr((Str){s.s, (size_t)(last.s + last.n - s.s)}));
            for (size_t q = first; q < parts.l->n; q++) list_push(j, r.l, parts.l->v[q]);
        }
        return r;
    }
    Str sep = want_str(j, sepv, "the separator");
    if (!sep.n) fail(j, "empty separator");
    if (!right) {
        size_t at = 0;
        const char *hit;
        while ((max < 0 || (int64_t)r.l->n < max) && (hit = find(s, sep, at))) {
            list_push(j, r.l, vstr((Str){s.s + at, (size_t)(hit - s.s) - at}));
            at = (size_t)(hit - s.s) + sep.n;
        }
        list_push(j, r.l, vstr((Str){s.s + at, s.n - at}));
        return r;
    }
    Value rev = vlist(j, 4);  // right to left, then reversed
    size_t end = s.n;
    while (max < 0 || (int64_t)rev.l->n < max) {
        const char *hit = find_last(j, s, sep, end);
        if (!hit) break;
        list_push(j, rev.l, vstr((Str){hit + sep.n, end - (size_t)(hit - s.s) - sep.n}));
        end = (size_t)(hit - s.s);
    }
    list_push(j, r.l, vstr((Str){s.s, end}));
    for (size_t i = rev.l->n; i-- > 0;) list_push(j, r.l, rev.l->v[i]);
    return r;
}

static Value replace(J *j, Str s, Str old, Str new, int64_t count) {
    j->steps += (long)(s.n >> 6);
    SB b = {0};
    size_t at = 0;
    int64_t done = 0;
    if (!old.n) {  // between every character and at both ends
        for (size_t i = 0; i <= s.n && (count < 0 || done < count);) {
            sb_put(j, &b, new.s, new.n);
            done++;
            if (i == s.n) {
                at = s.n;
                break;
            }
            size_t k = i;
            cp_next(s, &k);
            sb_put(j, &b, s.s + i, k - i);
            i = at = k;
        }
        sb_put(j, &b, s.s + at, s.n - at);
        return vstr(sb_str(&b));
    }
    const char *hit;
    while ((count < 0 || done < count) && (hit = find(s, old, at))) {
        sb_put(j, &b, s.s + at, (size_t)(hit - s.s) - at);
        sb_put(j, &b, new.s, new.n);
        at = (size_t)(hit - s.s) + old.n;
        done++;
    }
    sb_put(j, &b, s.s + at, s.n - at);
    return vstr(sb_str(&b));
}

// 'u' upper, 'l' lower, 'c' capitalize, 't' str.title (a word: letters), 'T' jinja2's title filter (a word
// starts after whitespace or one of -({[<). Simple case mappings (utf8proc): "ß" stays one character.
static Value change_case(J *j, Str s, int mode) {
    j->steps += (long)s.n;
    SB b = {0};
    int word_start = 1, first = 1;
    for (size_t i = 0; i < s.n;) {
        int32_t c = cp_next(s, &i);
        int up = mode == 'u' || ((mode == 't' || mode == 'T') && word_start) || (mode == 'c' && first);
        int32_t d = up ? utf8proc_toupper(c) : utf8proc_tolower(c);
        sb_cp(j, &b, d);
        utf8proc_category_t cat = utf8proc_category(c);
        if (mode == 'T') word_start = py_space(c) || (c > 0 && c < 128 && strchr("-({[<", (int)c));
        else word_start = !(cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO);
        first = 0;
    }
    return vstr(sb_str(&b));
}

static int affix(J *j, Str s, const Value *what, int end) {
    const List *l = what->t == T_LIST ? what->l : NULL;
    size_t n = l ? l->n : 1;
    for (size_t i = 0; i < n; i++) {
        Str a = want_str(j, l ? &l->v[i] : what, end ? "endswith's argument" : "startswith's argument");
        j->steps += (long)(a.n >> 6);
        if (a.n <= s.n && !memcmp(end ? s.s + s.n - a.n : s.s, a.s, a.n)) return 1;
    }
    return 0;
}

static int64_t cp_index(Str s, const char *at) { return (int64_t)cp_count((Str){s.s, (size_t)(at - s.s)}); }

static Value str_method(J *j, Str s, Str m, Args *a) {
    const Value *x = arg(j, a, 0, "x"), *y = arg(j, a, 1, "y");
    if (str_eq(m, "strip") || str_eq(m, "lstrip") || str_eq(m, "rstrip")) {
        Str chars = x && x->t != T_NONE ? want_str(j, x, "chars") : S("");
        int which = m.s[0] == 'l' ? 1 : m.s[0] == 'r' ? 2 : 3;
        return vstr(str_strip(j, s, which, x && x->t != T_NONE ? &chars : NULL));
    }
    if (str_eq(m, "split") || str_eq(m, "rsplit")) {
        return split(j, s, arg(j, a, 0, "sep"), arg(j, a, 1, "maxsplit"), m.s[0] == 'r');
    }
    if (str_eq(m, "startswith") || str_eq(m, "endswith")) {
        if (!x) fail(j, "%.*s() takes at least 1 argument", (int)m.n, m.s);
        return vbool(affix(j, s, x, m.s[0] == 'e'));
    }
    if (str_eq(m, "upper") || str_eq(m, "lower") || str_eq(m, "title") || str_eq(m, "capitalize"))
        return change_case(j, s, m.s[0] == 'c' ? 'c' : m.s[0]);
    if (str_eq(m, "replace")) {
        if (!x || !y) fail(j, "replace() takes at least 2 arguments");
        const Value *c = arg(j, a, 2, "count");
        return replace(j, s, want_str(j, x, "old"), want_str(j, y, "new"), c ? want_int(j, c, "count") : -1);
    }
    if (str_eq(m, "find") || str_eq(m, "rfind") || str_eq(m, "count")) {
        if (!x) fail(j, "%.*s() takes at least 1 argument", (int)m.n, m.s);
        Str sub = want_str(j, x, "sub");
        if (m.s[0] == 'c') {
            int64_t n = 0;
            j->steps += (long)(s.n >> 6);
            if (!sub.n) return vint((int64_t)cp_count(s) + 1);
            for (const char *h = find(s, sub, 0); h; h = find(s, sub, (size_t)(h - s.s) + sub.n)) n++;
            return vint(n);
        }
        j->steps += (long)(s.n >> 6);
        const char *hit = m.s[0] == 'r' ? find_last(j, s, sub, s.n) : find(s, sub, 0);
        return vint(hit ? cp_index(s, hit) : -1);
    }
    if (str_eq(m, "join")) {
        if (!x) fail(j, "join() takes exactly one argument");
        const List *l = items_of(j, x);
        SB b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) sb_put(j, &b, s.s, s.n);
            Str e = want_str(j, &l->v[i], "a joined item");
            sb_put(j, &b, e.s, e.n);
        }
        return vstr(sb_str(&b));
    }
    j->steps += (long)(s.n >> 6);  // every method below reads s once (or a bounded number of times)
    if (str_eq(m, "isdigit") || str_eq(m, "isalpha") || str_eq(m, "isspace")) {
        j->steps += (long)s.n;
        int ok = s.n > 0;
        for (size_t i = 0; i < s.n && ok;) {
            int32_t c = cp_next(s, &i);
            utf8proc_category_t cat = utf8proc_category(c);
            ok = m.s[2] == 'd'   ? cat == UTF8PROC_CATEGORY_ND
                 : m.s[2] == 'a' ? (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO)
                                 : py_space(c);
        }
        return vbool(ok);
    }
    if (str_eq(m, "splitlines")) {
        j->steps += (long)s.n;
        Value r = vlist(j, 4);
        size_t at = 0;
        for (size_t i = 0; i < s.n;) {
            size_t k = i;
            int32_t c = cp_next(s, &k);
            int nl = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e) ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
            if (nl) {
                list_push(j, r.l, vstr((Str){s.s + at, i - at}));
                if (c == '\r' && k < s.n && s.s[k] == '\n') k++;
                at = k;
            }
            i = k;
        }
        if (at < s.n) list_push(j, r.l, vstr((Str){s.s + at, s.n - at}));
        return r;
    }
    fail(j, "str.%.*s() is not supported", (int)m.n, m.s);
}

static GRPO_NORETURN void unsafe(J *j, Str m, const Value *self) {
    fail(j, "access to attribute '%.*s' of '%s' object is unsafe.", (int)m.n, m.s, type_name(self));
}

static Value method(J *j, const Value *self, Str m, Args *a) {
    if (self->t == T_STR) return str_method(j, self->s, m, a);
    const Value *x = arg(j, a, 0, "x");
    if (self->t == T_LIST) {
        if (!str_eq(m, "index") && !str_eq(m, "count")) unsafe(j, m, self);
        j->steps += (long)self->l->n;
        if (!x) fail(j, "%.*s() takes exactly one argument", (int)m.n, m.s);
        int64_t n = 0;
        for (size_t i = 0; i < self->l->n; i++)
            if (veq(j, &self->l->v[i], x)) {
                if (m.s[0] == 'i') return vint((int64_t)i);
                n++;
            }
        if (m.s[0] == 'i') fail(j, "list.index(x): x not in list");
        return vint(n);
    }
    if (self->t == T_LOOP) {  // loop.cycle(a, b, ...)
        if (!a->np) fail(j, "no items for cycling given");
        return a->pos[self->lp->i % (size_t)a->np];
    }
    const Dict *d = self->d;
    if (str_eq(m, "get")) {
        if (!x) fail(j, "get() takes at least 1 argument");
        const Value *v = dict_find(j, d, x), *fallback = arg(j, a, 1, "default");
        return v ? *v : fallback ? *fallback : V(T_NONE);
    }
    int which = str_eq(m, "items") ? 2 : str_eq(m, "keys") ? 0 : str_eq(m, "values") ? 1 : -1;
    if (which < 0) unsafe(j, m, self);
    Value r = vlist(j, d->n);
    for (size_t i = 0; i < d->n; i++) {
        if (which < 2) {
            list_push(j, r.l, which ? d->v[i] : d->k[i]);
            continue;
        }
        Value pair = vlist(j, 2);
        pair.l->tuple = 1;
        list_push(j, pair.l, d->k[i]);
        list_push(j, pair.l, d->v[i]);
        list_push(j, r.l, pair);
    }
    return r;
}

static Value call_macro(J *j, const Macro *m, Args *a, const Value *caller) {
    if (++j->calls > MAX_CALLS) fail(j, "macros call each other deeper than %d", MAX_CALLS);
    const Node *def = m->def;
    Frame *saved = j->frame;
    Frame *f = frame_new(j, m->closure);
    j->frame = f;
    int np = def->args.n;
    Value varargs = vlist(j, 0), kwargs = vdict(j);
    varargs.l->tuple = 1;
    for (int i = 0; i < a->np; i++)
        if (i >= np) list_push(j, varargs.l, a->pos[i]);
    for (int i = 0; i < np; i++) {
        const Node *param = def->args.v[i];
        const Value *given = NULL;
        for (int k = 0; k < a->nk; k++)
            if (str_same(a->names[k], param->s)) given = &a->kw[k];
        if (i < a->np) given = &a->pos[i];
        Value v = given ? *given : param->a ? eval(j, param->a) : vundef(param->s, NULL);
        frame_set(j, f, param->s, v);
    }
    for (int k = 0; k < a->nk; k++) {
        int named = str_eq(a->names[k], "caller");
        for (int i = 0; i < np; i++) named |= str_same(a->names[k], def->args.v[i]->s);
        if (!named) dict_set(j, kwargs.d, vstr(a->names[k]), a->kw[k]);
    }
    frame_set(j, f, S("varargs"), varargs);
    frame_set(j, f, S("kwargs"), kwargs);
    if (caller) frame_set(j, f, S("caller"), *caller);
    size_t start = j->out.len;
    exec_body(j, &def->body);
    Str text = str_copy(j, j->out.data ? j->out.data + start : "", j->out.len - start);
    j->out.len = start;
    j->frame = saved;
    j->calls--;
    return vstr(text);
}

static Value range(J *j, const Args *a) {
    if (a->np < 1 || a->np > 3 || a->nk) fail(j, "range() takes 1 to 3 integer arguments");
    int64_t lo = 0, hi, st = 1;
    if (a->np == 1) hi = want_int(j, &a->pos[0], "range()'s argument");
    else
        lo = want_int(j, &a->pos[0], "range()'s argument"),
        hi = want_int(j, &a->pos[1], "range()'s argument");
    if (a->np == 3) st = want_int(j, &a->pos[2], "range()'s step");
    if (st == 0) fail(j, "range() arg 3 must not be zero");
    double n = ceil(((double)hi - (double)lo) / (double)st);
    if (n > MAX_RANGE)
        fail(j, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
    Value r = vlist(j, n > 0 ? (size_t)n : 0);
    for (int64_t i = lo; st > 0 ? i < hi : i > hi;) {
        list_push(j, r.l, vint(i));
        if (__builtin_add_overflow(i, st, &i)) break;
    }
    return r;
}

static Value call_value(J *j, const Value *f, Args *a) {
    if (f->t == T_MACRO) {
        const Value *caller = NULL;
        for (int k = 0; k < a->nk; k++)
            if (str_eq(a->names[k], "caller")) caller = &a->kw[k];
        return call_macro(j, f->m, a, caller);
    }
    if (f->t == T_UNDEF) fail_undef(j, f);
    if (f->t != T_FUNC) fail(j, "'%s' object is not callable", type_name(f));
    const Func *fn = f->fn;
    switch (fn->id) {
    case F_RANGE: return range(j, a);
    case F_NAMESPACE: case F_DICT: {
        Value d = vdict(j);
        if (a->np > 1)
            fail(j, "%s() takes at most one positional argument", fn->id == F_DICT ? "dict" : "namespace");
        if (a->np == 1) {
            if (a->pos[0].t != T_DICT)
                fail(j, "%s()'s argument must be a mapping", fn->id == F_DICT ? "dict" : "namespace");
            for (size_t i = 0; i < a->pos[0].d->n; i++)
                dict_set(j, d.d, a->pos[0].d->k[i], a->pos[0].d->v[i]);
        }
        for (int i = 0; i < a->nk; i++) dict_set(j, d.d, vstr(a->names[i]), a->kw[i]);
        if (fn->id == F_NAMESPACE) d.t = T_NS;
        return d;
    }
    case F_RAISE: {
        Str msg = a->np ? str_of(j, &a->pos[0]) : S("");
        fail_msg(j, xprintf("%s: %.*s", j->name, (int)msg.n, msg.s));
    }
    case F_STRFTIME: {
        if (a->np != 1) fail(j, "strftime_now() takes exactly one argument");
        Str fmt = want_str(j, &a->pos[0], "strftime_now()'s format");
        const char *z = str_copy(j, fmt.s, fmt.n).s;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char out[512];
        size_t n = fmt.n ? strftime(out, sizeof out, z, &tm) : 0;
        if (fmt.n && !n) fail(j, "strftime_now(): the format gives nothing or over 511 bytes");
        return vstr(str_copy(j, out, n));
    }
    default: return method(j, &fn->self, fn->name, a);
    }
}

static void assign(J *j, const Node *target, Value v) {
    if (target->k == E_ATTR) {  // {% set ns.x = v %}
        Value ns = eval(j, target->a);
        if (ns.t != T_NS) fail(j, "cannot assign attribute on non-namespace object");
        dict_set(j, ns.d, vstr(target->s), v);
        return;
    }
    frame_set(j, j->frame, target->s, v);
}

static void assign_targets(J *j, const Node *n, Value v) {
    if (!n->op) return assign(j, n->args.v[0], v);
    const List *l = items_of(j, &v);
    if ((int)l->n != n->args.n)
        fail(j, "%s values to unpack (expected %d, got %zu)",
             (int)l->n > n->args.n ? "too many" : "not enough", n->args.n, l->n);
    for (int i = 0; i < n->args.n; i++) assign(j, n->args.v[i], l->v[i]);
}

static Value eval_node(J *j, const Node *n);

static Value eval(J *j, const Node *n) {
    if (++j->depth > MAX_RUN_DEPTH) fail(j, "evaluations nested deeper than %d", MAX_RUN_DEPTH);
    Value v = eval_node(j, n);
    j->depth--;
    return v;
}

static Value eval_node(J *j, const Node *n) {
    step(j);
    j->line = n->line;
    switch (n->k) {
    case E_LIT: return n->lit;
    case E_HOLE: return j->hole;
    case E_NAME: return lookup(j, n->s);
    case E_ATTR: {
        Value o = eval(j, n->a);
        return getattr_(j, &o, n->s);
    }
    case E_ITEM: {
        Value o = eval(j, n->a), k = eval(j, n->b);
        return getitem(j, &o, &k);
    }
    case E_SLICE: {
        Value o = eval(j, n->a);
        Value a = n->b ? eval(j, n->b) : V(T_NONE), b = n->c ? eval(j, n->c) : V(T_NONE);
        Value c = n->args.n ? eval(j, n->args.v[0]) : V(T_NONE);
        return slice(j, &o, &a, &b, &c);
    }
    case E_CALL: {
        if (n->a->k == E_ATTR) {
            Value o = eval(j, n->a->a);
            if (has_method(&o, n->a->s)) {
                Args a = eval_args(j, n);
                j->line = n->line;
                return method(j, &o, n->a->s, &a);
            }
        }
        Value f = eval(j, n->a);
        Args a = eval_args(j, n);
        j->line = n->line;
        return call_value(j, &f, &a);
    }
    case E_FILTER: {
        Value v = n->a ? eval(j, n->a) : j->hole;
        Args a = eval_args(j, n);
        j->line = n->line;
        return filter(j, n->s, &v, &a);
    }
    case E_TEST: {
        Value v = eval(j, n->a);
        Args a = eval_args(j, n);
        j->line = n->line;
        return vbool(test(j, n->s, &v, &a) != n->op);
    }
    case E_NEG: case E_POS: {
        Value v = eval(j, n->a);
        if (v.t == T_UNDEF) fail_undef(j, &v);
        if (!is_num(&v))
            fail(j, "bad operand type for unary %c: '%s'", n->k == E_NEG ? '-' : '+', type_name(&v));
        if (n->k == E_POS) return v.t == T_BOOL ? vint(v.b) : v;
        if (v.t == T_FLOAT) return vfloat(-v.f);
        int64_t i = v.t == T_INT ? v.i : v.b;
        if (i == INT64_MIN) checked(j, 1, 0);
        return vint(-i);
    }
    case E_NOT: {
        Value v = eval(j, n->a);
        return vbool(!truthy(&v));
    }
    case E_AND: case E_OR: {
        Value a = eval(j, n->a);
        if (truthy(&a) == (n->k == E_OR)) return a;
        return eval(j, n->b);
    }
    case E_COND: {
        Value c = eval(j, n->b);
        if (truthy(&c)) return eval(j, n->a);
        return n->c ? eval(j, n->c) : vundef(S("the if expression's else"), NULL);
    }
    case E_LIST: case E_TUPLE: {
        Value l = vlist(j, (size_t)n->args.n);
        for (int i = 0; i < n->args.n; i++) list_push(j, l.l, eval(j, n->args.v[i]));
        l.l->tuple = n->k == E_TUPLE;
        return l;
    }
    case E_DICT: {
        Value d = vdict(j);
        for (int i = 0; i < n->args.n; i++) {
            Value k = eval(j, n->args.v[i]);
            dict_set(j, d.d, k, eval(j, n->kw.v[i]));
        }
        return d;
    }
    case E_BIN: {
        Value a = eval(j, n->a), b = eval(j, n->b);
        j->line = n->line;
        switch (n->op) {
        case 'e': return vbool(veq(j, &a, &b));
        case 'n': return vbool(!veq(j, &a, &b));
        case '<': return vbool(compare(j, &a, &b) < 0);
        case 'l': return vbool(compare(j, &a, &b) <= 0);
        case '>': return vbool(compare(j, &a, &b) > 0);
        case 'g': return vbool(compare(j, &a, &b) >= 0);
        case 'i': return vbool(contains(j, &b, &a));
        case 'I': return vbool(!contains(j, &b, &a));
        default: return arith(j, n->op, a, b);
        }
    }
    default: fail(j, "internal: node %d is not an expression", n->k);
    }
}

static void emit(J *j, const char *s, size_t n) {
    if (j->out.len + n > MAX_OUTPUT) fail(j, "the rendering grows past %zu MiB", MAX_OUTPUT >> 20);
    buf_append(&j->out, s, n);
}

static void emit_value(J *j, const Value *v) {
    if (v->t == T_STR) return emit(j, v->s.s, v->s.n);
    SB b = {0};
    to_str(j, &b, v);
    emit(j, b.s, b.n);
}

// What body writes, as a string (taken back out of the output).
static Str capture(J *j, const Nodes *body) {
    size_t start = j->out.len;
    exec_body(j, body);
    Str s = str_copy(j, j->out.data ? j->out.data + start : "", j->out.len - start);
    j->out.len = start;
    return s;
}

static void exec_for(J *j, const Node *n) {
    Value seqv = eval(j, n->a);
    if (seqv.t == T_NONE) fail(j, "'NoneType' object is not iterable");
    const List *all = items_of(j, &seqv);
    Frame *saved = j->frame;
    j->frame = frame_new(j, saved);  // where the `if` filter sees each item
    const List *items = all;
    if (n->b) {  // for x in xs if cond: the loop sees only the items that pass
        Value kept = vlist(j, all->n);
        for (size_t i = 0; i < all->n; i++) {
            assign_targets(j, n, all->v[i]);
            Value c = eval(j, n->b);
            if (truthy(&c)) list_push(j, kept.l, all->v[i]);
        }
        items = kept.l;
    }
    Loop *lp = alloc(j, sizeof *lp);
    lp->items = items;
    Frame *f = frame_new(j, saved);  // emptied each iteration: it starts from the enclosing scope, as jinja2's
    for (lp->i = 0; lp->i < items->n; lp->i++) {
        step(j);
        f->n = 0;
        j->frame = f;
        assign_targets(j, n, items->v[lp->i]);
        frame_set(j, j->frame, S("loop"), (Value){.t = T_LOOP, .lp = lp});
        exec_body(j, &n->body);
        if (j->ctl == CTL_BREAK) {
            j->ctl = CTL_NONE;
            break;
        }
        j->ctl = CTL_NONE;
    }
    j->frame = saved;
    if (!items->n) exec_body(j, &n->orelse);
}

static void exec(J *j, const Node *n) {
    step(j);
    j->line = n->line;
    switch (n->k) {
    case S_TEXT: return emit(j, n->s.s, n->s.n);
    case S_OUT: {
        Value v = eval(j, n->a);
        return emit_value(j, &v);
    }
    case S_IF: {
        Value c = eval(j, n->a);
        return exec_body(j, truthy(&c) ? &n->body : &n->orelse);
    }
    case S_FOR: return exec_for(j, n);
    case S_SET: return assign_targets(j, n, eval(j, n->a));
    case S_SETBLOCK: {
        Value v = vstr(capture(j, &n->body));
        if (n->a) {
            Value saved = j->hole;
            j->hole = v;
            v = eval(j, n->a);
            j->hole = saved;
        }
        return assign(j, n->args.v[0], v);
    }
    case S_MACRO: {
        Macro *m = alloc(j, sizeof *m);
        m->def = n;
        m->closure = j->frame;
        return frame_set(j, j->frame, n->s, (Value){.t = T_MACRO, .m = m});
    }
    case S_CALLBLOCK: {
        Macro *m = alloc(j, sizeof *m);
        m->def = n;
        m->closure = j->frame;
        Value caller = {.t = T_MACRO, .m = m};
        const Node *call = n->a;
        Value f = eval(j, call->a);
        Args a = eval_args(j, call);
        if (f.t != T_MACRO) fail(j, "{%% call %%} needs a macro");
        Value r = call_macro(j, f.m, &a, &caller);
        return emit_value(j, &r);
    }
    case S_FILTERBLOCK: {
        Value saved = j->hole;
        j->hole = vstr(capture(j, &n->body));
        Value v = eval(j, n->a);
        j->hole = saved;
        return emit_value(j, &v);
    }
    case S_BREAK: j->ctl = CTL_BREAK; return;
    case S_CONTINUE: j->ctl = CTL_CONTINUE; return;
    case S_WITH: {
        Frame *saved = j->frame;
        j->frame = frame_new(j, saved);
        for (int i = 0; i < n->kw.n; i++) frame_set(j, j->frame, n->kw.v[i]->s, eval(j, n->kw.v[i]->a));
        exec_body(j, &n->body);
        j->frame = saved;
        return;
    }
    case S_BLOCK: return exec_body(j, &n->body);
    default: fail(j, "internal: node %d is not a statement", n->k);
    }
}

static void exec_body(J *j, const Nodes *b) {
    if (++j->depth > MAX_RUN_DEPTH) fail(j, "blocks nested deeper than %d", MAX_RUN_DEPTH);
    for (int i = 0; i < b->n && !j->ctl; i++) exec(j, b->v[i]);
    j->depth--;
}

// ---------------------------------------------------------------- tests and filters

static int test(J *j, Str name, const Value *v, const Args *a) {
    const Value *x = a->np ? &a->pos[0] : NULL;
    const char *n = NULL;
    char buf[16];
    if (name.n < sizeof buf) {
        memcpy(buf, name.s, name.n);
        buf[name.n] = 0;
        n = buf;
    }
    if (!n) return 0;
    if (!strcmp(n, "defined")) return v->t != T_UNDEF;
    if (!strcmp(n, "undefined")) return v->t == T_UNDEF;
    if (!strcmp(n, "none")) return v->t == T_NONE;
    if (!strcmp(n, "string")) return v->t == T_STR;
    if (!strcmp(n, "number")) return is_num(v);
    if (!strcmp(n, "integer")) return v->t == T_INT;
    if (!strcmp(n, "float")) return v->t == T_FLOAT;
    if (!strcmp(n, "boolean")) return v->t == T_BOOL;
    if (!strcmp(n, "true")) return v->t == T_BOOL && v->b;
    if (!strcmp(n, "false")) return v->t == T_BOOL && !v->b;
    if (!strcmp(n, "mapping")) return v->t == T_DICT;
    if (!strcmp(n, "iterable")) return v->t == T_STR || v->t == T_LIST || v->t == T_DICT || v->t == T_UNDEF;
    if (!strcmp(n, "sequence")) return v->t == T_STR || v->t == T_LIST || v->t == T_DICT;
    if (!strcmp(n, "callable")) return v->t == T_MACRO || v->t == T_FUNC;
    if (!strcmp(n, "escaped")) return 0;
    if (!strcmp(n, "lower") || !strcmp(n, "upper")) {
        if (v->t != T_STR) fail(j, "the %s test needs a string", n);
        Value c = change_case(j, v->s, n[0]);
        return str_same(c.s, v->s);
    }
    if (!strcmp(n, "odd") || !strcmp(n, "even") || !strcmp(n, "divisibleby")) {
        int64_t i = want_int(j, v, "the tested value");
        if (n[0] == 'd') {
            int64_t d = x ? want_int(j, x, "divisibleby's argument") : 0;
            if (d == 0) fail(j, "integer division or modulo by zero");
            return d == -1 || i % d == 0;
        }
        return (i % 2 != 0) == (n[0] == 'o');
    }
    if (!x) fail(j, "the %s test takes one argument", n);
    if (!strcmp(n, "in")) return contains(j, x, v);
    if (!strcmp(n, "sameas")) return v->t == x->t && (v->t == T_NONE || v->t == T_UNDEF || veq(j, v, x));
    if (!strcmp(n, "eq") || !strcmp(n, "equalto") || !strcmp(n, "==")) return veq(j, v, x);
    if (!strcmp(n, "ne") || !strcmp(n, "!=")) return !veq(j, v, x);
    int c = compare(j, v, x);
    if (!strcmp(n, "lt") || !strcmp(n, "lessthan") || !strcmp(n, "<")) return c < 0;
    if (!strcmp(n, "le") || !strcmp(n, "<=")) return c <= 0;
    if (!strcmp(n, "gt") || !strcmp(n, "greaterthan") || !strcmp(n, ">")) return c > 0;
    return c >= 0;  // ge, >=
}

// An item's attribute for map/sort/selectattr/join/...: "a.b" walks down; digits index lists.
static Value attr_path(J *j, const Value *v, Str path) {
    Value cur = *v;
    size_t at = 0;
    while (at <= path.n) {
        const char *dot = memchr(path.s + at, '.', path.n - at);
        size_t end = dot ? (size_t)(dot - path.s) : path.n;
        Str part = {path.s + at, end - at};
        int digits = part.n > 0;
        for (size_t i = 0; i < part.n; i++) digits &= is_digit(part.s[i]);
        Value key = digits ? vint(atoll(str_copy(j, part.s, part.n).s)) : vstr(part);
        if (cur.t == T_UNDEF) return cur;
        cur = getitem(j, &cur, &key);
        at = end + 1;
    }
    return cur;
}

static Str lower_if(J *j, const Value *v, int case_sensitive) {
    return case_sensitive ? v->s : change_case(j, v->s, 'l').s;
}

// The sort key of an item: its attribute (when given), lower-cased unless case_sensitive.
static Value sort_key(J *j, const Value *v, const Value *attribute, int case_sensitive) {
    Value k = attribute && attribute->t != T_NONE ? attr_path(j, v, want_str(j, attribute, "attribute")) : *v;
    if (k.t == T_STR && !case_sensitive) k.s = lower_if(j, &k, 0);
    return k;
}

// A stable merge sort of items by keys.
static void sort_by(J *j, Value *items, Value *keys, size_t n, int reverse) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_by(j, items, keys, h, reverse);
    sort_by(j, items + h, keys + h, n - h, reverse);
    Value *ti = alloc(j, n * sizeof *ti), *tk = alloc(j, n * sizeof *tk);
    size_t a = 0, b = h, k = 0;
    while (a < h || b < n) {
        step(j);
        int take_b = a == h || (b < n && (reverse ? compare(j, &keys[b], &keys[a]) > 0
                                                  : compare(j, &keys[b], &keys[a]) < 0));
        size_t from = take_b ? b++ : a++;
        ti[k] = items[from];
        tk[k++] = keys[from];
    }
    memcpy(items, ti, n * sizeof *ti);
    memcpy(keys, tk, n * sizeof *tk);
}

static Value indent(J *j, Str s, const Value *width, int first, int blank_lines) {
    Str pad;
    SB p = {0};
    if (width && width->t == T_STR) {
        pad = width->s;
    } else {
        int64_t w = width ? want_int(j, width, "indent's width") : 4;
        for (int64_t i = 0; i < w && i < 1024; i++) sb_puts(j, &p, " ");
        pad = sb_str(&p);
    }
    Value lines = str_method(j, concat(j, s, S("\n")).s, S("splitlines"), &(Args){0});
    SB b = {0};
    for (size_t i = 0; i < lines.l->n; i++) {
        Str line = lines.l->v[i].s;
        if (i) sb_puts(j, &b, "\n");
        if (i ? line.n || blank_lines : first) sb_put(j, &b, pad.s, pad.n);
        sb_put(j, &b, line.s, line.n);
    }
    if (!lines.l->n && first) sb_put(j, &b, pad.s, pad.n);
    return vstr(sb_str(&b));
}

static Value html_escape(J *j, Str s) {
    j->steps += (long)s.n;
    SB b = {0};
    for (size_t i = 0; i < s.n; i++) {
        const char *e = s.s[i] == '&' ? "&amp;" : s.s[i] == '<' ? "&lt;" : s.s[i] == '>' ? "&gt;"
                      : s.s[i] == '"' ? "&#34;" : s.s[i] == '\'' ? "&#39;" : NULL;
        if (e) sb_puts(j, &b, e);
        else sb_put(j, &b, &s.s[i], 1);
    }
    return vstr(sb_str(&b));
}

static Value to_number(J *j, const Value *v, const Value *fallback, int want_float) {
    if (v->t == T_INT || v->t == T_BOOL)
        return want_float ? vfloat(num(v)) : vint(v->t == T_INT ? v->i : v->b);
    if (v->t == T_FLOAT) {
        if (want_float) return *v;
        if (!isfinite(v->f) || fabs(v->f) >= 9.2e18) return *fallback;
        return vint((int64_t)v->f);
    }
    if (v->t == T_STR) {
        Str s = str_strip(j, v->s, 3, NULL);
        char *z = (char *)str_copy(j, s.s, s.n).s, *end;
        if (!want_float) {
            long long i = strtoll(z, &end, 10);
            if (s.n && !*end) return vint(i);
        }
        double f = strtod(z, &end);
        if (s.n && !*end && want_float) return vfloat(f);
        if (s.n && !*end && !isnan(f)) {  // int(float(s)): nan is not a number (the default), inf overflows
            if (!(fabs(f) < 9.2e18)) checked(j, 1, 0);
            return vint((int64_t)f);
        }
    }
    return *fallback;
}

static Value filter(J *j, Str name, const Value *v, Args *a) {
    char n[16];
    memcpy(n, name.s, name.n < 15 ? name.n : 15);
    n[name.n < 15 ? name.n : 15] = 0;
    const Value *x = a->np ? &a->pos[0] : NULL;
    if (!strcmp(n, "safe") || !strcmp(n, "string")) return vstr(str_of(j, v));
    if (!strcmp(n, "default") || !strcmp(n, "d")) {
        const Value *dv = arg(j, a, 0, "default_value"), *boolean = arg(j, a, 1, "boolean");
        int use = v->t == T_UNDEF || (arg_bool(boolean, 0) && !truthy(v));
        return use ? (dv ? *dv : vstr(S(""))) : *v;
    }
    if (!strcmp(n, "tojson")) {
        static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
        check_args(j, a, 4, names, "tojson");
        const Value *ia = arg(j, a, 1, "indent"), *sep = arg(j, a, 2, "separators");
        JsonStyle st = {arg_bool(arg(j, a, 0, "ensure_ascii"), 0), -1, arg_bool(arg(j, a, 3, "sort_keys"), 0),
                        S(", "), S(": ")};
        if (ia && ia->t != T_NONE) {
            st.indent = (int)want_int(j, ia, "tojson's indent");
            if (st.indent < 0) st.indent = 0;
            if (st.indent > 64) fail(j, "tojson: indent over 64");
            st.item_sep = S(",");
        }
        if (sep && sep->t != T_NONE) {
            if (sep->t != T_LIST || sep->l->n != 2) fail(j, "tojson: separators must be a pair of strings");
            st.item_sep = want_str(j, &sep->l->v[0], "a separator");
            st.key_sep = want_str(j, &sep->l->v[1], "a separator");
        }
        SB b = {0};
        to_json(j, &b, v, &st, 0);
        return vstr(sb_str(&b));
    }
    if (!strcmp(n, "length") || !strcmp(n, "count")) return vint((int64_t)length(j, v));
    if (!strcmp(n, "trim")) {
        Str chars = x && x->t != T_NONE ? want_str(j, x, "trim's chars") : S("");
        return vstr(str_strip(j, str_of(j, v), 3, x && x->t != T_NONE ? &chars : NULL));
    }
    if (!strcmp(n, "upper") || !strcmp(n, "lower") || !strcmp(n, "capitalize"))
        return change_case(j, str_of(j, v), n[0]);
    if (!strcmp(n, "title")) return change_case(j, str_of(j, v), 'T');
    if (!strcmp(n, "replace")) {
        const Value *y = arg(j, a, 1, "new"), *c = arg(j, a, 2, "count");
        if (!x || !y) fail(j, "replace needs old and new");
        return replace(j, str_of(j, v), str_of(j, x), str_of(j, y),
                       c && c->t != T_NONE ? want_int(j, c, "count") : -1);
    }
    if (!strcmp(n, "e") || !strcmp(n, "escape") || !strcmp(n, "forceescape"))
        return html_escape(j, str_of(j, v));
    if (!strcmp(n, "indent")) {
        return indent(j, str_of(j, v), arg(j, a, 0, "width"), arg_bool(arg(j, a, 1, "first"), 0),
                      arg_bool(arg(j, a, 2, "blank"), 0));
    }
    if ((!strcmp(n, "int") || !strcmp(n, "float")) && v->t == T_UNDEF) fail_undef(j, v);
    if (!strcmp(n, "int")) {
        Value zero = vint(0);
        const Value *dv = arg(j, a, 0, "default");
        return to_number(j, v, dv ? dv : &zero, 0);
    }
    if (!strcmp(n, "float")) {
        Value zero = vfloat(0);
        const Value *dv = arg(j, a, 0, "default");
        return to_number(j, v, dv ? dv : &zero, 1);
    }
    if (!strcmp(n, "abs")) {
        if (v->t == T_FLOAT) return vfloat(fabs(v->f));
        int64_t i = want_int(j, v, "abs's value");
        if (i == INT64_MIN) checked(j, 1, 0);
        return vint(i < 0 ? -i : i);
    }
    if (!strcmp(n, "round")) {
        int64_t prec = x ? want_int(j, x, "round's precision") : 0;
        const Value *m = arg(j, a, 1, "method");
        Str how = m ? want_str(j, m, "round's method") : S("common");
        double f = num(v), s = pow(10, (double)prec);
        if (!is_num(v)) fail(j, "round needs a number");
        if (v->t != T_FLOAT && str_eq(how, "common") && prec >= 0) return vint(v->t == T_INT ? v->i : v->b);
        double r = str_eq(how, "ceil")    ? ceil(f * s) / s
                   : str_eq(how, "floor") ? floor(f * s) / s
                                          : rint(f * s) / s;
        return vfloat(r);
    }
    if (!strcmp(n, "attr")) {  // an attribute only: a dict's keys are items, not attributes
        if (!x) fail(j, "attr needs a name");
        Str name = want_str(j, x, "attr's name");
        if (v->t == T_DICT && !has_method(v, name)) return vundef(name, type_name(v));
        return getattr_(j, v, name);
    }
    if (!strcmp(n, "items")) {
        if (v->t == T_UNDEF) return vlist(j, 0);
        if (v->t != T_DICT) fail(j, "items: can only get item pairs from a mapping");
        return method(j, v, S("items"), &(Args){0});
    }
    if (!strcmp(n, "dictsort")) {
        if (v->t != T_DICT) fail(j, "dictsort needs a mapping");
        Value pairs = method(j, v, S("items"), &(Args){0});
        const Value *by = arg(j, a, 1, "by");
        int pos = by && str_eq(want_str(j, by, "dictsort's by"), "value");
        Value *keys = alloc(j, (pairs.l->n + 1) * sizeof *keys);
        for (size_t i = 0; i < pairs.l->n; i++)
            keys[i] =
                sort_key(j, &pairs.l->v[i].l->v[pos], NULL, arg_bool(arg(j, a, 0, "case_sensitive"), 0));
        sort_by(j, pairs.l->v, keys, pairs.l->n, arg_bool(arg(j, a, 2, "reverse"), 0));
        return pairs;
    }
    const List *l = items_of(j, v);
    if (!strcmp(n, "list")) {
        Value r = vlist(j, l->n);
        for (size_t i = 0; i < l->n; i++) list_push(j, r.l, l->v[i]);
        return r;
    }
    if (!strcmp(n, "first") || !strcmp(n, "last")) {
        if (!l->n) return vundef(S("no first item"), NULL);
        return l->v[n[0] == 'f' ? 0 : l->n - 1];
    }
    if (!strcmp(n, "reverse")) {
        if (v->t == T_STR)
            return slice(j, v, &(Value){.t = T_NONE}, &(Value){.t = T_NONE}, &(Value){.t = T_INT, .i = -1});
        Value r = vlist(j, l->n);
        for (size_t i = l->n; i-- > 0;) list_push(j, r.l, l->v[i]);
        return r;
    }
    if (!strcmp(n, "join")) {
        const Value *attribute = arg(j, a, 1, "attribute");
        Str sep = x && x->t != T_UNDEF ? str_of(j, x) : S("");
        SB b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) sb_put(j, &b, sep.s, sep.n);
            Value e = attribute ? attr_path(j, &l->v[i], want_str(j, attribute, "attribute")) : l->v[i];
            to_str(j, &b, &e);
        }
        return vstr(sb_str(&b));
    }
    if (!strcmp(n, "sort") || !strcmp(n, "unique") || !strcmp(n, "min") || !strcmp(n, "max")) {
        int is_sort = n[0] == 's';
        const Value *attribute = arg(j, a, is_sort ? 2 : 1, "attribute");
        int cs = arg_bool(arg(j, a, is_sort ? 1 : 0, "case_sensitive"), 0);
        Value r = vlist(j, l->n);
        Value *keys = alloc(j, (l->n + 1) * sizeof *keys);
        for (size_t i = 0; i < l->n; i++) {
            Value k = sort_key(j, &l->v[i], attribute, cs);
            if (n[0] == 'u') {
                int seen = 0;
                for (size_t q = 0; q < r.l->n && !seen; q++) {
                    step(j);
                    seen = veq(j, &keys[q], &k);
                }
                if (seen) continue;
            }
            keys[r.l->n] = k;
            list_push(j, r.l, l->v[i]);
        }
        if (n[0] == 'u') return r;
        sort_by(j, r.l->v, keys, r.l->n, is_sort && arg_bool(arg(j, a, 0, "reverse"), 0));
        if (is_sort) return r;
        if (!r.l->n) return vundef(S("no min or max of an empty sequence"), NULL);
        return r.l->v[n[1] == 'i' ? 0 : r.l->n - 1];
    }
    j->steps += (long)l->n;  // each filter below reads the list once
    if (!strcmp(n, "sum")) {
        const Value *attribute = arg(j, a, 0, "attribute"), *start = arg(j, a, 1, "start");
        Value acc = start ? *start : vint(0);
        for (size_t i = 0; i < l->n; i++) {
            Value e = attribute && attribute->t != T_NONE
                          ? attr_path(j, &l->v[i], want_str(j, attribute, "attribute"))
                          : l->v[i];
            acc = arith(j, '+', acc, e);
        }
        return acc;
    }
    if (!strcmp(n, "map")) {
        const Value *attribute = NULL, *dflt = NULL;
        for (int k = 0; k < a->nk; k++) {
            if (str_eq(a->names[k], "attribute")) attribute = &a->kw[k];
            if (str_eq(a->names[k], "default")) dflt = &a->kw[k];
        }
        if (!attribute && !x) fail(j, "map needs a filter name or attribute=");
        Value r = vlist(j, l->n);
        Args rest = {a->pos + 1, a->np ? a->np - 1 : 0, a->names, a->kw, attribute ? 0 : a->nk};
        Str fname = attribute ? S("") : want_str(j, x, "map's filter");
        if (!attribute && !known(FILTERS, fname)) fail(j, "no filter named '%.*s'", (int)fname.n, fname.s);
        for (size_t i = 0; i < l->n; i++) {
            Value e;
            if (attribute) {
                e = attr_path(j, &l->v[i], want_str(j, attribute, "attribute"));
                if (e.t == T_UNDEF && dflt) e = *dflt;
            } else {
                e = filter(j, fname, &l->v[i], &rest);
            }
            list_push(j, r.l, e);
        }
        return r;
    }
    if (!strcmp(n, "select") || !strcmp(n, "reject") || !strcmp(n, "selectattr") ||
        !strcmp(n, "rejectattr")) {
        int by_attr = strstr(n, "attr") != NULL, keep = n[0] == 's';
        int first = by_attr ? 1 : 0;
        if (by_attr && !x) fail(j, "%s needs an attribute name", n);
        Str tname = a->np > first ? want_str(j, &a->pos[first], "the test's name") : S("");
        if (tname.n && !known(TESTS, tname)) fail(j, "no test named '%.*s'", (int)tname.n, tname.s);
        Args targs = {a->pos + first + 1, a->np > first + 1 ? a->np - first - 1 : 0, NULL, NULL, 0};
        Value r = vlist(j, l->n);
        for (size_t i = 0; i < l->n; i++) {
            Value e = by_attr ? attr_path(j, &l->v[i], want_str(j, x, "attribute")) : l->v[i];
            int ok = tname.n ? test(j, tname, &e, &targs) : truthy(&e);
            if (ok == keep) list_push(j, r.l, l->v[i]);
        }
        return r;
    }
    fail(j, "filter '%s' is not supported", n);
}

// ---------------------------------------------------------------- rendering

static Value from_json(J *j, const cJSON *x) {
    if (cJSON_IsNull(x)) return V(T_NONE);
    if (cJSON_IsBool(x)) return vbool(cJSON_IsTrue(x));
    if (cJSON_IsNumber(x)) {  // an int or a float as written (base/json.h keeps the text that tells)
        const char *t = x->valuestring;
        double d = x->valuedouble;
        if (t && strpbrk(t, ".eE")) return vfloat(d);
        if (t) {
            errno = 0;
            long long i = strtoll(t, NULL, 10);
            return errno ? vfloat(d) : vint(i);  // past 64 bits: the nearest float
        }
        if (d == floor(d) && fabs(d) < 9.2e18) return vint((int64_t)d);
        return vfloat(d);
    }
    if (cJSON_IsString(x)) {
        if (!j->nul) return vstr(S(x->valuestring));
        size_t n;
        j->pending = json_string_bytes(x, j->nul, &n);  // freed by jinja_render if the copy fails
        Str s = str_copy(j, j->pending, n);
        free(j->pending);
        j->pending = NULL;
        return vstr(s);
    }
    if (cJSON_IsArray(x)) {
        Value l = vlist(j, (size_t)cJSON_GetArraySize(x));
        for (const cJSON *e = x->child; e; e = e->next) list_push(j, l.l, from_json(j, e));
        return l;
    }
    if (cJSON_IsObject(x)) {
        Value d = vdict(j);
        for (const cJSON *e = x->child; e; e = e->next)
            dict_push(j, d.d, vstr(S(e->string)), from_json(j, e));
        return d;
    }
    return V(T_NONE);
}

char *jinja_render(const JinjaTemplate *t, const cJSON *vars, uint32_t nul_sentinel, Buf *out) {
    J *j = calloc(1, sizeof *j);
    if (!j) die("out of memory");
    j->name = t->name;
    j->nul = nul_sentinel;
    char *err = NULL;
    if (setjmp(j->fail)) {
        err = j->err;
    } else {
        j->frame = frame_new(j, NULL);
        for (const cJSON *e = vars ? vars->child : NULL; e; e = e->next)
            frame_set(j, j->frame, S(e->string), from_json(j, e));
        exec_body(j, &t->body);
        buf_append(out, j->out.data ? j->out.data : "", j->out.len);
    }
    buf_free(&j->out);
    free(j->pending);
    chunks_free(j->chunks);
    free(j);
    return err;
}

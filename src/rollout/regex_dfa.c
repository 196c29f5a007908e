// guided_regex: the pattern parsed into a Thompson NFA over bytes, made a DFA by subset construction over byte
// classes, each state's distance to a match found backwards (regex_dfa.h).
#include "rollout/regex_dfa.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/util.h"
#include "text/utf8.h"

#define NFA_MAX 100000                 // NFA states at most ('.' takes about 70: UTF-8's byte sequences)
#define WORK_MAX ((int64_t)50000000)   // pattern bytes parsed and NFA states visited at most: the compile's time
#define DEPTH_MAX 64                    // groups nested at most
#define FAR INT64_MAX

typedef struct {
    uint32_t set[8];  // the bytes of this state's transition (none: epsilon edges only)
    int out;          // where the transition goes
    int eps[2];       // epsilon edges (-1: none)
} NState;

typedef struct {
    int start, end;  // end: an epsilon state without edges, which the fragment's user connects
} Frag;

typedef struct {
    const unsigned char *p;
    size_t n, at;
    NState *st;
    int n_st;
    int64_t work;  // pattern bytes parsed (a counted repeat's atom again for each copy)
    int ecma;      // REGEX_ECMA
    char *err;     // the first error (malloc'd)
} Parser;

static const Frag NONE = {-1, -1};

static Frag fail(Parser *P, char *msg) {
    if (P->err)
        free(msg);
    else
        P->err = msg;
    return NONE;
}

// -1, the error kept.
static int bad(Parser *P, char *msg) {
    fail(P, msg);
    return -1;
}

static int new_state(Parser *P) {
    if (P->err) return -1;
    if (P->n_st == NFA_MAX) return bad(P, xprintf("the pattern is too large (over %d automaton states)", NFA_MAX));
    NState *s = &P->st[P->n_st];
    memset(s->set, 0, sizeof s->set);
    s->out = -1;
    s->eps[0] = s->eps[1] = -1;
    return P->n_st++;
}

static void edge(Parser *P, int from, int to) {
    if (from < 0 || to < 0) return;
    NState *s = &P->st[from];
    s->eps[s->eps[0] < 0 ? 0 : 1] = to;
}

static int has(const uint32_t set[8], int b) { return (int)(set[b >> 5] >> (b & 31) & 1u); }
static void add_range(uint32_t set[8], int lo, int hi) {
    for (int b = lo; b <= hi; b++) set[b >> 5] |= 1u << (b & 31);
}

static Frag empty(Parser *P) {
    int s = new_state(P);
    return (Frag){s, s};
}

static Frag byte_set(Parser *P, const uint32_t set[8]) {
    int s = new_state(P), e = new_state(P);
    if (e < 0) return NONE;
    memcpy(P->st[s].set, set, sizeof P->st[s].set);
    P->st[s].out = e;
    return (Frag){s, e};
}

static Frag byte_range(Parser *P, int lo, int hi) {
    uint32_t set[8] = {0};
    add_range(set, lo, hi);
    return byte_set(P, set);
}

static Frag cat(Parser *P, Frag a, Frag b) {
    if (P->err) return NONE;
    edge(P, a.end, b.start);
    return (Frag){a.start, b.end};
}

static Frag alt(Parser *P, Frag a, Frag b) {
    int s = new_state(P), e = new_state(P);
    if (e < 0) return NONE;
    edge(P, s, a.start);
    edge(P, s, b.start);
    edge(P, a.end, e);
    edge(P, b.end, e);
    return (Frag){s, e};
}

// a* (skip 1, loop 1), a? (skip 1, loop 0), a+ (skip 0, loop 1).
static Frag repeat(Parser *P, Frag a, int skip, int loop) {
    int s = new_state(P), e = new_state(P);
    if (e < 0) return NONE;
    edge(P, s, a.start);
    if (skip) edge(P, s, e);
    if (loop) edge(P, a.end, a.start);
    edge(P, a.end, e);
    return (Frag){s, e};
}

// One UTF-8 character: an ASCII byte of `ascii`, or (multi) any well-formed multi-byte character; with ECMA, not
// one that ECMA-262 counts as a space or line terminator (U+00A0, U+1680, U+3000, U+FEFF, and U+2000-U+207F whole:
// its spaces and U+2028/9), so that a class taking them for Python (\S, [^\s], .) takes only what ECMA's does.
static Frag utf8_class(Parser *P, const uint32_t ascii[8], int multi) {
    static const uint8_t any[8][4][2] = {
        {{0xC2, 0xDF}, {0x80, 0xBF}},
        {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}},
        {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}},
        {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}},
    };
    static const uint8_t ecma[19][4][2] = {
        {{0xC2, 0xC2}, {0x80, 0x9F}},
        {{0xC2, 0xC2}, {0xA1, 0xBF}},
        {{0xC3, 0xDF}, {0x80, 0xBF}},
        {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}},
        {{0xE1, 0xE1}, {0x80, 0x99}, {0x80, 0xBF}},
        {{0xE1, 0xE1}, {0x9A, 0x9A}, {0x81, 0xBF}},
        {{0xE1, 0xE1}, {0x9B, 0xBF}, {0x80, 0xBF}},
        {{0xE2, 0xE2}, {0x82, 0xBF}, {0x80, 0xBF}},
        {{0xE3, 0xE3}, {0x80, 0x80}, {0x81, 0xBF}},
        {{0xE3, 0xE3}, {0x81, 0xBF}, {0x80, 0xBF}},
        {{0xE4, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}},
        {{0xEE, 0xEE}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xEF, 0xEF}, {0x80, 0xBA}, {0x80, 0xBF}},
        {{0xEF, 0xEF}, {0xBB, 0xBB}, {0x80, 0xBE}},
        {{0xEF, 0xEF}, {0xBC, 0xBF}, {0x80, 0xBF}},
        {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}},
    };
    const uint8_t(*seqs)[4][2] = P->ecma ? ecma : any;
    int n = P->ecma ? 19 : 8;
    Frag f = byte_set(P, ascii);
    for (int i = 0; multi && i < n; i++) {
        Frag g = byte_range(P, seqs[i][0][0], seqs[i][0][1]);
        for (int k = 1; k < 4 && seqs[i][k][0]; k++) g = cat(P, g, byte_range(P, seqs[i][k][0], seqs[i][k][1]));
        f = alt(P, f, g);
    }
    return f;
}

static Frag code_point(Parser *P, uint32_t cp) {
    char u[4];
    int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (n == 1) u[0] = (char)cp;
    else {
        for (int i = n - 1; i > 0; i--, cp >>= 6) u[i] = (char)(0x80 | (cp & 0x3F));
        u[0] = (char)((0xF0 << (4 - n)) | cp);
    }
    Frag f = byte_range(P, (unsigned char)u[0], (unsigned char)u[0]);
    for (int i = 1; i < n; i++) f = cat(P, f, byte_range(P, (unsigned char)u[i], (unsigned char)u[i]));
    return f;
}

static int peek(const Parser *P) { return P->at < P->n ? P->p[P->at] : -1; }

// The UTF-8 character at P->at (consumed); -1 (an error set) when it is not well-formed.
static int64_t next_char(Parser *P) {
    size_t len;
    if (utf8_scan(P->p + P->at, P->n - P->at, &len) != UTF8_VALID)
        return bad(P, xprintf("the pattern is not UTF-8 at byte %zu", P->at));
    uint32_t cp = len == 1 ? P->p[P->at] : P->p[P->at] & (0x7Fu >> len);
    for (size_t i = 1; i < len; i++) cp = cp << 6 | (P->p[P->at + i] & 0x3Fu);
    P->at += len;
    return cp;
}

typedef struct {
    int is_class;       // a class escape (\d \w \s and their negations): ascii and multi
    uint32_t ascii[8];  // its ASCII bytes
    int multi;          // it takes every non-ASCII character too (\D \W \S)
    uint32_t cp;        // else the character
} Escape;

static int hex_value(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// The escape after a backslash (P->at past it). Returns 0, or -1 with the error set.
static int escape(Parser *P, Escape *e) {
    memset(e, 0, sizeof *e);
    int c = peek(P);
    if (c < 0) return bad(P, xstrdup("the pattern ends with a backslash"));
    if (P->ecma && (c == 'a' || c == 'U')) return bad(P, xprintf("\\%c is Python's, not ECMA-262's", c));
    if (c >= 0x80) {
        int64_t cp = next_char(P);
        e->cp = (uint32_t)cp;
        return cp < 0 ? -1 : 0;
    }
    P->at++;
    const char *classes = "dDwWsS";
    if (strchr(classes, c)) {
        int lower = c | 0x20;
        if (lower == 'd') add_range(e->ascii, '0', '9');
        if (lower == 'w') {
            add_range(e->ascii, '0', '9');
            add_range(e->ascii, 'A', 'Z');
            add_range(e->ascii, 'a', 'z');
            add_range(e->ascii, '_', '_');
        }
        if (lower == 's') {
            add_range(e->ascii, '\t', '\r');  // \t \n \v \f \r
            add_range(e->ascii, ' ', ' ');
        }
        if (c != lower)
            for (int i = 0; i < 4; i++) e->ascii[i] = ~e->ascii[i];  // the other ASCII bytes
        e->multi = c != lower;
        e->is_class = 1;
        return 0;
    }
    static const char simple[] = "n\nt\tr\rf\fv\va\a";
    for (int i = 0; simple[i]; i += 2)
        if (c == simple[i]) {
            e->cp = (uint32_t)simple[i + 1];
            return 0;
        }
    if (c == 'x' || c == 'u' || c == 'U') {
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = hex_value(peek(P));
            if (h < 0) return bad(P, xprintf("\\%c needs %d hex digits", c, digits));
            v = v << 4 | (uint32_t)h;
            P->at++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            return bad(P, xprintf("\\%c%0*X is not a character", c, digits, v));
        e->cp = v;
        return 0;
    }
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return bad(P, xprintf("\\%c is not supported (backreferences, \\b, \\A, \\Z and the like)", c));
    e->cp = (uint32_t)c;  // an escaped punctuation character is itself
    return 0;
}

// One class member (a character, or a class escape in *e); P->at at it. Returns 0, or -1 with the error set.
static int class_item(Parser *P, Escape *e) {
    if (peek(P) == '\\') {
        P->at++;
        return escape(P, e);
    }
    memset(e, 0, sizeof *e);
    int64_t cp = next_char(P);
    e->cp = (uint32_t)cp;
    return cp < 0 ? -1 : 0;
}

// [...]: P->at past '['.
static Frag char_class(Parser *P) {
    int neg = peek(P) == '^';
    P->at += neg;
    uint32_t ascii[8] = {0}, *wide = NULL;  // the ASCII bytes, and the non-ASCII characters listed
    int multi = 0, n_wide = 0;
    for (int first = 1;; first = 0) {
        if (peek(P) < 0) {
            fail(P, xstrdup("a character class [ is not closed"));
            break;
        }
        if (peek(P) == ']' && !first) {
            P->at++;
            break;
        }
        if (peek(P) == ']' && P->ecma) {
            fail(P, xprintf("[] at byte %zu: in ECMA-262 a class does not start with ] (write \\])", P->at));
            break;
        }
        Escape lo, hi;
        if (class_item(P, &lo)) break;
        if (lo.is_class && peek(P) == '-' && P->at + 1 < P->n && P->p[P->at + 1] != ']') {
            fail(P, xprintf("a bad character range before byte %zu", P->at));  // [\d-z], as Python says
            break;
        }
        if (lo.is_class) {
            for (int i = 0; i < 8; i++) ascii[i] |= lo.ascii[i];
            multi |= lo.multi;
            continue;
        }
        hi = lo;
        if (peek(P) == '-' && P->at + 1 < P->n && P->p[P->at + 1] != ']') {
            P->at++;
            if (class_item(P, &hi)) break;
            if (hi.is_class || hi.cp < lo.cp) {
                fail(P, xprintf("a bad character range before byte %zu", P->at));
                break;
            }
            if (hi.cp >= 0x80) {
                fail(P, xstrdup("a character range past ASCII is not supported"));
                break;
            }
        }
        if (lo.cp < 0x80) {
            add_range(ascii, (int)lo.cp, (int)hi.cp);
            continue;
        }
        wide = xrealloc(wide, (size_t)(n_wide + 1) * sizeof *wide);
        wide[n_wide++] = lo.cp;
    }
    if (neg && (multi || n_wide)) fail(P, xstrdup("a negated class of non-ASCII characters is not supported"));
    if (P->err) {
        free(wide);
        return NONE;
    }
    if (neg) {
        for (int i = 0; i < 4; i++) ascii[i] = ~ascii[i];
        multi = 1;
    }
    for (int i = 4; i < 8; i++) ascii[i] = 0;  // the ASCII part only: the multi-byte ones are utf8_class's
    Frag f = utf8_class(P, ascii, multi);
    for (int i = 0; i < n_wide; i++) f = alt(P, f, code_point(P, wide[i]));
    free(wide);
    return f;
}

static Frag alternation(Parser *P, int depth);
static int quantifier(Parser *P, int *lo, int *hi);

static Frag atom(Parser *P, int depth) {
    int c = peek(P);
    size_t at = P->at;
    if (c == '(') {
        P->at++;
        if (peek(P) == '?') {
            const char *named = P->ecma ? "?<" : "?P<";  // a named group, as each writes it
            size_t len = strlen(named);
            int lookbehind = P->ecma && P->at + 2 < P->n && (P->p[P->at + 2] == '=' || P->p[P->at + 2] == '!');
            if (P->at + 1 < P->n && P->p[P->at + 1] == ':') P->at += 2;
            else if (P->n - P->at >= len && !memcmp(P->p + P->at, named, len) && !lookbehind) {
                size_t name = P->at += len;
                while (peek(P) == '_' || (peek(P) >= 0 && peek(P) < 0x80 && isalnum(peek(P)))) P->at++;
                if (P->at == name || isdigit(P->p[name]) || peek(P) != '>')
                    return fail(P, xprintf("a bad group name at byte %zu", name));
                P->at++;
            } else {
                int c2 = P->at + 1 < P->n ? P->p[P->at + 1] : ' ';
                return fail(P, xprintf("(?%c... is not supported (lookaround, flags, conditionals)", c2));
            }
        }
        if (depth == DEPTH_MAX) return fail(P, xprintf("groups nest deeper than %d", DEPTH_MAX));
        Frag f = alternation(P, depth + 1);
        if (P->err) return NONE;
        if (peek(P) != ')') return fail(P, xprintf("the group opened at byte %zu is not closed", at));
        P->at++;
        return f;
    }
    if (c == '[') {
        P->at++;
        return char_class(P);
    }
    if (c == '.') {
        P->at++;
        uint32_t ascii[8] = {0};
        add_range(ascii, 0, 0x7F);
        ascii['\n' >> 5] &= ~(1u << ('\n' & 31));
        if (P->ecma) ascii['\r' >> 5] &= ~(1u << ('\r' & 31));  // a line terminator there too
        return utf8_class(P, ascii, 1);
    }
    int lo, hi;
    if (c == '*' || c == '+' || c == '?' || (c == '{' && quantifier(P, &lo, &hi)))
        return fail(P, xprintf("nothing to repeat at byte %zu", at));
    if (c == '^' || c == '$') {
        P->at++;
        if ((c == '^' && at == 0) || (c == '$' && P->at == P->n)) return empty(P);  // a full match anyway
        return fail(P, xprintf("%c at byte %zu: ^ and $ are supported at the pattern's ends only", c, at));
    }
    Escape e = {0};
    if (c == '\\') {
        P->at++;
        if (escape(P, &e)) return NONE;
    } else {
        int64_t cp = next_char(P);
        if (cp < 0) return NONE;
        e.cp = (uint32_t)cp;
    }
    return e.is_class ? utf8_class(P, e.ascii, e.multi) : code_point(P, e.cp);
}

static int number(Parser *P, int *v) {
    if (peek(P) < '0' || peek(P) > '9') return 0;
    int64_t x = 0;
    while (peek(P) >= '0' && peek(P) <= '9') {
        x = x * 10 + (peek(P) - '0');
        if (x > INT32_MAX) x = INT32_MAX;
        P->at++;
    }
    *v = (int)x;
    return 1;
}

// A quantifier at P->at (consumed): *lo, *hi (-1: no bound). 0 when there is none (a '{' that does not make one
// is a literal, as in Python).
static int quantifier(Parser *P, int *lo, int *hi) {
    int c = peek(P);
    if (c == '*' || c == '+' || c == '?') {
        P->at++;
        *lo = c == '+';
        *hi = c == '?' ? 1 : -1;
        return 1;
    }
    if (c != '{') return 0;
    size_t at = P->at++;
    if (P->ecma && peek(P) == ',') {  // the error kept: a quantifier, so that nothing else is read into it
        fail(P, xprintf("{,n} at byte %zu is Python's (ECMA-262 reads it as text): write {0,n}", at));
        return 1;
    }
    int has_lo = number(P, lo);
    if (!has_lo) *lo = 0;
    *hi = *lo;
    if (peek(P) == ',') {
        P->at++;
        if (!number(P, hi)) *hi = -1;
    } else if (!has_lo) {
        P->at = at;
        return 0;
    }
    if (peek(P) != '}') {
        P->at = at;
        return 0;
    }
    P->at++;
    if (*lo > REGEX_MAX_REPEAT || *hi > REGEX_MAX_REPEAT)
        fail(P, xprintf("a repeat count over %d at byte %zu", REGEX_MAX_REPEAT, at));
    else if (*hi >= 0 && *hi < *lo)
        fail(P, xprintf("min repeat greater than max repeat at byte %zu", at));
    return 1;
}

// An atom and its quantifier: the atom parsed again (from `from`) for each copy a count asks.
static Frag repetition(Parser *P, int depth) {
    size_t from = P->at;
    int anchor = peek(P) == '^';
    Frag f = atom(P, depth);
    int lo, hi;
    if (P->err || !quantifier(P, &lo, &hi) || P->err) return f;
    if (anchor) return fail(P, xprintf("nothing to repeat at byte %zu", from + 1));
    if (peek(P) == '?') P->at++;  // lazy: the same full matches
    else if (peek(P) == '+')
        return fail(P, xprintf("a possessive quantifier at byte %zu is not supported", P->at));
    size_t after = P->at;
    int again;
    if (quantifier(P, &again, &again) || P->err) return fail(P, xprintf("multiple repeat at byte %zu", after));
    Frag r = empty(P);
    int copies = hi < 0 ? (lo > 0 ? lo : 1) : hi;
    int skip = -1;  // where an optional copy, skipped, goes: past all of them, as (a(a)?)? (closures stay small)
    for (int i = 0; i < copies && !P->err; i++) {
        Frag c = f;
        if (i > 0) {
            P->work += (int64_t)(after - from);
            if (P->work > WORK_MAX) return fail(P, xstrdup("the pattern is too complex to compile"));
            P->at = from;
            c = atom(P, depth);
        }
        if (hi < 0 && i == copies - 1) {
            r = cat(P, r, repeat(P, c, i >= lo, 1));  // the last one loops: * or +
        } else if (i < lo) {
            r = cat(P, r, c);
        } else {
            if (skip < 0) skip = new_state(P);
            int s = new_state(P);
            edge(P, r.end, s);
            edge(P, s, c.start);
            edge(P, s, skip);
            r.end = c.end;
        }
    }
    if (skip >= 0) {
        edge(P, r.end, skip);
        r.end = skip;
    }
    P->at = after;
    return P->err ? NONE : r;
}

static Frag concatenation(Parser *P, int depth) {
    Frag f = empty(P);
    while (!P->err && peek(P) >= 0 && peek(P) != '|' && peek(P) != ')') f = cat(P, f, repetition(P, depth));
    return f;
}

static Frag alternation(Parser *P, int depth) {
    Frag f = concatenation(P, depth);
    while (!P->err && peek(P) == '|') {
        P->at++;
        f = alt(P, f, concatenation(P, depth));
    }
    return f;
}

// ---------------------------------------------------------------- DFA

typedef struct {
    const NState *st;
    int n_st, accept;
    int *stack, *mark, stamp;
    int *pool;  // every DFA state's NFA states (the ones with a transition, and accept), sorted
    int64_t pool_n, pool_cap;
    int64_t *off;  // state i's at pool[off[i] .. off[i + 1])
    int *table;    // hash -> DFA state + 1 (open addressing, 2 * REGEX_MAX_STATES slots)
    int64_t work;  // NFA states visited so far (closures, transitions), against WORK_MAX
} Subset;

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

// The epsilon closure of the m states seeds into out (sorted; only states with a transition, and accept).
static int closure(Subset *S, const int *seeds, int m, int *out) {
    int k = 0, n = 0;
    S->stamp++;
    for (int i = 0; i < m; i++)
        if (S->mark[seeds[i]] != S->stamp) {
            S->mark[seeds[i]] = S->stamp;
            S->stack[n++] = seeds[i];
        }
    while (n > 0) {
        int s = S->stack[--n];
        const NState *q = &S->st[s];
        S->work++;
        if (q->out >= 0 || s == S->accept) out[k++] = s;
        for (int e = 0; e < 2; e++)
            if (q->eps[e] >= 0 && S->mark[q->eps[e]] != S->stamp) {
                S->mark[q->eps[e]] = S->stamp;
                S->stack[n++] = q->eps[e];
            }
    }
    qsort(out, (size_t)k, sizeof *out, cmp_int);
    return k;
}

// The DFA state of NFA set s (n), added when new (its row of d->next grown); -1 when the states run out.
static int intern(Subset *S, RegexDfa *d, const int *s, int n, int *cap) {
    size_t slots = 2 * REGEX_MAX_STATES;
    for (size_t h = hash_bytes(s, (size_t)n * sizeof *s) & (slots - 1);; h = (h + 1) & (slots - 1)) {
        int id = S->table[h] - 1;
        if (id >= 0) {
            if (S->off[id + 1] - S->off[id] == n && !memcmp(S->pool + S->off[id], s, (size_t)n * sizeof *s))
                return id;
            continue;
        }
        if (d->n == REGEX_MAX_STATES) return -1;
        id = d->n++;
        S->table[h] = id + 1;
        if (S->pool_n + n > S->pool_cap) {
            S->pool_cap = 2 * (S->pool_n + n);
            S->pool = xrealloc(S->pool, (size_t)S->pool_cap * sizeof *S->pool);
        }
        memcpy(S->pool + S->pool_n, s, (size_t)n * sizeof *s);
        S->off[id] = S->pool_n;
        S->pool_n += n;
        S->off[id + 1] = S->pool_n;
        if (d->n > *cap) {
            *cap *= 2;
            d->next = xrealloc(d->next, (size_t)*cap * (size_t)d->n_cls * sizeof *d->next);
        }
        return id;
    }
}

// Bytes that every NFA transition treats alike share a class: d->cls[b], d->n_cls of them; rep[k] one byte of
// class k.
static void byte_classes(const NState *st, int n_st, RegexDfa *d, int rep[256]) {
    int cls[256] = {0}, n = 1;
    for (int s = 0; s < n_st; s++) {
        if (st[s].out < 0) continue;
        int remap[512], m = 0;
        for (int i = 0; i < 512; i++) remap[i] = -1;
        for (int b = 0; b < 256; b++) {
            int key = cls[b] * 2 + has(st[s].set, b);
            if (remap[key] < 0) remap[key] = m++;
            cls[b] = remap[key];
        }
        n = m;
    }
    for (int b = 255; b >= 0; b--) {
        d->cls[b] = (uint8_t)cls[b];
        rep[cls[b]] = b;
    }
    d->n_cls = n;
}

typedef struct {
    int64_t cost;
    int state;
} Reach;

// Pushes r on the binary min-heap *h (n entries, room for cap: grown as it fills).
static void heap_push(Reach **hp, int64_t *n, int64_t *cap, Reach r) {
    if (*n == *cap) {
        *cap *= 2;
        *hp = xrealloc(*hp, (size_t)*cap * sizeof **hp);
    }
    Reach *h = *hp;
    int64_t i = (*n)++;
    for (; i > 0 && h[(i - 1) / 2].cost > r.cost; i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
    h[i] = r;
}

// Pops the heap's least entry.
static Reach heap_pop(Reach *h, int64_t *n) {
    Reach top = h[0], last = h[--*n];
    int64_t i = 0;
    for (int64_t k = 1; k < *n; i = k, k = 2 * k + 1) {
        if (k + 1 < *n && h[k + 1].cost < h[k].cost) k++;
        if (h[k].cost >= last.cost) break;
        h[i] = h[k];
    }
    h[i] = last;
    return top;
}

// out[s]: the least cost from state s to an accepting one (FAR: none), a byte of class c costing w[c] (FAR: it
// cannot be written), found backwards from the accepting states (Dijkstra over the reversed transitions).
static void costs(const RegexDfa *d, const uint8_t *accepting, const int64_t *w, int64_t *out) {
    int n = d->n, C = d->n_cls;
    int64_t *count = xcalloc((size_t)n + 1, sizeof *count), queued = 0, room = (int64_t)n + 1;
    for (int64_t e = 0; e < (int64_t)n * C; e++)
        if (d->next[e] >= 0 && w[e % C] != FAR) count[d->next[e] + 1]++;
    for (int s = 0; s < n; s++) count[s + 1] += count[s];
    int32_t *from = xmalloc((size_t)count[n] * sizeof *from + 1);  // the transitions into each state: its source
    uint8_t *by = xmalloc((size_t)count[n] + 1);                        // and class
    int64_t *fill = xmalloc((size_t)n * sizeof *fill);
    memcpy(fill, count, (size_t)n * sizeof *fill);
    for (int64_t e = 0; e < (int64_t)n * C; e++)
        if (d->next[e] >= 0 && w[e % C] != FAR) {
            from[fill[d->next[e]]] = (int32_t)(e / C);
            by[fill[d->next[e]]++] = (uint8_t)(e % C);
        }
    Reach *heap = xmalloc((size_t)room * sizeof *heap);
    for (int s = 0; s < n; s++) {
        out[s] = accepting[s] ? 0 : FAR;
        if (accepting[s]) heap_push(&heap, &queued, &room, (Reach){0, s});
    }
    while (queued > 0) {
        Reach r = heap_pop(heap, &queued);
        if (r.cost > out[r.state]) continue;  // a stale entry: the state was reached cheaper since
        for (int64_t i = count[r.state]; i < count[r.state + 1]; i++) {
            int s = from[i];
            int64_t c = r.cost + w[by[i]];
            if (c >= out[s]) continue;
            out[s] = c;
            heap_push(&heap, &queued, &room, (Reach){c, s});
        }
    }
    free(count);
    free(from);
    free(by);
    free(fill);
    free(heap);
}

// *work: the steps spent, P's and the subset construction's.
static char *determinize(const Parser *P, int start, int accept, RegexDfa *d, int64_t *work) {
    Subset S = {.st = P->st, .n_st = P->n_st, .accept = accept, .work = P->work};
    S.stack = xmalloc((size_t)P->n_st * sizeof *S.stack);
    S.mark = xcalloc((size_t)P->n_st, sizeof *S.mark);
    S.off = xmalloc(((size_t)REGEX_MAX_STATES + 1) * sizeof *S.off);
    S.table = xcalloc(2 * (size_t)REGEX_MAX_STATES, sizeof *S.table);
    int *set = xmalloc((size_t)P->n_st * sizeof *set), *seeds = xmalloc((size_t)P->n_st * sizeof *seeds);
    int rep[256], cap = 64;
    byte_classes(P->st, P->n_st, d, rep);
    int C = d->n_cls;
    d->next = xmalloc((size_t)cap * (size_t)C * sizeof *d->next);
    uint8_t *accepting = xcalloc(REGEX_MAX_STATES, 1);
    intern(&S, d, set, closure(&S, &start, 1, set), &cap);
    char *err = NULL;
    for (int i = 0; i < d->n && !err; i++) {
        for (int64_t k = S.off[i]; k < S.off[i + 1]; k++) accepting[i] |= S.pool[k] == accept;
        for (int c = 0; c < C && !err; c++) {
            int m = 0;
            for (int64_t k = S.off[i]; k < S.off[i + 1]; k++) {
                const NState *q = &P->st[S.pool[k]];
                if (q->out >= 0 && has(q->set, rep[c])) seeds[m++] = q->out;
            }
            S.work += S.off[i + 1] - S.off[i];
            int n = m ? closure(&S, seeds, m, set) : 0;
            int to = n ? intern(&S, d, set, n, &cap) : -1;
            d->next[(size_t)i * C + c] = to;
            if (n && to < 0) err = xprintf("the pattern needs over %d automaton states", REGEX_MAX_STATES);
            if (!err && S.work > WORK_MAX) err = xstrdup("the pattern is too complex to compile");
        }
    }
    if (!err) {
        d->dist = xmalloc((size_t)d->n * sizeof *d->dist);
        int64_t ones[256];
        for (int c = 0; c < C; c++) ones[c] = 1;
        costs(d, accepting, ones, d->dist);
        for (int64_t e = 0; e < (int64_t)d->n * C; e++)  // a byte after which no match can be reached is no match
            if (d->next[e] >= 0 && d->dist[d->next[e]] == FAR) d->next[e] = -1;
        if (d->dist[0] == FAR) err = xstrdup("the pattern matches no string");
    }
    free(S.stack);
    free(S.mark);
    free(S.off);
    free(S.table);
    free(S.pool);
    free(set);
    free(seeds);
    free(accepting);
    if (!err) d->next = xrealloc(d->next, (size_t)d->n * (size_t)C * sizeof *d->next);
    *work = S.work;
    return err;
}

char *regex_compile(const char *pattern, size_t n, int flags, int64_t *work, RegexDfa *d) {
    memset(d, 0, sizeof *d);
    int64_t spent = (work ? *work : 0) + (int64_t)n;
    Parser P = {.p = (const unsigned char *)pattern, .n = n, .work = spent, .ecma = flags & REGEX_ECMA};
    P.st = xmalloc(NFA_MAX * sizeof *P.st);
    Frag f = alternation(&P, 0);
    if (!P.err && P.at < P.n) fail(&P, xprintf("an unbalanced ) at byte %zu", P.at));
    char *err = P.err ? P.err : determinize(&P, f.start, f.end, d, &spent);
    if (work) *work = P.err ? P.work : spent;
    free(P.st);
    if (err) regex_free(d);
    return err;
}

void regex_free(RegexDfa *d) {
    free(d->next);
    free(d->dist);
    memset(d, 0, sizeof *d);
}

int regex_walk(const RegexDfa *d, int state, const char *s, size_t n) {
    for (size_t i = 0; i < n && state >= 0; i++) state = d->next[(size_t)state * d->n_cls + d->cls[(uint8_t)s[i]]];
    return state;
}

int64_t *regex_costs(const RegexDfa *d, const int64_t byte_cost[256]) {
    int64_t w[256];
    uint8_t *accepting = xmalloc((size_t)d->n);
    for (int c = 0; c < d->n_cls; c++) w[c] = FAR;
    for (int b = 0; b < 256; b++)  // a class's bytes all lead alike: its cheapest
        if (byte_cost[b] < w[d->cls[b]]) w[d->cls[b]] = byte_cost[b];
    for (int s = 0; s < d->n; s++) accepting[s] = d->dist[s] == 0;
    int64_t *out = xmalloc((size_t)d->n * sizeof *out);
    costs(d, accepting, w, out);
    free(accepting);
    return out;
}

char *regex_intersect(const RegexDfa *a, const RegexDfa *b, int64_t *work, RegexDfa *d) {
    memset(d, 0, sizeof *d);
    int *pair_cls = xmalloc((size_t)a->n_cls * (size_t)b->n_cls * sizeof *pair_cls), C = 0, rep[256];
    for (int i = 0; i < a->n_cls * b->n_cls; i++) pair_cls[i] = -1;  // a's class and b's: one class here
    for (int x = 0; x < 256; x++) {
        int *k = &pair_cls[a->cls[x] * b->n_cls + b->cls[x]];
        if (*k < 0) {
            *k = C++;
            rep[*k] = x;
        }
        d->cls[x] = (uint8_t)*k;
    }
    free(pair_cls);
    d->n_cls = C;
    U64Map seen;  // a's state * b->n + b's -> this one's
    u64map_init(&seen, 64);
    int64_t *pairs = xmalloc(REGEX_MAX_STATES * sizeof *pairs);
    int cap = 64;
    d->next = xmalloc((size_t)cap * (size_t)C * sizeof *d->next);
    pairs[d->n++] = 0;
    u64map_put(&seen, 0, 0);
    char *err = NULL;
    for (int i = 0; i < d->n && !err; i++) {  // breadth first from both starts
        if (i == cap) {
            cap *= 2;
            d->next = xrealloc(d->next, (size_t)cap * (size_t)C * sizeof *d->next);
        }
        int sa = (int)(pairs[i] / b->n), sb = (int)(pairs[i] % b->n);
        if (work && (*work += C) > WORK_MAX) {
            err = xstrdup("the patterns are too complex to combine");
            break;
        }
        for (int c = 0; c < C; c++) {
            int ta = a->next[(size_t)sa * a->n_cls + a->cls[rep[c]]];
            int tb = b->next[(size_t)sb * b->n_cls + b->cls[rep[c]]];
            if (ta < 0 || tb < 0) {
                d->next[(size_t)i * C + c] = -1;
                continue;
            }
            uint64_t key = (uint64_t)ta * (uint64_t)b->n + (uint64_t)tb, to = 0;
            if (!u64map_get(&seen, key, &to)) {
                if (d->n == REGEX_MAX_STATES) {
                    err = xprintf("the patterns together need over %d automaton states", REGEX_MAX_STATES);
                    break;
                }
                to = (uint64_t)d->n;
                pairs[d->n++] = (int64_t)key;
                u64map_put(&seen, key, to);
            }
            d->next[(size_t)i * C + c] = (int32_t)to;
        }
    }
    if (!err) {
        uint8_t *accepting = xmalloc((size_t)d->n);
        int64_t ones[256];
        for (int s = 0; s < d->n; s++)
            accepting[s] = a->dist[pairs[s] / b->n] == 0 && b->dist[pairs[s] % b->n] == 0;
        for (int c = 0; c < C; c++) ones[c] = 1;
        d->dist = xmalloc((size_t)d->n * sizeof *d->dist);
        costs(d, accepting, ones, d->dist);
        for (int64_t e = 0; e < (int64_t)d->n * C; e++)  // as determinize: no edge to where no match is
            if (d->next[e] >= 0 && d->dist[d->next[e]] == FAR) d->next[e] = -1;
        if (d->dist[0] == FAR) err = xstrdup("no string matches them all");
        free(accepting);
    }
    u64map_free(&seen);
    free(pairs);
    if (err) regex_free(d);
    if (!err) d->next = xrealloc(d->next, (size_t)d->n * (size_t)C * sizeof *d->next);
    return err;
}

int64_t regex_longest(const RegexDfa *d) {
    int n = d->n, C = d->n_cls, done = 0;
    int *in = xcalloc((size_t)n, sizeof *in), *order = xmalloc((size_t)n * sizeof *order);
    for (int64_t e = 0; e < (int64_t)n * C; e++)  // the edges left lead to states that reach a match
        if (d->next[e] >= 0 && d->dist[e / C] != FAR) in[d->next[e]]++;
    for (int s = 0; s < n; s++)
        if (in[s] == 0 && d->dist[s] != FAR) order[done++] = s;
    for (int i = 0; i < done; i++)  // Kahn's: each state once all that lead to it are placed
        for (int c = 0; c < C; c++) {
            int t = d->next[(size_t)order[i] * C + c];
            if (t >= 0 && --in[t] == 0) order[done++] = t;
        }
    int live = 0;
    for (int s = 0; s < n; s++) live += d->dist[s] != FAR;
    int64_t most = -1;
    if (done == live) {  // no cycle: the longest path to a match, last states first
        int64_t *len = xmalloc((size_t)n * sizeof *len);
        for (int i = done - 1; i >= 0; i--) {
            int s = order[i];
            len[s] = d->dist[s] == 0 ? 0 : -1;
            for (int c = 0; c < C; c++) {
                int t = d->next[(size_t)s * C + c];
                if (t >= 0 && len[t] >= 0 && len[t] + 1 > len[s]) len[s] = len[t] + 1;
            }
        }
        most = len[0];
        free(len);
    }
    free(in);
    free(order);
    return most;
}

// JSON mode: a byte-level pushdown automaton over the output, and the mask it makes (see json_mask.h).
#include "rollout/json_mask.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

typedef enum {
    J_START,      // before the object: '{'
    J_OBJ_FIRST,  // after '{': a key or '}'
    J_KEY,        // after ',' in an object: a key
    J_COLON,      // after a key: ':'
    J_VALUE,      // a value (after ':', or ',' in an array)
    J_ARR_FIRST,  // after '[': a value or ']'
    J_AFTER,      // after a value: ',' or its container's close
    J_STRING,     // in a string (a key or a value)
    J_ESCAPE,     // after '\'
    J_HEX,        // in \uXXXX: `hex` digits left
    J_MINUS,      // a number's '-': a digit
    J_ZERO,       // a number's leading 0: '.', 'e' or its end
    J_INT,        // its integer digits
    J_DOT,        // after '.': a digit
    J_FRAC,       // its fraction's digits
    J_EXP,        // after 'e': a sign or a digit
    J_EXP_SIGN,   // after the exponent's sign: a digit
    J_EXP_INT,    // the exponent's digits
    J_LITERAL,    // in true, false or null: `lit` is the rest
    J_SKEY,       // in a key of a schema's object: property lp's, lk bytes of it written
    J_ELIT,       // in a value of a schema's enum (node lnode): literal lp's, lk bytes of it written
    J_DONE,       // the object is complete
} Mode;

typedef struct {
    const JsonSchema *s;
    uint8_t mode, key, depth, ws;  // key: the string is an object's key; ws: whitespace bytes in a row
    uint8_t need, lo, hi;          // UTF-8 in a string: continuation bytes left, and the next one's range
    uint8_t hex, intonly;          // intonly: the number is an integer's (no fraction or exponent)
    uint8_t digits;                // in the number's integer part or exponent
    const char *lit;
    int lnode, lp, lk;
    int rnode, rx;  // in a walked string or number (schema node rnode, js_walked; 0: none): its automaton's state
    int64_t chars;  // and its characters so far
    struct {
        char open;            // '{' or '['
        uint16_t node;        // its schema node: a JS_OBJECT or JS_ARRAY, or 0 (any members)
        uint32_t at;          // JS_OBJECT: the properties passed; JS_ARRAY: the items begun
    } frame[JSON_MAX_DEPTH];  // the open containers (last: the state is copied up to depth)
} Json;

// A state's cache key at most (json_key): the fields, then each frame's.
#define JSON_KEY_MAX (11 + sizeof(const char *) + 20 + 8 + 7 * JSON_MAX_DEPTH)
#define SHORT_ESCAPES "\"\\/bfnrt"  // after '\\' in a string (or u and 4 hex digits)
#define MAX_WS (1 + 2 * JSON_MAX_DEPTH)  // whitespace bytes in a row at most: a line and its indent
// A number stays a finite double, an integer exact in one (below 2^53), as JavaScript's JSON.parse reads them.
#define MAX_INT_DIGITS 15
#define MAX_EXP_DIGITS 2

static int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static const JsNode *node_of(const Json *j, int id) { return &j->s->nodes[id]; }

// The innermost open container's schema node.
static const JsNode *top(const Json *j) { return node_of(j, j->frame[j->depth - 1].node); }

static int open_container(Json *j, char c, int node) {
    if (j->depth == JSON_MAX_DEPTH) return 0;
    j->frame[j->depth].open = c;
    j->frame[j->depth].node = (uint16_t)node;
    j->frame[j->depth++].at = 0;
    j->mode = c == '{' ? J_OBJ_FIRST : J_ARR_FIRST;
    return 1;
}

// The containers a member of container f (the f+1-th open) may still open within JSON_MAX_DEPTH.
static int room(int f) { return JSON_MAX_DEPTH - 1 - f; }

// The fewest bytes of a value of node id as a member of container f.
static int64_t member_cost(const Json *j, int id, int f) { return node_of(j, id)->cost[room(f)]; }

// The bytes of container f's (an object's) required properties from its i-th on: ',' key ':' value each.
static int64_t rest_required(const Json *j, int f, uint32_t i) {
    const JsNode *n = node_of(j, j->frame[f].node);
    return i < (uint32_t)n->n ? j->s->props[n->first + i].rest[room(f)] : 0;
}

// The bytes that close container f once its current member is done.
static int64_t frame_rest(const Json *j, int f) {
    const JsNode *n = node_of(j, j->frame[f].node);
    if (n->kind == JS_OBJECT) return js_add(1, rest_required(j, f, j->frame[f].at));
    if (n->kind != JS_ARRAY || j->frame[f].at >= n->min_items) return 1;
    return js_add(1, js_times(n->min_items - j->frame[f].at, js_add(1, member_cost(j, n->item, f))));
}

static int close_container(Json *j, char c) {
    if (j->depth == 0 || j->frame[j->depth - 1].open != (c == '}' ? '{' : '[') || frame_rest(j, j->depth - 1) != 1)
        return 0;
    j->depth--;
    j->mode = j->depth ? J_AFTER : J_DONE;
    return 1;
}

static int start_value(Json *j, unsigned char c) {
    static const char *const lits[] = {"rue", "alse", "ull"};
    j->intonly = 0;
    switch (c) {
    case '"': j->mode = J_STRING, j->key = 0; return 1;
    case '{':
    case '[': return open_container(j, (char)c, 0);
    case '-': j->mode = J_MINUS; return 1;
    case '0': j->mode = J_ZERO; return 1;
    case 't': j->mode = J_LITERAL, j->lit = lits[0]; return 1;
    case 'f': j->mode = J_LITERAL, j->lit = lits[1]; return 1;
    case 'n': j->mode = J_LITERAL, j->lit = lits[2]; return 1;
    }
    if (c >= '1' && c <= '9') return j->mode = J_INT, j->digits = 1, 1;
    return 0;
}

static int pattern_byte(Json *j, unsigned char c);

// A value of schema node id starting with c.
static int start_typed(Json *j, int id, unsigned char c) {
    const JsonSchema *s = j->s;
    id = json_schema_deref(s, id);
    const JsNode *n = node_of(j, id);
    switch (n->kind) {
    case JS_ANY: return start_value(j, c);
    case JS_OBJECT_ANY: return c == '{' && open_container(j, '{', 0);
    case JS_OBJECT:
    case JS_ARRAY: return json_schema_starts(s, id, c) && open_container(j, (char)c, id);
    case JS_ENUM:
        for (int i = 0; i < n->n; i++)
            if ((unsigned char)s->lits[n->first + i].text[0] == c) {
                j->mode = J_ELIT, j->lnode = id, j->lp = i, j->lk = 1;
                return 1;
            }
        return 0;
    case JS_ANYOF:
        for (int i = 0; i < n->n; i++)
            if (json_schema_starts(s, s->alts[n->first + i], c)) return start_typed(j, s->alts[n->first + i], c);
        return 0;
    default:  // a string, number, integer, boolean or null
        if (!json_schema_starts(s, id, c) || !start_value(j, c)) return 0;
        j->intonly = n->kind == JS_INTEGER;
        if (!js_walked(n)) return 1;
        j->rnode = id, j->rx = 0, j->chars = 0;
        return n->kind == JS_STRING || pattern_byte(j, c);  // a number's first byte is its own
    }
}

// The schema node of the value due in the innermost container (or the root's).
static int child_node(const Json *j) {
    if (!j->depth) return j->s->root;
    const JsNode *n = top(j);
    if (n->kind == JS_OBJECT) return j->s->props[n->first + j->frame[j->depth - 1].at - 1].node;
    return n->kind == JS_ARRAY ? n->item : 0;
}

// The literals J_SKEY (and J_KEY, before one) and J_ELIT match: the properties the object may write next (up to
// its next required one), or the enum's values; alternative i's text.
static const char *alt_text(const Json *j, int i, int *len) {
    const JsonSchema *s = j->s;
    if (j->mode != J_ELIT) {
        const JsProp *p = &s->props[top(j)->first + i];
        *len = p->len;
        return p->key;
    }
    const JsLit *l = &s->lits[s->nodes[j->lnode].first + i];
    *len = l->len;
    return l->text;
}

static int alt_last(const Json *j) {
    if (j->mode == J_ELIT) return j->s->nodes[j->lnode].n - 1;
    const JsNode *n = top(j);
    int i = (int)j->frame[j->depth - 1].at;
    while (i < n->n - 1 && !j->s->props[n->first + i].required) i++;
    return i;
}

// Alternative i's text, if it agrees with what is written (alternative lp's first lk bytes); else NULL.
static const char *alt_agrees(const Json *j, int lp, int lk, int i, int *len) {
    int n;
    const char *written = alt_text(j, lp, &n);
    const char *t = alt_text(j, i, len);
    return *len >= lk && !memcmp(written, t, (size_t)lk) ? t : NULL;
}

static int json_byte(Json *j, unsigned char c);

// A byte of a key (J_SKEY) or of an enum value (J_ELIT). A key ends at its closing quote; a complete enum value
// ends at the first byte that continues no value (a number may go on: 1 or 12).
static int literal_byte(Json *j, unsigned char c) {
    int last = alt_last(j), complete = 0, len;
    for (int i = j->lp; i <= last; i++) {
        const char *t = alt_agrees(j, j->lp, j->lk, i, &len);
        if (!t || len == j->lk) {
            complete |= t != NULL;
            continue;
        }
        if ((unsigned char)t[j->lk] != c) continue;
        j->lp = i;
        if (++j->lk == len && j->mode == J_SKEY) {
            j->mode = J_COLON;
            j->frame[j->depth - 1].at = (uint32_t)i + 1;
        }
        return 1;
    }
    if (!complete || j->mode == J_SKEY) return 0;
    j->mode = J_AFTER;
    return json_byte(j, c);
}

// The least bytes that finish the literal whose lk bytes of alternative lp are written: a key's with its value and
// the object's other required properties (J_KEY: a key not begun, lk 0).
static int64_t literal_cost(const Json *j, int lp, int lk) {
    int64_t best = JS_INF;
    int len;
    int d = j->depth - 1, last = alt_last(j);
    for (int i = lp; i <= last; i++) {
        if (!alt_agrees(j, lp, lk, i, &len)) continue;
        int64_t c = len - lk;
        if (j->mode != J_ELIT) {  // ':' the value, the required properties after it, '}'
            int64_t value = member_cost(j, j->s->props[top(j)->first + i].node, d);
            c = js_add(c + 1, js_add(value, rest_required(j, d, (uint32_t)i + 1) + 1));
        }
        best = c < best ? c : best;
    }
    return best;
}

static int key_start(Json *j, unsigned char c) {
    if (c != '"') return 0;
    if (j->frame[j->depth - 1].node == 0) return j->mode = J_STRING, j->key = 1, 1;
    if (j->frame[j->depth - 1].at >= (uint32_t)top(j)->n) return 0;
    j->mode = J_SKEY, j->lp = (int)j->frame[j->depth - 1].at, j->lk = 1;
    return 1;
}

// A ',' after a member: another is due (if the container's schema has room for it).
static int comma(Json *j) {
    const JsNode *n = top(j);
    uint32_t *at = &j->frame[j->depth - 1].at;
    if (j->frame[j->depth - 1].open == '{') {
        if (n->kind == JS_OBJECT && *at >= (uint32_t)n->n) return 0;
        return j->mode = J_KEY, 1;
    }
    if (n->kind == JS_ARRAY && *at >= n->max_items) return 0;
    ++*at;
    return j->mode = J_VALUE, 1;
}

// A byte of a walked value (a string's unescaped, a number's) through its automaton, or (a string's lengths
// alone) counted against its maxLength; 1 for other values.
static int pattern_byte(Json *j, unsigned char c) {
    if (!j->rnode) return 1;
    const JsNode *n = node_of(j, j->rnode);
    if (!n->re) {
        j->chars += c < 0x80 || c >= 0xC0;  // a character's first byte
        return j->chars <= n->max_items;
    }
    j->rx = regex_walk(n->re, j->rx, (const char *)&c, 1);
    return j->rx >= 0;
}

// Whether a walked value may end: its automaton matches, or (a string) it has its minLength.
static int walked_done(const Json *j) {
    const JsNode *n = node_of(j, j->rnode);
    return n->re ? n->re->dist[j->rx] == 0 : j->chars >= n->min_items;
}

// Whether the value may end here (a walked one once walked_done: then its walk ends); a string at its quote, a
// number at the byte after it.
static int walk_end(Json *j) {
    if (j->rnode && !walked_done(j)) return 0;
    j->rnode = j->rx = 0;
    j->chars = 0;
    return 1;
}

// The fewest bytes that finish a walked value: a match, or the characters a string's minLength lacks (not its
// closing quote).
static int64_t walked_rest(const Json *j) {
    const JsNode *n = node_of(j, j->rnode);
    return n->re ? n->re_cost[j->rx] : j->need + (n->min_items > j->chars ? n->min_items - j->chars : 0);
}

// The byte a short escape (after '\\') stands for.
static unsigned char unescaped(unsigned char c) {
    return c == 'b' ? '\b' : c == 'f' ? '\f' : c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c;
}

// A string's byte: UTF-8 (no overlong form, surrogate or code point past U+10FFFF), escapes, the closing quote
// (of a walked string, once it matches or has its minLength).
static int string_byte(Json *j, unsigned char c) {
    if (j->need) {
        if (c < j->lo || c > j->hi) return 0;
        j->need--;
        j->lo = 0x80, j->hi = 0xbf;
        return pattern_byte(j, c);
    }
    if (c == '"') {
        if (!walk_end(j)) return 0;
        return j->mode = j->key ? J_COLON : J_AFTER, 1;
    }
    if (c == '\\') return j->mode = J_ESCAPE, 1;
    if (c < 0x20 || (c >= 0x80 && c < 0xc2) || c > 0xf4) return 0;
    if (c < 0x80) return pattern_byte(j, c);
    j->need = c < 0xe0 ? 1 : c < 0xf0 ? 2 : 3;
    j->lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
    j->hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    return pattern_byte(j, c);
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

// The modes between tokens, where whitespace may come: where a key, ':', a value or ',' is due, and where a
// number may end (the whitespace ends it).
static const uint32_t ws_modes = 1u << J_OBJ_FIRST | 1u << J_KEY | 1u << J_COLON | 1u << J_VALUE |
                                 1u << J_ARR_FIRST | 1u << J_AFTER | 1u << J_ZERO | 1u << J_INT | 1u << J_FRAC |
                                 1u << J_EXP_INT;

// Feeds one byte; 0 when it cannot continue a JSON object (j is then undefined).
static int json_byte(Json *j, unsigned char c) {
    if (is_ws(c) && (ws_modes >> j->mode & 1)) {
        if (j->mode == J_ZERO || j->mode == J_INT || j->mode == J_FRAC || j->mode == J_EXP_INT) {
            if (!walk_end(j)) return 0;
            j->mode = J_AFTER;
        }
        return ++j->ws <= MAX_WS;
    }
    j->ws = 0;
    switch ((Mode)j->mode) {
    case J_START: return start_typed(j, j->s->root, c);
    case J_OBJ_FIRST:
        if (c == '}') return close_container(j, '}');
        return key_start(j, c);
    case J_KEY: return key_start(j, c);
    case J_SKEY:
    case J_ELIT: return literal_byte(j, c);
    case J_COLON: return c == ':' ? (j->mode = J_VALUE) : 0;
    case J_ARR_FIRST:
        if (c == ']') return close_container(j, ']');
        if (top(j)->kind == JS_ARRAY && top(j)->max_items == 0) return 0;
        j->frame[j->depth - 1].at = 1;
        return start_typed(j, child_node(j), c);
    case J_VALUE: return start_typed(j, child_node(j), c);
    case J_STRING: return string_byte(j, c);
    case J_ESCAPE:
        if (c == 'u' && !j->rnode) return j->mode = J_HEX, j->hex = 4, 1;  // none in a walked string
        if (!c || !strchr(SHORT_ESCAPES, c)) return 0;
        j->mode = J_STRING;
        return pattern_byte(j, unescaped(c));
    case J_HEX:
        if (!is_digit(c) && !((c | 0x20) >= 'a' && (c | 0x20) <= 'f')) return 0;
        if (--j->hex == 0) j->mode = J_STRING;
        return 1;
    case J_MINUS:
        if (c == '0') return j->mode = J_ZERO, pattern_byte(j, c);
        return is_digit(c) ? (j->mode = J_INT, j->digits = 1, pattern_byte(j, c)) : 0;
    case J_ZERO:
    case J_INT:
        if (j->mode == J_INT && is_digit(c)) return ++j->digits <= MAX_INT_DIGITS && pattern_byte(j, c);
        if (c == '.' && !j->intonly) return j->mode = J_DOT, pattern_byte(j, c);
        if ((c == 'e' || c == 'E') && !j->intonly) return j->mode = J_EXP, pattern_byte(j, c);
        if (!walk_end(j)) return 0;
        j->mode = J_AFTER;
        return json_byte(j, c);
    case J_DOT: return is_digit(c) ? (j->mode = J_FRAC, pattern_byte(j, c)) : 0;
    case J_FRAC:
        if (is_digit(c)) return pattern_byte(j, c);
        if (c == 'e' || c == 'E') return j->mode = J_EXP, pattern_byte(j, c);
        if (!walk_end(j)) return 0;
        j->mode = J_AFTER;
        return json_byte(j, c);
    case J_EXP:
        if (c == '+' || c == '-') return j->mode = J_EXP_SIGN, 1;
        return is_digit(c) ? (j->mode = J_EXP_INT, j->digits = 1) : 0;
    case J_EXP_SIGN: return is_digit(c) ? (j->mode = J_EXP_INT, j->digits = 1) : 0;
    case J_EXP_INT:
        if (is_digit(c)) return ++j->digits <= MAX_EXP_DIGITS;
        j->mode = J_AFTER;
        return json_byte(j, c);
    case J_LITERAL:
        if (c != (unsigned char)*j->lit) return 0;
        if (!*++j->lit) j->mode = J_AFTER;
        return 1;
    case J_AFTER:
        if (c == ',') return comma(j);
        return (c == '}' || c == ']') && close_container(j, (char)c);
    case J_DONE: return 0;
    }
    return 0;
}

// In a walked string after '\\': the fewest bytes of an escape's letter, the rest of the string and its quote.
static int64_t escape_cost(const Json *j) {
    int64_t c = JS_INF;
    for (const char *e = SHORT_ESCAPES; *e; e++) {
        Json after = *j;  // with the escape's character written
        if (pattern_byte(&after, unescaped((unsigned char)*e)) && js_add(2, walked_rest(&after)) < c)
            c = js_add(2, walked_rest(&after));  // the letter, the rest, the quote
    }
    return c;
}

// The bytes that finish what the innermost container is in (its current member, then the container).
static int64_t top_cost(const Json *j) {
    const JsonSchema *s = j->s;
    int d = j->depth - 1;
    const JsNode *n = d >= 0 ? top(j) : NULL;
    int64_t rest = d >= 0 ? frame_rest(j, d) : 0, key = j->key ? 2 : 0;
    switch ((Mode)j->mode) {
    case J_START: return node_of(j, s->root)->cost[JSON_MAX_DEPTH];
    case J_DONE: return 0;
    case J_OBJ_FIRST:  // the required members (no ',' before the first) and '}'
        return n->kind == JS_OBJECT && rest_required(j, d, 0) ? rest_required(j, d, 0) : 1;
    case J_ARR_FIRST:
        if (n->kind != JS_ARRAY || n->min_items == 0) return 1;
        return js_times(n->min_items, js_add(1, member_cost(j, n->item, d)));
    case J_AFTER: return rest;
    case J_KEY:  // a member is due ("":0 in any object), then the required ones left
        return n->kind == JS_OBJECT ? literal_cost(j, (int)j->frame[d].at, 0) : 5;
    case J_SKEY: return literal_cost(j, j->lp, j->lk);
    case J_COLON: return js_add(1 + member_cost(j, child_node(j), d), rest);
    case J_VALUE: return js_add(d >= 0 ? member_cost(j, child_node(j), d) : 0, rest);
    case J_STRING: return js_add(j->rnode ? js_add(walked_rest(j), 1) : j->need + 1 + key, rest);
    case J_ESCAPE: return js_add(j->rnode ? escape_cost(j) : 2 + key, rest);
    case J_HEX: return js_add(j->hex + 1 + key, rest);
    case J_MINUS:
    case J_DOT: return js_add(j->rnode ? walked_rest(j) : 1, rest);
    case J_EXP:
    case J_EXP_SIGN: return js_add(1, rest);
    case J_LITERAL: return js_add((int64_t)strlen(j->lit), rest);
    case J_ELIT: return js_add(literal_cost(j, j->lp, j->lk), rest);
    case J_ZERO:
    case J_INT:
    case J_FRAC: return js_add(j->rnode ? walked_rest(j) : 0, rest);
    case J_EXP_INT: return rest;
    }
    return rest;
}

// The bytes (so tokens, one each) that close j at the least: the open string, literal or number finished, a
// key given its value, the required members written, each open container closed.
static int64_t json_cost(const Json *j) {
    int64_t c = top_cost(j);
    for (int f = 0; f + 1 < j->depth; f++) c = js_add(c, frame_rest(j, f));
    return c;
}

// *to = *from, but for the frames past its depth.
static void json_copy(Json *to, const Json *from) {
    memcpy(to, from, offsetof(Json, frame) + from->depth * sizeof from->frame[0]);
}

static int json_feed(Json *j, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!json_byte(j, (unsigned char)s[i])) return 0;
    return 1;
}

static int in_string(uint8_t mode) { return mode == J_STRING || mode == J_ESCAPE || mode == J_HEX; }

uint8_t *json_plain_tokens(const Tokenizer *tok, int64_t V) {
    uint8_t *plain = xcalloc((size_t)V, 1);
    for (int64_t id = 0; id < V && id < tok->n_ids; id++) {
        size_t len = 0, i = 0;
        const char *b = tokenizer_id_bytes(tok, (int32_t)id, &len);
        Json j = {.mode = J_STRING};
        while (b && i < len && json_byte(&j, (unsigned char)b[i]) && in_string(j.mode)) i++;
        plain[id] = len > 0 && i == len && j.mode == J_STRING && j.need == 0;
    }
    return plain;
}

static int is_stop(int64_t id, const int32_t *stop_ids, int n_stop) {
    for (int i = 0; i < n_stop; i++)
        if (stop_ids[i] == id) return 1;
    return 0;
}

// Should no token be allowed, the stop ids come back at logit 0: the output ends (no NaN draw). Returns allowed.
static int64_t end_if_none(const int32_t *stop_ids, int n_stop, float *logits, int64_t V, int64_t allowed) {
    for (int i = 0; allowed == 0 && i < n_stop; i++)
        if (stop_ids[i] >= 0 && stop_ids[i] < V) logits[stop_ids[i]] = 0.0f;
    return allowed;
}

// Masks every token but the stop ids (the output is complete); returns how many are left.
static int64_t only_stops(const int32_t *stop_ids, int n_stop, float *logits, int64_t V) {
    int64_t allowed = 0;
    for (int64_t id = 0; id < V; id++) {
        if (is_stop(id, stop_ids, n_stop))
            allowed++;
        else
            logits[id] = -INFINITY;
    }
    return allowed;
}

// Takes the special tokens (added ones marked so) that are not stop ids out of l: they are no text.
static void drop_special(MaskList *l, const Tokenizer *tok, const int32_t *stop_ids, int n_stop) {
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].special && !is_stop(tok->added[i].id, stop_ids, n_stop))
            mask_list_drop(l, tok->added[i].id);
}

// The mask of one state of a constraint's automaton from its list (the tokens that may come next, each with
// its need): the cache's under key, or built by build(ctx, list) (and kept). Then end_if_none.
static int64_t listed(MaskCache *cache, const void *key, size_t n, void (*build)(const void *ctx, MaskList *l),
                      const void *ctx, int64_t tokens_left, const int32_t *stop_ids, int n_stop, float *logits,
                      int64_t V) {
    const MaskList *l = cache ? mask_cache_find(cache, key, n) : NULL;
    MaskList own = {0};
    if (!l) {
        build(ctx, &own);
        l = cache ? mask_cache_keep(cache, key, n, &own) : &own;
    }
    int64_t allowed = mask_list_apply(l, tokens_left, logits, V);
    mask_list_free(&own);
    return end_if_none(stop_ids, n_stop, logits, V, allowed);
}

typedef struct {
    const Tokenizer *tok;
    const Json *at;
    const uint8_t *plain;
    const int32_t *stop_ids;
    int n_stop;
    int64_t V;
} JsonList;

// The tokens that continue the unfinished object at, each needing itself, the rest and a stop; not the special
// tokens or the stop ids (they would end it too soon).
static void json_list(const void *ctx, MaskList *l) {
    const JsonList *c = ctx;
    uint8_t first[256];  // whether a token may start with the byte (most tokens are out at their first)
    // a plain token leaves the state as it is (not in a walked string, whose automaton it moves)
    int string = c->plain && c->at->mode == J_STRING && c->at->need == 0 && !c->at->rnode;
    int64_t plain_need = 1 + json_cost(c->at) + 1;
    Json j;
    for (int ch = 0; ch < 256; ch++) {
        json_copy(&j, c->at);
        first[ch] = (uint8_t)json_byte(&j, (unsigned char)ch);
    }
    for (int64_t id = 0; id < c->V; id++) {
        size_t len = 0;
        const char *b = id < c->tok->n_ids ? tokenizer_id_bytes(c->tok, (int32_t)id, &len) : NULL;
        if (!b || !len || is_stop(id, c->stop_ids, c->n_stop)) continue;
        if (string && c->plain[id]) {
            mask_list_add(l, (int32_t)id, plain_need);
            continue;
        }
        if (!first[(unsigned char)b[0]]) continue;
        json_copy(&j, c->at);
        if (json_feed(&j, b, len)) mask_list_add(l, (int32_t)id, 1 + json_cost(&j) + 1);
    }
    drop_special(l, c->tok, c->stop_ids, c->n_stop);
}

// j's state as a cache key (its bytes, field by field: no padding) into key; returns its length.
static size_t json_key(const Json *j, uint8_t key[JSON_KEY_MAX]) {
    uint8_t head[] = {'j', j->mode, j->key, j->depth, j->ws, j->need, j->lo, j->hi, j->hex, j->intonly, j->digits};
    int32_t lits[] = {j->lnode, j->lp, j->lk, j->rnode, j->rx};
    const JsNode *r = node_of(j, j->rnode);  // past its minLength, with no maxLength, a count is like the next
    int64_t chars = r->max_items == INT64_MAX && j->chars > r->min_items ? r->min_items : j->chars;
    size_t n = 0;
    memcpy(key + n, head, sizeof head);
    n += sizeof head;
    memcpy(key + n, &j->lit, sizeof j->lit);
    n += sizeof j->lit;
    memcpy(key + n, lits, sizeof lits);
    n += sizeof lits;
    memcpy(key + n, &chars, sizeof chars);
    n += sizeof chars;
    for (int f = 0; f < j->depth; f++) {
        key[n++] = (uint8_t)j->frame[f].open;
        memcpy(key + n, &j->frame[f].node, sizeof j->frame[f].node);
        n += sizeof j->frame[f].node;
        memcpy(key + n, &j->frame[f].at, sizeof j->frame[f].at);
        n += sizeof j->frame[f].at;
    }
    return n;
}

int64_t json_mask(const Tokenizer *tok, const JsonSchema *schema, const uint8_t *plain, MaskCache *cache,
                  const char *text, size_t n, int64_t tokens_left, const int32_t *stop_ids, int n_stop,
                  float *logits, int64_t V) {
    Json at = {.s = schema, .mode = J_START};
    if (!json_feed(&at, text, n)) return 0;
    if (at.mode == J_DONE) return only_stops(stop_ids, n_stop, logits, V);
    uint8_t key[JSON_KEY_MAX];
    JsonList ctx = {tok, &at, plain, stop_ids, n_stop, V};
    return listed(cache, key, json_key(&at, key), json_list, &ctx, tokens_left, stop_ids, n_stop, logits, V);
}

int64_t choice_mask(const Tokenizer *tok, const char *const *choices, int n_choices, const char *text, size_t n,
                    int64_t tokens_left, const int32_t *stop_ids, int n_stop, float *logits, int64_t V) {
    const char **live = xmalloc((size_t)n_choices * sizeof *live);  // what the choices text begins go on with
    size_t *rest = xmalloc((size_t)n_choices * sizeof *rest);        // and its bytes
    uint8_t next[256] = {0};  // the bytes they go on with (a token starting with another is out at once)
    int n_live = 0, whole = 0;
    for (int c = 0; c < n_choices; c++) {
        size_t len = strlen(choices[c]);
        if (len < n || memcmp(choices[c], text, n) != 0) continue;
        whole |= len == n;
        if (len == n) continue;
        live[n_live] = choices[c] + n;
        rest[n_live++] = len - n;
        next[(unsigned char)choices[c][n]] = 1;
    }
    int64_t allowed = 0;
    for (int64_t id = 0; id < V; id++) {
        int stop = is_stop(id, stop_ids, n_stop), fits = 0;
        size_t len = 0;
        const char *b = !stop && id < tok->n_ids ? tokenizer_id_bytes(tok, (int32_t)id, &len) : NULL;
        if (b && n == 0) {  // a text's first token, as the text keeps it
            size_t lead = tokenizer_lead_strip(tok, b, len);
            b += lead;
            len -= lead;
        }
        if (!b || !len || !next[(unsigned char)b[0]]) b = NULL;
        for (int k = 0; b && !fits && k < n_live; k++)  // the token, the bytes after it (a token each at worst),
            fits = live[k][0] == b[0] && rest[k] >= len && memcmp(live[k], b, len) == 0 &&  // and a stop
                   1 + (int64_t)(rest[k] - len) + 1 <= tokens_left;
        if (stop ? whole : fits && !tokenizer_id_special(tok, (int32_t)id))  // a stop once it is a choice
            allowed++;
        else
            logits[id] = -INFINITY;
    }
    free(live);
    free(rest);
    return end_if_none(stop_ids, n_stop, logits, V, allowed);
}

typedef struct {
    const Tokenizer *tok;
    const RegexDfa *d;
    int at;
    int first;  // no text yet: a token's leading spaces that decode strips from a text do not count
    const int32_t *stop_ids;
    int n_stop;
    int64_t V;
} RegexList;

// The tokens that go on from state at towards a match, each needing itself, the rest (a byte a token) and a stop;
// the stop ids once at is a match (needing themselves); not the special tokens.
static void regex_list(const void *ctx, MaskList *l) {
    const RegexList *c = ctx;
    int matched = c->d->dist[c->at] == 0;
    for (int64_t id = 0; id < c->V; id++) {
        size_t len = 0;
        if (is_stop(id, c->stop_ids, c->n_stop)) {
            if (matched) mask_list_add(l, (int32_t)id, 1);
            continue;
        }
        const char *b = id < c->tok->n_ids ? tokenizer_id_bytes(c->tok, (int32_t)id, &len) : NULL;
        size_t lead = b && c->first ? tokenizer_lead_strip(c->tok, b, len) : 0;
        int to = b && len > lead ? regex_walk(c->d, c->at, b + lead, len - lead) : -1;  // most are out at byte 1
        if (to >= 0) mask_list_add(l, (int32_t)id, 1 + c->d->dist[to] + 1);
    }
    drop_special(l, c->tok, c->stop_ids, c->n_stop);
}

int64_t regex_mask(const Tokenizer *tok, const RegexDfa *d, MaskCache *cache, const char *text, size_t n,
                   int64_t tokens_left, const int32_t *stop_ids, int n_stop, float *logits, int64_t V) {
    int at = regex_walk(d, 0, text, n);
    if (at < 0) return 0;
    uint8_t key[1 + sizeof at] = {n == 0 ? 'R' : 'r'};
    memcpy(key + 1, &at, sizeof at);
    RegexList ctx = {tok, d, at, n == 0, stop_ids, n_stop, V};
    return listed(cache, key, sizeof key, regex_list, &ctx, tokens_left, stop_ids, n_stop, logits, V);
}

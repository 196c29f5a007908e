// JSON mode: a byte-level pushdown automaton over the output, and the mask it makes (see json_mask.h).
#include "rollout/json_mask.h"

#include <math.h>
#include <string.h>

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
    J_DONE,       // the object is complete
} Mode;

typedef struct {
    uint8_t mode, key, depth, ws;  // key: the string is an object's key; ws: whitespace bytes in a row
    uint8_t need, lo, hi;          // UTF-8 in a string: continuation bytes left, and the next one's range
    uint8_t hex;
    const char *lit;
    char stack[JSON_MAX_DEPTH];  // '{' or '['
} Json;

#define MAX_WS (1 + 2 * JSON_MAX_DEPTH)  // whitespace bytes in a row at most: a line and its indent

static int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static int open_container(Json *j, char c) {
    if (j->depth == JSON_MAX_DEPTH) return 0;
    j->stack[j->depth++] = c;
    j->mode = c == '{' ? J_OBJ_FIRST : J_ARR_FIRST;
    return 1;
}

static int close_container(Json *j, char c) {
    if (j->depth == 0 || j->stack[j->depth - 1] != (c == '}' ? '{' : '[')) return 0;
    j->depth--;
    j->mode = j->depth ? J_AFTER : J_DONE;
    return 1;
}

static int start_value(Json *j, unsigned char c) {
    static const char *const lits[] = {"rue", "alse", "ull"};
    switch (c) {
    case '"': j->mode = J_STRING, j->key = 0; return 1;
    case '{':
    case '[': return open_container(j, (char)c);
    case '-': j->mode = J_MINUS; return 1;
    case '0': j->mode = J_ZERO; return 1;
    case 't': j->mode = J_LITERAL, j->lit = lits[0]; return 1;
    case 'f': j->mode = J_LITERAL, j->lit = lits[1]; return 1;
    case 'n': j->mode = J_LITERAL, j->lit = lits[2]; return 1;
    }
    if (c >= '1' && c <= '9') return j->mode = J_INT, 1;
    return 0;
}

// A string's byte: UTF-8 (no overlong form, surrogate or code point past U+10FFFF), escapes, the closing quote.
static int string_byte(Json *j, unsigned char c) {
    if (j->need) {
        if (c < j->lo || c > j->hi) return 0;
        j->need--;
        j->lo = 0x80, j->hi = 0xbf;
        return 1;
    }
    if (c == '"') return j->mode = j->key ? J_COLON : J_AFTER, 1;
    if (c == '\\') return j->mode = J_ESCAPE, 1;
    if (c < 0x20 || (c >= 0x80 && c < 0xc2) || c > 0xf4) return 0;
    if (c < 0x80) return 1;
    j->need = c < 0xe0 ? 1 : c < 0xf0 ? 2 : 3;
    j->lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
    j->hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    return 1;
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
        if (j->mode == J_ZERO || j->mode == J_INT || j->mode == J_FRAC || j->mode == J_EXP_INT) j->mode = J_AFTER;
        return ++j->ws <= MAX_WS;
    }
    j->ws = 0;
    switch ((Mode)j->mode) {
    case J_START: return c == '{' && open_container(j, '{');
    case J_OBJ_FIRST:
        if (c == '}') return close_container(j, '}');
        return c == '"' ? (j->mode = J_STRING, j->key = 1) : 0;
    case J_KEY: return c == '"' ? (j->mode = J_STRING, j->key = 1) : 0;
    case J_COLON: return c == ':' ? (j->mode = J_VALUE) : 0;
    case J_ARR_FIRST:
        if (c == ']') return close_container(j, ']');
        return start_value(j, c);
    case J_VALUE: return start_value(j, c);
    case J_STRING: return string_byte(j, c);
    case J_ESCAPE:
        if (c == 'u') return j->mode = J_HEX, j->hex = 4, 1;
        return c && strchr("\"\\/bfnrt", c) ? (j->mode = J_STRING) : 0;
    case J_HEX:
        if (!is_digit(c) && !((c | 0x20) >= 'a' && (c | 0x20) <= 'f')) return 0;
        if (--j->hex == 0) j->mode = J_STRING;
        return 1;
    case J_MINUS:
        if (c == '0') return j->mode = J_ZERO, 1;
        return is_digit(c) ? (j->mode = J_INT) : 0;
    case J_ZERO:
    case J_INT:
        if (j->mode == J_INT && is_digit(c)) return 1;
        if (c == '.') return j->mode = J_DOT, 1;
        if (c == 'e' || c == 'E') return j->mode = J_EXP, 1;
        j->mode = J_AFTER;
        return json_byte(j, c);
    case J_DOT: return is_digit(c) ? (j->mode = J_FRAC) : 0;
    case J_FRAC:
        if (is_digit(c)) return 1;
        if (c == 'e' || c == 'E') return j->mode = J_EXP, 1;
        j->mode = J_AFTER;
        return json_byte(j, c);
    case J_EXP:
        if (c == '+' || c == '-') return j->mode = J_EXP_SIGN, 1;
        return is_digit(c) ? (j->mode = J_EXP_INT) : 0;
    case J_EXP_SIGN: return is_digit(c) ? (j->mode = J_EXP_INT) : 0;
    case J_EXP_INT:
        if (is_digit(c)) return 1;
        j->mode = J_AFTER;
        return json_byte(j, c);
    case J_LITERAL:
        if (c != (unsigned char)*j->lit) return 0;
        if (!*++j->lit) j->mode = J_AFTER;
        return 1;
    case J_AFTER:
        if (c == ',') return j->mode = j->stack[j->depth - 1] == '{' ? J_KEY : J_VALUE, 1;
        return (c == '}' || c == ']') && close_container(j, (char)c);
    case J_DONE: return 0;
    }
    return 0;
}

// The bytes (so tokens, one each) that close j at the least: the open string, escape or number finished, a
// key given its value, then each open container closed.
static int json_cost(const Json *j) {
    int c = j->depth, key = j->key ? 2 : 0;  // a key's ':' and a value ('0')
    switch ((Mode)j->mode) {
    case J_START: return 2;
    case J_STRING: return c + j->need + 1 + key;
    case J_ESCAPE: return c + 2 + key;
    case J_HEX: return c + j->hex + 1 + key;
    case J_MINUS:
    case J_DOT:
    case J_EXP:
    case J_EXP_SIGN:
    case J_VALUE: return c + 1;
    case J_LITERAL: return c + (int)strlen(j->lit);
    case J_KEY: return c + 4;  // "":0
    case J_COLON: return c + 2;
    default: return c;
    }
}

static int json_feed(Json *j, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!json_byte(j, (unsigned char)s[i])) return 0;
    return 1;
}

int64_t json_mask(const Tokenizer *tok, const char *text, size_t n, int64_t tokens_left, const int32_t *stop_ids,
                  int n_stop, float *logits, int64_t V) {
    Json at = {.mode = J_START};
    if (!json_feed(&at, text, n)) return 0;
    int64_t allowed = 0;
    if (at.mode == J_DONE) {  // only the stop ids
        for (int64_t id = 0; id < V; id++) {
            int stop = 0;
            for (int i = 0; i < n_stop; i++) stop |= stop_ids[i] == id;
            if (stop) allowed++;
            else logits[id] = -INFINITY;
        }
        return allowed;
    }
    for (int64_t id = 0; id < V; id++) {
        size_t len = 0;
        const char *b = id < tok->n_ids ? tokenizer_id_bytes(tok, (int32_t)id, &len) : NULL;
        Json j = at;
        if (b && len && json_feed(&j, b, len) && 1 + json_cost(&j) <= tokens_left) {
            allowed++;
            continue;
        }
        logits[id] = -INFINITY;
    }
    for (int i = 0; i < tok->n_added + n_stop; i++) {  // special tokens are not text; a stop id ends it too soon
        int32_t id = i < tok->n_added ? tok->added[i].id : stop_ids[i - tok->n_added];
        int special = i >= tok->n_added || tok->added[i].special;
        if (special && id >= 0 && id < V && logits[id] != -INFINITY) {
            logits[id] = -INFINITY;
            allowed--;
        }
    }
    for (int i = 0; allowed == 0 && i < n_stop; i++)  // nothing continues it (cannot be with the byte tokens of a
        logits[stop_ids[i]] = 0.0f;                  // byte-level vocabulary): the output ends, no NaN draw
    return allowed;
}

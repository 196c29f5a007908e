// Structured outputs (grpo serve's response_format json_schema, vLLM's guided_json): a JSON Schema compiled into
// the nodes that JSON mode's automaton (json_mask.h) walks, so that every output validates.
//
// The subset, as OpenAI's strict mode and Pydantic write it: type (one or a list), properties (written in the
// schema's order: required ones always, the others when the model picks them), required, additionalProperties
// (no property beyond the listed ones is written), items, minItems, maxItems, enum, const, anyOf/oneOf whose
// alternatives start with different characters (Optional[X] is anyOf [X, null]), $ref into the schema ($defs,
// definitions, "#"), a string's pattern (ECMA-262's, found anywhere in the string unless anchored: through
// regex_dfa.h, as REGEX_ECMA; no \u escape then) or minLength/maxLength (not both). The root is an object.
// Annotations (title, description, default, ...) change nothing; any other keyword (format, minimum, ...) is
// refused by name, never ignored.
#pragma once
#include <stdint.h>

#include <cjson/cJSON.h>

#include "rollout/regex_dfa.h"

#define JS_INF (INT64_MAX / 8)  // a cost no output can pay
#define JS_MAX_DEPTH 32         // objects and arrays nested at most (json_mask.h)

typedef enum {
    JS_ANY,         // any JSON value
    JS_OBJECT_ANY,  // any object
    JS_OBJECT,      // properties [first, first + n)
    JS_ARRAY,       // items `item`, min_items..max_items of them
    JS_STRING,
    JS_NUMBER,
    JS_INTEGER,
    JS_BOOLEAN,
    JS_NULL,
    JS_ENUM,   // one of lits [first, first + n) (their JSON text)
    JS_ANYOF,  // one of alts [first, first + n): the one that can start with the value's first character
    JS_REF,    // node `item`
} JsKind;

typedef struct {
    JsKind kind;
    int first, n;
    int item;
    int64_t min_items, max_items;  // JS_ARRAY's items; JS_STRING's characters (without re; else 0, INT64_MAX)
    int64_t cost[JS_MAX_DEPTH + 1];  // the fewest bytes of a value with room for cost[r]: r more containers
    uint8_t starts[32];              // the bytes a value can start with (a bit each)
    RegexDfa *re;                    // JS_STRING: what its characters (unescaped) must match; JS_INTEGER and
                                     // JS_NUMBER: its text (its bounds); or NULL
    int64_t *re_cost;                // and the fewest bytes from each of re's states to a match, as JSON writes
                                     // them (an escaped character: 2)
} JsNode;

typedef struct {
    char *key;  // as written: a JSON string, quotes and escapes included
    int len;
    int node;
    int required;
    int64_t rest[JS_MAX_DEPTH + 1];  // the bytes of this and the later required properties (',' key ':' value
                                     // each), their values with room for rest[r] containers
} JsProp;

typedef struct {
    char *text;
    int len;
} JsLit;

typedef struct JsonSchema {
    JsNode *nodes;  // node 0 is JS_ANY
    int n_nodes, root;
    JsProp *props;
    int n_props;
    JsLit *lits;
    int n_lits;
    int *alts;
    int n_alts;
} JsonSchema;

// Compiles schema (the request's; it stays the caller's). Returns NULL with a malloc'd message naming the keyword
// and where it is (a JSON pointer) in *why.
JsonSchema *json_schema_compile(const cJSON *schema, char **why);
void json_schema_free(JsonSchema *s);
// Whether a value of node id can start with byte c.
static inline int json_schema_starts(const JsonSchema *s, int id, unsigned char c) {
    return s->nodes[id].starts[c >> 3] >> (c & 7) & 1;
}
// The fewest bytes of the root's value (its shortest answer).
static inline int64_t json_schema_least(const JsonSchema *s) { return s->nodes[s->root].cost[JS_MAX_DEPTH]; }
static inline int64_t js_add(int64_t a, int64_t b) { return a + b < JS_INF ? a + b : JS_INF; }
static inline int64_t js_times(int64_t k, int64_t c) { return c > 0 && k >= JS_INF / c ? JS_INF : k * c; }
// Whether a value of node n walks its bytes: a string's characters through a pattern's or format's automaton or
// counted, a number's or integer's through its bounds' automaton.
static inline int js_walked(const JsNode *n) {
    return n->re || (n->kind == JS_STRING && (n->min_items > 0 || n->max_items < INT64_MAX));
}
// id with its $refs followed.
int json_schema_deref(const JsonSchema *s, int id);

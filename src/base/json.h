// cJSON helpers that turn missing keys and wrong types into one-line errors naming file and key.
#pragma once
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/util.h"

// Parses text[0..len) as exactly one JSON value (only whitespace may follow); NULL otherwise. A number written
// with a fraction or an exponent ("2.0", "1e2") or with more than 15 digits keeps its text as its valuestring
// (NULL for other numbers): cJSON's double loses the int/float kind and the digits past 2^53. Here and below.
cJSON *json_parse_exact(const char *text, size_t len, size_t *error_offset);
// One JSONL line. JSON strings may hold U+0000 ("\u0000"), which cJSON's C strings cannot: such
// escapes are swapped for a noncharacter absent from the line (*nul_sentinel, 0 if none) and
// json_string_bytes swaps it back. NULL when the line is not exactly one JSON value.
cJSON *json_parse_line(const char *line, size_t len, uint32_t *nul_sentinel);
// Whether text holds nul_sentinel (json_parse_line's; 0: none), a U+0000 of the line it came from.
int json_holds_nul(const char *text, uint32_t nul_sentinel);
// A string item's bytes (malloc'd, NUL-terminated) and their length, U+0000 restored.
char *json_string_bytes(const cJSON *item, uint32_t nul_sentinel, size_t *len);
// A JSONL data file read one object a line (the SFT and GRPO prompt loaders): blank lines are skipped and
// the line number kept for messages.
typedef struct {
    const char *path;  // borrowed
    FILE *f;
    char *buf;
    size_t cap;
    int64_t line;      // 1-based line of the object jsonl_next returned last
    uint32_t nul;      // that line's U+0000 sentinel (json_parse_line), for json_string_bytes
} JsonlReader;

// Dies with "KEY: cannot open PATH: why"; key names the option or config key that gave the file.
void jsonl_open(JsonlReader *r, const char *path, const char *key);
// The next non-blank line's JSON object (the caller cJSON_Deletes it), or NULL at the end of the file.
// Dies with "PATH:LINE: not a JSON object" on any other line, and on a read error or an over-long line.
cJSON *jsonl_next(JsonlReader *r);
void jsonl_close(JsonlReader *r);

// Writes s[0..n) as a JSON string literal (quotes, escapes; other UTF-8 as is).
void json_write_string(FILE *f, const char *s, size_t n);
// Appends v as Python's json.dumps(v, ensure_ascii=False) writes it (separators ", " and ": "): the `tojson`
// filter of Hugging Face chat templates (transformers and @huggingface/jinja agree on this). Strings keep
// UTF-8 and escape \" \\ \b \f \n \r \t and other controls as \u00XX; numbers with no fraction are written as
// integers (the JS engine's way), others in the shortest form that reads back the same.
void json_dump_py(Buf *out, const cJSON *v, uint32_t nul_sentinel);
// Writes a number with 9 significant digits (float round trip), or null when it is not finite.
void json_write_number(FILE *f, double x);
// Parses a JSON file; dies with the path and byte offset on malformed JSON. Here and in json_parse_line
// an object's duplicate keys keep the last value, as Python and Hugging Face do (json_parse_exact keeps
// them all, for callers that refuse duplicates).
cJSON *json_load_file(const char *path, size_t max);  // max: file_read_all's cap
// Writes root, pretty-printed, to path atomically (base/util's AtomicFile).
void json_save_file(const char *path, const cJSON *root);
// Required integer / number; `where` names the file for the error message.
int64_t json_get_int(const cJSON *obj, const char *key, const char *where);
double json_get_number(const cJSON *obj, const char *key, const char *where);
// Optional values: `fallback` when the key is absent or null; a wrong type still dies.
int64_t json_get_int_or(const cJSON *obj, const char *key, int64_t fallback, const char *where);
double json_get_number_or(const cJSON *obj, const char *key, double fallback, const char *where);
int json_get_bool_or(const cJSON *obj, const char *key, int fallback, const char *where);
// Number item -> int64, requiring an exact integer in [lo, hi].
int json_as_int(const cJSON *item, int64_t lo, int64_t hi, int64_t *out);

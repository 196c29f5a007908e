#include "base/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

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
    return root;
}

cJSON *json_load_file(const char *path) {
    size_t len, off;
    char *text = file_read_all(path, &len);
    cJSON *root = json_parse_exact(text, len, &off);
    free(text);
    if (!root) die("%s: malformed JSON near byte %zu", path, off);
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

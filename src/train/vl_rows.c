#include "train/vl_rows.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

// An image path as a data row names it: relative to the data file's directory unless absolute.
static char *row_path(const RecordReader *r, const char *p) {
    const char *slash = strrchr(r->path, '/');
    if (p[0] == '/' || !slash) return xstrdup(p);
    return xprintf("%.*s/%s", (int)(slash - r->path), r->path, p);
}

// One image of a row's list: a path (relative to the data file's directory), {"path": ...} / {"image": ...},
// or {"bytes": ...} (a Parquet row's encoded image).
static void row_image(const cJSON *it, const RecordReader *r, const char *key, int k, VlImage *im) {
    const cJSON *bytes = cJSON_IsObject(it) ? cJSON_GetObjectItemCaseSensitive(it, "bytes") : NULL;
    const cJSON *path = it;
    if (cJSON_IsObject(it)) path = cJSON_GetObjectItemCaseSensitive(it, "path");
    if (cJSON_IsObject(it) && !cJSON_IsString(path)) path = cJSON_GetObjectItemCaseSensitive(it, "image");
    memset(im, 0, sizeof *im);
    if (cJSON_IsString(bytes) && bytes->valuestring[0]) {
        im->bytes = (uint8_t *)json_string_bytes(bytes, r->nul, &im->n);
        im->path = xprintf("%s[%d]", key, k);
        return;
    }
    if (!cJSON_IsString(path) || !path->valuestring[0])
        die("%s: \"%s\"[%d] must be an image file's path, {\"path\": ...} or {\"bytes\": ...}", r->where, key, k);
    im->path = row_path(r, path->valuestring);
}

// "<image>" in s replaced by VL_IMAGE_TEXT (a fresh string); *count += how many there were.
char *vl_expand_placeholders(const char *s, int *count) {
    Buf b = {0};
    for (const char *at; (at = strstr(s, "<image>")); s = at + 7) {
        buf_append(&b, s, (size_t)(at - s));
        buf_append(&b, VL_IMAGE_TEXT, strlen(VL_IMAGE_TEXT));
        ++*count;
    }
    buf_append(&b, s, strlen(s));
    return b.data;
}

// obj's string key with its "<image>" placeholders expanded.
static void expand_in(cJSON *obj, const char *key, int *placeholders) {
    char *text = vl_expand_placeholders(cJSON_GetObjectItemCaseSensitive(obj, key)->valuestring, placeholders);
    cJSON *s = cJSON_CreateString(text);
    free(text);
    if (!s) die("out of memory");
    cJSON_ReplaceItemInObjectCaseSensitive(obj, key, s);
}

// A message-list prompt's copy for rendering: "<image>" placeholders in its text (contents and text parts)
// expanded, its image parts' images (paths relative to the data file as the row list's are, or data: URLs'
// bytes) after the row's list; *placeholders counts the images the text and parts stand for.
cJSON *vl_row_messages(const cJSON *msgs, const RecordReader *r, const char *key, VlImage **ims, int *n,
                         int *placeholders) {
    cJSON *copy = cJSON_Duplicate(msgs, 1);
    if (!copy) die("out of memory");
    VlImage *parts = NULL;
    int n_paths = 0;
    char *err = vl_message_images(copy, 1, &parts, &n_paths);
    if (err) die("%s: \"%s\": %s", r->where, key, err);
    if (n_paths && *n) die("%s: images both in \"%s\"'s content parts and in the row's image list", r->where, key);
    for (cJSON *m = copy->child; m; m = m->next) {
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsString(content)) expand_in(m, "content", placeholders);
        for (cJSON *part = cJSON_IsArray(content) ? content->child : NULL; part; part = part->next)
            if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(part, "text")))
                expand_in(part, "text", placeholders);
    }
    *placeholders += n_paths;
    *ims = xrealloc(*ims, (size_t)(*n + n_paths + 1) * sizeof **ims);
    for (int i = 0; i < n_paths; i++) {
        (*ims)[*n + i] = parts[i];
        if (parts[i].bytes) continue;
        (*ims)[*n + i].path = row_path(r, parts[i].path);
        free(parts[i].path);
    }
    *n += n_paths;
    free(parts);
    return copy;
}

// The row's image list (key) into *ims, *n.
void vl_row_images(const cJSON *row, const RecordReader *r, const char *key, VlImage **ims, int *n) {
    const cJSON *list = key ? records_get(row, key) : NULL;
    *ims = NULL;
    *n = 0;
    if (!list || cJSON_IsNull(list)) return;
    if (!cJSON_IsArray(list)) die("%s: \"%s\" must be a list of images", r->where, key);
    *ims = xcalloc((size_t)cJSON_GetArraySize(list) + 1, sizeof **ims);
    for (const cJSON *it = list->child; it; it = it->next, ++*n) row_image(it, r, key, *n, &(*ims)[*n]);
}

// A vision-language prompt's ids: each image's grid read, its one pad expanded to its merged units.
void vl_row_expand(const RecordReader *r, const VlProcessor *vl, int32_t image_pad, VlImage *ims, int n,
                   int placeholders, IdList *ids) {
    if (!vl) die("%s: the row has images, but the model is not a vision-language model", r->where);
    if (placeholders != n)
        die("%s: the prompt has %d \"<image>\" placeholder%s for %d image%s", r->where, placeholders,
            placeholders == 1 ? "" : "s", n, n == 1 ? "" : "s");
    for (int i = 0; i < n; i++) vl_image_grid(vl, &ims[i], r->where);
    IdList out;
    if (vl_expand_pads(ids->ids, (int64_t)ids->n, image_pad, ims, n, vl->merge, &out) != 0)
        die("%s: the prompt's text holds <|image_pad|> tokens of its own", r->where);
    free(ids->ids);
    *ids = out;
}


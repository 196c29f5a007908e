#include "train/prompt_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "io/records.h"
#include "text/chat.h"

static char *field_text(const cJSON *it, const RecordReader *r, const char *key) {
    size_t n;
    if (cJSON_IsString(it)) return json_string_bytes(it, r->nul, &n);
    if (cJSON_IsNumber(it)) {
        char *s = cJSON_PrintUnformatted(it);
        if (!s) die("out of memory");
        return s;
    }
    die("%s: \"%s\" must be a string%s", r->where, key, it ? "" : " (missing)");
}

// An item as JSON text, U+0000 restored (json_dump_py's form).
static char *json_text(const cJSON *item, uint32_t nul) {
    Buf b = {0};
    json_dump_py(&b, item, nul);
    return b.data ? b.data : xstrdup("null");
}

// The row's tools_kwargs ({tool name: {...}}): extra_info.tools_kwargs (verl) or tools_kwargs; NULL if none.
static cJSON *tools_kwargs_of(const cJSON *row, const RecordReader *r) {
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(row, "extra_info");
    const cJSON *kw = cJSON_IsObject(extra) ? cJSON_GetObjectItemCaseSensitive(extra, "tools_kwargs") : NULL;
    if (!kw) kw = cJSON_GetObjectItemCaseSensitive(row, "tools_kwargs");
    if (!kw || cJSON_IsNull(kw)) return NULL;
    if (!cJSON_IsObject(kw)) die("%s: \"tools_kwargs\" must be an object {tool name: {...}}", r->where);
    return cJSON_Duplicate(kw, 1);
}

// A message-list prompt: rendered whole with the generation prompt; *last_user: its last user message.
static void render_messages(const cJSON *msgs, const RecordReader *r, const PromptDataOptions *o, IdList *ids,
                            char **last_user) {
    if (!o->chat_template)
        die("%s: \"%s\" is a list of messages, which needs data.chat_template: true", r->where, o->prompt_key);
    Buf text = {0};
    char *err = chat_render_messages_try(o->tok, msgs, o->tools, r->nul, 1, &text);
    if (err) die("%s: \"%s\": %s", r->where, o->prompt_key, err);
    size_t bad_offset;
    if (tokenizer_encode(o->tok, text.data ? text.data : "", text.len, ids, &bad_offset) != 0)
        die("%s: \"%s\" is not valid UTF-8", r->where, o->prompt_key);
    buf_free(&text);
    *last_user = NULL;
    for (const cJSON *m = msgs->child; m; m = m->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!strcmp(role->valuestring, "user") && cJSON_IsString(content)) {
            free(*last_user);
            size_t n;
            *last_user = json_string_bytes(content, r->nul, &n);
        }
    }
    if (!*last_user) *last_user = xstrdup("");
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
    const char *p = path->valuestring, *slash = strrchr(r->path, '/');
    if (p[0] == '/' || !slash) im->path = xstrdup(p);
    else im->path = xprintf("%.*s/%s", (int)(slash - r->path), r->path, p);
}

// "<image>" in s replaced by VL_IMAGE_TEXT (a fresh string); *count += how many there were.
static char *expand_placeholders(const char *s, int *count) {
    Buf b = {0};
    for (const char *at; (at = strstr(s, "<image>")); s = at + 7) {
        buf_append(&b, s, (size_t)(at - s));
        buf_append(&b, VL_IMAGE_TEXT, strlen(VL_IMAGE_TEXT));
        ++*count;
    }
    buf_append(&b, s, strlen(s));
    return b.data;
}

// A message-list prompt's copy for rendering: content parts flattened (their images after the row's list)
// and "<image>" placeholders expanded; *placeholders counts the images the text now stands for.
static cJSON *vl_messages(const cJSON *msgs, const RecordReader *r, const char *key, VlImage **ims, int *n,
                          int *placeholders) {
    cJSON *copy = cJSON_Duplicate(msgs, 1);
    if (!copy) die("out of memory");
    char **paths = NULL;
    int n_paths = 0;
    char *err = vl_flatten_messages(copy, &paths, &n_paths);
    if (err) die("%s: \"%s\": %s", r->where, key, err);
    if (n_paths && *n) die("%s: images both in \"%s\"'s content parts and in the row's image list", r->where, key);
    for (cJSON *m = copy->child; m; m = m->next) {
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(content)) continue;
        char *text = expand_placeholders(content->valuestring, placeholders);
        cJSON *s = cJSON_CreateString(text);
        free(text);
        if (!s) die("out of memory");
        cJSON_ReplaceItemInObjectCaseSensitive(m, "content", s);
    }
    *placeholders += n_paths;
    *ims = xrealloc(*ims, (size_t)(*n + n_paths + 1) * sizeof **ims);
    for (int i = 0; i < n_paths; i++) {  // a part's path is as written (a request's), not the data file's
        (*ims)[*n + i] = (VlImage){.path = paths[i]};
    }
    *n += n_paths;
    free(paths);
    return copy;
}

// The row's image list (o->image_key) into *ims, *n.
static void row_images(const cJSON *row, const RecordReader *r, const PromptDataOptions *o, VlImage **ims, int *n) {
    const cJSON *list = o->image_key ? records_get(row, o->image_key) : NULL;
    *ims = NULL;
    *n = 0;
    if (!list || cJSON_IsNull(list)) return;
    if (!cJSON_IsArray(list)) die("%s: \"%s\" must be a list of images", r->where, o->image_key);
    *ims = xcalloc((size_t)cJSON_GetArraySize(list) + 1, sizeof **ims);
    for (const cJSON *it = list->child; it; it = it->next, ++*n) row_image(it, r, o->image_key, *n, &(*ims)[*n]);
}

// A vision-language prompt's ids: each image's grid read, its one pad expanded to its merged units.
static void expand_images(const RecordReader *r, const PromptDataOptions *o, VlImage *ims, int n, int placeholders,
                          IdList *ids) {
    if (!o->vl) die("%s: the row has images, but the model is not a vision-language model", r->where);
    if (placeholders != n)
        die("%s: the prompt has %d \"<image>\" placeholder%s for %d image%s", r->where, placeholders,
            placeholders == 1 ? "" : "s", n, n == 1 ? "" : "s");
    for (int i = 0; i < n; i++) vl_image_grid(o->vl, &ims[i], r->where);
    IdList out;
    if (vl_expand_pads(ids->ids, (int64_t)ids->n, o->image_pad, ims, n, o->vl->merge, &out) != 0)
        die("%s: the prompt's text holds <|image_pad|> tokens of its own", r->where);
    free(ids->ids);
    *ids = out;
}

// One row into *x; 0 when the prompt is over max_prompt_length and filtered.
static int read_row(const cJSON *row, const RecordReader *r, const PromptDataOptions *o, PromptSample *x) {
    const cJSON *prompt_item = records_get(row, o->prompt_key);
    IdList ids = {0};
    char *prompt = NULL, *messages = NULL;
    VlImage *ims;
    int n_images, placeholders = 0;
    row_images(row, r, o, &ims, &n_images);
    if (cJSON_IsArray(prompt_item)) {
        cJSON *msgs = vl_messages(prompt_item, r, o->prompt_key, &ims, &n_images, &placeholders);
        render_messages(msgs, r, o, &ids, &prompt);
        cJSON_Delete(msgs);
        messages = json_text(prompt_item, r->nul);
    } else {
        prompt = field_text(prompt_item, r, o->prompt_key);
        char *text = expand_placeholders(prompt, &placeholders);
        size_t bad_offset;
        int rc = chat_encode_prompt(o->tok, text, strlen(text), o->chat_template, o->tools, &ids, &bad_offset);
        free(text);
        if (rc != 0)
            die("%s: \"%s\" is not valid UTF-8", r->where, o->prompt_key);
    }
    if (n_images || placeholders) expand_images(r, o, ims, n_images, placeholders, &ids);
    if (ids.n == 0) die("%s: the prompt is empty", r->where);
    if ((int64_t)ids.n > o->max_prompt_length) {
        if (!o->filter_overlong)
            die("%s: the prompt has %zu tokens, max_prompt_length is %lld (or set data.filter_overlong_prompts)",
                r->where, ids.n, (long long)o->max_prompt_length);
        free(ids.ids);
        free(prompt);
        free(messages);
        for (int i = 0; i < n_images; i++) vl_image_free(&ims[i]);
        free(ims);
        return 0;
    }
    const cJSON *source = cJSON_GetObjectItemCaseSensitive(row, "data_source");
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(row, "extra_info");
    if (source && !cJSON_IsNull(source) && !cJSON_IsString(source))
        die("%s: \"data_source\" must be a string", r->where);
    char *answer = field_text(records_get(row, o->answer_key), r, o->answer_key);
    *x = (PromptSample){.prompt = prompt, .answer = answer,
                        .messages = messages, .ids = ids.ids, .len = (int64_t)ids.n, .line = r->line,
                        .tools_kwargs = tools_kwargs_of(row, r), .images = ims, .n_images = n_images};
    if (cJSON_IsString(source)) x->data_source = xstrdup(source->valuestring);
    if (extra && !cJSON_IsNull(extra)) x->extra_info = json_text(extra, r->nul);
    return 1;
}

void prompt_data_load(PromptData *d, const char *const *paths, int n_paths, const char *key,
                      const PromptDataOptions *o) {
    memset(d, 0, sizeof *d);
    size_t n_cap = 0;
    for (int f = 0; f < n_paths; f++) {
        // Parquet: decode only the columns a prompt needs
        char *prompt_col = xprintf("%.*s", (int)strcspn(o->prompt_key, "."), o->prompt_key);
        char *answer_col = xprintf("%.*s", (int)strcspn(o->answer_key, "."), o->answer_key);
        const char *image_key = o->image_key ? o->image_key : "images";
        char *image_col = xprintf("%.*s", (int)strcspn(image_key, "."), image_key);
        const char *cols[9] = {o->prompt_key, o->answer_key, prompt_col, answer_col, "data_source",
                               "extra_info", "tools_kwargs", image_key, image_col};
        RecordReader r;
        records_open(&r, paths[f], key, cols, 9);
        for (cJSON *row; (row = records_next(&r));) {
            if ((size_t)d->n == n_cap) {
                n_cap = n_cap ? 2 * n_cap : 64;
                d->s = xrealloc(d->s, n_cap * sizeof *d->s);
            }
            if (read_row(row, &r, o, &d->s[d->n])) {
                d->s[d->n].file = f;
                d->s[d->n++].parquet = r.parquet != NULL;
            } else {
                d->n_filtered++;
            }
            cJSON_Delete(row);
        }
        records_close(&r);
        free(prompt_col);
        free(answer_col);
        free(image_col);
    }
    if (d->n == 0 && d->n_filtered) die("%s: every prompt is longer than max_prompt_length (%lld)", paths[0],
                                        (long long)o->max_prompt_length);
    if (d->n == 0) die("%s: no prompts (the file is empty)", n_paths ? paths[0] : key);
}

void prompt_data_free(PromptData *d) {
    for (int64_t i = 0; i < d->n; i++) {
        PromptSample *x = &d->s[i];
        free(x->prompt);
        free(x->answer);
        free(x->messages);
        free(x->ids);
        free(x->data_source);
        free(x->extra_info);
        cJSON_Delete(x->tools_kwargs);
        for (int k = 0; k < x->n_images; k++) vl_image_free(&x->images[k]);
        free(x->images);
    }
    free(d->s);
    memset(d, 0, sizeof *d);
}

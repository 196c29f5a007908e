#include "train/prompt_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "io/records.h"
#include "text/chat.h"
#include "train/vl_rows.h"

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
    if (o->vl) o->tok->chat.image_text = VL_IMAGE_TEXT;
    char *err = chat_render(&o->tok->chat, msgs, o->tools, NULL, r->nul, 1, &text);
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

// One row into *x; 0 when the prompt is over max_prompt_length and filtered.
static int read_row(const cJSON *row, const RecordReader *r, const PromptDataOptions *o, PromptSample *x) {
    const cJSON *prompt_item = records_get(row, o->prompt_key);
    IdList ids = {0};
    char *prompt = NULL, *messages = NULL;
    VlImage *ims;
    int n_images, placeholders = 0;
    vl_row_images(row, r, o->image_key, &ims, &n_images);
    if (cJSON_IsArray(prompt_item) && o->vl) {  // a text model's "<image>" is text
        cJSON *msgs = vl_row_messages(prompt_item, r, o->prompt_key, &ims, &n_images, &placeholders);
        render_messages(msgs, r, o, &ids, &prompt);
        cJSON_Delete(msgs);
        messages = json_text(prompt_item, r->nul);
    } else if (cJSON_IsArray(prompt_item)) {
        render_messages(prompt_item, r, o, &ids, &prompt);
        messages = json_text(prompt_item, r->nul);
    } else {
        prompt = field_text(prompt_item, r, o->prompt_key);
        char *text = o->vl ? vl_expand_placeholders(prompt, &placeholders) : xstrdup(prompt);
        char *err = chat_encode_prompt(o->tok, text, strlen(text), o->chat_template, o->tools, &ids);
        free(text);
        if (err) die("%s: \"%s\": %s", r->where, o->prompt_key, err);
    }
    if (n_images || placeholders) vl_row_expand(r, o->vl, o->image_pad, ims, n_images, placeholders, &ids);
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

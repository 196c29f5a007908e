#include "model/vl.h"

#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "io/image.h"
#include "text/chat.h"

void vl_model_load(VlModel *v, const char *dir, const Qwen2Config *c) {
    char *path = path_join(dir, "config.json");
    cJSON *cfg = json_load_file(path, FILE_MAX_JSON);
    VisionConfig vc;
    vision_config_parse(&vc, cJSON_GetObjectItemCaseSensitive(cfg, "vision_config"), path);
    vl_processor_load(&v->proc, dir);
    vision_check(&vc, v->proc.patch, v->proc.temporal, v->proc.merge, c->hidden, dir);
    vision_load(&v->vision, &vc, dir);
    cJSON_Delete(cfg);
    free(path);
}

void vl_model_free(VlModel *v) { vision_free(&v->vision); }

static void image_read(const VlImage *im, Image *out, const char *where) {
    if (im->bytes) image_decode(out, im->bytes, im->n, im->path, IMAGE_MAX_PIXELS, where);
    else image_load(out, im->path, IMAGE_MAX_PIXELS, where);
}

void vl_image_grid(const VlProcessor *p, VlImage *im, const char *where) {
    Image img;
    image_read(im, &img, where);
    char err[160];
    int factor = p->patch * p->merge, rh, rw;
    if (vl_smart_resize(img.h, img.w, factor, p->min_pixels, p->max_pixels, &rh, &rw, err, sizeof err) != 0)
        die("%s: %s: %s", where, im->path, err);
    im->grid[0] = 1;  // an image is one temporal patch (its own second frame)
    im->grid[1] = rh / p->patch;
    im->grid[2] = rw / p->patch;
    image_free(&img);
}

int64_t vl_image_units(const int grid[3], int merge) {
    return (int64_t)grid[0] * grid[1] * grid[2] / (merge * merge);
}

float *vl_image_features(const VlModel *v, const VlImage *im, const char *where) {
    Image img;
    image_read(im, &img, where);
    int grid[3];
    float *patches = vl_preprocess(&v->proc, &img, grid, NULL, where);
    image_free(&img);
    if (memcmp(grid, im->grid, sizeof grid) != 0) die("%s: %s changed since it was read", where, im->path);
    float *feat = xmalloc((size_t)(vl_image_units(grid, v->proc.merge) * v->vision.cfg.out_hidden) * sizeof *feat);
    vision_forward(&v->vision, patches, grid, feat);
    free(patches);
    return feat;
}

float *vl_prompt_features(const VlModel *v, const VlImage *ims, int n, const char *where) {
    if (n == 0) return NULL;
    int64_t rows = 0, C = v->vision.cfg.out_hidden;
    for (int i = 0; i < n; i++) rows += vl_image_units(ims[i].grid, v->proc.merge);
    float *all = xmalloc((size_t)(rows * C) * sizeof *all), *at = all;
    for (int i = 0; i < n; i++) {
        int64_t units = vl_image_units(ims[i].grid, v->proc.merge);
        float *f = vl_image_features(v, &ims[i], where);
        memcpy(at, f, (size_t)(units * C) * sizeof *f);
        at += units * C;
        free(f);
    }
    return all;
}

void vl_image_free(VlImage *im) {
    free(im->path);
    free(im->bytes);
    memset(im, 0, sizeof *im);
}

int vl_batch_inputs(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B, const int64_t *prompt_len,
                    const VlImage *const *ims, const int *n_images, const float *const *feats, int merge,
                    Qwen2VlInputs *in) {
    int(**grids)[3] = xmalloc((size_t)B * sizeof *grids + 1);
    for (int b = 0; b < B; b++) {
        grids[b] = xmalloc((size_t)(n_images[b] + 1) * sizeof *grids[b]);
        for (int k = 0; k < n_images[b]; k++) memcpy(grids[b][k], ims[b][k].grid, sizeof grids[b][k]);
    }
    int rc = qwen2_vl_inputs(m, tokens, seq_off, B, prompt_len, feats, (const int(*const *)[3])grids, n_images,
                             merge, in);
    for (int b = 0; b < B; b++) free(grids[b]);
    free(grids);
    return rc;
}

const Qwen2VlInputs *vl_prompt_inputs(const Qwen2 *m, const int32_t *ids, int64_t n, const VlImage *ims,
                                      int n_images, const float *feats, int merge, Qwen2VlInputs *in) {
    if (n_images == 0) return NULL;
    int64_t seq_off[2] = {0, n};
    if (vl_batch_inputs(m, ids, seq_off, 1, NULL, &ims, &n_images, &feats, merge, in) != 0)
        die("internal: a prompt's image pads do not match its images");
    return in;
}

int vl_expand_pads(const int32_t *ids, int64_t n, int32_t image_pad, const VlImage *ims, int n_images, int merge,
                   IdList *out) {
    memset(out, 0, sizeof *out);
    int k = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] != image_pad) {
            idlist_push(out, ids[i]);
            continue;
        }
        if (k == n_images) break;
        for (int64_t u = vl_image_units(ims[k].grid, merge); u > 0; u--) idlist_push(out, image_pad);
        k++;
    }
    int64_t pads = 0;
    for (int64_t i = 0; i < n; i++) pads += ids[i] == image_pad;
    if (pads == n_images) return 0;
    free(out->ids);
    memset(out, 0, sizeof *out);
    return -1;
}

// One content part: text appended to *text, an image's path to *paths. NULL, or what is wrong with it.
static char *flatten_part(const cJSON *part, Buf *text, char ***paths, int *n_paths) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    if (!cJSON_IsString(type)) return xstrdup("a content part needs a \"type\" string");
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(s)) return xstrdup("a text part needs a \"text\" string");
        buf_append(text, s->valuestring, strlen(s->valuestring));
        return NULL;
    }
    const cJSON *src = NULL;
    if (!strcmp(t, "image")) src = cJSON_GetObjectItemCaseSensitive(part, "image");
    if (!strcmp(t, "image_url")) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(part, "image_url");
        src = cJSON_IsObject(u) ? cJSON_GetObjectItemCaseSensitive(u, "url") : u;
    }
    if (strcmp(t, "image") != 0 && strcmp(t, "image_url") != 0)
        return xprintf("content part type \"%s\" (supported: text, image, image_url)", t);
    if (!cJSON_IsString(src) || !src->valuestring[0])
        return xprintf("an %s part needs the image's path", t);
    const char *p = src->valuestring;
    if (!strncmp(p, "file://", 7)) p += 7;
    else if (strstr(p, "://") || !strncmp(p, "data:", 5))
        return xprintf("image \"%.60s\": only files are read (a path or file://)", p);
    *paths = xrealloc(*paths, (size_t)(*n_paths + 1) * sizeof **paths);
    (*paths)[(*n_paths)++] = xstrdup(p);
    buf_append(text, VL_IMAGE_TEXT, strlen(VL_IMAGE_TEXT));
    return NULL;
}

char *vl_flatten_messages(cJSON *msgs, char ***paths, int *n_paths) {
    int i = 0;
    for (cJSON *m = msgs ? msgs->child : NULL; m; m = m->next, i++) {
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsArray(content)) continue;
        Buf text = {0};
        int j = 0;
        for (const cJSON *part = content->child; part; part = part->next, j++) {
            char *err = cJSON_IsObject(part) ? flatten_part(part, &text, paths, n_paths)
                                             : xstrdup("a content part must be an object");
            if (err) {
                char *msg = xprintf("message %d, content part %d: %s", i, j, err);
                free(err);
                buf_free(&text);
                return msg;
            }
        }
        cJSON *s = cJSON_CreateString(text.data ? text.data : "");
        buf_free(&text);
        if (!s) die("out of memory");
        cJSON_ReplaceItemInObjectCaseSensitive(m, "content", s);
    }
    return NULL;
}

void vl_render_messages(const VlProcessor *vl, int32_t image_pad, Tokenizer *tok, const cJSON *msgs,
                        const cJSON *tools, uint32_t nul, int add_generation_prompt, IdList *ids, VlImage **ims,
                        int *n_images, const char *where) {
    cJSON *copy = cJSON_Duplicate(msgs, 1);
    if (!copy) die("out of memory");
    char **paths = NULL;
    int n = 0;
    char *err = cJSON_IsArray(copy) ? vl_flatten_messages(copy, &paths, &n) : NULL;
    if (err) die("%s: \"messages\": %s", where, err);
    if (n && !vl) die("%s: an image part, but the model is not a vision-language model", where);
    Buf text = {0};
    chat_render_json(tok, copy, tools, nul, add_generation_prompt, &text, where);
    cJSON_Delete(copy);
    IdList raw = {0};
    size_t bad;
    if (tokenizer_encode(tok, text.data ? text.data : "", text.len, &raw, &bad) != 0)
        die("%s: invalid UTF-8 at byte %zu", where, bad);
    buf_free(&text);
    *ims = n ? xcalloc((size_t)n, sizeof **ims) : NULL;
    *n_images = n;
    for (int i = 0; i < n; i++) {
        (*ims)[i].path = paths[i];
        vl_image_grid(vl, &(*ims)[i], where);
    }
    free(paths);
    if (!vl) {
        *ids = raw;
        return;
    }
    if (vl_expand_pads(raw.ids, (int64_t)raw.n, image_pad, *ims, n, vl->merge, ids) != 0)
        die("%s: the messages' text holds <|image_pad|> tokens of its own", where);
    free(raw.ids);
}

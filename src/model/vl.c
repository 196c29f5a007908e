#include "model/vl.h"

#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "io/image.h"
#include "io/safetensors.h"
#include "text/chat.h"

void vl_model_load(VlModel *v, const char *dir, const DecoderConfig *c) {
    char *path = path_join(dir, "config.json");
    cJSON *cfg = json_load_file(path, FILE_MAX_JSON);
    VisionConfig vc;
    vision_config_parse(&vc, cJSON_GetObjectItemCaseSensitive(cfg, "vision_config"), path);
    vl_processor_load(&v->proc, dir);
    vision_check(&vc, v->proc.patch, v->proc.temporal, v->proc.merge, c->hidden, dir);
    vision_load(&v->vision, &vc, dir);
    v->be = backend_cpu();
    cJSON_Delete(cfg);
    free(path);
}

void vl_model_free(VlModel *v) { vision_free(&v->vision); }

void vl_config_merger(DecoderConfig *c, const VisionConfig *vc) {
    c->merger_in = vc ? vc->hidden : 0;
    c->merger_units = vc ? (int64_t)vc->merge * vc->merge : 0;
    c->merger_ln_bias = vc ? vc->qwen2 : 0;
}

void vl_set_pixels(VlProcessor *p, int64_t min_pixels, int64_t max_pixels, const char *what) {
    if (min_pixels > 0) p->min_pixels = min_pixels;
    if (max_pixels > 0) p->max_pixels = max_pixels;
    if (p->min_pixels > p->max_pixels)
        die("%s: min_pixels %lld exceeds max_pixels %lld", what, (long long)p->min_pixels, (long long)p->max_pixels);
}

int vl_preset(const char *name, DecoderConfig *c, VisionConfig *vc) {
    // The published towers: 32 blocks of width 1280, full attention in 4 of them, 112-pixel windows.
    VisionConfig big = {.depth = 32, .hidden = 1280, .intermediate = 3420, .heads = 16, .patch = 14, .merge = 2,
                        .temporal = 2, .window = 112, .in_channels = 3, .fullatt = {7, 15, 23, 31}, .n_fullatt = 4,
                        .eps = 1e-6f};
    int section[3] = {16, 24, 24};  // head_dim 128
    if (!strcmp(name, "qwen2.5-vl-tiny")) {
        decoder_config_preset(c, "tiny");
        *vc = (VisionConfig){.depth = 2, .hidden = 32, .intermediate = 48, .heads = 2, .patch = 14, .merge = 2,
                             .temporal = 2, .window = 112, .in_channels = 3, .fullatt = {1}, .n_fullatt = 1,
                             .eps = 1e-6f};
        memcpy(section, (int[3]){2, 3, 3}, sizeof section);  // head_dim 16
    } else if (!strcmp(name, "qwen2.5-vl-3b")) {
        decoder_config_preset(c, "qwen2.5-3b");
        *vc = big;
    } else if (!strcmp(name, "qwen2.5-vl-7b")) {
        decoder_config_preset(c, "qwen2.5-7b");
        *vc = big;
    } else {
        return 0;
    }
    c->max_pos = 128000;
    decoder_config_family(c, ARCH_QWEN2_5_VL);
    c->image_pad_id = 151655;
    memcpy(c->mrope_section, section, sizeof section);
    vc->out_hidden = (int)c->hidden;
    return 1;
}

const char *vl_preset_names(void) { return "qwen2.5-vl-tiny, qwen2.5-vl-3b, qwen2.5-vl-7b"; }

// config.json (transformers 4's flat layout: the language model's keys, the vision ids, vision_config) and
// preprocessor_config.json.
static void write_configs(const char *dir, const DecoderConfig *c, const VisionConfig *vc, const int32_t vision[3],
                          int64_t max_pixels, DType dtype) {
    cJSON *r = decoder_config_json(c, dtype), *v = cJSON_CreateObject(), *p = cJSON_CreateObject();
    if (!v || !p) die("out of memory");
    // transformers' get_rope_index finds the images by their vision_start
    cJSON_AddNumberToObject(r, "vision_start_token_id", vision[0]);
    cJSON_AddNumberToObject(r, "vision_end_token_id", vision[2]);
    cJSON_AddNumberToObject(v, "depth", vc->depth);
    cJSON_AddNumberToObject(v, "hidden_size", vc->hidden);
    cJSON_AddNumberToObject(v, "num_heads", vc->heads);
    cJSON_AddNumberToObject(v, "intermediate_size", vc->intermediate);
    cJSON_AddNumberToObject(v, "out_hidden_size", vc->out_hidden);
    cJSON_AddNumberToObject(v, "patch_size", vc->patch);
    cJSON_AddNumberToObject(v, "spatial_merge_size", vc->merge);
    cJSON_AddNumberToObject(v, "temporal_patch_size", vc->temporal);
    cJSON_AddNumberToObject(v, "window_size", vc->window);
    cJSON_AddItemToObject(v, "fullatt_block_indexes", cJSON_CreateIntArray(vc->fullatt, vc->n_fullatt));
    cJSON_AddStringToObject(v, "hidden_act", "silu");
    cJSON_AddNumberToObject(v, "in_chans", 3);
    cJSON_AddItemToObject(r, "vision_config", v);
    cJSON_AddNumberToObject(p, "min_pixels", 56 * 56);
    cJSON_AddNumberToObject(p, "max_pixels", (double)max_pixels);
    cJSON_AddNumberToObject(p, "patch_size", vc->patch);
    cJSON_AddNumberToObject(p, "temporal_patch_size", vc->temporal);
    cJSON_AddNumberToObject(p, "merge_size", vc->merge);
    char *path = path_join(dir, "preprocessor_config.json");
    json_save_file(path, p);
    free(path);
    path = path_join(dir, "config.json");  // last: a directory with a config has its weights
    json_save_file(path, r);
    free(path);
    cJSON_Delete(r);
    cJSON_Delete(p);
}

void vl_write_random(const char *dir, const DecoderConfig *c, const VisionConfig *vc, const int32_t vision[3],
                     int64_t max_pixels, uint64_t seed, DType dtype) {
    Decoder m;
    decoder_build(&m, c, DTYPE_F32);
    decoder_init_random(&m, seed);
    Vision v;
    vision_init_random(&v, vc, seed ^ 0x5eed, c->init_std);
    int n_lm = decoder_tensors(&m, NULL), n_vis = vision_n_tensors(vc);
    DecoderTensor *ts = xmalloc((size_t)n_lm * sizeof *ts);
    decoder_tensors(&m, ts);
    StWriteTensor *ws = xcalloc((size_t)(n_lm + n_vis), sizeof *ws);
    for (int i = 0; i < n_lm; i++) {
        ws[i] = (StWriteTensor){.name = ts[i].name, .ndim = ts[i].ndim, .data = ts[i].data};
        memcpy(ws[i].shape, ts[i].shape, sizeof ts[i].shape);
    }
    char(*names)[96] = xmalloc((size_t)n_vis * sizeof *names);
    int n = n_lm + vision_tensors(&v, ws + n_lm, names);
    char *path = path_join(dir, "model.safetensors");
    safetensors_write(path, ws, n, dtype);
    write_configs(dir, c, vc, vision, max_pixels, dtype);
    free(path), free(names), free(ws), free(ts);
    vision_free(&v);
    decoder_free(&m);
}

// im's pixels (full 0, an image given as bytes: its size only, from its header): NULL, or what is wrong with
// the image (malloc'd, naming it).
static char *image_read(const VlImage *im, int full, Image *out) {
    memset(out, 0, sizeof *out);
    char *err = !im->bytes ? image_load_try(out, im->path, IMAGE_MAX_PIXELS)
                : full     ? image_decode_try(out, im->bytes, im->n, IMAGE_MAX_PIXELS)
                           : image_size_try(im->bytes, im->n, IMAGE_MAX_PIXELS, &out->w, &out->h);
    if (!err) return NULL;
    char *msg = xprintf("%s: %s", im->path, err);
    free(err);
    return msg;
}

char *vl_image_grid_try(const VlProcessor *p, VlImage *im, int full) {
    Image img;
    char *err = image_read(im, full, &img);
    if (err) return err;
    char why[160];
    int factor = p->patch * p->merge, rh, rw;
    int rc = vl_smart_resize(img.h, img.w, factor, p->min_pixels, p->max_pixels, &rh, &rw, why, sizeof why);
    image_free(&img);
    if (rc != 0) return xprintf("%s: %s", im->path, why);
    im->grid[0] = 1;  // an image is one temporal patch (its own second frame)
    im->grid[1] = rh / p->patch;
    im->grid[2] = rw / p->patch;
    return NULL;
}

void vl_image_grid(const VlProcessor *p, VlImage *im, const char *where) {
    char *err = vl_image_grid_try(p, im, 1);
    if (err) die("%s: %s", where, err);
}

int64_t vl_image_units(const int grid[3], int merge) {
    return (int64_t)grid[0] * grid[1] * grid[2] / (merge * merge);
}

// im's merger input (vision_hidden): units rows of merge^2 * the tower's width (malloc'd).
static float *image_hidden(const VlModel *v, const VlImage *im, const char *where) {
    Image img;
    char *err = image_read(im, 1, &img);
    if (err) die("%s: %s", where, err);
    int grid[3];
    float *patches = vl_preprocess(&v->proc, &img, grid, NULL, where);
    image_free(&img);
    if (memcmp(grid, im->grid, sizeof grid) != 0) die("%s: %s changed since it was read", where, im->path);
    int64_t width = (int64_t)v->proc.merge * v->proc.merge * v->vision.cfg.hidden;
    float *hidden = xmalloc((size_t)(vl_image_units(grid, v->proc.merge) * width) * sizeof *hidden);
    vision_hidden(&v->vision, patches, grid, hidden);
    free(patches);
    return hidden;
}

float *vl_prompt_hidden(const VlModel *v, const VlImage *ims, int n, const char *where, int64_t *units) {
    *units = 0;
    if (n == 0) return NULL;
    int64_t width = (int64_t)v->proc.merge * v->proc.merge * v->vision.cfg.hidden;
    for (int i = 0; i < n; i++) *units += vl_image_units(ims[i].grid, v->proc.merge);
    float *all = xmalloc((size_t)(*units * width) * sizeof *all), *at = all;
    for (int i = 0; i < n; i++) {
        int64_t rows = vl_image_units(ims[i].grid, v->proc.merge);
        float *h = image_hidden(v, &ims[i], where);
        memcpy(at, h, (size_t)(rows * width) * sizeof *h);
        at += rows * width;
        free(h);
    }
    return all;
}

float *vl_prompt_features(const VlModel *v, const VlImage *ims, int n, const char *where) {
    int64_t units;
    float *hidden = vl_prompt_hidden(v, ims, n, where, &units);
    if (!hidden) return NULL;
    float *feats = xmalloc((size_t)(units * v->vision.cfg.out_hidden) * sizeof *feats);
    vision_merge(v->be, &v->vision.cfg, &v->vision.merger, hidden, units, feats);
    free(hidden);
    return feats;
}

void vl_image_free(VlImage *im) {
    free(im->path);
    free(im->bytes);
    memset(im, 0, sizeof *im);
}

int vl_batch_inputs(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B, const int64_t *prompt_len,
                    const VlImage *const *ims, const int *n_images, const float *const *feats, int merge,
                    DecoderVlInputs *in) {
    int(**grids)[3] = xmalloc((size_t)B * sizeof *grids + 1);
    for (int b = 0; b < B; b++) {
        grids[b] = xmalloc((size_t)(n_images[b] + 1) * sizeof *grids[b]);
        for (int k = 0; k < n_images[b]; k++) memcpy(grids[b][k], ims[b][k].grid, sizeof grids[b][k]);
    }
    int rc = decoder_vl_inputs(m, tokens, seq_off, B, prompt_len, feats, (const int(*const *)[3])grids, n_images,
                             merge, in);
    for (int b = 0; b < B; b++) free(grids[b]);
    free(grids);
    return rc;
}

void vl_inputs_grads(DecoderVlInputs *in, const int64_t *seq_off, const float *const *feats, float *const *grads) {
    in->image_grads = xmalloc((size_t)in->n_image_rows * sizeof *in->image_grads + 1);
    for (int64_t i = 0, b = 0; i < in->n_image_rows; i++) {
        while (in->image_rows[i] >= seq_off[b + 1]) b++;
        in->image_grads[i] = grads[b] + (in->image_feats[i] - feats[b]);
    }
}

const DecoderVlInputs *vl_prompt_inputs(const Decoder *m, const int32_t *ids, int64_t n, const VlImage *ims,
                                      int n_images, const float *feats, int merge, DecoderVlInputs *in) {
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

// A data: URL's bytes (base64) into im. NULL, or what is wrong with it.
static char *data_url(const char *url, VlImage *im) {
    const char *comma = strchr(url, ',');
    if (!comma || comma - url < 12 || strncmp(comma - 7, ";base64", 7) != 0)
        return xprintf("image \"%.40s\": a data: URL must hold base64 (data:image/png;base64,...)", url);
    size_t bad;
    im->bytes = base64_decode(comma + 1, strlen(comma + 1), &im->n, &bad);
    if (!im->bytes) return xprintf("image data: URL: not base64 at character %zu of its data", bad);
    return NULL;
}

// One content part checked, its image appended to *ims: a path (with files), a file:// URL's (with files), or a
// data: URL's bytes (named by `name`, the message and part). NULL, or what is wrong with the part.
static char *part_image(const cJSON *part, int files, const char *name, VlImage **ims, int *n) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    if (!cJSON_IsString(type)) return xstrdup("a content part needs a \"type\" string");
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(s)) return xstrdup("a text part needs a \"text\" string");
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
        return xprintf("an %s part needs the image's %s", t, files ? "path or data: URL" : "data: URL");
    const char *p = src->valuestring;
    VlImage im = {0};
    if (!strncmp(p, "data:", 5)) {
        char *err = data_url(p, &im);
        if (err) return err;
        im.path = xstrdup(name);
    } else {
        if (!files || (strstr(p, "://") && strncmp(p, "file://", 7) != 0))
            return xprintf("image \"%.60s\": only %s", p,
                           files ? "files (a path or file://) and data: URLs are read"
                                 : "data: URLs (base64) are taken here, not files or URLs");
        im.path = xstrdup(strncmp(p, "file://", 7) ? p : p + 7);
    }
    *ims = xrealloc(*ims, (size_t)(*n + 1) * sizeof **ims);
    (*ims)[(*n)++] = im;
    return NULL;
}

char *vl_message_images(const cJSON *msgs, int files, VlImage **ims, int *n) {
    int i = 0;
    for (const cJSON *m = msgs ? msgs->child : NULL; m; m = m->next, i++) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        int j = 0;
        for (const cJSON *part = cJSON_IsArray(content) ? content->child : NULL; part; part = part->next, j++) {
            char name[64];
            snprintf(name, sizeof name, "message %d, content part %d", i, j);
            char *err = cJSON_IsObject(part) ? part_image(part, files, name, ims, n)
                                             : xstrdup("a content part must be an object");
            if (err) {
                char *msg = xprintf("%s: %s", name, err);
                free(err);
                return msg;
            }
        }
    }
    return NULL;
}

char *vl_expand_images(const VlProcessor *vl, int32_t image_pad, VlImage *ims, int n_images, int full,
                       IdList *ids) {
    if (n_images && !vl) return xstrdup("an image part, but the model is not a vision-language model");
    for (int i = 0; i < n_images; i++) {
        char *err = vl_image_grid_try(vl, &ims[i], full);
        if (err) return err;
    }
    if (!vl) return NULL;
    IdList out;
    if (vl_expand_pads(ids->ids, (int64_t)ids->n, image_pad, ims, n_images, vl->merge, &out) != 0)
        return xstrdup("the messages' text holds <|image_pad|> tokens of its own");
    free(ids->ids);
    *ids = out;
    return NULL;
}

void vl_render_messages(const VlProcessor *vl, int32_t image_pad, Tokenizer *tok, const cJSON *msgs,
                        const cJSON *tools, uint32_t nul, int add_generation_prompt, IdList *ids, VlImage **ims,
                        int *n_images, const char *where) {
    *ims = NULL;
    *n_images = 0;
    char *err = cJSON_IsArray(msgs) ? vl_message_images(msgs, 1, ims, n_images) : NULL;
    if (err) die("%s: \"messages\": %s", where, err);
    if (*n_images && !vl) die("%s: an image part, but the model is not a vision-language model", where);
    if (!tok->chat.tpl) die("%s: \"messages\" given but %s has no chat template", where, tok->path);
    tok->chat.image_text = vl ? VL_IMAGE_TEXT : NULL;
    Buf text = {0};
    chat_render_or_die(&tok->chat, msgs, tools, NULL, nul, add_generation_prompt, &text, where);
    size_t bad;
    *ids = (IdList){0};
    if (tokenizer_encode(tok, text.data ? text.data : "", text.len, ids, &bad) != 0)
        die("%s: invalid UTF-8 at byte %zu", where, bad);
    buf_free(&text);
    err = vl_expand_images(vl, image_pad, *ims, *n_images, 1, ids);
    if (err) die("%s: %s", where, err);
}

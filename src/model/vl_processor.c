#include "model/vl_processor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"

void vl_processor_defaults(VlProcessor *p) {
    *p = (VlProcessor){.min_pixels = 56 * 56, .max_pixels = 28 * 28 * 1280, .patch = 14, .temporal = 2,
                       .merge = 2,
                       .mean = {0.48145466f, 0.4578275f, 0.40821073f},
                       .std = {0.26862954f, 0.26130258f, 0.27577711f}, .rescale = 1.0 / 255.0};
}

static void floats3(const cJSON *root, const char *key, float out[3], const char *where) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!a || cJSON_IsNull(a)) return;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 3)
        die("%s: \"%s\" must be a list of 3 numbers", where, key);
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
            die("%s: \"%s\"[%d] must be a number", where, key, i);
        out[i] = (float)e->valuedouble;
    }
}

void vl_processor_load(VlProcessor *p, const char *model_dir) {
    vl_processor_defaults(p);
    char *path = path_join(model_dir, "preprocessor_config.json");
    if (!file_exists(path)) {
        free(path);
        return;
    }
    cJSON *root = json_load_file(path, FILE_MAX_JSON);
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(root, "size");
    if (cJSON_IsObject(size)) {  // transformers 5: size {shortest_edge: min_pixels, longest_edge: max_pixels}
        p->min_pixels = json_get_int_or(size, "shortest_edge", p->min_pixels, path);
        p->max_pixels = json_get_int_or(size, "longest_edge", p->max_pixels, path);
    }
    p->min_pixels = json_get_int_or(root, "min_pixels", p->min_pixels, path);
    p->max_pixels = json_get_int_or(root, "max_pixels", p->max_pixels, path);
    p->patch = (int)json_get_int_or(root, "patch_size", p->patch, path);
    p->temporal = (int)json_get_int_or(root, "temporal_patch_size", p->temporal, path);
    p->merge = (int)json_get_int_or(root, "merge_size", p->merge, path);
    p->rescale = json_get_number_or(root, "rescale_factor", p->rescale, path);
    floats3(root, "image_mean", p->mean, path);
    floats3(root, "image_std", p->std, path);
    if (p->patch < 1 || p->patch > 64 || p->temporal < 1 || p->temporal > 4 || p->merge < 1 || p->merge > 8)
        die("%s: patch_size, temporal_patch_size or merge_size out of range", path);
    if (p->min_pixels < 1 || p->max_pixels < p->min_pixels || p->max_pixels > IMAGE_MAX_PIXELS)
        die("%s: min_pixels %lld / max_pixels %lld out of range", path, (long long)p->min_pixels,
            (long long)p->max_pixels);
    for (int c = 0; c < 3; c++)
        if (!(p->std[c] != 0)) die("%s: image_std holds 0", path);
    cJSON_Delete(root);
    free(path);
}

int vl_patch_dim(const VlProcessor *p) { return 3 * p->temporal * p->patch * p->patch; }

int vl_smart_resize(int h, int w, int factor, int64_t min_pixels, int64_t max_pixels, int *rh, int *rw,
                    char *err, size_t err_len) {
    double big = h > w ? h : w, small = h > w ? w : h;
    if (big / small > 200) {
        snprintf(err, err_len, "%d x %d pixels: the aspect ratio must be at most 200", w, h);
        return -1;
    }
    // Python's round() is round-half-even: nearbyint in the default rounding mode
    double hb = nearbyint((double)h / factor) * factor, wb = nearbyint((double)w / factor) * factor;
    if (hb * wb > (double)max_pixels) {
        double beta = sqrt((double)h * w / (double)max_pixels);
        hb = fmax(factor, floor(h / beta / factor) * factor);
        wb = fmax(factor, floor(w / beta / factor) * factor);
    } else if (hb * wb < (double)min_pixels) {
        double beta = sqrt((double)min_pixels / ((double)h * w));
        hb = ceil(h * beta / factor) * factor;
        wb = ceil(w * beta / factor) * factor;
    }
    if (hb < factor || wb < factor) {  // transformers would go on with a zero side and fail later
        snprintf(err, err_len, "%d x %d pixels resize to nothing within max_pixels %lld",
                 w, h, (long long)max_pixels);
        return -1;
    }
    *rh = (int)hb;
    *rw = (int)wb;
    return 0;
}

float *vl_preprocess(const VlProcessor *p, const Image *im, int grid[3], Image *resized, const char *where) {
    int factor = p->patch * p->merge, rh, rw;
    char err[160];
    if (vl_smart_resize(im->h, im->w, factor, p->min_pixels, p->max_pixels, &rh, &rw, err, sizeof err) != 0)
        die("%s: %s", where, err);
    Image r;
    if (rh == im->h && rw == im->w) {  // Pillow returns a copy for the same size
        r = (Image){im->w, im->h, xmalloc((size_t)im->w * im->h * 3)};
        memcpy(r.rgb, im->rgb, (size_t)im->w * im->h * 3);
    } else {
        image_resize_bicubic(im, rw, rh, &r);
    }
    // rescale (float64, then float32) and normalise (float32), channel-first
    size_t plane = (size_t)rw * rh;
    float *chw = xmalloc(3 * plane * sizeof *chw);
    for (size_t i = 0; i < plane; i++)
        for (int c = 0; c < 3; c++) {
            float x = (float)((double)r.rgb[i * 3 + c] * p->rescale);
            chw[c * plane + i] = (x - p->mean[c]) / p->std[c];
        }
    int P = p->patch, M = p->merge, T = p->temporal, gh = rh / P, gw = rw / P;
    int dim = vl_patch_dim(p);
    float *out = xmalloc((size_t)gh * gw * dim * sizeof *out);
    // rows: (h block, w block, h within the 2 x 2 merge, w within it); columns: (channel, frame, y, x)
    size_t row = 0;
    for (int bh = 0; bh < gh / M; bh++)
        for (int bw = 0; bw < gw / M; bw++)
            for (int mh = 0; mh < M; mh++)
                for (int mw = 0; mw < M; mw++, row++) {
                    int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
                    float *o = out + row * dim;
                    for (int c = 0; c < 3; c++)
                        for (int t = 0; t < T; t++)
                            for (int y = 0; y < P; y++)
                                for (int x = 0; x < P; x++)
                                    *o++ = chw[c * plane + (size_t)(y0 + y) * rw + (x0 + x)];
                }
    free(chw);
    grid[0] = 1;
    grid[1] = gh;
    grid[2] = gw;
    if (resized) *resized = r;
    else image_free(&r);
    return out;
}

// The image processor of Qwen2-VL and Qwen2.5-VL, as transformers' (slow, Pillow-based)
// Qwen2VLImageProcessor computes it: smart_resize to multiples of patch_size * merge_size within
// [min_pixels, max_pixels], Pillow's bicubic resize, rescale by 1/255 (float64, then float32), CLIP's mean
// and std (float32), and patches of temporal_patch_size x 3 x patch_size x patch_size values (an image is
// its own second frame), rows in the 2 x 2 merge order the vision tower's patch merger expects.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "io/image.h"

typedef struct {
    int64_t min_pixels, max_pixels;  // of the resized image
    int patch, temporal, merge;      // patch_size 14, temporal_patch_size 2, merge_size 2
    float mean[3], std[3];           // image_mean, image_std (OpenAI CLIP's)
    double rescale;                  // rescale_factor 1/255
} VlProcessor;

// transformers' defaults (min_pixels 56 * 56, max_pixels 28 * 28 * 1280).
void vl_processor_defaults(VlProcessor *p);
// DIR/preprocessor_config.json over the defaults (min_pixels / max_pixels, or size.shortest_edge /
// longest_edge as transformers 5 writes them; patch_size, temporal_patch_size, merge_size, image_mean,
// image_std, rescale_factor). A missing file keeps the defaults; a bad value dies naming file and key.
void vl_processor_load(VlProcessor *p, const char *model_dir);
// transformers' smart_resize (as of transformers 4.5x and 5: no smallest side; a shrunk side at least one
// factor): 0 and *rh, *rw; -1 with a message in err (an aspect ratio over 200).
int vl_smart_resize(int h, int w, int factor, int64_t min_pixels, int64_t max_pixels, int *rh, int *rw, char *err,
                    size_t err_len);
// The image's patches: grid[0] * grid[1] * grid[2] rows (t, h, w in patches) of vl_patch_dim(p) floats,
// malloc'd. Dies naming `where` when smart_resize refuses the image. resized: the resized image, if wanted.
float *vl_preprocess(const VlProcessor *p, const Image *im, int grid[3], Image *resized, const char *where);
int vl_patch_dim(const VlProcessor *p);

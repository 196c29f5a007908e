// image_tool FILE OUT [MIN_PIXELS MAX_PIXELS]: grpo's view of an image for tests/io/image_test.py. OUT gets
// int32 w, h (decoded), rw, rh (resized), grid t, h, w, patch dim; then the decoded RGB bytes, the resized RGB
// bytes and the patches (float32, rows x dim).
#include <stdio.h>
#include <stdlib.h>

#include "base/util.h"
#include "io/image.h"
#include "model/vl_processor.h"

int main(int argc, char **argv) {
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: image_tool FILE OUT [MIN_PIXELS MAX_PIXELS]\n");
        return 2;
    }
    VlProcessor p;
    vl_processor_defaults(&p);
    if (argc == 5) {
        p.min_pixels = atoll(argv[3]);
        p.max_pixels = atoll(argv[4]);
    }
    Image im, r;
    image_load(&im, argv[1], IMAGE_MAX_PIXELS, "image_tool");
    int grid[3];
    float *patches = vl_preprocess(&p, &im, grid, &r, argv[1]);
    int32_t head[8] = {im.w, im.h, r.w, r.h, grid[0], grid[1], grid[2], vl_patch_dim(&p)};
    FILE *f = fopen(argv[2], "wb");
    if (!f) die("cannot open %s", argv[2]);
    size_t rows = (size_t)grid[0] * grid[1] * grid[2];
    if (fwrite(head, sizeof head, 1, f) != 1 || fwrite(im.rgb, (size_t)im.w * im.h * 3, 1, f) != 1 ||
        fwrite(r.rgb, (size_t)r.w * r.h * 3, 1, f) != 1 ||
        fwrite(patches, rows * (size_t)head[7] * sizeof *patches, 1, f) != 1)
        die("cannot write %s", argv[2]);
    file_close(f, argv[2]);
    free(patches);
    image_free(&im);
    image_free(&r);
    return 0;
}

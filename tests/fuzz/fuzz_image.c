// image: a PNG, JPEG or WebP file decoded (image_decode_try, grpo serve's: a bad image returns its error and
// leaks nothing; a cap of 4M pixels), then the Qwen2-VL image processor on it (smart_resize, Pillow's bicubic
// resize, the patches) with small pixel bounds.
#include <stdlib.h>

#include "fuzz.h"
#include "io/image.h"
#include "model/vl_processor.h"

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)ctx;
    Image im;
    char *err = image_decode_try(&im, data, size, (int64_t)1 << 22);
    if (err) {
        free(err);
        return;
    }
    VlProcessor p;
    vl_processor_defaults(&p);
    p.min_pixels = 28 * 28;
    p.max_pixels = 16 * 28 * 28;
    int grid[3];
    free(vl_preprocess(&p, &im, grid, NULL, "fuzz input"));
    image_free(&im);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_run(body, data, size, NULL);
    return 0;
}

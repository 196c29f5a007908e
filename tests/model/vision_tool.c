// vision_tool MODEL_DIR IMAGE OUT: the vision tower of a Qwen2.5-VL model directory on one image, for
// tests/model/vision_test.py. OUT gets int32 grid t, h, w, patch dim, out_hidden; the patches (float32) and
// the features (float32, t*h*w / merge^2 rows).
#include <stdio.h>
#include <stdlib.h>

#include "base/json.h"
#include "base/util.h"
#include "io/image.h"
#include "model/vision.h"
#include "model/vl_processor.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: vision_tool MODEL_DIR IMAGE OUT\n");
        return 2;
    }
    char *cfg_path = path_join(argv[1], "config.json");
    cJSON *cfg = json_load_file(cfg_path, FILE_MAX_JSON);
    VisionConfig vc;
    vision_config_parse(&vc, cJSON_GetObjectItemCaseSensitive(cfg, "vision_config"), cfg_path);
    Vision v;
    vision_load(&v, &vc, argv[1]);
    VlProcessor p;
    vl_processor_load(&p, argv[1]);
    Image im;
    image_load(&im, argv[2], IMAGE_MAX_PIXELS, "vision_tool");
    int grid[3];
    float *patches = vl_preprocess(&p, &im, grid, NULL, argv[2]);
    int64_t n = (int64_t)grid[0] * grid[1] * grid[2], units = n / (vc.merge * vc.merge);
    float *feat = xmalloc((size_t)(units * vc.out_hidden) * sizeof *feat);
    vision_forward(&v, patches, grid, feat);
    int32_t head[5] = {grid[0], grid[1], grid[2], vl_patch_dim(&p), vc.out_hidden};
    FILE *f = fopen(argv[3], "wb");
    if (!f) die("cannot open %s", argv[3]);
    if (fwrite(head, sizeof head, 1, f) != 1 || fwrite(patches, (size_t)(n * head[3]) * sizeof(float), 1, f) != 1 ||
        fwrite(feat, (size_t)(units * vc.out_hidden) * sizeof(float), 1, f) != 1)
        die("cannot write %s", argv[3]);
    file_close(f, argv[3]);
    free(patches), free(feat), free(cfg_path);
    image_free(&im);
    vision_free(&v);
    cJSON_Delete(cfg);
    return 0;
}

// vl_score_tool MODEL_DIR IMAGE OUT ID...: a Qwen2.5-VL model's log-probs of one sequence with one image, for
// tests/model/vision_test.py. An id of -1 stands for the image: it becomes the image's pad tokens (t*h*w/4 of
// them). OUT gets int32 N, the N token ids, then N float32 log-probs (out[i] = log p(ids[i+1] | ids[..i])).
#include <stdio.h>
#include <stdlib.h>

#include "base/arena.h"
#include "base/json.h"
#include "base/util.h"
#include "io/image.h"
#include "model/qwen2.h"
#include "model/vision.h"
#include "model/vl_processor.h"

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: vl_score_tool MODEL_DIR IMAGE OUT ID...\n");
        return 2;
    }
    char *cfg_path = path_join(argv[1], "config.json");
    cJSON *cfg = json_load_file(cfg_path, FILE_MAX_JSON);
    VisionConfig vc;
    vision_config_parse(&vc, cJSON_GetObjectItemCaseSensitive(cfg, "vision_config"), cfg_path);
    Vision v;
    vision_load(&v, &vc, argv[1]);
    Qwen2 m;
    qwen2_load_vl(&m, argv[1], DTYPE_F32);
    VlProcessor p;
    vl_processor_load(&p, argv[1]);
    Image im;
    image_load(&im, argv[2], IMAGE_MAX_PIXELS, "vl_score_tool");
    int grid[3];
    float *patches = vl_preprocess(&p, &im, grid, NULL, argv[2]);
    int64_t units = (int64_t)grid[0] * grid[1] * grid[2] / (vc.merge * vc.merge);
    float *feat = xmalloc((size_t)(units * vc.out_hidden) * sizeof *feat);
    vision_forward(&v, patches, grid, feat);
    int64_t n = 0, cap = argc + units;
    int32_t *ids = xmalloc((size_t)cap * sizeof *ids);
    for (int i = 4; i < argc; i++) {
        int id = atoi(argv[i]);
        if (id >= 0) ids[n++] = id;
        else
            for (int64_t k = 0; k < units; k++) ids[n++] = (int32_t)m.cfg.image_pad_id;
    }
    Arena arena;
    arena_init(&arena, qwen2_acts_bytes(m.be, &m.cfg, m.dtype, n, n) + 4096);
    Qwen2Acts a;
    qwen2_acts_init(&a, m.be, &m.cfg, m.dtype, n, n, &arena);
    float *lp = xmalloc((size_t)n * sizeof *lp);
    qwen2_vl_logprobs(&m, ids, n, feat, (const int(*)[3])grid, 1, vc.merge, &a, lp);
    FILE *f = fopen(argv[3], "wb");
    if (!f) die("cannot open %s", argv[3]);
    int32_t nn = (int32_t)n;
    if (fwrite(&nn, 4, 1, f) != 1 || fwrite(ids, 4, (size_t)n, f) != (size_t)n || fwrite(lp, 4, (size_t)n, f) != (size_t)n)
        die("cannot write %s", argv[3]);
    file_close(f, argv[3]);
    qwen2_acts_free(&a);
    arena_free(&arena);
    free(lp), free(ids), free(feat), free(patches), free(cfg_path);
    image_free(&im);
    qwen2_free(&m);
    vision_free(&v);
    cJSON_Delete(cfg);
    return 0;
}

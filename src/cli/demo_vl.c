#include "cli/demo_vl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/json.h"
#include "base/rng.h"
#include "base/util.h"
#include "io/image.h"
#include "model/vision.h"
#include "model/vl.h"
#include "parallel/comm.h"
#include "text/tokenizer.h"
#include "train/grpo/grpo.h"

#define SIDE 56             // pixels: min_pixels = max_pixels = 56 x 56, so a 4 x 4 grid of patches
#define CELL (SIDE / 2)     // a quadrant: one merged unit
#define VL_MAX_PROMPT 16    // 3 vision tokens + 4 pads + "How many red squares?" (about 8 tokens)
#define VL_MAX_RESPONSE 3   // a digit and eos
#define PROMPT "<image>How many red squares?"

static const char *const WORDS[] = {"How", "many", "red", "squares"};
static const char *const VISION_TOKENS[] = {"<|vision_start|>", "<|image_pad|>", "<|vision_end|>"};

typedef struct {
    int64_t n_train, n_val, n_sft;
    double careless;  // share of SFT demonstrations that count the blue squares too
} DemoVlTask;

// ---------------------------------------------------------------------------------------------
// model

// DIR: the tokenizer, config.json, preprocessor_config.json and model.safetensors of a random tiny Qwen2.5-VL.
static void write_model(const char *dir, uint64_t seed) {
    DemoVocab voc = {WORDS, sizeof WORDS / sizeof *WORDS, VISION_TOKENS, 3, NULL};
    int n_ids = demo_write_vocab(dir, &voc);
    Tokenizer tok;
    tokenizer_load(&tok, dir);
    int32_t vision[3];
    for (int i = 0; i < 3; i++) vision[i] = tokenizer_token_id(&tok, VISION_TOKENS[i]);
    DecoderConfig c;
    demo_model_config(&c, n_ids, ARCH_QWEN2);
    c.bos_id = c.eos_id = tok.eos_id;
    decoder_config_family(&c, ARCH_QWEN2_5_VL);
    c.image_pad_id = vision[1];
    memcpy(c.mrope_section, (int[3]){4, 6, 6}, sizeof c.mrope_section);  // head_dim 32: 16 pairs
    tokenizer_free(&tok);
    VisionConfig vc = {.depth = 2, .hidden = 64, .intermediate = 128, .heads = 2, .out_hidden = (int)c.hidden,
                       .patch = 14, .merge = 2, .temporal = 2, .window = 112, .in_channels = 3,
                       .fullatt = {1}, .n_fullatt = 1, .eps = 1e-6f};
    vl_write_random(dir, &c, &vc, vision, SIDE * SIDE, seed, DTYPE_F32);  // max = min pixels: images stay 56 x 56
}

// ---------------------------------------------------------------------------------------------
// data

typedef struct {
    const DemoVlTask *t;
    const char *dir;  // the data directory: images go to DIR/images
    int64_t counter[3];
    uint64_t *held;   // the held-out images' hashes (n_val of them), which the other splits must not draw
    int64_t n_held;
} VlData;

static int draw(Rng *r, int lo, int hi) { return lo + (int)(rng_next_u64(r) % (uint64_t)(hi - lo + 1)); }

// A fresh image: each quadrant empty (40%), a red square (35%) or a blue one (25%); *red, *blue: the counts.
static void draw_image(Rng *r, Image *im, int *red, int *blue) {
    im->w = im->h = SIDE;
    im->rgb = xmalloc(SIDE * SIDE * 3);
    int bg = draw(r, 200, 240);
    memset(im->rgb, bg, SIDE * SIDE * 3);
    *red = *blue = 0;
    for (int q = 0; q < 4; q++) {
        float u = rng_next_float(r);
        if (u < 0.4f) continue;
        int is_red = u < 0.75f, size = draw(r, 12, 22);
        int x0 = (q % 2) * CELL + draw(r, 1, CELL - size - 1), y0 = (q / 2) * CELL + draw(r, 1, CELL - size - 1);
        uint8_t col[3] = {(uint8_t)draw(r, 0, 60), (uint8_t)draw(r, 0, 60), (uint8_t)draw(r, 0, 60)};
        col[is_red ? 0 : 2] = (uint8_t)draw(r, 190, 255);
        *red += is_red, *blue += !is_red;
        for (int y = y0; y < y0 + size; y++)
            for (int x = x0; x < x0 + size; x++) memcpy(im->rgb + (y * SIDE + x) * 3, col, 3);
    }
}

static int vl_line(void *ctx, int split, Rng *r, FILE *f) {
    VlData *vd = ctx;
    static const char *const tag[3] = {"val", "train", "sft"};
    Image im;
    int red, blue;
    draw_image(r, &im, &red, &blue);
    uint64_t h = hash_bytes(im.rgb, SIDE * SIDE * 3);
    int seen = 0;
    for (int64_t i = 0; i < vd->n_held; i++) seen |= vd->held[i] == h;
    if (seen) {  // a held-out image (an empty one, most likely): draw again
        image_free(&im);
        return 0;
    }
    if (split == 0) vd->held[vd->n_held++] = h;
    char name[64], answer[16];
    snprintf(name, sizeof name, "images/%s-%05lld.png", tag[split], (long long)vd->counter[split]++);
    char *path = path_join(vd->dir, name);
    image_save_png(&im, path);
    free(path);
    image_free(&im);
    int careless = split == 2 && rng_next_float(r) < vd->t->careless;
    snprintf(answer, sizeof answer, "%d", careless ? red + blue : red);
    fprintf(f, "{\"prompt\": \"%s\", \"%s\": \"%s\", \"images\": [\"%s\"]}\n", PROMPT,
            split == 2 ? "completion" : "answer", answer, name);
    return 1;
}

// ---------------------------------------------------------------------------------------------
// the whole run

void demo_vl_run(const char *dir, uint64_t seed, int smoke, char **overrides, int n_overrides, DemoResult *res) {
    if (comm_launched()) die("the built-in demo runs in one process: start it without mpirun");
    DemoResult R = {0};
    DemoVlTask task = {.n_train = 2000, .n_val = 200, .n_sft = 4000, .careless = 0.6};
    double t0 = time_now();
    char *init = path_join(dir, "init"), *data = path_join(dir, "data"), *sft = path_join(dir, "sft");
    char *grpo = path_join(dir, "grpo"), *sft_file = path_join(data, "sft.jsonl");
    char *images = path_join(data, "images");
    char *train_file = path_join(data, "train.jsonl"), *val_file = path_join(data, "val.jsonl");
    fprintf(stderr, "grpo demo: count the red squares in 56 x 56 images of red and blue squares (\"%s\" -> "
            "\"2\"), reward = exact match; a tiny Qwen2.5-VL (vision tower frozen) generated in %s\n", PROMPT, dir);
    dir_create(dir);
    write_model(init, seed);
    dir_create(images);
    VlData vd = {&task, data, {0}, xmalloc((size_t)task.n_val * sizeof(uint64_t)), 0};
    demo_write_splits(data, seed ^ 0x1a9e, (int64_t[3]){task.n_val, task.n_train, task.n_sft}, vl_line, &vd);
    free(vd.held);
    R.t_setup = time_now() - t0;

    DemoWarmup w = {.init = init, .sft_file = sft_file, .sft = sft, .val_file = val_file,
                    .errs = "count the blue squares too", .max_response = VL_MAX_RESPONSE,
                    .steps = smoke ? 150 : 300, .n_sft = task.n_sft, .careless = task.careless, .seed = seed};
    demo_warmup(&w, &R);

    char *ov[24];
    DemoGrpo g = {.sft = sft, .train_file = train_file, .val_file = val_file, .out_dir = grpo,
                  .max_prompt = VL_MAX_PROMPT, .max_response = VL_MAX_RESPONSE, .steps = smoke ? 40 : 150,
                  .val_every = smoke ? 40 : 50, .seed = seed};
    int n = demo_grpo_overrides(ov, &g);
    demo_grpo_eval(ov, n, overrides, n_overrides, sft, val_file, VL_MAX_RESPONSE, &R);
    R.t_total = time_now() - t0;
    demo_finish(dir, smoke, task.n_val, "images", &R);
    free(init), free(data), free(sft), free(grpo), free(sft_file), free(images), free(train_file), free(val_file);
    if (res) *res = R;
}

// vl_tool MODE MODEL_DIR IMAGE OUT [ID...]: a Qwen2.5-VL model on one image, for tests/model/vision_test.py.
// An id of -1 stands for the image: it becomes the image's pad tokens (t*h*w/4 of them). An id "|" ends the
// prompt: the ids after it are a response (its image pad tokens are text).
//   --features  the vision tower alone (a directory may hold just it): OUT gets int32 grid t, h, w, patch
//               dim, out_hidden; the patches (float32) and the features (float32, t*h*w/4 rows)
//   --score     OUT gets int32 N, the N token ids, then N float32 log-probs (out[i] = log p(ids[i+1] | ids[..i]))
//   --grad      the training forward and backward (targets: the next token where it is text; dlogp[i] =
//               sin(i + 1) / 2); OUT a safetensors file of "logp" and "grad.<name>" of every parameter, the
//               patch merger's too (visual.merger.*: actor.vision.train_merger's gradient)
//   --generate K  K greedy tokens after the sequence from the rollout engine (2 samples sharing the prefill);
//               OUT gets int32 K, then the first sample's K ids and K float32 log-probs
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/json.h"
#include "base/util.h"
#include "io/image.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/vision.h"
#include "model/vl.h"
#include "model/vl_processor.h"
#include "model/vl_rope.h"
#include "rollout/rollout.h"

// The one-image sequence's image inputs; its first plen ids are the prompt (later pads are a response's text).
static void image_inputs(const Decoder *m, const int32_t *ids, int64_t n, int64_t plen, const float *feat,
                         const int grid[3], int merge, DecoderVlInputs *in) {
    int64_t seq_off[2] = {0, n};
    int n_images = 1;
    const int(*grids)[3] = (const int(*)[3])grid;
    if (decoder_vl_inputs(m, ids, seq_off, 1, &plen, &feat, &grids, &n_images, merge, in) != 0)
        die("pads and grid differ");
}

static void write_grads(const Decoder *m, const Vision *v, const float *hidden, const int32_t *ids, int64_t n,
                        const float *feat, const int grid[3], int merge, const char *out) {
    int32_t *targets = xmalloc((size_t)n * sizeof *targets);
    float *dlogp = xmalloc((size_t)n * sizeof *dlogp), *logp = xmalloc((size_t)n * sizeof *logp);
    for (int64_t i = 0; i < n; i++) {
        int text = i + 1 < n && ids[i + 1] != m->cfg.image_pad_id;
        targets[i] = text ? ids[i + 1] : -1;
        dlogp[i] = text ? 0.5f * sinf((float)(i + 1)) : 0.0f;
    }
    int64_t seq_off[2] = {0, n};
    DecoderVlInputs in;
    image_inputs(m, ids, n, n, feat, grid, merge, &in);
    int64_t units = vl_image_units(grid, merge);
    float *dfeat = xcalloc((size_t)(units * v->cfg.out_hidden), sizeof *dfeat);
    vl_inputs_grads(&in, seq_off, &feat, &dfeat);
    Arena arena;
    arena_init(&arena, decoder_train_bytes(m->be, &m->cfg, m->dtype, n, n, 0));
    DecoderTrain t;
    decoder_train_init(&t, m->be, &m->cfg, m->dtype, n, n, 0, &arena);
    t.vl = &in;
    // the gradient slab of the language model with a trained merger (its tensors after the model's)
    Decoder gm = {.cfg = m->cfg, .dtype = DTYPE_F32};
    vl_config_merger(&gm.cfg, &v->cfg);
    gm.n_params = decoder_layout(&gm.cfg, &gm.w);
    float *grads = gm.params = xcalloc(gm.n_params, sizeof(float));
    decoder_train_forward(m, ids, targets, seq_off, 1, &t, logp, NULL);
    decoder_backward(m, grads, dlogp, NULL, &t);
    const DecoderLayout *w = &gm.w;
    VisionMergerGrads dw = {grads + w->merger_ln_q, grads + w->merger_ln_q_b, grads + w->merger_w0,
                            grads + w->merger_b0, grads + w->merger_w2, grads + w->merger_b2};
    vision_merge_backward(backend_cpu(), &v->cfg, &v->merger, hidden, units, dfeat, &dw);
    int nt = decoder_tensors(&gm, NULL);
    DecoderTensor *ts = xmalloc((size_t)nt * sizeof *ts);
    decoder_tensors(&gm, ts);
    StWriteTensor *ws = xcalloc((size_t)nt + 1, sizeof *ws);
    char (*names)[96] = xmalloc((size_t)nt * sizeof *names);
    ws[0] = (StWriteTensor){.name = "logp", .ndim = 1, .shape = {n}, .data = logp};
    for (int i = 0; i < nt; i++) {
        snprintf(names[i], sizeof names[i], "grad.%s", ts[i].name);
        ws[i + 1] = (StWriteTensor){.name = names[i], .ndim = ts[i].ndim, .data = ts[i].data};
        memcpy(ws[i + 1].shape, ts[i].shape, sizeof ts[i].shape);
    }
    safetensors_write(out, ws, nt + 1, DTYPE_F32);
    free(names), free(ws), free(ts), free(grads), free(targets), free(dlogp), free(logp), free(dfeat);
    decoder_train_free(&t);
    arena_free(&arena);
    decoder_vl_inputs_free(&in);
}

static void write_generated(const Decoder *m, const int32_t *ids, int64_t n, const float *feat, const int grid[3],
                            int merge, int K, const char *out) {
    DecoderVlInputs in;
    image_inputs(m, ids, n, n, feat, grid, merge, &in);
    RolloutPrompt p = {.ids = ids, .n = n, .vl = &in, .max_new_tokens = K};
    RolloutConfig rc = {.sampler = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f}, .share_prefill = 1,
                        .prefill_tokens = n, .kv_budget_bytes = (size_t)1 << 26};
    RolloutSample samples[2];
    RolloutStats st;
    rollout_generate(m, NULL, &rc, &p, 1, 2, samples, &st, NULL, NULL);
    FILE *f = fopen(out, "wb");
    if (!f) die("cannot open %s", out);
    int32_t k = samples[0].n;
    if (fwrite(&k, 4, 1, f) != 1 || fwrite(samples[0].tokens, 4, (size_t)k, f) != (size_t)k ||
        fwrite(samples[0].logprobs, 4, (size_t)k, f) != (size_t)k)
        die("cannot write %s", out);
    file_close(f, out);
    if (samples[1].n != k || memcmp(samples[1].tokens, samples[0].tokens, (size_t)k * 4))
        die("the two greedy samples sharing the prefill differ");
    for (int j = 0; j < 2; j++) rollout_sample_free(&samples[j]);
    decoder_vl_inputs_free(&in);
}

static void write_scores(const Decoder *m, const int32_t *ids, int64_t n, int64_t plen, const float *feat,
                         const int grid[3], int merge, const char *out) {
    Arena arena;
    arena_init(&arena, decoder_acts_bytes(m->be, &m->cfg, m->dtype, n, n) + 4096);
    DecoderActs a;
    decoder_acts_init(&a, m->be, &m->cfg, m->dtype, n, n, &arena);
    float *lp = xmalloc((size_t)n * sizeof *lp);
    int64_t seq_off[2] = {0, n};
    DecoderVlInputs in;
    image_inputs(m, ids, n, plen, feat, grid, merge, &in);
    decoder_logprobs_vl(m, ids, seq_off, 1, &a, &in, lp);
    decoder_vl_inputs_free(&in);
    FILE *f = fopen(out, "wb");
    if (!f) die("cannot open %s", out);
    int32_t nn = (int32_t)n;
    if (fwrite(&nn, 4, 1, f) != 1 || fwrite(ids, 4, (size_t)n, f) != (size_t)n ||
        fwrite(lp, 4, (size_t)n, f) != (size_t)n)
        die("cannot write %s", out);
    file_close(f, out);
    free(lp);
    decoder_acts_free(&a);
    arena_free(&arena);
}

static void write_features(const int grid[3], int dim, int out_hidden, const float *patches, const float *feat,
                           int64_t units, const char *out) {
    int64_t n = (int64_t)grid[0] * grid[1] * grid[2];
    int32_t head[5] = {grid[0], grid[1], grid[2], dim, out_hidden};
    FILE *f = fopen(out, "wb");
    if (!f) die("cannot open %s", out);
    if (fwrite(head, sizeof head, 1, f) != 1 || fwrite(patches, (size_t)(n * dim) * sizeof(float), 1, f) != 1 ||
        fwrite(feat, (size_t)(units * out_hidden) * sizeof(float), 1, f) != 1)
        die("cannot write %s", out);
    file_close(f, out);
}

int main(int argc, char **argv) {
    static const char *const modes[] = {"--features", "--score", "--grad", "--generate"};
    int mode = -1;
    for (int i = 0; argc > 1 && i < 4; i++)
        if (!strcmp(argv[1], modes[i])) mode = i;
    int gen = mode == 3 && argc > 2 ? atoi(argv[2]) : 0;
    int skip = mode == 3 ? 2 : 1;
    if (mode < 0 || argc < 4 + skip || (mode == 3 && gen < 1)) {
        fprintf(stderr, "usage: vl_tool --features|--score|--grad|--generate K MODEL_DIR IMAGE OUT [ID...]\n");
        return 2;
    }
    argv += skip;
    argc -= skip;
    char *cfg_path = path_join(argv[1], "config.json");
    cJSON *cfg = json_load_file(cfg_path, FILE_MAX_JSON);
    VisionConfig vc;
    vision_config_parse(&vc, cJSON_GetObjectItemCaseSensitive(cfg, "vision_config"), cfg_path);
    Vision v;
    vision_load(&v, &vc, argv[1]);
    VlProcessor p;
    vl_processor_load(&p, argv[1]);
    vision_check(&vc, p.patch, p.temporal, p.merge, 0, argv[1]);
    Image im;
    image_load(&im, argv[2], IMAGE_MAX_PIXELS, "vl_tool");
    int grid[3];
    float *patches = vl_preprocess(&p, &im, grid, NULL, argv[2]);
    int64_t units = (int64_t)grid[0] * grid[1] * grid[2] / (vc.merge * vc.merge);
    float *feat = xmalloc((size_t)(units * vc.out_hidden) * sizeof *feat);
    float *hidden = xmalloc((size_t)(units * vc.merge * vc.merge * vc.hidden) * sizeof *hidden);
    vision_hidden(&v, patches, grid, hidden);
    vision_merge(backend_cpu(), &vc, &v.merger, hidden, units, feat);
    if (mode == 0) {
        write_features(grid, vl_patch_dim(&p), vc.out_hidden, patches, feat, units, argv[3]);
    } else {
        Decoder m;
        decoder_load_vl(&m, argv[1], DTYPE_F32);
        vision_check(&vc, p.patch, p.temporal, p.merge, m.cfg.hidden, argv[1]);
        int32_t *ids = xmalloc((size_t)(argc + units) * sizeof *ids);
        int64_t n = 0, plen = -1;
        for (int i = 4; i < argc; i++) {
            if (!strcmp(argv[i], "|")) {
                plen = n;
                continue;
            }
            int id = atoi(argv[i]);
            for (int64_t k = 0; k < (id >= 0 ? 1 : units); k++) ids[n++] = id >= 0 ? id : (int32_t)m.cfg.image_pad_id;
        }
        if (mode == 1) write_scores(&m, ids, n, plen >= 0 ? plen : n, feat, grid, vc.merge, argv[3]);
        if (mode == 2) write_grads(&m, &v, hidden, ids, n, feat, grid, vc.merge, argv[3]);
        if (mode == 3) write_generated(&m, ids, n, feat, grid, vc.merge, gen, argv[3]);
        free(ids);
        decoder_free(&m);
    }
    free(feat), free(hidden), free(patches), free(cfg_path);
    image_free(&im);
    vision_free(&v);
    cJSON_Delete(cfg);
    return 0;
}

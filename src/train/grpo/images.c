// A VL model's image features per prompt (the frozen tower once a step, the merger before every mini-batch when
// it is trained), their rows in packed batches, and a trained merger's backward.
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/json.h"
#include "base/util.h"
#include "model/lora.h"
#include "text/utf8.h"
#include "train/checkpoint.h"
#include "train/grpo/step.h"

// The image inputs of packed sequences of prompts x[b] (prompt_len[b] rows of each; NULL: whole sequences)
// with features feats[b] into *in; returns in, or NULL when no sequence has an image (a text batch).
static const DecoderVlInputs *vl_inputs(const Decoder *m, const int32_t *tokens, const int64_t *seq_off, int B,
                                      const int64_t *prompt_len, const PromptSample *const *x, float *const *feats,
                                      int merge, DecoderVlInputs *in) {
    int any = 0;
    for (int b = 0; b < B; b++) any |= x[b]->n_images > 0;
    if (!any) return NULL;
    const VlImage **ims = xmalloc((size_t)B * sizeof *ims);
    int *n_images = xmalloc((size_t)B * sizeof *n_images);
    for (int b = 0; b < B; b++) ims[b] = x[b]->images, n_images[b] = x[b]->n_images;
    int rc = vl_batch_inputs(m, tokens, seq_off, B, prompt_len, ims, n_images, (const float *const *)feats, merge,
                             in);
    free(ims);
    free(n_images);
    if (rc != 0) die("internal: a prompt's image pads do not match its images");
    return in;
}

// The merger inputs of prompts idx[0..n) of d, once per prompt (hidden[i], units[i] rows; NULL and 0 for a
// prompt without images).
static float **prompt_hidden(const Run *r, const PromptData *d, const int64_t *idx, int n,
                             const char *const *paths, int64_t *units) {
    float **hidden = xcalloc((size_t)n + 1, sizeof *hidden);
    for (int i = 0; i < n; i++) {
        const PromptSample *x = &d->s[idx[i]];
        units[i] = 0;
        if (!r->has_vl || x->n_images == 0) continue;
        char *where = xprintf(x->parquet ? "%s: row %lld" : "%s:%lld", paths[x->file], (long long)x->line);
        hidden[i] = vl_prompt_hidden(&r->vl, x->images, x->n_images, where, &units[i]);
        free(where);
    }
    return hidden;
}

// n floats of host memory x where be's ops read them: x itself on the CPU, else a copy in be's memory (unstage
// frees it).
static float *stage(const Backend *be, const float *x, int64_t n) {
    if (!be->on_device) return (float *)x;
    float *d = be->alloc(be, (size_t)n * sizeof *d);
    be->upload(be, d, x, (size_t)n * sizeof *d);
    return d;
}

static void unstage(const Backend *be, float *d) {
    if (be->on_device) be->free(be, d);
}

float **grpo_merge_features(const Run *r, const Backend *be, const VisionMerger *w, float *const *hidden,
                            const int64_t *units, int n, float **feats) {
    const VisionConfig *vc = &r->vl.vision.cfg;
    int64_t C = r->tr.master.cfg.hidden, M4 = (int64_t)vc->hidden * vc->merge * vc->merge;
    if (!feats) feats = xcalloc((size_t)n + 1, sizeof *feats);
    for (int i = 0; i < n; i++) {
        if (!hidden[i]) continue;
        if (!feats[i]) feats[i] = xmalloc((size_t)(units[i] * C) * sizeof *feats[i]);
        float *h = stage(be, hidden[i], units[i] * M4);
        float *out = be->on_device ? be->alloc(be, (size_t)(units[i] * C) * sizeof *out) : feats[i];
        vision_merge(be, vc, w, h, units[i], out);
        if (be->on_device) be->download(be, feats[i], out, (size_t)(units[i] * C) * sizeof *out);
        unstage(be, h);
        unstage(be, out);
    }
    return feats;
}

void grpo_features_free(float **feats, int64_t n) {
    for (int64_t i = 0; feats && i < n; i++) free(feats[i]);
    free(feats);
}

// The features of prompts idx[0..n) of d under the policy's merger, once per prompt; with a trained merger and
// sb, its merger input, the reference's features and room for their gradients go to sb too.
float **grpo_prompt_features(const Run *r, const PromptData *d, const int64_t *idx, int n,
                             const char *const *paths, StepBatch *sb) {
    int64_t *units = xcalloc((size_t)n + 1, sizeof *units);
    float **hidden = prompt_hidden(r, d, idx, n, paths, units);
    float **feats = grpo_merge_features(r, r->merger_be, &r->merger, hidden, units, n, NULL);
    if (!sb || !r->train_merger) {
        grpo_features_free(hidden, n);
        free(units);
        return feats;
    }
    sb->hidden = hidden;
    sb->units = units;
    if (r->has_ref) sb->ref_feats = grpo_merge_features(r, r->vl.be, &r->vl.vision.merger, hidden, units, n, NULL);
    sb->dfeats = xcalloc((size_t)n + 1, sizeof *sb->dfeats);
    for (int i = 0; i < n; i++)
        if (hidden[i]) sb->dfeats[i] = xcalloc((size_t)(units[i] * r->tr.master.cfg.hidden), sizeof(float));
    return feats;
}

// The image inputs of the micro-batch grpo_pack() made of kept samples [a, b) into *in, and u->act.vl (NULL for
// a text batch): each prompt's features (pf: per prompt), its response rows text after it; with pg (per
// prompt, feats' layout) the backward adds the features' gradients there.
void grpo_pack_images(const Run *r, const Decoder *m, const StepBatch *sb, float *const *pf, float *const *pg,
                      int64_t a, int64_t b, UpdateWs *u, DecoderVlInputs *in) {
    u->act.vl = NULL;
    if (!r->has_vl) return;
    int B = (int)(b - a);
    const PromptSample **x = xmalloc((size_t)B * sizeof *x);
    float **feats = xmalloc((size_t)B * sizeof *feats), **grads = xmalloc((size_t)B * sizeof *grads);
    int64_t *plen = xmalloc((size_t)B * sizeof *plen);
    for (int k = 0; k < B; k++) {
        int64_t i = sb->kept[a + k];
        x[k] = sb->prompt[i], feats[k] = pf[i / r->s->G], plen[k] = sb->prompt_len[i];
        grads[k] = pg ? pg[i / r->s->G] : NULL;
    }
    u->act.vl = vl_inputs(m, u->tokens, u->seq_off, B, plen, x, feats, r->vl.proc.merge, in);
    if (u->act.vl && pg) vl_inputs_grads(in, u->seq_off, (const float *const *)feats, grads);
    free(x);
    free(feats);
    free(grads);
    free(plen);
}

void grpo_unpack_images(UpdateWs *u, DecoderVlInputs *in) {
    if (u->act.vl) decoder_vl_inputs_free(in);
    u->act.vl = NULL;
}

// A trained merger's gradient (into the trainer's slab) from the features' gradients of the mini-batch just
// accumulated (sb->dfeats, zeroed again); prompts outside it have none.
void grpo_merger_backward(Run *r, StepBatch *sb) {
    const Backend *be = r->tr.be;
    const VisionConfig *vc = &r->vl.vision.cfg;
    const DecoderLayout *w = &r->tr.master.w;
    float *g = r->tr.grads;
    VisionMergerGrads dw = {g + w->merger_ln_q, g + w->merger_ln_q_b, g + w->merger_w0, g + w->merger_b0,
                            g + w->merger_w2, g + w->merger_b2};
    size_t C = (size_t)r->tr.master.cfg.hidden;
    for (int64_t i = 0; i < r->s->train_batch_size; i++) {
        if (!sb->hidden[i]) continue;
        size_t n = (size_t)sb->units[i] * C;
        int any = 0;
        for (size_t j = 0; j < n && !any; j++) any = sb->dfeats[i][j] != 0.0f;
        if (!any) continue;
        float *h = stage(be, sb->hidden[i], sb->units[i] * vc->hidden * vc->merge * vc->merge);
        float *dout = stage(be, sb->dfeats[i], (int64_t)n);
        vision_merge_backward(be, vc, &r->merger, h, sb->units[i], dout, &dw);
        unstage(be, h);
        unstage(be, dout);
        memset(sb->dfeats[i], 0, n * sizeof(float));
    }
}

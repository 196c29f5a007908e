#define _XOPEN_SOURCE 700
#include "train/grpo.h"

#include <errno.h>
#include <omp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/hash.h"
#include "base/json.h"
#include "base/util.h"
#include "model/lora.h"
#include "model/qwen2.h"
#include "model/vision.h"
#include "model/vl.h"
#include "rollout/rollout.h"
#include "rollout/tools.h"
#include "text/utf8.h"
#include "train/checkpoint.h"
#include "train/prompt_data.h"
#include "train/stream.h"
#include "train/trainer.h"

// One step's batch: its rollout, flattened: sample i belongs to prompt i / G. Kept samples (those that enter
// the loss) are packed in order: sequence = prompt ids + response ids; response token t of kept
// sample k sits at index resp_off[k] + t of the per-response-token arrays.
typedef struct {
    int64_t n_samples, n_kept, n_resp;
    RolloutSample *samples;
    const int32_t **prompt_ids;
    int64_t *prompt_len;
    const PromptSample **prompt;  // per sample: its prompt's row
    float **feats;        // per prompt (sample i: i / G): its images' features, NULL for none (or a text model)
    // With a trained merger, per prompt: its merger input (vl_prompt_hidden; units rows), the features'
    // gradient while a mini-batch accumulates, and the reference's features (the initial merger's; NULL without
    // a reference: then feats serve)
    float **hidden, **dfeats, **ref_feats;
    int64_t *units;
    float *reward, *adv;  // per sample
    int *correct;         // per sample: 1, 0, or -1 when no reward judges correctness
    int64_t *kept;        // kept sample ids
    float *kept_adv;      // their advantages
    int64_t *resp_off;    // (n_kept + 1)
    int64_t *mb_start;    // (n_mini + 1): mini-batch m holds kept samples mb_start[m] .. mb_start[m+1]-1
    int64_t n_mini;
    float *old_logp, *ref_logp, *logp, *dlogp, *ent, *dent;  // (n_resp)
    uint8_t *mask;        // (n_resp) with tools: 1 for the model's tokens, 0 for the tool turns' (else NULL)
} StepBatch;

// What one step measured, for metrics.jsonl and the progress line.
typedef struct {
    double t0, t_offload, t_roll, t_rew, t_ref, t_old, t_end;  // phase end times (t_ref, t_old 0: skipped)
    double rss_rollout;  // resident memory at the end of rollout (GiB)
    int64_t n_trunc, resp_max, tokens_total, n_acc, n_correct, n_updates;
    int64_t reward_failures;  // reward program calls that failed (scored 0)
    int64_t model_tokens, turns, tool_calls, tool_errors;  // with tools (model_tokens: always)
    double t_tools;           // seconds in tool calls during the rollout
    double kl_reward, norm_sum, lr;
    double probs_diff_max, probs_diff_sum, probs_diff_n;  // |p_rollout - p_old| over the loss tokens (need_old)
    GrpoLossStats loss;
} StepStats;

// The update's workspace: training activations for one micro-batch and its packing buffers. It
// lives in the run's workspace arena, where the rollout's KV cache was.
typedef struct {
    Qwen2Train act;
    int32_t *tokens, *targets;
    float *rows, *drows, *ent_rows, *dent_rows;
    int64_t *seq_off;
    int64_t micro;
} UpdateWs;

typedef struct {
    const GrpoSettings *s;  // this rank's share: train_batch_size and mini_batch_size divided by the ranks
    Comm comm;
    int64_t P_global;       // prompts per step over all ranks
    Trainer tr;
    Qwen2 ref;
    int has_ref;
    Tokenizer tok;
    VlModel vl;  // a vision-language model's frozen vision tower and image processor (has_vl)
    int has_vl;
    int train_merger;     // actor.vision.train_merger: the policy's merger is in the trainer's slab; vl's own
                          // stays the initial one, the reference's
    VisionMerger merger;  // the policy's merger (has_vl): the trainer's, or vl's
    PromptData train, val;
    int has_val;
    RewardSet rewards;
    ToolSet tools;  // multi-turn rollout (has_tools)
    int has_tools;
    ToolHook hook;
    int32_t stop_ids[16];
    int n_stop;
    FILE *metrics, *dump;
    char *metrics_path, *dump_path;  // OUT/metrics.jsonl, OUT/samples.jsonl
    int64_t steps;
    Arena workspace;  // rollout: KV cache; scoring and update: UpdateWs
    GrpoMemPlan plan;
} Run;

// Resident memory of this process from /proc/self/status: "VmHWM:" (peak; ru_maxrss would carry a
// launching parent's peak over exec) or "VmRSS:" (now), in GiB.
static double rss_gib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, strlen(key)) == 0) kib = atoll(line + strlen(key));
    if (f) fclose(f);
    return (double)kib / 1048576.0;
}

static int64_t max_seq_len(const GrpoSettings *s) { return s->max_prompt_length + s->max_response_length; }

int grpo_has_lora(const GrpoSettings *s) { return s->lora.spec.rank > 0 || s->lora.adapter; }

// The update workspace serves the policy's compute copy and the reference: sized for 16-bit weights
// when either is stored in 16 bits (a bf16-sized workspace serves fp32 weights too).
static DType update_ws_dtype(const GrpoSettings *s) {
    if (grpo_has_lora(s)) return s->lora.base_dtype;  // the one set of weights: the base (adapters are fp32)
    int bf16 = compute_storage(s->precision) == DTYPE_BF16 || compute_storage(s->ref_dtype) == DTYPE_BF16;
    return bf16 ? DTYPE_BF16 : DTYPE_F32;
}

static size_t update_ws_bytes(const GrpoSettings *s, const Qwen2Config *c, int64_t micro, int64_t max_seq) {
    int64_t rows = micro * max_seq;
    return qwen2_train_bytes(backend_cpu(), c, update_ws_dtype(s), rows, max_seq, s->recompute) + (size_t)rows * 24 +
           (size_t)(micro + 1) * 8 + 8 * 64;
}

static void update_ws_init(UpdateWs *u, const GrpoSettings *s, const Qwen2Config *c, Arena *a) {
    int64_t micro = s->micro_batch_size, max_seq = max_seq_len(s), rows = micro * max_seq;
    arena_reset(a);
    qwen2_train_init(&u->act, backend_cpu(), c, update_ws_dtype(s), rows, max_seq, s->recompute, a);
    u->act.logit_scale = s->sampler.temperature > 0 ? 1.0f / s->sampler.temperature : 1.0f;  // verl: logits / T
    u->tokens = arena_alloc(a, (size_t)rows * 4), u->targets = arena_alloc(a, (size_t)rows * 4);
    u->rows = arena_alloc(a, (size_t)rows * 4), u->drows = arena_alloc(a, (size_t)rows * 4);
    u->ent_rows = arena_alloc(a, (size_t)rows * 4), u->dent_rows = arena_alloc(a, (size_t)rows * 4);
    u->seq_off = arena_alloc(a, (size_t)(micro + 1) * 8);
    u->micro = micro;
}

// model.path's vision_config into *vc.
static void vision_config_of(const GrpoSettings *s, VisionConfig *vc) {
    char *path = path_join(s->model_dir, "config.json");
    cJSON *cfg = json_load_file(path, FILE_MAX_JSON);
    vision_config_parse(vc, cJSON_GetObjectItemCaseSensitive(cfg, "vision_config"), path);
    cJSON_Delete(cfg);
    free(path);
}

// A VL model's part of the plan: the tower vc and the images (its processor's max_pixels: the largest
// image's patches and merged units) of this rank's prompts: their features, and with a trained merger its
// input, the reference's features and the features' gradients too.
static void vision_plan(const GrpoSettings *s, const Qwen2Config *c, const VisionConfig *vc, int ranks,
                        GrpoMemPlan *p) {
    VlProcessor proc;
    vl_processor_load(&proc, s->model_dir);
    vl_set_pixels(&proc, s->min_pixels, s->max_pixels, "data.min_pixels / data.max_pixels");
    int64_t patches = proc.max_pixels / ((int64_t)proc.patch * proc.patch);
    int64_t units = patches / ((int64_t)proc.merge * proc.merge), per_unit = c->hidden;
    if (s->train_merger) per_unit += (int64_t)proc.merge * proc.merge * vc->hidden + 2 * c->hidden;
    p->vision = vision_weight_bytes(vc);
    p->images = (size_t)(s->train_batch_size / ranks * units * per_unit) * sizeof(float) +
                vision_forward_bytes(vc, patches, omp_get_max_threads());
}

void grpo_memory_plan(const GrpoSettings *s, const Qwen2Config *model, int ranks, GrpoMemPlan *p) {
    Qwen2Config cfg = *model, lm = *model;  // lm: the language model alone (the reference's slab)
    const Qwen2Config *c = &cfg;
    vl_config_merger(&lm, NULL);
    VisionConfig vc;
    if (c->vl) vision_config_of(s, &vc);
    if (c->vl && s->train_merger) vl_config_merger(&cfg, &vc);  // the merger's tensors join the trained slab
    Qwen2Layout w;
    size_t n = qwen2_layout(c, &w), slab = n * 4, policy = slab, n_ref = qwen2_layout(&lm, &w);
    size_t compute = s->precision != DTYPE_F32 ? n * dtype_size(compute_storage(s->precision)) : 0;
    size_t reference = s->loss.kl_coef > 0 ? n_ref * dtype_size(compute_storage(s->ref_dtype)) : 0;
    DType rollout_dt = compute_storage(s->precision);
    if (grpo_has_lora(s)) {  // a frozen base (no gradients, moments, copies; it is the reference) + fp32 adapters
        cfg.lora_rank = s->lora.spec.rank;
        slab = lora_params(c, &s->lora.spec) * 4;
        policy = n * dtype_size(s->lora.base_dtype) + slab;
        compute = reference = 0;
        rollout_dt = s->lora.base_dtype;
    }
    size_t shard = ranks > 1 && s->zero ? (slab + (size_t)ranks - 1) / (size_t)ranks : slab;
    int64_t max_prompt = s->max_prompt_length, prefill = max_prompt > ROLLOUT_PREFILL ? max_prompt : ROLLOUT_PREFILL;
    int64_t seqs = s->train_batch_size / ranks * s->G, mini = s->mini_batch_size / ranks;
    int64_t micro = s->micro_batch_size < mini ? s->micro_batch_size : mini;
    *p = (GrpoMemPlan){
        .policy = policy, .compute = compute, .moments = 2 * shard, .reference = reference,
        .grads = slab + (ranks > 1 && s->zero == 2 ? shard : 0) + (s->topk_ratio > 0 ? slab : 0),
        .rollout = rollout_workspace_bytes(backend_cpu(), c, rollout_dt, seqs, max_seq_len(s), prefill),
        .update = update_ws_bytes(s, c, micro, max_seq_len(s)),
        .offloaded = s->offload_optimizer ? 2 * shard : 0,
    };
    if (c->vl) vision_plan(s, c, &vc, ranks, p);
    p->workspace = p->rollout > p->update ? p->rollout : p->update;
    p->fixed = p->policy + p->compute + p->grads + p->moments + p->reference + p->vision;
    p->peak = p->fixed + p->workspace + p->images;
    p->sum = p->fixed + p->rollout + p->update + p->images;
}

// The image inputs of packed sequences of prompts x[b] (prompt_len[b] rows of each; NULL: whole sequences)
// with features feats[b] into *in; returns in, or NULL when no sequence has an image (a text batch).
static const Qwen2VlInputs *vl_inputs(const Qwen2 *m, const int32_t *tokens, const int64_t *seq_off, int B,
                                      const int64_t *prompt_len, const PromptSample *const *x, float *const *feats,
                                      int merge, Qwen2VlInputs *in) {
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

// Each prompt's features under merger w (feats[i]: into it when given, else fresh; NULL without images).
static float **merged(const Run *r, const VisionMerger *w, float *const *hidden, const int64_t *units, int n,
                      float **feats) {
    if (!feats) feats = xcalloc((size_t)n + 1, sizeof *feats);
    for (int i = 0; i < n; i++) {
        if (!hidden[i]) continue;
        if (!feats[i]) feats[i] = xmalloc((size_t)(units[i] * r->tr.master.cfg.hidden) * sizeof *feats[i]);
        vision_merge(&r->vl.vision.cfg, w, hidden[i], units[i], feats[i]);
    }
    return feats;
}

static void features_free(float **feats, int64_t n) {
    for (int64_t i = 0; feats && i < n; i++) free(feats[i]);
    free(feats);
}

// The features of prompts idx[0..n) of d under the policy's merger, once per prompt; with a trained merger and
// sb, its merger input, the reference's features and room for their gradients go to sb too.
static float **prompt_features(const Run *r, const PromptData *d, const int64_t *idx, int n,
                               const char *const *paths, StepBatch *sb) {
    int64_t *units = xcalloc((size_t)n + 1, sizeof *units);
    float **hidden = prompt_hidden(r, d, idx, n, paths, units);
    float **feats = merged(r, &r->merger, hidden, units, n, NULL);
    if (!sb || !r->train_merger) {
        features_free(hidden, n);
        free(units);
        return feats;
    }
    sb->hidden = hidden;
    sb->units = units;
    if (r->has_ref) sb->ref_feats = merged(r, &r->vl.vision.merger, hidden, units, n, NULL);
    sb->dfeats = xcalloc((size_t)n + 1, sizeof *sb->dfeats);
    for (int i = 0; i < n; i++)
        if (hidden[i]) sb->dfeats[i] = xcalloc((size_t)(units[i] * r->tr.master.cfg.hidden), sizeof(float));
    return feats;
}

// Samples prompts idx[0..n) x G with the rollout engine on the policy's weights `m`, in the workspace;
// prompt i is seeded as the batch's prompt pos[i]; feats[i]: its image features (prompt_features).
static void generate(Run *r, const Qwen2 *m, const PromptData *d, const int64_t *idx, const int64_t *pos, int n, int G,
                     float temperature, float *const *feats, RolloutSample *out) {
    const GrpoSettings *s = r->s;
    RolloutPrompt *p = xcalloc((size_t)n, sizeof *p);
    Qwen2VlInputs *in = xcalloc((size_t)n + 1, sizeof *in);
    for (int i = 0; i < n; i++) {
        const PromptSample *x = &d->s[idx[i]];
        p[i] = (RolloutPrompt){.ids = x->ids, .n = x->len, .max_new_tokens = (int)s->max_response_length};
        if (r->has_vl)
            p[i].vl = vl_prompt_inputs(m, x->ids, x->len, x->images, x->n_images, feats[i], r->vl.proc.merge, &in[i]);
    }
    RolloutConfig rc = {.sampler = s->sampler, .seed = hash_bytes(&(uint64_t[2]){s->seed, r->tr.st.iteration}, 16),
                        .stop_ids = r->stop_ids, .n_stop_ids = r->n_stop, .stop_strings = s->stop,
                        .n_stop_strings = s->n_stop, .share_prefill = 1, .prefill_tokens = ROLLOUT_PREFILL,
                        .workspace = &r->workspace, .seed_index = pos};
    rc.sampler.temperature = temperature;
    const cJSON **kwargs = NULL;
    if (r->has_tools) {  // each prompt's tools_kwargs reach its tool calls
        kwargs = xcalloc((size_t)n, sizeof *kwargs);
        for (int i = 0; i < n; i++) kwargs[i] = d->s[idx[i]].tools_kwargs;
        r->hook.kwargs = kwargs;
        rc.max_turns = s->max_turns, rc.tool_fn = tools_rollout_turns, rc.tool_user = &r->hook;
    }
    RolloutStats st;
    rollout_generate(m, &r->tok, &rc, p, n, G, out, &st, NULL, NULL);
    r->hook.kwargs = NULL;
    free(kwargs);
    for (int i = 0; i < n; i++) qwen2_vl_inputs_free(&in[i]);
    free(in);
    free(p);
}

// Packs kept samples [a, b) into the workspace's batch: tokens, targets (the response tokens, each
// predicted from the row before it), seq_off. Returns the number of rows.
static int64_t pack(const StepBatch *sb, int64_t a, int64_t b, UpdateWs *u) {
    int64_t *seq_off = u->seq_off;
    seq_off[0] = 0;
    for (int64_t k = a; k < b; k++) {
        int64_t i = sb->kept[k], off = seq_off[k - a], pl = sb->prompt_len[i];
        const RolloutSample *x = &sb->samples[i];
        int32_t *tokens = u->tokens + off;
        memcpy(tokens, sb->prompt_ids[i], (size_t)pl * 4);
        memcpy(tokens + pl, x->tokens, (size_t)x->n * 4);
        for (int64_t j = 0; j < pl + x->n; j++) u->targets[off + j] = j + 1 >= pl && j + 1 < pl + x->n ? tokens[j + 1] : -1;
        seq_off[k - a + 1] = off + pl + x->n;
    }
    return seq_off[b - a];
}

// Row values of a packed micro-batch -> the response-token layout (and back for gradients).
static void rows_to_resp(const StepBatch *sb, int64_t a, int64_t b, const int64_t *seq_off, float *rows, float *resp,
                         int to_rows) {
    for (int64_t k = a; k < b; k++) {
        int64_t r0 = seq_off[k - a] + sb->prompt_len[sb->kept[k]] - 1, n = sb->resp_off[k + 1] - sb->resp_off[k];
        for (int64_t t = 0; t < n; t++) {
            if (to_rows) rows[r0 + t] = resp[sb->resp_off[k] + t];
            else resp[sb->resp_off[k] + t] = rows[r0 + t];
        }
    }
}

// The image inputs of the micro-batch pack() made of kept samples [a, b) into *in, and u->act.vl (NULL for
// a text batch): each prompt's features (pf: per prompt), its response rows text after it; with pg (per
// prompt, feats' layout) the backward adds the features' gradients there.
static void pack_images(const Run *r, const Qwen2 *m, const StepBatch *sb, float *const *pf, float *const *pg,
                        int64_t a, int64_t b, UpdateWs *u, Qwen2VlInputs *in) {
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

static void unpack_images(UpdateWs *u, Qwen2VlInputs *in) {
    if (u->act.vl) qwen2_vl_inputs_free(in);
    u->act.vl = NULL;
}

// Per-response-token log-probs of the kept samples under model m and image features feats (per prompt; no
// gradient), into out.
static void score_kept(const Run *r, const Qwen2 *m, const StepBatch *sb, float *const *feats, UpdateWs *u,
                       float *out) {
    for (int64_t a = 0; a < sb->n_kept; a += u->micro) {
        int64_t b = a + u->micro < sb->n_kept ? a + u->micro : sb->n_kept;
        Qwen2VlInputs in;
        pack(sb, a, b, u);
        pack_images(r, m, sb, feats, NULL, a, b, u, &in);
        qwen2_train_forward(m, u->tokens, u->targets, u->seq_off, (int)(b - a), &u->act, u->rows, NULL);
        unpack_images(u, &in);
        rows_to_resp(sb, a, b, u->seq_off, u->rows, out, 0);
    }
}

// The rewards of one sample of prompt x (text: its final answer) into *det; returns the conversation's
// messages of a multi-turn sample (NULL for single turn), which the caller frees.
static char *score_sample(const Run *r, const PromptSample *x, const RolloutSample *out, const char *text,
                          RewardDetail *det) {
    char *msgs = r->has_tools ? rollout_sample_messages(out, x->prompt, x->messages) : NULL;
    RewardRow row = {x->prompt, x->answer, msgs, x->extra_info, -1};
    if (r->s->by_data_source) row.rule = reward_rule_of_data_source(x->data_source);
    reward_score_row(&r->rewards, &row, text, det);
    return msgs;
}

// reward.by_data_source: every row's data_source must name a rule (checked before the run starts).
static void check_data_sources(const PromptData *d, const char *const *paths) {
    for (int64_t i = 0; i < d->n; i++) {
        const PromptSample *x = &d->s[i];
        if (reward_rule_of_data_source(x->data_source) >= 0) continue;
        char *shown = x->data_source ? xprintf("data_source \"%s\"", x->data_source) : xstrdup("no data_source");
        die("%s%s%lld: %s has no rule reward (reward.by_data_source knows openai/gsm8k, lighteval/MATH, "
            "DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500)", paths[x->file],
            x->parquet ? ": row " : ":", (long long)x->line, shown);
    }
}

// Greedy pass@1 on the validation prompts (each rank scores its contiguous share).
static double validate(Run *r) {
    const Qwen2 *m = trainer_weights(&r->tr);
    int64_t v0 = r->val.n * r->comm.rank / r->comm.size, n = r->val.n * (r->comm.rank + 1) / r->comm.size - v0;
    double correct = 0;
    int64_t *idx = xmalloc((size_t)(n + 1) * sizeof *idx);
    for (int64_t i = 0; i < n; i++) idx[i] = v0 + i;
    RolloutSample *out = xcalloc((size_t)(n + 1), sizeof *out);
    float **feats = prompt_features(r, &r->val, idx, (int)n, r->s->val_files, NULL);
    if (n > 0) generate(r, m, &r->val, idx, idx, (int)n, 1, 0.0f, feats, out);
    features_free(feats, n);
    for (int64_t i = 0; i < n; i++) {
        char *text = rollout_sample_final_text(&out[i]);
        RewardDetail det;
        char *msgs = score_sample(r, &r->val.s[v0 + i], &out[i], text, &det);
        correct += det.correct == 1;
        free(text);
        free(msgs);
        rollout_sample_free(&out[i]);
    }
    free(out);
    free(idx);
    comm_allreduce_f64(&r->comm, &correct, 1, COMM_SUM, "validation counts");
    return correct / (double)r->val.n;
}

static void step_batch_free(StepBatch *sb, int64_t n_prompts) {
    features_free(sb->feats, n_prompts);
    features_free(sb->hidden, n_prompts);
    features_free(sb->dfeats, n_prompts);
    features_free(sb->ref_feats, n_prompts);
    free(sb->units);
    for (int64_t i = 0; i < sb->n_samples; i++) rollout_sample_free(&sb->samples[i]);
    free(sb->samples), free(sb->prompt_ids), free(sb->prompt_len), free(sb->prompt);
    free(sb->reward), free(sb->adv), free(sb->correct);
    free(sb->kept), free(sb->kept_adv), free(sb->resp_off), free(sb->mb_start), free(sb->old_logp), free(sb->ref_logp);
    free(sb->logp), free(sb->dlogp), free(sb->ent), free(sb->dent), free(sb->mask);
}

// Rewards of every sample (+ the soft overlong penalty), and the counts metrics need.
static void score_rewards(Run *r, const int64_t *idx, StepBatch *sb, StepStats *st) {
    const GrpoSettings *s = r->s;
    int64_t n = sb->n_samples;
    sb->prompt_ids = xmalloc((size_t)n * sizeof *sb->prompt_ids), sb->prompt_len = xmalloc((size_t)n * 8);
    sb->prompt = xmalloc((size_t)n * sizeof *sb->prompt);
    sb->reward = xmalloc((size_t)n * 4), sb->adv = xmalloc((size_t)n * 4), sb->correct = xmalloc((size_t)n * sizeof(int));
    for (int64_t i = 0; i < n; i++) {
        int64_t p = idx[i / s->G];
        const RolloutSample *x = &sb->samples[i];
        sb->prompt[i] = &r->train.s[p];
        sb->prompt_ids[i] = r->train.s[p].ids;
        sb->prompt_len[i] = r->train.s[p].len;
        char *text = rollout_sample_final_text(x);  // after tool turns: the model's last turn
        RewardDetail det;
        char *msgs = score_sample(r, &r->train.s[p], x, text, &det);
        double rw = det.total;
        free(text);
        free(msgs);
        int64_t lim = s->max_response_length - s->overlong_buffer;
        if (s->overlong_buffer > 0 && x->n > lim) rw -= (double)(x->n - lim) / (double)s->overlong_buffer * s->overlong_penalty;
        sb->reward[i] = (float)rw;
        sb->correct[i] = det.correct;
        st->n_acc += det.correct >= 0, st->n_correct += det.correct == 1;
        st->n_trunc += x->finish == FINISH_LENGTH;
        st->reward_failures += det.program_failures;
        int64_t own = x->n;  // the model's tokens (tool turns' not counted)
        for (int t = 0; x->mask && t < x->n; t++) own -= !x->mask[t];
        st->model_tokens += own;
        st->resp_max = own > st->resp_max ? own : st->resp_max;
        st->tokens_total += sb->prompt_len[i] + x->n;
        st->turns += x->turns;
    }
}

// Which samples enter the loss: dynamic sampling drops whole flat groups from the batch; masking
// keeps a truncated response's slot in its mini-batch (as verl's zero response mask) but not its loss.
static void select_kept(const GrpoSettings *s, StepBatch *sb) {
    int64_t n = sb->n_samples, n_slots = 0;
    sb->kept = xmalloc((size_t)n * 8), sb->kept_adv = xmalloc((size_t)n * 4), sb->resp_off = xmalloc((size_t)(n + 1) * 8);
    sb->mb_start = xmalloc((size_t)(n / s->mini_batch_size + 2) * 8);
    sb->resp_off[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        if (s->dynamic_sampling && grpo_group_is_flat(sb->reward + (i / s->G) * s->G, s->G)) continue;
        for (int64_t slot = n_slots++; sb->n_mini <= slot / s->mini_batch_size;) sb->mb_start[sb->n_mini++] = sb->n_kept;
        if (s->mask_truncated && sb->samples[i].finish == FINISH_LENGTH) continue;
        sb->kept[sb->n_kept] = i;
        sb->resp_off[sb->n_kept + 1] = sb->resp_off[sb->n_kept] + sb->samples[i].n;
        sb->n_kept++;
    }
    sb->mb_start[sb->n_mini] = sb->n_kept;
    sb->n_resp = sb->resp_off[sb->n_kept];
    size_t bytes = (size_t)sb->n_resp * 4 + 4;
    sb->old_logp = xmalloc(bytes), sb->ref_logp = xmalloc(bytes), sb->logp = xmalloc(bytes), sb->dlogp = xmalloc(bytes);
    sb->ent = xmalloc(bytes), sb->dent = xmalloc(bytes);
    if (!sb->samples[0].mask) return;
    sb->mask = xmalloc((size_t)sb->n_resp + 1);
    for (int64_t k = 0; k < sb->n_kept; k++)
        memcpy(sb->mask + sb->resp_off[k], sb->samples[sb->kept[k]].mask, (size_t)sb->samples[sb->kept[k]].n);
}

// Tokens of kept samples [a, b) that enter the loss (the model's own), and how many of those samples have one.
static void count_loss_tokens(const StepBatch *sb, int64_t a, int64_t b, double *n_tok, double *n_seq) {
    *n_tok = *n_seq = 0;
    for (int64_t k = a; k < b; k++) {
        int64_t own = 0;
        for (int64_t t = sb->resp_off[k]; t < sb->resp_off[k + 1]; t++) own += !sb->mask || sb->mask[t];
        *n_tok += (double)own;
        *n_seq += own > 0;
    }
}

// verl's rollout_probs_diff: how far the rollout's token probabilities are from the trainer's old ones (the
// same weights: only the two forwards' numerics, or a disagreement between them), over the loss tokens.
static void probs_diff(const StepBatch *sb, StepStats *st) {
    for (int64_t k = 0; k < sb->n_kept; k++) {
        const RolloutSample *x = &sb->samples[sb->kept[k]];
        for (int64_t t = sb->resp_off[k]; t < sb->resp_off[k + 1]; t++) {
            if (sb->mask && !sb->mask[t]) continue;
            double d = fabs(exp((double)x->logprobs[t - sb->resp_off[k]]) - exp((double)sb->old_logp[t]));
            st->probs_diff_max = d > st->probs_diff_max ? d : st->probs_diff_max;
            st->probs_diff_sum += d;
            st->probs_diff_n += 1.0;
        }
    }
}

// verl's use_kl_in_reward: token rewards = score - beta * KL(old, ref), summed per sequence.
// Returns the sum over responses of each one's mean KL (the metric divides by the responses).
static double kl_into_reward(const GrpoSettings *s, StepBatch *sb) {
    double sum = 0.0;
    for (int64_t k = 0; k < sb->n_kept; k++) {
        double kl = 0.0, len = 0.0;
        for (int64_t t = sb->resp_off[k]; t < sb->resp_off[k + 1]; t++) {
            if (sb->mask && !sb->mask[t]) continue;  // a tool's token: not the policy's
            kl += kl_estimate(s->loss.kl, sb->old_logp[t], sb->ref_logp[t], NULL);
            len += 1.0;
        }
        sb->reward[sb->kept[k]] -= (float)(s->loss.kl_coef * kl);
        sum += len > 0 ? kl / len : 0.0;
    }
    return sum;
}

// One mini-batch's gradient, micro-batch by micro-batch, into the trainer's gradient slab. Its loss
// is normalised by the whole mini-batch over all ranks (n_tok tokens, n_seq responses), so that the
// ranks' gradients add up to the single-process one (with dynamic sampling the ranks drop flat groups
// on their own, so mini-batches after the first may hold other samples than in one process).
static void accumulate_minibatch(Run *r, const Qwen2 *cm, StepBatch *sb, int64_t m0, int64_t m1, double n_tok,
                                 double n_seq, int on_policy, UpdateWs *u, GrpoLossStats *total) {
    const GrpoSettings *s = r->s;
    GrpoLossConfig lc = s->loss;
    if (s->use_kl_in_reward) lc.kl_coef = 0.0;
    int bonus = lc.entropy_coeff != 0.0;
    for (int64_t a = m0; a < m1 && n_tok > 0; a += u->micro) {
        int64_t b = a + u->micro < m1 ? a + u->micro : m1, t0 = sb->resp_off[a], t1 = sb->resp_off[b];
        Qwen2VlInputs in;
        pack(sb, a, b, u);
        pack_images(r, cm, sb, sb->feats, sb->dfeats, a, b, u, &in);
        qwen2_train_forward(cm, u->tokens, u->targets, u->seq_off, (int)(b - a), &u->act, u->rows, u->ent_rows);
        rows_to_resp(sb, a, b, u->seq_off, u->rows, sb->logp, 0);
        rows_to_resp(sb, a, b, u->seq_off, u->ent_rows, sb->ent, 0);
        // On-policy (one epoch, one mini-batch): old = current, so the ratio is exactly 1.
        if (on_policy) memcpy(sb->old_logp + t0, sb->logp + t0, (size_t)(t1 - t0) * 4);
        GrpoLossStats st;
        grpo_loss(&lc, sb->logp, sb->old_logp, r->has_ref ? sb->ref_logp : NULL, sb->ent, sb->mask, sb->kept_adv + a,
                  sb->resp_off + a, (int)(b - a), n_tok, n_seq, sb->dlogp, bonus ? sb->dent : NULL, &st);
        grpo_loss_stats_add(total, &st);
        // The trainer averages the ranks' gradients: each contributes its share times the rank count.
        float scale = (float)(r->tr.scaler.scale * r->comm.size);
        for (int64_t t = t0; t < t1; t++) sb->dlogp[t] *= scale;
        for (int64_t t = t0; bonus && t < t1; t++) sb->dent[t] *= scale;
        memset(u->drows, 0, (size_t)u->seq_off[b - a] * 4);
        rows_to_resp(sb, a, b, u->seq_off, u->drows, sb->dlogp, 1);
        if (bonus) {
            memset(u->dent_rows, 0, (size_t)u->seq_off[b - a] * 4);
            rows_to_resp(sb, a, b, u->seq_off, u->dent_rows, sb->dent, 1);
        }
        qwen2_backward(cm, r->tr.grads, u->drows, bonus ? u->dent_rows : NULL, &u->act);
        unpack_images(u, &in);
    }
}

// A trained merger's gradient (into the trainer's slab) from the features' gradients of the mini-batch just
// accumulated (sb->dfeats, zeroed again); prompts outside it have none.
static void merger_backward(Run *r, StepBatch *sb) {
    const Qwen2Layout *w = &r->tr.master.w;
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
        vision_merge_backward(&r->vl.vision.cfg, &r->merger, sb->hidden[i], sb->units[i], sb->dfeats[i], &dw);
        memset(sb->dfeats[i], 0, n * sizeof(float));
    }
}

// ppo_epochs passes over the mini-batches; clip + AdamW after each (a trained merger's features refreshed
// before each, as its weights move).
static void update(Run *r, StepBatch *sb, int need_old, UpdateWs *u, StepStats *st) {
    const GrpoSettings *s = r->s;
    int64_t it = r->tr.st.iteration;
    grpo_loss_stats_init(&st->loss);
    // The schedule advances once per GRPO step, as verl steps its scheduler once per update_actor.
    st->lr = lr_at(s->schedule, s->adam.lr, s->warmup, r->steps, it);
    for (int64_t e = 0; e < s->ppo_epochs; e++)
        for (int64_t mb = 0; mb < sb->n_mini; mb++) {
            int64_t m0 = sb->mb_start[mb], m1 = sb->mb_start[mb + 1];
            double tot[2];  // 0 tokens: a zero-gradient step
            count_loss_tokens(sb, m0, m1, &tot[0], &tot[1]);
            comm_allreduce_f64(&r->comm, tot, 2, COMM_SUM, "mini-batch token counts");
            const Qwen2 *cm = trainer_begin_step(&r->tr);
            if (r->train_merger)  // the merger's weights moved with the last update
                merged(r, &r->merger, sb->hidden, sb->units, (int)s->train_batch_size, sb->feats);
            accumulate_minibatch(r, cm, sb, m0, m1, tot[0], tot[1], !need_old, u, &st->loss);
            if (r->train_merger) merger_backward(r, sb);
            double norm = trainer_apply(&r->tr, st->lr, 1);
            if (!isfinite(norm)) fprintf(stderr, "grpo: warning: step %lld: non-finite gradients; update skipped\n", (long long)it + 1);
            else st->norm_sum += norm, st->n_updates++;
            if (r->tr.st.skips_in_row >= s->max_skips)
                die("%lld consecutive updates skipped for non-finite gradients (step %lld)", (long long)r->tr.st.skips_in_row,
                    (long long)it + 1);
        }
}

// Sums over the ranks of what the metrics need (each rank's loss statistics are already its share).
enum { M_REWARD, M_LEN, M_TRUNC, M_ACC, M_CORRECT, M_TOKENS, M_KEPT, M_RESP, M_PG, M_CLIP, M_ENT, M_KL,
       M_KL_REWARD, M_REWARD_FAIL, M_TURNS, M_TOOL_CALLS, M_TOOL_ERRORS, M_N };

static void write_metrics(Run *r, const StepBatch *sb, const StepStats *st) {
    const GrpoSettings *s = r->s;
    double sum[M_N] = {0}, mx[3] = {(double)st->resp_max, st->loss.ratio_max, -st->loss.ratio_min};
    for (int64_t i = 0; i < sb->n_samples; i++) sum[M_REWARD] += sb->reward[i];
    sum[M_LEN] = (double)st->model_tokens;  // with tools, the model's tokens only
    sum[M_TURNS] = (double)st->turns, sum[M_TOOL_CALLS] = (double)st->tool_calls;
    sum[M_TOOL_ERRORS] = (double)st->tool_errors;
    sum[M_TRUNC] = (double)st->n_trunc, sum[M_ACC] = (double)st->n_acc, sum[M_CORRECT] = (double)st->n_correct;
    sum[M_TOKENS] = (double)st->tokens_total, sum[M_KEPT] = (double)sb->n_kept, sum[M_RESP] = (double)sb->n_resp;
    sum[M_PG] = st->loss.pg_loss, sum[M_CLIP] = st->loss.clip_frac, sum[M_ENT] = st->loss.entropy, sum[M_KL] = st->loss.kl;
    sum[M_KL_REWARD] = st->kl_reward, sum[M_REWARD_FAIL] = (double)st->reward_failures;
    comm_allreduce_f64(&r->comm, sum, M_N, COMM_SUM, "metrics");
    comm_allreduce_f64(&r->comm, mx, 3, COMM_MAX, "metrics");
    double diff[3] = {st->probs_diff_max, st->probs_diff_sum, st->probs_diff_n};
    comm_allreduce_f64(&r->comm, diff, 1, COMM_MAX, "metrics");
    comm_allreduce_f64(&r->comm, diff + 1, 2, COMM_SUM, "metrics");
    double n = (double)(sb->n_samples * r->comm.size), rmean = sum[M_REWARD] / n, rlen = sum[M_LEN] / n, rvar = 0;
    for (int64_t i = 0; i < sb->n_samples; i++) rvar += (sb->reward[i] - rmean) * (sb->reward[i] - rmean);
    comm_allreduce_f64(&r->comm, &rvar, 1, COMM_SUM, "metrics");  // two passes: exact 0 for equal rewards
    if (r->comm.rank != 0) return;

    double rstd = sqrt(rvar / n);
    double upd = (double)(s->ppo_epochs * (sb->n_mini ? sb->n_mini : 1));
    double kl = s->use_kl_in_reward ? (sum[M_KEPT] ? sum[M_KL_REWARD] / sum[M_KEPT] : 0.0) : sum[M_KL] / upd;
    double acc = sum[M_ACC] ? sum[M_CORRECT] / sum[M_ACC] : NAN;
    double t_ref = st->t_ref ? st->t_ref - st->t_rew : 0.0, t_old = st->t_old ? st->t_old - (st->t_ref ? st->t_ref : st->t_rew) : 0.0;
    double t_upd = st->t_end - (st->t_old ? st->t_old : st->t_ref ? st->t_ref : st->t_rew), dt = st->t_end - st->t0;
    double tok_s = sum[M_TOKENS] / r->comm.size / dt;  // per process (device)
    FILE *f = r->metrics;
    fprintf(f, "{\"step\": %lld, \"reward_mean\": %.6g, \"reward_std\": %.6g, \"accuracy\": ", (long long)r->tr.st.iteration,
            rmean, rstd);
    json_write_number(f, acc);
    fprintf(f, ", \"kl\": ");
    json_write_number(f, r->has_ref ? kl : NAN);
    fprintf(f, ", \"entropy\": ");
    json_write_number(f, sum[M_RESP] ? sum[M_ENT] / upd : NAN);
    fprintf(f, ", \"pg_loss\": %.6g, \"clip_frac\": %.6g, \"ratio_min\": ", sum[M_PG] / upd, sum[M_CLIP] / upd);
    json_write_number(f, -mx[2]);
    fprintf(f, ", \"ratio_max\": ");
    json_write_number(f, mx[1]);
    fprintf(f, ", \"response_length_mean\": %.6g, \"response_length_max\": %.0f, \"truncated_frac\": %.6g, \"kept\": %.0f, "
            "\"grad_norm\": ", rlen, mx[0], sum[M_TRUNC] / n, sum[M_KEPT]);
    json_write_number(f, st->n_updates ? st->norm_sum / (double)st->n_updates : NAN);
    fprintf(f, ", \"lr\": %.6g, \"time_offload_s\": %.4f, \"time_rollout_s\": %.4f, \"time_reward_s\": %.4f, "
            "\"time_reference_s\": %.4f, \"time_old_logprob_s\": %.4f, \"time_update_s\": %.4f, \"time_step_s\": %.4f, "
            "\"tokens_per_s\": %.1f, \"rss_rollout_gib\": %.3f, \"peak_rss_gib\": %.3f, \"reward_failures\": %.0f",
            st->lr, st->t_offload - st->t0, st->t_roll - st->t_offload, st->t_rew - st->t_roll, t_ref, t_old, t_upd, dt,
            tok_s, st->rss_rollout, rss_gib("VmHWM:"), sum[M_REWARD_FAIL]);
    if (st->t_old)  // old log-probs were computed: how far the rollout's were from them
        fprintf(f, ", \"rollout_probs_diff_max\": %.6g, \"rollout_probs_diff_mean\": %.6g", diff[0],
                diff[1] / (diff[2] > 0 ? diff[2] : 1.0));
    if (r->has_tools)
        fprintf(f, ", \"turns_mean\": %.6g, \"tool_calls\": %.0f, \"tool_errors\": %.0f, \"time_tools_s\": %.4f",
                sum[M_TURNS] / n, sum[M_TOOL_CALLS], sum[M_TOOL_ERRORS], st->t_tools);
    fputs("}\n", f);
    file_flush(f, r->metrics_path);
    if (sum[M_REWARD_FAIL] > 0)  // they scored 0: say so, not only in the metrics
        fprintf(stderr, "grpo: warning: step %lld: %.0f reward program call%s failed and scored 0 (last: %s)\n",
                (long long)r->tr.st.iteration, sum[M_REWARD_FAIL], sum[M_REWARD_FAIL] == 1 ? "" : "s",
                reward_last_error(&r->rewards));
    fprintf(stderr, "grpo train: step %lld/%lld | reward %.3f | acc %.3f | kl %.4g | clip %.3f | len %.1f | %.0f tok/s | %.1f s\n",
            (long long)r->tr.st.iteration, (long long)r->steps, rmean, acc, kl, sum[M_CLIP] / upd, rlen, tok_s, dt);
}

static void dump_samples(Run *r, const StepBatch *sb, const int64_t *idx) {
    FILE *f = r->dump;
    for (int64_t i = 0; i < sb->n_samples; i++) {
        int64_t p = idx[i / r->s->G];
        char *text = rollout_sample_text(&sb->samples[i]);
        fprintf(f, "{\"step\": %lld, \"prompt_index\": %lld, \"sample\": %lld, \"prompt\": ", (long long)r->tr.st.iteration,
                (long long)p, (long long)(i % r->s->G));
        json_write_string(f, r->train.s[p].prompt, strlen(r->train.s[p].prompt));
        fprintf(f, ", \"prompt_ids\": [");
        for (int64_t j = 0; j < sb->prompt_len[i]; j++) fprintf(f, j ? ", %d" : "%d", sb->prompt_ids[i][j]);
        fprintf(f, "], \"response_ids\": [");
        for (int j = 0; j < sb->samples[i].n; j++) fprintf(f, j ? ", %d" : "%d", sb->samples[i].tokens[j]);
        fprintf(f, "], \"logprobs\": [");  // the rollout's, under softmax(logits / temperature)
        for (int j = 0; j < sb->samples[i].n; j++)
            fprintf(f, j ? ", %.9g" : "%.9g", (double)sb->samples[i].logprobs[j]);
        fprintf(f, "], \"response\": ");
        Buf clean = {0};  // valid UTF-8, as the reward program saw it
        utf8_append_lossy(&clean, text, strlen(text));
        json_write_string(f, clean.data ? clean.data : "", clean.len);
        buf_free(&clean);
        fprintf(f, ", \"reward\": %.9g, \"advantage\": %.9g, \"correct\": %d", (double)sb->reward[i],
                (double)sb->adv[i], sb->correct[i]);
        if (sb->samples[i].mask) {  // tools: the model's tokens (1) and the tool turns' (0), the turns taken
            fprintf(f, ", \"mask\": [");
            for (int j = 0; j < sb->samples[i].n; j++) fprintf(f, j ? ", %d" : "%d", sb->samples[i].mask[j]);
            fprintf(f, "], \"turns\": %d", sb->samples[i].turns);
        }
        fputs("}\n", f);
        free(text);
    }
    file_flush(f, r->dump_path);
}

// One GRPO step, as the design's diagram: rollout, rewards, advantages, reference and old
// log-probs, update, metrics. The rollout and the update take turns in r->workspace.
static void grpo_step(Run *r, Stream *stream) {
    const GrpoSettings *s = r->s;
    int64_t P = s->train_batch_size, it = r->tr.st.iteration;
    StepStats st = {.t0 = time_now()};
    StepBatch sb = {.n_samples = P * s->G};
    int64_t *idx = xmalloc((size_t)P * sizeof *idx), *pos = xmalloc((size_t)P * sizeof *pos);
    for (int64_t i = 0; i < P; i++) {
        // This rank's share of every mini-batch: local prompt i is the step's prompt pos[i].
        int64_t mini = s->mini_batch_size / s->G;  // this rank's prompts per mini-batch
        pos[i] = i / mini * mini * r->comm.size + r->comm.rank * mini + i % mini;
        idx[i] = stream_at(stream, it * r->P_global + pos[i]);
    }

    // 0. the Adam moments leave memory until the update needs them (actor.offload_optimizer)
    trainer_offload(&r->tr);
    st.t_offload = time_now();
    // 1. rollout on the policy's own (compute) weights, KV cache in the workspace
    const Qwen2 *policy = trainer_weights(&r->tr);
    sb.samples = xcalloc((size_t)sb.n_samples, sizeof *sb.samples);
    ToolSet before = r->tools;
    sb.feats = prompt_features(r, &r->train, idx, (int)P, s->train_files, &sb);  // once per prompt a step
    generate(r, policy, &r->train, idx, pos, (int)P, s->G, s->sampler.temperature, sb.feats, sb.samples);
    st.tool_calls = r->tools.calls - before.calls, st.tool_errors = r->tools.errors - before.errors;
    st.t_tools = r->tools.seconds - before.seconds;
    st.rss_rollout = rss_gib("VmRSS:");
    st.t_roll = time_now();
    // 2. rewards, and which samples enter the loss
    score_rewards(r, idx, &sb, &st);
    select_kept(s, &sb);
    st.t_rew = time_now();
    // Dynamic sampling can leave ranks with different numbers of mini-batches: all take the largest.
    double n_mini = (double)sb.n_mini;
    comm_allreduce_f64(&r->comm, &n_mini, 1, COMM_MAX, "mini-batch count");
    for (; sb.n_mini < (int64_t)n_mini; sb.n_mini++) sb.mb_start[sb.n_mini + 1] = sb.n_kept;

    // 3. reference log-probs (frozen initial policy); old log-probs before any update when needed.
    // From here on the workspace holds training activations.
    UpdateWs u;
    update_ws_init(&u, s, &r->tr.master.cfg, &r->workspace);
    int need_old = s->ppo_epochs > 1 || sb.n_mini > 1 || s->use_kl_in_reward;
    float **ref_feats = sb.ref_feats ? sb.ref_feats : sb.feats;
    if (r->has_ref && sb.n_kept) {
        score_kept(r, &r->ref, &sb, ref_feats, &u, sb.ref_logp);
        st.t_ref = time_now();
    }
    if (need_old && sb.n_kept) score_kept(r, policy, &sb, sb.feats, &u, sb.old_logp), st.t_old = time_now();
    if (need_old) probs_diff(&sb, &st);
    if (s->use_kl_in_reward) st.kl_reward = kl_into_reward(s, &sb);
    // 4. group advantages
    grpo_advantages(sb.reward, P, s->G, s->norm_adv_by_std, 1e-6f, sb.adv);
    for (int64_t k = 0; k < sb.n_kept; k++) sb.kept_adv[k] = sb.adv[sb.kept[k]];
    // 5. update: epochs x mini-batches x micro-batches, clip + AdamW per mini-batch
    update(r, &sb, need_old, &u, &st);
    qwen2_train_free(&u.act);
    st.t_end = time_now();
    r->tr.st.iteration++;

    // 6. metrics
    write_metrics(r, &sb, &st);
    if (r->dump) dump_samples(r, &sb, idx);
    step_batch_free(&sb, P);
    free(idx);
    free(pos);
}

// actor.lora.* and model.adapter: the adapter's own adapter_config.json decides r, alpha and the targets;
// the keys, when set, must agree with it.
static void resolve_lora(GrpoSettings *s, const GrpoConfig *c) {
    const GrpoActorConfig *a = &c->actor;
    TrainerLora *lo = &s->lora;
    *lo = (TrainerLora){.spec = {a->lora.rank, a->lora.alpha, 0}, .base_dtype = a->lora.base_dtype,
                        .adapter = c->model.adapter, .seed = c->trainer.seed};
    for (int i = 0; i < a->lora.target_modules.n; i++)
        lora_targets_add(&lo->spec.targets, a->lora.target_modules.items[i]);  // checked by grpo_config_load
    if (!lo->spec.targets) lora_targets_add(&lo->spec.targets, "all-linear");
    if (lo->adapter)
        lora_spec_from_adapter(&lo->spec, lo->adapter, "actor.lora.rank", a->lora.target_modules.n > 0,
                               "actor.lora.target_modules");
}

void grpo_settings_resolve(GrpoSettings *s, const GrpoConfig *c) {
    const GrpoActorConfig *a = &c->actor;
    *s = (GrpoSettings){
        .config = c, .model_dir = c->model.path,
        .train_files = (const char *const *)c->data.train_file.items, .n_train_files = c->data.train_file.n,
        .val_files = (const char *const *)c->data.val_file.items, .n_val_files = c->data.val_file.n,
        .filter_overlong = c->data.filter_overlong_prompts, .by_data_source = c->reward.by_data_source,
        .out_dir = c->trainer.out_dir, .prompt_key = c->data.prompt_key, .answer_key = c->data.answer_key,
        .image_key = c->data.image_key, .min_pixels = c->data.min_pixels, .max_pixels = c->data.max_pixels,
        .chat_template = c->data.chat_template, .enable_thinking = c->data.enable_thinking,
        .train_batch_size = c->data.train_batch_size, .G = (int)c->rollout.n,
        .max_prompt_length = c->data.max_prompt_length, .max_response_length = c->data.max_response_length,
        .sampler = {(float)c->rollout.temperature, (int)c->rollout.top_k, (float)c->rollout.top_p},
        .norm_adv_by_std = c->algorithm.norm_adv_by_std, .dynamic_sampling = c->algorithm.dynamic_sampling,
        .use_kl_in_reward = c->algorithm.use_kl_in_reward, .mask_truncated = c->algorithm.mask_truncated,
        .overlong_buffer = c->reward.overlong_buffer.len, .overlong_penalty = c->reward.overlong_buffer.penalty_factor,
        .ppo_epochs = a->ppo_epochs,
        // verl counts mini-batches in prompts (each brings its G responses) and micro-batches in responses.
        .mini_batch_size = (a->mini_batch_size ? a->mini_batch_size : c->data.train_batch_size) * c->rollout.n,
        .adam = {a->lr, a->beta1, a->beta2, a->adam_eps, a->weight_decay}, .grad_clip = a->grad_clip,
        .schedule = a->lr_schedule, .warmup = a->lr_warmup_steps, .steps = c->trainer.steps, .epochs = c->data.epochs,
        .precision = a->precision, .ref_dtype = c->model.ref_dtype, .save_dtype = c->trainer.save_dtype,
        .loss_scale = a->loss_scale, .loss_scale_window = a->loss_scale_window, .max_skips = c->trainer.max_skips,
        .recompute = a->recompute, .offload_optimizer = a->offload_optimizer, .shuffle = c->data.shuffle,
        .seed = c->trainer.seed, .train_merger = a->vision.train_merger,
        .save_every = c->trainer.save_every, .keep = c->trainer.keep, .val_every = c->trainer.val_every,
        .val_before_train = c->trainer.val_before_train, .dump_samples = c->trainer.dump_samples,
        .resume = c->trainer.resume, .overwrite = c->trainer.overwrite,
        .stop = (const char *const *)c->rollout.stop.items, .n_stop = c->rollout.stop.n,
        .tools_file = c->rollout.multi_turn.tools_file, .max_turns = (int)c->rollout.multi_turn.max_turns,
        .max_parallel_calls = (int)c->rollout.multi_turn.max_parallel_calls,
        .tool_timeout_s = c->rollout.multi_turn.tool_timeout_s, .tool_memory_mb = c->rollout.multi_turn.tool_memory_mb,
        .dist_timeout_s = c->dist.timeout_s, .zero = (int)c->dist.zero, .pin_cpu = c->dist.pin_cpu,
        .topk_ratio = c->compression.type == GRPO_COMPRESSION_TOPK ? c->compression.ratio : 0.0,
    };
    s->micro_batch_size = a->micro_batch_size ? a->micro_batch_size : s->mini_batch_size;
    resolve_lora(s, c);
    // KL in the loss (verl use_kl_loss) or folded into the reward (use_kl_in_reward), never both.
    s->loss = (GrpoLossConfig){a->clip_ratio_low, a->clip_ratio_high, a->clip_ratio_c,
                               a->use_kl_loss ? a->kl_loss_coef : c->algorithm.use_kl_in_reward ? c->algorithm.kl_coef : 0.0,
                               (KlEstimator)(a->use_kl_loss ? a->kl_loss_type : c->algorithm.kl_penalty),
                               (LossAgg)a->loss_agg_mode, (double)c->data.max_response_length, a->entropy_coeff};
    const GrpoRewardConfig *rc = &c->reward;
    RewardSpec *sp = s->rewards;
    // reward.by_data_source: both rules, each row scored by its own (a zero weight stands for 1)
    int by_source = rc->by_data_source;
    if (rc->gsm8k.weight != 0 || by_source) {
        reward_spec_defaults(sp, REWARD_GSM8K);
        sp->weight = rc->gsm8k.weight != 0 ? rc->gsm8k.weight : 1.0;
        sp->score = rc->gsm8k.score, sp->format_score = rc->gsm8k.format_score;
        sp->flexible = rc->gsm8k.method == GRPO_GSM8K_FLEXIBLE, sp->clip_chars = rc->gsm8k.clip_chars;
        sp->strip_think = rc->strip_think;
        sp++;
    }
    if (rc->boxed.weight != 0 || by_source) {
        reward_spec_defaults(sp, REWARD_BOXED);
        sp->weight = rc->boxed.weight != 0 ? rc->boxed.weight : 1.0;
        sp->score = rc->boxed.score, sp->format_score = rc->boxed.format_score;
        sp->strip_think = rc->strip_think;
        sp++;
    }
    if (rc->format.weight != 0) {
        reward_spec_defaults(sp, REWARD_FORMAT);
        sp->weight = rc->format.weight, sp->pattern = rc->format.regex, sp->dotall = rc->format.dotall;
        sp++;
    }
    if (rc->exact.weight != 0) {
        reward_spec_defaults(sp, REWARD_EXACT);
        sp->weight = rc->exact.weight;
        sp->strip_think = rc->strip_think;
        sp++;
    }
    if (rc->program.weight != 0) {
        reward_spec_defaults(sp, REWARD_PROGRAM);
        sp->weight = rc->program.weight, sp->command = rc->program.command;
        sp->timeout_s = rc->program.timeout_s, sp->grace_s = rc->program.grace_s;
        sp->memory_mb = rc->program.memory_mb;
        sp++;
    }
    s->n_rewards = (int)(sp - s->rewards);
}

#define GIB 1073741824.0

// OUT/config.yaml: the resolved configuration as YAML, so the run can be repeated with --config and
// `grpo report` can show it.
static void save_config(const GrpoSettings *s) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) die("out of memory");
    grpo_config_print_yaml(s->config, f);
    if (fclose(f) != 0) die("out of memory");
    char *path = path_join(s->out_dir, "config.yaml");
    AtomicFile af;
    atomic_file_open(&af, path);
    atomic_file_write(&af, text, len);
    atomic_file_commit(&af);
    free(path);
    free(text);
}

char *grpo_plan_text(const GrpoMemPlan *p) {
    char *vision = p->vision ? xprintf(" + vision tower %.2f + images %.2f", (double)p->vision / GIB,
                                       (double)p->images / GIB)
                             : xstrdup("");
    char *text = xprintf("policy %.2f + compute copy %.2f + gradients %.2f + Adam moments %.2f%s + reference %.2f%s + "
                         "workspace %.2f = max(rollout %.2f, update %.2f) -> peak %.2f (not shared: %.2f)",
                         (double)p->policy / GIB, (double)p->compute / GIB, (double)p->grads / GIB,
                         (double)p->moments / GIB, p->offloaded ? " (offloaded during rollout)" : "",
                         (double)p->reference / GIB, vision, (double)p->workspace / GIB, (double)p->rollout / GIB,
                         (double)p->update / GIB, (double)p->peak / GIB, (double)p->sum / GIB);
    free(vision);
    return text;
}

static void print_plan(const GrpoMemPlan *p, const Comm *comm) {
    if (comm->size > 1) fprintf(stderr, "grpo train: memory plan per process of %d:\n", comm->size);
    char *text = grpo_plan_text(p);
    fprintf(stderr, "grpo train: memory plan (GiB): %s\n", text);
    free(text);
}

// This rank's share of the settings: its prompts per step and responses per mini-batch.
static GrpoSettings rank_share(const GrpoSettings *s, const Comm *comm) {
    GrpoSettings l = *s;
    int64_t N = comm->size, mini_prompts = s->mini_batch_size / s->G;
    if (s->train_batch_size % N || mini_prompts % N)
        die("under mpirun -np %lld, data.train_batch_size (%lld) and the mini-batch (%lld prompts) must be multiples of "
            "the rank count: a prompt's group never spans ranks", (long long)N, (long long)s->train_batch_size,
            (long long)mini_prompts);
    if (N > 1 && s->train_batch_size % mini_prompts)
        die("under mpirun, data.train_batch_size (%lld) must be a multiple of actor.mini_batch_size (%lld)",
            (long long)s->train_batch_size, (long long)mini_prompts);
    if (N > 1 && s->dump_samples) die("trainer.dump_samples needs a single process (each rank holds only its samples)");
    l.train_batch_size /= N;
    l.mini_batch_size /= N;
    if (l.micro_batch_size > l.mini_batch_size) l.micro_batch_size = l.mini_batch_size;
    return l;
}

// A validation line of metrics.jsonl; step 0 is the accuracy before training.
static void write_val_metrics(Run *r, int64_t step, double acc) {
    fprintf(r->metrics, "{\"step\": %lld, \"val_accuracy\": %.6g}\n", (long long)step, acc);
    file_flush(r->metrics, r->metrics_path);
}

// The run's model (trainer), tokenizer, data, stop tokens, rewards and reference: all but its files.
static void run_load(Run *r) {
    const GrpoSettings *s = r->s;
    Qwen2Config lm;
    qwen2_config_load_vl(&lm, s->model_dir);
    if ((r->has_vl = lm.vl)) {  // the vision tower is frozen: loaded once, fp32, never trained
        vl_model_load(&r->vl, s->model_dir, &lm);
        vl_set_pixels(&r->vl.proc, s->min_pixels, s->max_pixels, "data.min_pixels / data.max_pixels");
        r->merger = r->vl.vision.merger;
    } else if (s->train_merger) {
        die("%s: actor.vision.train_merger needs a vision-language model", s->model_dir);
    }
    r->train_merger = s->train_merger;  // then the merger is trained with the language model, in its slab
    trainer_init(&r->tr, s->model_dir, s->adam, s->grad_clip, s->precision, s->loss_scale, s->loss_scale_window,
                 &s->lora, r->train_merger ? &r->vl.vision.cfg : NULL);
    trainer_set_dist(&r->tr, &r->comm, s->zero, s->topk_ratio);
    const Qwen2Config *c = &r->tr.master.cfg;
    if (r->train_merger) {
        const float *p = r->tr.master.params;
        const Qwen2Layout *w = &r->tr.master.w;
        r->merger = (VisionMerger){p + w->merger_ln_q, c->merger_ln_bias ? p + w->merger_ln_q_b : NULL,
                                   p + w->merger_w0, p + w->merger_b0, p + w->merger_w2, p + w->merger_b2};
    }
    char *tj = path_join(s->model_dir, "tokenizer.json");
    if (!file_exists(tj)) die("%s: grpo train needs a tokenizer.json in the model directory", s->model_dir);
    tokenizer_load(&r->tok, tj);
    r->tok.no_thinking = !s->enable_thinking;
    free(tj);
    if ((r->has_tools = s->tools_file != NULL)) {
        if (!s->chat_template || !r->tok.tool_calls)
            die("rollout.multi_turn.tools_file needs data.chat_template: true and a chat template with tool calls "
                "(%s has %s)", s->model_dir, r->tok.has_chat_template ? "one without them" : "none");
        toolset_load(&r->tools, s->tools_file, "rollout.multi_turn.tools_file", s->max_parallel_calls,
                     s->tool_timeout_s, s->tool_memory_mb);
        r->hook = (ToolHook){.tools = &r->tools, .tok = &r->tok};
    }
    const char *tools = r->has_tools ? r->tools.schemas_text : NULL;
    PromptDataOptions po = {.prompt_key = s->prompt_key, .answer_key = s->answer_key, .tok = &r->tok,
                            .chat_template = s->chat_template, .tools = tools,
                            .max_prompt_length = s->max_prompt_length, .filter_overlong = s->filter_overlong,
                            .image_key = s->image_key};
    if (r->has_vl) {
        po.vl = &r->vl.proc;
        po.image_pad = (int32_t)c->image_pad_id;
    }
    prompt_data_load(&r->train, s->train_files, s->n_train_files, "data.train_file", &po);
    if ((r->has_val = s->n_val_files > 0))
        prompt_data_load(&r->val, s->val_files, s->n_val_files, "data.val_file", &po);
    int lead = r->comm.rank == 0;
    if (lead && r->train.n_filtered + r->val.n_filtered > 0)
        fprintf(stderr, "grpo train: data.filter_overlong_prompts skipped %lld training and %lld validation prompts "
                "over %lld tokens\n", (long long)r->train.n_filtered, (long long)r->val.n_filtered,
                (long long)s->max_prompt_length);
    if (s->by_data_source) {
        check_data_sources(&r->train, s->train_files);
        check_data_sources(&r->val, s->val_files);
    }
    if (s->max_prompt_length + s->max_response_length > c->max_pos)
        die("max_prompt_length + max_response_length = %lld exceeds the model's max_position_embeddings %lld",
            (long long)(s->max_prompt_length + s->max_response_length), (long long)c->max_pos);
    r->steps = s->steps ? s->steps : s->epochs * ((r->train.n + r->P_global - 1) / r->P_global);
    r->n_stop = qwen2_stop_ids(s->model_dir, r->stop_ids, 15);
    int dup = r->tok.eos_id < 0;
    for (int i = 0; i < r->n_stop; i++) dup |= r->stop_ids[i] == r->tok.eos_id;
    if (!dup) r->stop_ids[r->n_stop++] = r->tok.eos_id;
    reward_set_init(&r->rewards, s->rewards, s->n_rewards);
    // The reference is the initial policy, frozen (optionally rounded to bf16); never computed when beta = 0.
    // With LoRA it is the base with the adapters switched off: the policy's own weights, no copy.
    if ((r->has_ref = s->loss.kl_coef > 0) && r->tr.has_lora) {
        r->ref = trainer_base(&r->tr);
    } else if (r->has_ref) {
        Qwen2Config rc = *c;  // the language model: a trained merger's initial weights are vl's
        vl_config_merger(&rc, NULL);
        qwen2_build(&r->ref, &rc, compute_storage(s->ref_dtype));
        compute_copy_round(&r->ref, &r->tr.master, s->ref_dtype);
    }
    r->tr.st.seed = s->seed;
    r->tr.st.batch_size = r->P_global;
    r->tr.st.data_lines = r->train.n;
    r->tr.st.shuffle = s->shuffle;
}

// Resumes from ckpt (NULL: a new run), then rank 0 writes config.yaml and opens metrics.jsonl and
// samples.jsonl (appending when resumed).
static void run_open(Run *r, const char *ckpt) {
    const GrpoSettings *s = r->s;
    int lead = r->comm.rank == 0;
    r->metrics_path = path_join(s->out_dir, "metrics.jsonl");
    r->dump_path = path_join(s->out_dir, "samples.jsonl");
    const char *mp = r->metrics_path, *dp = r->dump_path;
    if (ckpt) {
        TrainState now = r->tr.st;
        trainer_load(&r->tr, ckpt);
        static const char *const keys[4] = {"trainer.seed", "data.train_batch_size", "data.train_file",
                                            "data.shuffle"};
        checkpoint_check_run(ckpt, &r->tr.st, &now, keys);
        if (lead) metrics_truncate(mp, r->tr.st.iteration);
        if (lead) fprintf(stderr, "grpo train: resuming from %s (step %lld)\n", ckpt, (long long)r->tr.st.iteration);
    }
    if (!lead) return;
    save_config(s);
    const char *mode = ckpt ? "a" : "w";
    if (!(r->metrics = fopen(mp, mode))) die("cannot open %s for writing: %s", mp, strerror(errno));
    if (s->dump_samples && !(r->dump = fopen(dp, mode))) die("cannot open %s for writing: %s", dp, strerror(errno));
}

static void print_start(const Run *r) {
    const GrpoSettings *s = r->s;
    const char *ref = "not needed (no KL)";
    if (r->has_ref) ref = r->tr.has_lora ? "the base with the adapters off (no copy)" : dtype_name(s->ref_dtype);
    char params[16];
    fmt_count(params, sizeof params, (double)r->tr.n);
    fprintf(stderr, "grpo train: %lld prompts x %d samples per step (%d process%s), %lld step%s, "
            "%s %sparameters, reference %s\n", (long long)r->P_global, s->G, r->comm.size,
            r->comm.size > 1 ? "es" : "", (long long)r->steps, r->steps == 1 ? "" : "s", params,
            r->tr.has_lora ? "trained LoRA " : "", ref);
}

// Greedy pass@1 on the validation prompts, printed and written as step `step` (0: before training).
static void run_validate(Run *r, int64_t step) {
    double acc = validate(r);
    if (r->comm.rank != 0) return;
    if (step == 0) fprintf(stderr, "grpo train: validation accuracy before training: %.3f\n", acc);
    else fprintf(stderr, "grpo train: step %lld validation accuracy %.3f\n", (long long)step, acc);
    write_val_metrics(r, step, acc);
}

// After SIGINT/SIGTERM: a checkpoint of the step just finished, the files closed, exit 128 + sig.
static GRPO_NORETURN void run_stop(Run *r, int sig) {
    const GrpoSettings *s = r->s;
    trainer_save_on_signal(&r->tr, sig, r->tr.st.iteration, "grpo train", "trainer.resume=true", s->out_dir,
                           s->save_dtype, s->model_dir, s->keep);
    if (r->comm.rank == 0) file_close(r->metrics, r->metrics_path);
    if (r->dump) file_close(r->dump, r->dump_path);
    reward_set_free(&r->rewards);  // ends the reward program
    if (r->has_tools) toolset_free(&r->tools);
    comm_finalize(&r->comm);
    exit(128 + sig);
}

// The end: rank 0 writes the final model and closes the files; everything is freed.
static void run_finish(Run *r) {
    const GrpoSettings *s = r->s;
    comm_finalize(&r->comm);  // the other ranks are done; rank 0's writes need no MPI (nor its timeout)
    if (r->comm.rank == 0) {
        copy_model_extras(s->model_dir, s->out_dir);
        trainer_save_result(&r->tr, s->out_dir, s->save_dtype, s->model_dir);
        checkpoint_prune(s->out_dir, s->keep);
        fprintf(stderr, "grpo train: wrote %s (peak RSS %.2f GiB; planned %.2f GiB)\n", s->out_dir,
                rss_gib("VmHWM:"), (double)r->plan.peak / GIB);
        file_close(r->metrics, r->metrics_path);
    }
    if (r->dump) file_close(r->dump, r->dump_path);
    free(r->metrics_path);
    free(r->dump_path);
    if (r->has_ref && !r->tr.has_lora) qwen2_free(&r->ref);
    arena_free(&r->workspace);
    reward_set_free(&r->rewards);
    if (r->has_tools) toolset_free(&r->tools);
    prompt_data_free(&r->train);
    if (r->has_val) prompt_data_free(&r->val);
    tokenizer_free(&r->tok);
    if (r->has_vl) vl_model_free(&r->vl);
    trainer_free(&r->tr);
}

void grpo_run(const GrpoSettings *global) {
    if (!global->model_dir || global->n_train_files == 0)
        die("model.path and data.train_file are required (or run grpo train with no arguments for the demo)");
    Run r = {.P_global = global->train_batch_size};
    comm_init(&r.comm, global->dist_timeout_s);
    comm_pin_cpu(&r.comm, global->pin_cpu == GRPO_PIN_BLOCK ? "block" : "none");
    stop_signals_install();  // SIGINT/SIGTERM: checkpoint after the current step, then exit
    GrpoSettings local = rank_share(global, &r.comm);
    const GrpoSettings *s = r.s = &local;
    int lead = r.comm.rank == 0;  // prints and writes files
    static const RunDirOpts dir_opts = {"trainer.out_dir", "trainer.resume=true", "trainer.overwrite=true",
                                        "model.path"};
    char *ckpt = run_dir_claim(s->out_dir, s->model_dir, s->resume, s->overwrite, lead, &dir_opts);
    run_load(&r);
    run_open(&r, ckpt);
    free(ckpt);
    // One workspace for the whole run, sized by the memory plan: KV cache in rollout, activations in the update.
    grpo_memory_plan(global, &r.tr.master.cfg, r.comm.size, &r.plan);
    arena_init(&r.workspace, r.plan.workspace);
    if (s->offload_optimizer) trainer_offload_init(&r.tr, s->out_dir);
    if (lead) print_plan(&r.plan, &r.comm);
    if (lead) print_start(&r);
    Stream stream;
    stream_init(&stream, r.train.n, s->seed, s->shuffle);
    if (r.has_val && s->val_before_train && !s->resume) run_validate(&r, 0);
    while (r.tr.st.iteration < r.steps) {
        grpo_step(&r, &stream);
        int64_t it = r.tr.st.iteration;
        if (r.has_val && s->val_every > 0 && it % s->val_every == 0) run_validate(&r, it);
        if (s->save_every > 0 && it % s->save_every == 0)
            trainer_save(&r.tr, s->out_dir, s->save_dtype, s->model_dir, s->keep);
        int sig = it < r.steps ? trainer_stop_signal(&r.tr) : 0;
        if (sig) run_stop(&r, sig);
    }
    stream_free(&stream);
    run_finish(&r);
}

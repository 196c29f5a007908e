// The run's memory plan: fixed slabs, and one workspace that is the rollout's KV cache, then the update's
// activations.
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
static void vision_plan(const GrpoSettings *s, const DecoderConfig *c, const VisionConfig *vc, int ranks,
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

void grpo_memory_plan(const GrpoSettings *s, const DecoderConfig *model, const Backend *be, int ranks, GrpoMemPlan *p) {
    DecoderConfig cfg = *model, lm = *model;  // lm: the language model alone (the reference's slab)
    const DecoderConfig *c = &cfg;
    vl_config_merger(&lm, NULL);
    VisionConfig vc;
    if (c->vl) vision_config_of(s, &vc);
    if (c->vl && s->train_merger) vl_config_merger(&cfg, &vc);  // the merger's tensors join the trained slab
    DecoderLayout w;
    size_t n = decoder_layout(c, &w), slab = n * 4, policy = slab, n_ref = decoder_layout(&lm, &w);
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
    size_t chunk = TRAINER_OFFLOAD_CHUNK * 4 < shard ? TRAINER_OFFLOAD_CHUNK * 4 : shard;
    // a device's offloaded moments stay on the host: two staging buffers of a chunk of each on the device
    size_t moments = s->offload_optimizer && be->on_device ? 4 * chunk : 2 * shard;
    // ZeRO-2's shard and top-k's residual beside the gradients
    size_t grads_more = (ranks > 1 && s->zero == 2 ? shard : 0) + (s->topk_ratio > 0 ? slab : 0);
    int host = s->offload_params && be->on_device;  // the master and the optimizer on the host
    int64_t max_prompt = s->max_prompt_length, prefill = max_prompt > ROLLOUT_PREFILL ? max_prompt : ROLLOUT_PREFILL;
    int64_t seqs = s->train_batch_size / ranks * s->G, mini = s->mini_batch_size / ranks;
    int64_t micro = s->micro_batch_size < mini ? s->micro_batch_size : mini;
    *p = (GrpoMemPlan){
        .policy = host ? 0 : policy, .compute = compute, .moments = host ? 0 : moments, .reference = reference,
        .grads = slab + (host ? 0 : grads_more), .host = host ? policy + slab + grads_more + 2 * shard : 0,
        .rollout = rollout_workspace_bytes(be, c, rollout_dt, seqs, max_seq_len(s), prefill),
        .update = grpo_update_ws_bytes(s, c, be, micro, max_seq_len(s)),
        .offloaded = s->offload_optimizer ? 2 * shard : 0,
    };
    if (s->rollout_int8) p->int8 = decoder_q8_bytes(&lm);
    if (s->rm_path) {
        DecoderConfig rc;
        decoder_config_load_rm(&rc, s->rm_path);
        p->reward_model = reward_model_bytes(&rc, s->rm_path, s->rm_dtype, s->rm_max_length, s->rm_length_asked,
                                             s->rm_micro);
    }
    if (s->judge.model_path) {
        DecoderConfig jc;
        decoder_config_load(&jc, s->judge.model_path);
        p->reward_model += reward_judge_bytes(&jc, &s->judge);
    }
    if (c->vl) vision_plan(s, c, &vc, ranks, p);
    if (be->memory_own) {
        int64_t rows = micro * max_seq_len(s) > prefill ? micro * max_seq_len(s) : prefill;
        int64_t width = c->inter > c->heads * c->head_dim ? c->inter : c->heads * c->head_dim;
        if (rows < seqs) rows = seqs;
        if (width < c->hidden) width = c->hidden;
        p->backend = be->memory_own(be, rows, (int)c->heads, width);
    }
    p->workspace = p->rollout > p->update ? p->rollout : p->update;
    if (be->on_device) p->reward_model_host = p->reward_model, p->reward_model = 0;
    p->fixed = p->policy + p->compute + p->grads + p->moments + p->reference + p->int8 + p->vision + p->backend +
               p->reward_model;
    p->peak = p->fixed + p->workspace + p->images;
    p->sum = p->fixed + p->rollout + p->update + p->images;
}

char *grpo_plan_text(const GrpoMemPlan *p) {
    char *vision = p->vision ? xprintf(" + vision tower %.2f + images %.2f", (double)p->vision / GIB,
                                       (double)p->images / GIB)
                             : xstrdup("");
    char *host = p->host ? xprintf(" (on the host: %.2f)", (double)p->host / GIB) : xstrdup("");
    if (p->reward_model_host) {
        char *more = xprintf("%s (reward models on the host: %.2f)", host, (double)p->reward_model_host / GIB);
        free(host);
        host = more;
    }
    char *own = p->backend ? xprintf(" + device buffers %.2f", (double)p->backend / GIB) : xstrdup("");
    char *int8 = p->int8 ? xprintf(" + int8 rollout copy %.2f", (double)p->int8 / GIB) : xstrdup("");
    char *rm = p->reward_model ? xprintf(" + reward models %.2f", (double)p->reward_model / GIB) : xstrdup("");
    const char *moments = p->host ? " (the master and moments on the host)" : "";
    if (p->offloaded && !p->host)  // a device's stay on the host, staged through two buffers on the device
        moments = p->moments < p->offloaded ? " (staging buffers; on the host)" : " (offloaded during rollout)";
    char *text = xprintf("policy %.2f + compute copy %.2f + gradients %.2f + Adam moments %.2f%s + reference %.2f"
                         "%s%s%s%s + workspace %.2f = max(rollout %.2f, update %.2f) -> peak %.2f (not shared: %.2f)%s",
                         (double)p->policy / GIB, (double)p->compute / GIB, (double)p->grads / GIB,
                         (double)p->moments / GIB, moments,
                         (double)p->reference / GIB, int8, rm, vision, own, (double)p->workspace / GIB,
                         (double)p->rollout / GIB, (double)p->update / GIB, (double)p->peak / GIB,
                         (double)p->sum / GIB, host);
    free(vision);
    free(host);
    free(own);
    free(int8);
    free(rm);
    return text;
}

void grpo_print_plan(const GrpoMemPlan *p, const Comm *comm) {
    if (comm->size > 1) fprintf(stderr, "grpo train: memory plan per process of %d:\n", comm->size);
    char *text = grpo_plan_text(p);
    fprintf(stderr, "grpo train: memory plan (GiB): %s\n", text);
    free(text);
}

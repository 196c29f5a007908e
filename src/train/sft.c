#include "train/sft.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/json.h"
#include "base/util.h"
#include "model/decoder.h"
#include "model/vl.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "train/sft_data.h"
#include "train/stream.h"

// The largest packed micro-batch any step can form: the sum of the b longest samples (with repeats).
static int64_t max_micro_tokens(const SftData *d, int64_t b) {
    // b consecutive samples of the stream touch at most (b-1)/n + 2 epochs, so a sample can be in a
    // micro-batch that many times (a batch larger than the data set, or one across an epoch's end).
    int64_t *top = xcalloc((size_t)b, sizeof *top), sum = 0, repeats = (b - 1) / d->n + 2;
    for (int64_t i = 0; i < d->n * repeats; i++) {
        int64_t x = d->s[i % d->n].len;
        for (int64_t j = 0; j < b; j++)
            if (x > top[j]) {
                int64_t t = top[j];
                top[j] = x;
                x = t;
            }
    }
    for (int64_t j = 0; j < b; j++) sum += top[j];
    free(top);
    return sum;
}

static void fmt_duration(char *buf, size_t n, double s) {
    long t = s > 0 && s < 1e9 ? (long)s : 0;
    snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

// Packs micro-batch samples ids[0..b) into tokens/seq_off with the completion tokens as targets
// (each predicted from the row before it) and their loss weight w in dlogp.
static void pack(const SftData *d, const int64_t *ids, int64_t b, float w, int32_t *tokens, int32_t *targets,
                 float *dlogp, int64_t *seq_off) {
    seq_off[0] = 0;
    for (int64_t j = 0; j < b; j++) {
        const SftSample *s = &d->s[ids[j]];
        int64_t off = seq_off[j], len = s->len;
        memcpy(tokens + off, s->ids, (size_t)len * 4);
        for (int64_t i = 0; i < len; i++) {
            int has = i + 1 < len && i + 1 >= s->prompt_len;
            targets[off + i] = has ? s->ids[i + 1] : -1;
            dlogp[off + i] = has ? w : 0.0f;
        }
        seq_off[j + 1] = off + len;
    }
}

// Resuming: the checkpoint says whether the run trains LoRA adapters (its adapter_config.json sets r,
// alpha and the targets), so --lora-rank may be left out; one given must agree with it.
static void resume_lora(TrainerLora *lo, const char *ckpt) {
    char *ac = path_join(ckpt, "adapter_config.json");
    int adapters = file_exists(ac);
    free(ac);
    if (!adapters && (lo->spec.rank || lo->adapter))
        die("--resume: %s is a full fine-tuning checkpoint (no adapter_config.json); leave out --lora-rank and "
            "--adapter", ckpt);
    if (adapters) lora_spec_from_adapter(&lo->spec, ckpt, "option --lora-rank", 0, "");
}

// be: a device's peak memory joins the line.
static void write_metrics(FILE *f, const char *path, const Backend *be, int64_t step, double loss, double norm,
                          double lr, int64_t tokens, double scale, double seconds) {
    fprintf(f, "{\"step\": %lld, \"loss\": ", (long long)step);
    json_write_number(f, loss);
    fprintf(f, ", \"grad_norm\": ");
    json_write_number(f, norm);
    fprintf(f, ", \"lr\": %.9g, \"tokens\": %lld, \"loss_scale\": %.9g, \"skipped\": %s, \"elapsed_s\": %.4f", lr,
            (long long)tokens, scale, isfinite(norm) ? "false" : "true", seconds);
    if (be->memory_peak) fprintf(f, ", \"device_peak_bytes\": %zu", be->memory_peak(be));
    fputs("}\n", f);
    file_flush(f, path);
}

// One SFT run's state.
typedef struct {
    const SftConfig *cfg;
    Comm comm;
    int lead;  // rank 0: prints and writes files
    Trainer tr;
    SftData data;
    int64_t steps, B, b;  // B samples a step, in micro-batches of b
    Arena arena;          // the training workspace and logp, dlogp: the backend's memory
    DecoderTrain act;
    float *logp, *dlogp;
    int32_t *tokens, *targets;        // the host's: the packed micro-batch,
    float *host_logp, *host_dlogp;    // its log-probs and their loss weights
    int64_t *seq_off, *batch;
    Stream stream;
    VlModel vl;  // a vision-language model's frozen vision tower and image processor (has_vl)
    int has_vl;
} Sft;

// What a step measured.
typedef struct {
    double loss, norm, scale, lr;  // norm: pre-clip, NAN when the step was skipped
    int64_t n_target, n_tok;       // the batch's completion tokens, all its tokens
} SftStepOut;

// The workspace for the activations of the largest micro-batch, and the micro-batch buffers.
static void sft_workspace(Sft *r) {
    const DecoderConfig *c = &r->tr.master.cfg;
    const Backend *be = r->tr.be;
    int64_t max_tokens = max_micro_tokens(&r->data, r->b), max_seq = max_micro_tokens(&r->data, 1);
    DType wdt = r->tr.has_lora ? r->tr.master.dtype : compute_storage(r->cfg->precision);
    size_t buffers = (size_t)max_tokens * 2 * sizeof(float);
    size_t bytes = decoder_train_bytes(be, c, wdt, max_tokens, max_seq, r->cfg->recompute) + buffers + 4096;
    backend_arena_init(be, &r->arena, bytes);
    decoder_train_init(&r->act, be, c, wdt, max_tokens, max_seq, r->cfg->recompute, &r->arena);
    r->logp = arena_alloc(&r->arena, (size_t)max_tokens * sizeof *r->logp);
    r->dlogp = arena_alloc(&r->arena, (size_t)max_tokens * sizeof *r->dlogp);
    r->tokens = xmalloc((size_t)max_tokens * sizeof *r->tokens);
    r->targets = xmalloc((size_t)max_tokens * sizeof *r->targets);
    r->host_logp = xmalloc((size_t)max_tokens * sizeof *r->host_logp);
    r->host_dlogp = xmalloc((size_t)max_tokens * sizeof *r->host_dlogp);
    r->seq_off = xmalloc((size_t)(r->b + 1) * sizeof *r->seq_off);
}

static void sft_workspace_free(Sft *r) {
    decoder_train_free(&r->act);
    backend_arena_free(r->tr.be, &r->arena);
    free(r->tokens), free(r->targets), free(r->host_logp), free(r->host_dlogp), free(r->seq_off);
}

// The image inputs of micro-batch samples ids[0..b) (packed in r->tokens) into *in and r->act.vl: each
// sample's features (its images through the frozen tower, computed here) in its prompt. feats: b slots.
static void micro_images(Sft *r, const int64_t *ids, int64_t b, float **feats, DecoderVlInputs *in) {
    r->act.vl = NULL;
    int any = 0;
    for (int64_t j = 0; r->has_vl && j < b; j++) any |= r->data.s[ids[j]].n_images > 0;
    if (!any) return;
    const VlImage **ims = xmalloc((size_t)b * sizeof *ims);
    int *n_images = xmalloc((size_t)b * sizeof *n_images);
    int64_t *plen = xmalloc((size_t)b * sizeof *plen);
    for (int64_t j = 0; j < b; j++) {
        const SftSample *x = &r->data.s[ids[j]];
        char *where = xprintf("%s:%lld", r->data.path, (long long)x->line);
        feats[j] = vl_prompt_features(&r->vl, x->images, x->n_images, where);
        free(where);
        ims[j] = x->images, n_images[j] = x->n_images, plen[j] = x->prompt_len;
    }
    if (vl_batch_inputs(&r->tr.master, r->tokens, r->seq_off, (int)b, plen, ims, n_images,
                        (const float *const *)feats, r->vl.proc.merge, in) != 0)
        die("internal: a sample's image pads do not match its images");
    r->act.vl = in;
    free(ims);
    free(n_images);
    free(plen);
}

static void micro_images_free(Sft *r, int64_t b, float **feats, DecoderVlInputs *in) {
    if (!r->act.vl) return;
    decoder_vl_inputs_free(in);
    for (int64_t j = 0; j < b; j++) free(feats[j]), feats[j] = NULL;
    r->act.vl = NULL;
}

// One optimiser step at learning rate lr: this rank's micro-batches forward and backward (the loss is
// the mean of -log p over the batch's completion tokens), the loss summed over the ranks, the update.
static SftStepOut sft_step(Sft *r, int64_t step, double lr) {
    const Trainer *tr = &r->tr;
    int64_t B = r->B, b = r->b, N = r->comm.size, bad = -1;
    SftStepOut o = {.lr = lr};
    for (int64_t i = 0; i < B; i++) {
        r->batch[i] = stream_at(&r->stream, (step - 1) * B + i);
        o.n_target += r->data.s[r->batch[i]].len - r->data.s[r->batch[i]].prompt_len;
        o.n_tok += r->data.s[r->batch[i]].len;
    }
    // Each completion token weighs 1/n_target in every micro-batch, times the rank count, as the trainer
    // averages the ranks' gradients.
    float w = (float)(-tr->scaler.scale * (double)N / (double)o.n_target);
    const Decoder *cm = trainer_begin_step(&r->tr);
    double loss = 0.0;
    float **feats = xcalloc((size_t)b, sizeof *feats);
    DecoderVlInputs in;
    for (int64_t mb = r->comm.rank * (B / N); mb < (r->comm.rank + 1) * (B / N); mb += b) {
        pack(&r->data, r->batch + mb, b, w, r->tokens, r->targets, r->host_dlogp, r->seq_off);
        int64_t n = r->seq_off[b];
        cm->be->upload(cm->be, r->dlogp, r->host_dlogp, (size_t)n * sizeof *r->dlogp);
        micro_images(r, r->batch + mb, b, feats, &in);
        decoder_train_forward_fused(cm, r->tr.grads, r->tokens, r->targets, r->seq_off, (int)b, r->dlogp, &r->act,
                                  r->logp);
        cm->be->download(cm->be, r->host_logp, r->logp, (size_t)n * sizeof *r->logp);
        for (int64_t j = 0; j < b; j++) {
            double ls = 0.0;
            for (int64_t i = r->seq_off[j]; i < r->seq_off[j + 1]; i++) ls -= r->host_logp[i];
            if (!isfinite(ls) && bad < 0) bad = r->batch[mb + j];
            loss += ls;
        }
        decoder_backward(cm, r->tr.grads, r->dlogp, NULL, &r->act);
        micro_images_free(r, b, feats, &in);
    }
    free(feats);
    double red[2] = {loss, (double)bad};  // a non-finite sample on any rank skips the step on all
    comm_allreduce_f64(&r->comm, &red[0], 1, COMM_SUM, "the loss");
    comm_allreduce_f64(&r->comm, &red[1], 1, COMM_MAX, "the skip-step flag");
    o.loss = red[0] / (double)o.n_target;
    bad = (int64_t)red[1];
    o.scale = tr->scaler.scale;
    o.norm = trainer_apply(&r->tr, lr, bad < 0);
    if (bad >= 0 && r->lead)
        fprintf(stderr, "grpo: warning: step %lld: the loss of sample %s:%lld is not finite; step skipped\n",
                (long long)step, r->data.path, (long long)r->data.s[bad].line);
    else if (!isfinite(o.norm) && r->lead)
        fprintf(stderr, "grpo: warning: step %lld: non-finite gradients (loss scale %g); step skipped\n",
                (long long)step, o.scale);
    return o;
}

// A device that computes in bf16 needs bf16 compute weights, or a bf16 frozen base under LoRA.
// The options a device (or --offload-params) needs, for a run with or without LoRA.
static void check_device(const Backend *be, const TrainerLora *lora, const SftConfig *cfg) {
    int has_lora = lora->spec.rank > 0 || lora->adapter;
    if (has_lora)
        backend_require_bf16(be, "--device", "--lora-base-dtype", lora->base_dtype);
    else
        backend_require_bf16(be, "--device", "--precision", cfg->precision);
    if (cfg->offload_params) trainer_check_params_on_host(be, "--device", "--offload-params", has_lora, 0);
}

void sft_run(const SftConfig *cfg) {
    Sft r = {.cfg = cfg};
    const Backend *be = backend_open(cfg->device ? cfg->device : "cpu", "--device");
    backend_require_training(be, "--device");
    if (!cfg->resume) check_device(be, &cfg->lora, cfg);  // before the output directory is made
    comm_init(&r.comm, cfg->dist_timeout_s);
    comm_pin_cpu(&r.comm, cfg->pin_cpu ? "block" : "none");
    stop_signals_install();  // SIGINT/SIGTERM: checkpoint after the current step, then exit
    int lead = r.lead = r.comm.rank == 0;
    static const RunDirOpts dir_opts = {"--out", "--resume", "--force", "--model"};
    char *ckpt = run_dir_claim(cfg->out_dir, cfg->model_dir, cfg->resume, cfg->force, lead, &dir_opts);
    TrainerLora lora = cfg->lora;
    if (ckpt) resume_lora(&lora, ckpt);
    if (ckpt) check_device(be, &lora, cfg);  // LoRA or not: as the checkpoint says
    Trainer *tr = &r.tr;
    trainer_init(tr, be, cfg->model_dir, cfg->adam, cfg->clip, cfg->precision, cfg->loss_scale,
                 cfg->loss_scale_window, &lora, NULL, cfg->offload_params);
    trainer_set_dist(tr, &r.comm, cfg->zero, cfg->topk_ratio);
    const DecoderConfig *c = &tr->master.cfg;
    int64_t max_length = cfg->max_length ? cfg->max_length : c->max_pos;
    if ((r.has_vl = c->vl)) {  // frozen: fp32, never trained
        vl_model_load(&r.vl, cfg->model_dir, c);
        vl_set_pixels(&r.vl.proc, cfg->min_pixels, cfg->max_pixels, "--min-pixels / --max-pixels");
    }
    const VlProcessor *proc = r.has_vl ? &r.vl.proc : NULL;
    sft_data_load(&r.data, cfg->data_path, "option --data", cfg->model_dir, c, proc, max_length, cfg->filter_overlong);
    int64_t B = r.B = cfg->batch_size, b = r.b = cfg->micro_batch_size, N = r.comm.size;
    // Rank r takes samples [r*B/N, (r+1)*B/N) of each batch, in micro-batches of b.
    if (B % (N * b))
        die("under mpirun -np %lld, --batch-size %lld must be a multiple of ranks x --micro-batch-size (%lld)",
            (long long)N, (long long)B, (long long)(N * b));
    int64_t steps = r.steps = cfg->steps ? cfg->steps : (r.data.n + B - 1) / B;
    tr->st.seed = cfg->seed;
    tr->st.batch_size = B;
    tr->st.data_lines = r.data.n;
    tr->st.shuffle = cfg->shuffle;

    char *metrics_path = path_join(cfg->out_dir, "metrics.jsonl");
    if (ckpt) {
        TrainState now = tr->st;
        trainer_load(tr, ckpt);
        static const char *const keys[4] = {"--seed", "--batch-size", "--data", "shuffling (--no-shuffle)"};
        checkpoint_check_run(ckpt, &tr->st, &now, keys);
        if (lead) metrics_truncate(metrics_path, tr->st.step);
        if (lead) fprintf(stderr, "grpo sft: resuming from %s (step %lld)\n", ckpt, (long long)tr->st.step);
    }
    free(ckpt);
    sft_workspace(&r);
    FILE *metrics = lead ? fopen(metrics_path, cfg->resume ? "a" : "w") : NULL;
    if (lead && !metrics) die("cannot open %s for writing: %s", metrics_path, strerror(errno));
    stream_init(&r.stream, r.data.n, cfg->seed, cfg->shuffle);
    r.batch = xmalloc((size_t)B * sizeof *r.batch);
    char params[16];
    fmt_count(params, sizeof params, (double)tr->n);
    char filtered[64] = "";
    if (r.data.n_filtered)
        snprintf(filtered, sizeof filtered, ", %lld skipped as too long", (long long)r.data.n_filtered);
    if (lead)
        fprintf(stderr, "grpo sft: %lld samples (%lld truncated to %lld tokens%s), %lld step%s of %lld "
                "(micro-batches of %lld), %s %sparameters, workspace %.1f MiB\n", (long long)r.data.n,
                (long long)r.data.n_truncated, (long long)max_length, filtered, (long long)steps, steps == 1 ? "" : "s",
                (long long)B, (long long)b, params, tr->has_lora ? "trained LoRA " : "",
                (double)r.arena.size / 1048576.0);
    double t_start = time_now(), tok_total = 0;
    int64_t first_step = tr->st.step;

    while (tr->st.step < steps) {
        int64_t step = tr->st.step + 1;
        double t0 = time_now();
        SftStepOut o = sft_step(&r, step, lr_at(cfg->schedule, cfg->adam.lr, cfg->warmup, steps, tr->st.step));
        double now = time_now();
        tok_total += (double)o.n_tok;
        char eta[32];
        fmt_duration(eta, sizeof eta, (now - t_start) / (double)(step - first_step) * (double)(steps - step));
        if (lead) write_metrics(metrics, metrics_path, be, step, o.loss, o.norm, o.lr, o.n_target, o.scale, now - t0);
        if (lead)
            fprintf(stderr, "grpo sft: step %lld/%lld | loss %.4f | grad_norm %.4g | lr %.3g | %.0f tok/s | ETA %s\n",
                    (long long)step, (long long)steps, o.loss, o.norm, o.lr, tok_total / (now - t_start), eta);
        if (tr->st.skips_in_row >= cfg->max_skips)
            die("%lld consecutive steps skipped for non-finite loss or gradients (last: step %lld, loss scale %g); "
                "see the warnings above", (long long)tr->st.skips_in_row, (long long)step, o.scale);
        if (cfg->save_every && step % cfg->save_every == 0)
            trainer_save(tr, cfg->out_dir, cfg->save_dtype, cfg->model_dir, cfg->keep);
        int sig = tr->st.step < steps ? trainer_stop_signal(tr) : 0;
        if (sig) {
            trainer_save_on_signal(tr, sig, tr->st.step, "grpo sft", "--resume", cfg->out_dir, cfg->save_dtype,
                                   cfg->model_dir, cfg->keep);
            if (lead) file_close(metrics, metrics_path);
            comm_finalize(&r.comm);
            exit(128 + sig);
        }
    }
    comm_finalize(&r.comm);  // the other ranks are done; rank 0's writes need no MPI (nor its timeout)
    if (lead) {
        copy_model_extras(cfg->model_dir, cfg->out_dir);
        trainer_save_result(tr, cfg->out_dir, cfg->save_dtype, cfg->model_dir);
        checkpoint_prune(cfg->out_dir, cfg->keep);  // also after a resume that had nothing left to save
        if (be->memory_peak)
            fprintf(stderr, "grpo sft: wrote %s (%.1f s; %s peak %.3f GiB)\n", cfg->out_dir, time_now() - t_start,
                    be->name, (double)be->memory_peak(be) / GIB);
        else
            fprintf(stderr, "grpo sft: wrote %s (%.1f s)\n", cfg->out_dir, time_now() - t_start);
        file_close(metrics, metrics_path);
    }
    free(metrics_path);
    free(r.batch);
    stream_free(&r.stream);
    sft_workspace_free(&r);
    trainer_free(tr);
    backend_close(be);
    if (r.has_vl) vl_model_free(&r.vl);
    sft_data_free(&r.data);
}

#include "train/sft.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/json.h"
#include "base/rng.h"
#include "base/util.h"
#include "model/qwen2.h"
#include "train/checkpoint.h"
#include "train/sft_data.h"

// The sample stream: position k is line perm_e[k mod n] of epoch e = k / n, where perm_e is a
// permutation seeded by (seed, e), or the identity without shuffling. Stateless, so a resumed
// run picks up the same order from the step alone.
typedef struct {
    int64_t n, epoch;
    int64_t *perm;
    uint64_t seed;
    int shuffle;
} Stream;

static int64_t stream_at(Stream *s, int64_t k) {
    int64_t e = k / s->n;
    if (s->epoch != e) {
        s->epoch = e;
        for (int64_t i = 0; i < s->n; i++) s->perm[i] = i;
        Rng r;
        rng_init(&r, s->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(e + 1)));
        for (int64_t i = s->n - 1; s->shuffle && i > 0; i--) {
            int64_t j = (int64_t)(rng_next_u64(&r) % (uint64_t)(i + 1)), t = s->perm[i];
            s->perm[i] = s->perm[j];
            s->perm[j] = t;
        }
    }
    return s->perm[k % s->n];
}

// The largest packed micro-batch any step can form: the sum of the b longest samples.
static int64_t max_micro_tokens(const SftData *d, int64_t b) {
    int64_t *top = xcalloc((size_t)b, sizeof *top), sum = 0;
    for (int64_t i = 0; i < d->n; i++) {
        int64_t x = d->len[i];
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

// On resume: drop the records of steps after the checkpoint (they are about to be redone).
static void metrics_truncate(const char *path, int64_t step) {
    if (!file_exists(path)) return;
    char *text = file_read_all(path, NULL), *line = text;
    AtomicFile af;
    atomic_file_open(&af, path);
    while (*line) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) + 1 : strlen(line);
        const char *p = strstr(line, "\"step\": ");
        if (p && p < line + n && strtoll(p + 8, NULL, 10) <= step) atomic_file_write(&af, line, n);
        line += n;
    }
    atomic_file_commit(&af);
    free(text);
}

static void fmt_duration(char *buf, size_t n, double s) {
    long t = s > 0 && s < 1e9 ? (long)s : 0;
    snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

void sft_run(const SftConfig *cfg) {
    SftData data;
    Qwen2 master, compute;
    qwen2_load(&master, cfg->model_dir);
    const Qwen2Config *c = &master.cfg;
    int64_t max_length = cfg->max_length ? cfg->max_length : c->max_pos;
    sft_data_load(&data, cfg->data_path, cfg->model_dir, c, max_length);
    int64_t B = cfg->batch_size, b = cfg->micro_batch_size;
    int64_t steps = cfg->steps ? cfg->steps : (data.n + B - 1) / B;
    size_t n = master.n_params;

    // Fixed slabs: master weights (+ a low-precision compute copy), gradients, two moments.
    int lowp = cfg->precision != DTYPE_F32;
    if (lowp) qwen2_build(&compute, c);
    const Qwen2 *cm = lowp ? &compute : &master;
    float *grads = xcalloc(n, 4), *mom1 = xcalloc(n, 4), *mom2 = xcalloc(n, 4);
    int n_tensors = qwen2_tensors(&master, NULL);
    Qwen2Tensor *ts = xmalloc((size_t)n_tensors * sizeof *ts);
    qwen2_tensors(&master, ts);

    TrainState st = {.loss_scale = cfg->precision == DTYPE_F16 ? cfg->loss_scale : 1.0, .seed = cfg->seed,
                     .batch_size = B, .data_lines = data.n, .shuffle = cfg->shuffle};
    if (cfg->resume && !file_exists(cfg->out_dir)) die("--resume: %s does not exist, so there is no checkpoint to resume from", cfg->out_dir);
    dir_create(cfg->out_dir);
    char *ckpt = checkpoint_latest(cfg->out_dir);
    char *metrics_path = path_join(cfg->out_dir, "metrics.jsonl");
    if (cfg->resume) {
        if (!ckpt) die("--resume: %s holds no checkpoint-* directory", cfg->out_dir);
        TrainState saved;
        checkpoint_load(ckpt, &master, mom1, mom2, &saved);
        if (saved.batch_size != B || saved.data_lines != data.n || saved.seed != cfg->seed || saved.shuffle != cfg->shuffle)
            die("%s: the checkpoint was made with another --batch-size, --seed, --no-shuffle or data file", ckpt);
        if (cfg->precision != DTYPE_F16) saved.loss_scale = 1.0;
        st = saved;
        metrics_truncate(metrics_path, st.step);
        fprintf(stderr, "grpo sft: resuming from %s (step %lld)\n", ckpt, (long long)st.step);
    } else if (ckpt) {
        die("%s already holds checkpoints (%s); pass --resume to continue or choose another --out", cfg->out_dir, ckpt);
    }
    free(ckpt);
    LossScaler scaler = {st.loss_scale, cfg->loss_scale_window, st.good_steps};

    // One workspace for the activations of the largest micro-batch.
    int64_t max_tokens = max_micro_tokens(&data, b), max_seq = max_micro_tokens(&data, 1);
    Arena arena;
    arena_init(&arena, qwen2_train_bytes(c, max_tokens, max_seq, cfg->recompute) + (size_t)max_tokens * 20 + 4096);
    Qwen2Train tr;
    qwen2_train_init(&tr, c, max_tokens, max_seq, cfg->recompute, &arena);
    int32_t *tokens = arena_alloc(&arena, (size_t)max_tokens * 4), *targets = arena_alloc(&arena, (size_t)max_tokens * 4);
    float *logp = arena_alloc(&arena, (size_t)max_tokens * 4), *dlogp = arena_alloc(&arena, (size_t)max_tokens * 4);
    int64_t *seq_off = arena_alloc(&arena, (size_t)(b + 1) * 8);

    FILE *metrics = fopen(metrics_path, cfg->resume ? "a" : "w");
    if (!metrics) die("cannot open %s for writing", metrics_path);
    Stream stream = {.n = data.n, .epoch = -1, .perm = xmalloc((size_t)data.n * 8), .seed = cfg->seed,
                     .shuffle = cfg->shuffle};
    int64_t *batch = xmalloc((size_t)B * 8);
    fprintf(stderr, "grpo sft: %lld samples (%lld truncated to %lld tokens), %lld steps of %lld (micro-batches of %lld), "
            "%.1fM parameters, workspace %.1f MiB\n", (long long)data.n, (long long)data.n_truncated,
            (long long)max_length, (long long)steps, (long long)B, (long long)b, (double)n / 1e6,
            (double)arena.size / 1048576.0);
    double t_start = time_now(), tok_total = 0;
    int64_t first_step = st.step;

    for (; st.step < steps; st.step++) {
        double t0 = time_now(), lr = lr_at(cfg->schedule, cfg->adam.lr, cfg->warmup, steps, st.step);
        int64_t n_target = 0, n_tok = 0, bad = -1;
        for (int64_t i = 0; i < B; i++) {
            batch[i] = stream_at(&stream, st.step * B + i);
            n_target += data.len[batch[i]] - data.prompt_len[batch[i]];
            n_tok += data.len[batch[i]];
        }
        if (lowp) round_to_dtype(compute.params, master.params, n, cfg->precision);
        memset(grads, 0, n * 4);
        double loss = 0.0;
        for (int64_t mb = 0; mb < B; mb += b) {
            // Pack the micro-batch; targets are the completion tokens, each predicted from the row before it.
            seq_off[0] = 0;
            for (int64_t j = 0; j < b; j++) {
                int64_t s = batch[mb + j], off = seq_off[j], len = data.len[s];
                memcpy(tokens + off, data.ids[s], (size_t)len * 4);
                for (int64_t i = 0; i < len; i++) {
                    int has = i + 1 < len && i + 1 >= data.prompt_len[s];
                    targets[off + i] = has ? data.ids[s][i + 1] : -1;
                    dlogp[off + i] = has ? (float)(-scaler.scale / (double)n_target) : 0.0f;
                }
                seq_off[j + 1] = off + len;
            }
            qwen2_train_forward_fused(cm, grads, tokens, targets, seq_off, (int)b, dlogp, &tr, logp);
            for (int64_t j = 0; j < b; j++) {
                double ls = 0.0;
                for (int64_t i = seq_off[j]; i < seq_off[j + 1]; i++) ls -= logp[i];
                if (!isfinite(ls) && bad < 0) bad = batch[mb + j];
                loss += ls;
            }
            qwen2_backward(cm, grads, dlogp, &tr);
        }
        loss /= (double)n_target;
        // fp16 gradients: values past 65504 become inf, as they would in an fp16 buffer.
        if (cfg->precision == DTYPE_F16) round_to_dtype(grads, grads, n, DTYPE_F16);
        int overflow = bad >= 0 || !grad_all_finite(grads, n);
        double norm = NAN;
        if (overflow) {
            if (bad >= 0)
                fprintf(stderr, "grpo: warning: step %lld: the loss of sample %s:%lld is not finite; step skipped\n",
                        (long long)st.step + 1, data.path, (long long)data.line[bad]);
            else
                fprintf(stderr, "grpo: warning: step %lld: non-finite gradients (loss scale %g); step skipped\n",
                        (long long)st.step + 1, scaler.scale);
            st.skips_in_row++;
        } else {
            if (scaler.scale != 1.0) grad_scale(grads, n, (float)(1.0 / scaler.scale));
            norm = grad_norm(grads, n);
            if (cfg->clip > 0 && cfg->clip / (norm + 1e-6) < 1.0) grad_scale(grads, n, (float)(cfg->clip / (norm + 1e-6)));
            AdamW o = cfg->adam;
            o.lr = lr;
            st.adam_t++;
            for (int i = 0; i < n_tensors; i++) {  // HF Trainer's grouping: no decay for biases and norms
                size_t off = (size_t)(ts[i].data - master.params);
                int64_t numel = ts[i].shape[0] * (ts[i].ndim == 2 ? ts[i].shape[1] : 1);
                double wd = strstr(ts[i].name, "bias") || strstr(ts[i].name, "norm") ? 0.0 : o.weight_decay;
                adamw_update(&o, master.params + off, grads + off, mom1 + off, mom2 + off, (size_t)numel, wd, st.adam_t);
            }
            st.skips_in_row = 0;
        }
        double used_scale = scaler.scale;
        if (cfg->precision == DTYPE_F16) loss_scaler_update(&scaler, overflow);
        st.loss_scale = scaler.scale;
        st.good_steps = scaler.good;

        double now = time_now(), dt = now - t0;
        tok_total += (double)n_tok;
        fprintf(metrics, "{\"step\": %lld, \"loss\": ", (long long)st.step + 1);
        json_write_number(metrics, loss);
        fprintf(metrics, ", \"grad_norm\": ");
        json_write_number(metrics, norm);
        fprintf(metrics, ", \"lr\": %.9g, \"tokens\": %lld, \"loss_scale\": %.9g, \"skipped\": %s, \"elapsed_s\": %.4f}\n",
                lr, (long long)n_target, used_scale, overflow ? "true" : "false", dt);
        if (fflush(metrics) != 0) die("cannot write %s", metrics_path);
        char eta[32];
        fmt_duration(eta, sizeof eta, (now - t_start) / (double)(st.step + 1 - first_step) * (double)(steps - st.step - 1));
        fprintf(stderr, "grpo sft: step %lld/%lld | loss %.4f | grad_norm %.4g | lr %.3g | %.0f tok/s | ETA %s\n",
                (long long)st.step + 1, (long long)steps, loss, norm, lr, tok_total / (now - t_start), eta);
        if (st.skips_in_row >= cfg->max_skips)
            die("%lld consecutive steps skipped for non-finite loss or gradients (last: step %lld, loss scale %g); "
                "see the warnings above", (long long)st.skips_in_row, (long long)st.step + 1, used_scale);
        if (cfg->save_every && (st.step + 1) % cfg->save_every == 0) {
            TrainState saved = st;
            saved.step = st.step + 1;
            checkpoint_save(cfg->out_dir, &master, mom1, mom2, cfg->save_dtype, cfg->model_dir, &saved, cfg->keep);
        }
    }
    copy_model_extras(cfg->model_dir, cfg->out_dir);
    qwen2_save(&master, cfg->out_dir, cfg->save_dtype);
    checkpoint_prune(cfg->out_dir, cfg->keep);  // also after a resume that had nothing left to save
    fprintf(stderr, "grpo sft: wrote %s (%.1f s)\n", cfg->out_dir, time_now() - t_start);

    if (fclose(metrics) != 0) die("cannot write %s", metrics_path);
    free(metrics_path);
    free(batch);
    free(stream.perm);
    arena_free(&arena);
    free(ts);
    free(grads);
    free(mom1);
    free(mom2);
    if (lowp) qwen2_free(&compute);
    qwen2_free(&master);
    sft_data_free(&data);
}

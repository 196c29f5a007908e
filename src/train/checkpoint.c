#define _DEFAULT_SOURCE  // realpath
#include "train/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "base/util.h"
#include "io/safetensors.h"
#include "model/lora.h"

void copy_model_extras(const char *from_dir, const char *to_dir) {
    static const char *names[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                  "chat_template.json", "preprocessor_config.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *from = path_join(from_dir, names[i]), *to = path_join(to_dir, names[i]);
        if (file_exists(from)) file_copy(from, to);
        free(from);
        free(to);
    }
}

// Checkpoint steps found in OUT, ascending; returns the count.
static int64_t list_steps(const char *out, int64_t **steps) {
    *steps = NULL;
    DIR *d = opendir(out);
    if (!d) return 0;
    int64_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char *end;
        if (strncmp(e->d_name, "checkpoint-", 11) != 0) continue;
        long long st = strtoll(e->d_name + 11, &end, 10);
        if (*end || end == e->d_name + 11 || st < 0) continue;
        if (n == cap) *steps = xrealloc(*steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof **steps);
        int64_t i = n++;
        for (; i > 0 && (*steps)[i - 1] > st; i--) (*steps)[i] = (*steps)[i - 1];
        (*steps)[i] = st;
    }
    closedir(d);
    return n;
}

static char *step_dir(const char *out, const char *fmt, int64_t step) {
    char name[64];
    snprintf(name, sizeof name, fmt, (long long)step);
    return path_join(out, name);
}

static void write_state(const char *dir, const TrainState *s) {
    cJSON *r = cJSON_CreateObject();
    if (!r) die("out of memory");
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, s->seed);
    cJSON_AddNumberToObject(r, "global_step", (double)s->step);  // Hugging Face's name for it
    cJSON_AddNumberToObject(r, "adam_step", (double)s->adam_t);
    cJSON_AddNumberToObject(r, "grpo_step", (double)s->iteration);
    cJSON_AddNumberToObject(r, "skips_in_row", (double)s->skips_in_row);
    cJSON_AddNumberToObject(r, "loss_scale", s->loss_scale);
    cJSON_AddNumberToObject(r, "good_steps", (double)s->good_steps);
    cJSON_AddNumberToObject(r, "prompts_seen", (double)s->prompts_seen);
    cJSON_AddStringToObject(r, "seed", seed);
    cJSON_AddNumberToObject(r, "batch_size", (double)s->batch_size);
    cJSON_AddNumberToObject(r, "data_lines", (double)s->data_lines);
    cJSON_AddBoolToObject(r, "shuffle", s->shuffle);
    char *path = path_join(dir, "trainer_state.json");
    json_save_file(path, r);
    free(path);
    cJSON_Delete(r);
}

DecoderTensor *checkpoint_tensors(const Decoder *master, const Lora *lora, int *n) {
    *n = lora ? lora_tensors(lora, NULL) : decoder_tensors(master, NULL);
    DecoderTensor *ts = xmalloc((size_t)(*n ? *n : 1) * sizeof *ts);
    if (lora) lora_tensors(lora, ts);
    else decoder_tensors(master, ts);
    return ts;
}

// optimizer.safetensors: "exp_avg.<name>", "exp_avg_sq.<name>" and, when the model file is not
// fp32, "master.<name>" for each trained tensor.
static void write_optimizer(const char *dir, const Decoder *master, const Lora *lora, const float *m, const float *v,
                            int with_master) {
    int n;
    DecoderTensor *ts = checkpoint_tensors(master, lora, &n);
    StWriteTensor *ws = xcalloc((size_t)n * 3 + 1, sizeof *ws);
    char (*names)[100] = xmalloc((size_t)n * 3 * sizeof *names + 1);
    const char *prefix[3] = {"exp_avg", "exp_avg_sq", "master"};
    const float *base[3] = {m, v, master->params};  // master: an F32 model
    int k = 0;
    for (int j = 0; j < (with_master ? 3 : 2); j++)
        for (int i = 0; i < n; i++, k++) {
            snprintf(names[k], sizeof names[k], "%s.%s", prefix[j], ts[i].name);
            ws[k] = (StWriteTensor){.name = names[k], .ndim = ts[i].ndim, .data = base[j] + ts[i].off};
            memcpy(ws[k].shape, ts[i].shape, sizeof ts[i].shape);
        }
    char *path = path_join(dir, "optimizer.safetensors");
    safetensors_write(path, ws, k, DTYPE_F32);
    free(path);
    free(names);
    free(ws);
    free(ts);
}

// Deletes OUT/checkpoint-<step>: renamed out of the checkpoint-* namespace first, so a crash
// mid-delete never leaves a half-deleted directory that looks like a checkpoint.
static void remove_checkpoint(const char *out, int64_t step) {
    char *dir = step_dir(out, "checkpoint-%lld", step), *del = step_dir(out, ".checkpoint-%lld.del", step);
    if (file_exists(del)) dir_remove_flat(del);
    if (rename(dir, del) != 0) die("cannot rename %s to %s: %s", dir, del, strerror(errno));
    dir_fsync(out);
    dir_remove_flat(del);
    free(dir);
    free(del);
}

void checkpoint_prune(const char *out, int64_t keep) {
    DIR *d = opendir(out);  // leftovers of saves or deletes that a crash interrupted
    if (!d) die("cannot open directory %s: %s", out, strerror(errno));
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, ".checkpoint-", 12) != 0 || len < 16) continue;
        if (strcmp(e->d_name + len - 4, ".tmp") != 0 && strcmp(e->d_name + len - 4, ".del") != 0) continue;
        char *p = path_join(out, e->d_name);
        dir_remove_flat(p);
        free(p);
    }
    closedir(d);
    int64_t *steps, n = list_steps(out, &steps);
    for (int64_t i = 0; i + keep < n; i++) remove_checkpoint(out, steps[i]);
    free(steps);
}

void checkpoint_save(const char *out, const Decoder *master, const Lora *lora, const float *m, const float *v,
                     DType save_dtype, const char *model_dir, const TrainState *s, int64_t keep) {
    char *tmp = step_dir(out, ".checkpoint-%lld.tmp", s->step), *final = step_dir(out, "checkpoint-%lld", s->step);
    if (file_exists(tmp)) dir_remove_flat(tmp);  // left by a run killed mid-save
    dir_create(tmp);
    copy_model_extras(model_dir, tmp);
    Decoder copy;  // the files are written from host memory: a device's weights downloaded once for both
    const Decoder *host = lora ? master : decoder_host(master, &copy);
    write_optimizer(tmp, host, lora, m, v, !lora && save_dtype != DTYPE_F32);
    write_state(tmp, s);
    if (lora) lora_save(lora, tmp, model_dir);  // fp32, as trained
    else decoder_save(host, tmp, save_dtype, master->cfg.vl ? model_dir : NULL);
    if (host == &copy) decoder_free(&copy);
    dir_fsync(tmp);
    if (file_exists(final)) remove_checkpoint(out, s->step);  // the same step, saved by an earlier attempt
    if (rename(tmp, final) != 0) die("cannot rename %s to %s: %s", tmp, final, strerror(errno));
    dir_fsync(out);
    checkpoint_prune(out, keep);
    free(tmp);
    free(final);
}

// The files of a finished or running training run in OUT, besides its checkpoints.
static const char *const RUN_FILES[] = {"metrics.jsonl", "samples.jsonl", "config.yaml", "model.safetensors",
                                        "adapter_model.safetensors", "adapter_config.json"};
#define N_RUN_FILES (sizeof RUN_FILES / sizeof RUN_FILES[0])

static int same_dir(const char *a, const char *b) {
    char *ra = realpath(a, NULL), *rb = realpath(b, NULL);
    int same = ra && rb && strcmp(ra, rb) == 0;
    free(ra);
    free(rb);
    return same;
}

char *run_dir_claim(const char *out, const char *model_dir, int resume, int force, int remove,
                    const RunDirOpts *o) {
    if (same_dir(model_dir, out))
        die("%s %s is the %s directory; choose another, so the starting model is kept", o->out, out, o->model);
    if (resume && force) die("%s and %s: continue the run or replace it, not both", o->resume, o->force);
    if (resume && !file_exists(out))
        die("%s: %s does not exist, so there is no checkpoint to resume from", o->resume, out);
    dir_create(out);
    char *ckpt = checkpoint_latest(out);
    if (resume) {
        if (!ckpt) die("%s: %s holds no checkpoint-* directory", o->resume, out);
        stop_signal_checkpoint(ckpt);
        return ckpt;
    }
    const char *found = ckpt;
    for (size_t i = 0; i < N_RUN_FILES && !found; i++) {
        char *p = path_join(out, RUN_FILES[i]);
        if (file_exists(p)) found = RUN_FILES[i];
        free(p);
    }
    if (found && ckpt && !force)
        die("%s %s already holds a run (%s); pass %s to continue it, %s to replace it, or choose another %s",
            o->out, out, found, o->resume, o->force, o->out);
    if (found && !force)
        die("%s %s already holds a finished run (%s); pass %s to replace it, or choose another %s", o->out, out,
            found, o->force, o->out);
    if (found && remove) {
        checkpoint_prune(out, 0);
        for (size_t i = 0; i < N_RUN_FILES; i++) {
            char *p = path_join(out, RUN_FILES[i]);
            if (unlink(p) != 0 && errno != ENOENT) die("cannot remove %s: %s", p, strerror(errno));
            free(p);
        }
        dir_fsync(out);
    }
    free(ckpt);
    return NULL;
}

void checkpoint_check_run(const char *ckpt, const TrainState *saved, const TrainState *now,
                          const char *const keys[4]) {
    const char *tail = "resume with the settings it was made with";
    if (saved->seed != now->seed)
        die("%s was made with %s %" PRIu64 ", this run has %" PRIu64 "; %s", ckpt, keys[0], saved->seed, now->seed,
            tail);
    if (saved->batch_size != now->batch_size)
        die("%s was made with %s %lld, this run has %lld; %s", ckpt, keys[1], (long long)saved->batch_size,
            (long long)now->batch_size, tail);
    if (saved->data_lines != now->data_lines)
        die("%s was made with a %s of %lld samples, this run's has %lld; %s", ckpt, keys[2],
            (long long)saved->data_lines, (long long)now->data_lines, tail);
    if (saved->shuffle != now->shuffle)
        die("%s was made with %s %s, this run has %s; %s", ckpt, keys[3], saved->shuffle ? "on" : "off",
            now->shuffle ? "on" : "off", tail);
}

char *checkpoint_latest(const char *out) {
    int64_t *steps, n = list_steps(out, &steps);
    char *dir = n ? step_dir(out, "checkpoint-%lld", steps[n - 1]) : NULL;
    free(steps);
    return dir;
}

static void read_moments(const SafeTensors *st, const char *prefix, const DecoderTensor *t, float *dst) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", prefix, t->name);
    const StTensor *x = safetensors_find(st, name);
    int64_t numel = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
    if (!x) die("%s: missing tensor \"%s\"", st->path, name);
    if (x->dtype != DTYPE_F32 || x->numel != numel)
        die("%s: tensor \"%s\" must be F32 with %lld elements", st->path, name, (long long)numel);
    memcpy(dst, x->data, (size_t)numel * 4);
}

// The checkpoint's adapters into lora, which must have their rank, alpha and targets.
static void load_adapter(const char *dir, const Decoder *master, Lora *lora) {
    Lora saved;
    lora_load(&saved, &master->cfg, dir);
    if (saved.spec.rank != lora->spec.rank || saved.spec.alpha != lora->spec.alpha ||
        saved.spec.targets != lora->spec.targets)
        die("%s: the checkpoint's adapters have another r, lora_alpha or target_modules than this run's", dir);
    lora->be->upload(lora->be, lora->params, saved.params, lora->n * 4);
    lora_free(&saved);
}

void checkpoint_load(const char *dir, Decoder *master, Lora *lora, float *m, float *v, TrainState *s) {
    Decoder saved;  // full fine-tuning: the checkpoint's weights, read on the host, then uploaded into master
    if (lora) {
        load_adapter(dir, master, lora);
    } else {
        DecoderConfig c;  // the checkpoint's, with this run's merger (a trained one is in the slab)
        decoder_config_load_vl(&c, dir);
        c.merger_in = master->cfg.merger_in;
        c.merger_units = master->cfg.merger_units;
        c.merger_ln_bias = master->cfg.merger_ln_bias;
        decoder_load_config(&saved, dir, DTYPE_F32, &c);
        if (saved.n_params != master->n_params || saved.cfg.vocab != master->cfg.vocab ||
            saved.cfg.hidden != master->cfg.hidden || saved.cfg.layers != master->cfg.layers ||
            saved.cfg.tied != master->cfg.tied)
            die("%s: the checkpoint's model has a different shape from --model", dir);
    }

    char *path = path_join(dir, "optimizer.safetensors");
    SafeTensors st;
    safetensors_open(&st, path);
    int n;
    DecoderTensor *ts = checkpoint_tensors(master, lora, &n);
    char first[128];
    snprintf(first, sizeof first, "master.%s", ts[0].name);
    int with_master = !lora && safetensors_find(&st, first) != NULL;
    for (int i = 0; i < n; i++) {
        size_t off = ts[i].off;
        read_moments(&st, "exp_avg", &ts[i], m + off);
        read_moments(&st, "exp_avg_sq", &ts[i], v + off);
        if (with_master) read_moments(&st, "master", &ts[i], (float *)saved.params + off);  // exact fp32 weights
    }
    free(ts);
    safetensors_close(&st);
    free(path);
    if (!lora) {
        master->be->upload(master->be, master->params, saved.params, master->n_params * sizeof(float));
        decoder_free(&saved);
    }

    path = path_join(dir, "trainer_state.json");
    cJSON *r = json_load_file(path, FILE_MAX_JSON);
    if (!cJSON_IsObject(r)) die("%s: not a JSON object", path);
    s->step = json_get_int(r, "global_step", path);
    s->adam_t = json_get_int(r, "adam_step", path);
    s->iteration = json_get_int_or(r, "grpo_step", 0, path);
    s->skips_in_row = json_get_int(r, "skips_in_row", path);
    s->loss_scale = json_get_number(r, "loss_scale", path);
    s->good_steps = json_get_int(r, "good_steps", path);
    s->batch_size = json_get_int(r, "batch_size", path);
    s->data_lines = json_get_int(r, "data_lines", path);
    // states from before dynamic sampling generated extra batches: one batch a step
    s->prompts_seen = json_get_int_or(r, "prompts_seen", s->iteration * s->batch_size, path);
    s->shuffle = json_get_bool_or(r, "shuffle", -1, path);
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(r, "seed");
    char *end = NULL;
    if (cJSON_IsString(seed)) s->seed = strtoull(seed->valuestring, &end, 10);
    if (!end || *end || s->shuffle < 0 || s->step < 0 || s->adam_t < 0 || s->adam_t > s->step || !(s->loss_scale > 0))
        die("%s: malformed training state (seed, shuffle, step, adam_step or loss_scale)", path);
    cJSON_Delete(r);
    free(path);
}

// On resume: drop the records of steps after the checkpoint (they are about to be redone).
void metrics_truncate(const char *path, int64_t step) {
    if (!file_exists(path)) return;
    char *text = file_read_all(path, FILE_MAX_METRICS, NULL), *line = text;
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

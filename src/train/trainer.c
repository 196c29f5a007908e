#define _DEFAULT_SOURCE  // madvise, mkstemp, posix_fadvise
#include "train/trainer.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/util.h"

void trainer_init(Trainer *t, const char *model_dir, AdamW adam, double clip, DType precision, double loss_scale,
                  int64_t loss_scale_window) {
    memset(t, 0, sizeof *t);
    t->adam = adam;
    t->clip = clip;
    t->precision = precision;
    qwen2_load(&t->master, model_dir);
    if (precision != DTYPE_F32) qwen2_build(&t->compute, &t->master.cfg);
    t->n = t->master.n_params;
    t->grads = xcalloc(t->n, 4);
    t->m = xcalloc(t->n, 4);
    t->v = xcalloc(t->n, 4);
    t->n_tensors = qwen2_tensors(&t->master, NULL);
    t->tensors = xmalloc((size_t)t->n_tensors * sizeof *t->tensors);
    qwen2_tensors(&t->master, t->tensors);
    t->scaler = (LossScaler){precision == DTYPE_F16 ? loss_scale : 1.0, precision == DTYPE_F16 ? loss_scale_window : 0, 0};
    t->st.loss_scale = t->scaler.scale;
}

void trainer_offload_init(Trainer *t, const char *dir) {
    size_t bytes = 2 * t->n * 4;
    char *path = path_join(dir, ".optimizer-offload-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) die("%s: cannot create the optimizer offload file: %s", path, strerror(errno));
    if (unlink(path) != 0) die("%s: cannot unlink: %s", path, strerror(errno));  // nothing left behind, even on a crash
    // Reserve the blocks now: a full disk is an error here, not a SIGBUS in the middle of AdamW.
    int err = posix_fallocate(fd, 0, (off_t)bytes);
    if (err) die("%s: cannot reserve %zu MB for the offloaded optimizer moments: %s", dir, bytes >> 20, strerror(err));
    float *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) die("%s: cannot map the optimizer offload file: %s", dir, strerror(errno));
    memcpy(map, t->m, t->n * 4);
    memcpy(map + t->n, t->v, t->n * 4);
    free(t->m);
    free(t->v);
    t->m = map, t->v = map + t->n;
    t->offload_fd = fd;
    t->offloaded = 1;
    free(path);
}

void trainer_offload(Trainer *t) {
    if (!t->offloaded) return;
    size_t bytes = 2 * t->n * 4;
    if (msync(t->m, bytes, MS_SYNC) != 0) die("writing the offloaded optimizer moments: %s", strerror(errno));
    if (madvise(t->m, bytes, MADV_DONTNEED) != 0) die("releasing the optimizer moments: %s", strerror(errno));
    // Clean pages now; also drop them from the page cache, so the memory is really free for rollout.
    int err = posix_fadvise(t->offload_fd, 0, (off_t)bytes, POSIX_FADV_DONTNEED);
    if (err) die("releasing the optimizer moments' file pages: %s", strerror(err));
}

void trainer_free(Trainer *t) {
    free(t->grads);
    if (t->offloaded) {
        if (munmap(t->m, 2 * t->n * 4) != 0 || close(t->offload_fd) != 0) die("closing the optimizer offload file");
    } else {
        free(t->m);
        free(t->v);
    }
    free(t->tensors);
    if (t->precision != DTYPE_F32) qwen2_free(&t->compute);
    qwen2_free(&t->master);
    memset(t, 0, sizeof *t);
}

const Qwen2 *trainer_begin_step(Trainer *t) {
    memset(t->grads, 0, t->n * 4);
    return trainer_weights(t);
}

const Qwen2 *trainer_weights(Trainer *t) {
    if (t->precision == DTYPE_F32) return &t->master;
    round_to_dtype(t->compute.params, t->master.params, t->n, t->precision);
    return &t->compute;
}

double trainer_apply(Trainer *t, double lr, int loss_finite) {
    // fp16 gradients: values past 65504 become inf, as they would in an fp16 buffer.
    if (t->precision == DTYPE_F16) round_to_dtype(t->grads, t->grads, t->n, DTYPE_F16);
    int overflow = !loss_finite || !grad_all_finite(t->grads, t->n);
    double norm = NAN;
    t->st.step++;
    if (overflow) {
        t->st.skips_in_row++;
    } else {
        if (t->scaler.scale != 1.0) grad_scale(t->grads, t->n, (float)(1.0 / t->scaler.scale));
        norm = grad_norm(t->grads, t->n);
        if (t->clip > 0 && t->clip / (norm + 1e-6) < 1.0) grad_scale(t->grads, t->n, (float)(t->clip / (norm + 1e-6)));
        AdamW o = t->adam;
        o.lr = lr;
        t->st.adam_t++;
        t->st.skips_in_row = 0;
        for (int i = 0; i < t->n_tensors; i++) {  // Hugging Face Trainer's groups: no decay for biases and norms
            const Qwen2Tensor *x = &t->tensors[i];
            size_t off = (size_t)(x->data - t->master.params), numel = (size_t)(x->shape[0] * (x->ndim == 2 ? x->shape[1] : 1));
            double wd = strstr(x->name, "bias") || strstr(x->name, "norm") ? 0.0 : o.weight_decay;
            adamw_update(&o, t->master.params + off, t->grads + off, t->m + off, t->v + off, numel, wd, t->st.adam_t);
        }
    }
    loss_scaler_update(&t->scaler, overflow);
    t->st.loss_scale = t->scaler.scale;
    t->st.good_steps = t->scaler.good;
    return norm;
}

void trainer_save(const Trainer *t, const char *out, DType save_dtype, const char *model_dir, int64_t keep) {
    checkpoint_save(out, &t->master, t->m, t->v, save_dtype, model_dir, &t->st, keep);
}

void trainer_load(Trainer *t, const char *dir) {
    checkpoint_load(dir, &t->master, t->m, t->v, &t->st);
    if (t->precision != DTYPE_F16) t->st.loss_scale = 1.0;
    t->scaler.scale = t->st.loss_scale;
    t->scaler.good = t->st.good_steps;
}

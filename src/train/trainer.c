#define _GNU_SOURCE  // madvise, mkostemp, posix_fadvise
#include "train/trainer.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/util.h"
#include "model/vl.h"

#define F (sizeof(float))

// Elements of the moments this rank keeps: the whole slab, or its ZeRO shard.
static size_t n_moments(const Trainer *t) { return t->hi - t->lo; }

// The backend the trainer's slabs live in and its optimizer ops run on: the master's (the host's when
// params_on_host; the passes' gradients are t->be's).
static const Backend *be_of(const Trainer *t) { return t->master.be; }

// Floats of m (and of v) in each of a device's staging buffers for offloaded moments.
static size_t stage_chunk(const Trainer *t) {
    return n_moments(t) < TRAINER_OFFLOAD_CHUNK ? n_moments(t) : TRAINER_OFFLOAD_CHUNK;
}

// The gradients the optimizer steps with: the passes' slab, or its host copy.
static float *opt_grads(const Trainer *t) { return t->params_on_host ? t->hgrads : t->grads; }

// n floats of the backend's memory, zeroed (at least one, so a rank's empty shard is a valid pointer).
static float *slab(const Trainer *t, size_t n) { return be_of(t)->alloc(be_of(t), (n ? n : 1) * F); }

void trainer_init(Trainer *t, const Backend *be, const char *model_dir, AdamW adam, double clip, DType precision,
                  double loss_scale, int64_t loss_scale_window, const TrainerLora *lora,
                  const VisionConfig *train_merger, int params_on_host) {
    backend_require_training(be, "training on");  // before any work (the commands check first, naming the option)
    memset(t, 0, sizeof *t);
    t->be = be;
    t->params_on_host = params_on_host && be->on_device;
    int lora_on = lora && (lora->spec.rank > 0 || lora->adapter);
    if (t->params_on_host && (lora_on || train_merger))
        die("internal: the master on the host with %s", lora_on ? "LoRA" : "a trained merger");
    t->adam = adam;
    t->clip = clip;
    t->precision = precision;
    t->has_lora = lora_on;
    if (t->has_lora && precision != DTYPE_F32) die("internal: LoRA with a %s compute copy", dtype_name(precision));
    if (t->has_lora && train_merger) die("internal: a trained merger with LoRA");
    // a vision-language model: its language model (the tower is the caller's, frozen), and its merger
    DecoderConfig c;
    decoder_config_load_vl(&c, model_dir);
    vl_config_merger(&c, train_merger);
    decoder_load_config(&t->master, model_dir, t->has_lora ? lora->base_dtype : DTYPE_F32, &c);
    if (!t->params_on_host) decoder_to_backend(&t->master, be);
    if (t->has_lora) {
        if (lora->adapter) lora_load(&t->lora, &t->master.cfg, lora->adapter);
        else lora_init(&t->lora, &t->master.cfg, &lora->spec, lora->seed);
        lora_to_backend(&t->lora, be);
        lora_attach(&t->master, &t->lora);
        t->w = t->lora.params;
        t->n = t->lora.n;
    } else {
        if (precision != DTYPE_F32) decoder_build_on(&t->compute, &t->master.cfg, compute_storage(precision), be);
        t->w = t->master.params;
        t->n = t->master.n_params;
    }
    t->tensors = checkpoint_tensors(&t->master, t->has_lora ? &t->lora : NULL, &t->n_tensors);
    t->grads = be->alloc(be, t->n * F);  // m and v: on first need (moments_ready): offloaded ones never fill a device
    if (t->params_on_host) t->hgrads = slab(t, t->n);
    t->scaler = (LossScaler){precision == DTYPE_F16 ? loss_scale : 1.0, precision == DTYPE_F16 ? loss_scale_window : 0, 0};
    t->st.loss_scale = t->scaler.scale;
    t->hi = t->n;
    t->compute_stale = 1;
}

void trainer_check_params_on_host(const Backend *be, const char *device, const char *option, int lora,
                                  int train_merger) {
    if (!be->on_device)
        die("%s keeps a device's master weights on the host; with %s %s they are there already", option, device,
            be->name);
    if (lora) die("%s is for full fine-tuning: LoRA trains small adapters on a frozen base, with no master", option);
    if (train_merger) die("%s with a trained merger (actor.vision.train_merger) is not supported", option);
}

// Whether a device's ranks use the device's own collectives (NCCL): every rank on a GPU of its own, the library
// loaded on rank 0 (its verdict is every rank's). Otherwise they cross through host copies and MPI, said once.
// Collective.
static int device_collectives(const Backend *be, Comm *comm) {
    if (!be->dist_init) return 0;
    enum { K = BACKEND_DIST_KEY_BYTES };
    unsigned char key[K], *keys = xmalloc((size_t)comm->size * K);
    be->dist_key(be, key);
    comm_wait(comm, comm_allgather_bytes_start(comm, key, keys, K, "the ranks' GPUs"));
    int shared = 0;
    for (int i = 0; i < comm->size; i++)
        for (int j = 0; j < i; j++) shared |= !memcmp(keys + (size_t)i * K, keys + (size_t)j * K, K);
    free(keys);
    char id[BACKEND_DIST_ID_BYTES] = {0}, why[512] = "ranks share a GPU";
    double ok = !shared && comm->rank == 0 ? be->dist_id(be, id, why, sizeof why) : 0;
    comm_bcast(comm, &ok, sizeof ok, 0, "whether NCCL loaded");
    if (!ok && comm->rank == 0)
        fprintf(stderr, "grpo: warning: %s: the ranks' gradients cross through host copies and MPI, not NCCL (%s)\n",
                be->name, why);
    if (!ok) return 0;
    comm_bcast(comm, id, sizeof id, 0, "the NCCL communicator's id");
    be->dist_init(be, id, comm->rank, comm->size, comm->timeout_s);
    return 1;
}

void trainer_set_dist(Trainer *t, Comm *comm, int zero, double topk_ratio) {
    if (t->offloaded) die("internal: trainer_set_dist after trainer_offload_init");
    if (topk_ratio > 0 && zero > 0) die("compression.type topk needs dist.zero 0 (it replaces the all-reduce ZeRO shards)");
    if (be_of(t)->on_device && topk_ratio > 0)
        die("training on %s with top-k compression (compression.type topk): it compresses host gradients; set "
            "compression.type none", be_of(t)->name);
    t->comm = comm->size > 1 ? comm : NULL;
    t->nccl = t->comm && be_of(t)->on_device && device_collectives(be_of(t), comm);
    if (t->comm && be_of(t)->on_device && !t->nccl) t->host = xmalloc((t->n + t->n / (size_t)comm->size + 1) * F);
    t->zero = t->comm ? zero : 0;
    if (topk_ratio > 0) topk_init(&t->topk, t->n, topk_ratio);
    if (!t->zero) return;
    comm_shard(t->n, comm->rank, comm->size, &t->lo, &t->hi);  // the moments: this rank's shard only
    if (zero == 2 && !t->host && !t->nccl) t->gshard = slab(t, n_moments(t));  // a device's: in place
}

// Leaves the gradient's mean over the ranks in this rank's part of the slab ([lo, hi): the whole
// slab unless ZeRO-2, where only the shard is valid afterwards); returns 1 when every rank must skip.
static int average_gradients(Trainer *t, int loss_finite) {
    const Backend *be = be_of(t);
    if (t->params_on_host) t->be->download(t->be, t->hgrads, t->grads, t->n * F);  // the optimizer's copy
    float *og = opt_grads(t);
    if (t->nccl && t->zero == 2) {  // a device's own collectives, in place
        be->dist_reduce_scatter_mean(be, og, t->n, "gradients (ZeRO-2 reduce-scatter)");
    } else if (t->nccl) {
        be->dist_allreduce_mean(be, og, t->n, "gradients");
    } else if (t->zero == 2 && t->host) {  // a device's: through host copies
        be->download(be, t->host, og, t->n * F);
        comm_reduce_scatter_mean(t->comm, t->host, t->host + t->n, t->n, "gradients (ZeRO-2 reduce-scatter)");
        be->upload(be, og + t->lo, t->host + t->n, n_moments(t) * F);
    } else if (t->zero == 2) {
        comm_reduce_scatter_mean(t->comm, og, t->gshard, t->n, "gradients (ZeRO-2 reduce-scatter)");
        be->copy(be, og + t->lo, t->gshard, n_moments(t) * F);
    } else if (t->topk.ratio > 0) {
        // The residual is in units of the loss scale it was made at: follow fp16's scale changes.
        if (t->topk_scale > 0 && t->topk_scale != t->scaler.scale && t->topk.residual)
            be_of(t)->scale(be_of(t), t->topk.residual, t->n, (float)(t->scaler.scale / t->topk_scale));
        t->topk_scale = t->scaler.scale;
        Comm single = {.rank = 0, .size = 1};
        topk_allreduce_mean(t->comm ? t->comm : &single, &t->topk, og, t->n, "gradients (top-k)");
    } else if (t->host) {
        be->download(be, t->host, og, t->n * F);
        comm_allreduce_mean(t->comm, t->host, t->n, "gradients");
        be->upload(be, og, t->host, t->n * F);
    } else if (t->comm) {
        comm_allreduce_mean(t->comm, og, t->n, "gradients");
    }
    float *g = og + t->lo;
    size_t n = n_moments(t);
    // fp16 gradients: values past 65504 become inf, as they would in an fp16 buffer.
    if (t->precision == DTYPE_F16) be_of(t)->round_values(be_of(t), g, g, n, DTYPE_F16);
    double bad = !loss_finite || !be_of(t)->all_finite(be_of(t), g, n);
    // Whole averaged gradients are the same bits on every rank; a shard or a local loss is not.
    if (t->comm) comm_allreduce_f64(t->comm, &bad, 1, COMM_MAX, "the skip-step flag");
    // A skipped step's residual may hold the infinities nobody sent: start error feedback afresh.
    if (bad && t->topk.residual) memset(t->topk.residual, 0, t->n * F);
    return bad != 0;
}

// Global L2 norm of the averaged gradient, the same bits on every rank (the sum's last bits depend on
// the thread count, which ranks need not share): rank 0's, or the sum of the shards' squares under ZeRO.
static double global_norm(Trainer *t) {
    const Backend *be = be_of(t);
    const float *og = opt_grads(t);
    if (!t->comm) return be->grad_norm(be, og, t->n);
    if (!t->zero) {
        double norm = be->grad_norm(be, og, t->n);
        comm_bcast(t->comm, &norm, sizeof norm, 0, "the gradient norm");
        return norm;
    }
    double ss = be->grad_norm(be, og + t->lo, n_moments(t));
    ss *= ss;
    comm_allreduce_f64(t->comm, &ss, 1, COMM_SUM, "the gradient norm");
    return sqrt(ss);
}

// A host run's offloaded moments: a shared mapping of an unlinked file in dir, 2 nm floats (zeros).
static float *offload_file(const char *dir, size_t nm, int *fd_out) {
    size_t bytes = 2 * nm * F;
    char *path = path_join(dir, ".optimizer-offload-XXXXXX");
    int fd = mkostemp(path, O_CLOEXEC);  // not inherited by reward programs
    if (fd < 0) die("%s: cannot create the optimizer offload file: %s", path, strerror(errno));
    if (unlink(path) != 0) die("%s: cannot unlink: %s", path, strerror(errno));  // nothing left behind, even on a crash
    // Reserve the blocks now: a full disk is an error here, not a SIGBUS in the middle of AdamW.
    int err = posix_fallocate(fd, 0, (off_t)bytes);
    if (err) die("%s: cannot reserve %zu MB for the offloaded optimizer moments: %s", dir, bytes >> 20, strerror(err));
    float *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) die("%s: cannot map the optimizer offload file: %s", dir, strerror(errno));
    free(path);
    *fd_out = fd;
    return map;
}

void trainer_offload_init(Trainer *t, const char *dir) {
    const Backend *be = be_of(t);
    size_t nm = n_moments(t);
    // a device's: pinned host memory (its copies overlap AdamW); a host's: the file, whose pages rollout can have
    t->offload_fd = -1;
    float *map = be->on_device ? be->host_alloc(be, 2 * nm * F) : offload_file(dir, nm, &t->offload_fd);
    if (t->m) {  // moments made already (else the zeros are them)
        be->download(be, map, t->m, nm * F);
        be->download(be, map + nm, t->v, nm * F);
        be->free(be, t->m);
        be->free(be, t->v);
    }
    if (be->on_device) {  // AdamW streams them through two staging buffers of a chunk of m and one of v
        t->stage[0] = slab(t, 2 * stage_chunk(t));
        t->stage[1] = slab(t, 2 * stage_chunk(t));
        t->m = t->v = NULL;
    } else {  // host moments live in the mapping itself: AdamW faults them back in
        t->m = map, t->v = map + nm;
    }
    t->offload_map = map;
    t->offloaded = 1;
}

void trainer_offload(Trainer *t) {
    if (!t->offloaded || be_of(t)->on_device) return;  // a device's are host memory already
    size_t bytes = 2 * n_moments(t) * F;
    if (msync(t->offload_map, bytes, MS_SYNC) != 0) die("writing the offloaded optimizer moments: %s", strerror(errno));
    if (madvise(t->offload_map, bytes, MADV_DONTNEED) != 0) die("releasing the optimizer moments: %s", strerror(errno));
    // Clean pages now; also drop them from the page cache, so the memory is really free for rollout.
    int err = posix_fadvise(t->offload_fd, 0, (off_t)bytes, POSIX_FADV_DONTNEED);
    if (err) die("releasing the optimizer moments' file pages: %s", strerror(err));
}

// The moments in the backend's memory, zeroed, when first needed (not when offloaded: the mapping holds them).
static void moments_ready(Trainer *t) {
    if (t->m || t->offloaded) return;
    t->m = slab(t, n_moments(t));
    t->v = slab(t, n_moments(t));
}

// AdamW on the slab's elements [a, b) (inside this rank's shard). A device's offloaded moments stream up from
// host memory and back.
static void adamw_range(Trainer *t, const AdamW *o, size_t a, size_t b, double wd) {
    const Backend *be = be_of(t);
    float *p = t->w + a;
    const float *g = opt_grads(t) + a;
    if (t->m) {
        be->adamw(be, o, p, g, t->m + (a - t->lo), t->v + (a - t->lo), b - a, wd, t->st.adam_t);
        return;
    }
    float *hm = t->offload_map + (a - t->lo), *hv = t->offload_map + n_moments(t) + (a - t->lo);
    be->adamw_host_moments(be, o, p, g, hm, hv, b - a, wd, t->st.adam_t, t->stage, stage_chunk(t));
}

void trainer_free(Trainer *t) {
    const Backend *be = be_of(t);
    t->be->free(t->be, t->grads);
    if (t->hgrads) be->free(be, t->hgrads);
    if (!t->offloaded || be->on_device) {  // a host run's offloaded moments are the mapping
        if (t->m) be->free(be, t->m);
        if (t->v) be->free(be, t->v);
    }
    if (t->offloaded && be->on_device) be->host_free(be, t->offload_map);
    else if (t->offloaded && (munmap(t->offload_map, 2 * n_moments(t) * F) != 0 || close(t->offload_fd) != 0))
        die("closing the optimizer offload file");
    free(t->tensors);
    free(t->host);
    for (int i = 0; i < 2; i++)
        if (t->stage[i]) be->free(be, t->stage[i]);
    if (t->gshard) be->free(be, t->gshard);
    if (t->topk.ratio > 0) topk_free(&t->topk);
    if (t->precision != DTYPE_F32) decoder_free(&t->compute);
    if (t->has_lora) lora_free(&t->lora);
    decoder_free(&t->master);
    memset(t, 0, sizeof *t);
}

DType compute_storage(DType precision) { return precision == DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F32; }

// Elements of a host master rounded at a time for a device's compute copy (128 MiB of bf16).
#define ROUND_CHUNK ((size_t)1 << 26)

// dst[0, n) = src[0, n) rounded to precision, in be's memory (dst of dtype dt: bf16, or fp32 holding fp16 values).
static void round_into(const Backend *be, void *dst, DType dt, const float *src, size_t n, DType precision) {
    if (dt == DTYPE_BF16) be->round_operand(be, DTYPE_BF16, src, dst, (int64_t)n);
    else be->round_values(be, dst, src, n, precision);
}

void compute_copy_round(Decoder *dst, const Decoder *master, DType precision) {
    const Backend *be = master->be;
    size_t n = dst->n_params;  // the master's slab may go on past dst's: a trained merger
    if (dst->be == be) {
        round_into(be, dst->params, dst->dtype, master->params, n, precision);
        return;
    }
    size_t es = dtype_size(dst->dtype), chunk = n < ROUND_CHUNK ? n : ROUND_CHUNK;  // a host master, a device's copy
    void *buf = xmalloc(chunk * es);
    for (size_t i = 0; i < n; i += chunk) {
        size_t len = n - i < chunk ? n - i : chunk;
        round_into(be, buf, dst->dtype, (const float *)master->params + i, len, precision);
        dst->be->upload(dst->be, (char *)dst->params + i * es, buf, len * es);
    }
    free(buf);
}

Decoder trainer_base(const Trainer *t) {
    Decoder base = t->master;
    base.lora = NULL;
    return base;
}

const Decoder *trainer_begin_step(Trainer *t) {
    t->be->zero(t->be, t->grads, t->n * F);
    return trainer_weights(t);
}

const Decoder *trainer_weights(Trainer *t) {
    if (t->precision == DTYPE_F32) return &t->master;
    if (t->compute_stale) compute_copy_round(&t->compute, &t->master, t->precision);
    t->compute_stale = 0;
    return &t->compute;
}

double trainer_apply(Trainer *t, double lr, int loss_finite) {
    int overflow = average_gradients(t, loss_finite);
    double norm = NAN;
    t->st.step++;
    if (overflow) {
        t->st.skips_in_row++;
    } else {
        float *g = opt_grads(t) + t->lo;  // only this rank's shard is needed (and, under ZeRO-2, valid)
        const Backend *be = be_of(t);
        if (t->scaler.scale != 1.0) be->scale(be, g, n_moments(t), (float)(1.0 / t->scaler.scale));
        norm = global_norm(t);
        if (t->clip > 0 && t->clip / (norm + 1e-6) < 1.0) be->scale(be, g, n_moments(t), (float)(t->clip / (norm + 1e-6)));
        moments_ready(t);
        AdamW o = t->adam;
        o.lr = lr;
        t->st.adam_t++;
        t->st.skips_in_row = 0;
        // Hugging Face Trainer's groups: no decay for biases and norms (ln_q: the merger's norm). Neighbours of
        // one group make one range (a device's offloaded moments stream best in long ones).
        size_t ra = 0, rb = 0;  // the range so far, of decay rwd
        double rwd = 0.0;
        for (int i = 0; i < t->n_tensors; i++) {
            const DecoderTensor *x = &t->tensors[i];
            size_t off = x->off, end = off + (size_t)(x->shape[0] * (x->ndim == 2 ? x->shape[1] : 1));
            size_t a = off > t->lo ? off : t->lo, b = end < t->hi ? end : t->hi;  // the part in this rank's shard
            int no_decay = strstr(x->name, "bias") || strstr(x->name, "norm") || strstr(x->name, "ln_q");
            double wd = no_decay ? 0.0 : o.weight_decay;
            if (a >= b) continue;
            if (rb == a && rwd == wd && ra < rb) {
                rb = b;
                continue;
            }
            if (ra < rb) adamw_range(t, &o, ra, rb, rwd);
            ra = a, rb = b, rwd = wd;
        }
        if (ra < rb) adamw_range(t, &o, ra, rb, rwd);
        if (t->zero && t->nccl) {
            be->dist_allgather(be, t->w, t->n, "parameters (ZeRO all-gather)");
        } else if (t->zero && t->host) {  // a device's: its shard to the host, the whole slab back
            be->download(be, t->host + t->lo, t->w + t->lo, n_moments(t) * F);
            comm_allgather(t->comm, t->host + t->lo, t->host, t->n, "parameters (ZeRO all-gather)");
            be->upload(be, t->w, t->host, t->n * F);
        } else if (t->zero) {
            comm_allgather(t->comm, t->w + t->lo, t->w, t->n, "parameters (ZeRO all-gather)");
        }
        t->compute_stale = 1;
    }
    loss_scaler_update(&t->scaler, overflow);
    t->st.loss_scale = t->scaler.scale;
    t->st.good_steps = t->scaler.good;
    return norm;
}

// This rank's moments, m then v (2 n_moments floats), into host memory dst.
static void moments_to_host(const Trainer *t, float *dst) {
    const Backend *be = be_of(t);
    size_t nm = n_moments(t);
    if (!t->m) {  // a device's, offloaded: in the mapping
        memcpy(dst, t->offload_map, 2 * nm * F);
        return;
    }
    be->download(be, dst, t->m, nm * F);
    be->download(be, dst + nm, t->v, nm * F);
}

void trainer_save(Trainer *t, const char *out, DType save_dtype, const char *model_dir, int64_t keep) {
    const Backend *be = be_of(t);
    moments_ready(t);
    const float *m = t->m, *v = t->v;
    float *full = NULL;
    if (t->zero) {  // the moments' shards, sent to rank 0 one rank at a time (only rank 0 holds them all)
        size_t lo, hi, most = t->n / (size_t)t->comm->size + 1;
        float *buf = xmalloc(2 * most * F);
        if (t->comm->rank == 0) full = xmalloc(2 * t->n * F);
        for (int r = 0; r < t->comm->size; r++) {
            comm_shard(t->n, r, t->comm->size, &lo, &hi);
            if (r == t->comm->rank) moments_to_host(t, buf);
            comm_bcast(t->comm, buf, 2 * (hi - lo) * F, r, "optimizer moments (checkpoint)");
            if (full) {
                memcpy(full + lo, buf, (hi - lo) * F);
                memcpy(full + t->n + lo, buf + (hi - lo), (hi - lo) * F);
            }
        }
        free(buf);
        m = full, v = full + t->n;
    } else if (be->on_device && !t->m) {  // offloaded: the mapping is host memory already
        m = t->offload_map, v = t->offload_map + t->n;
    } else if (be->on_device) {  // the file is written from host memory
        full = xmalloc(2 * t->n * F);
        moments_to_host(t, full);
        m = full, v = full + t->n;
    }
    if (!t->comm || t->comm->rank == 0)
        checkpoint_save(out, &t->master, t->has_lora ? &t->lora : NULL, m, v, save_dtype, model_dir, &t->st, keep);
    free(full);
    char *dir = xprintf("%s/checkpoint-%lld", out, (long long)t->st.step);
    stop_signal_checkpoint(dir);
    free(dir);
}

void trainer_load(Trainer *t, const char *dir) {
    const Backend *be = be_of(t);
    moments_ready(t);
    if (t->zero || be->on_device) {  // read the whole moments on the host, keep this rank's shard
        float *full = xmalloc(2 * t->n * F);
        checkpoint_load(dir, &t->master, t->has_lora ? &t->lora : NULL, full, full + t->n, &t->st);
        if (t->m) {
            be->upload(be, t->m, full + t->lo, n_moments(t) * F);
            be->upload(be, t->v, full + t->n + t->lo, n_moments(t) * F);
        } else {  // a device's, offloaded: into the mapping
            memcpy(t->offload_map, full + t->lo, n_moments(t) * F);
            memcpy(t->offload_map + n_moments(t), full + t->n + t->lo, n_moments(t) * F);
        }
        free(full);
    } else {
        checkpoint_load(dir, &t->master, t->has_lora ? &t->lora : NULL, t->m, t->v, &t->st);
    }
    if (t->precision != DTYPE_F16) t->st.loss_scale = 1.0;
    t->scaler.scale = t->st.loss_scale;
    t->scaler.good = t->st.good_steps;
    t->compute_stale = 1;
}

void trainer_save_result(const Trainer *t, const char *dir, DType save_dtype, const char *model_dir) {
    if (t->has_lora) lora_save(&t->lora, dir, model_dir);
    else decoder_save(&t->master, dir, save_dtype, t->master.cfg.vl ? model_dir : NULL);
}

int trainer_stop_signal(Trainer *t) {
    double sig = stop_signal();
    if (t->comm) comm_allreduce_f64(t->comm, &sig, 1, COMM_MAX, "the stop-signal flag");
    return (int)sig;
}

void trainer_save_on_signal(Trainer *t, int sig, int64_t step, const char *cmd, const char *resume,
                            const char *out, DType save_dtype, const char *model_dir, int64_t keep) {
    trainer_save(t, out, save_dtype, model_dir, keep);
    if (!t->comm || t->comm->rank == 0)
        fprintf(stderr, "%s: %s: stopped after step %lld and wrote %s/checkpoint-%lld; run the same command with %s "
                "to continue\n", cmd, sig == SIGINT ? "SIGINT" : "SIGTERM", (long long)step, out,
                (long long)t->st.step, resume);
}

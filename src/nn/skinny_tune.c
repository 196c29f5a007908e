// The skinny kernels' choice by measurement, kept in the tuning file (nn/skinny.h says what and why).
#define _DEFAULT_SOURCE  // flock
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/cpu.h"
#include "base/util.h"
#include "nn/q8.h"
#include "nn/skinny.h"

#define TUNE_C 896                         // Qwen2.5-0.5B's hidden size and
#define TUNE_I 4864                        // intermediate size: its gate (I, C) and down (C, I) projections
#if defined(__SANITIZE_ADDRESS__)         // ASan's timings mean nothing: its passes read one gate and down
#define TUNE_MIN_BYTES ((size_t)16 << 20)  // pair (1 GiB a pass took ASan minutes a measurement)
#define TUNE_MAX_BYTES TUNE_MIN_BYTES
#else
#define TUNE_MIN_BYTES ((size_t)128 << 20) // weights a pass reads: at least this, and 3x the last-level caches,
#define TUNE_MAX_BYTES ((size_t)1 << 30)   // at most this
#endif
#define TUNE_FILE_MAX ((size_t)1 << 20)
#define TUNE_LOCK_WAIT 300.0               // seconds to wait for another process's measurement

// The choice per dtype (fp32, bf16, Q8_0: slot below): resolved once (pthread_once), or set by skinny_choose.
#define SLOTS 3
static SkinnyTuning tuned[SLOTS];
static SkinnyKernel chosen[SLOTS];
static pthread_once_t once[SLOTS] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};
static const DType slot_dtype[SLOTS] = {DTYPE_F32, DTYPE_BF16, DTYPE_Q8};

static int slot(DType dt) { return dt == DTYPE_Q8 ? 2 : dt == DTYPE_BF16; }

// Bytes of a (rows, C) matrix of dt (Q8_0: weights; inputs: in_bytes).
static size_t matrix_bytes(DType dt, size_t rows, size_t C) {
    return dt == DTYPE_Q8 ? rows * (C / Q8_BLOCK) * sizeof(Q8Block) : rows * C * dtype_size(dt);
}
static size_t in_bytes(DType dt, size_t rows, size_t C) {
    return dt == DTYPE_Q8 ? rows * (C / Q8_BLOCK) * sizeof(Q8In) : rows * C * dtype_size(dt);
}

char *skinny_tuning_path(void) {
    const char *f = getenv("GRPO_TUNING_FILE");
    if (f) return *f ? xstrdup(f) : NULL;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) return xprintf("%s/grpo/tuning.json", xdg);
    return home && *home ? xprintf("%s/.cache/grpo/tuning.json", home) : NULL;
}

// The tuning file's key: the CPU, our kernels and the level (this prefix), then the dtype; not the threads
// (processes that differ only there, such as an MPI job's ranks and one process, decode alike).
static char *machine_key(void) {
    return xprintf("%s | %s | level %s | ", *cpu_brand() ? cpu_brand() : "unknown CPU", SKINNY_KERNEL_SET,
                   cpu_isa_name(cpu_level()->level));
}

static void buf_add(Buf *b, const char *s) { buf_append(b, s, strlen(s)); }

cJSON *skinny_tuning_json(const SkinnyTuning *t) {
    if (!t->measured) return NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kernel", skinny_kernel_name(t->kernel));
    cJSON_AddNumberToObject(o, "threads", t->threads);
    cJSON *ms = cJSON_AddObjectToObject(o, "ms");
    for (int b = 0; b < SKINNY_BUCKETS; b++) {
        char rows[16];
        snprintf(rows, sizeof rows, "%d", skinny_bucket_rows(b));
        cJSON *e = cJSON_AddObjectToObject(ms, rows);
        for (int k = 0; k < SKINNY_KERNELS; k++)
            if (t->seconds[b][k] > 0)  // to the nanosecond
                cJSON_AddNumberToObject(e, skinny_kernel_name((SkinnyKernel)k), round(1e9 * t->seconds[b][k]) / 1e6);
    }
    return o;
}

char *skinny_tuning_text(const SkinnyTuning *t) {
    Buf s = {0};
    buf_add(&s, t->measured ? skinny_kernel_name(t->kernel) : "");
    for (int b = 0; t->measured && b < SKINNY_BUCKETS; b++) {
        int rows = skinny_bucket_rows(b), first = 1;
        char *x = xprintf("%s%d row%s:", b ? "; " : " (the others' time at ", rows, rows > 1 ? "s" : "");
        buf_add(&s, x);
        free(x);
        for (int k = 0; k < SKINNY_KERNELS; k++) {
            if (k == (int)t->kernel || t->seconds[b][k] <= 0) continue;
            x = xprintf("%s %s %.2fx", first ? "" : ",", skinny_kernel_name((SkinnyKernel)k),
                        t->seconds[b][k] / t->seconds[b][t->kernel]);
            buf_add(&s, x);
            free(x);
            first = 0;
        }
    }
    buf_add(&s, t->measured ? ")" : "");
    return s.data;
}

// An entry of the tuning file back into t; 0 when it is not one this process can use.
static int tuning_from_json(const cJSON *e, DType dt, SkinnyTuning *t) {
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(e, "kernel"), *th = cJSON_GetObjectItemCaseSensitive(e, "threads");
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(e, "ms");
    if (!cJSON_IsString(k) || !cJSON_IsNumber(th) || !cJSON_IsObject(ms)) return 0;
    *t = (SkinnyTuning){.measured = 1, .cached = 1, .kernel = SKINNY_KERNELS, .threads = th->valueint};
    for (int i = 0; i < SKINNY_ONEDNN; i++)
        if (strcmp(k->valuestring, skinny_kernel_name((SkinnyKernel)i)) == 0) t->kernel = (SkinnyKernel)i;
    if (t->kernel == SKINNY_KERNELS || !skinny_kernel_runs(t->kernel, dt)) return 0;
    for (int b = 0; b < SKINNY_BUCKETS; b++) {
        char rows[16];
        snprintf(rows, sizeof rows, "%d", skinny_bucket_rows(b));
        const cJSON *be = cJSON_GetObjectItemCaseSensitive(ms, rows);
        for (int i = 0; i < SKINNY_KERNELS; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(be, skinny_kernel_name((SkinnyKernel)i));
            if (cJSON_IsNumber(v) && v->valuedouble > 0) t->seconds[b][i] = v->valuedouble / 1e3;
        }
        if (t->seconds[b][t->kernel] <= 0) return 0;
    }
    return 1;
}

// The file's JSON object, or NULL when it is missing, too large or not one.
static cJSON *tuning_file_read(const char *path) {
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) return NULL;
    char *text = malloc(TUNE_FILE_MAX + 1);
    size_t n = text ? fread(text, 1, TUNE_FILE_MAX + 1, f) : 0;
    cJSON *root = NULL;
    if (text && n <= TUNE_FILE_MAX) text[n] = 0, root = cJSON_Parse(text);
    free(text);
    fclose(f);
    if (cJSON_IsObject(root)) return root;
    cJSON_Delete(root);
    return NULL;
}

// Replaces the file with root (a temporary file, synced, renamed over it); quietly nothing when that fails.
static void tuning_file_write(const char *path, const cJSON *root) {
    char *text = cJSON_Print(root), *tmp = xprintf("%s.%d.tmp", path, (int)getpid());
    FILE *f = text ? fopen(tmp, "wb") : NULL;
    int ok = f && fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f) ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) unlink(tmp);
    free(text), free(tmp);
}

// mkdir -p of path's directory; 0 when it cannot be made.
static int parent_dirs(const char *path) {
    char *d = xstrdup(path);
    int ok = 1;
    for (char *p = d + 1; ok && *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        ok = mkdir(d, 0755) == 0 || errno == EEXIST;
        *p = '/';
    }
    free(d);
    return ok;
}

// The lock beside the file (its descriptor, held until closed), or -1: none to be had within
// TUNE_LOCK_WAIT seconds (a stopped process holding it), or no place for it.
static int tuning_lock(const char *path) {
    char *lock_path = xprintf("%s.lock", path);
    int fd = parent_dirs(lock_path) ? open(lock_path, O_RDONLY | O_CREAT | O_CLOEXEC, 0644) : -1;
    if (fd < 0) fd = open(lock_path, O_RDONLY | O_CLOEXEC);  // another user's lock file
    free(lock_path);
    for (double t0 = time_now(); fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0;) {
        if ((errno != EWOULDBLOCK && errno != EINTR) || time_now() - t0 > TUNE_LOCK_WAIT) {
            close(fd);
            return -1;
        }
        usleep(20000);
    }
    return fd;
}

// The first line of a small text file (sysfs) into buf; "" when it cannot be read.
static char *read_line(const char *path, char *buf, int n) {
    FILE *f = fopen(path, "r");
    buf[0] = 0;
    if (f && !fgets(buf, n, f)) buf[0] = 0;
    if (f) fclose(f);
    return buf;
}

// Bytes of the last-level caches (L3 per domain x domains, from sysfs), 0 when unknown.
static size_t llc_bytes(void) {
    char size[64], shared[4096];
    size_t kib = strtoull(read_line("/sys/devices/system/cpu/cpu0/cache/index3/size", size, sizeof size), NULL, 10);
    size_t sharing = 0;
    read_line("/sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list", shared, sizeof shared);
    for (char *p = shared; *p && *p != '\n';) {  // "0-7,16-23": the CPUs one L3 serves
        char *end;
        long a = strtol(p, &end, 10), b = *end == '-' ? strtol(end + 1, &end, 10) : a;
        if (end == p) break;
        sharing += b >= a ? (size_t)(b - a + 1) : 0;
        p = *end == ',' ? end + 1 : end + strlen(end);
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return sharing && cpus > 0 ? kib * 1024 * (((size_t)cpus + sharing - 1) / sharing) : 0;
}

// Seconds of one pass of kernel k at `rows` rows over the n gate-shaped and down-shaped weight matrices in w.
static double time_pass(SkinnyKernel k, DType dt, int rows, const char *w, size_t n, const void *x, float *out) {
    size_t bytes = matrix_bytes(dt, TUNE_I, TUNE_C);
    double t0 = time_now();
    for (size_t m = 0; m < n; m++) {
        int down = m & 1;
        matmul_skinny_with(k, out, x, w + m * bytes, NULL, dt, rows, down ? TUNE_I : TUNE_C, down ? TUNE_C : TUNE_I);
    }
    double s = time_now() - t0;
    return s > 1e-9 ? s : 1e-9;
}

// The kernel of ours whose times, each relative to the fastest of ours at its row count, add up least:
// every row count weighs the same (a pass at 12 rows takes ten times one at 1).
static void tuning_pick(SkinnyTuning *t, DType dt) {
    double fastest[SKINNY_BUCKETS], best = 0.0;
    for (int b = 0; b < SKINNY_BUCKETS; b++) {
        fastest[b] = t->seconds[b][SKINNY_AVX2];  // runs everywhere
        for (int k = 0; k < SKINNY_ONEDNN; k++)
            if (skinny_kernel_runs((SkinnyKernel)k, dt) && t->seconds[b][k] < fastest[b]) fastest[b] = t->seconds[b][k];
    }
    for (int k = 0; k < SKINNY_ONEDNN; k++) {
        if (!skinny_kernel_runs((SkinnyKernel)k, dt)) continue;
        double total = 0.0;
        for (int b = 0; b < SKINNY_BUCKETS; b++) total += t->seconds[b][k] / fastest[b];
        if (k == 0 || total < best) best = total, t->kernel = (SkinnyKernel)k;
    }
}

static void tuning_measure(DType dt, SkinnyTuning *t) {
    size_t mat = matrix_bytes(dt, TUNE_I, TUNE_C), llc = 3 * llc_bytes();
    size_t bytes = llc > TUNE_MIN_BYTES ? llc : TUNE_MIN_BYTES;
    bytes = bytes < TUNE_MAX_BYTES ? bytes : TUNE_MAX_BYTES;
    size_t n = (bytes / mat + 1) & ~(size_t)1;  // gate and down pairs, one at least (ASan's 16 MiB: no fp32 one)
    n = n < 2 ? 2 : n;
    char *w = xmalloc(n * mat);
    size_t nx = (size_t)SKINNY_MAX_ROWS * TUNE_I;
    float *xf = xmalloc(nx * sizeof *xf), *out = xmalloc(nx * sizeof *out);
    for (size_t i = 0; i < nx; i++) xf[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
#pragma omp parallel for schedule(static)
    for (size_t m = 0; m < n; m++) memset(w + m * mat, 0x3c, mat);  // 0.0115 in fp32 and bf16; Q8_0: 1.06 x 60
    void *x = xmalloc(in_bytes(dt, SKINNY_MAX_ROWS, TUNE_I));
    if (dt == DTYPE_Q8) q8_quantize_inputs(x, xf, SKINNY_MAX_ROWS, TUNE_I);
    else dtype_from_f32(dt, xf, x, nx);
    *t = (SkinnyTuning){.measured = 1, .threads = omp_get_max_threads()};
    for (int b = 0; b < SKINNY_BUCKETS; b++)
        for (int round = 0; round < 4; round++)  // round 0 warms up (oneDNN compiles its primitives)
            for (int k = 0; k < SKINNY_KERNELS; k++) {
                if (!skinny_kernel_runs((SkinnyKernel)k, dt)) continue;
                double s = time_pass((SkinnyKernel)k, dt, skinny_bucket_rows(b), w, n, x, out);
                if (round && (s < t->seconds[b][k] || !t->seconds[b][k])) t->seconds[b][k] = s;
            }
    tuning_pick(t, dt);
    free(w), free(xf), free(out), free(x);
}

// dt's tuning: the file's entry, else measured (and kept in the file, under its lock).
static void tuning_resolve(DType dt, SkinnyTuning *t) {
    const char *mode = getenv("GRPO_TUNING");
    if (mode && strcmp(mode, "off") == 0) return;
    char *path = skinny_tuning_path(), *prefix = machine_key(), *key = xprintf("%s%s", prefix, dtype_name(dt));
    cJSON *root = tuning_file_read(path);  // without the lock: a writer replaces the file whole
    if (!tuning_from_json(cJSON_GetObjectItemCaseSensitive(root, key), dt, t)) {
        int lock = path ? tuning_lock(path) : -1;
        cJSON_Delete(root);
        root = lock >= 0 ? tuning_file_read(path) : NULL;  // another process may have measured meanwhile
        if (!tuning_from_json(cJSON_GetObjectItemCaseSensitive(root, key), dt, t)) {
            tuning_measure(dt, t);
            if (lock >= 0) {
                if (!root) root = cJSON_CreateObject();
                cJSON_DeleteItemFromObjectCaseSensitive(root, key);
                cJSON_AddItemToObject(root, key, skinny_tuning_json(t));
                tuning_file_write(path, root);
            }
        }
        if (lock >= 0) close(lock);  // and with it the lock
    }
    cJSON_Delete(root);
    free(path), free(prefix), free(key);
}

SkinnyKernel skinny_level_kernel(DType dt) {
    if (skinny_kernel_runs(SKINNY_AVX512_VNNI, dt)) return SKINNY_AVX512_VNNI;
    if (skinny_kernel_runs(SKINNY_AVX512_BF16, dt)) return SKINNY_AVX512_BF16;
    return skinny_kernel_runs(SKINNY_AVX512, dt) ? SKINNY_AVX512 : SKINNY_AVX2;
}

static void resolve(int d) {
    DType dt = slot_dtype[d];
    tuning_resolve(dt, &tuned[d]);
    chosen[d] = tuned[d].measured ? tuned[d].kernel : skinny_level_kernel(dt);
}

static void resolve_f32(void) { resolve(0); }
static void resolve_bf16(void) { resolve(1); }
static void resolve_q8(void) { resolve(2); }

const SkinnyTuning *skinny_tuning(DType dt) {
    static void (*const fns[SLOTS])(void) = {resolve_f32, resolve_bf16, resolve_q8};
    int d = slot(dt);
    pthread_once(&once[d], fns[d]);
    return &tuned[d];
}

SkinnyKernel skinny_choice(DType dt) {
    skinny_tuning(dt);
    return chosen[slot(dt)];
}

int skinny_choose(DType dt, SkinnyKernel k) {
    if (k == SKINNY_ONEDNN || !skinny_kernel_runs(k, dt)) return 0;
    skinny_tuning(dt);  // resolved first, so that it never overrides this
    chosen[slot(dt)] = k;
    return 1;
}

cJSON *skinny_tuning_entries(void) {
    char *path = skinny_tuning_path(), *prefix = machine_key();
    cJSON *root = tuning_file_read(path), *out = cJSON_CreateObject();
    size_t n = strlen(prefix);
    for (cJSON *e = root ? root->child : NULL; e; e = e->next) {
        SkinnyTuning t;
        if (strncmp(e->string, prefix, n) != 0) continue;
        const char *d = e->string + n;
        DType dt = strcmp(d, "BF16") == 0 ? DTYPE_BF16 : strcmp(d, "Q8_0") == 0 ? DTYPE_Q8 : DTYPE_F32;
        if (!tuning_from_json(e, dt, &t)) continue;
        char *text = skinny_tuning_text(&t);
        cJSON_AddStringToObject(out, e->string + n, text);
        free(text);
    }
    cJSON_Delete(root);
    free(path), free(prefix);
    return out;
}

// The harnesses' shared runtime: see fuzz.h. Test code, so the one process-wide state it needs (what the
// current input opened) lives in statics here.
#define _GNU_SOURCE
#include "fuzz.h"

#include "base/util.h"
#include "model/decoder.h"
#include "cli/demo.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <sanitizer/allocator_interface.h>
#include <sanitizer/common_interface_defs.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void fuzz_fail(const char *fmt, ...) {
    char msg[512] = "fuzz: ";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + 6, sizeof msg - 6, fmt, ap);
    va_end(ap);
    // To the sanitizers' report descriptor: libFuzzer's -close_fd_mask closes stderr but keeps that one.
    __sanitizer_report_error_summary(msg);
    abort();
}

// ---------------------------------------------------------------- what the running input allocated
// Heap blocks: an open-addressing set keyed by address, valid for the current generation (one per input, and one
// per compaction), plus the list of addresses inserted, so releasing walks only this input's blocks.
#define HEAP_CAP (1u << 21)
#define LOG_CAP (1u << 20)
#define TOMB ((uintptr_t)1)
_Static_assert(HEAP_CAP / 2 >= LOG_CAP, "a compaction's re-adds never compact again");
typedef struct {
    uintptr_t p;
    uint32_t gen;
} Slot;
static Slot heap[HEAP_CAP];
static uintptr_t heap_log[LOG_CAP];
static size_t n_log, n_used;
static uint32_t gen = 1;
static volatile int armed;
static pthread_t main_thread;

static size_t slot_of(uintptr_t p) {
    return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ull >> 43) & (HEAP_CAP - 1);  // Fibonacci hashing
}
static int slot_empty(const Slot *s) { return s->gen != gen || s->p == 0; }

static Slot *heap_find(uintptr_t p);
static void heap_add(uintptr_t p);

// Keeps only the blocks still held, in a new generation of the set: an input that allocates and frees more blocks
// than the log holds (a Parquet file of a million rows) goes on. A block the log names twice (freed, then the same
// address allocated again) is kept once.
static void heap_compact(void) {
    size_t live = 0;
    for (size_t i = 0; i < n_log; i++) {
        Slot *s = heap_find(heap_log[i]);
        if (!s) continue;
        s->p = TOMB;  // found once
        heap_log[live++] = heap_log[i];
    }
    gen++;
    n_log = n_used = 0;
    for (size_t i = 0; i < live; i++) heap_add(heap_log[i]);  // rewrites heap_log[i] with itself
}

static void heap_add(uintptr_t p) {
    if (n_used >= HEAP_CAP / 2 || n_log >= LOG_CAP) {
        heap_compact();  // over half the log still held: fail rather than compact again and again
        if (n_log > LOG_CAP / 2) fuzz_fail("an input held over %zu allocations at once", n_log);
    }
    size_t i = slot_of(p);
    while (!slot_empty(&heap[i]) && heap[i].p != TOMB) i = (i + 1) & (HEAP_CAP - 1);
    if (slot_empty(&heap[i])) n_used++;
    heap[i] = (Slot){p, gen};
    heap_log[n_log++] = p;
}

static Slot *heap_find(uintptr_t p) {
    for (size_t i = slot_of(p); !slot_empty(&heap[i]); i = (i + 1) & (HEAP_CAP - 1))
        if (heap[i].p == p) return &heap[i];
    return NULL;
}

static int tracking(void) { return armed && pthread_equal(pthread_self(), main_thread); }

static void on_malloc(const volatile void *p, size_t size) {
    (void)size;
    if (p && tracking()) heap_add((uintptr_t)p);
}

static void on_free(const volatile void *p) {
    if (!p || !pthread_equal(pthread_self(), main_thread)) return;
    Slot *s = heap_find((uintptr_t)p);
    if (s) s->p = TOMB;
}

// Files, directories, descriptors and mappings: short lists (an input holds a few at a time).
#define RES_CAP 256
typedef struct {
    void *p[RES_CAP];
    size_t len[RES_CAP];  // mappings: their length
    int n;
} ResList;
static ResList files, dirs, fds, maps, regexes;

static void res_add(ResList *l, void *p, size_t len) {
    if (!tracking()) return;
    if (l->n == RES_CAP) fuzz_fail("an input held over %d files, descriptors or mappings", RES_CAP);
    l->p[l->n] = p;
    l->len[l->n++] = len;
}

static void res_remove(ResList *l, const void *p) {
    for (int i = l->n - 1; i >= 0; i--)
        if (l->p[i] == p) {
            l->p[i] = l->p[--l->n];
            l->len[i] = l->len[l->n];
            return;
        }
}

#define FD_KEY(fd) ((void *)(intptr_t)((fd) + 1))

FILE *__real_fopen(const char *path, const char *mode);
FILE *__real_fdopen(int fd, const char *mode);
FILE *__real_open_memstream(char **ptr, size_t *size);
int __real_fclose(FILE *f);
DIR *__real_opendir(const char *path);
int __real_closedir(DIR *d);
int __real_open(const char *path, int flags, ...);
int __real_mkstemp(char *tmpl);
int __real_close(int fd);
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
int __real_munmap(void *addr, size_t len);
// PCRE2 keeps JIT-compiled code in executable memory of its own, which only pcre2_code_free returns.
void *__real_pcre2_compile_8(const unsigned char *pattern, size_t len, uint32_t options, int *err, size_t *off,
                             void *ctx);
void __real_pcre2_code_free_8(void *code);

FILE *__wrap_fopen(const char *path, const char *mode) {
    FILE *f = __real_fopen(path, mode);
    if (f) res_add(&files, f, 0);
    return f;
}
FILE *__wrap_fdopen(int fd, const char *mode) {
    FILE *f = __real_fdopen(fd, mode);
    if (f) {
        res_remove(&fds, FD_KEY(fd));  // fclose closes it now
        res_add(&files, f, 0);
    }
    return f;
}
FILE *__wrap_open_memstream(char **ptr, size_t *size) {
    FILE *f = __real_open_memstream(ptr, size);
    if (f) res_add(&files, f, 0);
    return f;
}
int __wrap_fclose(FILE *f) {
    res_remove(&files, f);
    return __real_fclose(f);
}
DIR *__wrap_opendir(const char *path) {
    DIR *d = __real_opendir(path);
    if (d) res_add(&dirs, d, 0);
    return d;
}
int __wrap_closedir(DIR *d) {
    res_remove(&dirs, d);
    return __real_closedir(d);
}
int __wrap_open(const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    int fd = __real_open(path, flags, mode);
    if (fd >= 0) res_add(&fds, FD_KEY(fd), 0);
    return fd;
}
int __wrap_mkstemp(char *tmpl) {
    int fd = __real_mkstemp(tmpl);
    if (fd >= 0) res_add(&fds, FD_KEY(fd), 0);
    return fd;
}
int __wrap_close(int fd) {
    res_remove(&fds, FD_KEY(fd));
    return __real_close(fd);
}
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    void *p = __real_mmap(addr, len, prot, flags, fd, off);
    if (p != MAP_FAILED) res_add(&maps, p, len);
    return p;
}
int __wrap_munmap(void *addr, size_t len) {
    res_remove(&maps, addr);
    return __real_munmap(addr, len);
}
void *__wrap_pcre2_compile_8(const unsigned char *pattern, size_t len, uint32_t options, int *err, size_t *off,
                             void *ctx) {
    void *code = __real_pcre2_compile_8(pattern, len, options, err, off, ctx);
    if (code) res_add(&regexes, code, 0);
    return code;
}
void __wrap_pcre2_code_free_8(void *code) {
    res_remove(&regexes, code);
    __real_pcre2_code_free_8(code);
}

// After a refused input: close what it opened, then free what it allocated.
static void release_all(void) {
    armed = 0;
    while (files.n) __wrap_fclose(files.p[files.n - 1]);
    while (dirs.n) __wrap_closedir(dirs.p[dirs.n - 1]);
    while (fds.n) __wrap_close((int)(intptr_t)fds.p[fds.n - 1] - 1);
    while (maps.n) __wrap_munmap(maps.p[maps.n - 1], maps.len[maps.n - 1]);
    while (regexes.n) __wrap_pcre2_code_free_8(regexes.p[regexes.n - 1]);
    for (size_t i = 0; i < n_log; i++) {
        Slot *s = heap_find(heap_log[i]);
        if (s) free((void *)heap_log[i]);  // the free hook marks it gone
    }
}

// ---------------------------------------------------------------- running one input
static jmp_buf back;

void fuzz_on_die(const char *msg) {
    if (!armed) fuzz_fail("grpo refused something outside an input: %s", msg);
    if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "fuzz: refused: %s\n", msg);  // to check the seeds
    longjmp(back, 1);
}

void fuzz_stdin(const char *path) {
    static char in_buf[1 << 16];
    if (!freopen(path, "r", stdin) || setvbuf(stdin, in_buf, _IOFBF, sizeof in_buf) != 0)
        fuzz_fail("cannot read stdin from %s", path);
}

int fuzz_run(FuzzBody body, const uint8_t *data, size_t size, void *ctx) {
    gen++;
    n_log = 0;
    n_used = 0;
    files.n = dirs.n = fds.n = maps.n = regexes.n = 0;
    armed = 1;
    if (setjmp(back)) {
        release_all();
        return 0;
    }
    body(data, size, ctx);
    armed = 0;
    return 1;
}

// ---------------------------------------------------------------- inputs and files
void fuzz_split(const uint8_t *data, size_t size, char **parts, size_t *lens, int max) {
    const char *p = (const char *)data, *end = p + size;
    size_t sep = strlen(FUZZ_SEP);
    for (int i = 0; i < max; i++) {
        const char *cut = i + 1 < max ? memmem(p, (size_t)(end - p), FUZZ_SEP, sep) : NULL;
        size_t n = cut ? (size_t)(cut - p) : (size_t)(end - p);
        parts[i] = malloc(n + 1);
        if (!parts[i]) fuzz_fail("out of memory");
        memcpy(parts[i], p, n);
        parts[i][n] = 0;
        lens[i] = n;
        p = cut ? cut + sep : end;
    }
}

void fuzz_parts_free(char **parts, int n) {
    for (int i = 0; i < n; i++) free(parts[i]);
}

static char dir[64];

const char *fuzz_dir(void) { return dir; }

char *fuzz_write(const char *name, const void *data, size_t n) {
    size_t len = strlen(dir) + strlen(name) + 2;
    char *path = malloc(len);
    if (!path) fuzz_fail("out of memory");
    snprintf(path, len, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) fuzz_fail("cannot write %s", path);
    return path;
}

const char *fuzz_model(void) {
    static char *model;
    if (model) return model;
    model = fuzz_write("model", "", 0);
    remove(model);
    int n_ids = demo_write_tokenizer(model);
    static const char cfg[] =
        "{\"eos_token\": \"<|im_end|>\", \"pad_token\": \"<|endoftext|>\", \"chat_template\": "
        "\"{% for message in messages %}<|im_start|>{{ message.role }}\\n{{ message.content }}<|im_end|>\\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}\"}";
    char *path = path_join(model, "tokenizer_config.json");
    FILE *f = fopen(path, "w");
    if (!f || fwrite(cfg, 1, sizeof cfg - 1, f) != sizeof cfg - 1 || fclose(f) != 0)
        fuzz_fail("cannot write %s", path);
    free(path);
    DecoderConfig c;
    demo_model_config(&c, n_ids, ARCH_QWEN2);
    c.hidden = 16;
    c.inter = 32;
    c.layers = 1;
    c.heads = 2;
    c.kv_heads = 1;
    c.head_dim = 8;
    Decoder m;
    decoder_build(&m, &c, DTYPE_F32);
    decoder_init_random(&m, 1);
    decoder_save(&m, model, DTYPE_F32, NULL);
    decoder_free(&m);
    return model;
}

static int remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)type, (void)ftw;
    remove(path);
    return 0;
}

static void remove_dir(void) { nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS); }

void fuzz_init(void) {
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0", 1);  // no kernel outlives the input that made it
    // Buffers of our own: stdio would allocate them lazily, inside some input, and that input's release
    // would free them.
    static char out_buf[1 << 16];
    if (!freopen("/dev/null", "w", stdout) || setvbuf(stdout, out_buf, _IOFBF, sizeof out_buf) != 0)
        fuzz_fail("cannot send stdout to /dev/null");
    main_thread = pthread_self();
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/grpo-fuzz-XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
    if (!mkdtemp(dir)) fuzz_fail("cannot make a directory %s", dir);
    atexit(remove_dir);
    if (!__sanitizer_install_malloc_and_free_hooks(on_malloc, on_free)) fuzz_fail("no sanitizer malloc hooks");
}

// The harnesses that need nothing more; the others define their own (a strong symbol wins).
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

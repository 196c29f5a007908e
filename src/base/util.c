#define _POSIX_C_SOURCE 200809L
#include "base/util.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <dirent.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// The calling thread's handler: state of the thread (not of the run), set and cleared by its owner.
static _Thread_local struct {
    DieHandler fn;
    void *user;
} on_die;

void die_catch_on_thread(DieHandler fn, void *user) {
    on_die.fn = fn;
    on_die.user = user;
}

void die(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
#ifdef GRPO_FUZZ
    fuzz_on_die(msg);  // a refused input is no finding: back to the harness (tests/fuzz/fuzz.c)
#endif
    fflush(stdout);
    // Names from files may hold control characters: escape them so the error stays one line. The line goes out
    // in one write, so an MPI launcher's own output (its abort banner) cannot land inside it.
    char line[4 * sizeof msg + 32];
    size_t n = (size_t)snprintf(line, sizeof line, "grpo: error: ");
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++) {
        if (*p < 0x20 || *p == 0x7f) n += (size_t)snprintf(line + n, sizeof line - n, "\\x%02x", *p);
        else line[n++] = (char)*p;
    }
    line[n++] = '\n';
    fwrite(line, 1, n, stderr);
    fflush(stderr);
    if (on_die.fn) {
        DieHandler fn = on_die.fn;
        on_die.fn = NULL;
        fn(on_die.user, msg);
    }
    // _exit: an error exit has nothing to clean up, and leak checkers need not inspect it.
    _exit(1);
}

void *xmalloc_at(size_t size, const char *file, int line) {
    void *p = malloc(size ? size : 1);
    if (!p) die("out of memory allocating %zu bytes (%s:%d)", size, file, line);
    return p;
}

void *xcalloc_at(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die("out of memory allocating %zu x %zu bytes (%s:%d)", n, size, file, line);
    return p;
}

void *xrealloc_at(void *p, size_t size, const char *file, int line) {
    void *q = realloc(p, size ? size : 1);
    if (!q) die("out of memory reallocating %zu bytes (%s:%d)", size, file, line);
    return q;
}

long line_read(FILE *f, char **line, size_t *cap, const char *name, int64_t lineno) {
    size_t n = 0;
    int c = EOF;
    while ((c = getc_unlocked(f)) != EOF) {  // one reader per stream: no lock per byte
        if (n + 2 > *cap) {  // room for this byte and the NUL
            if (n + 1 > LINE_MAX_BYTES)
                die("%s:%lld: line longer than %zu MiB", name, (long long)lineno, LINE_MAX_BYTES >> 20);
            *cap = *cap ? 2 * *cap : 256;
            if (*cap > LINE_MAX_BYTES + 2) *cap = LINE_MAX_BYTES + 2;
            *line = xrealloc(*line, *cap);
        }
        (*line)[n++] = (char)c;
        if (c == '\n') break;
    }
    if (ferror(f)) die("cannot read %s: %s", name, strerror(errno));
    if (n == 0) return -1;
    (*line)[n] = 0;
    return (long)n;
}

void file_flush(FILE *f, const char *path) {
    if (fflush(f) != 0 || ferror(f)) die("cannot write %s: %s", path, strerror(errno ? errno : EIO));
}

void file_close(FILE *f, const char *path) {
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) die("cannot write %s: %s", path, strerror(errno ? errno : EIO));
}

int str_listed(const char *s, const char *const *names) {
    for (int i = 0; names && names[i]; i++)
        if (!strcmp(s, names[i])) return 1;
    return 0;
}

// A base64 character's 6 bits, or -1.
static int b64_value(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

uint8_t *base64_decode(const char *s, size_t n, size_t *len, size_t *bad) {
    size_t data = n;
    if (n % 4 == 0 && data > 0 && s[data - 1] == '=') data--;
    if (n % 4 == 0 && data > 0 && s[data - 1] == '=') data--;
    uint8_t *out = xmalloc(data / 4 * 3 + 3);
    uint32_t acc = 0;
    size_t o = 0;
    for (size_t i = 0; i < data; i++) {
        int v = b64_value(s[i]);
        if (v < 0) {
            free(out);
            *bad = i;
            return NULL;
        }
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3) {
            out[o++] = (uint8_t)(acc >> 16);
            out[o++] = (uint8_t)(acc >> 8);
            out[o++] = (uint8_t)acc;
        }
    }
    if (data % 4 == 1) {  // 6 bits cannot end a byte
        free(out);
        *bad = data - 1;
        return NULL;
    }
    if (data % 4 == 2) out[o++] = (uint8_t)(acc >> 4);
    if (data % 4 == 3) {
        out[o++] = (uint8_t)(acc >> 10);
        out[o++] = (uint8_t)(acc >> 2);
    }
    *len = o;
    return out;
}

// Appends fmt's text with ap's arguments (buf_printf's and xprintf's).
static void buf_vprintf(Buf *b, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    if (n < 0) die("internal: bad format \"%s\"", fmt);
    size_t need = b->len + (size_t)n + 1;  // and the NUL vsnprintf writes
    if (need > b->cap) {
        b->cap = need > 2 * b->cap ? need : 2 * b->cap;
        b->data = xrealloc(b->data, b->cap);
    }
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    b->len += (size_t)n;
}

char *xprintf(const char *fmt, ...) {
    Buf b = {0};
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(&b, fmt, ap);
    va_end(ap);
    return b.data;
}

char *xstrdup_at(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc_at(n, file, line);
    memcpy(p, s, n);
    return p;
}

void buf_append(Buf *b, const void *data, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        b->data = xrealloc(b->data, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void buf_printf(Buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(b, fmt, ap);
    va_end(ap);
}

void buf_free(Buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

static void too_big(const char *path, size_t max) {
    die("%s is larger than %zu MiB, the limit for a file of its kind", path, max >> 20);
}

char *file_read_all(const char *path, size_t max, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (uintmax_t)st.st_size > max) too_big(path, max);
    size_t cap = 1 << 16, len = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (len + 1 >= cap) buf = xrealloc(buf, cap *= 2);
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (len > max) too_big(path, max);  // not a regular file, or it grew
        if (got == 0) break;
    }
    if (ferror(f)) die("cannot read %s: %s", path, strerror(errno));
    fclose(f);
    buf[len] = '\0';
    if (len_out) *len_out = len;
    return buf;
}

void file_check_readable(const char *what, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die("%s: cannot open %s: %s", what, path, strerror(errno));
    struct stat st;
    int dir = fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode);
    fclose(f);
    if (dir) die("%s: %s is a directory, not a file", what, path);
}

void dir_check(const char *what, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) die("%s: %s does not exist", what, path);
    if (stat(path, &st) != 0) die("%s: cannot open %s: %s", what, path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) die("%s: %s is not a directory", what, path);
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void dir_fsync(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) die("cannot open directory %s: %s", path, strerror(errno));
    int failed = fsync(fd) != 0;
    int e = errno;
    close(fd);
    if (failed) die("cannot sync directory %s: %s", path, strerror(e));
}

void dir_remove_flat(const char *path) {
    DIR *d = opendir(path);
    if (!d) die("cannot open directory %s: %s", path, strerror(errno));
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char *f = path_join(path, e->d_name);
        if (unlink(f) != 0) die("cannot remove %s: %s", f, strerror(errno));
        free(f);
    }
    closedir(d);
    if (rmdir(path) != 0) die("cannot remove directory %s: %s", path, strerror(errno));
}

void file_copy(const char *from, const char *to) {
    size_t n;
    char *data = file_read_all(from, SIZE_MAX, &n);  // files already read and checked by their loaders
    AtomicFile af;
    atomic_file_open(&af, to);
    atomic_file_write(&af, data, n);
    atomic_file_commit(&af);
    free(data);
}

void dir_create(const char *path) {
    char *p = xstrdup(path);
    for (char *s = p + 1;; s++) {
        char c = *s;
        if (c != '/' && c != '\0') continue;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) die("cannot create directory %s: %s", p, strerror(errno));
        *s = c;
        if (c == '\0') break;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) die("%s exists and is not a directory", path);
    free(p);
}

char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = xmalloc(a + b + 2);
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

void atomic_file_open(AtomicFile *af, const char *path) {
    af->path = xstrdup(path);
    af->tmp_path = xmalloc(strlen(path) + 16);
    sprintf(af->tmp_path, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(af->tmp_path);
    if (fd < 0) die("cannot create %s: %s", af->tmp_path, strerror(errno));
    mode_t mask = umask(0);  // mkstemp makes 0600 files; give the final file the usual mode
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) != 0) die("cannot chmod %s: %s", af->tmp_path, strerror(errno));
    af->f = fdopen(fd, "wb");
    if (!af->f) die("cannot open %s: %s", af->tmp_path, strerror(errno));
}

void atomic_file_write(AtomicFile *af, const void *data, size_t n) {
    if (n && fwrite(data, 1, n, af->f) != n) {
        int e = errno;
        fclose(af->f);
        unlink(af->tmp_path);
        die("cannot write %s: %s", af->path, strerror(e));
    }
}

static void fsync_dir_of(const char *path) {
    char *copy = xstrdup(path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {  // best effort: some filesystems refuse fsync on directories
        fsync(fd);
        close(fd);
    }
    free(copy);
}

void atomic_file_commit(AtomicFile *af) {
    int failed = fflush(af->f) != 0 || fsync(fileno(af->f)) != 0;
    int e = errno;
    if (fclose(af->f) != 0 && !failed) failed = 1, e = errno;
    if (!failed && rename(af->tmp_path, af->path) != 0) failed = 1, e = errno;
    if (failed) {
        unlink(af->tmp_path);
        die("cannot write %s: %s", af->path, strerror(e));
    }
    fsync_dir_of(af->path);
    free(af->path);
    free(af->tmp_path);
    af->f = NULL;
}

double time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long long kib = -1;
    while (kib < 0 && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kib) != 1) kib = -1;
    fclose(f);
    return kib < 0 ? -1 : (int64_t)kib * 1024;
}

void fmt_count(char *buf, size_t n, double count) {
    static const char units[] = " kMBT";
    int u = 0;
    while (count >= 999.5 && u < 4) {
        count /= 1000;
        u++;
    }
    int digits = 2;
    if (count >= 99.95) digits = 0;
    else if (count >= 9.995) digits = 1;
    if (u == 0) snprintf(buf, n, "%.0f", count);
    else snprintf(buf, n, "%.*f%c", digits, count, units[u]);
}

static atomic_int stop_received;  // lock-free, so safe in a handler
// The second signal's words about the newest checkpoint: two buffers, so the handler reads a whole one
// while the other is rewritten.
static char stop_notes[2][600] = {"no checkpoint was saved in this run", ""};
static atomic_int stop_note;

void stop_signal_checkpoint(const char *dir) {
    int next = 1 - atomic_load(&stop_note);
    if (dir) snprintf(stop_notes[next], sizeof stop_notes[next], "the newest checkpoint is %s", dir);
    else snprintf(stop_notes[next], sizeof stop_notes[next], "no checkpoint was saved in this run");
    atomic_store(&stop_note, next);
}

static void say(const char *text) {
    if (write(STDERR_FILENO, text, strlen(text)) < 0) {  // async-signal-safe; nothing to do if stderr is gone
    }
}

static void on_stop_signal(int sig) {
    const char *name = sig == SIGINT ? "grpo: SIGINT" : "grpo: SIGTERM";
    // Any thread may take a signal, two at once: the exchange tells the first from the second, which
    // ends the process by the signal's default action once this handler returns.
    if (atomic_exchange(&stop_received, sig) != 0) {
        say(name);
        say(", a second signal: stopping now, without a checkpoint; ");
        say(stop_notes[atomic_load(&stop_note)]);
        say("\n");
        signal(sig, SIG_DFL);
        raise(sig);  // blocked while the handler runs: delivered when it returns
        return;
    }
    say(name);
    say(": stopping after this step, with a checkpoint (a second one stops at once, without one)\n");
}

void stop_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;  // reads and writes carry on; the loops look at the flag between steps
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0)
        die("cannot install the SIGINT/SIGTERM handlers: %s", strerror(errno));
}

int stop_signal(void) { return atomic_load(&stop_received); }

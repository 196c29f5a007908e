// Checked allocation and I/O: every failure reports file:line and exits, so
// callers never have to thread error codes through for out-of-memory or disk faults.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#if defined(__GNUC__)
#define GRPO_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define GRPO_PRINTF(a, b)
#endif

#ifdef __cplusplus  // the CUDA backend's .cu files
#define GRPO_NORETURN [[noreturn]]
#else
#define GRPO_NORETURN _Noreturn
#endif

// Prints "grpo: error: <message>" on one line and exits with status 1.
GRPO_NORETURN void die(const char *fmt, ...) GRPO_PRINTF(1, 2);
// A thread that must answer for its work when it fails (grpo serve's engine thread: its requests get an error
// answer) catches die() on that thread: after the error line, die() calls the thread's handler with the
// message; the handler does not return (it long-jumps to the thread's recovery). NULL: die() exits again.
typedef void (*DieHandler)(void *user, const char *msg);
void die_catch_on_thread(DieHandler fn, void *user);
#ifdef GRPO_FUZZ
GRPO_NORETURN void fuzz_on_die(const char *msg);  // defined by the fuzz harnesses (tests/fuzz/fuzz.c)
#endif

void *xmalloc_at(size_t size, const char *file, int line);
void *xcalloc_at(size_t n, size_t size, const char *file, int line);
void *xrealloc_at(void *p, size_t size, const char *file, int line);
char *xstrdup_at(const char *s, const char *file, int line);
#define xmalloc(size) xmalloc_at((size), __FILE__, __LINE__)
#define xcalloc(n, size) xcalloc_at((n), (size), __FILE__, __LINE__)
#define xrealloc(p, size) xrealloc_at((p), (size), __FILE__, __LINE__)
#define xstrdup(s) xstrdup_at((s), __FILE__, __LINE__)
// printf into a fresh malloc'd string.
char *xprintf(const char *fmt, ...) GRPO_PRINTF(1, 2);
// Whether s is one of names (NULL-terminated; names may be NULL: none).
int str_listed(const char *s, const char *const *names);
// RFC 4648's base64 (its standard alphabet; the final '=' padding optional; no whitespace) of s[0..n): the bytes
// (malloc'd, *len of them), or NULL with *bad the offset of the first character that does not belong.
uint8_t *base64_decode(const char *s, size_t n, size_t *len, size_t *bad);

// Growable byte buffer, always NUL-terminated after `len` bytes once anything was appended.
typedef struct {
    char *data;
    size_t len, cap;
} Buf;
void buf_append(Buf *b, const void *data, size_t n);
// Appends the formatted text (as xprintf's).
void buf_printf(Buf *b, const char *fmt, ...) GRPO_PRINTF(2, 3);
void buf_free(Buf *b);

// fflush / fclose of a file being written, dying with "cannot write PATH: <reason>" (a full disk, a quota)
// when a write into it failed.
void file_flush(FILE *f, const char *path);
void file_close(FILE *f, const char *path);

// Reads a whole file into a NUL-terminated buffer; dies naming the path on failure.
// Dies too when the file holds more than `max` bytes: each kind of input has a cap (FILE_MAX_* here and
// in the readers), so a hostile file cannot make us allocate without bound.
char *file_read_all(const char *path, size_t max, size_t *len_out);
#define GIB 1073741824.0  // bytes in a GiB, for printing sizes
#define FILE_MAX_CONFIG ((size_t)1 << 20)  // a YAML training config
#define FILE_MAX_JSON ((size_t)16 << 20)   // config.json, tokenizer_config.json, index.json and the like
#define FILE_MAX_METRICS ((size_t)1 << 30) // a run's metrics.jsonl (grpo report, resume)

// One line of a JSONL file or stream, newline included, NUL-terminated in *line (grown as needed; free it);
// returns its length, or -1 at the end. A line past LINE_MAX_BYTES dies naming name:lineno: no data set
// line, prompt or token list needs more, and its parse can take about 45 times its size.
#define LINE_MAX_BYTES ((size_t)8 << 20)
long line_read(FILE *f, char **line, size_t *cap, const char *name, int64_t lineno);
int file_exists(const char *path);
// Die in one line naming what named the path (the option or key: "option --config", "model.path") unless it opens
// for reading ("WHAT: cannot open PATH: reason"), or unless it is a directory ("WHAT: PATH does not exist" / "is
// not a directory").
void file_check_readable(const char *what, const char *path);
void dir_check(const char *what, const char *path);
// mkdir -p: creates `path` and missing parents; dies naming the path when that fails.
void dir_create(const char *path);
// fsync of a directory, so renames and new entries in it survive a power cut.
void dir_fsync(const char *path);
// Removes a directory that holds only plain files (a checkpoint); dies naming what it cannot remove.
void dir_remove_flat(const char *path);
// Copies a file atomically (see AtomicFile).
void file_copy(const char *from, const char *to);
// "dir/name" in a fresh buffer.
char *path_join(const char *dir, const char *name);

// Atomic file write: data goes to a temporary file in the same directory, is
// fsync'd and renamed over `path`, so readers see the old file or the new one, never half.
typedef struct {
    FILE *f;
    char *path;
    char *tmp_path;
} AtomicFile;
void atomic_file_open(AtomicFile *af, const char *path);
void atomic_file_write(AtomicFile *af, const void *data, size_t n);
void atomic_file_commit(AtomicFile *af);

// Monotonic clock in seconds.
double time_now(void);

// The memory the kernel says a new allocation can get now (/proc/meminfo's MemAvailable), in bytes; -1 if
// unknown.
int64_t mem_available(void);

// A count for people, with three significant digits: 950, 12.3k, 1.54M, 7.62B.
void fmt_count(char *buf, size_t n, double count);

// SIGINT and SIGTERM ask a training loop to stop after its current step (checkpoint, then exit); a
// second one ends the process at once, saying which checkpoint is the newest. The signal and that note
// are the one piece of process-wide state here: a handler can reach nothing else.
void stop_signals_install(void);
int stop_signal(void);  // the first SIGINT/SIGTERM received, 0 if none
// The newest checkpoint saved (NULL: none yet), named by the second signal's message.
void stop_signal_checkpoint(const char *dir);

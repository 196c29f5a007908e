// The libFuzzer harnesses' shared runtime (tests/fuzz/README.md).
//
// grpo refuses a bad input with die(), which exits. In a fuzz build (GRPO_FUZZ) die() calls
// fuzz_on_die() instead, which jumps back into fuzz_run(); fuzz_run then releases what the refused input
// left behind, so the next input starts clean and a leak report means a real leak:
//   - heap blocks allocated while the body ran (the sanitizer's malloc/free hooks keep the list),
//   - FILEs, directories, descriptors, mappings and compiled regexes made while it ran (the linker wraps
//     fopen, fdopen, open_memstream, fclose, opendir, closedir, open, mkstemp, close, mmap, munmap,
//     pcre2_compile and pcre2_code_free: -Wl,--wrap).
// Only the main thread is tracked; harnesses run grpo with one thread (fuzz_init sets OMP_NUM_THREADS).
#pragma once
#include <stddef.h>
#include <stdint.h>

// Once per process, from LLVMFuzzerInitialize (fuzz.c's own unless the harness has one): one thread, stdout
// to /dev/null, a private directory.
void fuzz_init(void);

// Runs body(data, size, ctx). Returns 1 when it finished, 0 when grpo refused the input (die).
typedef void (*FuzzBody)(const uint8_t *data, size_t size, void *ctx);
int fuzz_run(FuzzBody body, const uint8_t *data, size_t size, void *ctx);

// Makes `path` the process's stdin (with a buffer no input's release frees).
void fuzz_stdin(const char *path);

// Cuts data at each FUZZ_SEP into at most max parts: NUL-terminated copies (parts[i], lens[i]); the
// last part takes the rest. Missing parts are empty. Free with fuzz_parts_free.
#define FUZZ_SEP "\n=====\n"
void fuzz_split(const uint8_t *data, size_t size, char **parts, size_t *lens, int max);
void fuzz_parts_free(char **parts, int n);

// The process's private directory (made by fuzz_init, removed at exit) and a file written into it:
// returns DIR/name (a static buffer per call site is the caller's business: this one is malloc'd).
const char *fuzz_dir(void);
char *fuzz_write(const char *name, const void *data, size_t n);

// A tiny model in DIR/model (made once): the demo's byte-level BPE tokenizer (256 bytes, a few merges,
// <|endoftext|> <|im_start|> <|im_end|>) with a ChatML chat template, and a one-layer Qwen2 of hidden
// size 16 over it. Returns the directory.
const char *fuzz_model(void);

// A finding that is not a sanitizer report: prints "fuzz: <message>" and aborts.
_Noreturn void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

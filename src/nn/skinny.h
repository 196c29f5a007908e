// The skinny projection (decode: a few rows), inside nn/: out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias
// for N <= SKINNY_MAX_ROWS, with weights and inputs in fp32, bf16, or Q8_0 (DTYPE_Q8: weights in nn/q8.h's Q8Block,
// inputs in its Q8In; decode's int8 weights; biases added by q8_matmul). Several kernels of ours can run it, one per instruction set, and which is fastest
// is not what the CPU's features say (on Zen 4, AVX2 widening streams a weight row as fast as AVX512-BF16
// dot products), so the process runs the kernel measured fastest on this machine (skinny_tune.c, below).
// oneDNN's GEMM is measured beside them but never chosen: each of ours computes a row the same way whatever
// rows come with it, so a sequence decodes to the same numbers alone or in a batch (of up to
// SKINNY_MAX_ROWS rows), and a GEMM does not.
#pragma once
#include <cjson/cJSON.h>
#include <stdint.h>

#include "base/dtype.h"

#define SKINNY_MAX_ROWS 16
// Names this set of kernels in the tuning file's keys (below): change it when a kernel changes.
#define SKINNY_KERNEL_SET "skinny kernels 2"

typedef enum {
    SKINNY_AVX2,         // widening bf16 in registers (fp32: 8-wide vectors); every level
    SKINNY_AVX512,       // the same 16 wide; AVX-512 and up
    SKINNY_AVX512_BF16,  // bf16 dot products (bf16 only); AVX512-BF16 and up
    SKINNY_AVX512_VNNI,  // int8 dot products (Q8_0 only; AVX2 runs it with two instructions); AVX512-BF16 and up
    SKINNY_ONEDNN,       // nn/gemm.h's GEMM; every level (measured for comparison)
    SKINNY_KERNELS,
} SkinnyKernel;

// The row counts kernels are measured at: 1, 3, 6, 12.
#define SKINNY_BUCKETS 4
int skinny_bucket_rows(int bucket);
const char *skinny_kernel_name(SkinnyKernel k);  // "avx2", "avx512", "avx512_bf16", "avx512_vnni", "onednn"
// 1 when kernel k runs dtype dt (DTYPE_F32, DTYPE_BF16 or DTYPE_Q8) at this process's CPU level (base/cpu.h).
int skinny_kernel_runs(SkinnyKernel k, DType dt);

// The projection with the kernel chosen for dt.
void matmul_skinny(float *out, const void *inp, const void *weight, const void *bias, DType dt, int64_t N, int64_t C,
                   int64_t OC);
// The same with kernel k (which must run dt here): for measuring and testing each kernel.
void matmul_skinny_with(SkinnyKernel k, float *out, const void *inp, const void *weight, const void *bias, DType dt,
                        int64_t N, int64_t C, int64_t OC);
// The process's kernel for dt: the first call per dtype resolves it (skinny_tuning), later calls read it.
// skinny_choose overrides it (tests); it refuses (returns 0) SKINNY_ONEDNN and a kernel that does not run
// dt here. Process state, like the CPU level.
SkinnyKernel skinny_choice(DType dt);
int skinny_choose(DType dt, SkinnyKernel k);
SkinnyKernel skinny_level_kernel(DType dt);  // what the CPU's features suggest: the highest level's of ours

// The choice by measurement (skinny_tune.c): each kernel this level allows, and oneDNN for the record,
// makes passes over 128 MiB of bf16 or fp32 weights shaped as Qwen2.5-0.5B's gate and down projections
// (896 x 4864 and back: the weights stream from memory, as in decode) at 1, 3, 6 and 12 rows, in turns,
// the fastest of three after a warm-up; the kernel chosen is the one whose times, each relative to the
// fastest of ours at its row count, add up least. The result is kept in a tuning file, one entry per CPU
// model, kernel set, level and dtype (a decode's numbers depend on its kernel, so one machine keeps one
// choice and runs stay reproducible, at any thread count), measured once under a lock, then read by every
// later process:
//   GRPO_TUNING_FILE  the file (default $XDG_CACHE_HOME/grpo/tuning.json, else ~/.cache/grpo/tuning.json);
//                     empty: measure in every process, keep nothing
//   GRPO_TUNING=off   measure nothing: the level's own kernel
// A file that cannot be read, locked or written costs a measurement, never the run; an entry that names a
// kernel this level lacks, or a file that is not JSON, is measured again and replaced.
typedef struct {
    int measured;         // 0: the level's own kernel (GRPO_TUNING=off, or a dtype without kernels)
    int cached;           // read from the tuning file, measured by an earlier process
    int threads;          // the OpenMP threads it was measured with
    SkinnyKernel kernel;  // ours
    double seconds[SKINNY_BUCKETS][SKINNY_KERNELS];  // one pass; 0: the kernel does not run here
} SkinnyTuning;

// dt's tuning, measured or read on the first call (skinny_choice makes it); thread-safe.
const SkinnyTuning *skinny_tuning(DType dt);
// {"kernel": "avx512_bf16", "threads": 2, "ms": {"1": {"avx2": 3.1, ...}, ...}}, for --stats and the tuning
// file; NULL when not measured.
cJSON *skinny_tuning_json(const SkinnyTuning *t);
// "avx512_bf16 (the others' time at 1 row: avx2 1.01x, avx512 1.08x, onednn 2.97x; 3 rows: ...)" for people;
// "" when not measured.
char *skinny_tuning_text(const SkinnyTuning *t);
// The tuning file's entries for this CPU, kernel set and level, as text by dtype: {"BF16": "avx512_bf16
// (the others' ...)"} (a new object, empty when there are none).
cJSON *skinny_tuning_entries(void);
// The tuning file's path (a fresh string), or NULL when none is kept.
char *skinny_tuning_path(void);

// Output columns o0 .. o0+3 (those < OC) of N rows, per kernel file (compiled for its level).
void skinny_block_bf16_avx2(float *out, const uint16_t *inp, const uint16_t *weight, const uint16_t *bias, int64_t o0,
                            int64_t N, int64_t C, int64_t OC);
void skinny_block_f32_avx2(float *out, const float *inp, const float *weight, const float *bias, int64_t o0, int64_t N,
                           int64_t C, int64_t OC);
void skinny_block_bf16_avx512bf16(float *out, const uint16_t *inp, const uint16_t *weight, const uint16_t *bias,
                                  int64_t o0, int64_t N, int64_t C, int64_t OC);
void skinny_block_bf16_avx512(float *out, const uint16_t *inp, const uint16_t *weight, const uint16_t *bias,
                              int64_t o0, int64_t N, int64_t C, int64_t OC);
void skinny_block_f32_avx512(float *out, const float *inp, const float *weight, const float *bias, int64_t o0,
                             int64_t N, int64_t C, int64_t OC);
// Q8_0: C counts blocks here.
typedef struct Q8Block Q8Block;
typedef struct Q8In Q8In;
void skinny_block_q8_avx2(float *out, const Q8In *inp, const Q8Block *weight, const Q8Block *bias, int64_t o0,
                          int64_t N, int64_t C, int64_t OC);
void skinny_block_q8_vnni(float *out, const Q8In *inp, const Q8Block *weight, const Q8Block *bias, int64_t o0,
                          int64_t N, int64_t C, int64_t OC);

// The backend seam: where a model's memory lives and what runs its ops. The model and rollout code is
// written once against this table; the CPU backend runs nn/ops.h on host memory, the CUDA backend
// (src/cuda/) runs kernels and cuBLASLt on device memory; the emulated device ("emu") runs the same kernels on
// the CPU, its "device memory" host memory that host code must still reach only through upload/download.
// Every op keeps nn/ops.h's contract (shapes, adds vs overwrites); pointers are the backend's memory unless a
// comment says host.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/arena.h"
#include "base/dtype.h"
#include "nn/ops.h"
#include "nn/optim.h"
#include "nn/sampler.h"

typedef struct Backend Backend;
struct Backend {
    const char *name;  // "cpu", "cuda:0", "emu"
    int on_device;     // memory is not host memory (upload/download needed)
    int bf16_weights;  // its ops take bf16 weights only (a GPU's): a model there, or a compute copy, is bf16
    void *ctx;         // the backend's own state (CUDA: stream, cuBLASLt handle, scratch)

    // Scratch (floats) the ops below need: attention over at most max_T keys (or its backward's), the
    // log-prob head (forward and backward) over V rows of width C stored as wt. A device's attention may
    // need none; the CPU's is a block per OpenMP thread.
    size_t (*attention_scratch)(const Backend *be, int64_t max_T, int backward);
    size_t (*logprob_scratch)(const Backend *be, int64_t V, int64_t C, DType wt);

    // Memory: alloc'd bytes are zeroed, 64-byte aligned; alloc dies naming the size when out of memory.
    void *(*alloc)(const Backend *be, size_t bytes);
    void (*free)(const Backend *be, void *p);
    // upload returns once host_src may be reused, unless it is host_alloc memory: then the copy may still be in
    // flight until the next download or synchronising call.
    void (*upload)(const Backend *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(const Backend *be, void *host_dst, const void *src, size_t bytes);  // waits for the ops before
    void (*copy)(const Backend *be, void *dst, const void *src, size_t bytes);
    // Host memory the device copies to and from asynchronously (a GPU's pinned memory), zeroed; host_free releases
    // it. The CPU's is its alloc.
    void *(*host_alloc)(const Backend *be, size_t bytes);
    void (*host_free)(const Backend *be, void *p);
    // A device's memory: the bytes alloc holds now and the most it has held at once (the backend's own buffers
    // too), and what the device has free and in all; NULL on the CPU (the process's RSS is its measure).
    size_t (*memory_held)(const Backend *be);
    size_t (*memory_peak)(const Backend *be);
    void (*memory_info)(const Backend *be, size_t *free_bytes, size_t *total_bytes);
    // The most bytes of its own buffers (a device's per-row statistics, widened biases, sampler draws, its GEMM
    // libraries' workspaces) for ops over at most `rows` rows with `heads` attention heads and projections at most
    // `width` wide; NULL on the CPU.
    size_t (*memory_own)(const Backend *be, int64_t rows, int heads, int64_t width);

    // Ops (nn/ops.h). round_operand: x (n) rounded into dst in dtype dt (a projection's input).
    void (*round_operand)(const Backend *be, DType dt, const float *x, void *dst, int64_t n);
    void (*embedding_forward)(const Backend *be, float *out, const int32_t *tokens, const void *table, DType wt,
                              int64_t N, int64_t C);
    void (*rmsnorm_forward)(const Backend *be, float *out, const float *inp, const void *weight, DType wt, int64_t N,
                            int64_t C, float eps, float offset);
    void (*matmul_forward)(const Backend *be, float *out, const void *inp, const void *weight, const void *bias,
                           DType dt, int64_t N, int64_t C, int64_t OC);
    void (*rope_table)(const Backend *be, float *cs, const int32_t *pos, int64_t N, int D, RopeFreqs f);
    void (*rope_forward)(const Backend *be, float *x, const float *cs, int64_t N, int n_heads, int D);
    void (*glu_forward)(const Backend *be, float *out, const float *gate, const float *up, int64_t n, GluAct act);
    void (*residual_forward)(const Backend *be, float *x, const float *y, int64_t n);
    // Causal attention of packed sequences (nn/ops.h attention_forward); N = seq_off[B] (seq_off is in the
    // backend's memory, N is known on the host). lse (N, H), may be NULL: the rows' log-sum-exp, which
    // training's backward reads.
    void (*attention_forward)(const Backend *be, float *out, float *lse, const float *q, const float *k,
                              const float *v, const int64_t *seq_off, int B, int64_t N, AttnShape a, float *scratch);
    // The cache's elements are kv_dt's (DTYPE_F32 or DTYPE_BF16).
    void (*attention_decode_forward)(const Backend *be, float *out, const float *q, const void *k_cache,
                                     const void *v_cache, DType kv_dt, const int64_t *kv_off, const int32_t *n_keys,
                                     int B, AttnShape a, float *scratch);
    // Row b of k and v (B, row) to k_cache / v_cache (kv_dt's elements: bf16 rounded to nearest even) at element
    // offset dst[b] (decode's new positions).
    void (*kv_append)(const Backend *be, void *k_cache, void *v_cache, DType kv_dt, const float *k, const float *v,
                      const int64_t *dst, int B, int64_t row);
    // ent (N), may be NULL: each row's entropy (training's entropy bonus).
    void (*logprob_forward)(const Backend *be, float *out, float *ent, const float *h, const void *W, DType wt,
                            const int32_t *targets, int64_t N, int64_t C, int64_t V, float *scratch);
    // One token for each of B rows of logits (B, V) as sampler_sample does, with u[b] its uniform draw
    // (host; unused when greedy); ids and logprobs (B) land in host memory. scr: from sampler_new.
    void (*sample)(const Backend *be, const SamplerConfig *sc, const float *logits, int B, int64_t V,
                   const double *u, void *scr, int32_t *ids, float *logprobs);
    // The sampler's scratch for rows of V logits, the backend's own (the CPU's: one per OpenMP thread; a
    // device may need none and return NULL); sampler_free releases it.
    void *(*sampler_new)(const Backend *be, int64_t V);
    void (*sampler_free)(const Backend *be, void *scr);

    // Training: each backward beside its forward above, with nn/ops.h's contract (gradients ADD unless it
    // says overwritten). A backend that has not implemented one leaves it NULL (backend_check_training).
    void (*zero)(const Backend *be, void *p, size_t bytes);
    void (*embedding_backward)(const Backend *be, float *dtable, const float *dout, const int32_t *tokens, int64_t N,
                               int64_t C);
    void (*rmsnorm_backward)(const Backend *be, float *dinp, float *dweight, const float *dout, const float *inp,
                             const void *weight, DType wt, int64_t N, int64_t C, float eps, float offset);
    void (*matmul_backward)(const Backend *be, float *dinp, float *dweight, float *dbias, const void *dout,
                            const void *inp, const void *weight, DType dt, int64_t N, int64_t C, int64_t OC);
    void (*rope_backward)(const Backend *be, float *dx, const float *cs, int64_t N, int n_heads, int D);
    void (*attention_backward)(const Backend *be, float *dq, float *dk, float *dv, const float *dout,
                               const float *out, const float *lse, const float *q, const float *k, const float *v,
                               const int64_t *seq_off, int B, int64_t N, AttnShape a, float *scratch);
    void (*glu_backward)(const Backend *be, float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, int64_t n, GluAct act);
    // LayerNorm with fp32 weight and bias, and GELU (erf form): a vision-language model's patch merger, trained
    // with the language model (actor.vision.train_merger).
    void (*layernorm_forward)(const Backend *be, float *out, const float *inp, const float *weight, const float *bias,
                              int64_t N, int64_t C, float eps);
    void (*layernorm_backward)(const Backend *be, float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int64_t N, int64_t C, float eps);
    void (*gelu_forward)(const Backend *be, float *out, const float *inp, int64_t n);
    void (*gelu_backward)(const Backend *be, float *dinp, const float *dout, const float *inp, int64_t n);
    void (*logprob_backward)(const Backend *be, float *dh, float *dW, float *out, const float *dlogp,
                             const float *dent, const float *h, const void *W, DType wt, const int32_t *targets,
                             int64_t N, int64_t C, int64_t V, float *scratch);
    // fp32 C (M,N) = alpha * op(A) @ op(B) [+ C when accumulate] (nn/gemm.h without bias): LoRA's products.
    void (*gemm)(const Backend *be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 int64_t lda, const float *B, int64_t ldb, int accumulate, float *C, int64_t ldc);
    // dst row i (width floats) = src row rows[i] * scale, for i < n (the head's rows that have targets).
    void (*gather_rows)(const Backend *be, float *dst, const float *src, const int64_t *rows, int64_t n,
                        int64_t width, float scale);
    // dst row rows[i] = src row i * scale, for i < n; dst's other rows are untouched.
    void (*scatter_rows)(const Backend *be, float *dst, const float *src, const int64_t *rows, int64_t n,
                         int64_t width, float scale);
    // Optimizer (nn/optim.h) on n floats of a slab: AdamW, the L2 norm, whether all are finite, scaling, and
    // rounding values to bf16/fp16 in fp32 storage (fp16 gradients, an fp16 compute copy).
    void (*adamw)(const Backend *be, const AdamW *o, float *p, const float *g, float *m, float *v, size_t n,
                  double wd, int64_t t);
    // AdamW (as adamw) whose moments m, v (n floats each) are host memory from host_alloc: a device's offloaded
    // moments. They stream through stage[0] and stage[1] (2 chunk floats of the backend's memory each: a chunk of m,
    // then of v) on copy streams of their own, chunk i + 1 going up and chunk i - 1 coming down while chunk i's AdamW
    // runs; they are back in m, v when it returns. The CPU steps m, v in place.
    void (*adamw_host_moments)(const Backend *be, const AdamW *o, float *p, const float *g, float *m, float *v,
                               size_t n, double wd, int64_t t, float *const stage[2], size_t chunk);
    double (*grad_norm)(const Backend *be, const float *g, size_t n);
    int (*all_finite)(const Backend *be, const float *g, size_t n);
    void (*scale)(const Backend *be, float *g, size_t n, float s);
    void (*round_values)(const Backend *be, float *dst, const float *src, size_t n, DType d);

    // Collectives among processes on the backend's memory (a GPU's, through NCCL); NULL where it has none (the CPU;
    // the emulated device), and then ranks cross through host copies and MPI. dist_key: this device's identity
    // (BACKEND_DIST_KEY_BYTES; ranks with one key share a GPU, which NCCL refuses). dist_id: a new communicator's id
    // (BACKEND_DIST_ID_BYTES, made by rank 0 and shared by the caller), or 0 with the reason in why (n bytes) when the
    // collective library does not load. dist_init: this process joins as `rank` of `size`; every collective then
    // waits at most timeout_s (<= 0: forever) and ends the job with one line naming `what` past it, or on the
    // library's asynchronous error. Shards are comm_shard's (parallel/comm.h), of different sizes by one at most.
    void (*dist_key)(const Backend *be, void *key);
    int (*dist_id)(const Backend *be, void *id, char *why, size_t n);
    void (*dist_init)(const Backend *be, const void *id, int rank, int size, double timeout_s);
    // buf (n) <- its mean over the ranks, the same bits on every rank.
    void (*dist_allreduce_mean)(const Backend *be, float *buf, size_t n, const char *what);
    // buf[lo, hi) <- the mean over the ranks of buf[lo, hi), on the rank whose shard [lo, hi) is; buf's other
    // elements are left as they were.
    void (*dist_reduce_scatter_mean)(const Backend *be, float *buf, size_t n, const char *what);
    // buf's shard of each rank, from that rank to every other (in place).
    void (*dist_allgather)(const Backend *be, float *buf, size_t n, const char *what);
    void (*close)(const Backend *be);
};
#define BACKEND_DIST_KEY_BYTES 16
#define BACKEND_DIST_ID_BYTES 128

// The CPU backend (host memory, nn/ops.h): a constant, nothing to close.
const Backend *backend_cpu(void);
// "cpu-staged": the CPU backend's ops and memory behind on_device = 1 (every crossing an explicit copy), a test device
// for the seam whose results must equal the CPU's bit for bit; a constant too.
const Backend *backend_cpu_staged(void);
// "cpu", "cuda", "cuda:N", "emu" or "cpu-staged". Dies with one clear line (naming `what`, e.g. "--device") when
// the spec is unknown, the build has no CUDA (or no emulator), or no such GPU is visible.
const Backend *backend_open(const char *spec, const char *what);
void backend_close(const Backend *be);
// The training ops be lacks, as a ", "-separated list of their names into buf ("" when it has them all):
// a run that trains checks it before any work starts.
void backend_missing_training_ops(const Backend *be, char *buf, size_t n);
// Dies with one line naming `what` (the option that chose be) when be lacks training ops.
void backend_require_training(const Backend *be, const char *what);
// Dies with one line when be takes bf16 weights only and the weights `option` sets (a compute copy, a frozen base,
// a reference) would be d: "`what` NAME computes in bf16: set `option` to bf16".
void backend_require_bf16(const Backend *be, const char *what, const char *option, DType d);
// How many CUDA GPUs a --device cuda run could use: 0 without CUDA in the build, a driver or a GPU; -1
// when the build has CUDA and it cannot be used (its module does not load, a driver older than its
// runtime). The reason for 0 or -1 goes into why (n bytes): the loader's or CUDA's own words.
int backend_cuda_devices(char *why, size_t n);

// An arena of `bytes` in be's memory; backend_arena_free releases it.
void backend_arena_init(const Backend *be, Arena *a, size_t bytes);
void backend_arena_free(const Backend *be, Arena *a);

// Memory for a KV cache that its sequences fill as they grow (zeroed). On the CPU, `bytes` of address space
// whose pages are committed when first written: *on_demand = 1, and backend_kv_release gives pages back. On a
// device, held whole from the start (*on_demand = 0; backend_kv_release does nothing).
void *backend_kv_reserve(const Backend *be, size_t bytes, int *on_demand);
// Gives back the memory of the whole pages within [p, p + bytes) of a reservation (reads there see zeros after).
void backend_kv_release(const Backend *be, void *p, size_t bytes);
void backend_kv_free(const Backend *be, void *p, size_t bytes);

// The CUDA backend: every op of backend/backend.h on one GPU and one stream. GEMMs go through cuBLASLt
// (bf16 operands, fp32 accumulation and output, the bias widened to fp32 and fused as an epilogue when
// cuBLASLt offers one); the rest are our own kernels, fp32 in registers, as on the CPU. Weights are bf16:
// a GPU model is a BF16 slab. Activations, the KV cache and log-probs stay fp32, as on the CPU.
//
// This text is compiled twice: by nvcc for the GPU (cuda.cu: cuBLASLt, the device count, cuda_backend_open) and as
// host C++ for the emulated device (emu.cpp with emu.h: --device emu, where the GEMM is the CPU's). So everything
// here is CUDA's runtime API and kernels launched through LAUNCH; what differs is the includer's:
//   gemm_new(c), gemm_free(c), gemm_bf16(...), gemm_ex(...), dist_free(c)  (below), and the table's dist_* entries
//   (NCCL's collectives, set by cuda.cu alone).
#ifdef GRPO_EMU
#include "cuda/emu.h"
#define LAUNCH EMU_LAUNCH
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define OPS_HOST_DEVICE __host__ __device__  // nn/ops.h's functions that kernels call too

extern "C" {
#include "base/util.h"
#include "cuda/cuda_backend.h"
#include "nn/ops.h"
}

#define CK(call) cuda_check((call), #call, __FILE__, __LINE__)

static void cuda_check(cudaError_t e, const char *what, const char *file, int line) {
    if (e != cudaSuccess) die("CUDA: %s failed at %s:%d: %s", what, file, line, cudaGetErrorString(e));
}

#ifndef GRPO_EMU
// kernel<<<grid, block, smem, stream>>>(...), its launch error checked.
#define LAUNCH(kernel, grid, block, smem, stream, ...)                             \
    do {                                                                           \
        kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__);                \
        cuda_check(cudaGetLastError(), "launching " #kernel, __FILE__, __LINE__); \
    } while (0)
#endif

// ---------------------------------------------------------------------------------------------
// state

#define REDUCE_BLOCKS 256   // grad_norm / all_finite: blocks of the first pass, each a partial sum
#define REDUCE_THREADS 256

typedef struct {
    Backend be;
    char name[24];
    int ordinal;
    cudaStream_t stream;
    cudaStream_t up, down;  // adamw_host_moments' copies: chunks going up, and coming back down
    cudaEvent_t went_up[2], stepped[2], came_down[2];  // per staging buffer: its chunk is up, stepped, back down
    cudaEvent_t entered;  // adamw_host_moments' start on the main stream (the staging buffers' zeroing before it)
    void *gemm;         // the includer's GEMM state (cuBLASLt's handle, workspace and plans; none on the emulator)
    void *dist;         // the includer's collectives (NCCL, once a run joins a communicator; none on the emulator)
    int bias_epilogue;  // 0: biases added by k_bias, not the GEMM's epilogue (GRPO_CUDA_BIAS_EPILOGUE=0)
    float *bias32;      // matmul: the bias widened to fp32, the epilogue's documented type
    int64_t bias_cap;
    double *u;  // sampler: (rows) draws, ids and log-probs
    int32_t *ids;
    float *lps;
    int rows_cap;
    void *rows;  // training: per-row statistics (norms' 1/rms, mean and 1/std; attention's rowsum(dO * O))
    size_t rows_bytes;
    double *partial;  // grad_norm / all_finite: REDUCE_BLOCKS block partials, then their sum
    struct {          // cu_alloc's blocks (cudaFree does not say a size): bytes held now and at most
        void **p;
        size_t *bytes, n, cap, in_use, peak;
    } held;
} Cuda;

// The includer's GEMM: out (N, OC) fp32 = inp (N, C) bf16 @ weight (OC, C)^T bf16, fp32 accumulation; with bias32
// (OC, fp32) it may add the bias as an epilogue, and says so by returning 1 (0: the caller adds it).
static void gemm_new(Cuda *c);
static void gemm_free(Cuda *c);
// The device memory gemm_new took for its libraries' workspaces (not through cu_alloc).
static size_t gemm_workspace_bytes(void);
static int gemm_bf16(Cuda *c, float *out, const void *inp, const void *weight, const float *bias32, int64_t N,
                     int64_t C, int64_t OC);
// nn/gemm.h's gemm without bias: C (M,N) fp32 = alpha op(A) (M,K) @ op(B) (K,N) [+ C when accumulate], row-major;
// A and B bf16 when bf16, else fp32 (LoRA's products, every backward's).
static void gemm_ex(Cuda *c, int bf16, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                    int64_t lda, const void *B, int64_t ldb, int accumulate, float *C, int64_t ldc);
// Releases c->dist (the communicator), if any.
static void dist_free(Cuda *c);

// The backend's state, its device made the calling thread's current one: every entry point of the table starts
// here, since the host thread calling it (a server's engine thread, say) need not be the one that opened it.
static Cuda *use(const Backend *be) {
    Cuda *c = (Cuda *)be->ctx;
    CK(cudaSetDevice(c->ordinal));
    return c;
}

static unsigned blocks_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);  // kernels loop (grid-stride) past that
}

// ---------------------------------------------------------------------------------------------
// memory

static void *cu_alloc(const Backend *be, size_t bytes) {
    Cuda *c = use(be);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        size_t free_b = 0, total = 0;
        if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) free_b = total = 0;
        die("%s: out of memory allocating %zu MB (%zu of %zu MB free)", be->name, bytes >> 20, free_b >> 20,
            total >> 20);
    }
    CK(cudaMemsetAsync(p, 0, bytes ? bytes : 1, c->stream));
    if (c->held.n == c->held.cap) {
        c->held.cap = c->held.cap ? 2 * c->held.cap : 64;
        c->held.p = (void **)xrealloc(c->held.p, c->held.cap * sizeof *c->held.p);
        c->held.bytes = (size_t *)xrealloc(c->held.bytes, c->held.cap * sizeof *c->held.bytes);
    }
    c->held.p[c->held.n] = p;
    c->held.bytes[c->held.n++] = bytes;
    c->held.in_use += bytes;
    if (c->held.in_use > c->held.peak) c->held.peak = c->held.in_use;
    return p;
}

static void cu_free(const Backend *be, void *p) {
    Cuda *c = use(be);
    if (!p) return;
    CK(cudaStreamSynchronize(c->stream));
    CK(cudaFree(p));
    for (size_t i = c->held.n; i-- > 0;)  // the newest first: workspaces come and go
        if (c->held.p[i] == p) {
            c->held.in_use -= c->held.bytes[i];
            c->held.n--;
            c->held.p[i] = c->held.p[c->held.n];
            c->held.bytes[i] = c->held.bytes[c->held.n];
            return;
        }
    die("internal: %s: freeing %p, which it did not allocate", be->name, p);
}

static void *cu_host_alloc(const Backend *be, size_t bytes) {
    use(be);
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess)
        die("%s: cannot pin %zu MB of host memory (for the offloaded Adam moments)", be->name, bytes >> 20);
    memset(p, 0, bytes);
    return p;
}

static void cu_host_free(const Backend *be, void *p) {
    use(be);
    if (p) CK(cudaFreeHost(p));
}

// rows: the largest per-row statistics (attention's delta, a float per row and head; LayerNorm's two doubles; the
// sampler's draw, id and log-prob), the widened bias, the reduction's partials, the GEMM libraries' workspaces.
static size_t cu_memory_own(const Backend *be, int64_t rows, int heads, int64_t width) {
    (void)be;
    int64_t per_row = heads * 4 > 16 ? heads * 4 : 16;
    return (size_t)(rows * per_row + rows * 16 + width * 4) + (REDUCE_BLOCKS + 1) * sizeof(double) +
           gemm_workspace_bytes();
}

static size_t cu_memory_peak(const Backend *be) { return ((Cuda *)be->ctx)->held.peak; }

static size_t cu_memory_held(const Backend *be) { return ((Cuda *)be->ctx)->held.in_use; }

static void cu_memory_info(const Backend *be, size_t *free_bytes, size_t *total_bytes) {
    use(be);
    CK(cudaMemGetInfo(free_bytes, total_bytes));
}

// From pageable memory cudaMemcpyAsync returns once the host bytes are staged: the caller may reuse them.
static void cu_upload(const Backend *be, void *dst, const void *src, size_t bytes) {
    Cuda *c = use(be);
    if (bytes) CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
}

static void cu_download(const Backend *be, void *dst, const void *src, size_t bytes) {
    Cuda *c = use(be);
    if (bytes) CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CK(cudaStreamSynchronize(c->stream));
}

// The backend's buffer *p of *cap bytes, made at least `bytes` long (its contents are not kept).
static void *grow(const Backend *be, void **p, size_t *cap, size_t bytes) {
    if (bytes > *cap) {
        cu_free(be, *p);
        *cap = bytes;
        *p = cu_alloc(be, bytes);
    }
    return *p;
}

static void cu_copy(const Backend *be, void *dst, const void *src, size_t bytes) {
    Cuda *c = use(be);
    if (bytes && dst != src) CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

// ---------------------------------------------------------------------------------------------
// reductions (blockDim.x a multiple of 32, at most 1024)

__device__ float warp_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ double warp_sum_d(double v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The block's sum of v, returned to every thread.
__device__ double block_sum_d(double v) {
    __shared__ double sh[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();  // sh may still be read from the previous call
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : 0.0;
    if (w == 0) v = warp_sum_d(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    return sh[0];
}

__device__ float block_max(float v) {
    __shared__ float sh[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : -INFINITY;
    if (w == 0) v = warp_max(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    return sh[0];
}

// The lowest index holding the block's largest value (each thread passes its own best pair).
__device__ int64_t block_argmax(float v, int64_t idx) {
    __shared__ float sv[32];
    __shared__ int64_t si[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx)) v = ov, idx = oi;
    }
    __syncthreads();
    if (lane == 0) sv[w] = v, si[w] = idx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < (int)(blockDim.x >> 5); k++)
            if (sv[k] > sv[0] || (sv[k] == sv[0] && si[k] < si[0])) sv[0] = sv[k], si[0] = si[k];
    }
    __syncthreads();
    return si[0];
}

// ---------------------------------------------------------------------------------------------
// element-wise ops

#define FOR_EACH(i, n) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

__global__ void k_round_bf16(const float *x, __nv_bfloat16 *y, int64_t n) {
    FOR_EACH(i, n) y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void k_embedding(float *out, const int32_t *tokens, const __nv_bfloat16 *table, int64_t N, int64_t C) {
    FOR_EACH(e, N * C) out[e] = __bfloat162float(table[(int64_t)tokens[e / C] * C + e % C]);
}

__global__ void k_rope_table(float *cs, const int32_t *pos, int64_t N, int D, RopeFreqs f) {
    int half = D / 2;
    FOR_EACH(e, N * half) {
        int64_t i = e / half;
        int j = (int)(e % half);
        // In double, as on the CPU; as a multiple of pi, whose reduction needs no local memory (cos and sin of
        // large arguments reduce through a table on the stack). Within 2e-11 of the CPU's angle below position
        // 131072 (3e-16 of it), far below float's ulp.
        double turns = (double)pos[i] * (rope_inv_freq(f, j, D) / M_PI), s, c;
        sincospi(turns, &s, &c);
        cs[i * D + j] = (float)c;
        cs[i * D + half + j] = (float)s;
    }
}

// sign -1: the inverse rotation (the backward: a rotation's transpose).
__global__ void k_rope(float *x, const float *cs, int64_t N, int n_heads, int D, float sign) {
    int half = D / 2;
    FOR_EACH(e, N * n_heads * half) {
        int64_t i = e / ((int64_t)n_heads * half);
        int j = (int)(e % half);
        float *v = x + (e / half) * D;  // row i, head (e / half) % n_heads
        float c = cs[i * D + j], s = sign * cs[i * D + half + j], a = v[j], b = v[j + half];
        v[j] = a * c - b * s;
        v[j + half] = b * c + a * s;
    }
}

__global__ void k_glu(float *out, const float *gate, const float *up, int64_t n, GluAct act) {
    FOR_EACH(i, n) {
        float g = gate[i];
        out[i] = (act == GLU_SILU ? g / (1.0f + expf(-g)) : gelu_tanh(g)) * up[i];
    }
}

__global__ void k_residual(float *x, const float *y, int64_t n) {
    FOR_EACH(i, n) x[i] += y[i];
}

__global__ void k_widen_bf16(const __nv_bfloat16 *x, float *y, int64_t n) {
    FOR_EACH(i, n) y[i] = __bfloat162float(x[i]);
}

__global__ void k_bias(float *out, const float *bias, int64_t N, int64_t OC) {
    FOR_EACH(e, N * OC) out[e] += bias[e % OC];
}

// A KV cache of fp32 (kv16 0) or bf16 (1, rounded to nearest even) elements.
__device__ void kv_put(void *cache, int kv16, int64_t i, float x) {
    if (kv16)
        ((__nv_bfloat16 *)cache)[i] = __float2bfloat16_rn(x);
    else
        ((float *)cache)[i] = x;
}

__device__ float kv_get(const void *cache, int kv16, int64_t i) {
    return kv16 ? __bfloat162float(((const __nv_bfloat16 *)cache)[i]) : ((const float *)cache)[i];
}

__global__ void k_kv_append(void *kc, void *vc, int kv16, const float *k, const float *v, const int64_t *dst, int B,
                            int64_t row) {
    FOR_EACH(e, B * row) {
        int64_t b = e / row, c = e % row;
        kv_put(kc, kv16, dst[b] + c, k[e]);
        kv_put(vc, kv16, dst[b] + c, v[e]);
    }
}

// One block a row: out = x / rms(x) * (offset + w).
__global__ void k_rmsnorm(float *out, const float *inp, const __nv_bfloat16 *w, int64_t C, float eps, float offset) {
    const float *x = inp + blockIdx.x * C;
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) ss += (double)x[j] * x[j];
    ss = block_sum_d(ss);
    float r = (float)(1.0 / sqrt(ss / (double)C + eps));
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
        out[blockIdx.x * C + j] = x[j] * r * (offset + __bfloat162float(w[j]));
}

static void need_bf16(const Backend *be, DType dt, const char *op) {
    if (dt != DTYPE_BF16) die("internal: %s on %s with %s weights (a GPU model is bf16)", op, be->name, dtype_name(dt));
}

static void cu_round_operand(const Backend *be, DType dt, const float *x, void *dst, int64_t n) {
    Cuda *c = use(be);
    need_bf16(be, dt, "round_operand");
    LAUNCH(k_round_bf16, blocks_for(n, 256), 256, 0, c->stream, x, (__nv_bfloat16 *)dst, n);
}

static void cu_embedding(const Backend *be, float *out, const int32_t *tokens, const void *table, DType wt, int64_t N,
                         int64_t C) {
    Cuda *c = use(be);
    need_bf16(be, wt, "embedding");
    LAUNCH(k_embedding, blocks_for(N * C, 256), 256, 0, c->stream, out, tokens, (const __nv_bfloat16 *)table, N, C);
}

static void cu_rmsnorm(const Backend *be, float *out, const float *inp, const void *weight, DType wt, int64_t N,
                       int64_t C, float eps, float offset) {
    Cuda *c = use(be);
    need_bf16(be, wt, "rmsnorm");
    if (N == 0) return;
    LAUNCH(k_rmsnorm, (unsigned)N, 256, 0, c->stream, out, inp, (const __nv_bfloat16 *)weight, C, eps, offset);
}

static void cu_rope_table(const Backend *be, float *cs, const int32_t *pos, int64_t N, int D, RopeFreqs f) {
    Cuda *c = use(be);
    LAUNCH(k_rope_table, blocks_for(N * (D / 2), 256), 256, 0, c->stream, cs, pos, N, D, f);
}

static void cu_rope(const Backend *be, float *x, const float *cs, int64_t N, int n_heads, int D) {
    Cuda *c = use(be);
    LAUNCH(k_rope, blocks_for(N * n_heads * (D / 2), 256), 256, 0, c->stream, x, cs, N, n_heads, D, 1.0f);
}

static void cu_glu(const Backend *be, float *out, const float *gate, const float *up, int64_t n, GluAct act) {
    Cuda *c = use(be);
    LAUNCH(k_glu, blocks_for(n, 256), 256, 0, c->stream, out, gate, up, n, act);
}

static void cu_residual(const Backend *be, float *x, const float *y, int64_t n) {
    Cuda *c = use(be);
    LAUNCH(k_residual, blocks_for(n, 256), 256, 0, c->stream, x, y, n);
}

// A KV cache's dtype as the kernels' kv16 flag (dies on one they do not read).
static int kv16_of(const Backend *be, DType kv_dt) {
    if (kv_dt != DTYPE_F32 && kv_dt != DTYPE_BF16)
        die("%s: a %s KV cache is not supported (fp32 or bf16)", be->name, dtype_name(kv_dt));
    return kv_dt == DTYPE_BF16;
}

static void cu_kv_append(const Backend *be, void *k_cache, void *v_cache, DType kv_dt, const float *k,
                         const float *v, const int64_t *dst, int B, int64_t row) {
    Cuda *c = use(be);
    int kv16 = kv16_of(be, kv_dt);
    LAUNCH(k_kv_append, blocks_for(B * row, 256), 256, 0, c->stream, k_cache, v_cache, kv16, k, v, dst, B, row);
}

// ---------------------------------------------------------------------------------------------
// matmul: the includer's GEMM (cuBLASLt on the GPU)

// The bf16 bias (OC) widened into the backend's fp32 bias buffer, which it returns.
static const float *widen_bias(const Backend *be, const void *bias, int64_t OC) {
    Cuda *c = use(be);
    if (OC > c->bias_cap) {
        cu_free(be, c->bias32);
        c->bias_cap = OC;
        c->bias32 = (float *)cu_alloc(be, (size_t)OC * sizeof(float));
    }
    LAUNCH(k_widen_bf16, blocks_for(OC, 256), 256, 0, c->stream, (const __nv_bfloat16 *)bias, c->bias32, OC);
    return c->bias32;
}

static void cu_matmul(const Backend *be, float *out, const void *inp, const void *weight, const void *bias, DType dt,
                      int64_t N, int64_t C, int64_t OC) {
    Cuda *c = use(be);
    need_bf16(be, dt, "matmul");
    if (N == 0) return;
    const float *b32 = bias ? widen_bias(be, bias, OC) : NULL;
    int fused = gemm_bf16(c, out, inp, weight, c->bias_epilogue ? b32 : NULL, N, C, OC);
    if (b32 && !fused) LAUNCH(k_bias, blocks_for(N * OC, 256), 256, 0, c->stream, out, b32, N, OC);
}

// ---------------------------------------------------------------------------------------------
// attention

#define ATT_TK 32      // keys per shared-memory tile
#define ATT_DMAX CUDA_ATT_DMAX  // head_dim supported (any up to it)
#define ATT_GMAX 16    // query heads per kv head supported
// k_attend's static shared memory within the 48 KiB a block gets without opting in (the emulator cannot see it)
static_assert(sizeof(float) * (2 * ATT_TK * (ATT_DMAX + 1) + ATT_GMAX * ATT_DMAX) <= 48 * 1024,
              "k_attend's shared tiles exceed 48 KiB");

// The sequence b holding packed row i: seq_off[b] <= i < seq_off[b + 1].
__device__ int seq_of(const int64_t *seq_off, int B, int64_t i) {
    int lo = 0, hi = B;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (seq_off[mid] <= i) lo = mid;
        else hi = mid;
    }
    return lo;
}

// Keys and values t0 .. t0 + nt - 1 of one kv head (rows kvs elements apart from element `base`; bf16 with
// kv16) into the block's shared tiles.
__device__ void load_kv_tile(float (*Ks)[ATT_DMAX + 1], float (*Vs)[ATT_DMAX + 1], const void *k, const void *v,
                             int kv16, int64_t base, int64_t t0, int nt, int D, int64_t kvs) {
    for (int e = threadIdx.x; e < nt * D; e += blockDim.x) {
        int j = e / D, d = e % D;
        Ks[j][d] = kv_get(k, kv16, base + (t0 + j) * kvs + d);
        Vs[j][d] = kv_get(v, kv16, base + (t0 + j) * kvs + d);
    }
}

// One block per (query row, kv head), one warp per query head of the group: each tile of keys and
// values is read from memory once for all heads of the group. Online softmax over the tiles. Lane l
// accumulates head dimensions CUDA_ATT_DIM(l, r) < D (cuda_backend.h), so any D up to ATT_DMAX works.
// Prefill (seq_off): row i attends to its sequence's rows up to itself, keys packed like the queries.
// Decode (kv_off, n_keys): row i attends to n_keys[i] cached positions from element kv_off[i] (bf16 with kv16).
// Both read only the last a.window of those keys when a.window > 0.
// lse (rows, H), may be NULL: each row's log-sum-exp of its scaled scores (training's backward).
__global__ void __launch_bounds__(32 * ATT_GMAX)
k_attend(float *out, float *lse, const float *q, const void *k, const void *v, int kv16, const int64_t *seq_off,
         int B, const int64_t *kv_off, const int32_t *n_keys, AttnShape a) {
    __shared__ float Ks[ATT_TK][ATT_DMAX + 1], Vs[ATT_TK][ATT_DMAX + 1], Qs[ATT_GMAX][ATT_DMAX];
    int H = a.H, KVH = a.KVH, D = a.D;
    int64_t i = blockIdx.x, kvs = (int64_t)KVH * D, qs = (int64_t)H * D, start, nk;
    int g = blockIdx.y, group = H / KVH, w = threadIdx.x >> 5, lane = threadIdx.x & 31, h = g * group + w;
    if (seq_off) {
        int b = seq_of(seq_off, B, i);
        start = seq_off[b] * kvs;
        nk = i - seq_off[b] + 1;
    } else {
        start = kv_off[i];
        nk = n_keys[i];
    }
    int64_t first = attn_first_key(nk - 1, a.window);  // row i is the newest of its nk keys
    start += first * kvs;
    nk -= first;
    int64_t base = start + (int64_t)g * D;
    float scale = a.scale, m = -INFINITY, l = 0.0f, acc[CUDA_ATT_DREGS];
#pragma unroll
    for (int r = 0; r < CUDA_ATT_DREGS; r++) acc[r] = 0.0f;
    for (int d = lane; d < D; d += 32) Qs[w][d] = q[i * qs + (int64_t)h * D + d] * scale;
    for (int64_t t0 = 0; t0 < nk; t0 += ATT_TK) {
        int nt = nk - t0 < ATT_TK ? (int)(nk - t0) : ATT_TK;
        __syncthreads();  // Qs written; the previous tile consumed
        load_kv_tile(Ks, Vs, k, v, kv16, base, t0, nt, D, kvs);
        __syncthreads();
        float s = -INFINITY;
        if (lane < nt) {
            s = 0.0f;
            for (int d = 0; d < D; d++) s += Qs[w][d] * Ks[lane][d];
        }
        float m_new = fmaxf(m, warp_max(s));  // finite: every tile has a key
        float corr = expf(m - m_new), p = lane < nt ? expf(s - m_new) : 0.0f;
        l = l * corr + warp_sum(p);
#pragma unroll
        for (int r = 0; r < CUDA_ATT_DREGS; r++) acc[r] *= corr;
        for (int j = 0; j < nt; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
            for (int r = 0; r < CUDA_ATT_DREGS; r++) {
                int d = CUDA_ATT_DIM(lane, r);
                if (d < D) acc[r] += pj * Vs[j][d];
            }
        }
        m = m_new;
    }
#pragma unroll
    for (int r = 0; r < CUDA_ATT_DREGS; r++) {
        int d = CUDA_ATT_DIM(lane, r);
        if (d < D) out[i * qs + (int64_t)h * D + d] = acc[r] / l;
    }
    if (lse && lane == 0) lse[i * H + h] = m + logf(l);
}

static void attention_shape(const Backend *be, AttnShape a) {
    if (a.D < 1 || a.D > ATT_DMAX || a.KVH < 1 || a.H % a.KVH || a.H / a.KVH > ATT_GMAX || a.window < 0)
        die("%s: attention with head_dim %d, %d query heads, %d kv heads and window %lld is not supported (head_dim "
            "up to %d, at most %d query heads per kv head, a window >= 0)", be->name, a.D, a.H, a.KVH,
            (long long)a.window, ATT_DMAX, ATT_GMAX);
}

static void attend(const Backend *be, float *out, float *lse, const float *q, const void *k, const void *v,
                   int kv16, const int64_t *seq_off, int B, const int64_t *kv_off, const int32_t *n_keys,
                   int64_t rows, AttnShape a) {
    Cuda *c = use(be);
    attention_shape(be, a);
    if (rows == 0) return;
    dim3 grid((unsigned)rows, (unsigned)a.KVH);
    LAUNCH(k_attend, grid, 32 * (a.H / a.KVH), 0, c->stream, out, lse, q, k, v, kv16, seq_off, B, kv_off, n_keys,
           a);
}

static void cu_attention(const Backend *be, float *out, float *lse, const float *q, const float *k, const float *v,
                         const int64_t *seq_off, int B, int64_t N, AttnShape a, float *scratch) {
    (void)scratch;
    attend(be, out, lse, q, k, v, 0, seq_off, B, NULL, NULL, N, a);
}

static void cu_attention_decode(const Backend *be, float *out, const float *q, const void *k_cache,
                                const void *v_cache, DType kv_dt, const int64_t *kv_off, const int32_t *n_keys,
                                int B, AttnShape a, float *scratch) {
    (void)scratch;
    attend(be, out, NULL, q, k_cache, v_cache, kv16_of(be, kv_dt), NULL, 0, kv_off, n_keys, B, a);
}

// ---------------------------------------------------------------------------------------------
// log-prob head and sampler

#define LOGPROB_THREADS 1024

// A row's largest logit mx, sum_j e^(z_j - mx) and, with want_sz (the entropy), sz = sum_j e^(z_j - mx) (z_j - mx)
// (else 0): every thread of the block gets them.
typedef struct {
    float mx;
    double sum, sz;
} RowSums;

__device__ RowSums row_sums(const float *z, int64_t V, int want_sz) {
    RowSums r;
    r.mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) r.mx = fmaxf(r.mx, z[j]);
    r.mx = block_max(r.mx);
    double s = 0.0, w = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        float d = z[j] - r.mx, e = expf(d);
        s += e;
        if (want_sz) w += (double)e * (double)d;
    }
    r.sum = block_sum_d(s);
    r.sz = want_sz ? block_sum_d(w) : 0.0;
    return r;
}

// ent, may be NULL: each row's entropy, log sum - sz / sum.
__global__ void __launch_bounds__(LOGPROB_THREADS)
k_logprob_rows(float *out, float *ent, const float *logits, const int32_t *targets, int64_t V) {
    int64_t r = blockIdx.x;
    int32_t t = targets[r];
    if (t < 0 || t >= V) {  // the whole block leaves together; an id past the vocabulary (unchecked input) is NaN
        if (threadIdx.x == 0) out[r] = t < 0 ? 0.0f : NAN;
        if (threadIdx.x == 0 && ent) ent[r] = t < 0 ? 0.0f : NAN;
        return;
    }
    const float *z = logits + r * V;
    RowSums rs = row_sums(z, V, ent != NULL);
    if (threadIdx.x == 0) out[r] = (float)((double)(z[t] - rs.mx) - log(rs.sum));
    if (threadIdx.x == 0 && ent) ent[r] = (float)(log(rs.sum) - rs.sz / rs.sum);
}

static void cu_logprob(const Backend *be, float *out, float *ent, const float *h, const void *W, DType wt,
                       const int32_t *targets, int64_t N, int64_t C, int64_t V, float *scratch) {
    Cuda *c = use(be);
    need_bf16(be, wt, "logprob_forward");
    __nv_bfloat16 *h16 = (__nv_bfloat16 *)(scratch + (size_t)LOGPROB_CHUNK * (size_t)V);  // cu_logprob_scratch
    for (int64_t i0 = 0; i0 < N; i0 += LOGPROB_CHUNK) {
        int64_t rows = N - i0 < LOGPROB_CHUNK ? N - i0 : LOGPROB_CHUNK;
        cu_round_operand(be, wt, h + i0 * C, h16, rows * C);
        cu_matmul(be, scratch, h16, W, NULL, wt, rows, C, V);
        float *e = ent ? ent + i0 : NULL;
        LAUNCH(k_logprob_rows, (unsigned)rows, LOGPROB_THREADS, 0, c->stream, out + i0, e, scratch, targets + i0, V);
    }
}

#define SAMPLE_THREADS 1024

// A row's unnormalised probabilities p_j = e^((z_j - mx) / T), computed where they are needed (the same float
// operations each time, so the same bits) instead of kept in a (rows, V) buffer.
typedef struct {
    const float *z;
    float mx, inv_t;
} Probs;

__device__ float prob(Probs P, int64_t j) { return expf((P.z[j] - P.mx) * P.inv_t); }

// Count (or mass) of the probabilities whose bits are >= t (probabilities are >= 0, so their bit
// patterns order like their values).
__device__ double mass_from(Probs P, int64_t V, uint32_t t, int count) {
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        float p = prob(P, j);
        if (__float_as_uint(p) >= t) s += count ? 1.0 : (double)p;
    }
    return block_sum_d(s);
}

// The largest threshold t in [lo, bits(1) + 1) with mass_from(t) >= want (count or probability mass).
__device__ uint32_t threshold(Probs P, int64_t V, uint32_t lo, double want, int count) {
    uint32_t hi = __float_as_uint(1.0f) + 1;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (mass_from(P, V, mid, count) >= want) lo = mid;
        else hi = mid;
    }
    return lo;
}

// One block a row. Greedy: the lowest id of the largest logit. Sampling: p = softmax(z / T), kept
// = those at or above the top-k threshold, then at or above the top-p one (ties at a threshold are all
// kept), and the first kept id whose running mass passes u * kept mass, in id order. The log-prob is
// log p(id) before truncation, as on the CPU.
__global__ void __launch_bounds__(SAMPLE_THREADS)
k_sample(const float *logits, int64_t V, float inv_t, int greedy, int top_k, float top_p, const double *u,
         int32_t *ids, float *lps) {
    __shared__ double seg_mass[SAMPLE_THREADS];
    __shared__ int64_t chosen;
    int64_t b = blockIdx.x;
    const float *z = logits + b * V;
    float best = -INFINITY;
    int64_t arg = V;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        if (z[j] > best) best = z[j], arg = j;  // j rises: the lowest id of the thread's best
    arg = block_argmax(best, arg);
    if (arg >= V) arg = 0;  // all NaN
    float mx = z[arg];
    Probs P = {z, mx, inv_t};
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += prob(P, j);
    double sum = block_sum_d(s);
    if (greedy) {
        if (threadIdx.x == 0) chosen = arg;
    } else {
        uint32_t t = 0;
        if (top_k > 0 && top_k < V) t = threshold(P, V, 0, (double)top_k, 1);
        if (top_p < 1.0f) {
            double kept = top_k > 0 ? mass_from(P, V, t, 0) : sum;
            t = threshold(P, V, t, top_p * kept, 0);
        }
        double mass = mass_from(P, V, t, 0), target = u[b] * mass;
        int64_t seg = (V + blockDim.x - 1) / blockDim.x, j0 = threadIdx.x * seg, j1 = j0 + seg < V ? j0 + seg : V;
        double ms = 0.0;
        for (int64_t j = j0; j < j1; j++) {
            float p = prob(P, j);
            if (__float_as_uint(p) >= t) ms += p;
        }
        seg_mass[threadIdx.x] = ms;
        __syncthreads();
        if (threadIdx.x == 0) {  // the segment the draw falls in, then the id within it
            int last_seg = 0;
            for (int k = 0; k < (int)blockDim.x; k++)
                if (seg_mass[k] > 0.0) last_seg = k;
            double c = 0.0;
            int64_t pick = arg;
            for (int k = 0; k <= last_seg; k++) {
                if (seg_mass[k] == 0.0) continue;
                if (c + seg_mass[k] <= target && k < last_seg) {
                    c += seg_mass[k];
                    continue;
                }
                // the crossing id, or the segment's last kept one if rounding keeps the walk below target
                for (int64_t j = k * seg; j < k * seg + seg && j < V; j++) {
                    float p = prob(P, j);
                    if (__float_as_uint(p) < t || p == 0.0f) continue;
                    pick = j;
                    if ((c += p) > target) break;
                }
                break;
            }
            chosen = pick;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        ids[b] = (int32_t)chosen;
        lps[b] = (float)((double)(z[chosen] - mx) * inv_t - log(sum));
    }
}

static void cu_sample(const Backend *be, const SamplerConfig *sc, const float *logits, int B, int64_t V,
                      const double *u, void *scr, int32_t *ids, float *logprobs) {
    (void)scr;
    Cuda *c = use(be);
    if (B == 0) return;
    if (B > c->rows_cap) {
        cu_free(be, c->u);
        cu_free(be, c->ids);
        cu_free(be, c->lps);
        c->rows_cap = B;
        c->u = (double *)cu_alloc(be, (size_t)B * sizeof(double));
        c->ids = (int32_t *)cu_alloc(be, (size_t)B * sizeof(int32_t));
        c->lps = (float *)cu_alloc(be, (size_t)B * sizeof(float));
    }
    int greedy = sc->temperature <= 0;
    float inv_t = greedy ? 1.0f : 1.0f / sc->temperature;
    if (!greedy) cu_upload(be, c->u, u, (size_t)B * sizeof(double));
    LAUNCH(k_sample, (unsigned)B, SAMPLE_THREADS, 0, c->stream, logits, V, inv_t, greedy, sc->top_k, sc->top_p, c->u,
           c->ids, c->lps);
    CK(cudaMemcpyAsync(ids, c->ids, (size_t)B * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream));
    cu_download(be, logprobs, c->lps, (size_t)B * sizeof(float));
}

// ---------------------------------------------------------------------------------------------
// training: every backward beside its forward, the LoRA GEMM, row gathers and the optimizer. Deterministic: no
// float atomics; a sum over rows runs in row order in one thread, a block's sum in block_sum_d's fixed tree.

static void cu_zero(const Backend *be, void *p, size_t bytes) {
    Cuda *c = use(be);
    if (bytes) CK(cudaMemsetAsync(p, 0, bytes, c->stream));
}

// One thread a column, the rows in order: rows that repeat a token add into the same row of dtable in turn.
__global__ void k_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int64_t N, int64_t C) {
    FOR_EACH(j, C) {
        for (int64_t i = 0; i < N; i++) dtable[(int64_t)tokens[i] * C + j] += dout[i * C + j];
    }
}

static void cu_embedding_backward(const Backend *be, float *dtable, const float *dout, const int32_t *tokens,
                                  int64_t N, int64_t C) {
    Cuda *c = use(be);
    LAUNCH(k_embedding_backward, blocks_for(C, 128), 128, 0, c->stream, dtable, dout, tokens, N, C);
}

// The per-row buffer (training's statistics), at least `bytes`.
static void *rows_buffer(const Backend *be, size_t bytes) {
    Cuda *c = use(be);
    return grow(be, &c->rows, &c->rows_bytes, bytes);
}

// One block a row. y = x r w with r = 1 / sqrt(mean(x^2) + eps) and w = offset + weight: dx += r (dy w) - x r^3
// mean(dy w x) (dinp may be NULL); r (float) into rstd[row] for the weight's gradient.
__global__ void k_rmsnorm_backward(float *dinp, float *rstd, const float *dout, const float *inp,
                                   const __nv_bfloat16 *w, int64_t C, float eps, float offset) {
    int64_t row = blockIdx.x;
    const float *x = inp + row * C, *dy = dout + row * C;
    double ss = 0.0, dot = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        ss += (double)x[j] * x[j];
        dot += (double)dy[j] * (offset + __bfloat162float(w[j])) * x[j];
    }
    ss = block_sum_d(ss);
    dot = block_sum_d(dot);
    double r = 1.0 / sqrt(ss / (double)C + eps);
    float a = (float)r, b = (float)(r * r * r * dot / (double)C);
    for (int64_t j = threadIdx.x; dinp && j < C; j += blockDim.x)
        dinp[row * C + j] += a * dy[j] * (offset + __bfloat162float(w[j])) - b * x[j];
    if (threadIdx.x == 0) rstd[row] = a;
}

// dweight (C) += sum over rows, in row order, of dy x r.
__global__ void k_rmsnorm_dweight(float *dweight, const float *dout, const float *inp, const float *rstd, int64_t N,
                                  int64_t C) {
    FOR_EACH(j, C) {
        float s = dweight[j];
        for (int64_t i = 0; i < N; i++) s += dout[i * C + j] * inp[i * C + j] * rstd[i];
        dweight[j] = s;
    }
}

static void cu_rmsnorm_backward(const Backend *be, float *dinp, float *dweight, const float *dout, const float *inp,
                                const void *weight, DType wt, int64_t N, int64_t C, float eps, float offset) {
    Cuda *c = use(be);
    need_bf16(be, wt, "rmsnorm_backward");
    if (N == 0) return;
    float *rstd = (float *)rows_buffer(be, (size_t)N * sizeof(float));
    LAUNCH(k_rmsnorm_backward, (unsigned)N, 256, 0, c->stream, dinp, rstd, dout, inp,
           (const __nv_bfloat16 *)weight, C, eps, offset);
    if (dweight) LAUNCH(k_rmsnorm_dweight, blocks_for(C, 128), 128, 0, c->stream, dweight, dout, inp, rstd, N, C);
}

// A row's mean and 1 / sqrt(variance + eps) in double, as LayerNorm normalises it; every thread gets them.
__device__ void row_moments(const float *x, int64_t C, float eps, double *mean, double *rstd) {
    double m = 0.0, var = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m += x[j];
    m = block_sum_d(m) / (double)C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) var += (x[j] - m) * (x[j] - m);
    var = block_sum_d(var);
    *mean = m;
    *rstd = 1.0 / sqrt(var / (double)C + eps);
}

// One block a row.
__global__ void k_layernorm(float *out, const float *inp, const float *w, const float *b, int64_t C, float eps) {
    const float *x = inp + blockIdx.x * C;
    double mean, rstd;
    row_moments(x, C, eps, &mean, &rstd);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
        out[blockIdx.x * C + j] = ((float)(x[j] - mean) * (float)rstd) * w[j] + b[j];
}

// One block a row: dx += rstd (g - mean(g) - xh mean(g xh)), g = dy w, xh = (x - mean) rstd (dinp may be NULL);
// the row's mean and rstd into stats[2 row], [2 row + 1] for the parameters' gradients.
__global__ void k_layernorm_backward(float *dinp, double *stats, const float *dout, const float *inp, const float *w,
                                     int64_t C, float eps) {
    int64_t row = blockIdx.x;
    const float *x = inp + row * C, *dy = dout + row * C;
    double mean, rstd, sg = 0.0, sgx = 0.0;
    row_moments(x, C, eps, &mean, &rstd);
    if (threadIdx.x == 0) stats[2 * row] = mean, stats[2 * row + 1] = rstd;
    if (!dinp) return;  // the same for the whole block
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        double g = (double)dy[j] * w[j];
        sg += g;
        sgx += g * (x[j] - mean) * rstd;
    }
    double mg = block_sum_d(sg) / (double)C, mgx = block_sum_d(sgx) / (double)C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
        dinp[row * C + j] += (float)(rstd * ((double)dy[j] * w[j] - mg - (x[j] - mean) * rstd * mgx));
}

// dweight, dbias (C) += sums over rows in row order, in double (each may be NULL).
__global__ void k_layernorm_params(float *dweight, float *dbias, const float *dout, const float *inp,
                                   const double *stats, int64_t N, int64_t C) {
    FOR_EACH(j, C) {
        double sw = 0.0, sb = 0.0;
        for (int64_t i = 0; i < N; i++) {
            float dy = dout[i * C + j];
            sw += dy * (inp[i * C + j] - stats[2 * i]) * stats[2 * i + 1];
            sb += dy;
        }
        if (dweight) dweight[j] += (float)sw;
        if (dbias) dbias[j] += (float)sb;
    }
}

static void cu_layernorm(const Backend *be, float *out, const float *inp, const float *weight, const float *bias,
                         int64_t N, int64_t C, float eps) {
    Cuda *c = use(be);
    if (N == 0) return;
    LAUNCH(k_layernorm, (unsigned)N, 256, 0, c->stream, out, inp, weight, bias, C, eps);
}

static void cu_layernorm_backward(const Backend *be, float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, int64_t N, int64_t C, float eps) {
    Cuda *c = use(be);
    if (N == 0) return;
    double *stats = (double *)rows_buffer(be, (size_t)N * 2 * sizeof(double));
    LAUNCH(k_layernorm_backward, (unsigned)N, 256, 0, c->stream, dinp, stats, dout, inp, weight, C, eps);
    if (dweight || dbias)
        LAUNCH(k_layernorm_params, blocks_for(C, 128), 128, 0, c->stream, dweight, dbias, dout, inp, stats, N, C);
}

__global__ void k_gelu(float *out, const float *inp, int64_t n) {
    FOR_EACH(i, n) out[i] = 0.5f * inp[i] * (1.0f + erff(inp[i] * 0.70710678118654752f));
}

// GELU'(x) = Phi(x) + x phi(x), in double; dinp may be dout.
__global__ void k_gelu_backward(float *dinp, const float *dout, const float *inp, int64_t n) {
    FOR_EACH(i, n) {
        double x = inp[i], cdf = 0.5 * (1.0 + erf(x * 0.70710678118654752));
        double pdf = 0.3989422804014327 * exp(-0.5 * x * x);
        dinp[i] = dout[i] * (float)(cdf + x * pdf);
    }
}

static void cu_gelu(const Backend *be, float *out, const float *inp, int64_t n) {
    Cuda *c = use(be);
    LAUNCH(k_gelu, blocks_for(n, 256), 256, 0, c->stream, out, inp, n);
}

static void cu_gelu_backward(const Backend *be, float *dinp, const float *dout, const float *inp, int64_t n) {
    Cuda *c = use(be);
    LAUNCH(k_gelu_backward, blocks_for(n, 256), 256, 0, c->stream, dinp, dout, inp, n);
}

// dout may be dgate: each element is read before it is written.
__global__ void k_glu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                               int64_t n, GluAct act) {
    FOR_EACH(i, n) {
        float g = gate[i], d = dout[i];
        if (act == GLU_SILU) {
            float sig = 1.0f / (1.0f + expf(-g));
            dup[i] = d * g * sig;
            dgate[i] = d * up[i] * sig * (1.0f + g * (1.0f - sig));
        } else {
            dup[i] = d * gelu_tanh(g);
            dgate[i] = d * up[i] * (float)gelu_tanh_grad(g);
        }
    }
}

static void cu_glu_backward(const Backend *be, float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, int64_t n, GluAct act) {
    Cuda *c = use(be);
    LAUNCH(k_glu_backward, blocks_for(n, 256), 256, 0, c->stream, dgate, dup, dout, gate, up, n, act);
}

static void cu_rope_backward(const Backend *be, float *dx, const float *cs, int64_t N, int n_heads, int D) {
    Cuda *c = use(be);
    LAUNCH(k_rope, blocks_for(N * n_heads * (D / 2), 256), 256, 0, c->stream, dx, cs, N, n_heads, D, -1.0f);
}

// dbias (OC) += column sums of the bf16 dout (N, OC), one thread a column, rows in order.
__global__ void k_bias_backward(float *dbias, const __nv_bfloat16 *dout, int64_t N, int64_t OC) {
    FOR_EACH(o, OC) {
        float s = dbias[o];
        for (int64_t i = 0; i < N; i++) s += __bfloat162float(dout[i * OC + o]);
        dbias[o] = s;
    }
}

static void cu_matmul_backward(const Backend *be, float *dinp, float *dweight, float *dbias, const void *dout,
                               const void *inp, const void *weight, DType dt, int64_t N, int64_t C, int64_t OC) {
    Cuda *c = use(be);
    need_bf16(be, dt, "matmul_backward");
    if (N == 0) return;
    if (dinp) gemm_ex(c, 1, 0, 0, N, C, OC, 1.0f, dout, OC, weight, C, 1, dinp, C);
    if (dweight) gemm_ex(c, 1, 1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1, dweight, C);
    if (dbias)
        LAUNCH(k_bias_backward, blocks_for(OC, 128), 128, 0, c->stream, dbias, (const __nv_bfloat16 *)dout, N, OC);
}

static void cu_gemm(const Backend *be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                    int64_t lda, const float *B, int64_t ldb, int accumulate, float *C, int64_t ldc) {
    gemm_ex(use(be), 0, ta, tb, M, N, K, alpha, A, lda, B, ldb, accumulate, C, ldc);
}

// ---- attention backward (FlashAttention-2's recomputation: probabilities rebuilt from the forward's lse)

// delta (N, H) = rowsum(dO * O) of each query row and head: one warp a (row, head), warps grid-striding.
__global__ void k_attention_delta(float *delta, const float *dout, const float *out, int64_t NH, int D) {
    int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    int lane = threadIdx.x & 31;
    for (int64_t x = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); x < NH; x += warps) {
        float s = 0.0f;  // x is the same for the whole warp
        for (int d = lane; d < D; d += 32) s += dout[x * D + d] * out[x * D + d];
        s = warp_sum(s);
        if (lane == 0) delta[x] = s;
    }
}

// dq: one block per (query row, kv head), one warp per query head of the group, as k_attend: tiles of the row's keys
// and values in shared memory; lane j scores key j of the tile, p = exp(s - lse), ds = p (dO.v - delta); then
// dq = scale sum_j ds_j k_j, each lane owning head dimensions CUDA_ATT_DIM(lane, r).
__global__ void __launch_bounds__(32 * ATT_GMAX)
k_attend_dq(float *dq, const float *dout, const float *lse, const float *delta, const float *q, const float *k,
            const float *v, const int64_t *seq_off, int B, AttnShape a) {
    __shared__ float Ks[ATT_TK][ATT_DMAX + 1], Vs[ATT_TK][ATT_DMAX + 1], Qs[ATT_GMAX][ATT_DMAX];
    int H = a.H, KVH = a.KVH, D = a.D;
    int64_t i = blockIdx.x, kvs = (int64_t)KVH * D, qs = (int64_t)H * D;
    int g = blockIdx.y, group = H / KVH, w = threadIdx.x >> 5, lane = threadIdx.x & 31, h = g * group + w;
    int b = seq_of(seq_off, B, i);
    int64_t first = seq_off[b] + attn_first_key(i - seq_off[b], a.window), nk = i - first + 1;
    int64_t base = first * kvs + (int64_t)g * D;
    const float *dor = dout + i * qs + (int64_t)h * D;
    float scale = a.scale, L = lse[i * H + h], Di = delta[i * H + h], acc[CUDA_ATT_DREGS];
#pragma unroll
    for (int r = 0; r < CUDA_ATT_DREGS; r++) acc[r] = 0.0f;
    for (int d = lane; d < D; d += 32) Qs[w][d] = q[i * qs + (int64_t)h * D + d] * scale;
    for (int64_t t0 = 0; t0 < nk; t0 += ATT_TK) {
        int nt = nk - t0 < ATT_TK ? (int)(nk - t0) : ATT_TK;
        __syncthreads();  // Qs written; the previous tile consumed
        load_kv_tile(Ks, Vs, k, v, 0, base, t0, nt, D, kvs);
        __syncthreads();
        float ds = 0.0f;
        if (lane < nt) {
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < D; d++) {
                s += Qs[w][d] * Ks[lane][d];
                dp += dor[d] * Vs[lane][d];
            }
            ds = expf(s - L) * (dp - Di);
        }
        for (int j = 0; j < nt; j++) {
            float dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
            for (int r = 0; r < CUDA_ATT_DREGS; r++) {
                int d = CUDA_ATT_DIM(lane, r);
                if (d < D) acc[r] += dsj * Ks[j][d];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < CUDA_ATT_DREGS; r++) {
        int d = CUDA_ATT_DIM(lane, r);
        if (d < D) dq[i * qs + (int64_t)h * D + d] = acc[r] * scale;
    }
}

// dk, dv, FlashAttention-2's way on CUDA cores: one block per (tile of DKV_T keys, kv head), 128 threads. The key
// tile stays in shared memory; for each query head of the group in turn, tiles of DKV_T query rows (q scaled, dO,
// lse, delta) come through shared memory too: S = q k and dP = dO v for the tile's pairs (two a thread), p =
// exp(S - lse) where the pair is causal, within the window and in one sequence, ds = p (dP - delta); then thread t
// adds p dO and ds q
// of the rows its key t / 8 sees into that key's dv and dk, dimensions t % 8 + 8 m (another sequence's rows are
// not touched: a non-finite value there stays there). Fixed order: heads, then query tiles, then rows.
#define DKV_T 16
static_assert(DKV_T * DKV_T == 2 * 128 && 8 * DKV_T == 128 && 8 * 16 >= ATT_DMAX, "k_attend_dkv's thread map");
static_assert(sizeof(float) * (4 * DKV_T * (ATT_DMAX + 1) + 2 * DKV_T * (DKV_T + 1) + 2 * DKV_T) <= 48 * 1024,
              "k_attend_dkv's shared tiles exceed 48 KiB");

__global__ void __launch_bounds__(128)
k_attend_dkv(float *dk, float *dv, const float *dout, const float *lse, const float *delta, const float *q,
             const float *k, const float *v, const int64_t *seq_off, int B, int64_t N, AttnShape a) {
    __shared__ float Ks[DKV_T][ATT_DMAX + 1], Vs[DKV_T][ATT_DMAX + 1], Qs[DKV_T][ATT_DMAX + 1];
    __shared__ float Os[DKV_T][ATT_DMAX + 1], Ps[DKV_T][DKV_T + 1], DSs[DKV_T][DKV_T + 1], Ls[DKV_T], Dls[DKV_T];
    int H = a.H, KVH = a.KVH, D = a.D;
    int64_t j0 = (int64_t)blockIdx.x * DKV_T, kvs = (int64_t)KVH * D, qs = (int64_t)H * D;
    int g = blockIdx.y, group = H / KVH, t = threadIdx.x, kk = t / 8, d0 = t % 8;
    int nk = N - j0 < DKV_T ? (int)(N - j0) : DKV_T;
    int64_t last_end = seq_off[seq_of(seq_off, B, j0 + nk - 1) + 1];  // the queries any of the tile's keys sees
    if (a.window && j0 + nk - 1 + a.window < last_end) last_end = j0 + nk - 1 + a.window;
    float scale = a.scale, ak[16], av[16];
#pragma unroll
    for (int m = 0; m < 16; m++) ak[m] = av[m] = 0.0f;
    load_kv_tile(Ks, Vs, k, v, 0, (int64_t)g * D, j0, nk, D, kvs);
    // the sequence ends of the key of this thread's pairs (column t % DKV_T) and of the key it accumulates
    int64_t jc = j0 + t % DKV_T, ja = j0 + kk;
    int64_t cend = jc < N ? seq_off[seq_of(seq_off, B, jc) + 1] : 0;
    int64_t aend = ja < N ? seq_off[seq_of(seq_off, B, ja) + 1] : 0;
    for (int h = g * group; h < (g + 1) * group; h++) {
        for (int64_t i0 = j0; i0 < last_end; i0 += DKV_T) {
            int nq = last_end - i0 < DKV_T ? (int)(last_end - i0) : DKV_T;
            __syncthreads();  // the previous tile's p and ds consumed
            for (int e = t; e < nq * D; e += blockDim.x) {
                int r = e / D, d = e % D;
                Qs[r][d] = q[(i0 + r) * qs + (int64_t)h * D + d] * scale;  // as k_attend scores
                Os[r][d] = dout[(i0 + r) * qs + (int64_t)h * D + d];
            }
            if (t < nq) {
                Ls[t] = lse[(i0 + t) * H + h];
                Dls[t] = delta[(i0 + t) * H + h];
            }
            __syncthreads();
            for (int x = 0; x < 2; x++) {
                int pair = t + 128 * x, r = pair / DKV_T, c = pair % DKV_T;
                int64_t i = i0 + r, j = j0 + c;
                float p = 0.0f, ds = 0.0f;
                if (r < nq && c < nk && i >= j && i < cend && j >= attn_first_key(i, a.window)) {
                    float s = 0.0f, dp = 0.0f;
                    for (int d = 0; d < D; d++) {
                        s += Qs[r][d] * Ks[c][d];
                        dp += Os[r][d] * Vs[c][d];
                    }
                    p = expf(s - Ls[r]);
                    ds = p * (dp - Dls[r]);
                }
                Ps[r][c] = p;
                DSs[r][c] = ds;
            }
            __syncthreads();
            int r0 = ja > i0 ? (int)(ja - i0) : 0, r1 = aend - i0 < nq ? (int)(aend - i0) : nq;
            for (int r = r0; r < r1; r++) {
                float p = Ps[r][kk], ds = DSs[r][kk];
#pragma unroll
                for (int m = 0; m < 16; m++) {
                    int d = d0 + 8 * m;
                    if (d < D) {
                        av[m] += p * Os[r][d];
                        ak[m] += ds * Qs[r][d];
                    }
                }
            }
        }
    }
    if (kk < nk) {
#pragma unroll
        for (int m = 0; m < 16; m++) {
            int d = d0 + 8 * m;
            if (d < D) {
                dk[(j0 + kk) * kvs + (int64_t)g * D + d] = ak[m];
                dv[(j0 + kk) * kvs + (int64_t)g * D + d] = av[m];
            }
        }
    }
}

static void cu_attention_backward(const Backend *be, float *dq, float *dk, float *dv, const float *dout,
                                  const float *out, const float *lse, const float *q, const float *k, const float *v,
                                  const int64_t *seq_off, int B, int64_t N, AttnShape a, float *scratch) {
    (void)scratch;
    Cuda *c = use(be);
    attention_shape(be, a);
    if (N == 0) return;
    float *delta = (float *)rows_buffer(be, (size_t)N * (size_t)a.H * sizeof(float));
    LAUNCH(k_attention_delta, blocks_for(N * a.H * 32, 256), 256, 0, c->stream, delta, dout, out, N * a.H, a.D);
    dim3 grid((unsigned)N, (unsigned)a.KVH), tiles((unsigned)((N + DKV_T - 1) / DKV_T), (unsigned)a.KVH);
    int threads = 32 * (a.H / a.KVH);
    LAUNCH(k_attend_dq, grid, threads, 0, c->stream, dq, dout, lse, delta, q, k, v, seq_off, B, a);
    LAUNCH(k_attend_dkv, tiles, 128, 0, c->stream, dk, dv, dout, lse, delta, q, k, v, seq_off, B, N, a);
}

// ---- log-prob head backward

// One block a row of logits z (rows of the chunk): g = d(loss)/d(logits) = dlogp (onehot(target) - p)
// - dent p (log p + H), rounded to bf16 into g16; out, may be NULL, gets the row's log-prob as logprob_forward's.
// A row without a target, or (without out) without a gradient, gets zeros.
__global__ void __launch_bounds__(LOGPROB_THREADS)
k_logprob_grad(float *out, __nv_bfloat16 *g16, const float *logits, const int32_t *targets, const float *dlogp,
               const float *dent, int64_t V) {
    int64_t r = blockIdx.x;
    int32_t t = targets[r];
    const float *z = logits + r * V;
    __nv_bfloat16 *g = g16 + r * V;
    float d = t >= 0 ? dlogp[r] : 0.0f, de = t >= 0 && dent ? dent[r] : 0.0f;
    if (t < 0 || t >= V || (d == 0.0f && de == 0.0f && !out)) {  // the whole block leaves together
        if (out && threadIdx.x == 0) out[r] = t < 0 ? 0.0f : NAN;  // an id past the vocabulary: NaN
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) g[j] = __float2bfloat16_rn(0.0f);
        return;
    }
    RowSums rs = row_sums(z, V, de != 0.0f);
    float mx = rs.mx;
    if (out && threadIdx.x == 0) out[r] = (float)((double)(z[t] - mx) - log(rs.sum));
    float inv = (float)(1.0 / rs.sum), lse = (float)log(rs.sum), H = (float)(log(rs.sum) - rs.sz / rs.sum);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        float p = expf(z[j] - mx) * inv, x;
        if (de == 0.0f) x = -d * p;
        else x = -d * p - de * p * (z[j] - mx - lse + H);
        if (j == t) x += d;
        g[j] = __float2bfloat16_rn(x);
    }
}

static void cu_logprob_backward(const Backend *be, float *dh, float *dW, float *out, const float *dlogp,
                                const float *dent, const float *h, const void *W, DType wt, const int32_t *targets,
                                int64_t N, int64_t C, int64_t V, float *scratch) {
    Cuda *c = use(be);
    need_bf16(be, wt, "logprob_backward");
    __nv_bfloat16 *h16 = (__nv_bfloat16 *)(scratch + (size_t)LOGPROB_CHUNK * (size_t)V);  // cu_logprob_scratch
    __nv_bfloat16 *g16 = h16 + (size_t)LOGPROB_CHUNK * (size_t)C;
    for (int64_t i0 = 0; i0 < N; i0 += LOGPROB_CHUNK) {
        int64_t rows = N - i0 < LOGPROB_CHUNK ? N - i0 : LOGPROB_CHUNK;
        cu_round_operand(be, wt, h + i0 * C, h16, rows * C);
        cu_matmul(be, scratch, h16, W, NULL, wt, rows, C, V);
        const float *de = dent ? dent + i0 : NULL;
        float *o = out ? out + i0 : NULL;
        LAUNCH(k_logprob_grad, (unsigned)rows, LOGPROB_THREADS, 0, c->stream, o, g16, scratch, targets + i0,
               dlogp + i0, de, V);
        gemm_ex(c, 1, 0, 0, rows, C, V, 1.0f, g16, V, W, C, 1, dh + i0 * C, C);
        if (dW) gemm_ex(c, 1, 1, 0, V, C, rows, 1.0f, g16, V, h16, C, 1, dW, C);
    }
}

// ---- rows, optimizer

__global__ void k_gather_rows(float *dst, const float *src, const int64_t *rows, int64_t n, int64_t width,
                              float scale) {
    FOR_EACH(e, n * width) dst[e] = src[rows[e / width] * width + e % width] * scale;
}

__global__ void k_scatter_rows(float *dst, const float *src, const int64_t *rows, int64_t n, int64_t width,
                               float scale) {
    FOR_EACH(e, n * width) dst[rows[e / width] * width + e % width] = src[e] * scale;
}

static void cu_gather_rows(const Backend *be, float *dst, const float *src, const int64_t *rows, int64_t n,
                           int64_t width, float scale) {
    Cuda *c = use(be);
    LAUNCH(k_gather_rows, blocks_for(n * width, 256), 256, 0, c->stream, dst, src, rows, n, width, scale);
}

static void cu_scatter_rows(const Backend *be, float *dst, const float *src, const int64_t *rows, int64_t n,
                            int64_t width, float scale) {
    Cuda *c = use(be);
    LAUNCH(k_scatter_rows, blocks_for(n * width, 256), 256, 0, c->stream, dst, src, rows, n, width, scale);
}

// nn/optim.c's float operations, in its order, with its constants (adamw_constants).
__global__ void k_adamw(float *p, const float *g, float *m, float *v, int64_t n, AdamWConstants k) {
    FOR_EACH(i, n) {
        float pi = p[i] * k.decay, gi = g[i];
        float mi = m[i] * k.b1 + k.a1 * gi;
        float vi = v[i] * k.b2 + k.a2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi + -k.step * (mi / (sqrtf(vi) / k.bc2_sqrt + k.eps));
    }
}

static void cu_adamw(const Backend *be, const AdamW *o, float *p, const float *g, float *m, float *v, size_t n,
                     double wd, int64_t t) {
    Cuda *c = use(be);
    AdamWConstants k = adamw_constants(o, wd, t);
    LAUNCH(k_adamw, blocks_for((int64_t)n, 256), 256, 0, c->stream, p, g, m, v, (int64_t)n, k);
}

// Chunk i of the host moments (i < nc) goes up into staging buffer i % 2 on the up stream, once that buffer's
// previous chunk (i - 2) has come down.
static void moments_up(Cuda *c, float *const stage[2], const float *m, const float *v, size_t n, size_t chunk,
                       size_t i) {
    int b = (int)(i & 1);
    size_t off = i * chunk, len = n - off < chunk ? n - off : chunk;
    if (i >= 2) CK(cudaStreamWaitEvent(c->up, c->came_down[b], 0));
    CK(cudaMemcpyAsync(stage[b], m + off, len * sizeof(float), cudaMemcpyHostToDevice, c->up));
    CK(cudaMemcpyAsync(stage[b] + chunk, v + off, len * sizeof(float), cudaMemcpyHostToDevice, c->up));
    CK(cudaEventRecord(c->went_up[b], c->up));
}

// The pipeline (backend.h): up (i + 1) | AdamW (i) on the main stream | down (i - 1), each buffer's order kept by its
// events: went_up -> AdamW -> stepped -> down -> came_down -> the next chunk up.
static void cu_adamw_host_moments(const Backend *be, const AdamW *o, float *p, const float *g, float *m, float *v,
                                  size_t n, double wd, int64_t t, float *const stage[2], size_t chunk) {
    Cuda *c = use(be);
    AdamWConstants k = adamw_constants(o, wd, t);
    size_t nc = (n + chunk - 1) / chunk;
    CK(cudaEventRecord(c->entered, c->stream));  // the up stream after the main stream's work so far
    CK(cudaStreamWaitEvent(c->up, c->entered, 0));
    if (nc) moments_up(c, stage, m, v, n, chunk, 0);
    for (size_t i = 0; i < nc; i++) {
        int b = (int)(i & 1);
        size_t off = i * chunk, len = n - off < chunk ? n - off : chunk;
        if (i + 1 < nc) moments_up(c, stage, m, v, n, chunk, i + 1);
        CK(cudaStreamWaitEvent(c->stream, c->went_up[b], 0));
        LAUNCH(k_adamw, blocks_for((int64_t)len, 256), 256, 0, c->stream, p + off, g + off, stage[b],
               stage[b] + chunk, (int64_t)len, k);
        CK(cudaEventRecord(c->stepped[b], c->stream));
        CK(cudaStreamWaitEvent(c->down, c->stepped[b], 0));
        CK(cudaMemcpyAsync(m + off, stage[b], len * sizeof(float), cudaMemcpyDeviceToHost, c->down));
        CK(cudaMemcpyAsync(v + off, stage[b] + chunk, len * sizeof(float), cudaMemcpyDeviceToHost, c->down));
        CK(cudaEventRecord(c->came_down[b], c->down));
    }
    CK(cudaStreamSynchronize(c->down));  // the moments are the host's again (and both buffers free)
}

// Block b's sum over its grid-stride elements (a fixed set, in a fixed order): of g^2 (squares), or of the
// non-finite count.
__global__ void k_reduce_partial(double *partial, const float *g, int64_t n, int squares) {
    double s = 0.0;
    FOR_EACH(i, n) s += squares ? (double)g[i] * g[i] : (double)!isfinite(g[i]);
    s = block_sum_d(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block: partial[n] = the sum of partial[0..n).
__global__ void k_reduce_final(double *partial, int n) {
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
    s = block_sum_d(s);
    if (threadIdx.x == 0) partial[n] = s;
}

static double reduce(const Backend *be, const float *g, size_t n, int squares) {
    Cuda *c = use(be);
    LAUNCH(k_reduce_partial, REDUCE_BLOCKS, REDUCE_THREADS, 0, c->stream, c->partial, g, (int64_t)n, squares);
    LAUNCH(k_reduce_final, 1, REDUCE_THREADS, 0, c->stream, c->partial, REDUCE_BLOCKS);
    double s = 0.0;
    cu_download(be, &s, c->partial + REDUCE_BLOCKS, sizeof s);
    return s;
}

static double cu_grad_norm(const Backend *be, const float *g, size_t n) { return sqrt(reduce(be, g, n, 1)); }

static int cu_all_finite(const Backend *be, const float *g, size_t n) { return reduce(be, g, n, 0) == 0.0; }

__global__ void k_scale(float *g, int64_t n, float s) {
    FOR_EACH(i, n) g[i] *= s;
}

static void cu_scale(const Backend *be, float *g, size_t n, float s) {
    Cuda *c = use(be);
    LAUNCH(k_scale, blocks_for((int64_t)n, 256), 256, 0, c->stream, g, (int64_t)n, s);
}

// x rounded to the nearest fp16 value (ties to even; past 65504 infinity; subnormals on their 2^-24 grid),
// as a float: by exponent arithmetic, the same on the GPU and the emulator.
__device__ float round_f16(float x) {
    float a = fabsf(x);
    if (!(a < 65520.0f)) return a == a ? copysignf(INFINITY, x) : x;  // 65520 is the tie above 65504: even is inf
    if (a < 6.103515625e-05f) return rintf(x * 16777216.0f) / 16777216.0f;  // below 2^-14: multiples of 2^-24
    int e;
    float m = frexpf(x, &e);  // x = m 2^e, 0.5 <= |m| < 1: fp16 keeps 11 significant bits
    return ldexpf(rintf(ldexpf(m, 11)), e - 11);
}

// 0: bf16, 1: fp16, 2: a copy.
__global__ void k_round_values(float *dst, const float *src, int64_t n, int kind) {
    FOR_EACH(i, n) {
        float x = src[i];
        if (kind == 0) x = __bfloat162float(__float2bfloat16_rn(x));
        else if (kind == 1) x = round_f16(x);
        dst[i] = x;
    }
}

static void cu_round_values(const Backend *be, float *dst, const float *src, size_t n, DType d) {
    Cuda *c = use(be);
    int kind = d == DTYPE_BF16 ? 0 : d == DTYPE_F16 ? 1 : 2;
    LAUNCH(k_round_values, blocks_for((int64_t)n, 256), 256, 0, c->stream, dst, src, (int64_t)n, kind);
}

// ---------------------------------------------------------------------------------------------
// open / close

static void cu_close(const Backend *be) {
    Cuda *c = use(be);
    CK(cudaStreamSynchronize(c->stream));
    dist_free(c);
    gemm_free(c);
    CK(cudaFree(c->bias32));
    CK(cudaFree(c->u));
    CK(cudaFree(c->ids));
    CK(cudaFree(c->lps));
    CK(cudaFree(c->rows));
    CK(cudaFree(c->partial));
    CK(cudaEventDestroy(c->entered));
    for (int b = 0; b < 2; b++) {
        CK(cudaEventDestroy(c->went_up[b]));
        CK(cudaEventDestroy(c->stepped[b]));
        CK(cudaEventDestroy(c->came_down[b]));
    }
    CK(cudaStreamDestroy(c->up));
    CK(cudaStreamDestroy(c->down));
    CK(cudaStreamDestroy(c->stream));
    free(c->held.p);
    free(c->held.bytes);
    free(c);
}

// The attention kernels keep their tiles in shared memory: no scratch.
static size_t cu_attention_scratch(const Backend *be, int64_t max_T, int backward) {
    (void)be;
    (void)max_T;
    (void)backward;
    return 0;
}

// cu_logprob(_backward): one chunk's logits (LOGPROB_CHUNK, V) fp32, then its rows of h rounded to bf16, then
// (backward) the logits' gradients in bf16: the CPU's layout (nn/logprob.c).
static size_t cu_logprob_scratch(const Backend *be, int64_t V, int64_t C, DType wt) {
    (void)be;
    (void)wt;
    return (size_t)LOGPROB_CHUNK * (size_t)V + (size_t)LOGPROB_CHUNK * (size_t)(C + V) / 2 + 1;
}

// The sampler kernel keeps its scratch in shared memory and the backend's own buffers.
static void *cu_sampler_new(const Backend *be, int64_t V) {
    (void)be;
    (void)V;
    return NULL;
}

static void cu_sampler_free(const Backend *be, void *scr) {
    (void)be;
    (void)scr;
}

// The backend named `name` on device `ordinal` (which exists).
static const Backend *backend_new(const char *name, int ordinal) {
    CK(cudaSetDevice(ordinal));
    Cuda *c = (Cuda *)xcalloc(1, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->ordinal = ordinal;
    CK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&c->up, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&c->down, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&c->entered, cudaEventDisableTiming));
    for (int b = 0; b < 2; b++) {
        CK(cudaEventCreateWithFlags(&c->went_up[b], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&c->stepped[b], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&c->came_down[b], cudaEventDisableTiming));
    }
    gemm_new(c);
    const char *epi = getenv("GRPO_CUDA_BIAS_EPILOGUE");  // "0": the op test's way to reach k_bias
    c->bias_epilogue = !(epi && !strcmp(epi, "0"));
    Backend *be = &c->be;
    be->name = c->name;
    be->on_device = 1;
    be->bf16_weights = 1;
    be->ctx = c;
    c->partial = (double *)cu_alloc(be, (REDUCE_BLOCKS + 1) * sizeof(double));
    be->attention_scratch = cu_attention_scratch;
    be->logprob_scratch = cu_logprob_scratch;
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->upload = cu_upload;
    be->download = cu_download;
    be->copy = cu_copy;
    be->host_alloc = cu_host_alloc;
    be->host_free = cu_host_free;
    be->memory_held = cu_memory_held;
    be->memory_peak = cu_memory_peak;
    be->memory_info = cu_memory_info;
    be->memory_own = cu_memory_own;
    be->round_operand = cu_round_operand;
    be->embedding_forward = cu_embedding;
    be->rmsnorm_forward = cu_rmsnorm;
    be->matmul_forward = cu_matmul;
    be->rope_table = cu_rope_table;
    be->rope_forward = cu_rope;
    be->glu_forward = cu_glu;
    be->residual_forward = cu_residual;
    be->attention_forward = cu_attention;
    be->attention_decode_forward = cu_attention_decode;
    be->kv_append = cu_kv_append;
    be->logprob_forward = cu_logprob;
    be->sample = cu_sample;
    be->sampler_new = cu_sampler_new;
    be->sampler_free = cu_sampler_free;
    be->zero = cu_zero;
    be->embedding_backward = cu_embedding_backward;
    be->rmsnorm_backward = cu_rmsnorm_backward;
    be->matmul_backward = cu_matmul_backward;
    be->rope_backward = cu_rope_backward;
    be->attention_backward = cu_attention_backward;
    be->glu_backward = cu_glu_backward;
    be->layernorm_forward = cu_layernorm;
    be->layernorm_backward = cu_layernorm_backward;
    be->gelu_forward = cu_gelu;
    be->gelu_backward = cu_gelu_backward;
    be->logprob_backward = cu_logprob_backward;
    be->gemm = cu_gemm;
    be->gather_rows = cu_gather_rows;
    be->scatter_rows = cu_scatter_rows;
    be->adamw = cu_adamw;
    be->adamw_host_moments = cu_adamw_host_moments;
    be->grad_norm = cu_grad_norm;
    be->all_finite = cu_all_finite;
    be->scale = cu_scale;
    be->round_values = cu_round_values;
    be->close = cu_close;
    return be;
}

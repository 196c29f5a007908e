// The CUDA backend: every op of backend/backend.h on one GPU and one stream. GEMMs go through cuBLASLt
// (bf16 operands, fp32 accumulation and output, the bias widened to fp32 and fused as an epilogue when
// cuBLASLt offers one); the rest are our own kernels, fp32 in registers, as on the CPU. Weights are bf16:
// a GPU model is a BF16 slab. Activations, the KV cache and log-probs stay fp32, as on the CPU.
//
// This text is compiled twice: by nvcc for the GPU (cuda.cu: cuBLASLt, the device count, cuda_backend_open) and as
// host C++ for the emulated device (emu.cpp with emu.h: --device emu, where the GEMM is the CPU's). So everything
// here is CUDA's runtime API and kernels launched through LAUNCH; what differs is the includer's:
//   gemm_new(c), gemm_free(c), gemm_bf16(...)  (below).
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

typedef struct {
    Backend be;
    char name[24];
    int ordinal;
    cudaStream_t stream;
    void *gemm;         // the includer's GEMM state (cuBLASLt's handle, workspace and plans; none on the emulator)
    int bias_epilogue;  // 0: biases added by k_bias, not the GEMM's epilogue (GRPO_CUDA_BIAS_EPILOGUE=0)
    float *bias32;      // matmul: the bias widened to fp32, the epilogue's documented type
    int64_t bias_cap;
    float *prob;  // sampler: (rows, V) probabilities
    size_t prob_cap;
    double *u;  // sampler: (rows) draws, ids and log-probs
    int32_t *ids;
    float *lps;
    int rows_cap;
} Cuda;

// The includer's GEMM: out (N, OC) fp32 = inp (N, C) bf16 @ weight (OC, C)^T bf16, fp32 accumulation; with bias32
// (OC, fp32) it may add the bias as an epilogue, and says so by returning 1 (0: the caller adds it).
static void gemm_new(Cuda *c);
static void gemm_free(Cuda *c);
static int gemm_bf16(Cuda *c, float *out, const void *inp, const void *weight, const float *bias32, int64_t N,
                     int64_t C, int64_t OC);

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
    return p;
}

static void cu_free(const Backend *be, void *p) {
    Cuda *c = use(be);
    if (!p) return;
    CK(cudaStreamSynchronize(c->stream));
    CK(cudaFree(p));
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

__global__ void k_rope_table(float *cs, const int32_t *pos, int64_t N, int D, double theta) {
    int half = D / 2;
    FOR_EACH(e, N * half) {
        int64_t i = e / half;
        int j = (int)(e % half);
        // In double, as on the CPU; as a multiple of pi, whose reduction needs no local memory (cos and sin of
        // large arguments reduce through a table on the stack). Within 2e-11 of the CPU's angle below position
        // 131072 (3e-16 of it), far below float's ulp.
        double turns = (double)pos[i] * (pow(theta, -2.0 * j / D) / M_PI), s, c;
        sincospi(turns, &s, &c);
        cs[i * D + j] = (float)c;
        cs[i * D + half + j] = (float)s;
    }
}

__global__ void k_rope(float *x, const float *cs, int64_t N, int n_heads, int D) {
    int half = D / 2;
    FOR_EACH(e, N * n_heads * half) {
        int64_t i = e / ((int64_t)n_heads * half);
        int j = (int)(e % half);
        float *v = x + (e / half) * D;  // row i, head (e / half) % n_heads
        float c = cs[i * D + j], s = cs[i * D + half + j], a = v[j], b = v[j + half];
        v[j] = a * c - b * s;
        v[j + half] = b * c + a * s;
    }
}

__global__ void k_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    FOR_EACH(i, n) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
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

__global__ void k_kv_append(float *kc, float *vc, const float *k, const float *v, const int64_t *dst, int B,
                            int64_t row) {
    FOR_EACH(e, B * row) {
        int64_t b = e / row, c = e % row;
        kc[dst[b] + c] = k[e];
        vc[dst[b] + c] = v[e];
    }
}

// One block a row: out = x / rms(x) * w.
__global__ void k_rmsnorm(float *out, const float *inp, const __nv_bfloat16 *w, int64_t C, float eps) {
    const float *x = inp + blockIdx.x * C;
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) ss += (double)x[j] * x[j];
    ss = block_sum_d(ss);
    float r = (float)(1.0 / sqrt(ss / (double)C + eps));
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) out[blockIdx.x * C + j] = x[j] * r * __bfloat162float(w[j]);
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
                       int64_t C, float eps) {
    Cuda *c = use(be);
    need_bf16(be, wt, "rmsnorm");
    if (N == 0) return;
    LAUNCH(k_rmsnorm, (unsigned)N, 256, 0, c->stream, out, inp, (const __nv_bfloat16 *)weight, C, eps);
}

static void cu_rope_table(const Backend *be, float *cs, const int32_t *pos, int64_t N, int D, double theta) {
    Cuda *c = use(be);
    LAUNCH(k_rope_table, blocks_for(N * (D / 2), 256), 256, 0, c->stream, cs, pos, N, D, theta);
}

static void cu_rope(const Backend *be, float *x, const float *cs, int64_t N, int n_heads, int D) {
    Cuda *c = use(be);
    LAUNCH(k_rope, blocks_for(N * n_heads * (D / 2), 256), 256, 0, c->stream, x, cs, N, n_heads, D);
}

static void cu_swiglu(const Backend *be, float *out, const float *gate, const float *up, int64_t n) {
    Cuda *c = use(be);
    LAUNCH(k_swiglu, blocks_for(n, 256), 256, 0, c->stream, out, gate, up, n);
}

static void cu_residual(const Backend *be, float *x, const float *y, int64_t n) {
    Cuda *c = use(be);
    LAUNCH(k_residual, blocks_for(n, 256), 256, 0, c->stream, x, y, n);
}

static void cu_kv_append(const Backend *be, float *k_cache, float *v_cache, const float *k, const float *v,
                         const int64_t *dst, int B, int64_t row) {
    Cuda *c = use(be);
    LAUNCH(k_kv_append, blocks_for(B * row, 256), 256, 0, c->stream, k_cache, v_cache, k, v, dst, B, row);
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

// One block per (query row, kv head), one warp per query head of the group: each tile of keys and
// values is read from memory once for all heads of the group. Online softmax over the tiles. Lane l
// accumulates head dimensions CUDA_ATT_DIM(l, r) < D (cuda_backend.h), so any D up to ATT_DMAX works.
// Prefill (seq_off): row i attends to its sequence's rows up to itself, keys packed like the queries.
// Decode (kv_off, n_keys): row i attends to n_keys[i] cached positions from element kv_off[i].
__global__ void __launch_bounds__(32 * ATT_GMAX)
k_attend(float *out, const float *q, const float *k, const float *v, const int64_t *seq_off, int B,
         const int64_t *kv_off, const int32_t *n_keys, int H, int KVH, int D) {
    __shared__ float Ks[ATT_TK][ATT_DMAX + 1], Vs[ATT_TK][ATT_DMAX + 1], Qs[ATT_GMAX][ATT_DMAX];
    int64_t i = blockIdx.x, kvs = (int64_t)KVH * D, qs = (int64_t)H * D, start, nk;
    int g = blockIdx.y, group = H / KVH, w = threadIdx.x >> 5, lane = threadIdx.x & 31, h = g * group + w;
    if (seq_off) {
        int lo = 0, hi = B;  // seq_off[lo] <= i < seq_off[hi]
        while (hi - lo > 1) {
            int mid = (lo + hi) / 2;
            if (seq_off[mid] <= i) lo = mid;
            else hi = mid;
        }
        start = seq_off[lo] * kvs;
        nk = i - seq_off[lo] + 1;
    } else {
        start = kv_off[i];
        nk = n_keys[i];
    }
    const float *kb = k + start + (int64_t)g * D, *vb = v + start + (int64_t)g * D;
    float scale = 1.0f / sqrtf((float)D), m = -INFINITY, l = 0.0f, acc[CUDA_ATT_DREGS];
#pragma unroll
    for (int r = 0; r < CUDA_ATT_DREGS; r++) acc[r] = 0.0f;
    for (int d = lane; d < D; d += 32) Qs[w][d] = q[i * qs + (int64_t)h * D + d] * scale;
    for (int64_t t0 = 0; t0 < nk; t0 += ATT_TK) {
        int nt = nk - t0 < ATT_TK ? (int)(nk - t0) : ATT_TK;
        __syncthreads();  // Qs written; the previous tile consumed
        for (int e = threadIdx.x; e < nt * D; e += blockDim.x) {
            int j = e / D, d = e % D;
            Ks[j][d] = kb[(t0 + j) * kvs + d];
            Vs[j][d] = vb[(t0 + j) * kvs + d];
        }
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
}

static void attend(const Backend *be, float *out, const float *q, const float *k, const float *v,
                   const int64_t *seq_off, int B, const int64_t *kv_off, const int32_t *n_keys, int64_t rows, int H,
                   int KVH, int D) {
    Cuda *c = use(be);
    if (D < 1 || D > ATT_DMAX || KVH < 1 || H % KVH || H / KVH > ATT_GMAX)
        die("%s: attention with head_dim %d, %d query heads and %d kv heads is not supported (head_dim up to "
            "%d, at most %d query heads per kv head)", be->name, D, H, KVH, ATT_DMAX, ATT_GMAX);
    if (rows == 0) return;
    dim3 grid((unsigned)rows, (unsigned)KVH);
    LAUNCH(k_attend, grid, 32 * (H / KVH), 0, c->stream, out, q, k, v, seq_off, B, kv_off, n_keys, H, KVH, D);
}

static void cu_attention(const Backend *be, float *out, float *lse, const float *q, const float *k, const float *v,
                         const int64_t *seq_off, int B, int64_t N, int H, int KVH, int D, float *scratch) {
    (void)scratch;
    if (lse) die("%s: attention's log-sum-exp (training) is not implemented on this backend yet", be->name);
    attend(be, out, q, k, v, seq_off, B, NULL, NULL, N, H, KVH, D);
}

static void cu_attention_decode(const Backend *be, float *out, const float *q, const float *k_cache,
                                const float *v_cache, const int64_t *kv_off, const int32_t *n_keys, int B, int H,
                                int KVH, int D, float *scratch) {
    (void)scratch;
    attend(be, out, q, k_cache, v_cache, NULL, 0, kv_off, n_keys, B, H, KVH, D);
}

// ---------------------------------------------------------------------------------------------
// log-prob head and sampler

#define LOGPROB_THREADS 1024

__global__ void __launch_bounds__(LOGPROB_THREADS)
k_logprob_rows(float *out, const float *logits, const int32_t *targets, int64_t V) {
    int64_t r = blockIdx.x;
    int32_t t = targets[r];
    if (t < 0 || t >= V) {  // the whole block leaves together; an id past the vocabulary (unchecked input) is NaN
        if (threadIdx.x == 0) out[r] = t < 0 ? 0.0f : NAN;
        return;
    }
    const float *z = logits + r * V;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, z[j]);
    mx = block_max(mx);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += expf(z[j] - mx);
    s = block_sum_d(s);
    if (threadIdx.x == 0) out[r] = (float)((double)(z[t] - mx) - log(s));
}

static void cu_logprob(const Backend *be, float *out, float *ent, const float *h, const void *W, DType wt,
                       const int32_t *targets, int64_t N, int64_t C, int64_t V, float *scratch) {
    Cuda *c = use(be);
    need_bf16(be, wt, "logprob_forward");
    if (ent) die("%s: the log-prob head's entropy (training) is not implemented on this backend yet", be->name);
    __nv_bfloat16 *h16 = (__nv_bfloat16 *)(scratch + (size_t)LOGPROB_CHUNK * (size_t)V);  // cu_logprob_scratch
    for (int64_t i0 = 0; i0 < N; i0 += LOGPROB_CHUNK) {
        int64_t rows = N - i0 < LOGPROB_CHUNK ? N - i0 : LOGPROB_CHUNK;
        cu_round_operand(be, wt, h + i0 * C, h16, rows * C);
        cu_matmul(be, scratch, h16, W, NULL, wt, rows, C, V);
        LAUNCH(k_logprob_rows, (unsigned)rows, LOGPROB_THREADS, 0, c->stream, out + i0, scratch, targets + i0, V);
    }
}

#define SAMPLE_THREADS 1024

// Count (or mass) of the probabilities whose bits are >= t (probabilities are >= 0, so their bit
// patterns order like their values).
__device__ double mass_from(const float *p, int64_t V, uint32_t t, int count) {
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        if (__float_as_uint(p[j]) >= t) s += count ? 1.0 : (double)p[j];
    return block_sum_d(s);
}

// The largest threshold t in [lo, bits(1) + 1) with mass_from(t) >= want (count or probability mass).
__device__ uint32_t threshold(const float *p, int64_t V, uint32_t lo, double want, int count) {
    uint32_t hi = __float_as_uint(1.0f) + 1;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (mass_from(p, V, mid, count) >= want) lo = mid;
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
         float *prob, int32_t *ids, float *lps) {
    __shared__ double seg_mass[SAMPLE_THREADS];
    __shared__ int64_t chosen;
    int64_t b = blockIdx.x;
    const float *z = logits + b * V;
    float *p = prob + b * V;
    float best = -INFINITY;
    int64_t arg = V;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        if (z[j] > best) best = z[j], arg = j;  // j rises: the lowest id of the thread's best
    arg = block_argmax(best, arg);
    if (arg >= V) arg = 0;  // all NaN
    float mx = z[arg];
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        p[j] = expf((z[j] - mx) * inv_t);
        s += p[j];
    }
    double sum = block_sum_d(s);
    if (greedy) {
        if (threadIdx.x == 0) chosen = arg;
    } else {
        uint32_t t = 0;
        if (top_k > 0 && top_k < V) t = threshold(p, V, 0, (double)top_k, 1);
        if (top_p < 1.0f) {
            double kept = top_k > 0 ? mass_from(p, V, t, 0) : sum;
            t = threshold(p, V, t, top_p * kept, 0);
        }
        double mass = mass_from(p, V, t, 0), target = u[b] * mass;
        int64_t seg = (V + blockDim.x - 1) / blockDim.x, j0 = threadIdx.x * seg, j1 = j0 + seg < V ? j0 + seg : V;
        double ms = 0.0;
        for (int64_t j = j0; j < j1; j++)
            if (__float_as_uint(p[j]) >= t) ms += p[j];
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
                    if (__float_as_uint(p[j]) < t || p[j] == 0.0f) continue;
                    pick = j;
                    if ((c += p[j]) > target) break;
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
    if ((size_t)B * (size_t)V > c->prob_cap) {
        cu_free(be, c->prob);
        c->prob_cap = (size_t)B * (size_t)V;
        c->prob = (float *)cu_alloc(be, c->prob_cap * sizeof(float));
    }
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
                                                            c->prob, c->ids, c->lps);
    CK(cudaMemcpyAsync(ids, c->ids, (size_t)B * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream));
    cu_download(be, logprobs, c->lps, (size_t)B * sizeof(float));
}

// ---------------------------------------------------------------------------------------------
// open / close

static void cu_close(const Backend *be) {
    Cuda *c = use(be);
    CK(cudaStreamSynchronize(c->stream));
    gemm_free(c);
    CK(cudaFree(c->bias32));
    CK(cudaFree(c->prob));
    CK(cudaFree(c->u));
    CK(cudaFree(c->ids));
    CK(cudaFree(c->lps));
    CK(cudaStreamDestroy(c->stream));
    free(c);
}

// The attention kernels keep their tiles in shared memory: no scratch.
static size_t cu_attention_scratch(const Backend *be, int64_t max_T, int backward) {
    (void)be;
    (void)max_T;
    (void)backward;
    return 0;
}

// cu_logprob: one chunk's logits (LOGPROB_CHUNK, V) fp32, then its rows of h rounded to bf16.
static size_t cu_logprob_scratch(const Backend *be, int64_t V, int64_t C, DType wt) {
    (void)be;
    (void)wt;
    return (size_t)LOGPROB_CHUNK * (size_t)V + ((size_t)LOGPROB_CHUNK * (size_t)C + 1) / 2;
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
    gemm_new(c);
    const char *epi = getenv("GRPO_CUDA_BIAS_EPILOGUE");  // "0": the op test's way to reach k_bias
    c->bias_epilogue = !(epi && !strcmp(epi, "0"));
    Backend *be = &c->be;
    be->name = c->name;
    be->on_device = 1;
    be->ctx = c;
    be->attention_scratch = cu_attention_scratch;
    be->logprob_scratch = cu_logprob_scratch;
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->upload = cu_upload;
    be->download = cu_download;
    be->copy = cu_copy;
    be->round_operand = cu_round_operand;
    be->embedding_forward = cu_embedding;
    be->rmsnorm_forward = cu_rmsnorm;
    be->matmul_forward = cu_matmul;
    be->rope_table = cu_rope_table;
    be->rope_forward = cu_rope;
    be->swiglu_forward = cu_swiglu;
    be->residual_forward = cu_residual;
    be->attention_forward = cu_attention;
    be->attention_decode_forward = cu_attention_decode;
    be->kv_append = cu_kv_append;
    be->logprob_forward = cu_logprob;
    be->sample = cu_sample;
    be->sampler_new = cu_sampler_new;
    be->sampler_free = cu_sampler_free;
    be->close = cu_close;
    return be;
}

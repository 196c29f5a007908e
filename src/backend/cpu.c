// The CPU backend: host memory and nn/ops.h, the numbers every parity test pins down.
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/util.h"
#include "nn/gemm.h"
#include "nn/ops.h"

static size_t cpu_attention_scratch(const Backend *be, int64_t max_T, int backward) {
    (void)be;
    return backward ? attention_backward_scratch_floats(max_T) : attention_scratch_floats(max_T);
}

static size_t cpu_logprob_scratch(const Backend *be, int64_t V, int64_t C, DType wt) {
    (void)be;
    return logprob_scratch_floats(V, C, wt);
}

static void *cpu_alloc(const Backend *be, size_t bytes) {
    (void)be;
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p) die("out of memory allocating %zu bytes", bytes);
    memset(p, 0, n);
    return p;
}

static void cpu_free(const Backend *be, void *p) {
    (void)be;
    free(p);
}

static void cpu_copy(const Backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (dst != src && bytes) memmove(dst, src, bytes);
}

static void cpu_round_operand(const Backend *be, DType dt, const float *x, void *dst, int64_t n) {
    (void)be;
    dtype_from_f32(dt, x, dst, (size_t)n);
}

static void cpu_embedding(const Backend *be, float *out, const int32_t *tokens, const void *table, DType wt, int64_t N,
                          int64_t C) {
    (void)be;
    embedding_forward(out, tokens, table, wt, N, C);
}

static void cpu_rmsnorm(const Backend *be, float *out, const float *inp, const void *weight, DType wt, int64_t N,
                        int64_t C, float eps, float offset) {
    (void)be;
    rmsnorm_forward(out, inp, weight, wt, N, C, eps, offset);
}

static void cpu_matmul(const Backend *be, float *out, const void *inp, const void *weight, const void *bias, DType dt,
                       int64_t N, int64_t C, int64_t OC) {
    (void)be;
    matmul_forward(out, inp, weight, bias, dt, N, C, OC);
}

static void cpu_rope_table(const Backend *be, float *cs, const int32_t *pos, int64_t N, int D, RopeFreqs f) {
    (void)be;
    rope_table(cs, pos, N, D, f);
}

static void cpu_rope(const Backend *be, float *x, const float *cs, int64_t N, int n_heads, int D) {
    (void)be;
    rope_forward(x, cs, N, n_heads, D);
}

static void cpu_glu(const Backend *be, float *out, const float *gate, const float *up, int64_t n, GluAct act) {
    (void)be;
    glu_forward(out, gate, up, n, act);
}

static void cpu_residual(const Backend *be, float *x, const float *y, int64_t n) {
    (void)be;
    residual_forward(x, y, n);
}

static void cpu_attention(const Backend *be, float *out, float *lse, const float *q, const float *k, const float *v,
                          const int64_t *seq_off, int B, int64_t N, AttnShape a, float *scratch) {
    (void)be;
    (void)N;
    attention_forward(out, lse, q, k, v, seq_off, B, a, scratch);
}

static void cpu_attention_decode(const Backend *be, float *out, const float *q, const void *k_cache,
                                 const void *v_cache, DType kv_dt, const int64_t *kv_off, const int32_t *n_keys,
                                 int B, AttnShape a, float *scratch) {
    (void)be;
    attention_decode_forward(out, q, k_cache, v_cache, kv_dt, kv_off, n_keys, B, a, scratch);
}

static void cpu_kv_append(const Backend *be, void *k_cache, void *v_cache, DType kv_dt, const float *k,
                          const float *v, const int64_t *dst, int B, int64_t row) {
    (void)be;
    size_t es = dtype_size(kv_dt);
    for (int b = 0; b < B; b++) {
        dtype_from_f32(kv_dt, k + b * row, (char *)k_cache + (size_t)dst[b] * es, (size_t)row);
        dtype_from_f32(kv_dt, v + b * row, (char *)v_cache + (size_t)dst[b] * es, (size_t)row);
    }
}

static void cpu_logprob(const Backend *be, float *out, float *ent, const float *h, const void *W, DType wt,
                        const int32_t *targets, int64_t N, int64_t C, int64_t V, float *scratch) {
    (void)be;
    logprob_forward(out, ent, h, W, wt, targets, N, C, V, scratch);
}

// One SamplerScratch per OpenMP thread.
typedef struct {
    int n;
    SamplerScratch *s;
} CpuSampler;

static void *cpu_sampler_new(const Backend *be, int64_t V) {
    (void)be;
    CpuSampler *c = xmalloc(sizeof *c);
    c->n = omp_get_max_threads();
    c->s = xmalloc((size_t)c->n * sizeof *c->s);
    for (int t = 0; t < c->n; t++)
        c->s[t] = (SamplerScratch){xmalloc((size_t)V * sizeof(float)), xmalloc((size_t)V * sizeof(int32_t))};
    return c;
}

static void cpu_sampler_free(const Backend *be, void *scr) {
    (void)be;
    CpuSampler *c = scr;
    for (int t = 0; t < c->n; t++) {
        free(c->s[t].prob);
        free(c->s[t].idx);
    }
    free(c->s);
    free(c);
}

static void cpu_sample(const Backend *be, const SamplerConfig *sc, const float *logits, int B, int64_t V,
                       const double *u, void *scratch, int32_t *ids, float *logprobs) {
    (void)be;
    SamplerScratch *scr = ((CpuSampler *)scratch)->s;
    // Each row reads only its own logits and draw: rows run in parallel, results are the same.
#pragma omp parallel for schedule(dynamic) if (B > 1)
    for (int b = 0; b < B; b++)
        ids[b] = sampler_sample(sc, logits + (int64_t)b * V, V, u[b], &scr[omp_get_thread_num()], &logprobs[b]);
}

static void cpu_zero(const Backend *be, void *p, size_t bytes) {
    (void)be;
    if (bytes) memset(p, 0, bytes);
}

static void cpu_embedding_backward(const Backend *be, float *dtable, const float *dout, const int32_t *tokens,
                                   int64_t N, int64_t C) {
    (void)be;
    embedding_backward(dtable, dout, tokens, N, C);
}

static void cpu_rmsnorm_backward(const Backend *be, float *dinp, float *dweight, const float *dout, const float *inp,
                                 const void *weight, DType wt, int64_t N, int64_t C, float eps, float offset) {
    (void)be;
    rmsnorm_backward(dinp, dweight, dout, inp, weight, wt, N, C, eps, offset);
}

static void cpu_matmul_backward(const Backend *be, float *dinp, float *dweight, float *dbias, const void *dout,
                                const void *inp, const void *weight, DType dt, int64_t N, int64_t C, int64_t OC) {
    (void)be;
    matmul_backward(dinp, dweight, dbias, dout, inp, weight, dt, N, C, OC);
}

static void cpu_rope_backward(const Backend *be, float *dx, const float *cs, int64_t N, int n_heads, int D) {
    (void)be;
    rope_backward(dx, cs, N, n_heads, D);
}

static void cpu_attention_backward(const Backend *be, float *dq, float *dk, float *dv, const float *dout,
                                   const float *out, const float *lse, const float *q, const float *k, const float *v,
                                   const int64_t *seq_off, int B, int64_t N, AttnShape a, float *scratch) {
    (void)be;
    (void)N;
    attention_backward(dq, dk, dv, dout, out, lse, q, k, v, seq_off, B, a, scratch);
}

static void cpu_layernorm(const Backend *be, float *out, const float *inp, const float *weight, const float *bias,
                          int64_t N, int64_t C, float eps) {
    (void)be;
    layernorm_forward(out, inp, weight, bias, N, C, eps);
}

static void cpu_layernorm_backward(const Backend *be, float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *weight, int64_t N, int64_t C, float eps) {
    (void)be;
    layernorm_backward(dinp, dweight, dbias, dout, inp, weight, N, C, eps);
}

static void cpu_gelu(const Backend *be, float *out, const float *inp, int64_t n) {
    (void)be;
    gelu_forward(out, inp, n);
}

static void cpu_gelu_backward(const Backend *be, float *dinp, const float *dout, const float *inp, int64_t n) {
    (void)be;
    gelu_backward(dinp, dout, inp, n);
}

static void cpu_glu_backward(const Backend *be, float *dgate, float *dup, const float *dout, const float *gate,
                             const float *up, int64_t n, GluAct act) {
    (void)be;
    glu_backward(dgate, dup, dout, gate, up, n, act);
}

static void cpu_logprob_backward(const Backend *be, float *dh, float *dW, float *out, const float *dlogp,
                                 const float *dent, const float *h, const void *W, DType wt, const int32_t *targets,
                                 int64_t N, int64_t C, int64_t V, float *scratch) {
    (void)be;
    logprob_backward(dh, dW, out, dlogp, dent, h, W, wt, targets, N, C, V, scratch);
}

static void cpu_gemm(const Backend *be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                     int64_t lda, const float *B, int64_t ldb, int accumulate, float *C, int64_t ldc) {
    (void)be;
    gemm(DTYPE_F32, ta, tb, M, N, K, alpha, A, lda, B, ldb, NULL, accumulate, C, ldc);
}

static void cpu_gather_rows(const Backend *be, float *dst, const float *src, const int64_t *rows, int64_t n,
                            int64_t width, float scale) {
    (void)be;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < width; j++) dst[i * width + j] = src[rows[i] * width + j] * scale;
}

static void cpu_scatter_rows(const Backend *be, float *dst, const float *src, const int64_t *rows, int64_t n,
                             int64_t width, float scale) {
    (void)be;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < width; j++) dst[rows[i] * width + j] = src[i * width + j] * scale;
}

static void cpu_adamw(const Backend *be, const AdamW *o, float *p, const float *g, float *m, float *v, size_t n,
                      double wd, int64_t t) {
    (void)be;
    adamw_update(o, p, g, m, v, n, wd, t);
}

static void cpu_adamw_host_moments(const Backend *be, const AdamW *o, float *p, const float *g, float *m, float *v,
                                   size_t n, double wd, int64_t t, float *const stage[2], size_t chunk) {
    (void)be;
    (void)stage;
    (void)chunk;
    adamw_update(o, p, g, m, v, n, wd, t);
}

static double cpu_grad_norm(const Backend *be, const float *g, size_t n) {
    (void)be;
    return grad_norm(g, n);
}

static int cpu_all_finite(const Backend *be, const float *g, size_t n) {
    (void)be;
    return grad_all_finite(g, n);
}

static void cpu_scale(const Backend *be, float *g, size_t n, float s) {
    (void)be;
    grad_scale(g, n, s);
}

static void cpu_round_values(const Backend *be, float *dst, const float *src, size_t n, DType d) {
    (void)be;
    round_to_dtype(dst, src, n, d);
}

static void cpu_close(const Backend *be) { (void)be; }

// Every op and the memory functions of the CPU backend, for its two tables below.
#define CPU_TABLE \
    .attention_scratch = cpu_attention_scratch, \
    .logprob_scratch = cpu_logprob_scratch, \
    .alloc = cpu_alloc, \
    .free = cpu_free, \
    .upload = cpu_copy, \
    .download = cpu_copy, \
    .copy = cpu_copy, \
    .host_alloc = cpu_alloc, \
    .host_free = cpu_free, \
    .round_operand = cpu_round_operand, \
    .embedding_forward = cpu_embedding, \
    .rmsnorm_forward = cpu_rmsnorm, \
    .matmul_forward = cpu_matmul, \
    .rope_table = cpu_rope_table, \
    .rope_forward = cpu_rope, \
    .glu_forward = cpu_glu, \
    .residual_forward = cpu_residual, \
    .attention_forward = cpu_attention, \
    .attention_decode_forward = cpu_attention_decode, \
    .kv_append = cpu_kv_append, \
    .logprob_forward = cpu_logprob, \
    .sample = cpu_sample, \
    .sampler_new = cpu_sampler_new, \
    .sampler_free = cpu_sampler_free, \
    .zero = cpu_zero, \
    .embedding_backward = cpu_embedding_backward, \
    .rmsnorm_backward = cpu_rmsnorm_backward, \
    .matmul_backward = cpu_matmul_backward, \
    .rope_backward = cpu_rope_backward, \
    .attention_backward = cpu_attention_backward, \
    .glu_backward = cpu_glu_backward, \
    .layernorm_forward = cpu_layernorm, \
    .layernorm_backward = cpu_layernorm_backward, \
    .gelu_forward = cpu_gelu, \
    .gelu_backward = cpu_gelu_backward, \
    .logprob_backward = cpu_logprob_backward, \
    .gemm = cpu_gemm, \
    .gather_rows = cpu_gather_rows, \
    .scatter_rows = cpu_scatter_rows, \
    .adamw = cpu_adamw, \
    .adamw_host_moments = cpu_adamw_host_moments, \
    .grad_norm = cpu_grad_norm, \
    .all_finite = cpu_all_finite, \
    .scale = cpu_scale, \
    .round_values = cpu_round_values, \
    .close = cpu_close,

static const Backend cpu = {.name = "cpu", CPU_TABLE};

// "cpu-staged": the same ops and memory, but on_device, so that model, rollout and trainer code take a device's
// paths (workspaces from alloc, explicit upload/download, files staged through the host) while every number is
// the CPU's: a run on it must equal the CPU's bit for bit. A test device for the seam. Its memory is host memory,
// so it cannot tell a missing copy from a real one (the emulated device under ASan can).
static const Backend cpu_staged = {.name = "cpu-staged", .on_device = 1, CPU_TABLE};


const Backend *backend_cpu(void) { return &cpu; }

const Backend *backend_cpu_staged(void) { return &cpu_staged; }

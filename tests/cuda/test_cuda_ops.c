// Every op of the CUDA backend against the CPU backend's (nn/ops.h, itself checked against PyTorch) on
// the same random inputs, at sizes that cross the kernels' tiles (32-key attention tiles, 256-row
// log-prob chunks, 1024-thread sampler blocks). Exits 77 (ctest: skipped) when no GPU is visible; fails
// when the build has CUDA and it cannot be used (the module does not load, a driver too old), naming why.
// Before either, a host check of the attention kernel's lane map (no GPU needed).
//
// Tolerances: both sides accumulate in fp32 in different orders. A sum of n random-signed terms then
// differs by about u sqrt(n) of its own scale (u = 6e-8), a sum of n positive terms (softmax) by at most
// u n; each bound below is 8 times that, relative to the output's scale (an error of a real bug, a
// wrong row or a missing term, is O(1)). Exact checks (rounding, copies, gathers, greedy ids) use 0.
#define _POSIX_C_SOURCE 200809L  // setenv
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/rng.h"
#include "base/util.h"
#include "cuda/cuda_backend.h"
#include "nn/ops.h"

#define U 6e-8

static int g_failures, g_checks;
static Rng g_rng;
static const Backend *g_cpu, *g_gpu;

static void report(const char *op, double err, double tol) {
    int ok = err <= tol;  // NaN fails
    g_checks++;
    g_failures += !ok;
    printf("%s  %-52s err %.2e (tol %.0e)\n", ok ? "PASS" : "FAIL", op, err, tol);
    fflush(stdout);
}

static float *randn(int64_t n, float scale) {
    float *p = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = scale * rng_normal(&g_rng);
    return p;
}

static uint16_t *to_bf16(const float *x, int64_t n) {
    uint16_t *p = xmalloc((size_t)(n > 0 ? n : 1) * 2);
    dtype_from_f32(DTYPE_BF16, x, p, (size_t)n);
    return p;
}

// A device copy of n bytes of host memory.
static void *up(const void *host, size_t bytes) {
    void *d = g_gpu->alloc(g_gpu, bytes);
    g_gpu->upload(g_gpu, d, host, bytes);
    return d;
}

static float *down(const void *dev, int64_t n) {
    float *h = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    g_gpu->download(g_gpu, h, dev, (size_t)n * sizeof *h);
    return h;
}

// max |a - b| / (max |b| + floor)
static double rel_err(const float *a, const float *b, int64_t n, double floor) {
    double d = 0.0, m = floor;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        if (a[i] != a[i]) d = INFINITY;
        m = fmax(m, fabs((double)b[i]));
    }
    return d / m;
}

static double max_abs(const float *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i]));
    return m;
}

static void gfree(void *p) { g_gpu->free(g_gpu, p); }

static void test_elementwise(int64_t n) {
    char op[96];
    float *x = randn(n, 3.0f), *y = randn(n, 1.0f);
    void *dx = up(x, (size_t)n * 4), *dy = up(y, (size_t)n * 4), *d16 = g_gpu->alloc(g_gpu, (size_t)n * 2);
    uint16_t *want16 = to_bf16(x, n), *got16 = xmalloc((size_t)n * 2);
    g_gpu->round_operand(g_gpu, DTYPE_BF16, dx, d16, n);
    g_gpu->download(g_gpu, got16, d16, (size_t)n * 2);
    snprintf(op, sizeof op, "round_operand bf16 n%lld (bits)", (long long)n);
    report(op, memcmp(want16, got16, (size_t)n * 2) ? 1.0 : 0.0, 0.0);

    float *want = xmalloc((size_t)n * 4), *dout = g_gpu->alloc(g_gpu, (size_t)n * 4);
    swiglu_forward(want, x, y, n);
    g_gpu->swiglu_forward(g_gpu, dout, dx, dy, n);
    float *got = down(dout, n);
    snprintf(op, sizeof op, "swiglu n%lld", (long long)n);
    report(op, rel_err(got, want, n, 1e-3), 1e-6);  // expf vs the CPU's exp polynomial: ulps
    free(got);

    memcpy(want, x, (size_t)n * 4);
    residual_forward(want, y, n);
    g_gpu->residual_forward(g_gpu, dx, dy, n);
    got = down(dx, n);
    snprintf(op, sizeof op, "residual n%lld", (long long)n);
    report(op, rel_err(got, want, n, 0.0), 0.0);
    free(got), free(x), free(y), free(want), free(want16), free(got16);
    gfree(dx), gfree(dy), gfree(d16), gfree(dout);
}

static void test_embedding_rmsnorm(int64_t N, int64_t C, int64_t V) {
    char op[96];
    float *table = randn(V * C, 1.0f), *w = randn(C, 1.0f), *x = randn(N * C, 2.0f);
    uint16_t *t16 = to_bf16(table, V * C), *w16 = to_bf16(w, C);
    int32_t *tok = xmalloc((size_t)N * sizeof *tok);
    for (int64_t i = 0; i < N; i++) tok[i] = (int32_t)(rng_next_u64(&g_rng) % (uint64_t)V);
    float *want = xmalloc((size_t)(N * C) * 4), *dout = g_gpu->alloc(g_gpu, (size_t)(N * C) * 4);
    void *dt = up(t16, (size_t)(V * C) * 2), *dtok = up(tok, (size_t)N * 4), *dw = up(w16, (size_t)C * 2);
    void *dx = up(x, (size_t)(N * C) * 4);
    embedding_forward(want, tok, t16, DTYPE_BF16, N, C);
    g_gpu->embedding_forward(g_gpu, dout, dtok, dt, DTYPE_BF16, N, C);
    float *got = down(dout, N * C);
    snprintf(op, sizeof op, "embedding N%lld C%lld V%lld", (long long)N, (long long)C, (long long)V);
    report(op, rel_err(got, want, N * C, 0.0), 0.0);
    free(got);
    rmsnorm_forward(want, x, w16, DTYPE_BF16, N, C, 1e-6f);
    g_gpu->rmsnorm_forward(g_gpu, dout, dx, dw, DTYPE_BF16, N, C, 1e-6f);
    got = down(dout, N * C);
    snprintf(op, sizeof op, "rmsnorm N%lld C%lld", (long long)N, (long long)C);
    report(op, rel_err(got, want, N * C, 0.0), 4e-7);  // sums in double on both sides: rounding of r only
    free(got), free(table), free(w), free(x), free(t16), free(w16), free(tok), free(want);
    gfree(dout), gfree(dt), gfree(dtok), gfree(dw), gfree(dx);
}

// bias: 0 none, 1 a bias, 2 a bias one element past an allocation's start (2-byte aligned). gpu: the
// backend under test (g_gpu, or one that adds biases with its own kernel, not cuBLASLt's epilogue).
static void test_matmul_on(const Backend *gpu, const char *how, int64_t N, int64_t C, int64_t OC, int bias) {
    char op[96];
    float *x = randn(N * C, 1.0f), *w = randn(OC * C, 1.0f), *b = randn(OC, 1.0f);
    uint16_t *x16 = to_bf16(x, N * C), *w16 = to_bf16(w, OC * C), *b16 = to_bf16(b, OC);
    float *want = xmalloc((size_t)(N * OC) * 4), *dout = gpu->alloc(gpu, (size_t)(N * OC) * 4);
    void *dx = gpu->alloc(gpu, (size_t)(N * C) * 2), *dw = gpu->alloc(gpu, (size_t)(OC * C) * 2);
    void *db = gpu->alloc(gpu, (size_t)(OC + 1) * 2);
    uint16_t *dbias = (uint16_t *)db + (bias == 2);
    gpu->upload(gpu, dx, x16, (size_t)(N * C) * 2);
    gpu->upload(gpu, dw, w16, (size_t)(OC * C) * 2);
    gpu->upload(gpu, dbias, b16, (size_t)OC * 2);
    matmul_forward(want, x16, w16, bias ? b16 : NULL, DTYPE_BF16, N, C, OC);
    gpu->matmul_forward(gpu, dout, dx, dw, bias ? dbias : NULL, DTYPE_BF16, N, C, OC);
    float *got = xmalloc((size_t)(N * OC) * 4);
    gpu->download(gpu, got, dout, (size_t)(N * OC) * 4);
    const char *what = bias == 2 ? " +bias (offset 1)" : " +bias";
    snprintf(op, sizeof op, "matmul bf16 N%lld C%lld OC%lld%s%s", (long long)N, (long long)C, (long long)OC,
             bias ? what : "", how);
    report(op, rel_err(got, want, N * OC, 0.0), 8.0 * U * sqrt((double)C));
    free(got), free(x), free(w), free(b), free(x16), free(w16), free(b16), free(want);
    gpu->free(gpu, dout);
    gpu->free(gpu, dx);
    gpu->free(gpu, dw);
    gpu->free(gpu, db);
}

static void test_matmul(int64_t N, int64_t C, int64_t OC, int bias) { test_matmul_on(g_gpu, "", N, C, OC, bias); }

static void test_rope(int64_t N, int H, int D) {
    char op[96];
    int32_t *pos = xmalloc((size_t)N * sizeof *pos);
    for (int64_t i = 0; i < N; i++) pos[i] = (int32_t)(rng_next_u64(&g_rng) % 40000);
    float *x = randn(N * H * D, 1.0f), *cs = xmalloc((size_t)(N * D) * 4);
    void *dpos = up(pos, (size_t)N * 4), *dx = up(x, (size_t)(N * H * D) * 4), *dcs = g_gpu->alloc(g_gpu, (size_t)(N * D) * 4);
    rope_table(cs, pos, N, D, 1e6);
    g_gpu->rope_table(g_gpu, dcs, dpos, N, D, 1e6);
    float *got = down(dcs, N * D);
    snprintf(op, sizeof op, "rope_table N%lld D%d", (long long)N, D);
    report(op, rel_err(got, cs, N * D, 0.0), 1e-7);  // double angles on both: float rounding of cos/sin
    free(got);
    rope_forward(x, cs, N, H, D);
    g_gpu->rope_forward(g_gpu, dx, dcs, N, H, D);
    got = down(dx, N * H * D);
    snprintf(op, sizeof op, "rope N%lld H%d D%d", (long long)N, H, D);
    report(op, rel_err(got, x, N * H * D, 0.0), 1e-6);
    free(got), free(pos), free(x), free(cs);
    gfree(dpos), gfree(dx), gfree(dcs);
}

static void test_attention(const int64_t *lens, int B, int H, int KVH, int D) {
    char op[96];
    int64_t *off = xmalloc((size_t)(B + 1) * sizeof *off), N = 0, T = 0;
    off[0] = 0;
    for (int b = 0; b < B; b++) {
        off[b + 1] = off[b] + lens[b];
        T = lens[b] > T ? lens[b] : T;
    }
    N = off[B];
    float *q = randn(N * H * D, 1.0f), *k = randn(N * KVH * D, 1.0f), *v = randn(N * KVH * D, 1.0f);
    float *want = xmalloc((size_t)(N * H * D) * 4), *scratch = xmalloc(attention_scratch_floats(T) * 4);
    attention_forward(want, NULL, q, k, v, off, B, H, KVH, D, scratch);
    void *dq = up(q, (size_t)(N * H * D) * 4), *dk = up(k, (size_t)(N * KVH * D) * 4), *dv = up(v, (size_t)(N * KVH * D) * 4);
    void *doff = up(off, (size_t)(B + 1) * 8), *dout = g_gpu->alloc(g_gpu, (size_t)(N * H * D) * 4);
    g_gpu->attention_forward(g_gpu, dout, NULL, dq, dk, dv, doff, B, N, H, KVH, D, NULL);
    float *got = down(dout, N * H * D);
    snprintf(op, sizeof op, "attention prefill B%d N%lld H%d KVH%d D%d", B, (long long)N, H, KVH, D);
    report(op, rel_err(got, want, N * H * D, 0.0), 8.0 * U * (double)(T + D));
    free(got);

    // Decode: the same keys as a cache of B slots (slot b = sequence b, padded to T), the last row of each
    // sequence as the query, n_keys = its length: the prefill's last rows again.
    float *kc = xcalloc((size_t)(B * T * KVH * D), 4), *vc = xcalloc((size_t)(B * T * KVH * D), 4);
    float *qd = xmalloc((size_t)(B * H * D) * 4), *wd = xmalloc((size_t)(B * H * D) * 4);
    int64_t *kv_off = xmalloc((size_t)B * 8);
    int32_t *nk = xmalloc((size_t)B * 4);
    for (int b = 0; b < B; b++) {
        kv_off[b] = (int64_t)b * T * KVH * D;
        nk[b] = (int32_t)lens[b];
        memcpy(kc + kv_off[b], k + off[b] * KVH * D, (size_t)(lens[b] * KVH * D) * 4);
        memcpy(vc + kv_off[b], v + off[b] * KVH * D, (size_t)(lens[b] * KVH * D) * 4);
        memcpy(qd + (int64_t)b * H * D, q + (off[b + 1] - 1) * H * D, (size_t)(H * D) * 4);
    }
    attention_decode_forward(wd, qd, kc, vc, kv_off, nk, B, H, KVH, D, scratch);
    void *dkc = up(kc, (size_t)(B * T * KVH * D) * 4), *dvc = up(vc, (size_t)(B * T * KVH * D) * 4);
    void *dqd = up(qd, (size_t)(B * H * D) * 4), *doffd = up(kv_off, (size_t)B * 8), *dnk = up(nk, (size_t)B * 4);
    void *dod = g_gpu->alloc(g_gpu, (size_t)(B * H * D) * 4);
    g_gpu->attention_decode_forward(g_gpu, dod, dqd, dkc, dvc, doffd, dnk, B, H, KVH, D, NULL);
    got = down(dod, B * H * D);
    snprintf(op, sizeof op, "attention decode B%d max keys %lld H%d KVH%d D%d", B, (long long)T, H, KVH, D);
    report(op, rel_err(got, wd, B * H * D, 0.0), 8.0 * U * (double)(T + D));
    free(got);

    // kv_append: row b of k (B, KVH*D) into slot b after its keys; the cache comes back as on the CPU.
    int64_t row = (int64_t)KVH * D, *dst = xmalloc((size_t)B * 8);
    float *kn = randn(B * row, 1.0f), *vn = randn(B * row, 1.0f);
    for (int b = 0; b < B; b++) dst[b] = kv_off[b] + (lens[b] < T ? lens[b] : T - 1) * row;
    void *ddst = up(dst, (size_t)B * 8), *dkn = up(kn, (size_t)(B * row) * 4), *dvn = up(vn, (size_t)(B * row) * 4);
    backend_cpu()->kv_append(backend_cpu(), kc, vc, kn, vn, dst, B, row);
    g_gpu->kv_append(g_gpu, dkc, dvc, dkn, dvn, ddst, B, row);
    float *gk = down(dkc, B * T * row), *gv = down(dvc, B * T * row);
    snprintf(op, sizeof op, "kv_append B%d row %lld", B, (long long)row);
    report(op, fmax(rel_err(gk, kc, B * T * row, 0.0), rel_err(gv, vc, B * T * row, 0.0)), 0.0);
    free(gk), free(gv), free(dst), free(kn), free(vn);
    gfree(ddst), gfree(dkn), gfree(dvn);

    free(off), free(q), free(k), free(v), free(want), free(scratch), free(kc), free(vc), free(qd), free(wd);
    free(kv_off), free(nk);
    gfree(dq), gfree(dk), gfree(dv), gfree(doff), gfree(dout), gfree(dkc), gfree(dvc), gfree(dqd), gfree(doffd);
    gfree(dnk), gfree(dod);
}

static void test_logprob(int64_t N, int64_t C, int64_t V) {
    char op[96];
    float *h = randn(N * C, 1.0f), *w = randn(V * C, 0.3f), *want = xmalloc((size_t)N * 4);
    uint16_t *w16 = to_bf16(w, V * C);
    int32_t *t = xmalloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) t[i] = i % 7 == 3 ? -1 : (int32_t)(rng_next_u64(&g_rng) % (uint64_t)V);
    size_t sf = logprob_scratch_floats(V, C, DTYPE_BF16);
    float *scratch = xmalloc(sf * 4);
    logprob_forward(want, NULL, h, w16, DTYPE_BF16, t, N, C, V, scratch);
    void *dh = up(h, (size_t)(N * C) * 4), *dw = up(w16, (size_t)(V * C) * 2), *dt = up(t, (size_t)N * 4);
    void *ds = g_gpu->alloc(g_gpu, sf * 4), *dout = g_gpu->alloc(g_gpu, (size_t)N * 4);
    g_gpu->logprob_forward(g_gpu, dout, NULL, dh, dw, DTYPE_BF16, dt, N, C, V, ds);
    float *got = down(dout, N);
    snprintf(op, sizeof op, "logprob_forward bf16 N%lld C%lld V%lld", (long long)N, (long long)C, (long long)V);
    // logits of scale 0.3 sqrt(C), off by 8 u sqrt(C) of that; the log-sum-exp is summed in double on both
    // sides over exponentials within an ulp or two: absolute error
    report(op, rel_err(got, want, N, 1.0) * fmax(1.0, max_abs(want, N)), 8.0 * U * (0.3 * (double)C + 1.0));
    free(got), free(h), free(w), free(want), free(w16), free(t), free(scratch);
    gfree(dh), gfree(dw), gfree(dt), gfree(ds), gfree(dout);
}

// log softmax(z / T)[id] in double: the reference for a sampled id's log-prob (T = 1 when greedy, as
// both samplers use).
static double host_logprob(const float *z, int64_t V, double T, int32_t id) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < V; j++) mx = fmax(mx, z[j]);
    for (int64_t j = 0; j < V; j++) sum += exp((z[j] - mx) / T);
    return (z[id] - mx) / T - log(sum);
}

// A tie at the top of row z: its ids set to the row's maximum + 1.
static void tie_at_top(float *z, int64_t V, const int64_t *ids, int n) {
    float mx = z[0];
    for (int64_t j = 1; j < V; j++) mx = z[j] > mx ? z[j] : mx;
    for (int i = 0; i < n; i++) z[ids[i]] = mx + 1.0f;
}

// Greedy: the CPU's ids exactly, and rows 0 and 1 tie at their maximum across threads, warps and (row 1,
// V > 1324) within a thread's stride: the lowest tied id wins. Sampling without truncation: both walk ids
// in order with the same u, so the ids agree unless u lands within rounding of a boundary (skipped rows).
// Top-k/top-p: the GPU's id must lie in the CPU's kept set (the GPU walks it in id order, the CPU in
// probability order, so the ids differ). Log-probs: each GPU id's against log_softmax(z / T)[id] on the
// host, never the CPU's (different id), relative to max(1, |lp|): the GPU rounds (z - max) / T to float
// before expf, an error of u |a| in each term's exponent a (|a| up to ~20 where the terms weigh), which
// the log of their sum keeps: 8 times 20 u.
static void test_sample(int B, int64_t V) {
    char op[96];
    float *z = randn((int64_t)B * V, 3.0f);
    const int64_t ties0[] = {V - 1, V / 2, 37, 5}, ties1[] = {V - 1, V > 1324 ? 1324 : V - 2, 301, 300};
    const int32_t lowest[2] = {5, 300};
    tie_at_top(z, V, ties0, 4);
    tie_at_top(z + V, V, ties1, 4);
    double *u = xmalloc((size_t)B * sizeof *u);
    for (int b = 0; b < B; b++) u[b] = (double)rng_next_float(&g_rng);
    int32_t *want = xmalloc((size_t)B * 4), *got = xmalloc((size_t)B * 4);
    float *lw = xmalloc((size_t)B * 4), *lg = xmalloc((size_t)B * 4);
    SamplerScratch scr = {xmalloc((size_t)V * 4), xmalloc((size_t)V * 4)};
    void *dz = up(z, (size_t)B * (size_t)V * 4);
    SamplerConfig cfgs[4] = {{0.0f, 0, 1.0f}, {0.8f, 0, 1.0f}, {1.0f, 50, 1.0f}, {1.2f, 40, 0.7f}};
    const char *names[4] = {"greedy", "T=0.8", "T=1 top-k 50", "T=1.2 top-k 40 top-p 0.7"};
    for (int c = 0; c < 4; c++) {
        SamplerConfig *sc = &cfgs[c];
        double T = sc->temperature > 0 ? sc->temperature : 1.0;
        for (int b = 0; b < B; b++) {  // poisoned: a call that wrote nothing cannot pass with the last config's
            got[b] = -1;
            lg[b] = NAN;
        }
        g_gpu->sample(g_gpu, sc, dz, B, V, u, NULL, got, lg);
        double bad = 0.0, lp_err = 0.0;
        for (int b = 0; b < B; b++) {
            const float *zb = z + (int64_t)b * V;
            want[b] = sampler_sample(sc, zb, V, u[b], &scr, &lw[b]);
            if (got[b] < 0 || got[b] >= V) {
                bad += 1.0;
                lp_err = INFINITY;
                continue;
            }
            double ref = host_logprob(zb, V, T, got[b]);
            lp_err = fmax(lp_err, fabs((double)lg[b] - ref) / fmax(1.0, fabs(ref)));
            if (c == 0) {
                bad += got[b] != want[b];
                if (b < 2) bad += got[b] != lowest[b];
            } else if (c == 1) {
                double mx = -INFINITY, sum = 0.0, cum = 0.0, near = 1.0;
                for (int64_t j = 0; j < V; j++) mx = fmax(mx, zb[j]);
                for (int64_t j = 0; j < V; j++) sum += exp((zb[j] - mx) / T);
                for (int64_t j = 0; j < V; j++) {
                    cum += exp((zb[j] - mx) / T);
                    near = fmin(near, fabs(cum - u[b] * sum) / sum);
                }
                if (near > 1e-5) bad += got[b] != want[b];
            } else {  // the GPU's id among the CPU's candidates: at least the probability of the CPU's last kept
                int64_t above = 0;  // ids strictly more likely than the GPU's pick
                for (int64_t j = 0; j < V; j++) above += zb[j] > zb[got[b]];
                int64_t kept = sc->top_k;
                if (sc->top_p < 1.0f) {  // the CPU's nucleus size within the top-k
                    float *s = xmalloc((size_t)V * 4);
                    for (int64_t j = 0; j < V; j++) s[j] = zb[j];
                    double total = 0.0, acc = 0.0, mx = -INFINITY;
                    for (int64_t j = 0; j < V; j++) mx = fmax(mx, s[j]);
                    // top-k largest by repeated max (k is small)
                    double *pk = xmalloc((size_t)sc->top_k * sizeof *pk);
                    for (int k = 0; k < sc->top_k; k++) {
                        int64_t arg = 0;
                        for (int64_t j = 1; j < V; j++) arg = s[j] > s[arg] ? j : arg;
                        pk[k] = exp((s[arg] - mx) / sc->temperature);
                        total += pk[k];
                        s[arg] = -INFINITY;
                    }
                    for (kept = 0; kept < sc->top_k && acc < sc->top_p * total;) acc += pk[kept++];
                    free(s), free(pk);
                }
                bad += above >= kept;
            }
        }
        snprintf(op, sizeof op, "sample %s B%d V%lld: ids", names[c], B, (long long)V);
        report(op, bad, 0.0);
        snprintf(op, sizeof op, "sample %s B%d V%lld: logprobs vs host", names[c], B, (long long)V);
        report(op, lp_err, 8.0 * 20.0 * U);
    }
    free(z), free(u), free(want), free(got), free(lw), free(lg), free(scr.prob), free(scr.idx);
    gfree(dz);
}

// k_attend's index loops run on the host for head_dim D and a block of `warps` warps (query heads of a
// group), as the kernel writes them with cuda_backend.h's lane map: the query row staged in shared memory,
// a tile of nt keys loaded by the whole block, each lane's accumulators and its output writes. Every
// element must be written exactly once and every index stay inside the kernel's arrays. Returns the
// number of violations.
static int attention_lane_map(int D, int warps, int nt) {
    enum { TK = 32 };  // k_attend's ATT_TK: keys per tile
    int bad = 0, threads = 32 * warps;
    int *qs = xcalloc(CUDA_ATT_DMAX, sizeof *qs), *tile = xcalloc((size_t)TK * CUDA_ATT_DMAX, sizeof *tile);
    int *out = xcalloc(CUDA_ATT_DMAX, sizeof *out);
    for (int lane = 0; lane < 32; lane++)  // one warp's row of Qs
        for (int d = lane; d < D; d += 32) {
            bad += d >= CUDA_ATT_DMAX;
            if (d < CUDA_ATT_DMAX) qs[d]++;
        }
    for (int t = 0; t < threads; t++)  // Ks/Vs [TK][DMAX + 1]
        for (int e = t; e < nt * D; e += threads) {
            int j = e / D, d = e % D;
            bad += j >= TK || d > CUDA_ATT_DMAX;
            if (j < TK && d < CUDA_ATT_DMAX) tile[j * CUDA_ATT_DMAX + d]++;
        }
    for (int lane = 0; lane < 32; lane++)  // acc[r] += p Vs[j][d]; out[d] = acc[r] / l
        for (int r = 0; r < CUDA_ATT_DREGS; r++) {
            int d = CUDA_ATT_DIM(lane, r);
            if (d >= D) continue;
            bad += d >= CUDA_ATT_DMAX;  // Vs's column (out's is d < D)
            if (d < CUDA_ATT_DMAX) out[d]++;
        }
    for (int d = 0; d < D && d < CUDA_ATT_DMAX; d++) {
        bad += qs[d] != 1;
        bad += out[d] != 1;
        for (int j = 0; j < nt; j++) bad += tile[j * CUDA_ATT_DMAX + d] != 1;
    }
    free(qs), free(tile), free(out);
    return bad;
}

// The lane map for the head_dims of the tiny preset and the test models (16, 24) and of Qwen2.5 (64,
// 128), at every group size (1..16 warps) and tile fill; then every D up to CUDA_ATT_DMAX.
static void test_attention_lane_map(void) {
    const int dims[] = {16, 24, 64, 128};
    char op[96];
    for (int i = 0; i < 4; i++) {
        int bad = 0;
        for (int warps = 1; warps <= 16; warps++)
            for (int nt = 1; nt <= 32; nt++) bad += attention_lane_map(dims[i], warps, nt);
        snprintf(op, sizeof op, "host: attention lane map D%d (violations)", dims[i]);
        report(op, bad, 0.0);
    }
    int bad = 0;
    for (int D = 1; D <= CUDA_ATT_DMAX; D++)
        for (int warps = 1; warps <= 16; warps += 5)
            for (int nt = 1; nt <= 32; nt += 31) bad += attention_lane_map(D, warps, nt);
    snprintf(op, sizeof op, "host: attention lane map D1..%d (violations)", CUDA_ATT_DMAX);
    report(op, bad, 0.0);
}

// Every op on shapes that cross the kernels' tiles and blocks: rows and widths that are not multiples of them,
// head_dim 16..128 (multiples of 32 or not), long rows, the real vocabulary for the sampler and log-prob head.
static void test_all_ops(void) {
    test_elementwise(1);
    test_elementwise(100003);
    test_embedding_rmsnorm(37, 896, 1000);
    test_embedding_rmsnorm(3, 3584, 50);
    test_embedding_rmsnorm(5, 100, 7);  // C below one block of threads
    test_matmul(1, 96, 200, 1);
    test_matmul(5, 130, 33, 1);  // odd sizes: unaligned operands
    test_matmul(7, 64, 96, 2);   // a bias 2 bytes past an allocation's start
    test_matmul(300, 896, 1152, 1);
    test_matmul(300, 896, 1152, 2);
    test_matmul(64, 4864, 896, 0);
    test_rope(37, 14, 64);
    test_rope(300, 28, 128);
    test_rope(37, 4, 16);
    test_rope(5, 3, 40);
    const int64_t l1[] = {1, 33, 70}, l2[] = {64, 5}, l3[] = {130, 31, 2};
    test_attention(l1, 3, 14, 2, 64);  // GQA 7, tiles crossed at 32 and 64 keys
    test_attention(l2, 2, 28, 4, 128);
    test_attention(l3, 3, 4, 4, 64);   // MHA
    test_attention(l1, 3, 4, 2, 16);   // the tiny preset's head_dim: half a warp's lanes idle
    test_attention(l3, 3, 6, 2, 24);   // the generate test models': not a multiple of 16 either
    test_attention(l2, 2, 6, 3, 40);   // past one lane per dimension, not a multiple of 32
    test_attention(l1, 3, 16, 1, 80);  // 16 query heads per kv head: the largest group
    test_attention(l3, 3, 2, 2, 96);
    test_attention(l2, 2, 4, 2, 112);
    test_logprob(300, 64, 1000);       // crosses the 256-row chunk; target -1 rows
    test_logprob(5, 896, 151936);
    test_sample(37, 1000);
    test_sample(3, 151936);
}

// test_cuda_ops [--device cuda|emu]: the GPU (default; skipped without one) or the emulated device.
int main(int argc, char **argv) {
    const char *device = argc == 3 && !strcmp(argv[1], "--device") ? argv[2] : "cuda";
    if (argc != 1 && argc != 3) {
        fprintf(stderr, "usage: test_cuda_ops [--device cuda|emu]\n");
        return 2;
    }
    test_attention_lane_map();
    if (g_failures) {
        printf("test_cuda_ops: %d checks, %d failed (host checks; the CUDA ops were not run)\n", g_checks,
               g_failures);
        return 1;
    }
    g_cpu = backend_cpu();
    rng_init(&g_rng, 2024);
    if (!strcmp(device, "emu")) {
        g_gpu = backend_open("emu", "test_cuda_ops");
        test_all_ops();
    } else {
        char why[1024];
        int n_gpus = backend_cuda_devices(why, sizeof why);
        if (n_gpus < 0) {
            printf("FAIL  the CUDA backend cannot be used: %s\n", why);
            return 1;
        }
        if (n_gpus == 0) {
            printf("SKIPPED: no CUDA GPU visible (%s): the CUDA ops were not run\n", why);
            return 77;
        }
        g_gpu = backend_open(device, "test_cuda_ops");
        test_all_ops();
        // The bias added by our kernel instead of cuBLASLt's epilogue (its fallback when cuBLASLt refuses).
        setenv("GRPO_CUDA_BIAS_EPILOGUE", "0", 1);
        const Backend *unfused = backend_open(device, "test_cuda_ops");
        unsetenv("GRPO_CUDA_BIAS_EPILOGUE");
        test_matmul_on(unfused, ", bias kernel", 5, 130, 33, 1);
        test_matmul_on(unfused, ", bias kernel", 300, 896, 1152, 2);
        backend_close(unfused);
    }
    // Training ops this backend has not implemented yet: listed, neither passed nor failed.
    char missing[512];
    backend_missing_training_ops(g_gpu, missing, sizeof missing);
    if (*missing) printf("NOT IMPLEMENTED on this backend (training ops): %s\n", missing);
    printf("test_cuda_ops on %s: %d checks, %d failed\n", g_gpu->name, g_checks, g_failures);
    backend_close(g_gpu);
    return g_failures != 0;
}

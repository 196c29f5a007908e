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
#include "nn/optim.h"

#define U 6e-8

static int g_failures, g_checks;
static int g_small;  // --small: no large shapes
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
    float *got;
    for (int act = GLU_SILU; act <= GLU_GELU_TANH; act++) {
        glu_forward(want, x, y, n, (GluAct)act);
        g_gpu->glu_forward(g_gpu, dout, dx, dy, n, (GluAct)act);
        got = down(dout, n);
        snprintf(op, sizeof op, "glu %s n%lld", act == GLU_SILU ? "silu" : "gelu-tanh", (long long)n);
        report(op, rel_err(got, want, n, 1e-3), 1e-6);  // expf vs the CPU's exp polynomial, tanhf: ulps
        free(got);
    }

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
    for (int off = 0; off <= 1; off++) {  // Gemma's (1 + w) with offset 1
        rmsnorm_forward(want, x, w16, DTYPE_BF16, N, C, 1e-6f, (float)off);
        g_gpu->rmsnorm_forward(g_gpu, dout, dx, dw, DTYPE_BF16, N, C, 1e-6f, (float)off);
        got = down(dout, N * C);
        snprintf(op, sizeof op, "rmsnorm N%lld C%lld offset %d", (long long)N, (long long)C, off);
        report(op, rel_err(got, want, N * C, 0.0), 4e-7);  // sums in double on both sides: rounding of r only
        free(got);
    }
    free(table), free(w), free(x), free(t16), free(w16), free(tok), free(want);
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
    // Llama 3's rescaled frequencies (Llama-3.2's), then plain ones, which the rotations below use
    RopeFreqs llama3 = {5e5, ROPE_LLAMA3, 32.0, 1.0, 4.0, 8192}, plain = {.theta = 1e6};
    for (int k = 0; k < 2; k++) {
        RopeFreqs f = k ? plain : llama3;
        rope_table(cs, pos, N, D, f);
        g_gpu->rope_table(g_gpu, dcs, dpos, N, D, f);
        float *got = down(dcs, N * D);
        snprintf(op, sizeof op, "rope_table%s N%lld D%d", k ? "" : " llama3", (long long)N, D);
        report(op, rel_err(got, cs, N * D, 0.0), 1e-7);  // double angles on both: float rounding of cos/sin
        free(got);
    }
    float *got;
    rope_forward(x, cs, N, H, D);
    g_gpu->rope_forward(g_gpu, dx, dcs, N, H, D);
    got = down(dx, N * H * D);
    snprintf(op, sizeof op, "rope N%lld H%d D%d", (long long)N, H, D);
    report(op, rel_err(got, x, N * H * D, 0.0), 1e-6);
    free(got);
    g_gpu->upload(g_gpu, dx, x, (size_t)(N * H * D) * 4);  // the backward from the same values
    rope_backward(x, cs, N, H, D);
    g_gpu->rope_backward(g_gpu, dx, dcs, N, H, D);
    got = down(dx, N * H * D);
    snprintf(op, sizeof op, "rope_backward N%lld H%d D%d", (long long)N, H, D);
    report(op, rel_err(got, x, N * H * D, 0.0), 1e-6);
    free(got), free(pos), free(x), free(cs);
    gfree(dpos), gfree(dx), gfree(dcs);
}

// window > 0: sliding-window attention
static void test_attention(const int64_t *lens, int B, int H, int KVH, int D, int64_t window) {
    char op[112];
    AttnShape a = attn_shape(H, KVH, D, window);
    int64_t *off = xmalloc((size_t)(B + 1) * sizeof *off), N = 0, T = 0;
    off[0] = 0;
    for (int b = 0; b < B; b++) {
        off[b + 1] = off[b] + lens[b];
        T = lens[b] > T ? lens[b] : T;
    }
    N = off[B];
    float *q = randn(N * H * D, 1.0f), *k = randn(N * KVH * D, 1.0f), *v = randn(N * KVH * D, 1.0f);
    float *want = xmalloc((size_t)(N * H * D) * 4), *scratch = xmalloc(attention_scratch_floats(T) * 4);
    attention_forward(want, NULL, q, k, v, off, B, a, scratch);
    void *dq = up(q, (size_t)(N * H * D) * 4), *dk = up(k, (size_t)(N * KVH * D) * 4), *dv = up(v, (size_t)(N * KVH * D) * 4);
    void *doff = up(off, (size_t)(B + 1) * 8), *dout = g_gpu->alloc(g_gpu, (size_t)(N * H * D) * 4);
    g_gpu->attention_forward(g_gpu, dout, NULL, dq, dk, dv, doff, B, N, a, NULL);
    float *got = down(dout, N * H * D);
    snprintf(op, sizeof op, "attention prefill B%d N%lld H%d KVH%d D%d window %lld", B, (long long)N, H, KVH, D,
             (long long)window);
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
    attention_decode_forward(wd, qd, kc, vc, DTYPE_F32, kv_off, nk, B, a, scratch);
    void *dkc = up(kc, (size_t)(B * T * KVH * D) * 4), *dvc = up(vc, (size_t)(B * T * KVH * D) * 4);
    void *dqd = up(qd, (size_t)(B * H * D) * 4), *doffd = up(kv_off, (size_t)B * 8), *dnk = up(nk, (size_t)B * 4);
    void *dod = g_gpu->alloc(g_gpu, (size_t)(B * H * D) * 4);
    g_gpu->attention_decode_forward(g_gpu, dod, dqd, dkc, dvc, DTYPE_F32, doffd, dnk, B, a, NULL);
    got = down(dod, B * H * D);
    snprintf(op, sizeof op, "attention decode B%d max keys %lld H%d KVH%d D%d window %lld", B, (long long)T, H, KVH,
             D, (long long)window);
    report(op, rel_err(got, wd, B * H * D, 0.0), 8.0 * U * (double)(T + D));
    free(got);

    // Extend (decoder_extend: a prompt's rows after its cached ones): every row of each sequence a query against
    // its slot, attending up to its own position, several rows a slot: the prefill's rows again, on both sides.
    int64_t *row_off = xmalloc((size_t)N * 8);
    int32_t *row_nk = xmalloc((size_t)N * 4);
    for (int b = 0; b < B; b++) {
        for (int64_t i = 0; i < lens[b]; i++) {
            row_off[off[b] + i] = kv_off[b];
            row_nk[off[b] + i] = (int32_t)(i + 1);
        }
    }
    float *we = xmalloc((size_t)(N * H * D) * 4);
    attention_decode_forward(we, q, kc, vc, DTYPE_F32, row_off, row_nk, (int)N, a, scratch);
    void *drow_off = up(row_off, (size_t)N * 8), *drow_nk = up(row_nk, (size_t)N * 4);
    void *dext = g_gpu->alloc(g_gpu, (size_t)(N * H * D) * 4);
    g_gpu->attention_decode_forward(g_gpu, dext, dq, dkc, dvc, DTYPE_F32, drow_off, drow_nk, (int)N, a, NULL);
    got = down(dext, N * H * D);
    snprintf(op, sizeof op, "attention extend B%d N%lld H%d KVH%d D%d window %lld (CPU's too)", B, (long long)N, H,
             KVH, D, (long long)window);
    report(op, fmax(rel_err(got, want, N * H * D, 0.0), rel_err(we, want, N * H * D, 0.0)), 8.0 * U * (double)(T + D));
    free(got);

    // A bf16 cache (--kv-cache-dtype bf16): decode and extend read its elements widened, giving what the fp32
    // ops give over those values widened, on the CPU and the device.
    int64_t nc = B * T * KVH * D;
    uint16_t *kc16 = to_bf16(kc, nc), *vc16 = to_bf16(vc, nc);
    float *kcw = xmalloc((size_t)nc * 4), *vcw = xmalloc((size_t)nc * 4);
    dtype_to_f32(DTYPE_BF16, kc16, kcw, (size_t)nc);
    dtype_to_f32(DTYPE_BF16, vc16, vcw, (size_t)nc);
    void *dkc16 = up(kc16, (size_t)nc * 2), *dvc16 = up(vc16, (size_t)nc * 2);
    float *w32 = xmalloc((size_t)(N * H * D) * 4), *w16 = xmalloc((size_t)(N * H * D) * 4);
    for (int ext = 0; ext < 2; ext++) {  // decode's last rows, then extend's every row
        const int64_t *o = ext ? row_off : kv_off;
        const int32_t *n = ext ? row_nk : nk;
        const float *qq = ext ? q : qd;
        int rows = ext ? (int)N : B;
        attention_decode_forward(w32, qq, kcw, vcw, DTYPE_F32, o, n, rows, a, scratch);
        attention_decode_forward(w16, qq, kc16, vc16, DTYPE_BF16, o, n, rows, a, scratch);
        g_gpu->attention_decode_forward(g_gpu, ext ? dext : dod, ext ? dq : dqd, dkc16, dvc16, DTYPE_BF16,
                                        ext ? drow_off : doffd, ext ? drow_nk : dnk, rows, a, NULL);
        got = down(ext ? dext : dod, rows * H * D);
        snprintf(op, sizeof op, "attention %s, bf16 cache B%d H%d KVH%d D%d window %lld (CPU's too)",
                 ext ? "extend" : "decode", B, H, KVH, D, (long long)window);
        report(op, fmax(rel_err(got, w32, rows * H * D, 0.0), rel_err(w16, w32, rows * H * D, 0.0)),
               8.0 * U * (double)(T + D));
        free(got);
    }
    free(kcw), free(vcw), free(w32), free(w16);
    free(we), free(row_off), free(row_nk);
    gfree(drow_off), gfree(drow_nk), gfree(dext);

    // kv_append: row b of k (B, KVH*D) into slot b after its keys; the cache comes back as on the CPU.
    int64_t row = (int64_t)KVH * D, *dst = xmalloc((size_t)B * 8);
    float *kn = randn(B * row, 1.0f), *vn = randn(B * row, 1.0f);
    for (int b = 0; b < B; b++) dst[b] = kv_off[b] + (lens[b] < T ? lens[b] : T - 1) * row;
    void *ddst = up(dst, (size_t)B * 8), *dkn = up(kn, (size_t)(B * row) * 4), *dvn = up(vn, (size_t)(B * row) * 4);
    backend_cpu()->kv_append(backend_cpu(), kc, vc, DTYPE_F32, kn, vn, dst, B, row);
    g_gpu->kv_append(g_gpu, dkc, dvc, DTYPE_F32, dkn, dvn, ddst, B, row);
    float *gk = down(dkc, B * T * row), *gv = down(dvc, B * T * row);
    snprintf(op, sizeof op, "kv_append B%d row %lld", B, (long long)row);
    report(op, fmax(rel_err(gk, kc, B * T * row, 0.0), rel_err(gv, vc, B * T * row, 0.0)), 0.0);
    free(gk), free(gv);
    // into the bf16 cache: rounded to nearest even, bit for bit as the CPU rounds
    backend_cpu()->kv_append(backend_cpu(), kc16, vc16, DTYPE_BF16, kn, vn, dst, B, row);
    g_gpu->kv_append(g_gpu, dkc16, dvc16, DTYPE_BF16, dkn, dvn, ddst, B, row);
    uint16_t *gk16 = xmalloc((size_t)nc * 2), *gv16 = xmalloc((size_t)nc * 2);
    g_gpu->download(g_gpu, gk16, dkc16, (size_t)nc * 2);
    g_gpu->download(g_gpu, gv16, dvc16, (size_t)nc * 2);
    snprintf(op, sizeof op, "kv_append B%d row %lld, bf16 cache (bits differing)", B, (long long)row);
    report(op, (double)(memcmp(gk16, kc16, (size_t)nc * 2) != 0) + (memcmp(gv16, vc16, (size_t)nc * 2) != 0), 0.0);
    free(gk16), free(gv16), free(kc16), free(vc16), free(dst), free(kn), free(vn);
    gfree(dkc16), gfree(dvc16);
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

// ---------------------------------------------------------------------------------------------
// training ops: each against the CPU's on the same inputs; gradients that add (+=) start from random values.

// The device result at dev (n floats) against the host's want: report(op, rel_err(..., floor), tol).
static void check(const char *op, const void *dev, const float *want, int64_t n, double floor, double tol) {
    float *got = down(dev, n);
    report(op, rel_err(got, want, n, floor), tol);
    free(got);
}

static float *copy_of(const float *x, int64_t n) {
    float *p = xmalloc((size_t)(n > 0 ? n : 1) * 4);
    memcpy(p, x, (size_t)n * 4);
    return p;
}

static void test_train_elementwise(int64_t n) {
    char op[96];
    float *x = randn(n, 3.0f), *y = randn(n, 1.0f), *d = randn(n, 1.0f);
    float *wg = xmalloc((size_t)n * 4), *wu = xmalloc((size_t)n * 4);
    void *dx = up(x, (size_t)n * 4), *dy = up(y, (size_t)n * 4), *dd = up(d, (size_t)n * 4);
    void *dg = g_gpu->alloc(g_gpu, (size_t)n * 4), *du = g_gpu->alloc(g_gpu, (size_t)n * 4);
    for (int act = GLU_SILU; act <= GLU_GELU_TANH; act++) {
        const char *name = act == GLU_SILU ? "silu" : "gelu-tanh";
        glu_backward(wg, wu, d, x, y, n, (GluAct)act);
        g_gpu->glu_backward(g_gpu, dg, du, dd, dx, dy, n, (GluAct)act);
        snprintf(op, sizeof op, "glu_backward %s n%lld (dgate, dup)", name, (long long)n);
        float *gg = down(dg, n), *gu = down(du, n);
        report(op, fmax(rel_err(gg, wg, n, 1e-3), rel_err(gu, wu, n, 1e-3)), 1e-6);  // expf vs exp_approx: ulps
        free(gg), free(gu);
        g_gpu->glu_backward(g_gpu, dd, du, dd, dx, dy, n, (GluAct)act);  // dout aliasing dgate
        snprintf(op, sizeof op, "glu_backward %s n%lld, dout = dgate", name, (long long)n);
        check(op, dd, wg, n, 1e-3, 1e-6);
        g_gpu->upload(g_gpu, dd, d, (size_t)n * 4);  // dout again for the next activation
    }

    gelu_forward(wg, x, n);
    g_gpu->gelu_forward(g_gpu, dg, dx, n);
    snprintf(op, sizeof op, "gelu n%lld", (long long)n);
    check(op, dg, wg, n, 1e-3, 1e-6);  // erff on both sides: ulps
    gelu_backward(wg, d, x, n);
    g_gpu->upload(g_gpu, dd, d, (size_t)n * 4);
    g_gpu->gelu_backward(g_gpu, dg, dd, dx, n);
    snprintf(op, sizeof op, "gelu_backward n%lld", (long long)n);
    check(op, dg, wg, n, 0.0, 1e-7);  // in double on both sides, then one float product

    memcpy(wg, x, (size_t)n * 4);
    grad_scale(wg, (size_t)n, 0.37f);
    g_gpu->upload(g_gpu, dg, x, (size_t)n * 4);
    g_gpu->scale(g_gpu, dg, (size_t)n, 0.37f);
    snprintf(op, sizeof op, "scale n%lld", (long long)n);
    check(op, dg, wg, n, 0.0, 0.0);
    // rounding: values across fp16's range (normal, subnormal, past 65504) and bf16's
    float *r = randn(n, 1.0f);
    for (int64_t i = 0; i < n; i++) r[i] *= powf(2.0f, (float)(i % 48) - 30.0f);
    g_gpu->upload(g_gpu, dx, r, (size_t)n * 4);
    const DType kinds[3] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    for (int k = 0; k < 3; k++) {
        round_to_dtype(wg, r, (size_t)n, kinds[k]);
        g_gpu->round_values(g_gpu, dg, dx, (size_t)n, kinds[k]);
        float *got = down(dg, n);
        snprintf(op, sizeof op, "round_values %s n%lld (bits)", dtype_name(kinds[k]), (long long)n);
        report(op, memcmp(got, wg, (size_t)n * 4) ? 1.0 : 0.0, 0.0);
        free(got);
    }
    g_gpu->zero(g_gpu, dg, (size_t)n * 4);
    memset(wg, 0, (size_t)n * 4);
    snprintf(op, sizeof op, "zero n%lld", (long long)n);
    check(op, dg, wg, n, 1.0, 0.0);
    free(x), free(y), free(d), free(wg), free(wu), free(r);
    gfree(dx), gfree(dy), gfree(dd), gfree(dg), gfree(du);
}

// gather_rows / scatter_rows of n rows of width floats out of (into) `rows_total` rows.
static void test_rows(int64_t rows_total, int64_t n, int64_t width) {
    char op[96];
    float *src = randn(rows_total * width, 1.0f), *dst = randn(rows_total * width, 1.0f);
    int64_t *idx = xmalloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) idx[i] = (i * 7 + 3) % rows_total;  // distinct while n <= rows_total
    float *want = xmalloc((size_t)(n * width) * 4);
    backend_cpu()->gather_rows(backend_cpu(), want, src, idx, n, width, 0.5f);
    void *dsrc = up(src, (size_t)(rows_total * width) * 4), *didx = up(idx, (size_t)n * 8);
    void *dg = g_gpu->alloc(g_gpu, (size_t)(n * width) * 4), *ddst = up(dst, (size_t)(rows_total * width) * 4);
    g_gpu->gather_rows(g_gpu, dg, dsrc, didx, n, width, 0.5f);
    snprintf(op, sizeof op, "gather_rows %lld of %lld, width %lld", (long long)n, (long long)rows_total,
             (long long)width);
    check(op, dg, want, n * width, 0.0, 0.0);
    backend_cpu()->scatter_rows(backend_cpu(), dst, want, idx, n, width, 3.0f);
    g_gpu->scatter_rows(g_gpu, ddst, dg, didx, n, width, 3.0f);
    snprintf(op, sizeof op, "scatter_rows %lld of %lld, width %lld", (long long)n, (long long)rows_total,
             (long long)width);
    check(op, ddst, dst, rows_total * width, 0.0, 0.0);
    free(src), free(dst), free(idx), free(want);
    gfree(dsrc), gfree(didx), gfree(dg), gfree(ddst);
}

// embedding, RMSNorm and LayerNorm backwards; tokens repeat (V < N) so rows of dtable take several adds.
static void test_norms_backward(int64_t N, int64_t C, int64_t V) {
    char op[96];
    float *x = randn(N * C, 2.0f), *dy = randn(N * C, 1.0f), *w = randn(C, 1.0f), *b = randn(C, 1.0f);
    float *dx0 = randn(N * C, 1.0f), *dw0 = randn(C, 1.0f), *db0 = randn(C, 1.0f), *dt0 = randn(V * C, 1.0f);
    uint16_t *w16 = to_bf16(w, C);
    int32_t *tok = xmalloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) tok[i] = (int32_t)(rng_next_u64(&g_rng) % (uint64_t)V);
    void *dX = up(x, (size_t)(N * C) * 4), *dDY = up(dy, (size_t)(N * C) * 4), *dW16 = up(w16, (size_t)C * 2);
    void *dWf = up(w, (size_t)C * 4), *dB = up(b, (size_t)C * 4), *dTok = up(tok, (size_t)N * 4);
    void *ddx = up(dx0, (size_t)(N * C) * 4), *ddw = up(dw0, (size_t)C * 4), *ddb = up(db0, (size_t)C * 4);
    void *ddt = up(dt0, (size_t)(V * C) * 4);
    float *wdt = copy_of(dt0, V * C), *wdx = copy_of(dx0, N * C), *wdw = copy_of(dw0, C), *wdb = copy_of(db0, C);

    embedding_backward(wdt, dy, tok, N, C);
    g_gpu->embedding_backward(g_gpu, ddt, dDY, dTok, N, C);
    snprintf(op, sizeof op, "embedding_backward N%lld C%lld V%lld", (long long)N, (long long)C, (long long)V);
    check(op, ddt, wdt, V * C, 0.0, 0.0);  // the same adds in the same order

    for (int off = 0; off <= 1; off++) {  // the second pass adds to the first's sums on both sides
        rmsnorm_backward(wdx, wdw, dy, x, w16, DTYPE_BF16, N, C, 1e-6f, (float)off);
        g_gpu->rmsnorm_backward(g_gpu, ddx, ddw, dDY, dX, dW16, DTYPE_BF16, N, C, 1e-6f, (float)off);
        snprintf(op, sizeof op, "rmsnorm_backward N%lld C%lld offset %d: dinp", (long long)N, (long long)C, off);
        check(op, ddx, wdx, N * C, 0.0, 1e-6);  // sums in double on both sides: rounding of r and r^3 mean
        snprintf(op, sizeof op, "rmsnorm_backward N%lld C%lld offset %d: dweight", (long long)N, (long long)C, off);
        check(op, ddw, wdw, C, 0.0, 8.0 * U * sqrt((double)N));
    }

    float *want = xmalloc((size_t)(N * C) * 4);
    layernorm_forward(want, x, w, b, N, C, 1e-6f);
    void *dout = g_gpu->alloc(g_gpu, (size_t)(N * C) * 4);
    g_gpu->layernorm_forward(g_gpu, dout, dX, dWf, dB, N, C, 1e-6f);
    snprintf(op, sizeof op, "layernorm N%lld C%lld", (long long)N, (long long)C);
    check(op, dout, want, N * C, 0.0, 4e-7);  // statistics in double: rounding only
    memcpy(wdx, dx0, (size_t)(N * C) * 4);
    memcpy(wdw, dw0, (size_t)C * 4);
    g_gpu->upload(g_gpu, ddx, dx0, (size_t)(N * C) * 4);
    g_gpu->upload(g_gpu, ddw, dw0, (size_t)C * 4);
    layernorm_backward(wdx, wdw, wdb, dy, x, w, N, C, 1e-6f);
    g_gpu->layernorm_backward(g_gpu, ddx, ddw, ddb, dDY, dX, dWf, N, C, 1e-6f);
    snprintf(op, sizeof op, "layernorm_backward N%lld C%lld: dinp, dweight, dbias", (long long)N, (long long)C);
    float *gx = down(ddx, N * C), *gw = down(ddw, C), *gb = down(ddb, C);
    double err = fmax(rel_err(gx, wdx, N * C, 0.0), fmax(rel_err(gw, wdw, C, 0.0), rel_err(gb, wdb, C, 0.0)));
    report(op, err, 1e-6);  // every sum in double: the statistics' last bits only
    free(gx), free(gw), free(gb);
    free(x), free(dy), free(w), free(b), free(dx0), free(dw0), free(db0), free(dt0), free(w16), free(tok);
    free(wdt), free(wdx), free(wdw), free(wdb), free(want);
    gfree(dX), gfree(dDY), gfree(dW16), gfree(dWf), gfree(dB), gfree(dTok), gfree(ddx), gfree(ddw), gfree(ddb);
    gfree(ddt), gfree(dout);
}

// matmul_backward with bf16 operands (dinp, dweight, dbias add), and the fp32 gemm in its four transpositions.
static void test_matmul_backward(int64_t N, int64_t C, int64_t OC) {
    char op[96];
    float *dy = randn(N * OC, 1.0f), *x = randn(N * C, 1.0f), *w = randn(OC * C, 1.0f);
    float *dx0 = randn(N * C, 1.0f), *dw0 = randn(OC * C, 1.0f), *db0 = randn(OC, 1.0f);
    uint16_t *dy16 = to_bf16(dy, N * OC), *x16 = to_bf16(x, N * C), *w16 = to_bf16(w, OC * C);
    float *wdx = copy_of(dx0, N * C), *wdw = copy_of(dw0, OC * C), *wdb = copy_of(db0, OC);
    void *dDY = up(dy16, (size_t)(N * OC) * 2), *dX = up(x16, (size_t)(N * C) * 2);
    void *dW = up(w16, (size_t)(OC * C) * 2);
    void *ddx = up(dx0, (size_t)(N * C) * 4), *ddw = up(dw0, (size_t)(OC * C) * 4), *ddb = up(db0, (size_t)OC * 4);
    matmul_backward(wdx, wdw, wdb, dy16, x16, w16, DTYPE_BF16, N, C, OC);
    g_gpu->matmul_backward(g_gpu, ddx, ddw, ddb, dDY, dX, dW, DTYPE_BF16, N, C, OC);
    snprintf(op, sizeof op, "matmul_backward bf16 N%lld C%lld OC%lld: dinp", (long long)N, (long long)C,
             (long long)OC);
    check(op, ddx, wdx, N * C, 0.0, 8.0 * U * sqrt((double)OC));
    snprintf(op, sizeof op, "matmul_backward bf16 N%lld C%lld OC%lld: dweight", (long long)N, (long long)C,
             (long long)OC);
    check(op, ddw, wdw, OC * C, 0.0, 8.0 * U * sqrt((double)N));
    snprintf(op, sizeof op, "matmul_backward bf16 N%lld C%lld OC%lld: dbias", (long long)N, (long long)C,
             (long long)OC);
    check(op, ddb, wdb, OC, 0.0, 0.0);  // the same adds in the same order
    // fp32 gemm: C (M, N') = alpha op(A) op(B) (+ C), with M = N, K = C, N' = OC
    float *a = randn(N * C, 1.0f), *bm = randn(C * OC, 1.0f), *c0 = randn(N * OC, 1.0f);
    void *dA = up(a, (size_t)(N * C) * 4), *dBm = up(bm, (size_t)(C * OC) * 4);
    void *dC = g_gpu->alloc(g_gpu, (size_t)(N * OC) * 4);
    float *want = xmalloc((size_t)(N * OC) * 4);
    for (int t = 0; t < 4; t++) {
        int ta = t & 1, tb = t >> 1, acc = t != 1;
        int64_t lda = ta ? N : C, ldb = tb ? C : OC;  // A stored (K, M) when transposed, B (N', K)
        memcpy(want, c0, (size_t)(N * OC) * 4);
        g_gpu->upload(g_gpu, dC, c0, (size_t)(N * OC) * 4);
        backend_cpu()->gemm(backend_cpu(), ta, tb, N, OC, C, 0.5f, a, lda, bm, ldb, acc, want, OC);
        g_gpu->gemm(g_gpu, ta, tb, N, OC, C, 0.5f, dA, lda, dBm, ldb, acc, dC, OC);
        snprintf(op, sizeof op, "gemm f32 ta%d tb%d%s M%lld N%lld K%lld", ta, tb, acc ? " +C" : "", (long long)N,
                 (long long)OC, (long long)C);
        check(op, dC, want, N * OC, 0.0, 8.0 * U * sqrt((double)C));
    }
    free(dy), free(x), free(w), free(dx0), free(dw0), free(db0), free(dy16), free(x16), free(w16);
    free(wdx), free(wdw), free(wdb), free(a), free(bm), free(c0), free(want);
    gfree(dDY), gfree(dX), gfree(dW), gfree(ddx), gfree(ddw), gfree(ddb), gfree(dA), gfree(dBm), gfree(dC);
}

// The forward's log-sum-exp and the backward (dq, dk, dv overwritten) of packed causal sequences with GQA.
static void test_attention_backward(const int64_t *lens, int B, int H, int KVH, int D, int64_t window) {
    char op[112];
    AttnShape a = attn_shape(H, KVH, D, window);
    int64_t *off = xmalloc((size_t)(B + 1) * sizeof *off), T = 0;
    off[0] = 0;
    for (int b = 0; b < B; b++) {
        off[b + 1] = off[b] + lens[b];
        T = lens[b] > T ? lens[b] : T;
    }
    int64_t N = off[B], nq = N * H * D, nkv = N * KVH * D, group = H / KVH;
    float *q = randn(nq, 1.0f), *k = randn(nkv, 1.0f), *v = randn(nkv, 1.0f), *dout = randn(nq, 1.0f);
    float *out = xmalloc((size_t)nq * 4), *lse = xmalloc((size_t)(N * H) * 4);
    float *scratch = xmalloc(attention_backward_scratch_floats(T) * 4);
    float *dq = xmalloc((size_t)nq * 4), *dk = xmalloc((size_t)nkv * 4), *dv = xmalloc((size_t)nkv * 4);
    attention_forward(out, lse, q, k, v, off, B, a, scratch);
    attention_backward(dq, dk, dv, dout, out, lse, q, k, v, off, B, a, scratch);
    void *dQ = up(q, (size_t)nq * 4), *dK = up(k, (size_t)nkv * 4), *dV = up(v, (size_t)nkv * 4);
    void *dOff = up(off, (size_t)(B + 1) * 8), *dDO = up(dout, (size_t)nq * 4);
    void *dO = g_gpu->alloc(g_gpu, (size_t)nq * 4), *dL = g_gpu->alloc(g_gpu, (size_t)(N * H) * 4);
    void *gdq = up(dq, (size_t)nq * 4), *gdk = up(dk, (size_t)nkv * 4), *gdv = up(dv, (size_t)nkv * 4);
    g_gpu->zero(g_gpu, gdq, (size_t)nq * 4);  // poisoned with the answer, then zeroed: overwritten, not added
    g_gpu->scale(g_gpu, gdk, (size_t)nkv, 3.0f);
    g_gpu->scale(g_gpu, gdv, (size_t)nkv, -1.0f);
    g_gpu->attention_forward(g_gpu, dO, dL, dQ, dK, dV, dOff, B, N, a, NULL);
    snprintf(op, sizeof op, "attention lse B%d N%lld H%d KVH%d D%d window %lld", B, (long long)N, H, KVH, D,
             (long long)window);
    check(op, dL, lse, N * H, 1.0, 8.0 * U * (double)(T + D));  // a log of a sum of <= T positive terms
    // The backward from the CPU's forward (out, lse), so only the backward's own error is measured.
    g_gpu->upload(g_gpu, dO, out, (size_t)nq * 4);
    g_gpu->upload(g_gpu, dL, lse, (size_t)(N * H) * 4);
    g_gpu->attention_backward(g_gpu, gdq, gdk, gdv, dDO, dO, dL, dQ, dK, dV, dOff, B, N, a, NULL);
    // dq: sums over <= T keys of terms p (dp - delta) k; dk, dv: over <= T queries of each of the group's heads
    snprintf(op, sizeof op, "attention_backward B%d N%lld H%d KVH%d D%d window %lld: dq", B, (long long)N, H, KVH, D,
             (long long)window);
    check(op, gdq, dq, nq, 0.0, 8.0 * U * (double)(T + D));
    snprintf(op, sizeof op, "attention_backward B%d N%lld H%d KVH%d D%d window %lld: dk", B, (long long)N, H, KVH, D,
             (long long)window);
    check(op, gdk, dk, nkv, 0.0, 8.0 * U * (double)(T * group + D));
    snprintf(op, sizeof op, "attention_backward B%d N%lld H%d KVH%d D%d window %lld: dv", B, (long long)N, H, KVH, D,
             (long long)window);
    check(op, gdv, dv, nkv, 0.0, 8.0 * U * (double)(T * group + D));
    free(off), free(q), free(k), free(v), free(dout), free(out), free(lse), free(scratch), free(dq), free(dk);
    free(dv);
    gfree(dQ), gfree(dK), gfree(dV), gfree(dOff), gfree(dDO), gfree(dO), gfree(dL);
    gfree(gdq), gfree(gdk), gfree(gdv);
}

// The head's entropy, and its backward with and without the entropy's gradient, with and without out and dW.
// The logits' gradient g is rounded to bf16 before its two products, on both sides: where the two sides' fp32 g
// straddle a rounding boundary they differ by one bf16 step (8 significant bits: at most 2^-7 |g|), so an output of
// dh = g W may differ by 2^-7 sum_j |g_rj| |W_jc|, and of dW = g^T h16 by 2^-7 sum_r |g_rj| |h_rc|; the products'
// fp32 sums add 8 u sqrt(K) of the same sums. g's magnitudes from the CPU's logits (h rounded to bf16, as the head
// does), in double: bh (N, C) and bw (V, C) are those bounds per output.
static void head_grad_bounds(const float *h, const uint16_t *w16, const int32_t *t, const float *dlogp,
                             const float *dent, int64_t N, int64_t C, int64_t V, double *bh, double *bw) {
    uint16_t *h16 = to_bf16(h, N * C);
    float *z = xmalloc((size_t)(N * V) * 4), *hr = xmalloc((size_t)(N * C) * 4), *wr = xmalloc((size_t)(V * C) * 4);
    matmul_forward(z, h16, w16, NULL, DTYPE_BF16, N, C, V);
    for (int64_t e = 0; e < N * C; e++) hr[e] = fabsf(bf16_to_f32(h16[e]));
    for (int64_t e = 0; e < V * C; e++) wr[e] = fabsf(bf16_to_f32(w16[e]));
    double *ag = xcalloc((size_t)V, sizeof *ag), kh = 0x1p-7 + 8.0 * U * sqrt((double)V);
    double kw = 0x1p-7 + 8.0 * U * sqrt((double)N);
    memset(bw, 0, (size_t)(V * C) * sizeof *bw);
    for (int64_t r = 0; r < N; r++) {
        const float *zr = z + r * V;
        double mx = -INFINITY, sum = 0.0, H = 0.0, d = t[r] >= 0 ? dlogp[r] : 0.0;
        double de = t[r] >= 0 && dent ? dent[r] : 0.0;
        for (int64_t j = 0; j < V; j++) mx = fmax(mx, zr[j]);
        for (int64_t j = 0; j < V; j++) sum += exp(zr[j] - mx);
        for (int64_t j = 0; j < V; j++) H -= exp(zr[j] - mx) / sum * (zr[j] - mx - log(sum));
        for (int64_t j = 0; j < V; j++) {
            double p = exp(zr[j] - mx) / sum, lp = zr[j] - mx - log(sum);
            ag[j] = fabs(-d * p - de * p * (lp + H) + (j == t[r] ? d : 0.0));
        }
        for (int64_t c = 0; c < C; c++) {
            double a = 0.0;
            for (int64_t j = 0; j < V; j++) a += ag[j] * wr[j * C + c];
            bh[r * C + c] = kh * a;
        }
        for (int64_t j = 0; j < V; j++)
            for (int64_t c = 0; c < C; c++) bw[j * C + c] += kw * ag[j] * hr[r * C + c];
    }
    free(h16), free(z), free(hr), free(wr), free(ag);
}

// max over outputs of |got - want| / bound (a pass is <= 1), 1e-30 absolute as a bound's floor.
static double bounded_err(const float *got, const float *want, const double *bound, int64_t n) {
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]) / (bound[i] + 1e-30);
        worst = e > worst || e != e ? e : worst;
    }
    return worst;
}

// The head's entropy, and its backward: the log-prob's gradient alone (with out and dW), with the entropy's (no
// dW), and the entropy's alone (dW); rows without a target or a gradient.
static void test_logprob_backward(int64_t N, int64_t C, int64_t V) {
    char op[96];
    float *h = randn(N * C, 1.0f), *w = randn(V * C, 0.3f), *dlogp = randn(N, 1.0f), *dent = randn(N, 0.5f);
    float *dh0 = randn(N * C, 1.0f), *dw0 = randn(V * C, 0.1f), *zeros = xcalloc((size_t)N, 4);
    uint16_t *w16 = to_bf16(w, V * C);
    int32_t *t = xmalloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) {
        t[i] = i % 7 == 3 ? -1 : (int32_t)(rng_next_u64(&g_rng) % (uint64_t)V);
        if (i % 5 == 1) dlogp[i] = 0.0f, dent[i] = 0.0f;  // rows without a gradient
        if (i % 5 == 2) dent[i] = 0.0f;
    }
    size_t sf = logprob_scratch_floats(V, C, DTYPE_BF16);
    float *scratch = xmalloc(sf * 4), *lp = xmalloc((size_t)N * 4), *ent = xmalloc((size_t)N * 4);
    double *bh = xmalloc((size_t)(N * C) * sizeof *bh), *bw = xmalloc((size_t)(V * C) * sizeof *bw);
    void *dH = up(h, (size_t)(N * C) * 4), *dW = up(w16, (size_t)(V * C) * 2), *dT = up(t, (size_t)N * 4);
    void *dDL = up(dlogp, (size_t)N * 4), *dDE = up(dent, (size_t)N * 4), *dZ = up(zeros, (size_t)N * 4);
    void *ds = g_gpu->alloc(g_gpu, g_gpu->logprob_scratch(g_gpu, V, C, DTYPE_BF16) * 4);
    void *dlp = g_gpu->alloc(g_gpu, (size_t)N * 4), *dent_out = g_gpu->alloc(g_gpu, (size_t)N * 4);
    logprob_forward(lp, ent, h, w16, DTYPE_BF16, t, N, C, V, scratch);
    g_gpu->logprob_forward(g_gpu, dlp, dent_out, dH, dW, DTYPE_BF16, dT, N, C, V, ds);
    snprintf(op, sizeof op, "logprob_forward bf16 N%lld C%lld V%lld: entropy", (long long)N, (long long)C,
             (long long)V);
    // as the log-prob: logits off by 8 u sqrt(C) of their scale 0.3 sqrt(C), sums in double
    check(op, dent_out, ent, N, 1.0, 8.0 * U * (0.3 * (double)C + 1.0));
    const char *names[3] = {"log-prob", "+entropy, no dW", "entropy alone"};
    for (int variant = 0; variant < 3; variant++) {
        const float *dl = variant == 2 ? zeros : dlogp, *de = variant ? dent : NULL;
        int with_dw = variant != 1;
        float *wdh = copy_of(dh0, N * C), *wdw = copy_of(dw0, V * C), *wlp = xmalloc((size_t)N * 4);
        void *gdh = up(dh0, (size_t)(N * C) * 4), *gdw = up(dw0, (size_t)(V * C) * 4);
        logprob_backward(wdh, with_dw ? wdw : NULL, wlp, dl, de, h, w16, DTYPE_BF16, t, N, C, V, scratch);
        g_gpu->logprob_backward(g_gpu, gdh, with_dw ? gdw : NULL, dlp, variant == 2 ? dZ : dDL, variant ? dDE : NULL,
                                dH, dW, DTYPE_BF16, dT, N, C, V, ds);
        head_grad_bounds(h, w16, t, dl, de, N, C, V, bh, bw);
        // each side adds its gradient to dh0 / dW0 in fp32: one rounding more, at the sum's magnitude (where the
        // gradient is tiny against dW0 that rounding is the whole difference)
        for (int64_t e = 0; e < N * C; e++) bh[e] += 2.0 * U * fabs(wdh[e]);
        for (int64_t e = 0; with_dw && e < V * C; e++) bw[e] += 2.0 * U * fabs(wdw[e]);
        snprintf(op, sizeof op, "logprob_backward N%lld C%lld V%lld %s: out", (long long)N, (long long)C,
                 (long long)V, names[variant]);
        check(op, dlp, wlp, N, 1.0, 8.0 * U * (0.3 * (double)C + 1.0));
        snprintf(op, sizeof op, "logprob_backward N%lld C%lld V%lld %s: dh / bound", (long long)N, (long long)C,
                 (long long)V, names[variant]);
        float *got = down(gdh, N * C);
        for (int64_t e = 0; e < N * C; e++) got[e] -= dh0[e], wdh[e] -= dh0[e];  // the gradients, not dh0 + them
        report(op, bounded_err(got, wdh, bh, N * C), 1.0);
        free(got);
        if (with_dw) {
            snprintf(op, sizeof op, "logprob_backward N%lld C%lld V%lld %s: dW / bound", (long long)N, (long long)C,
                     (long long)V, names[variant]);
            got = down(gdw, V * C);
            for (int64_t e = 0; e < V * C; e++) got[e] -= dw0[e], wdw[e] -= dw0[e];
            report(op, bounded_err(got, wdw, bw, V * C), 1.0);
            free(got);
        }
        free(wdh), free(wdw), free(wlp);
        gfree(gdh), gfree(gdw);
    }
    free(h), free(w), free(dlogp), free(dent), free(dh0), free(dw0), free(zeros), free(w16), free(t), free(scratch);
    free(lp), free(ent), free(bh), free(bw);
    gfree(dH), gfree(dW), gfree(dT), gfree(dDL), gfree(dDE), gfree(dZ), gfree(ds), gfree(dlp), gfree(dent_out);
}

// AdamW over three steps (weight decay on), the gradient's norm, and finiteness with and without an inf / NaN.
// AdamW with the moments in host memory too, streamed in chunks of `chunk`, in two calls (the slab's [0, a) and
// [a, n), as the trainer's ranges), from moments that are not zero: the device AdamW's bits.
static void test_optimizer(int64_t n, size_t chunk) {
    char op[96];
    float *p = randn(n, 1.0f), *m = randn(n, 0.01f), *v = randn(n, 0.01f);
    for (int64_t i = 0; i < n; i++) v[i] *= v[i];
    void *dp = up(p, (size_t)n * 4), *dm = up(m, (size_t)n * 4), *dv = up(v, (size_t)n * 4);
    void *dp2 = up(p, (size_t)n * 4);
    float *hm = g_gpu->host_alloc(g_gpu, (size_t)n * 4), *hv = g_gpu->host_alloc(g_gpu, (size_t)n * 4);
    memcpy(hm, m, (size_t)n * 4);
    memcpy(hv, v, (size_t)n * 4);
    size_t a = (size_t)n / 3 | 1;
    float *stage[2] = {g_gpu->alloc(g_gpu, 2 * chunk * 4), g_gpu->alloc(g_gpu, 2 * chunk * 4)};
    AdamW o = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
    float *g = NULL;
    void *dg = g_gpu->alloc(g_gpu, (size_t)n * 4);
    for (int64_t step = 1; step <= 3; step++) {
        free(g);
        g = randn(n, 0.01f);
        g_gpu->upload(g_gpu, dg, g, (size_t)n * 4);
        adamw_update(&o, p, g, m, v, (size_t)n, o.weight_decay, step);
        g_gpu->adamw(g_gpu, &o, dp, dg, dm, dv, (size_t)n, o.weight_decay, step);
        float *p2 = dp2;
        const float *g2 = dg;
        g_gpu->adamw_host_moments(g_gpu, &o, p2, g2, hm, hv, a, o.weight_decay, step, stage, chunk);
        g_gpu->adamw_host_moments(g_gpu, &o, p2 + a, g2 + a, hm + a, hv + a, (size_t)n - a, o.weight_decay, step,
                                  stage, chunk);
    }
    // the same float operations; the GPU may fuse a multiply-add (one rounding less) per operation
    snprintf(op, sizeof op, "adamw 3 steps n%lld: p, m, v", (long long)n);
    float *gp = down(dp, n), *gm = down(dm, n), *gv = down(dv, n);
    report(op, fmax(rel_err(gp, p, n, 0.0), fmax(rel_err(gm, m, n, 0.0), rel_err(gv, v, n, 0.0))), 8.0 * U);
    snprintf(op, sizeof op, "adamw_host_moments 3 steps n%lld chunk %zu: p, m, v bits", (long long)n, chunk);
    float *gp2 = down(dp2, n);
    report(op, memcmp(gp2, gp, (size_t)n * 4) != 0 || memcmp(hm, gm, (size_t)n * 4) != 0 ||
                   memcmp(hv, gv, (size_t)n * 4) != 0, 0.0);
    free(gp), free(gm), free(gv), free(gp2);
    g_gpu->host_free(g_gpu, hm);
    g_gpu->host_free(g_gpu, hv);
    gfree(dp2), gfree(stage[0]), gfree(stage[1]);
    snprintf(op, sizeof op, "grad_norm n%lld", (long long)n);
    double want = grad_norm(g, (size_t)n), got = g_gpu->grad_norm(g_gpu, dg, (size_t)n);
    report(op, fabs(got - want) / want, 1e-12);  // sums in double on both sides
    snprintf(op, sizeof op, "all_finite n%lld: finite, inf, NaN", (long long)n);
    double bad = g_gpu->all_finite(g_gpu, dg, (size_t)n) != 1;
    float inf = INFINITY, nan = NAN;
    g_gpu->upload(g_gpu, (float *)dg + n - 1, &inf, 4);
    bad += g_gpu->all_finite(g_gpu, dg, (size_t)n) != 0;
    g_gpu->upload(g_gpu, (float *)dg + n - 1, &g[n - 1], 4);
    g_gpu->upload(g_gpu, (float *)dg + n / 2, &nan, 4);
    bad += g_gpu->all_finite(g_gpu, dg, (size_t)n) != 0;
    bad += g_gpu->all_finite(g_gpu, dg, (size_t)(n / 2)) != 1;  // a prefix before the NaN (empty when n is 1)
    report(op, bad, 0.0);
    free(p), free(m), free(v), free(g);
    gfree(dp), gfree(dm), gfree(dv), gfree(dg);
}

// Every training op, on shapes that cross the kernels' tiles and blocks, as test_all_ops does for inference.
static void test_training_ops(void) {
    test_train_elementwise(1);
    if (!g_small) test_train_elementwise(100003);
    test_rows(40, 33, 96);
    test_rows(7, 1, 5);
    test_norms_backward(37, 896, 20);
    test_norms_backward(5, 100, 3);
    test_matmul_backward(37, 96, 130);
    test_matmul_backward(5, 33, 7);
    const int64_t l1[] = {1, 33, 70}, l2[] = {64, 5}, l3[] = {130, 31, 2}, l4[] = {5, 0, 23};
    test_attention_backward(l1, 3, 14, 2, 64, 0);
    test_attention_backward(l2, 2, 4, 2, 16, 0);
    test_attention_backward(l3, 3, 6, 2, 24, 0);
    test_attention_backward(l2, 2, 16, 1, 40, 0);
    test_attention_backward(l1, 3, 4, 4, 128, 0);
    test_attention_backward(l4, 3, 4, 2, 7, 0);  // an empty sequence; head_dim not a multiple of 8
    test_attention_backward(l3, 3, 4, 2, 24, 40);  // sliding window: key tiles past their queries' windows
    test_attention_backward(l1, 3, 6, 3, 16, 5);
    test_logprob_backward(300, 64, 1000);
    test_logprob_backward(5, 96, 3001);
    test_optimizer(1, 1);
    if (!g_small) test_optimizer(100003, 1000);  // 101 chunks, the last one short
    test_optimizer(2500, 4096);
}

// Every op on shapes that cross the kernels' tiles and blocks: rows and widths that are not multiples of them,
// head_dim 16..128 (multiples of 32 or not), long rows, the real vocabulary for the sampler and log-prob head;
// with g_small (--small) none of the large shapes (each kernel still runs, on its small ones).
static void test_all_ops(void) {
    test_elementwise(1);
    if (!g_small) test_elementwise(100003);
    test_embedding_rmsnorm(37, 896, 1000);
    if (!g_small) test_embedding_rmsnorm(3, 3584, 50);
    test_embedding_rmsnorm(5, 100, 7);  // C below one block of threads
    test_matmul(1, 96, 200, 1);
    test_matmul(5, 130, 33, 1);  // odd sizes: unaligned operands
    test_matmul(7, 64, 96, 2);   // a bias 2 bytes past an allocation's start
    if (!g_small) {
        test_matmul(300, 896, 1152, 1);
        test_matmul(300, 896, 1152, 2);
        test_matmul(64, 4864, 896, 0);
    }
    test_rope(37, 14, 64);
    if (!g_small) test_rope(300, 28, 128);
    test_rope(37, 4, 16);
    test_rope(5, 3, 40);
    const int64_t l1[] = {1, 33, 70}, l2[] = {64, 5}, l3[] = {130, 31, 2};
    test_attention(l1, 3, 14, 2, 64, 0);  // GQA 7, tiles crossed at 32 and 64 keys
    if (!g_small) test_attention(l2, 2, 28, 4, 128, 0);
    test_attention(l3, 3, 4, 4, 64, 0);   // MHA
    test_attention(l1, 3, 4, 2, 16, 0);   // the tiny preset's head_dim: half a warp's lanes idle
    test_attention(l3, 3, 6, 2, 24, 0);   // the generate test models': not a multiple of 16 either
    test_attention(l2, 2, 6, 3, 40, 0);   // past one lane per dimension, not a multiple of 32
    test_attention(l1, 3, 16, 1, 80, 0);  // 16 query heads per kv head: the largest group
    test_attention(l3, 3, 2, 2, 96, 0);
    test_attention(l2, 2, 4, 2, 112, 0);
    test_attention(l3, 3, 4, 2, 64, 40);  // sliding window: a tile's keys partly out of it, decode from a cache
    test_attention(l1, 3, 6, 3, 24, 1);   // a window of one key: each row its own value
    test_logprob(300, 64, 1000);       // crosses the 256-row chunk; target -1 rows
    if (!g_small) test_logprob(5, 896, 151936);
    test_sample(37, 1000);
    if (!g_small) test_sample(3, 151936);
    test_training_ops();
}

// test_cuda_ops [--device cuda|emu] [--small]: the GPU (default; skipped without one) or the emulated device;
// --small leaves out the large shapes (the ThreadSanitizer build's run: races, not numbers, at its speed).
int main(int argc, char **argv) {
    g_small = argc > 1 && !strcmp(argv[argc - 1], "--small");
    argc -= g_small;
    const char *device = argc == 3 && !strcmp(argv[1], "--device") ? argv[2] : "cuda";
    if (argc != 1 && argc != 3) {
        fprintf(stderr, "usage: test_cuda_ops [--device cuda|emu] [--small]\n");
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

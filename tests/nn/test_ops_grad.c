// Finite-difference checks of every *_backward in nn/ops.h against its forward.
//
// For each op: L = sum_i r_i * out_i with random r (so dout = r), the analytic gradient from the
// backward, and central differences of L (summed in double) around the float inputs:
//     g_fd = (L(x + e) - L(x - e)) / ((double)(float)(x + e) - (double)(float)(x - e)).
// Error measure per tensor: max|g_fd - g| / max|g| (g = analytic).
// Tolerance: the forward runs in float, so L carries rounding of about u * sum|r_i out_i| with
// u = 6e-8; divided by 2e that is ~1e-5 relative for the sizes here with e = 1e-2, and the
// truncation term (e^2/6) f''' is ~2e-5 for O(1) inputs. FD_TOL = 2e-3 leaves two orders of
// margin above both, while any real bug (a sign, a missing term, a wrong head) is O(1).
// The linear ops (embedding, matmul, rope) have no truncation error at all.
//
// Besides the values: gradients are ADDED into pre-filled buffers (checked against a run into
// zeros), buffers ops.h calls OVERWRITTEN ignore their NaN-filled contents, glu's dout may
// alias dgate, matmul's dinp/dbias may be NULL, and logprob rows with target -1 get no gradient
// even with a non-zero dlogp. Prints one line per op and tensor; exit status 1 on any failure.
//
// --sampled (under qemu, tests/base/cpu_levels_test.py, and the sanitizers): the same ops, paths and checks, each
// tensor's differences at SAMPLED_POINTS points (its first, last and random ones), exp's sweep at 1/100 of its
// points and the widened bf16 product at a twelfth of its size: every op's code runs, in seconds instead of the
// quarter hour an emulated CPU or ASan takes to difference every element.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/rng.h"
#include "base/util.h"
#include "base/vmath.h"
#include "nn/gemm.h"
#include "nn/ops.h"
#include "nn/q8.h"
#include "nn/skinny.h"

#define FD_TOL 2e-3
#define ACC_TOL 1e-5  // pre-filled run minus prefill vs run into zeros, relative to max|g| + max|prefill|

#define SAMPLED_POINTS 24
static int g_failures = 0;
static int g_checks = 0;
static int64_t g_max_samples = INT64_MAX;  // --sampled: SAMPLED_POINTS
static Rng g_rng;

static float *fnew(int64_t n) { return xcalloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

static float *frandn(int64_t n, float scale) {
    float *p = fnew(n);
    for (int64_t i = 0; i < n; i++) p[i] = scale * rng_normal(&g_rng);
    return p;
}

static float *fcopy(const float *src, int64_t n) {
    float *p = fnew(n);
    memcpy(p, src, (size_t)n * sizeof(float));
    return p;
}

static double dot_d(const float *r, const float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)r[i] * x[i];
    return s;
}

static float maxabs(const float *x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

static void report(const char *op, const char *what, double err, double tol, const char *detail) {
    int ok = err <= tol;  // NaN fails
    g_checks++;
    g_failures += !ok;
    printf("%s  %-34s %-28s err %.2e (tol %.0e)%s%s\n", ok ? "PASS" : "FAIL", op, what, err, tol,
           detail && *detail ? "  " : "", detail ? detail : "");
    fflush(stdout);
}

// Loss as a function of the current contents of the inputs (read through ctx).
typedef double (*LossFn)(void *ctx);

// Central differences of f with respect to x[i] for all i, or for `max_samples` of them: the first
// and last element, then alternately a random one anywhere and one in the last quarter (where the
// tests put rows past a 128-query attention block or a 256-row logprob chunk).
static void fd_check(const char *op, const char *what, LossFn f, void *ctx, float *x, const float *g, int64_t n,
                     float eps, int64_t max_samples) {
    if (max_samples > g_max_samples) max_samples = g_max_samples;
    double gmax = maxabs(g, n), emax = 0.0;
    int64_t worst = -1, checked = 0;
    double worst_fd = 0.0;
    for (int64_t s = 0; s < (n < max_samples ? n : max_samples); s++) {
        int64_t i = s;
        if (n > max_samples) {
            uint64_t u = rng_next_u64(&g_rng);
            i = s == 0 ? 0 : s == 1 ? n - 1 : s % 2 ? (int64_t)(u % (uint64_t)n) : n - 1 - (int64_t)(u % (uint64_t)(n / 4));
        }
        float x0 = x[i], xp = x0 + eps, xm = x0 - eps;
        x[i] = xp;
        double lp = f(ctx);
        x[i] = xm;
        double lm = f(ctx);
        x[i] = x0;
        double fd = (lp - lm) / ((double)xp - (double)xm);
        double e = fabs(fd - (double)g[i]);
        if (!(e <= emax)) {  // also records NaN
            emax = e;
            worst = i;
            worst_fd = fd;
        }
        checked++;
    }
    double rel = emax / (gmax > 0 ? gmax : 1e-30);
    if (gmax == 0.0) rel = emax > 0 ? INFINITY : 0.0;
    char detail[160];
    if (worst >= 0)
        snprintf(detail, sizeof detail, "max|g| %.3g, worst [%lld] fd %.6g vs %.6g (%lld/%lld checked)", gmax,
                 (long long)worst, worst_fd, (double)g[worst], (long long)checked, (long long)n);
    else
        snprintf(detail, sizeof detail, "max|g| %.3g (%lld checked)", gmax, (long long)checked);
    report(op, what, rel, FD_TOL, detail);
}

// After a backward into buffers pre-filled with `pre`: buf - pre must equal the run into zeros.
static void acc_check(const char *op, const char *what, const float *buf, const float *pre, const float *zero_run,
                      int64_t n) {
    double scale = (double)maxabs(zero_run, n) + maxabs(pre, n), emax = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(((double)buf[i] - pre[i]) - zero_run[i]);
        emax = e > emax || e != e ? e : emax;
    }
    char w[64];
    snprintf(w, sizeof w, "%s +=", what);
    report(op, w, emax / (scale > 0 ? scale : 1e-30), ACC_TOL, "");
}

// The same for OVERWRITTEN outputs: the NaN-filled buffer's result must equal the run into zeros.
static void overwrite_check(const char *op, const char *what, const float *buf, const float *zero_run, int64_t n) {
    double scale = maxabs(zero_run, n), emax = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)buf[i] - zero_run[i]);
        emax = e > emax || e != e ? e : emax;
    }
    char w[64];
    snprintf(w, sizeof w, "%s overwritten", what);
    report(op, w, emax / (scale > 0 ? scale : 1e-30), ACC_TOL, "");
}

static float *nan_filled(int64_t n) {
    float *p = fnew(n);
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

// ------------------------------------------------------------------------------------- embedding

typedef struct {
    float *out, *table, *r;
    int32_t *tokens;
    int64_t N, C;
} EmbCtx;

static double emb_loss(void *p) {
    EmbCtx *c = p;
    embedding_forward(c->out, c->tokens, c->table, DTYPE_F32, c->N, c->C);
    return dot_d(c->r, c->out, c->N * c->C);
}

static void test_embedding(void) {
    const char *op = "embedding V7 C5 N10 (repeats)";
    int64_t V = 7, C = 5, N = 10;
    int32_t tokens[10] = {3, 0, 3, 6, 1, 3, 0, 2, 6, 3};  // row 4 and 5 unused, 3 four times
    EmbCtx c = {fnew(N * C), frandn(V * C, 1.0f), frandn(N * C, 1.0f), tokens, N, C};
    float *dt = fnew(V * C);
    embedding_backward(dt, c.r, tokens, N, C);
    fd_check(op, "dtable", emb_loss, &c, c.table, dt, V * C, 0.5f, 1 << 30);
    float *pre = frandn(V * C, 1.0f), *acc = fcopy(pre, V * C);
    embedding_backward(acc, c.r, tokens, N, C);
    acc_check(op, "dtable", acc, pre, dt, V * C);
    free(c.out), free(c.table), free(c.r), free(dt), free(pre), free(acc);
}

// --------------------------------------------------------------------------------------- rmsnorm

typedef struct {
    float *out, *inp, *w, *r;
    int64_t N, C;
    float eps, offset;
} RmsCtx;

static double rms_loss(void *p) {
    RmsCtx *c = p;
    rmsnorm_forward(c->out, c->inp, c->w, DTYPE_F32, c->N, c->C, c->eps, c->offset);
    return dot_d(c->r, c->out, c->N * c->C);
}

// offset 1: Gemma's (1 + w), its weights near 0
static void test_rmsnorm(int64_t N, int64_t C, float eps, float offset) {
    char op[64];
    snprintf(op, sizeof op, "rmsnorm N%lld C%lld eps%g offset %g", (long long)N, (long long)C, eps, offset);
    RmsCtx c = {fnew(N * C), frandn(N * C, 1.0f), frandn(C, 0.1f), frandn(N * C, 1.0f), N, C, eps, offset};
    for (int64_t j = 0; j < C; j++) c.w[j] += 1.0f - offset;
    for (int64_t j = 0; j < C; j++) c.inp[2 * C + j] *= 0.1f;  // a small-norm row
    float *dx = fnew(N * C), *dw = fnew(C);
    rmsnorm_backward(dx, dw, c.r, c.inp, c.w, DTYPE_F32, N, C, eps, offset);
    fd_check(op, "dinp", rms_loss, &c, c.inp, dx, N * C, 1e-3f, 1 << 30);
    fd_check(op, "dweight", rms_loss, &c, c.w, dw, C, 1e-2f, 1 << 30);
    float *px = frandn(N * C, 1.0f), *pw = frandn(C, 1.0f), *ax = fcopy(px, N * C), *aw = fcopy(pw, C);
    rmsnorm_backward(ax, aw, c.r, c.inp, c.w, DTYPE_F32, N, C, eps, offset);
    acc_check(op, "dinp", ax, px, dx, N * C);
    acc_check(op, "dweight", aw, pw, dw, C);
    free(c.out), free(c.inp), free(c.w), free(c.r), free(dx), free(dw), free(px), free(pw), free(ax), free(aw);
}

// ------------------------------------------------------------------------------------- layernorm

typedef struct {
    float *out, *inp, *w, *b, *r;
    int64_t N, C;
    float eps;
} LnCtx;

static double ln_loss(void *p) {
    LnCtx *c = p;
    layernorm_forward(c->out, c->inp, c->w, c->b, c->N, c->C, c->eps);
    return dot_d(c->r, c->out, c->N * c->C);
}

static void test_layernorm(int64_t N, int64_t C, float eps) {
    char op[64];
    snprintf(op, sizeof op, "layernorm N%lld C%lld eps%g", (long long)N, (long long)C, eps);
    LnCtx c = {fnew(N * C), frandn(N * C, 1.0f), frandn(C, 0.1f), frandn(C, 0.5f), frandn(N * C, 1.0f), N, C, eps};
    for (int64_t j = 0; j < C; j++) c.w[j] += 1.0f;
    for (int64_t j = 0; j < C; j++) c.inp[C + j] = 3.0f + 0.05f * c.inp[C + j];  // a row with a large mean
    float *dx = fnew(N * C), *dw = fnew(C), *db = fnew(C);
    layernorm_backward(dx, dw, db, c.r, c.inp, c.w, N, C, eps);
    fd_check(op, "dinp", ln_loss, &c, c.inp, dx, N * C, 1e-3f, 1 << 30);
    fd_check(op, "dweight", ln_loss, &c, c.w, dw, C, 1e-2f, 1 << 30);
    fd_check(op, "dbias", ln_loss, &c, c.b, db, C, 1e-2f, 1 << 30);
    float *px = frandn(N * C, 1.0f), *pw = frandn(C, 1.0f), *pb = frandn(C, 1.0f);
    float *ax = fcopy(px, N * C), *aw = fcopy(pw, C), *ab = fcopy(pb, C), *nw = fcopy(pw, C);
    layernorm_backward(ax, aw, ab, c.r, c.inp, c.w, N, C, eps);
    acc_check(op, "dinp", ax, px, dx, N * C);
    acc_check(op, "dweight", aw, pw, dw, C);
    acc_check(op, "dbias", ab, pb, db, C);
    layernorm_backward(NULL, nw, NULL, c.r, c.inp, c.w, N, C, eps);  // the merger's use: weights only
    acc_check(op, "dweight (no dinp, no dbias)", nw, pw, dw, C);
    free(c.out), free(c.inp), free(c.w), free(c.b), free(c.r), free(dx), free(dw), free(db);
    free(px), free(pw), free(pb), free(ax), free(aw), free(ab), free(nw);
}

// ------------------------------------------------------------------------------------------ gelu

typedef struct {
    float *out, *inp, *r;
    int64_t n;
} GeluCtx;

static double gelu_loss(void *p) {
    GeluCtx *c = p;
    gelu_forward(c->out, c->inp, c->n);
    return dot_d(c->r, c->out, c->n);
}

static void test_gelu(void) {
    const char *op = "gelu n41";
    int64_t n = 41;
    GeluCtx c = {fnew(n), frandn(n, 2.0f), frandn(n, 1.0f), n};
    c.inp[0] = -9.0f, c.inp[1] = 9.0f, c.inp[2] = 0.0f;  // saturated ends and the origin
    float *dx = nan_filled(n);                              // OVERWRITTEN
    gelu_backward(dx, c.r, c.inp, n);
    fd_check(op, "dinp", gelu_loss, &c, c.inp, dx, n, 1e-2f, 1 << 30);
    float *ad = fcopy(c.r, n);  // dout aliases dinp
    gelu_backward(ad, ad, c.inp, n);
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs((double)ad[i] - dx[i]));
    report(op, "dout aliasing dinp", e / fmax(maxabs(dx, n), 1e-30), 0.0, "");
    free(c.out), free(c.inp), free(c.r), free(dx), free(ad);
}

// ---------------------------------------------------------------------------------------- matmul

typedef struct {
    float *out, *inp, *w, *b, *r;
    int64_t N, C, OC;
} MmCtx;

static double mm_loss(void *p) {
    MmCtx *c = p;
    matmul_forward(c->out, c->inp, c->w, c->b, DTYPE_F32, c->N, c->C, c->OC);
    return dot_d(c->r, c->out, c->N * c->OC);
}

static void test_matmul(int64_t N, int64_t C, int64_t OC, int bias) {
    char op[64];
    snprintf(op, sizeof op, "matmul N%lld C%lld OC%lld %s", (long long)N, (long long)C, (long long)OC,
             bias ? "bias" : "nobias");
    MmCtx c = {fnew(N * OC), frandn(N * C, 1.0f), frandn(OC * C, 0.3f), bias ? frandn(OC, 0.3f) : NULL,
               frandn(N * OC, 1.0f), N, C, OC};
    float *dx = fnew(N * C), *dw = fnew(OC * C), *db = bias ? fnew(OC) : NULL;
    matmul_backward(dx, dw, db, c.r, c.inp, c.w, DTYPE_F32, N, C, OC);
    fd_check(op, "dinp", mm_loss, &c, c.inp, dx, N * C, 0.25f, 1 << 30);
    fd_check(op, "dweight", mm_loss, &c, c.w, dw, OC * C, 0.25f, 1 << 30);
    if (bias) fd_check(op, "dbias", mm_loss, &c, c.b, db, OC, 0.25f, 1 << 30);
    float *px = frandn(N * C, 1.0f), *pw = frandn(OC * C, 1.0f), *pb = frandn(OC, 1.0f);
    float *ax = fcopy(px, N * C), *aw = fcopy(pw, OC * C), *ab = fcopy(pb, OC);
    matmul_backward(ax, aw, bias ? ab : NULL, c.r, c.inp, c.w, DTYPE_F32, N, C, OC);
    acc_check(op, "dinp", ax, px, dx, N * C);
    acc_check(op, "dweight", aw, pw, dw, OC * C);
    if (bias) acc_check(op, "dbias", ab, pb, db, OC);
    // dinp and dbias may be NULL: dweight alone, same values
    float *w2 = fnew(OC * C);
    matmul_backward(NULL, w2, NULL, c.r, c.inp, c.w, DTYPE_F32, N, C, OC);
    double e = 0.0;
    for (int64_t i = 0; i < OC * C; i++) e = fmax(e, fabs((double)w2[i] - dw[i]));
    report(op, "dweight w/ NULL dinp,dbias", e / fmax(maxabs(dw, OC * C), 1e-30), ACC_TOL, "");
    free(c.out), free(c.inp), free(c.w), free(c.b), free(c.r), free(dx), free(dw), free(db);
    free(px), free(pw), free(pb), free(ax), free(aw), free(ab), free(w2);
}

// ------------------------------------------------------------------------------------------ rope

typedef struct {
    float *x, *tmp, *r, *cs;
    int64_t N;
    int H, D;
} RopeCtx;

static double rope_loss(void *p) {
    RopeCtx *c = p;
    int64_t n = c->N * c->H * c->D;
    memcpy(c->tmp, c->x, (size_t)n * sizeof(float));
    rope_forward(c->tmp, c->cs, c->N, c->H, c->D);
    return dot_d(c->r, c->tmp, n);
}

static void test_rope(double theta) {
    char op[64];
    snprintf(op, sizeof op, "rope N7 H3 D8 theta%g", theta);
    int32_t pos[7] = {0, 1, 2, 7, 0, 1000, 131};
    int64_t N = 7, n = N * 3 * 8;
    RopeCtx c = {frandn(n, 1.0f), fnew(n), frandn(n, 1.0f), fnew(N * 8), N, 3, 8};
    rope_table(c.cs, pos, N, 8, (RopeFreqs){.theta = theta});
    float *dx = fcopy(c.r, n);  // in place: dout -> dinp
    rope_backward(dx, c.cs, N, 3, 8);
    fd_check(op, "dx (in place)", rope_loss, &c, c.x, dx, n, 0.25f, 1 << 30);
    free(c.x), free(c.tmp), free(c.r), free(c.cs), free(dx);
}

// ------------------------------------------------------------------------------------- attention

typedef struct {
    float *out, *q, *k, *v, *r, *scratch;
    const int64_t *seq_off;
    int B;
    AttnShape a;
    int64_t N;
} AttCtx;

static double att_loss(void *p) {
    AttCtx *c = p;
    attention_forward(c->out, NULL, c->q, c->k, c->v, c->seq_off, c->B, c->a, c->scratch);
    return dot_d(c->r, c->out, c->N * c->a.H * c->a.D);
}

// window > 0: sliding-window attention (each query sees itself and window - 1 keys before it)
static void test_attention(const int64_t *lens, int B, int H, int KVH, int D, int64_t window, int64_t max_samples) {
    char op[112];
    AttnShape a = attn_shape(H, KVH, D, window);
    int n0 = snprintf(op, sizeof op, "attention H%d KVH%d D%d window %lld T=", H, KVH, D, (long long)window);
    int64_t seq_off[8] = {0}, max_T = 0;
    for (int b = 0; b < B; b++) {
        seq_off[b + 1] = seq_off[b] + lens[b];
        max_T = lens[b] > max_T ? lens[b] : max_T;
        n0 += snprintf(op + n0, sizeof op - (size_t)n0, b ? ",%lld" : "%lld", (long long)lens[b]);
    }
    int64_t N = seq_off[B], nq = N * H * D, nkv = N * KVH * D;
    AttCtx c = {fnew(nq), frandn(nq, 1.0f), frandn(nkv, 1.0f), frandn(nkv, 1.0f), frandn(nq, 1.0f),
                fnew((int64_t)attention_scratch_floats(max_T)), seq_off, B, a, N};
    float *lse = fnew(N * H), *out = fnew(nq);
    attention_forward(out, lse, c.q, c.k, c.v, seq_off, B, a, c.scratch);
    // lse must not change the output
    float *out2 = fnew(nq);
    attention_forward(out2, NULL, c.q, c.k, c.v, seq_off, B, a, c.scratch);
    double e = 0.0;
    for (int64_t i = 0; i < nq; i++) e = fmax(e, fabs((double)out[i] - out2[i]));
    report(op, "out with/without lse (abs)", e, 1e-6, "");
    // lse against a direct double computation over the keys j0 .. i the row sees
    double lerr = 0.0, scale = 1.0 / sqrt((double)D);
    for (int b = 0; b < B; b++)
        for (int64_t i = seq_off[b]; i < seq_off[b + 1]; i++)
            for (int h = 0; h < H; h++) {
                const float *qi = c.q + i * H * D + h * D;
                double mx = -INFINITY, s[256];
                int64_t nk = i - seq_off[b] + 1, j0 = window && nk > window ? nk - window : 0;
                for (int64_t j = j0; j < nk && j < 256; j++) {
                    const float *kj = c.k + (seq_off[b] + j) * KVH * D + (h / (H / KVH)) * D;
                    s[j] = dot_d(qi, kj, D) * scale;
                    mx = fmax(mx, s[j]);
                }
                if (nk > 256) continue;
                double sum = 0.0;
                for (int64_t j = j0; j < nk; j++) sum += exp(s[j] - mx);
                lerr = fmax(lerr, fabs(mx + log(sum) - lse[i * H + h]));
            }
    report(op, "lse (abs err)", lerr, 1e-5, "");

    float *scr = fnew((int64_t)attention_backward_scratch_floats(max_T));
    float *dq = fnew(nq), *dk = fnew(nkv), *dv = fnew(nkv);
    attention_backward(dq, dk, dv, c.r, out, lse, c.q, c.k, c.v, seq_off, B, a, scr);
    fd_check(op, "dq", att_loss, &c, c.q, dq, nq, 1e-2f, max_samples);
    fd_check(op, "dk", att_loss, &c, c.k, dk, nkv, 1e-2f, max_samples);
    fd_check(op, "dv", att_loss, &c, c.v, dv, nkv, 1e-2f, max_samples);
    // OVERWRITTEN: NaN-filled buffers give the same result
    float *oq = nan_filled(nq), *ok = nan_filled(nkv), *ov = nan_filled(nkv);
    attention_backward(oq, ok, ov, c.r, out, lse, c.q, c.k, c.v, seq_off, B, a, scr);
    overwrite_check(op, "dq", oq, dq, nq);
    overwrite_check(op, "dk", ok, dk, nkv);
    overwrite_check(op, "dv", ov, dv, nkv);
    free(c.out), free(c.q), free(c.k), free(c.v), free(c.r), free(c.scratch), free(lse), free(out), free(out2);
    free(scr), free(dq), free(dk), free(dv), free(oq), free(ok), free(ov);
}

// ---------------------------------------------------------------------------------------- glu

typedef struct {
    float *out, *gate, *up, *r;
    int64_t n;
    GluAct act;
} GluCtx;

static double glu_loss(void *p) {
    GluCtx *c = p;
    glu_forward(c->out, c->gate, c->up, c->n, c->act);
    return dot_d(c->r, c->out, c->n);
}

static void test_glu(GluAct act) {
    const char *op = act == GLU_SILU ? "glu silu n41" : "glu gelu-tanh n41";
    int64_t n = 41;
    GluCtx c = {fnew(n), frandn(n, 3.0f), frandn(n, 1.0f), frandn(n, 1.0f), n, act};
    c.gate[0] = -12.0f, c.gate[1] = 12.0f, c.gate[2] = 0.0f;  // saturated ends and the origin
    float *dg = nan_filled(n), *du = nan_filled(n);           // OVERWRITTEN
    glu_backward(dg, du, c.r, c.gate, c.up, n, act);
    fd_check(op, "dgate", glu_loss, &c, c.gate, dg, n, 1e-2f, 1 << 30);
    fd_check(op, "dup", glu_loss, &c, c.up, du, n, 0.25f, 1 << 30);
    float *ag = fcopy(c.r, n), *au = nan_filled(n);  // dout aliases dgate
    glu_backward(ag, au, ag, c.gate, c.up, n, act);
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fmax(fabs((double)ag[i] - dg[i]), fabs((double)au[i] - du[i])));
    report(op, "dout aliasing dgate", e / fmax(fmax(maxabs(dg, n), maxabs(du, n)), 1e-30), 0.0, "");
    free(c.out), free(c.gate), free(c.up), free(c.r), free(dg), free(du), free(ag), free(au);
}

// ------------------------------------------------------------------------------ bf16 projections

// n random bf16 values (normal * scale, rounded) and their fp32 values.
static uint16_t *bf16_randn(int64_t n, float scale, float **as_f32) {
    uint16_t *h = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    float *f = frandn(n, scale);
    for (int64_t i = 0; i < n; i++) f[i] = bf16_to_f32(h[i] = f32_to_bf16(f[i]));
    *as_f32 = f;
    return h;
}

// The bf16 forward and backward against sums in double of the same bf16 operands: only the fp32
// accumulation may differ (the skinny kernel of the CPU level for N <= 16; above, oneDNN's bf16 matmul, or
// below AVX-512 fp32 products of widened tiles).
static void test_matmul_bf16(int64_t N, int64_t C, int64_t OC, int bias) {
    char op[64];
    snprintf(op, sizeof op, "matmul bf16 N%lld C%lld OC%lld %s", (long long)N, (long long)C, (long long)OC,
             bias ? "bias" : "nobias");
    float *x, *w, *b, *dy;
    uint16_t *x16 = bf16_randn(N * C, 1.0f, &x), *w16 = bf16_randn(OC * C, 0.3f, &w);
    uint16_t *b16 = bf16_randn(OC, 0.3f, &b), *dy16 = bf16_randn(N * OC, 1.0f, &dy);
    float *out = fnew(N * OC), *dx = fnew(N * C), *dw = fnew(OC * C), *db = fnew(OC);
    matmul_forward(out, x16, w16, bias ? b16 : NULL, DTYPE_BF16, N, C, OC);
    matmul_backward(dx, dw, bias ? db : NULL, dy16, x16, w16, DTYPE_BF16, N, C, OC);
    double e[4] = {0}, m[4] = {0};
    for (int64_t i = 0; i < N; i++)
        for (int64_t o = 0; o < OC; o++) {
            double r = bias ? b[o] : 0.0;
            for (int64_t c = 0; c < C; c++) r += (double)x[i * C + c] * w[o * C + c];
            e[0] = fmax(e[0], fabs(out[i * OC + o] - r)), m[0] = fmax(m[0], fabs(r));
        }
    for (int64_t i = 0; i < N; i++)
        for (int64_t c = 0; c < C; c++) {
            double r = 0.0;
            for (int64_t o = 0; o < OC; o++) r += (double)dy[i * OC + o] * w[o * C + c];
            e[1] = fmax(e[1], fabs(dx[i * C + c] - r)), m[1] = fmax(m[1], fabs(r));
        }
    for (int64_t o = 0; o < OC; o++) {
        double rb = 0.0;
        for (int64_t c = 0; c < C; c++) {
            double r = 0.0;
            for (int64_t i = 0; i < N; i++) r += (double)dy[i * OC + o] * x[i * C + c];
            e[2] = fmax(e[2], fabs(dw[o * C + c] - r)), m[2] = fmax(m[2], fabs(r));
        }
        for (int64_t i = 0; i < N; i++) rb += dy[i * OC + o];
        e[3] = fmax(e[3], fabs(db[o] - (bias ? rb : 0.0))), m[3] = fmax(m[3], fabs(rb));
    }
    const char *what[4] = {"out", "dinp", "dweight", "dbias"};
    for (int k = 0; k < (bias ? 4 : 3); k++) report(op, what[k], e[k] / fmax(m[k], 1e-30), ACC_TOL, "vs double");
    free(x), free(w), free(b), free(dy), free(x16), free(w16), free(b16), free(dy16);
    free(out), free(dx), free(dw), free(db);
}

// Every skinny kernel that runs here (nn/skinny.h), fp32 and bf16, against sums in double of the same
// operands, at every row count it serves (1 .. 16: its 4-, 2- and 1-row paths), with inner sizes that leave
// a partial step and a scalar tail; each row's output the same bits alone and in any batch (a sequence
// decodes alike alone or batched); and matmul_skinny following the process's choice (skinny_choose).
static void test_skinny_kernels(DType dt, int64_t C, int64_t OC) {
    size_t es = dtype_size(dt);
    float *x, *w, *b;
    uint16_t *x16 = bf16_randn(SKINNY_MAX_ROWS * C, 1.0f, &x), *w16 = bf16_randn(OC * C, 0.3f, &w);
    uint16_t *b16 = bf16_randn(OC, 0.3f, &b);
    const void *xs = dt == DTYPE_BF16 ? (const void *)x16 : x, *ws = dt == DTYPE_BF16 ? (const void *)w16 : w;
    const void *bs = dt == DTYPE_BF16 ? (const void *)b16 : b;
    float *out = fnew(SKINNY_MAX_ROWS * OC), *alone = fnew(OC), *ref = fnew(SKINNY_MAX_ROWS * OC);
    double m = 0.0;
    for (int64_t i = 0; i < SKINNY_MAX_ROWS; i++)
        for (int64_t o = 0; o < OC; o++) {
            double r = b[o];
            for (int64_t c = 0; c < C; c++) r += (double)x[i * C + c] * w[o * C + c];
            ref[i * OC + o] = (float)r;
            m = fmax(m, fabs(r));
        }
    for (int k = 0; k < SKINNY_KERNELS; k++) {
        if (!skinny_kernel_runs((SkinnyKernel)k, dt)) continue;
        char op[64];
        snprintf(op, sizeof op, "skinny %s %s C%lld OC%lld", skinny_kernel_name((SkinnyKernel)k), dtype_name(dt),
                 (long long)C, (long long)OC);
        double err = 0.0, batch = 0.0;
        for (int64_t N = 1; N <= SKINNY_MAX_ROWS; N++) {
            matmul_skinny_with((SkinnyKernel)k, out, xs, ws, bs, dt, N, C, OC);
            for (int64_t i = 0; i < N * OC; i++) err = fmax(err, fabs((double)out[i] - ref[i]) / fmax(m, 1e-30));
            for (int64_t i = 0; k != SKINNY_ONEDNN && i < N; i++) {
                matmul_skinny_with((SkinnyKernel)k, alone, (const char *)xs + (size_t)(i * C) * es, ws, bs, dt, 1, C,
                                   OC);
                for (int64_t o = 0; o < OC; o++) batch += alone[o] != out[i * OC + o];
            }
        }
        report(op, "out, 1..16 rows", err, ACC_TOL, "vs double");
        if (k != SKINNY_ONEDNN) report(op, "a row alone = in a batch", batch, 0.0, "outputs differing");
    }
    // The choice: matmul_skinny runs the chosen kernel; oneDNN and a kernel that does not run dt are refused.
    SkinnyKernel prev = skinny_choice(dt);
    int refused = skinny_choose(dt, SKINNY_ONEDNN) + skinny_choose(dt, SKINNY_KERNELS);
    if (dt == DTYPE_F32) refused += skinny_choose(dt, SKINNY_AVX512_BF16);
    double diff = refused + (skinny_choice(dt) != prev);
    for (int k = 0; k < SKINNY_ONEDNN; k++) {
        if (!skinny_kernel_runs((SkinnyKernel)k, dt)) continue;
        diff += !skinny_choose(dt, (SkinnyKernel)k) + (skinny_choice(dt) != (SkinnyKernel)k);
        matmul_skinny(out, xs, ws, bs, dt, 3, C, OC);
        matmul_skinny_with((SkinnyKernel)k, ref, xs, ws, bs, dt, 3, C, OC);
        diff += memcmp(out, ref, (size_t)(3 * OC) * sizeof *out) != 0;
    }
    skinny_choose(dt, prev);
    char op[64];
    snprintf(op, sizeof op, "skinny choice %s", dtype_name(dt));
    report(op, "each kernel chosen in turn", diff, 0.0, "mismatches");
    free(x), free(w), free(b), free(x16), free(w16), free(b16), free(out), free(alone), free(ref);
}

// The Q8_0 kernels (int8 decode) against sums in double of the dequantized operands, at every row count (with
// inner sizes that leave fewer than four steps at the end, and a partial block of outputs), through
// q8_matmul (inputs quantized there, a bf16 bias added); each row alone = in a batch, and every kernel the
// same bits as AVX2's (a block's integer sum is exact, and the kernels add the blocks in one order).
static void test_q8_kernels(int64_t C, int64_t OC) {
    int64_t nb = C / Q8_BLOCK;
    float *x, *w, *b;
    uint16_t *x16 = bf16_randn(SKINNY_MAX_ROWS * C, 1.0f, &x), *w16 = bf16_randn(OC * C, 0.3f, &w);
    uint16_t *b16 = bf16_randn(OC, 0.3f, &b);
    Q8Block *wq = xmalloc((size_t)(OC * nb) * sizeof *wq), *xq = xmalloc((size_t)(SKINNY_MAX_ROWS * nb) * sizeof *xq);
    Q8In *scratch = xmalloc((size_t)(SKINNY_MAX_ROWS * nb) * sizeof *scratch);
    q8_quantize(wq, w16, DTYPE_BF16, OC, C);
    q8_quantize(xq, x, DTYPE_F32, SKINNY_MAX_ROWS, C);
    float *xd = fnew(SKINNY_MAX_ROWS * C), *wd = fnew(OC * C), *out = fnew(SKINNY_MAX_ROWS * OC);
    float *alone = fnew(OC), *ref = fnew(SKINNY_MAX_ROWS * OC), *avx2 = fnew(SKINNY_MAX_ROWS * OC);
    q8_dequantize(xd, xq, SKINNY_MAX_ROWS * nb);
    q8_dequantize(wd, wq, OC * nb);
    double m = 0.0;
    for (int64_t i = 0; i < SKINNY_MAX_ROWS; i++)
        for (int64_t o = 0; o < OC; o++) {
            double r = b[o];
            for (int64_t c = 0; c < C; c++) r += (double)xd[i * C + c] * wd[o * C + c];
            ref[i * OC + o] = (float)r;
            m = fmax(m, fabs(r));
        }
    SkinnyKernel prev = skinny_choice(DTYPE_Q8);
    for (int k = 0; k < SKINNY_ONEDNN; k++) {
        if (!skinny_kernel_runs((SkinnyKernel)k, DTYPE_Q8)) continue;
        char op[64];
        snprintf(op, sizeof op, "skinny %s Q8_0 C%lld OC%lld", skinny_kernel_name((SkinnyKernel)k), (long long)C,
                 (long long)OC);
        skinny_choose(DTYPE_Q8, (SkinnyKernel)k);
        double err = 0.0, batch = 0.0, same = 0.0;
        for (int64_t N = 1; N <= SKINNY_MAX_ROWS; N++) {
            q8_matmul(out, x, wq, b16, DTYPE_BF16, N, C, OC, scratch);
            for (int64_t i = 0; i < N * OC; i++) err = fmax(err, fabs((double)out[i] - ref[i]) / fmax(m, 1e-30));
            for (int64_t i = 0; i < N; i++) {
                q8_matmul(alone, x + i * C, wq, b16, DTYPE_BF16, 1, C, OC, scratch);
                for (int64_t o = 0; o < OC; o++) batch += alone[o] != out[i * OC + o];
            }
            if (k == SKINNY_AVX2) memcpy(avx2, out, (size_t)(N * OC) * sizeof *out);
            else same += memcmp(avx2, out, (size_t)(N * OC) * sizeof *out) != 0;  // N = 16 last: all rows
        }
        report(op, "out, 1..16 rows", err, ACC_TOL, "vs double");
        report(op, "a row alone = in a batch", batch, 0.0, "outputs differing");
        if (k != SKINNY_AVX2) report(op, "the same bits as avx2", same, 0.0, "row counts differing");
    }
    skinny_choose(DTYPE_Q8, prev);
    free(x), free(w), free(b), free(x16), free(w16), free(b16), free(wq), free(xq), free(scratch), free(xd), free(wd);
    free(out), free(alone), free(ref), free(avx2);
}

// --------------------------------------------------------------------------------------- logprob

typedef struct {
    float *out, *h, *W, *r, *scratch;
    int32_t *targets;
    int64_t N, C, V;
    float *re, *ent;  // with re: loss += re . entropy
} LpCtx;

static double lp_loss(void *p) {
    LpCtx *c = p;
    logprob_forward(c->out, c->re ? c->ent : NULL, c->h, c->W, DTYPE_F32, c->targets, c->N, c->C, c->V, c->scratch);
    return dot_d(c->r, c->out, c->N) + (c->re ? dot_d(c->re, c->ent, c->N) : 0.0);
}

static void test_logprob(int64_t N, int64_t C, int64_t V, int64_t max_samples) {
    char op[64];
    snprintf(op, sizeof op, "logprob N%lld C%lld V%lld", (long long)N, (long long)C, (long long)V);
    int32_t *targets = xmalloc((size_t)N * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++)
        targets[i] = i % 4 == 1 ? -1 : (int32_t)(rng_next_u64(&g_rng) % (uint64_t)V);
    targets[N - 1] = (int32_t)V - 1;
    // dlogp non-zero everywhere, also on target -1 rows (those must get no gradient)
    LpCtx c = {fnew(N), frandn(N * C, 1.0f), frandn(V * C, 0.5f), frandn(N, 1.0f),
               fnew((int64_t)logprob_scratch_floats(V, C, DTYPE_F32)), targets, N, C, V};
    float *dh = fnew(N * C), *dW = fnew(V * C);
    logprob_backward(dh, dW, NULL, c.r, NULL, c.h, c.W, DTYPE_F32, targets, N, C, V, c.scratch);
    fd_check(op, "dh", lp_loss, &c, c.h, dh, N * C, 1e-2f, max_samples);
    fd_check(op, "dW", lp_loss, &c, c.W, dW, V * C, 1e-2f, max_samples);
    double z = 0.0;
    for (int64_t i = 0; i < N; i++)
        if (targets[i] < 0)
            for (int64_t j = 0; j < C; j++) z = fmax(z, fabs(dh[i * C + j]));
    report(op, "dh = 0 on target -1 rows", z, 0.0, "");
    logprob_forward(c.out, NULL, c.h, c.W, DTYPE_F32, targets, N, C, V, c.scratch);
    z = 0.0;
    for (int64_t i = 0; i < N; i++)
        if (targets[i] < 0) z = fmax(z, fabs(c.out[i]));
    report(op, "out = 0 on target -1 rows", z, 0.0, "");
    float *ph = frandn(N * C, 1.0f), *pW = frandn(V * C, 1.0f), *ah = fcopy(ph, N * C), *aW = fcopy(pW, V * C);
    // The fused form (out given) writes the forward's logprobs and the same gradients.
    float *fused = fnew(N);
    logprob_backward(ah, aW, fused, c.r, NULL, c.h, c.W, DTYPE_F32, targets, N, C, V, c.scratch);
    z = 0.0;
    for (int64_t i = 0; i < N; i++) z = fmax(z, fabs(fused[i] - c.out[i]));
    report(op, "fused out == logprob_forward", z, 0.0, "");
    free(fused);
    acc_check(op, "dh", ah, ph, dh, N * C);
    acc_check(op, "dW", aW, pW, dW, V * C);
    // The entropy term (GRPO's entropy bonus): loss = r . logprob + re . entropy.
    char op2[80];
    snprintf(op2, sizeof op2, "logprob+entropy N%lld C%lld V%lld", (long long)N, (long long)C, (long long)V);
    c.re = frandn(N, 1.0f), c.ent = fnew(N);
    float *eh = fnew(N * C), *eW = fnew(V * C);
    logprob_backward(eh, eW, NULL, c.r, c.re, c.h, c.W, DTYPE_F32, targets, N, C, V, c.scratch);
    fd_check(op2, "dh", lp_loss, &c, c.h, eh, N * C, 1e-2f, max_samples);
    fd_check(op2, "dW", lp_loss, &c, c.W, eW, V * C, 1e-2f, max_samples);
    z = 0.0;
    for (int64_t i = 0; i < N; i++)
        if (targets[i] < 0) z = fmax(z, fabs(c.ent[i]));
    report(op2, "entropy = 0 on target -1 rows", z, 0.0, "");
    free(c.re), free(c.ent), free(eh), free(eW);
    free(c.out), free(c.h), free(c.W), free(c.r), free(c.scratch), free(targets), free(dh), free(dW);
    free(ph), free(pW), free(ah), free(aW);
}

// --------------------------------------------------------------------------------- row math

// exp_approx (under every softmax, sigmoid and log-prob) against libm's exp in double, in ulps of the
// correctly rounded float (its polynomial is within 1); row_max and row_exp_sum against serial loops.
static void test_vmath(void) {
    double worst = 0.0, at = 0.0;
    const int64_t points = g_max_samples == INT64_MAX ? 4000000 : 40000;
    for (int64_t i = 0; i <= points; i++) {
        float x = -87.0f + 175.0f * (float)i / (float)points;
        double want = exp((double)x);
        float wf = (float)want;
        double ulp = (double)nextafterf(wf, INFINITY) - (double)wf, err = fabs((double)exp_approx(x) - want) / ulp;
        if (err > worst) worst = err, at = x;
    }
    char detail[64];
    snprintf(detail, sizeof detail, "worst at x = %.6g", at);
    report("exp_approx", "ulps on [-87, 88] vs exp()", worst, 2.0, detail);
    float edge_x[] = {0.0f, -INFINITY, -100.0f, INFINITY, 100.0f}, edge_want[] = {1.0f, 0.0f, 0.0f, INFINITY, INFINITY};
    int bad = isnan(exp_approx(NAN)) ? 0 : 1;
    for (int i = 0; i < 5; i++) bad += exp_approx(edge_x[i]) != edge_want[i];
    report("exp_approx", "1 at 0, 0 / inf / NaN at the ends", bad, 0.0, "");

    int64_t lens[] = {1, 7, 16, 17, 151936};
    double max_err = 0.0, sum_err = 0.0;
    for (int t = 0; t < 5; t++) {
        int64_t n = lens[t];
        float *x = frandn(n, 4.0f), *e = fnew(n);
        x[n / 2] = NAN;  // ignored by the max, as a serial x > mx loop ignores it
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        float got = row_max(x, n);
        max_err = fmax(max_err, n > 1 ? fabs((double)got - mx) : (isnan(got) ? 0.0 : 1.0));
        x[n / 2] = 0.0f;
        mx = row_max(x, n);
        double s = row_exp_sum(e, x, n, mx, 0.7f), want = 0.0;
        for (int64_t i = 0; i < n; i++) {
            want += exp((double)((x[i] - mx) * 0.7f));  // the float argument: only exp's error remains
            max_err = fmax(max_err, e[i] != exp_approx((x[i] - mx) * 0.7f));
        }
        sum_err = fmax(sum_err, fabs(s - want) / want);
        free(x), free(e);
    }
    report("row_max, row_exp_sum", "max (and stored e^x) exact", max_err, 0.0, "");
    report("row_exp_sum", "sum vs double, relative", sum_err, 1.2e-7, "");  // 1 ulp a term at most
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--sampled") == 0) g_max_samples = SAMPLED_POINTS;
    const int full = g_max_samples == INT64_MAX;
    const CpuLevel *cpu = cpu_level();
    printf("test_ops_grad: CPU level %s%s%s, bf16 products %s\n", cpu_isa_name(cpu->level), cpu->cap ? " by " : "",
           cpu->cap ? cpu->cap : "", gemm_bf16_native() ? "on oneDNN's bf16 matmul" : "widened to fp32");
    rng_init(&g_rng, 1234);
    test_vmath();
    test_embedding();
    test_rmsnorm(5, 37, 1e-5f, 0.0f);
    test_rmsnorm(3, 16, 1e-6f, 0.0f);
    test_rmsnorm(4, 24, 1e-6f, 1.0f);
    test_layernorm(5, 37, 1e-6f);
    test_layernorm(3, 16, 1e-5f);
    test_gelu();
    test_matmul(1, 19, 23, 1);   // gemv path
    test_matmul(5, 19, 23, 1);   // skinny kernel (N <= 16)
    test_matmul(16, 24, 10, 0);  // skinny, no bias
    test_matmul(37, 19, 23, 1);  // sgemm path
    test_matmul(40, 33, 70, 0);
    test_matmul_bf16(1, 100, 23, 1);  // skinny: a 64-block, a 32-block and a tail; OC not a multiple of 4
    test_matmul_bf16(5, 70, 9, 1);    // skinny, two row groups
    test_matmul_bf16(16, 64, 37, 0);  // skinny, four row groups
    test_matmul_bf16(37, 40, 23, 1);  // oneDNN
    test_matmul_bf16(300, 96, 130, 1);
    test_matmul_bf16(full ? 600 : 100, 1100, full ? 300 : 150, 1);  // widened: above the skinny kernel's rows
    // C 316: every kernel's steps (fp32 32 / 64 values, bf16 32 / 64 / 128) leave a partial step and a tail;
    // OC 130: threads share the columns (OC * C past PAR_MIN); C 256: whole steps only
    test_skinny_kernels(DTYPE_F32, 316, 130);
    test_skinny_kernels(DTYPE_BF16, 316, 23);
    test_skinny_kernels(DTYPE_BF16, 256, 9);
    test_q8_kernels(320, 23);
    test_q8_kernels(96, 9);
    test_rope(1e4);
    test_rope(1e6);
    const int64_t l1[] = {1, 5, 9}, l2[] = {4, 2}, l3[] = {6, 1, 3}, l4[] = {3, 130};
    test_attention(l1, 3, 4, 2, 8, 0, 1 << 30);  // GQA 2
    test_attention(l2, 2, 2, 2, 4, 0, 1 << 30);  // MHA
    test_attention(l3, 3, 4, 1, 6, 0, 1 << 30);  // MQA (4 query heads on one kv head)
    test_attention(l4, 2, 2, 1, 4, 0, 160);      // crosses the 128-query block; sampled
    test_attention(l1, 3, 4, 2, 8, 3, 1 << 30);  // sliding window 3 (Mistral's, Gemma's local layers)
    test_attention(l4, 2, 2, 1, 4, 50, 160);     // a window across the 128-query block's start
    test_glu(GLU_SILU);
    test_glu(GLU_GELU_TANH);
    test_logprob(9, 12, 50, 1 << 30);
    test_logprob(300, 8, 37, 200);  // crosses the 256-row chunk; sampled
    printf("test_ops_grad: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures != 0;
}

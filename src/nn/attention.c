#include <math.h>
#include <omp.h>

#include "base/util.h"
#include "base/vmath.h"
#include "nn/gemm.h"
#include "nn/ops.h"

// Softmax of each of `rows` rows of n floats, in place; returns the last row's log-sum-exp.
static float softmax_rows(float *s, int64_t rows, int64_t n, int64_t ld) {
    float lse = 0.0f;
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * ld, mx = row_max(row, n), sum = (float)row_exp_sum(row, row, n, mx, 1.0f);
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; j++) row[j] *= inv;
        lse = mx + logf(sum);
    }
    return lse;
}

// Queries are processed in blocks so scratch is (block x T) per thread, not (T x T),
// and keys past the block's last query are never touched (causal).
#define ATT_QBLOCK 128

size_t attention_scratch_floats(int64_t max_T) { return (size_t)omp_get_max_threads() * ATT_QBLOCK * (size_t)max_T; }

// A block of queries i0 .. reads keys k0 = attn_first_key(i0) onwards; within them query i sees local indices
// row_lo(i, k0) .. i - k0.
static int64_t row_lo(int64_t i, int64_t k0, int64_t window) {
    int64_t lo = attn_first_key(i, window) - k0;
    return lo > 0 ? lo : 0;
}

void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, const int64_t *seq_off,
                       int B, AttnShape a, float *scratch) {
    int H = a.H, D = a.D;
    int64_t qs = (int64_t)H * D, kvs = (int64_t)a.KVH * D;  // row strides
    int group = H / a.KVH;
    int64_t max_T = 0;
    for (int b = 0; b < B; b++) max_T = seq_off[b + 1] - seq_off[b] > max_T ? seq_off[b + 1] - seq_off[b] : max_T;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            float *S = scratch + (size_t)omp_get_thread_num() * ATT_QBLOCK * (size_t)max_T;
            int64_t r0 = seq_off[b], T = seq_off[b + 1] - r0;
            const float *qh = q + r0 * qs + (int64_t)h * D;
            const float *kh = k + r0 * kvs + (int64_t)(h / group) * D;
            const float *vh = v + r0 * kvs + (int64_t)(h / group) * D;
            float *oh = out + r0 * qs + (int64_t)h * D;
            for (int64_t i0 = 0; i0 < T; i0 += ATT_QBLOCK) {
                int64_t bs = T - i0 < ATT_QBLOCK ? T - i0 : ATT_QBLOCK, k0 = attn_first_key(i0, a.window);
                int64_t nk = i0 + bs - k0;
                gemm_f32_local(0, 1, bs, nk, D, a.scale, qh + i0 * qs, qs, kh + k0 * kvs, kvs, 0, S, nk);
                for (int64_t r = 0; r < bs; r++) {
                    float *s = S + r * nk;
                    int64_t lo = row_lo(i0 + r, k0, a.window), hi = i0 + r - k0;
                    float l = softmax_rows(s + lo, 1, hi - lo + 1, nk);
                    if (lse) lse[(r0 + i0 + r) * H + h] = l;
                    for (int64_t j = 0; j < nk; j++)
                        if (j < lo || j > hi) s[j] = 0.0f;
                }
                gemm_f32_local(0, 0, bs, D, nk, 1.0f, S, nk, vh + k0 * kvs, kvs, 0, oh + i0 * qs, qs);
            }
        }
    }
}

size_t attention_backward_scratch_floats(int64_t max_T) { return 2 * attention_scratch_floats(max_T); }

// Per query block: rebuild P = exp(S - lse), then dV += P^T dO, dS = P * (dO V^T - rowsum(dO * O)),
// dQ = scale dS K, dK += scale dS^T Q. Threads own whole (sequence, kv head) pairs, so the query
// heads sharing a kv head add into its dK/dV one after another, never concurrently.
void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                        const float *q, const float *k, const float *v, const int64_t *seq_off, int B, AttnShape a,
                        float *scratch) {
    int H = a.H, KVH = a.KVH, D = a.D;
    int64_t qs = (int64_t)H * D, kvs = (int64_t)KVH * D;
    int group = H / KVH;
    float scale = a.scale;
    int64_t max_T = 0;
    for (int b = 0; b < B; b++) max_T = seq_off[b + 1] - seq_off[b] > max_T ? seq_off[b + 1] - seq_off[b] : max_T;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++) {
        for (int g = 0; g < KVH; g++) {
            float *S = scratch + (size_t)omp_get_thread_num() * 2 * ATT_QBLOCK * (size_t)max_T;
            float *dP = S + ATT_QBLOCK * (size_t)max_T;
            int64_t r0 = seq_off[b], T = seq_off[b + 1] - r0;
            const float *kg = k + r0 * kvs + (int64_t)g * D, *vg = v + r0 * kvs + (int64_t)g * D;
            float *dkg = dk + r0 * kvs + (int64_t)g * D, *dvg = dv + r0 * kvs + (int64_t)g * D;
            for (int64_t i = 0; i < T; i++)
                for (int d = 0; d < D; d++) dkg[i * kvs + d] = dvg[i * kvs + d] = 0.0f;
            for (int h = g * group; h < (g + 1) * group; h++) {
                const float *qh = q + r0 * qs + (int64_t)h * D, *oh = out + r0 * qs + (int64_t)h * D;
                const float *doh = dout + r0 * qs + (int64_t)h * D;
                float *dqh = dq + r0 * qs + (int64_t)h * D;
                for (int64_t i0 = 0; i0 < T; i0 += ATT_QBLOCK) {
                    int64_t bs = T - i0 < ATT_QBLOCK ? T - i0 : ATT_QBLOCK, k0 = attn_first_key(i0, a.window);
                    int64_t nk = i0 + bs - k0;
                    const float *kb = kg + k0 * kvs, *vb = vg + k0 * kvs;
                    gemm_f32_local(0, 1, bs, nk, D, scale, qh + i0 * qs, qs, kb, kvs, 0, S, nk);
                    gemm_f32_local(0, 1, bs, nk, D, 1.0f, doh + i0 * qs, qs, vb, kvs, 0, dP, nk);
                    for (int64_t r = 0; r < bs; r++) {
                        float *s = S + r * nk, *dp = dP + r * nk;
                        float l = lse[(r0 + i0 + r) * H + h], di = 0.0f;
                        int64_t lo = row_lo(i0 + r, k0, a.window), hi = i0 + r - k0;
                        for (int d = 0; d < D; d++) di += doh[(i0 + r) * qs + d] * oh[(i0 + r) * qs + d];
                        for (int64_t j = 0; j < nk; j++) {
                            float p = j >= lo && j <= hi ? exp_approx(s[j] - l) : 0.0f;
                            s[j] = p;
                            dp[j] = p * (dp[j] - di);
                        }
                    }
                    gemm_f32_local(1, 0, nk, D, bs, 1.0f, S, nk, doh + i0 * qs, qs, 1, dvg + k0 * kvs, kvs);
                    gemm_f32_local(0, 0, bs, D, nk, scale, dP, nk, kb, kvs, 0, dqh + i0 * qs, qs);
                    gemm_f32_local(1, 0, nk, D, bs, scale, dP, nk, qh + i0 * qs, qs, 1, dkg + k0 * kvs, kvs);
                }
            }
        }
    }
}

// Whether row b of a decode batch continues row b - 1's run: the same cache slot, the next position (a prompt's
// rows after those its slot holds).
static int continues(const int64_t *kv_off, const int32_t *n_keys, int b) {
    return b > 0 && kv_off[b] == kv_off[b - 1] && n_keys[b] == n_keys[b - 1] + 1;
}

// Whether row b starts a block: a run's first row, or a row at a multiple of ATT_QBLOCK positions (so a block
// holds at most ATT_QBLOCK rows, found without walking back to the run's start).
static int block_start(const int64_t *kv_off, const int32_t *n_keys, int b) {
    return !continues(kv_off, n_keys, b) || (n_keys[b] - 1) % ATT_QBLOCK == 0;
}

#define ATT_WIDEN 8192      // floats of a thread's stack that a bf16 cache's keys or values are widened into
#define ATT_BF16_DMAX 1024  // head_dim a bf16 cache is read with (a tile of 8 keys at least)

// Rows j0 .. j0 + t - 1 (of D elements, kvs apart) of a bf16 cache from element `first`, widened into buf (t, D).
static void widen_rows(float *buf, const void *cache, int64_t first, int64_t kvs, int64_t j0, int64_t t, int D) {
    for (int64_t j = 0; j < t; j++) {
        const uint16_t *row = (const uint16_t *)cache + first + (j0 + j) * kvs;
        for (int d = 0; d < D; d++) buf[j * D + d] = bf16_to_f32(row[d]);
    }
}

// S (M, n) = scale * Q (M, D; rows ldq apart) @ K^T, keys n rows of the cache from element `first`, kvs apart
// (a bf16 cache's a tile at a time, widened).
static void cache_scores(int64_t M, int64_t n, int D, float scale, const float *Q, int64_t ldq, const void *cache,
                         DType dt, int64_t first, int64_t kvs, float *S) {
    if (dt == DTYPE_F32) {
        gemm_f32_local(0, 1, M, n, D, scale, Q, ldq, (const float *)cache + first, kvs, 0, S, n);
        return;
    }
    float buf[ATT_WIDEN];
    for (int64_t j0 = 0, tile = ATT_WIDEN / D; j0 < n; j0 += tile) {
        int64_t t = n - j0 < tile ? n - j0 : tile;
        widen_rows(buf, cache, first, kvs, j0, t, D);
        gemm_f32_local(0, 1, M, t, D, scale, Q, ldq, buf, D, 0, S + j0, n);
    }
}

// O (M, D; rows ldo apart) = S (M, n) @ V, values as cache_scores' keys (overwrites O).
static void cache_values(int64_t M, int64_t n, int D, const float *S, const void *cache, DType dt, int64_t first,
                         int64_t kvs, float *O, int64_t ldo) {
    if (dt == DTYPE_F32) {
        gemm_f32_local(0, 0, M, D, n, 1.0f, S, n, (const float *)cache + first, kvs, 0, O, ldo);
        return;
    }
    float buf[ATT_WIDEN];
    for (int64_t j0 = 0, tile = ATT_WIDEN / D; j0 < n; j0 += tile) {
        int64_t t = n - j0 < tile ? n - j0 : tile;
        widen_rows(buf, cache, first, kvs, j0, t, D);
        gemm_f32_local(0, 0, M, D, t, 1.0f, S + j0, n, buf, D, j0 > 0, O, ldo);
    }
}

void attention_decode_forward(float *out, const float *q, const void *k_cache, const void *v_cache, DType kv_dt,
                              const int64_t *kv_off, const int32_t *n_keys, int B, AttnShape a, float *scratch) {
    int H = a.H, KVH = a.KVH, D = a.D;
    int64_t qs = (int64_t)H * D, kvs = (int64_t)KVH * D;
    int group = H / KVH;
    if (kv_dt != DTYPE_F32 && (kv_dt != DTYPE_BF16 || D > ATT_BF16_DMAX))
        die("attention over a %s KV cache with head_dim %d is not supported (fp32; bf16 up to %d)",
            dtype_name(kv_dt), D, ATT_BF16_DMAX);
    int32_t max_n = 0;
    for (int b = 0; b < B; b++) max_n = n_keys[b] > max_n ? n_keys[b] : max_n;
    // A row alone: the query heads of one kv head form a (group x D) matrix against the same keys, one product
    // each way (the kv head's first query head's turn). A block of a run's rows (up to ATT_QBLOCK): per query head,
    // the rows' queries against the keys up to the last row's, each row's own keys masked as in attention_forward.
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            if (!block_start(kv_off, n_keys, b)) continue;
            int bs = 1;
            while (b + bs < B && continues(kv_off, n_keys, b + bs) && !block_start(kv_off, n_keys, b + bs)) bs++;
            if (bs == 1 && h % group) continue;
            float *S = scratch + (size_t)omp_get_thread_num() * ATT_QBLOCK * (size_t)max_n;
            int64_t n0 = attn_first_key(n_keys[b] - 1, a.window), n = n_keys[b + bs - 1] - n0;
            int64_t first = kv_off[b] + n0 * kvs + (int64_t)(h / group) * D;
            if (bs == 1) {
                cache_scores(group, n, D, a.scale, q + b * qs + (int64_t)h * D, D, k_cache, kv_dt, first, kvs, S);
                softmax_rows(S, group, n, n);
                cache_values(group, n, D, S, v_cache, kv_dt, first, kvs, out + b * qs + (int64_t)h * D, D);
                continue;
            }
            cache_scores(bs, n, D, a.scale, q + b * qs + (int64_t)h * D, qs, k_cache, kv_dt, first, kvs, S);
            for (int r = 0; r < bs; r++) {
                float *s = S + (int64_t)r * n;
                int64_t pos = n_keys[b + r] - 1, lo = attn_first_key(pos, a.window) - n0, hi = pos - n0;
                softmax_rows(s + lo, 1, hi - lo + 1, n);
                for (int64_t j = 0; j < n; j++)
                    if (j < lo || j > hi) s[j] = 0.0f;
            }
            cache_values(bs, n, D, S, v_cache, kv_dt, first, kvs, out + b * qs + (int64_t)h * D, qs);
        }
    }
}

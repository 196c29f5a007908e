// Top-k gradient compression with error feedback; the semantics are in topk.h.
#include "parallel/topk.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint32_t idx;  // within the chunk
    float val;
} TopKPair;

// Selection never needs more: k pairs of 8 bytes per chunk must fit MPI's int byte count.
#define TOPK_MAX_CHUNK ((size_t)1 << 27)

size_t topk_count(size_t n, double ratio) {
    if (n == 0) return 0;
    double k = ceil(ratio * (double)n);
    if (k < 1) return 1;
    return k >= (double)n ? n : (size_t)k;
}

void topk_init(TopK *t, size_t n, double ratio) {
    if (!(ratio > 0 && ratio <= 1)) die("compression.ratio must be in (0, 1], got %g", ratio);
    memset(t, 0, sizeof *t);
    t->ratio = ratio;
    t->n = n;
    t->chunk = TOPK_CHUNK_FLOATS;
    if (ratio < 1) t->residual = xcalloc(n, sizeof *t->residual);
}

void topk_free(TopK *t) {
    free(t->residual);
    free(t->send);
    free(t->recv);
    free(t->hist);
    memset(t, 0, sizeof *t);
}

// Magnitude order as integers: for |x| the IEEE bits grow with the value, and NaNs lie above inf.
static uint32_t key_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u & 0x7fffffffu;
}

// The k-th largest key of g[0..n) (1 <= k <= n): radix select on the high, then the low 16 bits,
// two passes and no sort. *above = the number of keys strictly larger.
static uint32_t kth_largest_key(const float *g, size_t n, size_t k, size_t *hist, size_t *above) {
    size_t cum = 0;
    memset(hist, 0, 65536 * sizeof *hist);
    for (size_t i = 0; i < n; i++) hist[key_of(g[i]) >> 16]++;
    uint32_t hi = 65535;
    while (cum + hist[hi] < k) cum += hist[hi--];
    memset(hist, 0, 65536 * sizeof *hist);
    for (size_t i = 0; i < n; i++) {
        uint32_t key = key_of(g[i]);
        if (key >> 16 == hi) hist[key & 0xffffu]++;
    }
    uint32_t lo = 65535;
    while (cum + hist[lo] < k) cum += hist[lo--];
    *above = cum;
    return hi << 16 | lo;
}

void topk_allreduce_mean(Comm *c, TopK *t, float *grad, size_t n, const char *what) {
    if (n != t->n) comm_abort(c, "%s: top-k state is for %zu floats, got %zu", what, t->n, n);
    if (t->ratio >= 1) {  // keep everything: the dense all-reduce, bit for bit
        comm_allreduce_mean(c, grad, n, what);
        return;
    }
    if (t->chunk == 0 || t->chunk > TOPK_MAX_CHUNK) t->chunk = t->chunk ? TOPK_MAX_CHUNK : TOPK_CHUNK_FLOATS;
    size_t kmax = topk_count(n < t->chunk ? n : t->chunk, t->ratio);
    if (!t->hist) {
        t->send = xmalloc(kmax * sizeof(TopKPair));
        t->recv = xmalloc(kmax * sizeof(TopKPair) * (size_t)c->size);
        t->hist = xmalloc(65536 * sizeof *t->hist);
    }
    TopKPair *send = t->send, *recv = t->recv;
    for (size_t c0 = 0; c0 < n; c0 += t->chunk) {
        size_t len = n - c0 < t->chunk ? n - c0 : t->chunk, k = topk_count(len, t->ratio), above;
        float *g = grad + c0, *res = t->residual + c0;
        for (size_t i = 0; i < len; i++) g[i] += res[i];
        uint32_t thresh = kth_largest_key(g, len, k, t->hist, &above);
        size_t ties = k - above, j = 0;  // entries equal to the threshold to take, lowest index first
        for (size_t i = 0; i < len; i++) {
            uint32_t key = key_of(g[i]);
            int take = key > thresh || (key == thresh && ties > 0);
            if (key == thresh && take) ties--;
            if (take) {
                send[j].idx = (uint32_t)i;
                send[j++].val = g[i];
                res[i] = 0;
            } else {
                res[i] = g[i];
            }
        }
        comm_wait(c, comm_allgather_bytes_start(c, send, recv, k * sizeof *send, what));
        memset(g, 0, len * sizeof *g);
        for (size_t p = 0; p < k * (size_t)c->size; p++) g[recv[p].idx] += recv[p].val;  // rank order
        float s = (float)c->size;
        for (size_t i = 0; i < len; i++) g[i] /= s;
    }
}

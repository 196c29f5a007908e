// Top-k gradient compression with error feedback (`compression.type: topk`, `compression.ratio`).
//
// Each step, per chunk of the gradient (TopK.chunk floats; the last chunk may be shorter):
//   g = grad + residual                   (error feedback: what was not sent before is added back)
//   k = ceil(ratio * chunk length), at least 1
//   sent = the k entries of g with the largest |g| (NaN counts as larger than any number, so a
//          non-finite gradient always reaches every rank); ties are broken by the lower index
//   residual = g with the sent entries set to 0 (= g - sent), kept for the next step
//   every rank all-gathers the (index, value) pairs of all ranks; the result is, per entry, the sum
//   of the values sent for it, added in rank order starting from 0, divided by size
//   grad <- that result (identical on every rank; 0 where no rank sent the entry)
// ratio is the fraction of gradient entries each rank sends per step, in (0, 1]. Each pair is 8
// bytes (uint32 index, float value), so the sparse exchange sends fewer bytes than a dense
// all-reduce (4 bytes per entry) only for ratio < 0.5. ratio 1 keeps everything and is exactly
// comm_allreduce_mean (the same bits, no residual); it takes that dense path.
// The residual is per-rank state: a resumed run that should continue bit for bit must restore it.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "parallel/comm.h"

// Default selection unit: 64 Mi floats (k*8 bytes per chunk stays under MPI's int counts).
#define TOPK_CHUNK_FLOATS ((size_t)64 << 20)

typedef struct {
    double ratio;     // fraction of entries sent per step, in (0, 1]
    size_t n;         // gradient length (the same every step)
    size_t chunk;     // selection unit in floats; TOPK_CHUNK_FLOATS unless changed before the first step
    float *residual;  // n floats, zero at start (NULL for ratio 1)
    // Scratch, allocated on first use: send/receive pairs and the radix-select histogram.
    void *send, *recv;
    size_t *hist;
} TopK;

// Number of entries sent for a chunk of n floats: ceil(ratio * n), clamped to [1, n] (0 if n == 0).
size_t topk_count(size_t n, double ratio);
// Sets up the state for gradients of n floats; aborts unless 0 < ratio <= 1.
void topk_init(TopK *t, size_t n, double ratio);
void topk_free(TopK *t);
// grad[0..n) <- the compressed mean over ranks described above; updates t->residual.
// Every rank must call it with the same n (== t->n) in the same order.
void topk_allreduce_mean(Comm *c, TopK *t, float *grad, size_t n, const char *what);

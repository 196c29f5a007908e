// Q8_0, llama.cpp's 8-bit format (its block_q8_0): a row's values in runs of 32, each stored as a block of
// 32 int8 and one fp16 scale d = max|x| / 127, value i = d * q[i] with q[i] = round(x[i] / d): 34 bytes for
// 32 values. Decode's int8 weights (rollout.weight_dtype: int8, generate --dtype int8) are Q8_0 copies of
// the projections, and the inputs of their kernels (nn/skinny.h, DTYPE_Q8) are Q8_0 rows too, each block's
// 32 products then summed exactly in integers.
#pragma once
#include <stdint.h>

#include "base/dtype.h"

#define Q8_BLOCK 32

typedef struct Q8Block {
    uint16_t d;  // fp16
    int8_t q[Q8_BLOCK];
} Q8Block;
_Static_assert(sizeof(Q8Block) == 2 + Q8_BLOCK, "Q8Block is llama.cpp's block_q8_0: 34 bytes");

// A block of a projection's input as the kernels take it: Q8_0's values, per 4 values -128 times their sum
// (the VNNI kernel multiplies unsigned weights, q + 128, and starts its sums there), and the fp16 scale as
// the fp32 it is.
typedef struct Q8In {
    int8_t q[Q8_BLOCK];
    int32_t corr[Q8_BLOCK / 4];
    float d;
} Q8In;

// rows x C values of x (stored as dt: F32 or BF16; C a multiple of Q8_BLOCK) into rows x C/Q8_BLOCK blocks,
// overwriting out; OpenMP-parallel.
void q8_quantize(Q8Block *out, const void *x, DType dt, int64_t rows, int64_t C);
// The same as kernel inputs.
void q8_quantize_inputs(Q8In *out, const float *x, int64_t rows, int64_t C);
// n blocks back to n x Q8_BLOCK values (d * q).
void q8_dequantize(float *out, const Q8Block *b, int64_t n);

// out (N, OC) = x (N, C) @ W^T (+ bias), overwriting out, for N <= SKINNY_MAX_ROWS (decode): W (OC, C) in
// Q8_0 blocks, x quantized into xq (N x C/Q8_BLOCK blocks) first, then the kernel chosen for DTYPE_Q8;
// bias NULL or OC values of dtype bt.
void q8_matmul(float *out, const float *x, const Q8Block *w, const void *bias, DType bt, int64_t N, int64_t C,
               int64_t OC, Q8In *xq);

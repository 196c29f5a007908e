// The skinny projection (decode: a few rows), inside nn/: out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias
// for N <= SKINNY_MAX_ROWS, with kernels per instruction set chosen at run time (base/cpu.h).
#pragma once
#include <stdint.h>

#include "base/dtype.h"

#define SKINNY_MAX_ROWS 16

void matmul_skinny(float *out, const void *inp, const void *weight, const void *bias, DType dt, int64_t N, int64_t C,
                   int64_t OC);
// Output columns o0 .. o0+3 (those < OC) with AVX512-BF16 (skinny_avx512bf16.c, compiled for it).
void skinny_block_bf16_avx512(float *out, const uint16_t *inp, const uint16_t *weight, const uint16_t *bias,
                              int64_t o0, int64_t N, int64_t C, int64_t OC);

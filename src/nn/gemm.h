// Matrix products on oneDNN with fp32 accumulation: the one place the ops call a GEMM library.
// Row-major; ta / tb transpose A / B as stored. oneDNN picks its kernels (AVX2, AVX-512, AVX512-BF16,
// AMX) from what the CPU has at run time (capped by GRPO_CPU_ISA: base/cpu.h), and caches each shape's
// primitive itself. bf16 where oneDNN has no bf16 matmul (below AVX-512) widens tiles of the operands to
// fp32 in cache-sized buffers and multiplies those: the same products, summed in another order.
#pragma once
#include <stdint.h>

#include "base/dtype.h"

// C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) [+ bias (N)] [+ C when accumulate].
// A and B are both `dt` (DTYPE_F32 or DTYPE_BF16); bias, may be NULL (and is with alpha != 1), is `dt` too;
// C is fp32.
// Uses every OpenMP thread; each distinct shape is compiled once (about a millisecond).
void gemm(DType dt, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda,
          const void *B, int64_t ldb, const void *bias, int accumulate, float *C, int64_t ldc);
// The same in fp32 without bias, for small products inside an OpenMP parallel region (attention's
// per-head blocks): runs on the calling thread, and needs nothing compiled per shape.
void gemm_f32_local(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, int accumulate, float *C, int64_t ldc);

// 1 when oneDNN multiplies bf16 itself on this CPU, 0 when gemm widens tiles to fp32 (decided once).
int gemm_bf16_native(void);
// The instruction set oneDNN dispatches to here ("avx2", "avx512_core_bf16", ...).
const char *gemm_onednn_isa(void);

// The emulated device (--device emu): backend.cuh's kernels and ops compiled as host C++ with emu.h, so that every
// kernel runs on the CPU under CUDA's execution model; the GEMM, cuBLASLt's on the GPU, is the CPU backend's under
// the same contract (bf16 operands, fp32 accumulation), its bias added by the backend's own kernel; the other
// products (backwards', LoRA's) are the CPU's gemm (nn/gemm.h).
#define GRPO_EMU 1
#include "cuda/backend.cuh"

extern "C" {
#include "nn/gemm.h"
}

static void gemm_new(Cuda *c) { c->gemm = NULL; }

static void gemm_free(Cuda *c) { (void)c; }

static size_t gemm_workspace_bytes(void) { return 0; }

static void dist_free(Cuda *c) { (void)c; }  // no collectives: the emulated device's ranks use MPI

static int gemm_bf16(Cuda *c, float *out, const void *inp, const void *weight, const float *bias32, int64_t N,
                     int64_t C, int64_t OC) {
    (void)c;
    (void)bias32;
    emu::DeviceAccess access("the emulated GEMM", {out, inp, weight});
    matmul_forward(out, inp, weight, NULL, DTYPE_BF16, N, C, OC);
    return 0;
}

static void gemm_ex(Cuda *c, int bf16, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                    int64_t lda, const void *B, int64_t ldb, int accumulate, float *C, int64_t ldc) {
    (void)c;
    emu::DeviceAccess access("the emulated GEMM", {A, B, C});
    gemm(bf16 ? DTYPE_BF16 : DTYPE_F32, ta, tb, M, N, K, alpha, A, lda, B, ldb, NULL, accumulate, C, ldc);
}

const Backend *emu_backend_open(void) { return backend_new("emu", 0); }

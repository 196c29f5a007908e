// The emulated device (--device emu): backend.cuh's kernels and ops compiled as host C++ with emu.h, so that every
// kernel runs on the CPU under CUDA's execution model; the GEMM, cuBLASLt's on the GPU, is the CPU backend's under
// the same contract (bf16 operands, fp32 accumulation), its bias added by the backend's own kernel.
#define GRPO_EMU 1
#include "cuda/backend.cuh"

static void gemm_new(Cuda *c) { c->gemm = NULL; }

static void gemm_free(Cuda *c) { (void)c; }

static int gemm_bf16(Cuda *c, float *out, const void *inp, const void *weight, const float *bias32, int64_t N,
                     int64_t C, int64_t OC) {
    (void)c;
    (void)bias32;
    emu::DeviceAccess access("the emulated GEMM", {out, inp, weight});
    matmul_forward(out, inp, weight, NULL, DTYPE_BF16, N, C, OC);
    return 0;
}

const Backend *emu_backend_open(void) { return backend_new("emu", 0); }

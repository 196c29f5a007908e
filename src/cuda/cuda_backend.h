// The CUDA backend (built when CMake finds nvcc): device memory, cuBLASLt GEMMs (bf16 in, fp32
// accumulation) and our own kernels for the rest, behind the table in backend/backend.h. The same kernels run
// on the CPU as the emulated device (emu_backend_open, in every build but the fuzz build).
#pragma once
#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// Attention's lane map (k_attend), here so the op test can check it on a host without a GPU: lane l
// of a warp owns head dimensions CUDA_ATT_DIM(l, r) for r < CUDA_ATT_DREGS, those below head_dim D;
// D from 1 to CUDA_ATT_DMAX is supported.
#define CUDA_ATT_DMAX 128
#define CUDA_ATT_DREGS ((CUDA_ATT_DMAX + 31) / 32)
#define CUDA_ATT_DIM(lane, r) ((lane) + 32 * (r))

// GPU `ordinal` as a backend; dies with one line naming `what` when there is no such GPU.
// ordinal -1 (plain `cuda`): this process's GPU, local_rank % the GPUs visible (one GPU a rank under mpirun).
const Backend *cuda_backend_open(int ordinal, int local_rank, const char *what);
// How many GPUs the CUDA runtime sees: 0 when there is no driver or no GPU, -1 when CUDA fails otherwise
// (a driver older than the runtime, a GPU that cannot be used); the reason for 0 or -1 into why (n bytes).
int cuda_device_count(char *why, size_t n);
// The emulated device ("emu"): the CUDA backend's kernels on the CPU (cuda/emu.h), device memory in host memory.
const Backend *emu_backend_open(void);

#ifdef __cplusplus
}
#endif

// The CUDA backend (built when CMake finds nvcc): device memory, cuBLASLt GEMMs (bf16 in, fp32
// accumulation) and our own kernels for the rest, behind the table in backend/backend.h.
#pragma once
#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// GPU `ordinal` as a backend; dies with one line naming `what` when there is no such GPU.
const Backend *cuda_backend_open(int ordinal, const char *what);
// How many GPUs the CUDA runtime sees (0 when none or no driver), for tests that skip without one.
int cuda_device_count(void);

#ifdef __cplusplus
}
#endif

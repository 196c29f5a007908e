// The emulated CUDA device (--device emu): what the CUDA C++ of src/cuda/backend.cuh needs to compile as host C++
// and run on the CPU under CUDA's execution model, so that every kernel runs in CI without a GPU. emu.cpp compiles
// backend.cuh with this header; nvcc compiles the same text for the GPU (cuda.cu).
//
// - A launch runs the grid's blocks on the host's OpenMP threads, one block at a time on each. The threads of a
//   block are fibers, each on its own stack, switched at the block's synchronisation points: a thread never runs
//   past a barrier before every other thread of its block has reached it, and nothing else orders them.
// - __syncthreads() is a real barrier: all threads of the block must reach the same one. A thread that returns
//   while others wait, or threads waiting at different barriers, stop the run with an error naming the kernel,
//   the block, the barrier and the threads.
// - Warp intrinsics (__shfl_*_sync, __ballot_sync, __all_sync, __any_sync, __syncwarp) wait for every lane of
//   their mask at the same call with the same mask; a lane that is missing (returned, or waiting elsewhere), a
//   mask without the calling lane, or a shuffle from a lane outside the mask is the same kind of error. Stricter
//   than the guide on purpose: a lane of the mask that has returned counts as missing, and the lanes of one
//   __syncwarp must call it at the same place.
// - __shared__ variables are per block (thread-local to the host thread running the block); dynamic shared
//   memory is DYNAMIC_SHARED(type, name).
// - Memory: cudaMalloc is host memory (ASan sees overruns) in a registry; a copy or memset whose device side is
//   not device memory, a host side that is, or a kernel pointer argument that is not device memory, is an
//   error. In ASan builds device memory is poisoned except inside kernels, copies and the emulated GEMM, so
//   host code that reads or writes it is reported.
// - Under ThreadSanitizer (GRPO_TSAN) every thread is a TSan fiber and only barriers and __syncwarp order their
//   memory accesses (a shuffle does not, as on the device): a missing __syncthreads() is a reported data race.
//   Blocks one host thread runs one after another are ordered (they share its __shared__ memory), so a race
//   between blocks shows only between blocks of different host threads (the op tests run one).
// - Streams: kernels, memsets and copies from or to pageable host memory run when called, after what their stream
//   still holds. A copy from or to pinned host memory (cudaHostAlloc) is asynchronous, as on a GPU, and here as late
//   as CUDA allows: it waits in its stream until something orders it (an event wait or synchronisation that covers
//   it, a later kernel, memset or pageable copy on its stream, the emulated GEMM, cudaFreeHost). A missing event
//   wait that should hold a kernel or a consumer back until such a copy has run then shows as wrong data, where a
//   GPU would show it only sometimes. The other way is not seen: a copy that should wait for a kernel or memset
//   on another stream finds it done, since those run when called.
// - __nv_bfloat16 rounds to nearest even, and NaN to 0x7fff, as cuda_bf16.h does.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <tuple>
#include <type_traits>
#include <utility>

// Kernels are static: the executable exports its symbols to the CUDA module it loads, whose kernels' launch stubs
// have these names (public before CUDA 13) and would otherwise call the emulated ones.
#define __global__ static
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define warpSize 32

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {

// The running thread's indices (set by the scheduler before it switches to a thread). A call, not a thread_local
// read in the kernel's own code: GCC 12 with UBSan checks the address of an extern thread_local with flags a call
// (here, every barrier and shuffle) has clobbered.
struct Ids {
    uint3 thread, block;
    dim3 block_dim, grid_dim;
};
const Ids *current();

enum WarpOp { WARP_SHFL, WARP_SHFL_UP, WARP_SHFL_DOWN, WARP_SHFL_XOR, WARP_BALLOT, WARP_ALL, WARP_ANY, WARP_SYNC };
enum BarrierOp { BARRIER_SYNC, BARRIER_COUNT, BARRIER_AND, BARRIER_OR };

// A warp intrinsic of the calling thread: waits for the lanes of mask, returns this lane's result (the source
// lane's value for shuffles, the mask of true predicates for a ballot, 0/1 for all/any).
uint64_t warp(WarpOp op, const char *file, int line, unsigned mask, uint64_t value, int arg, int width);
// __syncthreads() and its predicate forms (the count, and, or of pred over the block).
int barrier(BarrierOp op, const char *file, int line, int pred);
// The launch's dynamic shared memory of this block.
void *dynamic_shared();

template <class T>
inline T shfl(WarpOp op, const char *file, int line, unsigned mask, T v, int arg, int width = 32) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a shuffle moves at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = warp(op, file, line, mask, b, arg, width);
    T r;
    memcpy(&r, &b, sizeof r);
    return r;
}

struct Syncwarp {  // __syncwarp(mask = all lanes)
    const char *file;
    int line;
    void operator()(unsigned mask = 0xffffffffu) const { warp(WARP_SYNC, file, line, mask, 0, 0, 32); }
};

// Runs one thread of a launch: the kernel with its copied arguments.
typedef void (*ThreadFn)(void *closure);
// A pointer argument of a kernel, and its position (for the error that names it).
struct PtrArg {
    int index;
    const void *p;
};
void launch(const char *kernel, const char *file, int line, dim3 grid, dim3 block, size_t smem, ThreadFn fn,
            void *closure, const PtrArg *ptrs, int n_ptrs);

template <class T>
inline void pointer_arg(const T &x, PtrArg *ptrs, int *n, int *index) {
    if constexpr (std::is_pointer<T>::value) ptrs[(*n)++] = PtrArg{*index, (const void *)x};
    (*index)++;
}

// kernel<<<grid, block, smem>>>(args...): the arguments are converted to the kernel's parameter types once, as
// CUDA copies them, and every thread calls the kernel with its own copy.
template <class... P, class... A>
inline void launch_kernel(const char *kernel, const char *file, int line, dim3 grid, dim3 block, size_t smem,
                          void (*k)(P...), A &&...a) {
    struct Closure {
        void (*k)(P...);
        std::tuple<P...> args;
    };
    Closure c{k, std::tuple<P...>(std::forward<A>(a)...)};
    PtrArg ptrs[sizeof...(P) + 1];
    int n = 0, index = 0;
    std::apply([&](const P &...x) { (pointer_arg(x, ptrs, &n, &index), ...); }, c.args);
    ThreadFn fn = [](void *p) {
        Closure *cl = (Closure *)p;
        std::apply(cl->k, cl->args);
    };
    launch(kernel, file, line, grid, block, smem, fn, &c, ptrs, n);
}

// Host code that reads or writes device memory on purpose (the emulated GEMM): checks that each pointer is
// device memory and, in ASan builds, lifts the poison of their allocations for the object's lifetime.
struct DeviceAccess {
    DeviceAccess(const char *what, std::initializer_list<const void *> ptrs);
    ~DeviceAccess();
    const void *p[8];
    int n;
};

}  // namespace emu

#define threadIdx (emu::current()->thread)
#define blockIdx (emu::current()->block)
#define blockDim (emu::current()->block_dim)
#define gridDim (emu::current()->grid_dim)

#define __syncthreads() (void)emu::barrier(emu::BARRIER_SYNC, __FILE__, __LINE__, 0)
#define __syncthreads_count(pred) emu::barrier(emu::BARRIER_COUNT, __FILE__, __LINE__, (pred) != 0)
#define __syncthreads_and(pred) emu::barrier(emu::BARRIER_AND, __FILE__, __LINE__, (pred) != 0)
#define __syncthreads_or(pred) emu::barrier(emu::BARRIER_OR, __FILE__, __LINE__, (pred) != 0)
#define __syncwarp emu::Syncwarp{__FILE__, __LINE__}
#define __shfl_sync(...) emu::shfl(emu::WARP_SHFL, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) emu::shfl(emu::WARP_SHFL_UP, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) emu::shfl(emu::WARP_SHFL_DOWN, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) emu::shfl(emu::WARP_SHFL_XOR, __FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, pred) \
    ((unsigned)emu::warp(emu::WARP_BALLOT, __FILE__, __LINE__, (mask), (pred) != 0, 0, 32))
#define __all_sync(mask, pred) ((int)emu::warp(emu::WARP_ALL, __FILE__, __LINE__, (mask), (pred) != 0, 0, 32))
#define __any_sync(mask, pred) ((int)emu::warp(emu::WARP_ANY, __FILE__, __LINE__, (mask), (pred) != 0, 0, 32))

// kernel<<<grid, block, smem, stream>>>(...) on the emulated device: it runs now, after the stream's pending copies.
#define EMU_LAUNCH(kernel, grid, block, smem, stream, ...) \
    (emu::stream_flush(stream),                           \
     emu::launch_kernel(#kernel, __FILE__, __LINE__, dim3(grid), dim3(block), (smem), kernel, __VA_ARGS__))
#define DYNAMIC_SHARED(type, name) type *name = (type *)emu::dynamic_shared()

// ---------------------------------------------------------------------------------------------
// bf16, bit casts and device math (only what the kernels use)

struct __nv_bfloat16 {
    unsigned short x;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h.x = 0x7fff;  // NaN: the canonical one, as the device's cvt.rn.bf16
    else h.x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // nearest, ties to even
    return h;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

template <class To, class From>
inline To emu_bits(From x) {
    static_assert(sizeof(To) == sizeof(From), "bit casts keep the size");
    To t;
    memcpy(&t, &x, sizeof t);
    return t;
}
inline unsigned __float_as_uint(float x) { return emu_bits<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return emu_bits<float>(x); }

// sin(pi x), cos(pi x): x reduced modulo 2 exactly first (the device's sincospi needs no large-argument reduction).
inline void sincospi(double x, double *s, double *c) {
    double r = remainder(x, 2.0) * M_PI;
    *s = sin(r);
    *c = cos(r);
}

// ---------------------------------------------------------------------------------------------
// atomics (relaxed, as on the device: they order nothing else); only what the kernels and tests use, each tested

inline float atomicAdd(float *p, float v) {
    uint32_t *u = (uint32_t *)p, old = __atomic_load_n(u, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(u, &old, __float_as_uint(__uint_as_float(old) + v), 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    return __uint_as_float(old);
}
template <class T>
inline T atomicAdd(T *p, T v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
template <class T>
inline T atomicMax(T *p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}

// ---------------------------------------------------------------------------------------------
// The runtime API the backend calls, on the emulated device (one device, ordinal 0; streams are synchronous).

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorLaunchFailure = 719,  // only from the fault injection (GRPO_EMU_FAIL_SYNC, emu_runtime.cpp)
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
typedef struct EmuStream *cudaStream_t;
typedef struct EmuEvent *cudaEvent_t;
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00

namespace emu {
// Runs the stream's pending copies (NULL: the legacy stream, which holds none).
void stream_flush(cudaStream_t s);
}  // namespace emu

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int ordinal);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
cudaError_t cudaMalloc(void **p, size_t bytes);
template <class T>
inline cudaError_t cudaMalloc(T **p, size_t bytes) {
    return cudaMalloc((void **)p, bytes);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);

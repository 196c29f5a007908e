// The emulated device's own contract (src/cuda/emu.h), with small kernels of its own: warp intrinsics give what
// the CUDA C++ Programming Guide defines (each lane's source lane computed here from the guide's formulas),
// barriers and their predicate forms, per-block shared memory, atomics across blocks, 3-D indices, dynamic
// shared memory, bf16 rounding as the CPU's dtype_from_f32; and the misuses a GPU would hang on or make
// undefined stop the run with one error naming them: a thread that returns before a barrier the others wait at,
// divergent barriers, a shuffle missing a lane of its mask or naming lanes outside it, host pointers given to a
// kernel or copied as device memory, invalid launch configurations, a missing barrier (a wrong result here; a
// reported data race under ThreadSanitizer), and host code touching device memory (reported under ASan); streams:
// a copy with pinned host memory runs only once something orders it.
//
// usage: test_emu            every good case here, then every bad case as `test_emu --case NAME` in a child
//        test_emu --case N   one bad case (it must die)
#define GRPO_EMU 1
#include "cuda/emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern "C" {
#include "base/dtype.h"
}

static int g_failures, g_checks;

static void report(int ok, const char *what, const char *detail) {
    g_checks++;
    g_failures += !ok;
    printf("%s  %s%s%s\n", ok ? "PASS" : "FAIL", what, *detail ? "  " : "", detail);
    fflush(stdout);
}

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) abort();
    cudaMemsetAsync(p, 0, bytes, NULL);
    return p;
}

template <class T>
static void download(T *host, const T *dev, size_t n) {
    cudaMemcpyAsync(host, dev, n * sizeof(T), cudaMemcpyDeviceToHost, NULL);
}

// ---------------------------------------------------------------------------------------------
// good cases

__global__ void k_copy(int *out, const int *in, int n) {
    if ((int)threadIdx.x < n) out[threadIdx.x] = in[threadIdx.x];
}

// Streams: a copy with pinned host memory waits in its stream until something orders it (an event wait, a
// synchronisation), as late as CUDA allows; a pageable one runs at once.
static void test_streams(void) {
    const int n = 8;
    int *h = NULL, *back = NULL;
    cudaHostAlloc((void **)&h, n * sizeof(int), cudaHostAllocDefault);
    cudaHostAlloc((void **)&back, n * sizeof(int), cudaHostAllocDefault);
    for (int i = 0; i < n; i++) h[i] = 10 + i, back[i] = -1;
    int *d = (int *)dev_alloc(n * sizeof(int)), *out = (int *)dev_alloc(n * sizeof(int)), got[8];
    cudaStream_t s;
    cudaEvent_t e;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaMemcpyAsync(d, h, n * sizeof(int), cudaMemcpyHostToDevice, s);
    EMU_LAUNCH(k_copy, 1, 32, 0, NULL, out, d, n);  // no wait: the copy has not run
    download(got, out, n);
    report(got[0] == 0 && got[n - 1] == 0, "streams: a pinned copy not waited for has not run", "");
    cudaEventRecord(e, s);
    cudaStreamWaitEvent(NULL, e, 0);
    EMU_LAUNCH(k_copy, 1, 32, 0, NULL, out, d, n);
    download(got, out, n);
    report(got[0] == 10 && got[n - 1] == 10 + n - 1, "streams: an event wait runs it first", "");
    cudaMemcpyAsync(back, d, n * sizeof(int), cudaMemcpyDeviceToHost, s);
    int before = back[0];
    cudaStreamSynchronize(s);
    report(before == -1 && back[0] == 10 && back[n - 1] == 10 + n - 1,
           "streams: a pinned download lands at the stream's synchronisation", "");
    cudaEventDestroy(e);
    cudaStreamDestroy(s);
    cudaFreeHost(h);
    cudaFreeHost(back);
    cudaFree(d);
    cudaFree(out);
}

enum { SH_XOR, SH_XOR8, SH_UP, SH_DOWN, SH_IDX, SH_IDX8, BALLOT, ALL, ANY, N_WARP_RESULTS };

__global__ void k_warp(int *out) {
    int t = threadIdx.x, lane = t & 31;
    int v = 1000 + t;
    int *o = out + t * N_WARP_RESULTS;
    o[SH_XOR] = __shfl_xor_sync(0xffffffffu, v, 1);
    o[SH_XOR8] = __shfl_xor_sync(0xffffffffu, v, 8, 8);
    o[SH_UP] = __shfl_up_sync(0xffffffffu, v, 3, 8);
    o[SH_DOWN] = __shfl_down_sync(0xffffffffu, v, 5, 16);
    o[SH_IDX] = __shfl_sync(0xffffffffu, v, 31 - lane);
    o[SH_IDX8] = __shfl_sync(0xffffffffu, v, 2, 8);
    o[BALLOT] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    o[ALL] = __all_sync(0xffffffffu, t < 40);
    o[ANY] = __any_sync(0xffffffffu, t == 7);
}

// The guide's definitions: the source lane of each shuffle (a lane outside its width segment keeps its value).
static int want_warp(int t, int r) {
    int lane = t & 31, w0 = t - lane;
    switch (r) {
    case SH_XOR: return 1000 + w0 + (lane ^ 1);
    case SH_XOR8: return 1000 + t - (lane % 16 >= 8 ? 8 : 0);  // an earlier group's lane is read; a later one not
    case SH_UP: return 1000 + t - (lane % 8 >= 3 ? 3 : 0);
    case SH_DOWN: return 1000 + t + (lane % 16 + 5 < 16 ? 5 : 0);
    case SH_IDX: return 1000 + w0 + 31 - lane;
    case SH_IDX8: return 1000 + w0 + lane / 8 * 8 + 2;
    case BALLOT: return (int)0x49249249u;  // lanes 0, 3, 6, ..., 30
    case ALL: return w0 == 0;             // warp 0: all t < 40; warp 1: not
    case ANY: return w0 == 0;             // lane 7 of warp 0
    }
    return -1;
}

static void test_warp(void) {
    int *d = (int *)dev_alloc(64 * N_WARP_RESULTS * sizeof(int)), h[64 * N_WARP_RESULTS];
    EMU_LAUNCH(k_warp, 1, 64, 0, NULL, d);
    download(h, d, 64 * N_WARP_RESULTS);
    static const char *names[] = {"__shfl_xor_sync", "__shfl_xor_sync width 8", "__shfl_up_sync width 8", "__shfl_down_sync width 16",
                                  "__shfl_sync", "__shfl_sync width 8", "__ballot_sync", "__all_sync", "__any_sync"};
    for (int r = 0; r < N_WARP_RESULTS; r++) {
        int bad = 0;
        char detail[96] = "";
        for (int t = 0; t < 64; t++)
            if (h[t * N_WARP_RESULTS + r] != want_warp(t, r) && !bad++)
                snprintf(detail, sizeof detail, "thread %d: %d, want %d", t, h[t * N_WARP_RESULTS + r], want_warp(t, r));
        char what[96];
        snprintf(what, sizeof what, "%s: every lane of 2 warps as the guide defines", names[r]);
        report(!bad, what, detail);
    }
    cudaFree(d);
}

// Half-warp masks: lanes 0-15 and 16-31 pass shared memory after their own __syncwarp and shuffle among
// themselves (under TSan: no race reported).
__global__ void k_half_warps(int *out) {
    __shared__ int sh[32];
    int lane = threadIdx.x & 31;
    unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    sh[lane] = 3 * lane;
    __syncwarp(mask);
    out[threadIdx.x] = __shfl_xor_sync(mask, (int)threadIdx.x, 8) + 1000 * sh[lane ^ 8];
}

__global__ void k_barriers(int *out, int *shared_seen) {
    __shared__ int sh[256];
    int t = threadIdx.x;
    sh[t] = (int)blockIdx.x * 1000 + t;
    int count = __syncthreads_count(t % 4 == 0);
    int all = __syncthreads_and(t < 1000);
    int any = __syncthreads_or(t == 17);
    if (t == 0) out[blockIdx.x * 3] = count, out[blockIdx.x * 3 + 1] = all, out[blockIdx.x * 3 + 2] = any;
    shared_seen[blockIdx.x * 256 + t] = sh[(t + 1) % 256];  // a neighbour's write of this block
}

__global__ void k_atomics(int *sum, int *mx, float *fsum) {
    atomicAdd(sum, 1);
    atomicMax(mx, (int)(blockIdx.x * blockDim.x + threadIdx.x));
    atomicAdd(fsum, 0.5f);
}

__global__ void k_indices(int *out) {
    int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    out[b * 24 + t] = (int)(threadIdx.x | threadIdx.y << 4 | threadIdx.z << 8 | blockIdx.x << 12 |
                            blockIdx.y << 16 | blockIdx.z << 20);
}

__global__ void k_dynamic(float *out) {
    DYNAMIC_SHARED(float, buf);
    buf[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}

static void test_block_features(void) {
    int *d = (int *)dev_alloc(32 * sizeof(int)), h[256 * 7];
    EMU_LAUNCH(k_half_warps, 1, 32, 0, NULL, d);
    download(h, d, 32);
    int bad = 0;
    for (int t = 0; t < 32; t++) bad += h[t] != (t ^ 8) + 3000 * (t ^ 8);
    report(!bad, "__syncwarp (shared memory passed after it) and __shfl_xor_sync on half-warp masks", "");
    cudaFree(d);

    int *res = (int *)dev_alloc(7 * 3 * sizeof(int)), *seen = (int *)dev_alloc(7 * 256 * sizeof(int));
    EMU_LAUNCH(k_barriers, 7, 256, 0, NULL, res, seen);
    download(h, res, 21);
    bad = 0;
    for (int b = 0; b < 7; b++) bad += h[b * 3] != 64 || h[b * 3 + 1] != 1 || h[b * 3 + 2] != 1;
    report(!bad, "__syncthreads_count / _and / _or over a block of 256", "");
    download(h, seen, 7 * 256);
    bad = 0;
    for (int b = 0; b < 7; b++)
        for (int t = 0; t < 256; t++) bad += h[b * 256 + t] != b * 1000 + (t + 1) % 256;
    report(!bad, "__shared__ memory: each of 7 blocks sees its own threads' writes after a barrier", "");
    cudaFree(res);
    cudaFree(seen);

    int *sum = (int *)dev_alloc(2 * sizeof(int));
    float *fsum = (float *)dev_alloc(sizeof(float));
    EMU_LAUNCH(k_atomics, 100, 128, 0, NULL, sum, sum + 1, fsum);
    float fh;
    download(h, sum, 2);
    download(&fh, fsum, 1);
    char detail[96];
    snprintf(detail, sizeof detail, "sum %d, max %d, float sum %g", h[0], h[1], fh);
    report(h[0] == 12800 && h[1] == 12799 && fh == 6400.0f, "atomicAdd / atomicMax over 100 blocks x 128", detail);
    cudaFree(sum);
    cudaFree(fsum);

    int *idx = (int *)dev_alloc(12 * 24 * sizeof(int));
    EMU_LAUNCH(k_indices, dim3(2, 2, 3), dim3(4, 3, 2), 0, NULL, idx);
    download(h, idx, 12 * 24);
    bad = 0;
    for (int bz = 0; bz < 3; bz++)
        for (int by = 0; by < 2; by++)
            for (int bx = 0; bx < 2; bx++)
                for (int tz = 0; tz < 2; tz++)
                    for (int ty = 0; ty < 3; ty++)
                        for (int tx = 0; tx < 4; tx++) {
                            int b = bx + 2 * (by + 2 * bz), t = tx + 4 * (ty + 3 * tz);
                            bad += h[b * 24 + t] != (tx | ty << 4 | tz << 8 | bx << 12 | by << 16 | bz << 20);
                        }
    report(!bad, "threadIdx / blockIdx / blockDim / gridDim in 3-D", "");
    cudaFree(idx);

    float *out = (float *)dev_alloc(100 * sizeof(float)), fo[100];
    EMU_LAUNCH(k_dynamic, 1, 100, 100 * sizeof(float), NULL, out);
    download(fo, out, 100);
    bad = 0;
    for (int t = 0; t < 100; t++) bad += fo[t] != (float)(99 - t);
    report(!bad, "dynamic shared memory (DYNAMIC_SHARED)", "");
    cudaFree(out);
}

// bf16: round to nearest even (ties both ways), overflow to inf, NaN to 0x7fff, as the CPU's conversion (which
// test_dtype holds to PyTorch) except NaN, whose payload the device canonicalises.
static void test_bf16(void) {
    const uint32_t bits[] = {0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f807fffu, 0xbf808000u,
                             0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000000u, 0x7f800000u, 0x7f7f8000u};
    int bad = 0;
    char detail[96] = "";
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++) {
        float f;
        memcpy(&f, &bits[i], 4);
        uint16_t want;
        dtype_from_f32(DTYPE_BF16, &f, &want, 1);
        if (__float2bfloat16_rn(f).x != want && !bad++)
            snprintf(detail, sizeof detail, "0x%08x: 0x%04x, want 0x%04x", bits[i], __float2bfloat16_rn(f).x, want);
    }
    float nan;
    uint32_t nb = 0x7fc01234u;
    memcpy(&nan, &nb, 4);
    bad += __float2bfloat16_rn(nan).x != 0x7fff || __float2bfloat16_rn(-nan).x != 0x7fff;
    report(!bad, "__float2bfloat16_rn == the CPU's bf16 rounding; NaN -> 0x7fff", detail);
}

// ---------------------------------------------------------------------------------------------
// bad cases (each dies)

__global__ void k_early_return(int *out) {
    if (threadIdx.x == 5) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void k_divergent(int *out) {
    if (threadIdx.x % 2) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1;
}

__global__ void k_shfl_missing(int *out) {
    if (threadIdx.x == 3) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void k_shfl_not_self(int *out) { out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, (int)threadIdx.x, 1); }

__global__ void k_shfl_outside(int *out) {
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, (int)threadIdx.x, 20);
}

// Thread 0 sums what every thread wrote, without the barrier between: the fibers run it before the others
// have written (a wrong sum), and TSan reports the race.
__global__ void k_missing_barrier(int *out) {
    __shared__ int sh[64];
    sh[threadIdx.x] = 1;
    if (threadIdx.x == 0) {
        int s = 0;
        for (int i = 0; i < 64; i++) s += sh[i];
        out[0] = s;
    }
}

static int run_case(const char *name) {
    int *d = (int *)dev_alloc(64 * sizeof(int));
    if (!strcmp(name, "early_return")) EMU_LAUNCH(k_early_return, 2, 64, 0, NULL, d);
    if (!strcmp(name, "divergent_barriers")) EMU_LAUNCH(k_divergent, 1, 64, 0, NULL, d);
    if (!strcmp(name, "shfl_missing_lane")) EMU_LAUNCH(k_shfl_missing, 1, 32, 0, NULL, d);
    if (!strcmp(name, "shfl_mask_without_self")) EMU_LAUNCH(k_shfl_not_self, 1, 32, 0, NULL, d);
    if (!strcmp(name, "shfl_source_outside_mask")) EMU_LAUNCH(k_shfl_outside, 1, 32, 0, NULL, d);
    if (!strcmp(name, "host_pointer")) {
        int host[64];
        EMU_LAUNCH(k_early_return, 1, 64, 0, NULL, host);
    }
    if (!strcmp(name, "bad_config")) EMU_LAUNCH(k_divergent, 1, 2048, 0, NULL, d);
    if (!strcmp(name, "too_much_shared")) EMU_LAUNCH(k_dynamic, 1, 32, 64 << 10, NULL, (float *)d);
    if (!strcmp(name, "copy_to_host_as_device")) {
        int host[4] = {0};
        cudaMemcpyAsync(host, d, sizeof host, cudaMemcpyHostToDevice, NULL);
    }
    if (!strcmp(name, "host_touch")) {  // ASan: use-after-poison
        volatile int *p = d;
        printf("read %d\n", p[1]);
    }
    if (!strcmp(name, "missing_barrier")) {
        EMU_LAUNCH(k_missing_barrier, 1, 64, 0, NULL, d);
        int s;
        download(&s, d, 1);
        if (s != 64) {
            fprintf(stderr, "missing barrier: thread 0 summed %d of 64 writes\n", s);
            return 1;
        }
    }
    return 0;  // not stopped: the case failed
}

#if defined(__SANITIZE_ADDRESS__)
#define HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define HAVE_TSAN 1
#endif

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--case")) return run_case(argv[2]);
    test_warp();
    test_block_features();
    test_bf16();
    test_streams();
    struct {
        const char *name, *want;
        int enabled;
    } cases[] = {
        {"early_return", "thread 5 returned", 1},
        {"divergent_barriers", "waits at __syncthreads()", 1},
        {"shfl_missing_lane", "thread 3 returned", 1},
        {"shfl_mask_without_self", "which does not name its lane", 1},
        {"shfl_source_outside_mask", "reads lane 20, which is not in the mask 0x0000ffff", 1},
        {"host_pointer", "argument 0", 1},
        {"bad_config", "invalid launch configuration", 1},
        {"too_much_shared", "dynamic shared memory", 1},
        {"copy_to_host_as_device", "the destination is not device memory", 1},
#ifdef HAVE_ASAN
        {"host_touch", "use-after-poison", 1},
#endif
#ifdef HAVE_TSAN
        {"missing_barrier", "ThreadSanitizer: data race", 1},
#else
        {"missing_barrier", "thread 0 summed 1 of 64 writes", 1},
#endif
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[256], out[8192] = "", what[160];
        snprintf(cmd, sizeof cmd, "'%s' --case %s 2>&1", argv[0], cases[i].name);
        FILE *p = popen(cmd, "r");
        size_t len = p ? fread(out, 1, sizeof out - 1, p) : 0;
        out[len] = '\0';
        int st = p ? pclose(p) : -1;
        int failed = st != -1 && WIFEXITED(st) && WEXITSTATUS(st) != 0;
        int said = strstr(out, cases[i].want) != NULL;
        const char *line = strstr(out, "error:");
        char first[200] = "";
        snprintf(first, sizeof first, "%.*s", (int)strcspn(line ? line : out, "\n"), line ? line : out);
        snprintf(what, sizeof what, "bad case %s stops the run (\"%s\")", cases[i].name, cases[i].want);
        report(failed && said, what, first);
    }
    printf("test_emu: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures != 0;
}

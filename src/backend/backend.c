#define _DEFAULT_SOURCE  // readlink
#include "backend/backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/util.h"
#include "cuda/cuda_backend.h"
#include "parallel/comm.h"

#ifdef GRPO_CUDA
#include <dlfcn.h>

// The CUDA backend module: next to the executable (an installed grpo) when it is there, else where the
// build made it. A module that is there but does not load (libcudart or libcublasLt missing, an
// unresolved symbol) is the error, in the loader's words into err.
static void *cuda_module(char *err, size_t n) {
    char path[4096];
    const char *module = GRPO_CUDA_MODULE;
    ssize_t len = readlink("/proc/self/exe", path, sizeof path - 32);
    if (len > 0) {
        path[len] = '\0';
        char *slash = strrchr(path, '/');
        if (slash) {
            strcpy(slash + 1, "libgrpo_cuda.so");
            if (access(path, R_OK) == 0) module = path;
        }
    }
    void *h = dlopen(module, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(err, n, "cannot load the CUDA backend: %s", e ? e : "dlopen failed");
    }
    return h;
}

typedef const Backend *(*CudaOpenFn)(int ordinal, int local_rank, const char *what);
typedef int (*CudaCountFn)(char *why, size_t n);

static void *cuda_symbol(const char *name, const char *what) {
    char err[1024] = "";
    void *h = cuda_module(err, sizeof err);
    if (!h) die("%s cuda: %s", what, err);
    void *f = dlsym(h, name);
    if (!f) die("%s cuda: the CUDA backend module has no %s", what, name);
    return f;
}
#endif

int backend_cuda_devices(char *why, size_t n) {
    if (n) why[0] = '\0';
#ifdef GRPO_CUDA
    void *h = cuda_module(why, n);
    if (!h) return -1;
    CudaCountFn count = (CudaCountFn)dlsym(h, "cuda_device_count");
    if (!count) {
        snprintf(why, n, "the CUDA backend module has no cuda_device_count");
        return -1;
    }
    return count(why, n);
#else
    snprintf(why, n, "this grpo was built without CUDA");
    return 0;
#endif
}

#ifdef GRPO_CUDA
// This process's rank among its machine's, as its launcher says (0 without one; with a launcher that says nothing
// we know, a warning: every rank would take GPU 0).
static int launcher_local_rank(void) {
    static const char *const names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
                                        "PALS_LOCAL_RANKID", "SLURM_LOCALID"};
    if (!comm_launched()) return 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v >= '0' && *v <= '9') return atoi(v);
    }
    fprintf(stderr, "grpo: warning: the launcher does not say this rank's place on its machine "
            "(OMPI_COMM_WORLD_LOCAL_RANK and the like): --device cuda is GPU 0; name one with cuda:N\n");
    return 0;
}
#endif

const Backend *backend_open(const char *spec, const char *what) {
    if (!strcmp(spec, "cpu")) return backend_cpu();
    if (!strcmp(spec, "cpu-staged")) return backend_cpu_staged();
    if (!strcmp(spec, "emu")) {
#ifdef GRPO_HAVE_EMU
        return emu_backend_open();
#else
        die("%s emu: this grpo was built without the emulated device (GRPO_EMU)", what);
#endif
    }
    if (strncmp(spec, "cuda", 4) || (spec[4] && spec[4] != ':'))
        die("%s: unknown device '%s' (cpu, cuda, cuda:N or emu)", what, spec);
    int ordinal = -1;  // plain "cuda": this rank's GPU
    if (spec[4] == ':') {
        char *end;
        long n = strtol(spec + 5, &end, 10);
        if (end == spec + 5 || *end || n < 0 || n > 1024)
            die("%s: '%s' is not cuda:N with a GPU number N", what, spec);
        ordinal = (int)n;
    }
#ifdef GRPO_CUDA
    CudaOpenFn open = (CudaOpenFn)cuda_symbol("cuda_backend_open", what);
    return open(ordinal, launcher_local_rank(), what);
#else
    (void)ordinal;
    die("%s %s: this grpo was built without CUDA (nvcc was not found when it was built); use --device cpu", what,
        spec);
#endif
}

void backend_close(const Backend *be) {
    if (be) be->close(be);
}

void backend_arena_init(const Backend *be, Arena *a, size_t bytes) {
    if (!be->on_device) {
        arena_init(a, bytes);
        return;
    }
    a->size = (bytes + 63) & ~(size_t)63;
    a->base = be->alloc(be, a->size);
    a->used = a->peak = 0;
    a->on_device = 1;
}

void backend_arena_free(const Backend *be, Arena *a) {
    if (!be->on_device) {
        arena_free(a);
        return;
    }
    be->free(be, a->base);
    a->base = NULL;
    a->size = a->used = 0;
}

static void list_if_missing(char *buf, size_t n, int present, const char *name) {
    size_t len = strlen(buf);
    if (!present) snprintf(buf + len, n - len, "%s%s", len ? ", " : "", name);
}

void backend_missing_training_ops(const Backend *be, char *buf, size_t n) {
    buf[0] = '\0';
    list_if_missing(buf, n, be->zero != NULL, "zero");
    list_if_missing(buf, n, be->embedding_backward != NULL, "embedding_backward");
    list_if_missing(buf, n, be->rmsnorm_backward != NULL, "rmsnorm_backward");
    list_if_missing(buf, n, be->matmul_backward != NULL, "matmul_backward");
    list_if_missing(buf, n, be->rope_backward != NULL, "rope_backward");
    list_if_missing(buf, n, be->attention_backward != NULL, "attention_backward");
    list_if_missing(buf, n, be->glu_backward != NULL, "glu_backward");
    list_if_missing(buf, n, be->layernorm_forward != NULL, "layernorm_forward");
    list_if_missing(buf, n, be->layernorm_backward != NULL, "layernorm_backward");
    list_if_missing(buf, n, be->gelu_forward != NULL, "gelu_forward");
    list_if_missing(buf, n, be->gelu_backward != NULL, "gelu_backward");
    list_if_missing(buf, n, be->logprob_backward != NULL, "logprob_backward");
    list_if_missing(buf, n, be->gemm != NULL, "gemm");
    list_if_missing(buf, n, be->gather_rows != NULL, "gather_rows");
    list_if_missing(buf, n, be->scatter_rows != NULL, "scatter_rows");
    list_if_missing(buf, n, be->adamw != NULL, "adamw");
    list_if_missing(buf, n, be->adamw_host_moments != NULL && be->host_alloc != NULL, "adamw_host_moments");
    list_if_missing(buf, n, be->grad_norm != NULL, "grad_norm");
    list_if_missing(buf, n, be->all_finite != NULL, "all_finite");
    list_if_missing(buf, n, be->scale != NULL, "scale");
    list_if_missing(buf, n, be->round_values != NULL, "round_values");
}

void backend_require_bf16(const Backend *be, const char *what, const char *option, DType d) {
    if (be->bf16_weights && d != DTYPE_BF16)
        die("%s %s computes in bf16 (the master weights and Adam moments stay fp32): set %s to bf16", what, be->name,
            option);
}

void backend_require_training(const Backend *be, const char *what) {
    char missing[1024];
    backend_missing_training_ops(be, missing, sizeof missing);
    if (*missing) die("%s %s: training needs ops this backend does not have yet: %s", what, be->name, missing);
}

void *backend_kv_reserve(const Backend *be, size_t bytes, int *on_demand) {
    *on_demand = !be->on_device;
    if (be->on_device) return be->alloc(be, bytes);
    // MAP_NORESERVE: the kernel counts no commit charge for pages never written
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED)
        die("cannot reserve %zu MiB of address space for the KV cache: %s", bytes >> 20, strerror(errno));
    // small pages: a transparent huge page would commit 2 MiB for a sequence's first position, and khugepaged
    // could gather given-back pages into one again (EINVAL: a kernel without them)
    if (madvise(p, bytes ? bytes : 1, MADV_NOHUGEPAGE) != 0 && errno != EINVAL)
        die("cannot set the KV cache's pages: %s", strerror(errno));
    return p;
}

void backend_kv_release(const Backend *be, void *p, size_t bytes) {
    if (be->on_device) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = ((uintptr_t)p + page - 1) / page * page;
    uintptr_t hi = ((uintptr_t)p + bytes) / page * page;
    if (hi > lo && madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0)
        die("cannot give back KV cache pages: %s", strerror(errno));
}

void backend_kv_free(const Backend *be, void *p, size_t bytes) {
    if (!p) return;
    if (be->on_device) be->free(be, p);
    else if (munmap(p, bytes ? bytes : 1) != 0) die("cannot unmap the KV cache: %s", strerror(errno));
}

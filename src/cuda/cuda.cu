// The CUDA backend for the GPU: backend.cuh's kernels and ops compiled by nvcc, with cuBLASLt for the forward GEMM
// (bf16 operands, fp32 accumulation and output, the fp32 bias fused as an epilogue when cuBLASLt offers one) and
// cuBLAS's GemmEx for the others (the backwards', LoRA's fp32 products).
#include <cublasLt.h>
#include <cublas_v2.h>
#ifdef GRPO_NCCL
#include <dlfcn.h>
#include <nccl.h>
#include <time.h>
#include <unistd.h>
#endif

#include "cuda/backend.cuh"

#ifdef GRPO_NCCL
extern "C" {
#include "parallel/comm.h"  // comm_shard
}
#endif

#define LT(call) blas_check((call), "cuBLASLt", #call, __FILE__, __LINE__)
#define BLAS(call) blas_check((call), "cuBLAS", #call, __FILE__, __LINE__)

static void blas_check(cublasStatus_t s, const char *lib, const char *what, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) die("%s: %s failed at %s:%d: status %d", lib, what, file, line, (int)s);
}

#define MAX_PLANS 256
#define LT_WORKSPACE (32u << 20)
#define BLAS_WORKSPACE (32u << 20)  // cuBLAS's, ours (set on its handle), so that it is counted

// A cuBLASLt matmul for one shape, operand alignment and epilogue (align_bias: the fp32 bias's alignment,
// 0 without the bias epilogue), made once and reused. ok = 0 remembers that cuBLASLt offered no
// algorithm (status: the heuristic's), so it is not asked again for every call of that shape.
typedef struct {
    int64_t m, n, k;
    int align_a, align_b, align_c, align_bias, ok;
    cublasStatus_t status;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} Plan;

// Cuda.gemm: cuBLASLt's handle, its workspace and the plans made so far; cuBLAS's handle (on the backend's stream).
typedef struct {
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *lt_ws, *blas_ws;
    Plan plans[MAX_PLANS];
    int n_plans;
} Lt;

static int align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 2 && a % (uintptr_t)al) al /= 2;
    return al;
}

static void plan_destroy(Plan *p) {
    LT(cublasLtMatrixLayoutDestroy(p->la));
    LT(cublasLtMatrixLayoutDestroy(p->lb));
    LT(cublasLtMatrixLayoutDestroy(p->lc));
    LT(cublasLtMatmulDescDestroy(p->desc));
}

// out (n, m) row-major = inp (n, k) @ W (m, k)^T, i.e. column-major out^T = W^T-op applied to inp^T;
// bias (m) fp32 or NULL. The plan may be one cuBLASLt refused (ok = 0).
static Plan *plan_get(Lt *c, int64_t m, int64_t n, int64_t k, int aa, int ab, int ac, const float *bias) {
    int abias = bias ? align_of(bias) : 0;
    for (int i = 0; i < c->n_plans; i++) {
        Plan *p = &c->plans[i];
        if (p->m == m && p->n == n && p->k == k && p->align_a == aa && p->align_b == ab && p->align_c == ac &&
            p->align_bias == abias)
            return p;
    }
    if (c->n_plans == MAX_PLANS) {  // shapes past the cache's size: start it over
        for (int i = 0; i < c->n_plans; i++) plan_destroy(&c->plans[i]);
        c->n_plans = 0;
    }
    Plan *p = &c->plans[c->n_plans++];
    memset(p, 0, sizeof *p);
    p->m = m;
    p->n = n;
    p->k = k;
    p->align_a = aa;
    p->align_b = ab;
    p->align_c = ac;
    p->align_bias = abias;
    LT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t));
    LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
    if (bias) {
        // cublasLt.h (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE): the bias has D's type, fp32 here. The heuristic
        // reads the bias pointer's alignment, so the real one is set before it.
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_32F;
        LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
        LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
        LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    LT(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, (uint64_t)k, (uint64_t)m, k));
    LT(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, (uint64_t)k, (uint64_t)n, k));
    LT(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, (uint64_t)m, (uint64_t)n, m));
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = LT_WORKSPACE;
    uint32_t a32 = (uint32_t)aa, b32 = (uint32_t)ab, c32 = (uint32_t)ac;
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, sizeof a32));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b32, sizeof b32));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c32, sizeof c32));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c32, sizeof c32));
    // No split-K reductions: a row's sums then do not depend on how many rows share the product (the seeding
    // contract of generate: one line alone samples as it does in a batch).
    uint32_t no_split = CUBLASLT_REDUCTION_SCHEME_NONE;
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_split,
                                            sizeof no_split));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    // A failure here is a refusal, remembered (ok = 0): the caller falls back (bias) or says so.
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res,
                                                       &found);
    if (st == CUBLAS_STATUS_SUCCESS && found == 0) {  // no algorithm without split-K: any, rather than none
        uint32_t any = CUBLASLT_REDUCTION_SCHEME_MASK;
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &any, sizeof any));
        st = cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found);
    }
    LT(cublasLtMatmulPreferenceDestroy(pref));
    p->status = st;
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
        p->algo = res.algo;
        p->ok = 1;
    }
    return p;
}


static void gemm_new(Cuda *c) {
    Lt *g = (Lt *)xcalloc(1, sizeof *g);
    LT(cublasLtCreate(&g->lt));
    CK(cudaMalloc(&g->lt_ws, LT_WORKSPACE));
    CK(cudaMalloc(&g->blas_ws, BLAS_WORKSPACE));
    BLAS(cublasCreate(&g->blas));
    BLAS(cublasSetStream(g->blas, c->stream));  // resets the workspace: set it after
    BLAS(cublasSetWorkspace(g->blas, g->blas_ws, BLAS_WORKSPACE));
    c->gemm = g;
}

static size_t gemm_workspace_bytes(void) { return LT_WORKSPACE + BLAS_WORKSPACE; }

static void gemm_free(Cuda *c) {
    Lt *g = (Lt *)c->gemm;
    for (int i = 0; i < g->n_plans; i++) plan_destroy(&g->plans[i]);
    CK(cudaFree(g->lt_ws));
    LT(cublasLtDestroy(g->lt));
    BLAS(cublasDestroy(g->blas));
    CK(cudaFree(g->blas_ws));
    free(g);
}

static int gemm_bf16(Cuda *c, float *out, const void *inp, const void *weight, const float *bias32, int64_t N,
                     int64_t C, int64_t OC) {
    Lt *g = (Lt *)c->gemm;
    int aa = align_of(weight), ab = align_of(inp), ac = align_of(out);
    Plan *p = bias32 ? plan_get(g, OC, N, C, aa, ab, ac, bias32) : NULL;
    int fused = p != NULL && p->ok;
    if (!fused) p = plan_get(g, OC, N, C, aa, ab, ac, NULL);
    if (!p->ok)
        die("cuBLASLt offers no algorithm for a bf16 matmul of %lld x %lld x %lld (heuristic status %d)",
            (long long)N, (long long)OC, (long long)C, (int)p->status);
    if (fused) LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias32, sizeof bias32));
    float alpha = 1.0f, beta = 0.0f;
    LT(cublasLtMatmul(g->lt, p->desc, &alpha, weight, p->la, inp, p->lb, &beta, out, p->lc, out, p->lc, &p->algo,
                      g->lt_ws, LT_WORKSPACE, c->stream));
    return fused;
}

// Row-major C (M,N) is column-major C^T (N,M) = op(B)^T op(A)^T: cuBLAS gets B first. Run to run deterministic on one
// stream; cuBLAS may split K by the shape, so a row's bits may depend on the rows beside it (LoRA's products in
// rollout are not batch-invariant on a GPU, unlike the cuBLASLt forward). B stored (K,N) (tb = 0) reads
// column-major as B^T, (N,K) already; stored (N,K) (tb = 1) reads as (K,N) and is transposed; A likewise.
static void gemm_ex(Cuda *c, int bf16, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                    int64_t lda, const void *B, int64_t ldb, int accumulate, float *C, int64_t ldc) {
    Lt *g = (Lt *)c->gemm;
    if (M == 0 || N == 0) return;
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX || ldc > INT32_MAX)
        die("%s: a GEMM of %lld x %lld x %lld is past cuBLAS's int sizes", c->name, (long long)M, (long long)N,
            (long long)K);
    cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    float beta = accumulate ? 1.0f : 0.0f;
    BLAS(cublasGemmEx(g->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M,
                      (int)K, &alpha, B, t, (int)ldb, A, t, (int)lda, &beta, C, CUDA_R_32F, (int)ldc,
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

int cuda_device_count(char *why, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess) {
        if (count == 0) snprintf(why, n, "0 devices");
        return count;
    }
    int driver = 0, runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = -1;  // driver 0: none installed
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
    if (driver == 0) {
        snprintf(why, n, "no CUDA driver is installed");
        return 0;
    }
    if (e == cudaErrorNoDevice) {
        snprintf(why, n, "%s", cudaGetErrorString(e));
        return 0;
    }
    snprintf(why, n, "cudaGetDeviceCount: %s (the driver supports CUDA %d.%d, the runtime is %d.%d)",
             cudaGetErrorString(e), driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    return -1;
}

// ---------------------------------------------------------------------------------------------
#ifdef GRPO_NCCL
// collectives: NCCL, loaded when a run first joins a communicator (only data parallelism on GPUs needs it, and it is
// large): libnccl.so.2 from the loader's path, or the file GRPO_NCCL_LIB names (PyTorch's, say).

static_assert(sizeof(ncclUniqueId) == BACKEND_DIST_ID_BYTES, "backend.h's id size is NCCL's");
static_assert(sizeof(cudaUUID_t) == BACKEND_DIST_KEY_BYTES, "backend.h's key size is a GPU's UUID");

typedef struct {
    ncclResult_t (*GetUniqueId)(ncclUniqueId *id);
    ncclResult_t (*CommInitRankConfig)(ncclComm_t *comm, int size, ncclUniqueId id, int rank, ncclConfig_t *cfg);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t comm, ncclResult_t *err);
    ncclResult_t (*CommDestroy)(ncclComm_t comm);
    ncclResult_t (*AllReduce)(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op,
                              ncclComm_t comm, cudaStream_t s);
    ncclResult_t (*Reduce)(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, int root,
                           ncclComm_t comm, cudaStream_t s);
    ncclResult_t (*Broadcast)(const void *send, void *recv, size_t n, ncclDataType_t t, int root, ncclComm_t comm,
                              cudaStream_t s);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    const char *(*GetErrorString)(ncclResult_t r);
    const char *(*GetLastError)(ncclComm_t comm);
    ncclComm_t comm;  // NULL until dist_init
    int rank, size;
    double timeout_s;
} Nccl;

// NCCL's entry points, or NULL with the loader's reason in why. Never unloaded (RTLD_NODELETE): a thread of its own
// may outlive the communicator.
static Nccl *nccl_load(char *why, size_t n) {
    const char *env = getenv("GRPO_NCCL_LIB"), *path = env && *env ? env : "libnccl.so.2";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, n, "%s", e ? e : path);
        return NULL;
    }
    Nccl *x = (Nccl *)xcalloc(1, sizeof *x);
    struct {
        void **fn;
        const char *name;
    } syms[] = {{(void **)&x->GetUniqueId, "ncclGetUniqueId"},
                {(void **)&x->CommInitRankConfig, "ncclCommInitRankConfig"},
                {(void **)&x->CommGetAsyncError, "ncclCommGetAsyncError"},
                {(void **)&x->CommDestroy, "ncclCommDestroy"},
                {(void **)&x->AllReduce, "ncclAllReduce"},
                {(void **)&x->Reduce, "ncclReduce"},
                {(void **)&x->Broadcast, "ncclBroadcast"},
                {(void **)&x->GroupStart, "ncclGroupStart"},
                {(void **)&x->GroupEnd, "ncclGroupEnd"},
                {(void **)&x->GetErrorString, "ncclGetErrorString"},
                {(void **)&x->GetLastError, "ncclGetLastError"}};
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].fn = dlsym(h, syms[i].name);
        if (!*syms[i].fn) {
            snprintf(why, n, "%s has no %s (NCCL 2.14 or newer is needed)", path, syms[i].name);
            dlclose(h);
            free(x);
            return NULL;
        }
    }
    return x;
}

static void nccl_check(const Nccl *x, ncclResult_t r, const char *what, const char *file, int line) {
    if (r != ncclSuccess && r != ncclInProgress)  // a non-blocking communicator's calls may still be in progress
        die("rank %d/%d: NCCL: %s failed at %s:%d: %s (%s)", x->rank, x->size, what, file, line, x->GetErrorString(r),
            x->GetLastError(x->comm));
}
#define NC(x, call) nccl_check((x), (call), #call, __FILE__, __LINE__)

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Waits for what the communicator has pending: its set-up (n 0), or the collectives just enqueued on the backend's
// stream, whose compute before them has finished already. NCCL's asynchronous error ends the job in one line, and
// so does timeout_s without completion (comm.h's message; the process's exit tears down the kernels left waiting
// for a rank that will not come: ncclCommAbort could block on them itself).
static void nccl_wait(Cuda *c, Nccl *x, const char *what, const char *op, size_t n) {
    double t0 = seconds_now();
    useconds_t nap = 0;
    char of[64] = "";
    if (n) snprintf(of, sizeof of, " of %zu floats", n);
    for (;;) {
        ncclResult_t async = ncclSuccess;
        NC(x, x->CommGetAsyncError(x->comm, &async));
        if (async != ncclSuccess && async != ncclInProgress)
            die("rank %d/%d: %s (%s%s): NCCL: %s (%s)", x->rank, x->size, what, op, of, x->GetErrorString(async),
                x->GetLastError(x->comm));
        if (async == ncclSuccess) {
            if (!n) return;
            cudaError_t q = cudaStreamQuery(c->stream);
            if (q == cudaSuccess) return;
            if (q != cudaErrorNotReady) cuda_check(q, "cudaStreamQuery (waiting for an NCCL collective)", __FILE__,
                                                   __LINE__);
        }
        if (x->timeout_s > 0 && seconds_now() - t0 > x->timeout_s)
            die("rank %d/%d: %s (%s%s) did not complete within %g s: another rank is hung or dead", x->rank, x->size,
                what, op, of, x->timeout_s);
        usleep(nap);
        nap = nap < 1000 ? nap + 50 : 1000;  // polls at once while it moves, then every millisecond
    }
}

static void dist_free(Cuda *c) {
    Nccl *x = (Nccl *)c->dist;
    if (!x) return;
    if (x->comm) NC(x, x->CommDestroy(x->comm));
    free(x);
    c->dist = NULL;
}

static void cu_dist_key(const Backend *be, void *key) {
    Cuda *c = use(be);
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, c->ordinal));
    memcpy(key, &p.uuid, sizeof p.uuid);
}

static int cu_dist_id(const Backend *be, void *id, char *why, size_t n) {
    Cuda *c = use(be);
    if (!c->dist && !(c->dist = nccl_load(why, n))) return 0;
    Nccl *x = (Nccl *)c->dist;
    ncclUniqueId u;
    ncclResult_t r = x->GetUniqueId(&u);  // its bootstrap can fail (no usable network interface): said, not fatal
    if (r != ncclSuccess) {
        snprintf(why, n, "ncclGetUniqueId: %s", x->GetErrorString(r));
        return 0;
    }
    memcpy(id, &u, sizeof u);
    return 1;
}

static void cu_dist_init(const Backend *be, const void *id, int rank, int size, double timeout_s) {
    Cuda *c = use(be);
    char why[512];
    if (!c->dist && !(c->dist = nccl_load(why, sizeof why)))
        die("rank %d/%d: %s: NCCL does not load here (rank 0's did): %s; set GRPO_NCCL_LIB to a libnccl.so.2", rank,
            size, be->name, why);
    Nccl *x = (Nccl *)c->dist;
    if (x->comm) die("internal: %s joined a second NCCL communicator", be->name);
    x->rank = rank;
    x->size = size;
    x->timeout_s = timeout_s;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;  // calls return at once: nccl_wait polls them under the timeout
    NC(x, x->CommInitRankConfig(&x->comm, size, u, rank, &cfg));
    nccl_wait(c, x, "joining the ranks' NCCL communicator", "ncclCommInitRankConfig", 0);
}

// The communicator, its stream's compute done (the timeout is the collective's alone).
static Nccl *dist_begin(Cuda *c) {
    Nccl *x = (Nccl *)c->dist;
    if (!x || !x->comm) die("internal: an NCCL collective before dist_init");
    CK(cudaStreamSynchronize(c->stream));
    return x;
}

static void cu_dist_allreduce_mean(const Backend *be, float *buf, size_t n, const char *what) {
    Cuda *c = use(be);
    Nccl *x = dist_begin(c);
    NC(x, x->AllReduce(buf, buf, n, ncclFloat32, ncclAvg, x->comm, c->stream));
    nccl_wait(c, x, what, "all-reduce", n);
}

// Each rank's shard (comm_shard's: of one or two sizes, which NCCL's ReduceScatter and AllGather do not take) in
// one group, in place: reduce (the mean) to its rank, or broadcast from it.
static void shards_grouped(const Backend *be, float *buf, size_t n, int reduce, const char *what) {
    Cuda *c = use(be);
    Nccl *x = dist_begin(c);
    NC(x, x->GroupStart());
    for (int r = 0; r < x->size; r++) {
        size_t lo, hi;
        comm_shard(n, r, x->size, &lo, &hi);
        if (hi > lo && reduce)
            NC(x, x->Reduce(buf + lo, buf + lo, hi - lo, ncclFloat32, ncclAvg, r, x->comm, c->stream));
        else if (hi > lo)
            NC(x, x->Broadcast(buf + lo, buf + lo, hi - lo, ncclFloat32, r, x->comm, c->stream));
    }
    NC(x, x->GroupEnd());
    nccl_wait(c, x, what, reduce ? "reduce-scatter" : "all-gather", n);
}

static void cu_dist_reduce_scatter_mean(const Backend *be, float *buf, size_t n, const char *what) {
    shards_grouped(be, buf, n, 1, what);
}

static void cu_dist_allgather(const Backend *be, float *buf, size_t n, const char *what) {
    shards_grouped(be, buf, n, 0, what);
}

// The table's collectives (built without nccl.h: none, and a device's ranks use MPI).
static void dist_set(Backend *be) {
    be->dist_key = cu_dist_key;
    be->dist_id = cu_dist_id;
    be->dist_init = cu_dist_init;
    be->dist_allreduce_mean = cu_dist_allreduce_mean;
    be->dist_reduce_scatter_mean = cu_dist_reduce_scatter_mean;
    be->dist_allgather = cu_dist_allgather;
}
#else
static void dist_free(Cuda *c) { (void)c; }
static void dist_set(Backend *be) { (void)be; }
#endif

const Backend *cuda_backend_open(int ordinal, int local_rank, const char *what) {
    char why[256], name[24];
    int n = cuda_device_count(why, sizeof why);
    const char *spec = ordinal < 0 ? "cuda" : name;
    snprintf(name, sizeof name, "cuda:%d", ordinal);
    if (n < 0) die("%s %s: CUDA does not work on this machine: %s", what, spec, why);
    if (n == 0) die("%s %s: no CUDA GPU is visible (%s)", what, spec, why);
    if (ordinal < 0) ordinal = local_rank % n;  // one GPU a rank of this machine, in turn
    if (ordinal >= n)
        die("%s cuda:%d: %d GPU%s visible (cuda:0 .. cuda:%d)", what, ordinal, n, n == 1 ? "" : "s", n - 1);
    snprintf(name, sizeof name, "cuda:%d", ordinal);
    Backend *be = (Backend *)backend_new(name, ordinal);
    dist_set(be);
    return be;
}

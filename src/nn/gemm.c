#include "nn/gemm.h"

#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>

#include "base/cpu.h"
#include "base/util.h"

// One CPU engine and stream for the process, made on first use and never changed after; shapes'
// primitives live in oneDNN's own primitive cache (a hit costs a few microseconds). bf16_native: oneDNN
// has a bf16 matmul on this CPU (at its level, as capped), probed once with the layouts the ops use.
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static int bf16_native;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;

static void check(dnnl_status_t s, const char *what) {
    if (s != dnnl_success) die("oneDNN: %s failed (status %d)", what, (int)s);
}

// A (rows, cols) matrix stored row-major with leading dimension ld, or its transpose.
static void matrix_desc(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld, int trans, dnnl_data_type_t dt) {
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {ld, 1};
    if (trans) {
        strides[0] = 1;
        strides[1] = ld;
    }
    check(dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides), "describing a matrix");
}

// The matmul's primitive descriptor, or the status oneDNN gave (dnnl_unimplemented: no kernel for it).
static dnnl_status_t matmul_pd(dnnl_primitive_desc_t *pd, const dnnl_memory_desc_t *a, const dnnl_memory_desc_t *b,
                               const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *c, float alpha,
                               int accumulate) {
    dnnl_matmul_desc_t md;
    check(dnnl_matmul_desc_init(&md, a, b, bias, c), "describing a matmul");
    dnnl_primitive_attr_t attr;
    check(dnnl_primitive_attr_create(&attr), "creating attributes");
    if (alpha != 1.0f) check(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "setting alpha");
    if (accumulate) {
        dnnl_post_ops_t po;
        check(dnnl_post_ops_create(&po), "creating post-ops");
        check(dnnl_post_ops_append_sum(po, 1.0f), "adding the sum post-op");
        check(dnnl_primitive_attr_set_post_ops(attr, po), "setting post-ops");
        dnnl_post_ops_destroy(po);
    }
    dnnl_status_t s = dnnl_primitive_desc_create(pd, &md, attr, engine, NULL);
    dnnl_primitive_attr_destroy(attr);
    return s;
}

// Can oneDNN multiply bf16 here, in the three layouts the ops use (a projection with bias, its input
// gradient, its weight gradient)? oneDNN 2.6 has no bf16 matmul below AVX-512.
static int probe_bf16(void) {
    static const int layouts[3][3] = {{0, 1, 1}, {0, 0, 0}, {1, 0, 0}};  // ta, tb, bias
    for (int i = 0; i < 3; i++) {
        dnnl_memory_desc_t a, b, c, bd;
        matrix_desc(&a, 64, 64, 64, layouts[i][0], dnnl_bf16);
        matrix_desc(&b, 64, 64, 64, layouts[i][1], dnnl_bf16);
        matrix_desc(&c, 64, 64, 64, 0, dnnl_f32);
        matrix_desc(&bd, 1, 64, 64, 0, dnnl_bf16);
        dnnl_primitive_desc_t pd;
        dnnl_status_t s = matmul_pd(&pd, &a, &b, layouts[i][2] ? &bd : NULL, &c, 1.0f, !layouts[i][2]);
        if (s == dnnl_unimplemented) return 0;
        check(s, "creating a bf16 matmul");
        dnnl_primitive_desc_destroy(pd);
    }
    return 1;
}

static void engine_init(void) {
    // GRPO_CPU_ISA caps oneDNN too; this must be its first call.
    static const dnnl_cpu_isa_t isa[] = {dnnl_cpu_isa_avx2, dnnl_cpu_isa_avx512_core, dnnl_cpu_isa_avx512_core_bf16,
                                         dnnl_cpu_isa_avx512_core_amx};
    const CpuLevel *cpu = cpu_level();
    if (cpu->cap_onednn) check(dnnl_set_max_cpu_isa(isa[cpu->level]), "capping the instruction set");
    check(dnnl_engine_create(&engine, dnnl_cpu, 0), "creating the CPU engine");
    check(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "creating a stream");
    bf16_native = probe_bf16();
}

int gemm_bf16_native(void) {
    pthread_once(&engine_once, engine_init);
    return bf16_native;
}

const char *gemm_onednn_isa(void) {
    pthread_once(&engine_once, engine_init);
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

static dnnl_memory_t memory_on(const dnnl_memory_desc_t *md, const void *data) {
    dnnl_memory_t mem;
    check(dnnl_memory_create(&mem, md, engine, (void *)data), "wrapping a buffer");
    return mem;
}

// oneDNN's sgemm runs on the calling thread inside a parallel region.
void gemm_f32_local(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, int accumulate, float *C, int64_t ldc) {
    pthread_once(&engine_once, engine_init);
    check(dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, accumulate ? 1.0f : 0.0f, C, ldc),
          "sgemm");
}

// bf16 where oneDNN has no bf16 matmul: blocks of the operands are widened to fp32 and multiplied by
// oneDNN's fp32 matmul (all threads). For each block of up to WIDE_M rows of op(A) and WIDE_K of the inner
// dimension (more rows when it is shorter), the A block is widened once, then the B block of each panel
// of up to WIDE_N columns (more when the inner dimension is shorter) in turn:
// the weights are widened a panel at a time (their rows of blocks once per WIDE_M rows), never whole, and
// the buffers stay at 8 + 4 MiB whatever the shapes. bf16 -> fp32 is exact and a product of two bf16
// numbers is exact in fp32, so this is the bf16 contract (bf16 operands, fp32 accumulation) summed in
// another order.
enum { WIDE_M = 1024, WIDE_K = 2048, WIDE_N = 512 };

// dst (rows, cols), row-major, from a block of a bf16 matrix stored with leading dimension ld.
static void widen(float *dst, const uint16_t *src, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for if (rows * cols >= 65536)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = bf16_to_f32(src[r * ld + c]);
}

// A block of op(X) (rows r0.., columns c0..: `rows` x `cols`) widened into dst, in X's stored orientation:
// transposed blocks stay transposed (the fp32 product reads them so), leading dimension their width.
static int64_t widen_block(float *dst, const uint16_t *X, int64_t ldx, int trans, int64_t r0, int64_t c0,
                           int64_t rows, int64_t cols) {
    if (trans) {
        widen(dst, X + c0 * ldx + r0, cols, rows, ldx);
        return rows;
    }
    widen(dst, X + r0 * ldx + c0, rows, cols, ldx);
    return cols;
}

// The widened blocks' buffer of the calling thread (gemm runs on one thread at a time, but need not be the
// same one): allocated once at its largest, (WIDE_M + WIDE_N) x WIDE_K floats, and kept like oneDNN's own
// scratchpad, because a fresh 12 MiB per product costs more in page faults than the widening itself; freed
// when the thread exits (a thread-specific key's destructor: a serve engine thread ends before the process).
static pthread_key_t wide_key;
static pthread_once_t wide_once = PTHREAD_ONCE_INIT;

static void wide_key_create(void) {
    if (pthread_key_create(&wide_key, free)) die("pthread_key_create failed");
}

static float *wide_buffer(void) {
    if (pthread_once(&wide_once, wide_key_create)) die("pthread_once failed");
    float *buf = pthread_getspecific(wide_key);
    if (buf) return buf;
    buf = xmalloc((size_t)(WIDE_M + WIDE_N) * WIDE_K * sizeof(float));
    if (pthread_setspecific(wide_key, buf)) die("pthread_setspecific failed");
    return buf;
}

static void gemm_bf16_widened(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *A,
                              int64_t lda, const uint16_t *B, int64_t ldb, const uint16_t *bias, int accumulate,
                              float *C, int64_t ldc) {
    // With a shorter inner dimension the same buffers hold more rows and columns: fewer, larger products.
    int64_t kb = K < WIDE_K ? K : WIDE_K, span = kb > 64 ? kb : 64;
    int64_t mb = WIDE_M * WIDE_K / span / 64 * 64, nb = WIDE_K * WIDE_N / span / 64 * 64;
    mb = M < mb ? M : mb;
    nb = N < nb ? N : nb;
    float *wide = wide_buffer();
    float *a = wide, *b = wide + (size_t)WIDE_M * WIDE_K, *bias32 = NULL;
    if (bias) {
        bias32 = xmalloc((size_t)N * sizeof(float));
        dtype_to_f32(DTYPE_BF16, bias, bias32, (size_t)N);
    }
    for (int64_t i0 = 0; i0 < M; i0 += mb) {
        int64_t m = M - i0 < mb ? M - i0 : mb;
        for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += kb) {  // K = 0 still sets C (bias or zero)
            int64_t k = K - k0 < kb ? K - k0 : kb;
            int64_t la = widen_block(a, A, lda, ta, i0, k0, m, k);
            for (int64_t j0 = 0; j0 < N; j0 += nb) {
                int64_t n = N - j0 < nb ? N - j0 : nb;
                int64_t lb = widen_block(b, B, ldb, tb, k0, j0, k, n);
                // the first inner block sets C as asked (bias, accumulate); the later ones add to it
                gemm(DTYPE_F32, ta, tb, m, n, k, alpha, a, la, b, lb, k0 == 0 && bias32 ? bias32 + j0 : NULL,
                     k0 > 0 || accumulate, C + i0 * ldc + j0, ldc);
            }
        }
    }
    free(bias32);
}

void gemm(DType dt, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda,
          const void *B, int64_t ldb, const void *bias, int accumulate, float *C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (dt != DTYPE_F32 && dt != DTYPE_BF16) die("internal: gemm on %s", dtype_name(dt));
    if (bias && alpha != 1.0f) die("internal: gemm with a bias and alpha %g", alpha);
    pthread_once(&engine_once, engine_init);
    if (dt == DTYPE_BF16 && !bf16_native) {
        gemm_bf16_widened(ta, tb, M, N, K, alpha, A, lda, B, ldb, bias, accumulate, C, ldc);
        return;
    }
    dnnl_data_type_t t = dt == DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t a, b, c, bd;
    matrix_desc(&a, M, K, lda, ta, t);
    matrix_desc(&b, K, N, ldb, tb, t);
    matrix_desc(&c, M, N, ldc, 0, dnnl_f32);
    if (bias) matrix_desc(&bd, 1, N, N, 0, t);
    dnnl_primitive_desc_t pd;
    dnnl_status_t s = matmul_pd(&pd, &a, &b, bias ? &bd : NULL, &c, alpha, accumulate);
    if (s == dnnl_unimplemented && dt == DTYPE_BF16) {  // a shape the probe did not foresee: never fail
        gemm_bf16_widened(ta, tb, M, N, K, alpha, A, lda, B, ldb, bias, accumulate, C, ldc);
        return;
    }
    check(s, "creating a matmul");
    dnnl_primitive_t prim;
    check(dnnl_primitive_create(&prim, pd), "creating a matmul primitive");
    dnnl_primitive_desc_destroy(pd);

    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, memory_on(&a, A)},
        {DNNL_ARG_WEIGHTS, memory_on(&b, B)},
        {DNNL_ARG_DST, memory_on(&c, C)},
    };
    int nargs = 3;
    if (bias) args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, memory_on(&bd, bias)};
    check(dnnl_primitive_execute(prim, stream, nargs, args), "running a matmul");
    check(dnnl_stream_wait(stream), "waiting for a matmul");
    for (int i = 0; i < nargs; i++) dnnl_memory_destroy(args[i].memory);
    dnnl_primitive_destroy(prim);
}

#include "nn/gemm.h"

#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>

#include "base/util.h"

// One CPU engine and stream for the process, made on first use and never changed after; shapes'
// primitives live in oneDNN's own primitive cache (a hit costs a few microseconds).
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;

static void check(dnnl_status_t s, const char *what) {
    if (s != dnnl_success) die("oneDNN: %s failed (status %d)", what, (int)s);
}

static void engine_init(void) {
    check(dnnl_engine_create(&engine, dnnl_cpu, 0), "creating the CPU engine");
    check(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "creating a stream");
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

static dnnl_memory_t memory_on(const dnnl_memory_desc_t *md, const void *data) {
    dnnl_memory_t mem;
    check(dnnl_memory_create(&mem, md, engine, (void *)data), "wrapping a buffer");
    return mem;
}

// oneDNN's sgemm runs on the calling thread inside a parallel region.
void gemm_f32_local(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, int accumulate, float *C, int64_t ldc) {
    check(dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, accumulate ? 1.0f : 0.0f, C, ldc),
          "sgemm");
}

void gemm(DType dt, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda,
          const void *B, int64_t ldb, const void *bias, int accumulate, float *C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (dt != DTYPE_F32 && dt != DTYPE_BF16) die("internal: gemm on %s", dtype_name(dt));
    pthread_once(&engine_once, engine_init);
    dnnl_data_type_t t = dt == DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t a, b, c, bd;
    matrix_desc(&a, M, K, lda, ta, t);
    matrix_desc(&b, K, N, ldb, tb, t);
    matrix_desc(&c, M, N, ldc, 0, dnnl_f32);
    if (bias) matrix_desc(&bd, 1, N, N, 0, t);
    dnnl_matmul_desc_t md;
    check(dnnl_matmul_desc_init(&md, &a, &b, bias ? &bd : NULL, &c), "describing a matmul");

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
    dnnl_primitive_desc_t pd;
    check(dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL), "creating a matmul");
    dnnl_primitive_attr_destroy(attr);
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

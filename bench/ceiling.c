// Ceilings for the CPU benchmarks, measured with the library grpo uses: oneDNN matmul GFLOP/s for one
// shape (fp32 or bf16 operands, fp32 accumulation) and a read-bandwidth loop (GB/s), OpenMP threads as
// OMP_NUM_THREADS says. Prints one JSON line: the median of REPS runs.
//   ceiling gemm f32|bf16 M N K [REPS]     C (M,N) = A (M,K) @ B (N,K)^T, as a projection computes
//   ceiling read MB [REPS]                 sum of an MB-megabyte fp32 array, every thread a slice
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/util.h"
#include "nn/gemm.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void bench_gemm(DType dt, int64_t M, int64_t N, int64_t K, int reps) {
    size_t es = dtype_size(dt);
    float *a = xmalloc((size_t)(M * K) * 4), *b = xmalloc((size_t)(N * K) * 4), *c = xmalloc((size_t)(M * N) * 4);
    for (int64_t i = 0; i < M * K; i++) a[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < N * K; i++) b[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
    void *a2 = xmalloc((size_t)(M * K) * es), *b2 = xmalloc((size_t)(N * K) * es);
    dtype_from_f32(dt, a, a2, (size_t)(M * K));
    dtype_from_f32(dt, b, b2, (size_t)(N * K));
    double *t = xmalloc((size_t)reps * sizeof *t);
    gemm(dt, 0, 1, M, N, K, 1.0f, a2, K, b2, K, NULL, 0, c, N);  // compiles the kernel
    for (int r = 0; r < reps; r++) {
        double t0 = time_now();
        gemm(dt, 0, 1, M, N, K, 1.0f, a2, K, b2, K, NULL, 0, c, N);
        t[r] = time_now() - t0;
    }
    printf("{\"gemm\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, \"gflops\": %.1f}\n", dtype_name(dt),
           (long long)M, (long long)N, (long long)K, 2.0 * (double)M * (double)N * (double)K / median(t, reps) / 1e9);
    free(a), free(b), free(c), free(a2), free(b2), free(t);
}

static void bench_read(size_t mb, int reps) {
    size_t n = mb << 18;  // floats
    float *x = xmalloc(n * 4);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] = 1.0f;
    double *t = xmalloc((size_t)reps * sizeof *t), sum = 0.0;
    for (int r = 0; r < reps; r++) {
        double t0 = time_now();
        float s = 0.0f;
#pragma omp parallel for simd reduction(+ : s)  // simd: a vectorised sum, as a read loop should be
        for (size_t i = 0; i < n; i++) s += x[i];
        t[r] = time_now() - t0;
        sum += s;
    }
    printf("{\"read_mb\": %zu, \"gbps\": %.1f, \"check\": %.0f}\n", mb, (double)(n * 4) / median(t, reps) / 1e9, sum);
    free(x), free(t);
}

int main(int argc, char **argv) {
    if (argc >= 6 && strcmp(argv[1], "gemm") == 0) {
        DType dt = strcmp(argv[2], "bf16") == 0 ? DTYPE_BF16 : DTYPE_F32;
        bench_gemm(dt, atoll(argv[3]), atoll(argv[4]), atoll(argv[5]), argc > 6 ? atoi(argv[6]) : 10);
    } else if (argc >= 3 && strcmp(argv[1], "read") == 0) {
        bench_read((size_t)atoll(argv[2]), argc > 3 ? atoi(argv[3]) : 10);
    } else {
        die("usage: ceiling gemm f32|bf16 M N K [REPS] | ceiling read MB [REPS]");
    }
    return 0;
}

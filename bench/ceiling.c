// Ceilings for the CPU benchmarks, measured with the library grpo uses: oneDNN matmul GFLOP/s for one
// shape (fp32 or bf16 operands, fp32 accumulation) and a read-bandwidth loop (GB/s), OpenMP threads as
// OMP_NUM_THREADS says. Prints one JSON line: the median of REPS runs.
//   ceiling gemm f32|bf16 M N K [REPS]     C (M,N) = A (M,K) @ B (N,K)^T, as a projection computes
//   ceiling read MB [REPS]                 sum of an MB-megabyte fp32 array, every thread a slice
//   ceiling skinny f32|bf16|q8 ROWS C OC MB [REPS]
//                                          every skinny kernel against the read loop (bench_skinny)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/util.h"
#include "nn/gemm.h"
#include "nn/q8.h"
#include "nn/skinny.h"

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

typedef float v8f __attribute__((vector_size(32)));

static inline v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

// Seconds to sum n floats (n a multiple of 64) on every thread. Eight independent 8-float sums per thread:
// one sum's chain of adds would measure the add latency (about 20 GB/s a core), not the memory.
static double read_pass(const float *x, size_t n, float *sum) {
    double t0 = time_now();
    float s = 0.0f;
#pragma omp parallel reduction(+ : s)
    {
        v8f a[8] = {{0}};
#pragma omp for
        for (size_t i = 0; i < n; i += 64)
            for (int k = 0; k < 8; k++) a[k] += load8(x + i + 8 * k);
        v8f v = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        for (int k = 0; k < 8; k++) s += v[k];
    }
    *sum += s;
    return time_now() - t0;
}

static float *read_buffer(size_t n) {
    float *x = xmalloc(n * 4);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] = 1.0f;
    return x;
}

static void bench_read(size_t mb, int reps) {
    size_t n = mb << 18;  // floats
    float *x = read_buffer(n);
    float sum = 0.0f;
    double *t = xmalloc((size_t)reps * sizeof *t);
    for (int r = 0; r < reps; r++) t[r] = read_pass(x, n, &sum);
    printf("{\"read_mb\": %zu, \"gbps\": %.1f, \"check\": %.0f}\n", mb, (double)(n * 4) / median(t, reps) / 1e9,
           (double)sum);
    free(x), free(t);
}

// Every skinny kernel that runs `dt` here (nn/skinny.h) over MB megabytes of (OC,C) weight matrices at ROWS
// rows, as decode streams its layers, and the read loop over as many bytes, taking turns REPS times:
// GB/s of weights read (median) per kernel, and the read loop's.
static void bench_skinny(DType dt, int64_t rows, int64_t C, int64_t OC, size_t mb, int reps) {
    int q8 = dt == DTYPE_Q8;  // Q8_0 blocks: 34 bytes per 32 values
    size_t es = q8 ? sizeof(Q8Block) : dtype_size(dt), ev = q8 ? Q8_BLOCK : 1;
    size_t per = (size_t)(C * OC) / ev * es, mats = ((mb << 20) + per - 1) / per;
    size_t n = mats * (size_t)(C * OC), nr = ((mats * per / 4) + 63) & ~(size_t)63;
    float *wf = xmalloc(n * 4), *x = xmalloc((size_t)(rows * C) * 4), *out = xmalloc((size_t)(rows * OC) * 4);
    for (size_t i = 0; i < n; i++) wf[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < rows * C; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    void *w = xmalloc(n / ev * es), *x2 = xmalloc(q8 ? (size_t)(rows * C / Q8_BLOCK) * sizeof(Q8In) : (size_t)(rows * C) * es);
    if (q8) q8_quantize(w, wf, DTYPE_F32, (int64_t)(n / (size_t)C), C), q8_quantize_inputs(x2, x, rows, C);
    else dtype_from_f32(dt, wf, w, n), dtype_from_f32(dt, x, x2, (size_t)(rows * C));
    free(wf);
    float *rd = read_buffer(nr);
    float sum = 0.0f;
    double *t = xcalloc((size_t)(SKINNY_KERNELS + 1) * (size_t)reps, sizeof *t);
    for (int r = -1; r < reps; r++) {  // r = -1: a warm-up round
        for (int k = 0; k <= SKINNY_KERNELS; k++) {
            if (k < SKINNY_KERNELS && !skinny_kernel_runs((SkinnyKernel)k, dt)) continue;
            double secs = 0.0;
            if (k == SKINNY_KERNELS) {
                secs = read_pass(rd, nr, &sum);
            } else {
                double t0 = time_now();
                for (size_t m = 0; m < mats; m++)
                    matmul_skinny_with((SkinnyKernel)k, out, x2, (const char *)w + m * per, NULL, dt, rows, C, OC);
                secs = time_now() - t0;
            }
            if (r >= 0) t[(size_t)k * (size_t)reps + (size_t)r] = secs;
        }
    }
    printf("{\"dtype\": \"%s\", \"rows\": %lld, \"C\": %lld, \"OC\": %lld, \"mb\": %.0f", dtype_name(dt),
           (long long)rows, (long long)C, (long long)OC, (double)(mats * per) / (1 << 20));
    for (int k = 0; k <= SKINNY_KERNELS; k++) {
        if (k < SKINNY_KERNELS && !skinny_kernel_runs((SkinnyKernel)k, dt)) continue;
        double gbps = (double)(mats * per) / median(t + (size_t)k * (size_t)reps, reps) / 1e9;
        printf(", \"%s\": %.1f", k < SKINNY_KERNELS ? skinny_kernel_name((SkinnyKernel)k) : "read", gbps);
    }
    printf(", \"check\": %.0f}\n", (double)sum);
    free(w), free(x), free(x2), free(out), free(rd), free(t);
}

int main(int argc, char **argv) {
    if (argc >= 6 && strcmp(argv[1], "gemm") == 0) {
        DType dt = strcmp(argv[2], "bf16") == 0 ? DTYPE_BF16 : DTYPE_F32;
        bench_gemm(dt, atoll(argv[3]), atoll(argv[4]), atoll(argv[5]), argc > 6 ? atoi(argv[6]) : 10);
    } else if (argc >= 3 && strcmp(argv[1], "read") == 0) {
        bench_read((size_t)atoll(argv[2]), argc > 3 ? atoi(argv[3]) : 10);
    } else if (argc >= 7 && strcmp(argv[1], "skinny") == 0) {
        DType dt = strcmp(argv[2], "bf16") == 0 ? DTYPE_BF16 : strcmp(argv[2], "q8") == 0 ? DTYPE_Q8 : DTYPE_F32;
        long long rows = atoll(argv[3]), C = atoll(argv[4]), OC = atoll(argv[5]), mb = atoll(argv[6]);
        int reps = argc > 7 ? atoi(argv[7]) : 7;
        if (rows < 1 || rows > SKINNY_MAX_ROWS || C < 1 || OC < 1 || mb < 1 || reps < 1 || (dt == DTYPE_Q8 && C % Q8_BLOCK))
            die("ceiling skinny: ROWS 1..%d, C (q8: a multiple of %d), OC, MB and REPS at least 1", SKINNY_MAX_ROWS, Q8_BLOCK);
        bench_skinny(dt, rows, C, OC, (size_t)mb, reps);
    } else {
        die("usage: ceiling gemm f32|bf16 M N K [REPS] | ceiling read MB [REPS] | "
            "ceiling skinny f32|bf16|q8 ROWS C OC MB [REPS]");
    }
    return 0;
}

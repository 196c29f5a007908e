// Driver binary for the dist layer, run by comm_test.py (with and without mpirun) and bench/allreduce.py.
//
//   test_comm check --tmp DIR      every collective on random per-rank inputs; each rank writes its
//                                  inputs and outputs as raw files DIR/<case>.r<rank>.s<step>.{in,out}.<type>
//                                  and a line per case to DIR/cases.r<rank>.jsonl; comm_test.py
//                                  recomputes the results with numpy. In-binary checks print FAIL lines.
//   test_comm fail --mode kill|hang|abort [--timeout S]
//                                  all-reduces in a loop; at step 3 rank 1 kills itself (SIGKILL),
//                                  sleeps forever, or calls comm_abort.
//   test_comm bench --n N [--iters I] [--ratio R]
//                                  times all-reduces of N floats (top-k at ratio R if R < 1); rank 0
//                                  prints one JSON line.
#define _GNU_SOURCE  // sched_getaffinity
#include <sched.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/rng.h"
#include "base/util.h"
#include "parallel/comm.h"
#include "parallel/topk.h"

static int failures = 0;
#define CHECK(c, cond, ...)                                       \
    do {                                                          \
        if (!(cond)) {                                            \
            failures++;                                           \
            printf("FAIL rank %d/%d: ", (c)->rank, (c)->size);    \
            printf(__VA_ARGS__);                                  \
            putchar('\n');                                        \
        }                                                         \
    } while (0)

static const char *tmp_dir;
static FILE *manifest;

static void write_file(const Comm *c, const char *name, int step, const char *kind, const char *type,
                       const void *data, size_t bytes) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.r%d.s%d.%s.%s", tmp_dir, name, c->rank, step, kind, type);
    FILE *f = fopen(path, "wb");
    if (!f || (bytes && fwrite(data, 1, bytes, f) != bytes) || fclose(f) != 0) die("cannot write %s", path);
}

static void case_line(const Comm *c, const char *name, const char *op, size_t n, int steps, double ratio,
                      size_t chunk, uint64_t bytes) {
    fprintf(manifest,
            "{\"case\":\"%s\",\"op\":\"%s\",\"n\":%zu,\"steps\":%d,\"ratio\":%.17g,\"chunk\":%zu,"
            "\"bytes\":%llu,\"size\":%d,\"rank\":%d,\"mpi\":%d}\n",
            name, op, n, steps, ratio, chunk, (unsigned long long)bytes, c->size, c->rank, c->mpi);
}

// Inputs differ per rank, case and step.
static float *random_floats(const Comm *c, size_t n, uint64_t seed) {
    Rng r;
    rng_init(&r, seed * 1000003u + (uint64_t)c->rank);
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = 2.0f * rng_next_float(&r) - 1.0f;
    return x;
}

static void case_allreduce(Comm *c, const char *name, size_t n, size_t bucket, uint64_t seed) {
    c->bucket_floats = bucket;
    float *x = random_floats(c, n, seed);
    write_file(c, name, 0, "in", "f32", x, n * 4);
    uint64_t b0 = c->bytes_sent;
    comm_allreduce_mean(c, x, n, name);
    write_file(c, name, 0, "out", "f32", x, n * 4);
    case_line(c, name, "allreduce", n, 1, 0, 0, c->bytes_sent - b0);
    free(x);
}

// Two ops in flight at once, compute in between, waited in the opposite order.
static void case_split(Comm *c, const char *name, size_t n, uint64_t seed) {
    c->bucket_floats = 100;
    float *x = random_floats(c, n, seed), *y = xmalloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *x);
    write_file(c, name, 0, "in", "f32", x, n * 4);
    uint64_t b0 = c->bytes_sent;
    size_t half = n / 2 + 7;
    CommOp *late = comm_allreduce_start(c, x + half, n - half, "late layers");
    volatile double acc = 0;
    for (int i = 0; i < 200; i++) {
        for (int j = 0; j < 10000; j++) acc += sqrt((double)j);
        comm_test(c, late);
    }
    CommOp *early = comm_allreduce_start(c, x, half, "early layers");
    comm_wait(c, early);
    comm_wait(c, late);
    uint64_t bytes = c->bytes_sent - b0;
    write_file(c, name, 0, "out", "f32", x, n * 4);
    comm_allreduce_mean(c, y, n, "blocking");
    CHECK(c, !memcmp(x, y, n * sizeof *x), "%s: split-phase result differs from the blocking all-reduce", name);
    case_line(c, name, "allreduce", n, 1, 0, 0, bytes);
    free(x);
    free(y);
}

static void case_f64(Comm *c) {
    const char *names[] = {"f64_sum", "f64_max", "f64_min"};
    CommReduce ops[] = {COMM_SUM, COMM_MAX, COMM_MIN};
    for (int k = 0; k < 3; k++) {
        double v[5];
        Rng r;
        rng_init(&r, 77 + (uint64_t)c->rank);
        for (int i = 0; i < 5; i++) v[i] = (double)rng_next_float(&r) * 1000.0 - 500.0;
        write_file(c, names[k], 0, "in", "f64", v, sizeof v);
        uint64_t b0 = c->bytes_sent;
        comm_allreduce_f64(c, v, 5, ops[k], names[k]);
        write_file(c, names[k], 0, "out", "f64", v, sizeof v);
        case_line(c, names[k], names[k], 5, 1, 0, 0, c->bytes_sent - b0);
    }
}

static void case_reduce_scatter(Comm *c, const char *name, size_t n, size_t bucket, uint64_t seed) {
    c->bucket_floats = bucket;
    size_t lo, hi;
    comm_shard(n, c->rank, c->size, &lo, &hi);
    float *x = random_floats(c, n, seed), *shard = xmalloc((hi - lo) * sizeof *shard);
    write_file(c, name, 0, "in", "f32", x, n * 4);
    uint64_t b0 = c->bytes_sent;
    comm_reduce_scatter_mean(c, x, shard, n, name);
    write_file(c, name, 0, "out", "f32", shard, (hi - lo) * 4);
    case_line(c, name, "reduce_scatter", n, 1, 0, 0, c->bytes_sent - b0);
    free(x);
    free(shard);
}

static void case_allgather(Comm *c, const char *name, size_t n, size_t bucket, int in_place, uint64_t seed) {
    c->bucket_floats = bucket;
    size_t lo, hi;
    comm_shard(n, c->rank, c->size, &lo, &hi);
    float *shard = random_floats(c, hi - lo, seed), *full = random_floats(c, n, seed + 1);  // full: garbage
    write_file(c, name, 0, "in", "f32", shard, (hi - lo) * 4);
    if (in_place) memcpy(full + lo, shard, (hi - lo) * sizeof *shard);
    uint64_t b0 = c->bytes_sent;
    comm_allgather(c, in_place ? full + lo : shard, full, n, name);
    write_file(c, name, 0, "out", "f32", full, n * 4);
    case_line(c, name, "allgather", n, 1, 0, 0, c->bytes_sent - b0);
    free(shard);
    free(full);
}

static void case_bcast(Comm *c) {
    size_t bytes = 10001;
    int root = c->size - 1;
    c->bucket_floats = 1000;  // 4000-byte pieces
    unsigned char *b = xmalloc(bytes);
    for (size_t i = 0; i < bytes; i++) b[i] = (unsigned char)(i * 7 + (size_t)c->rank * 13);
    write_file(c, "bcast", 0, "in", "u8", b, bytes);
    uint64_t b0 = c->bytes_sent;
    comm_bcast(c, b, bytes, root, "bcast");
    write_file(c, "bcast", 0, "out", "u8", b, bytes);
    case_line(c, "bcast", "bcast", bytes, 1, 0, (size_t)root, c->bytes_sent - b0);
    free(b);
}

// Several steps of top-k with the residual carried; `mode` 1 quantises inputs (ties), 2 puts a NaN
// into rank 0's step-1 gradient.
static void case_topk(Comm *c, const char *name, size_t n, double ratio, size_t chunk, int steps, int mode,
                      uint64_t seed) {
    c->bucket_floats = 256;
    TopK t;
    topk_init(&t, n, ratio);
    if (chunk) t.chunk = chunk;
    uint64_t bytes = 0;
    for (int s = 0; s < steps; s++) {
        float *g = random_floats(c, n, seed + (uint64_t)s);
        if (mode == 1)
            for (size_t i = 0; i < n; i++) g[i] = roundf(g[i] * 4.0f) / 4.0f;
        if (mode == 2 && s == 1 && c->rank == 0) g[7] = NAN;
        write_file(c, name, s, "in", "f32", g, n * 4);
        float *dense = xmalloc(n * sizeof *dense);
        memcpy(dense, g, n * sizeof *g);
        uint64_t b0 = c->bytes_sent;
        topk_allreduce_mean(c, &t, g, n, name);
        bytes += c->bytes_sent - b0;
        write_file(c, name, s, "out", "f32", g, n * 4);
        if (ratio >= 1) {
            comm_allreduce_mean(c, dense, n, "dense");
            CHECK(c, !memcmp(dense, g, n * sizeof *g), "%s step %d: ratio 1 differs from the dense all-reduce", name, s);
        }
        free(dense);
        free(g);
    }
    case_line(c, name, "topk", n, steps, ratio, t.chunk, bytes);
    topk_free(&t);
}

static void write_cpus(FILE *f, const char *key) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) die("sched_getaffinity failed");
    fprintf(f, "\"%s\":[", key);
    for (int i = 0, first = 1; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &set)) fprintf(f, "%s%d", first ? "" : ",", i), first = 0;
    fputs("]", f);
}

// Last: the rank stays pinned. Writes the CPU masks before and after for comm_test.py.
static void case_pin(Comm *c) {
    char path[1024];
    snprintf(path, sizeof path, "%s/pin.r%d.json", tmp_dir, c->rank);
    FILE *f = fopen(path, "w");
    if (!f) die("cannot write %s", path);
    CHECK(c, comm_pin_cpu(c, "none") == 0, "pin mode none did something");
    fprintf(f, "{\"local_rank\":%d,\"local_size\":%d,", c->local_rank, c->local_size);
    write_cpus(f, "before");
    int k = comm_pin_cpu(c, "block");
    fprintf(f, ",\"ret\":%d,", k);
    write_cpus(f, "after");
    fputs("}\n", f);
    if (fclose(f) != 0) die("cannot write %s", path);
}

static int run_check(Comm *c) {
    char path[1024];
    snprintf(path, sizeof path, "%s/cases.r%d.jsonl", tmp_dir, c->rank);
    manifest = fopen(path, "w");
    if (!manifest) die("cannot write %s", path);
    size_t small = c->size > 1 ? (size_t)c->size - 1 : 1;  // fewer floats than ranks
    case_allreduce(c, "ar_n0", 0, 1000, 1);
    case_allreduce(c, "ar_n1", 1, 1000, 2);
    case_allreduce(c, "ar_lt_ranks", small, 1000, 3);
    case_allreduce(c, "ar_bucket_m1", 999, 1000, 4);
    case_allreduce(c, "ar_bucket", 1000, 1000, 5);
    case_allreduce(c, "ar_bucket_p1", 1001, 1000, 6);
    case_allreduce(c, "ar_2503", 2503, 1000, 7);
    case_allreduce(c, "ar_default_bucket", COMM_BUCKET_FLOATS + 5, COMM_BUCKET_FLOATS, 8);
    case_split(c, "ar_split", 2503, 9);
    case_f64(c);
    case_reduce_scatter(c, "rs_n1", 1, 1000, 10);
    case_reduce_scatter(c, "rs_lt_ranks", small, 1000, 11);
    case_reduce_scatter(c, "rs_5", 5, 2, 12);
    case_reduce_scatter(c, "rs_2503", 2503, 1000, 13);
    case_allgather(c, "ag_n1", 1, 1000, 0, 14);
    case_allgather(c, "ag_lt_ranks", small, 1000, 0, 15);
    case_allgather(c, "ag_5", 5, 2, 0, 16);
    case_allgather(c, "ag_2503", 2503, 1000, 0, 17);
    case_allgather(c, "ag_inplace_2503", 2503, 1000, 1, 18);
    case_bcast(c);
    comm_barrier(c, "barrier");
    case_topk(c, "topk_ratio1", 2503, 1.0, 0, 3, 0, 20);
    case_topk(c, "topk_0.1", 2503, 0.1, 0, 5, 0, 30);
    case_topk(c, "topk_chunks", 1000, 0.05, 300, 5, 0, 40);
    case_topk(c, "topk_ties", 500, 0.3, 0, 5, 1, 50);
    case_topk(c, "topk_nan", 400, 0.01, 0, 2, 2, 60);
    case_topk(c, "topk_k1", 100, 1e-9, 0, 3, 0, 70);
    case_pin(c);
    fclose(manifest);
    return failures;
}

static void run_fail(Comm *c, const char *mode) {
    size_t n = 1 << 20;
    float *x = random_floats(c, n, 5);
    for (int step = 0; step < 1000; step++) {
        if (step == 3 && c->rank == 1) {
            fprintf(stderr, "rank 1: %s now\n", mode);
            fflush(stderr);
            if (!strcmp(mode, "kill")) raise(SIGKILL);
            if (!strcmp(mode, "abort")) comm_abort(c, "test abort from rank %d", c->rank);
            for (;;) pause();  // hang
        }
        comm_allreduce_mean(c, x, n, "gradients");
    }
    free(x);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void run_bench(Comm *c, size_t n, int iters, double ratio) {
    float *x = random_floats(c, n, 1);
    TopK t;
    topk_init(&t, n, ratio);
    double *times = xmalloc((size_t)iters * sizeof *times);
    uint64_t bytes = 0;
    for (int i = -1; i < iters; i++) {  // step -1: warm-up (pages, MPI connections, scratch)
        comm_barrier(c, "bench");
        uint64_t b0 = c->bytes_sent;
        double t0 = time_now();
        topk_allreduce_mean(c, &t, x, n, "bench");
        double dt = time_now() - t0;
        uint64_t sent = c->bytes_sent - b0;
        comm_allreduce_f64(c, &dt, 1, COMM_MAX, "bench time");
        if (i >= 0) times[i] = dt, bytes = sent;
    }
    qsort(times, (size_t)iters, sizeof *times, cmp_double);
    if (c->rank == 0)
        printf("{\"size\":%d,\"n\":%zu,\"ratio\":%g,\"iters\":%d,\"median_s\":%.6f,\"min_s\":%.6f,"
               "\"bytes_per_step\":%llu}\n",
               c->size, n, ratio, iters, times[iters / 2], times[0], (unsigned long long)bytes);
    free(times);
    topk_free(&t);
    free(x);
}

int main(int argc, char **argv) {
    if (argc < 2) die("usage: test_comm check|fail|bench [options]");
    const char *cmd = argv[1], *mode = "kill";
    double timeout = 60, ratio = 1;
    size_t n = 1 << 20;
    int iters = 5;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tmp")) tmp_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--mode")) mode = argv[i + 1];
        else if (!strcmp(argv[i], "--timeout")) timeout = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--n")) n = (size_t)atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ratio")) ratio = atof(argv[i + 1]);
        else die("unknown option %s", argv[i]);
    }
    Comm c;
    comm_init(&c, timeout);
    int rc = 0;
    if (!strcmp(cmd, "check")) {
        if (!tmp_dir) die("check needs --tmp DIR");
        rc = run_check(&c) ? 1 : 0;
        printf("rank %d/%d: %s\n", c.rank, c.size, rc ? "in-binary checks failed" : "in-binary checks passed");
    } else if (!strcmp(cmd, "fail")) {
        run_fail(&c, mode);
    } else if (!strcmp(cmd, "bench")) {
        if (iters < 1) die("--iters must be >= 1");
        run_bench(&c, n, iters, ratio);
    } else {
        die("unknown command %s", cmd);
    }
    comm_finalize(&c);
    return rc;
}

// MPI communicator: nonblocking collectives in buckets, every wait polled against a timeout.
#define _GNU_SOURCE  // sched_setaffinity, CPU_SET
#include "parallel/comm.h"

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// Busy polling lasts this long after the last completed bucket (see comm_wait).
#define COMM_SPIN_S 0.02

struct CommOp {
    const char *what;      // the caller's name for the data
    const char *name;      // the collective, for messages
    size_t n;              // its size in `unit`s, for messages
    const char *unit;
    int nreq, ndone;
    MPI_Request *req;      // one per bucket
    int *done_idx;         // MPI_Testsome's output
    float **scale;         // per request: divide scale[i][0..scale_n[i]) by size once it completes
    size_t *scale_n;
    int *counts;           // per request: size counts then size displacements (live until completion)
};

static void vreport(const Comm *c, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    fflush(stdout);
    if (c && c->size > 1) fprintf(stderr, "grpo: error: rank %d/%d: ", c->rank, c->size);
    else fputs("grpo: error: ", stderr);
    // One line, whatever the names in it hold.
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++) {
        if (*p < 0x20 || *p == 0x7f) fprintf(stderr, "\\x%02x", *p);
        else fputc(*p, stderr);
    }
    fputc('\n', stderr);
    fflush(stderr);
}

void comm_abort(const Comm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(c, fmt, ap);
    va_end(ap);
    if (c && c->mpi) MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
}

static void check(const Comm *c, int rc, const char *what, const char *call) {
    if (rc == MPI_SUCCESS) return;
    char err[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, err, &len) != MPI_SUCCESS) snprintf(err, sizeof err, "MPI error %d", rc);
    comm_abort(c, "%s: %s failed: %s (a rank has probably died)", what, call, err);
}

int comm_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

void comm_init(Comm *c, double timeout_s) {
    memset(c, 0, sizeof *c);
    c->size = 1;
    c->local_size = 1;
    c->timeout_s = timeout_s;
    c->bucket_floats = COMM_BUCKET_FLOATS;
    if (!comm_launched()) return;
    // Open MPI's nonblocking all-reduce picks, by default, an algorithm that measured 2-4x slower on
    // large buckets than Rabenseifner's (recursive-halving reduce-scatter + all-gather; libnbc falls
    // back to its ring where that does not apply). Each sum is formed on one rank and copied to the
    // others, so every rank gets the same bits. A value set by the user wins.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        die("MPI_Init_thread failed");
    c->mpi = 1;
    // Errors come back as codes that check() turns into one line naming the operation.
    check(c, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "init", "MPI_Comm_set_errhandler");
    check(c, MPI_Comm_rank(MPI_COMM_WORLD, &c->rank), "init", "MPI_Comm_rank");
    check(c, MPI_Comm_size(MPI_COMM_WORLD, &c->size), "init", "MPI_Comm_size");
    if (provided < MPI_THREAD_FUNNELED) comm_abort(c, "MPI provides no MPI_THREAD_FUNNELED support");
    MPI_Comm local;
    check(c, MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local),
          "init", "MPI_Comm_split_type");
    check(c, MPI_Comm_rank(local, &c->local_rank), "init", "MPI_Comm_rank");
    check(c, MPI_Comm_size(local, &c->local_size), "init", "MPI_Comm_size");
    check(c, MPI_Comm_free(&local), "init", "MPI_Comm_free");
}

void comm_finalize(Comm *c) {
    if (!c->mpi) return;
    // MPI_Finalize has no timeout of its own: a rank that never gets here is caught by the barrier.
    comm_barrier(c, "finalize");
    check(c, MPI_Finalize(), "finalize", "MPI_Finalize");
    c->mpi = 0;
}

// ---- ops ----

static CommOp *op_new(const char *what, const char *name, size_t n, const char *unit, int nreq, int ncounts) {
    CommOp *op = xcalloc(1, sizeof *op);
    op->what = what;
    op->name = name;
    op->n = n;
    op->unit = unit;
    op->nreq = nreq;
    op->req = xmalloc((size_t)nreq * sizeof *op->req);
    for (int i = 0; i < nreq; i++) op->req[i] = MPI_REQUEST_NULL;
    op->done_idx = xmalloc((size_t)nreq * sizeof *op->done_idx);
    op->scale = xcalloc((size_t)nreq, sizeof *op->scale);
    op->scale_n = xcalloc((size_t)nreq, sizeof *op->scale_n);
    op->counts = xcalloc((size_t)nreq * (size_t)ncounts, sizeof *op->counts);
    return op;
}

static void op_free(CommOp *op) {
    free(op->req);
    free(op->done_idx);
    free(op->scale);
    free(op->scale_n);
    free(op->counts);
    free(op);
}

static int nbuckets(size_t n, size_t bucket) { return n ? (int)((n + bucket - 1) / bucket) : 0; }

static size_t bucket_of(const Comm *c) {
    size_t b = c->bucket_floats ? c->bucket_floats : COMM_BUCKET_FLOATS;
    return b > (size_t)INT_MAX / 8 ? (size_t)INT_MAX / 8 : b;  // MPI counts are ints
}

// One MPI_Testsome: finishes the requests that completed. Returns 1 if any did.
static int op_progress(Comm *c, CommOp *op) {
    if (op->ndone >= op->nreq) return 0;
    int outcount = 0;
    check(c, MPI_Testsome(op->nreq, op->req, &outcount, op->done_idx, MPI_STATUSES_IGNORE), op->what,
          op->name);
    if (outcount == MPI_UNDEFINED) {  // no active request left
        op->ndone = op->nreq;
        return 1;
    }
    for (int j = 0; j < outcount; j++) {
        int i = op->done_idx[j];
        float *p = op->scale[i], s = (float)c->size;
        for (size_t e = 0; e < op->scale_n[i]; e++) p[e] /= s;
        op->ndone++;
    }
    return outcount > 0;
}

int comm_test(Comm *c, CommOp *op) {
    op_progress(c, op);
    return op->ndone >= op->nreq;
}

void comm_wait(Comm *c, CommOp *op) {
    double t0 = time_now(), last = t0;
    long sleep_ns = 50000;
    while (op->ndone < op->nreq) {
        if (op_progress(c, op)) {
            last = time_now();
            sleep_ns = 50000;
            continue;
        }
        double now = time_now();
        if (c->timeout_s > 0 && now - t0 > c->timeout_s)
            comm_abort(c, "%s (%s of %zu %s) did not complete within %g s: another rank is hung or dead",
                       op->what, op->name, op->n, op->unit, c->timeout_s);
        // Open MPI advances a transfer only inside MPI calls, so poll without pause while buckets keep
        // completing; once none has for COMM_SPIN_S (a peer is still computing), back off from 50 us to
        // 1 ms between polls so that a waiting rank does not burn a core.
        if (now - last < COMM_SPIN_S) continue;
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        sleep_ns = sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2;
    }
    op_free(op);
}

CommOp *comm_allreduce_start(Comm *c, float *buf, size_t n, const char *what) {
    if (c->size == 1) return op_new(what, "all-reduce", n, "floats", 0, 0);
    size_t bucket = bucket_of(c);
    CommOp *op = op_new(what, "all-reduce", n, "floats", nbuckets(n, bucket), 0);
    for (int i = 0; i < op->nreq; i++) {
        size_t b0 = (size_t)i * bucket, len = n - b0 < bucket ? n - b0 : bucket;
        check(c, MPI_Iallreduce(MPI_IN_PLACE, buf + b0, (int)len, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &op->req[i]),
              what, "MPI_Iallreduce");
        op->scale[i] = buf + b0;
        op->scale_n[i] = len;
    }
    c->bytes_sent += n * sizeof(float);
    return op;
}

// Per bucket [b0, b1) of the full vector: counts[r] = the part of rank r's shard inside it,
// displs[r] = where that part starts, relative to b0. Returns this rank's part as [*mlo, *mhi).
static void bucket_counts(const Comm *c, size_t n, size_t b0, size_t b1, int *counts, int *displs, size_t *mlo,
                          size_t *mhi) {
    *mlo = *mhi = b0;
    for (int r = 0; r < c->size; r++) {
        size_t lo, hi;
        comm_shard(n, r, c->size, &lo, &hi);
        lo = lo < b0 ? b0 : lo;
        hi = hi > b1 ? b1 : hi;
        if (hi < lo) hi = lo;
        counts[r] = (int)(hi - lo);
        displs[r] = (int)(lo - b0 < b1 - b0 ? lo - b0 : b1 - b0);
        if (r == c->rank) *mlo = lo, *mhi = hi;
    }
}

CommOp *comm_reduce_scatter_start(Comm *c, const float *full, float *shard, size_t n, const char *what) {
    size_t lo, hi;
    comm_shard(n, c->rank, c->size, &lo, &hi);
    if (c->size == 1) {
        if (n) memcpy(shard, full, n * sizeof *full);
        return op_new(what, "reduce-scatter", n, "floats", 0, 0);
    }
    size_t bucket = bucket_of(c);
    CommOp *op = op_new(what, "reduce-scatter", n, "floats", nbuckets(n, bucket), 2 * c->size);
    for (int i = 0; i < op->nreq; i++) {
        size_t b0 = (size_t)i * bucket, b1 = n - b0 < bucket ? n : b0 + bucket, mlo, mhi;
        int *counts = op->counts + (size_t)i * 2 * c->size;
        bucket_counts(c, n, b0, b1, counts, counts + c->size, &mlo, &mhi);
        float *out = mhi > mlo ? shard + (mlo - lo) : shard;  // nothing lands here when empty
        check(c, MPI_Ireduce_scatter(full + b0, out, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &op->req[i]),
              what, "MPI_Ireduce_scatter");
        op->scale[i] = out;
        op->scale_n[i] = mhi - mlo;
    }
    c->bytes_sent += n * sizeof(float);
    return op;
}

CommOp *comm_allgather_start(Comm *c, const float *shard, float *full, size_t n, const char *what) {
    size_t lo, hi;
    comm_shard(n, c->rank, c->size, &lo, &hi);
    int in_place = shard == full + lo;
    if (c->size == 1) {
        if (n && !in_place) memcpy(full, shard, n * sizeof *full);
        return op_new(what, "all-gather", n, "floats", 0, 0);
    }
    size_t bucket = bucket_of(c);
    CommOp *op = op_new(what, "all-gather", n, "floats", nbuckets(n, bucket), 2 * c->size);
    for (int i = 0; i < op->nreq; i++) {
        size_t b0 = (size_t)i * bucket, b1 = n - b0 < bucket ? n : b0 + bucket, mlo, mhi;
        int *counts = op->counts + (size_t)i * 2 * c->size;
        bucket_counts(c, n, b0, b1, counts, counts + c->size, &mlo, &mhi);
        const void *send = in_place ? MPI_IN_PLACE : mhi > mlo ? (const void *)(shard + (mlo - lo)) : (const void *)shard;
        check(c, MPI_Iallgatherv(send, (int)(mhi - mlo), MPI_FLOAT, full + b0, counts, counts + c->size, MPI_FLOAT,
                                 MPI_COMM_WORLD, &op->req[i]),
              what, "MPI_Iallgatherv");
    }
    c->bytes_sent += (hi - lo) * sizeof(float);
    return op;
}

CommOp *comm_allgather_bytes_start(Comm *c, const void *send, void *recv, size_t bytes, const char *what) {
    if (bytes > (size_t)INT_MAX) comm_abort(c, "%s: all-gather of %zu bytes per rank is too large", what, bytes);
    if (c->size == 1) {
        if (bytes && recv != send) memmove(recv, send, bytes);
        return op_new(what, "all-gather", bytes, "bytes", 0, 0);
    }
    CommOp *op = op_new(what, "all-gather", bytes, "bytes", 1, 0);
    check(c, MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD, &op->req[0]),
          what, "MPI_Iallgather");
    c->bytes_sent += bytes;
    return op;
}

void comm_allreduce_mean(Comm *c, float *buf, size_t n, const char *what) {
    comm_wait(c, comm_allreduce_start(c, buf, n, what));
}

void comm_reduce_scatter_mean(Comm *c, const float *full, float *shard, size_t n, const char *what) {
    comm_wait(c, comm_reduce_scatter_start(c, full, shard, n, what));
}

void comm_allgather(Comm *c, const float *shard, float *full, size_t n, const char *what) {
    comm_wait(c, comm_allgather_start(c, shard, full, n, what));
}

void comm_allreduce_f64(Comm *c, double *buf, size_t n, CommReduce op_kind, const char *what) {
    if (c->size == 1) return;
    MPI_Op mop = op_kind == COMM_MAX ? MPI_MAX : op_kind == COMM_MIN ? MPI_MIN : MPI_SUM;
    size_t bucket = bucket_of(c);
    CommOp *op = op_new(what, "all-reduce", n, "doubles", nbuckets(n, bucket), 0);
    for (int i = 0; i < op->nreq; i++) {
        size_t b0 = (size_t)i * bucket, len = n - b0 < bucket ? n - b0 : bucket;
        check(c, MPI_Iallreduce(MPI_IN_PLACE, buf + b0, (int)len, MPI_DOUBLE, mop, MPI_COMM_WORLD, &op->req[i]),
              what, "MPI_Iallreduce");
    }
    c->bytes_sent += n * sizeof(double);
    comm_wait(c, op);
}

void comm_bcast(Comm *c, void *buf, size_t bytes, int root, const char *what) {
    if (c->size == 1) return;
    if (root < 0 || root >= c->size) comm_abort(c, "%s: broadcast from rank %d of %d", what, root, c->size);
    size_t piece = bucket_of(c) * sizeof(float);
    CommOp *op = op_new(what, "broadcast", bytes, "bytes", nbuckets(bytes, piece), 0);
    for (int i = 0; i < op->nreq; i++) {
        size_t b0 = (size_t)i * piece, len = bytes - b0 < piece ? bytes - b0 : piece;
        check(c, MPI_Ibcast((char *)buf + b0, (int)len, MPI_BYTE, root, MPI_COMM_WORLD, &op->req[i]), what,
              "MPI_Ibcast");
    }
    if (c->rank == root) c->bytes_sent += bytes;
    comm_wait(c, op);
}

void comm_barrier(Comm *c, const char *what) {
    if (c->size == 1) return;
    CommOp *op = op_new(what, "barrier", 0, "floats", 1, 0);
    check(c, MPI_Ibarrier(MPI_COMM_WORLD, &op->req[0]), what, "MPI_Ibarrier");
    comm_wait(c, op);
}

int comm_pin_cpu(Comm *c, const char *mode) {
    if (!strcmp(mode, "none")) return 0;
    if (strcmp(mode, "block")) comm_abort(c, "dist.pin_cpu: unknown mode '%s' (expected none or block)", mode);
    cpu_set_t have, want;
    if (sched_getaffinity(0, sizeof have, &have) != 0) comm_abort(c, "sched_getaffinity failed");
    int cpus[CPU_SETSIZE], ncpu = 0;
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &have)) cpus[ncpu++] = i;
    if (ncpu == 0) comm_abort(c, "sched_getaffinity returned no CPU");
    size_t lo, hi;
    comm_shard((size_t)ncpu, c->local_rank, c->local_size, &lo, &hi);
    if (lo == hi) lo = (size_t)(c->local_rank % ncpu), hi = lo + 1;
    CPU_ZERO(&want);
    for (size_t i = lo; i < hi; i++) CPU_SET(cpus[i], &want);
    if (sched_setaffinity(0, sizeof want, &want) != 0)
        comm_abort(c, "sched_setaffinity to CPUs %d..%d failed", cpus[lo], cpus[hi - 1]);
    return (int)(hi - lo);
}

// Data parallelism between processes: a communicator over MPI in which every collective has a
// timeout, gradient all-reduce in buckets with a split-phase (start/wait) form for overlap with the
// backward pass, and the reduce-scatter/all-gather pair that ZeRO sharding needs.
//
// Single-process runs need no launcher: comm_init sees no launcher in the environment, makes no MPI
// call at all and every collective is a local copy (or nothing). Under `mpirun -np N`, rank r of N.
//
// Threading: MPI is initialised with MPI_THREAD_FUNNELED; call these functions from the main thread
// only (outside OpenMP parallel regions).
//
// Errors: with size > 1, a rank that fails alone must not leave the others waiting. comm_abort
// prints one line and MPI_Aborts the whole job. die() (base/util.h) exits with status 1, which
// Open MPI's mpirun also turns into the end of the job; any other launcher is covered by the
// timeout of the ranks left waiting. MPI errors (a dead peer) are reported by comm_abort naming the
// operation, never as a crash dump.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

// Floats per all-reduce bucket (16 MiB): each bucket is one nonblocking collective, so a large
// gradient is several messages in flight at once, and the caller can start the buckets of the
// layers whose gradients are final while the backward pass still computes earlier layers.
#define COMM_BUCKET_FLOATS ((size_t)4 << 20)

typedef struct {
    int rank, size;              // this process's rank and the number of ranks (0 and 1 without MPI)
    int local_rank, local_size;  // rank among the ranks on this machine, and their number
    double timeout_s;            // every wait gives up after this long (<= 0: waits forever)
    int mpi;                     // 1 when comm_init initialised MPI (so comm_finalize finalises it)
    size_t bucket_floats;        // floats per collective message; COMM_BUCKET_FLOATS unless changed
    // Payload bytes this rank handed to collectives since init: n*4 per all-reduce or
    // reduce-scatter of n floats, (hi-lo)*4 per all-gather, `bytes` per comm_allgather_bytes (k*8
    // per top-k chunk), bytes per broadcast from this root, n*8 per f64 all-reduce. Nothing is counted when size == 1. These
    // are not wire bytes: a ring all-reduce moves about 2(size-1)/size times its payload.
    uint64_t bytes_sent;
} Comm;

// Initialises MPI when the process was started by a launcher (environment OMPI_COMM_WORLD_SIZE,
// PMI_SIZE or PMIX_RANK present), otherwise sets rank 0 of 1 without touching MPI. Before MPI_Init
// it sets OMPI_MCA_coll_libnbc_iallreduce_algorithm=3 (Rabenseifner) unless already set: Open MPI's
// default nonblocking all-reduce measured 2-4x slower on 16 MiB buckets.
// timeout_s: see Comm.timeout_s (the `dist.timeout_s` setting, 600 by default).
void comm_init(Comm *c, double timeout_s);
// 1 when a launcher started this process (the environment comm_init looks at).
int comm_launched(void);
// Finalises MPI if comm_init initialised it, after a barrier under the timeout (MPI_Finalize has
// none). Every rank must call it.
void comm_finalize(Comm *c);

// Prints "grpo: error: rank R/N: <message>" (just "grpo: error: <message>" when size == 1) and
// ends the whole job with exit status 1 on every rank (MPI_Abort), or this process without MPI.
GRPO_NORETURN void comm_abort(const Comm *c, const char *fmt, ...) GRPO_PRINTF(2, 3);

// Contiguous shard layout used by ZeRO: of n elements, rank r owns [lo, hi). The first n % size
// ranks own n / size + 1 elements, the others n / size (so shards differ by at most one and may be
// empty when n < size). Shards are in rank order and cover [0, n). Inline: the CUDA module's NCCL collectives use
// it too.
static inline void comm_shard(size_t n, int rank, int size, size_t *lo, size_t *hi) {
    size_t base = n / (size_t)size, rem = n % (size_t)size, r = (size_t)rank;
    *lo = r * base + (r < rem ? r : rem);
    *hi = *lo + base + (r < rem ? 1 : 0);
}

// ---- split-phase collectives on float slabs: start now, wait later ----
// Every rank must start the same collectives in the same order with the same n; the waits may
// come in any order. Buffers must stay untouched (and alive) until comm_wait returns.
// `what` names the data for messages ("gradients", "parameters"); it must outlive the op.
typedef struct CommOp CommOp;

// buf[0..n) <- mean over ranks of buf[0..n): the sum (MPI_SUM in bucket-sized pieces) divided by
// size, the same bits on every rank.
CommOp *comm_allreduce_start(Comm *c, float *buf, size_t n, const char *what);
// shard[0..hi-lo) <- mean over ranks of full[lo..hi), with [lo, hi) = comm_shard(n, rank, size).
// full and shard must not overlap.
CommOp *comm_reduce_scatter_start(Comm *c, const float *full, float *shard, size_t n, const char *what);
// full[0..n) <- every rank's shard put at its place: full[lo_r..hi_r) = shard of rank r.
// shard may be a separate buffer of hi-lo floats or exactly full + lo (in place).
CommOp *comm_allgather_start(Comm *c, const float *shard, float *full, size_t n, const char *what);
// Lets MPI advance the op without blocking (Open MPI moves nonblocking collectives forward only
// inside MPI calls, so a caller that overlaps compute should call this now and then, e.g. after each
// layer's backward). Returns 1 when the op is complete (it must still be waited for).
int comm_test(Comm *c, CommOp *op);
// Waits for the op, applies the division by size, and frees the op. It polls MPI without pause
// while buckets keep completing, and backs off to sleeps of up to 1 ms after 20 ms without one. If
// the op is not complete timeout_s after the wait began (time spent computing between start and
// wait does not count), comm_abort ends the job with
//   grpo: error: rank R/N: <what> (<op> of <n> floats) did not complete within T s: another rank is hung or dead
void comm_wait(Comm *c, CommOp *op);

// ---- blocking forms: start + wait ----
void comm_allreduce_mean(Comm *c, float *buf, size_t n, const char *what);
void comm_reduce_scatter_mean(Comm *c, const float *full, float *shard, size_t n, const char *what);
void comm_allgather(Comm *c, const float *shard, float *full, size_t n, const char *what);

typedef enum { COMM_SUM, COMM_MAX, COMM_MIN } CommReduce;
// buf[0..n) <- the element-wise sum / max / min over ranks, for metrics (counts up to 2^53 are exact).
void comm_allreduce_f64(Comm *c, double *buf, size_t n, CommReduce op, const char *what);
// buf[0..bytes) of rank `root` copied to every rank.
void comm_bcast(Comm *c, void *buf, size_t bytes, int root, const char *what);
// Returns once every rank has called it (or aborts after the timeout).
void comm_barrier(Comm *c, const char *what);
// recv[r*bytes .. (r+1)*bytes) <- send[0..bytes) of rank r, for every rank r (bytes <= INT_MAX, the
// same on every rank). Split-phase like the float collectives; the blocking form is start + wait.
CommOp *comm_allgather_bytes_start(Comm *c, const void *send, void *recv, size_t bytes, const char *what);

// Optional CPU pinning of this rank (`dist.pin_cpu`). mode "none": nothing. mode "block": the CPUs
// this process may run on when called (its affinity mask) are split into local_size contiguous
// blocks and this rank (and, through inheritance, its OpenMP threads) is bound to block local_rank;
// with fewer CPUs than local ranks, rank i gets CPU i % ncpu. Launch with `mpirun --bind-to none`,
// otherwise mpirun's own binding (one core per rank for -np <= 2) is the mask being split.
// The binding applies to the calling thread and the threads it creates afterwards: call it right
// after comm_init, before the first OpenMP parallel region or BLAS call starts a thread pool.
// Returns the number of CPUs this rank is bound to (0 for "none"); aborts on an unknown mode or a
// failing sched_setaffinity.
int comm_pin_cpu(Comm *c, const char *mode);

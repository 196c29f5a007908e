#!/usr/bin/python3
"""Gradient all-reduce alone, 1 vs 2 ranks (weak scaling: every rank holds a full gradient of N floats,
one thread per rank), dense and top-k compressed.

usage: /usr/bin/python3 bench/allreduce.py [--tool build/tests/test_comm] [--sizes 1000000 25000000 100000000]
           [--iters 5] [--ratio 0.01] [--mpirun mpirun]

Each configuration runs `test_comm bench --n N --iters I --ratio R` (tests/parallel/test_comm.c): one warm-up
call, then I timed calls of topk_allreduce_mean (ratio 1 takes the dense path: comm_allreduce_mean in
16 MiB buckets), each between barriers; a call's time is the slowest rank's. Reported: median seconds,
algorithm bandwidth N*4/t (GB/s), bus bandwidth = algbw * 2(P-1)/P (what a ring all-reduce moves per
rank), and the payload bytes rank 0 sent per step (Comm.bytes_sent: N*4 dense, k*8 with k = ceil(ratio*N)
for top-k; 0 with one rank, which makes no MPI call at all). Top-k time includes the selection and the
error-feedback residual update. With one rank the "all-reduce" costs only the division by 1 (dense)
or the selection (top-k): weak-scaling efficiency of a step = t_step(1) / (t_step(1) + t_allreduce(2))
when nothing overlaps. OMP_NUM_THREADS=1 per rank; mpirun --bind-to none --oversubscribe.
Not a test: CI runs it once on small sizes (tests/bench/bench_smoke.py) so that it cannot rot.
"""
import argparse
import json
import os
import subprocess


def bench(tool, mpirun, np_, n, iters, ratio):
    cmd = [tool, "bench", "--n", str(n), "--iters", str(iters), "--ratio", str(ratio)]
    if np_ > 1:
        cmd = mpirun + ["-np", str(np_)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads([l for l in out.splitlines() if l.startswith("{")][0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", default="build/tests/test_comm")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 25_000_000, 100_000_000])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--ratio", type=float, default=0.01)
    ap.add_argument("--mpirun", default="mpirun")
    a = ap.parse_args()
    mpirun = [a.mpirun, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none"]
    print(f"{'floats':>11} {'mode':>11} {'ranks':>5} {'median s':>9} {'algbw GB/s':>10} {'busbw GB/s':>10} "
          f"{'bytes/step':>12}")
    for n in a.sizes:
        for ratio in (1.0, a.ratio):
            mode = "dense" if ratio >= 1 else f"topk {ratio:g}"
            for np_ in (1, 2):
                r = bench(a.tool, mpirun, np_, n, a.iters, ratio)
                t = r["median_s"]
                alg = n * 4 / t / 1e9 if t > 0 and np_ > 1 else float("nan")
                bus = alg * 2 * (np_ - 1) / np_
                print(f"{n:>11} {mode:>11} {np_:>5} {t:>9.4f} {alg:>10.2f} {bus:>10.2f} {r['bytes_per_step']:>12}",
                      flush=True)


if __name__ == "__main__":
    main()

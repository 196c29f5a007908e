#!/usr/bin/python3
"""The parallel layer (src/parallel/) against numpy: every collective, run without a launcher (1 rank) and
under `mpirun -np 2` and `-np 3` (uneven shards), and the failure modes (a killed rank, a hung rank,
a rank that aborts) ending the job in bounded time with a non-zero status and a clear message.

usage: comm_test.py --tool build/tests/test_comm --tmp DIR [--mpirun mpirun]

test_comm writes, per rank, its inputs and outputs as raw files and a line per case; the expected
results below are computed from the documented semantics (src/parallel/comm.h, src/parallel/topk.h):
  mean all-reduce      sum over ranks / size, the same bits on every rank (bit-exact against numpy's
                       float32 sum for 1 and 2 ranks, where the order of addition cannot matter;
                       within 1e-6 for 3)
  shard layout         the first n % size ranks own n // size + 1 elements, in rank order
  reduce-scatter       this rank's shard of the mean; all-gather: the shards concatenated
  top-k                per chunk: g = grad + residual, k = ceil(ratio * len) (>= 1), the k largest |g|
                       (NaN largest, ties to the lower index), residual = g with those set to 0, result
                       = sum of the sent values in rank order from 0, / size. Bit-exact.
  bytes_sent           payload bytes: n*4 per all-reduce / reduce-scatter, shard*4 per all-gather,
                       k*8 per top-k chunk, n*8 per f64 all-reduce, bytes for the broadcast root.
"""
import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

results = []


def report(name, ok, detail=""):
    results.append(ok)
    print(f"PASS {name}" if ok else f"FAIL {name}: {detail}", flush=True)


def run(cmd, timeout, env=None):
    """Runs cmd in its own session; kills that session if it outlives timeout. Returns (rc, out, err, secs)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env=env)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err, time.monotonic() - t0
    return p.returncode, out, err, time.monotonic() - t0


def shard_range(n, rank, size):
    sizes = [n // size + (1 if r < n % size else 0) for r in range(size)]
    lo = sum(sizes[:rank])
    return lo, lo + sizes[rank]


def load(tmp, case, rank, step, kind, dtype):
    ext = {np.float32: "f32", np.float64: "f64", np.uint8: "u8"}[dtype]
    return np.fromfile(os.path.join(tmp, f"{case}.r{rank}.s{step}.{kind}.{ext}"), dtype=dtype)


def mean_f32(xs):
    s = np.zeros_like(xs[0], dtype=np.float32)
    for x in xs:
        s = s + x
    return s / np.float32(len(xs))


def close_mean(got, want, size):
    if size <= 2:
        return np.array_equal(got, want, equal_nan=True)
    return got.shape == want.shape and np.allclose(got, want, rtol=0, atol=1e-6, equal_nan=True)


def topk_reference(grads, ratio, chunk):
    """grads[r][s]: rank r's gradient at step s. Returns the expected result per step."""
    size, steps, n = len(grads), len(grads[0]), len(grads[0][0])
    if ratio >= 1:
        return [mean_f32([grads[r][s] for r in range(size)]) for s in range(steps)], 0
    residual = [np.zeros(n, np.float32) for _ in range(size)]
    outs, pairs = [], 0
    for s in range(steps):
        out = np.zeros(n, np.float32)
        for c0 in range(0, n, chunk):
            c1 = min(n, c0 + chunk)
            k = min(c1 - c0, max(1, math.ceil(ratio * (c1 - c0))))
            total = np.zeros(c1 - c0, np.float32)
            for r in range(size):
                g = grads[r][s][c0:c1] + residual[r][c0:c1]
                idx = np.arange(c1 - c0)
                # Primary: NaN first; then larger |g|; then lower index.
                order = np.lexsort((idx, -np.abs(g.astype(np.float64)), ~np.isnan(g)))
                sel = order[:k]
                total[sel] = total[sel] + g[sel]
                left = g.copy()
                left[sel] = 0
                residual[r][c0:c1] = left
                pairs += k if r == 0 else 0
            out[c0:c1] = total / np.float32(size)
        outs.append(out)
    return outs, pairs


def check_pin(tag, tmp, size):
    """comm_pin_cpu "block": the CPUs of the mask at the call, split into local_size contiguous blocks (the
    shard layout), block local_rank for this rank; a rank whose block is empty gets CPU local_rank % ncpu."""
    problems = []
    for r in range(size):
        with open(os.path.join(tmp, f"pin.r{r}.json")) as f:
            p = json.load(f)
        cpus = p["before"]
        lo, hi = shard_range(len(cpus), p["local_rank"], p["local_size"])
        want = cpus[lo:hi] or [cpus[p["local_rank"] % len(cpus)]]
        if p["after"] != want or p["ret"] != len(want):
            problems.append(f"rank {r}: pinned to {p['after']} (returned {p['ret']}), want {want}")
    report(f"{tag} CPU pinning (block)", not problems, "; ".join(problems))


def check_run(tag, tool, tmp, size, launcher):
    if os.path.isdir(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    cmd = launcher + [tool, "check", "--tmp", tmp]
    rc, out, err, secs = run(cmd, 600)
    fails = [l for l in out.splitlines() if l.startswith("FAIL")]
    report(f"{tag} runs (in-binary checks: split-phase = blocking, top-k ratio 1 = dense bit for bit)",
           rc == 0 and not fails, f"rc {rc}, {fails[:3]} {err[-2000:]}")
    if rc != 0:
        return
    cases = []
    for r in range(size):
        with open(os.path.join(tmp, f"cases.r{r}.jsonl")) as f:
            cases.append([json.loads(l) for l in f])
    report(f"{tag} every rank ran the same cases",
           all([(c["case"], c["n"]) for c in cases[r]] == [(c["case"], c["n"]) for c in cases[0]]
               for r in range(size)))
    report(f"{tag} MPI initialised only under a launcher, size {size}",
           all(c["mpi"] == (1 if launcher else 0) and c["size"] == size for cs in cases for c in cs),
           str(cases[0][0]))
    check_pin(tag, tmp, size)
    for i, c0 in enumerate(cases[0]):
        name, op, n = c0["case"], c0["op"], c0["n"]
        per = [cases[r][i] for r in range(size)]
        problems = []
        if op == "allreduce":
            ins = [load(tmp, name, r, 0, "in", np.float32) for r in range(size)]
            outs = [load(tmp, name, r, 0, "out", np.float32) for r in range(size)]
            want = mean_f32(ins)
            if not all(close_mean(o, want, size) for o in outs):
                problems.append(f"mean differs: max |diff| {max(float(np.max(np.abs(o - want), initial=0)) for o in outs)}")
            if not all(np.array_equal(o, outs[0]) for o in outs):
                problems.append("ranks disagree")
            expect_bytes = [n * 4] * size
        elif op.startswith("f64_"):
            ins = np.stack([load(tmp, name, r, 0, "in", np.float64) for r in range(size)])
            outs = [load(tmp, name, r, 0, "out", np.float64) for r in range(size)]
            want = {"f64_sum": ins.sum(0), "f64_max": ins.max(0), "f64_min": ins.min(0)}[op]
            if not all(np.allclose(o, want, rtol=1e-15, atol=1e-12) for o in outs):
                problems.append(f"{outs[0]} vs {want}")
            expect_bytes = [n * 8] * size
        elif op == "reduce_scatter":
            ins = [load(tmp, name, r, 0, "in", np.float32) for r in range(size)]
            want = mean_f32(ins)
            for r in range(size):
                lo, hi = shard_range(n, r, size)
                got = load(tmp, name, r, 0, "out", np.float32)
                if not close_mean(got, want[lo:hi], size):
                    problems.append(f"rank {r} shard [{lo},{hi}) wrong")
            expect_bytes = [n * 4] * size
        elif op == "allgather":
            shards = [load(tmp, name, r, 0, "in", np.float32) for r in range(size)]
            want = np.concatenate(shards)
            for r in range(size):
                lo, hi = shard_range(n, r, size)
                if len(shards[r]) != hi - lo:
                    problems.append(f"rank {r} shard has {len(shards[r])} floats, want {hi - lo}")
                if not np.array_equal(load(tmp, name, r, 0, "out", np.float32), want):
                    problems.append(f"rank {r} gathered wrong")
            expect_bytes = [(shard_range(n, r, size)[1] - shard_range(n, r, size)[0]) * 4 for r in range(size)]
        elif op == "bcast":
            root = c0["chunk"]
            want = load(tmp, name, root, 0, "in", np.uint8)
            if not all(np.array_equal(load(tmp, name, r, 0, "out", np.uint8), want) for r in range(size)):
                problems.append("broadcast differs from the root's bytes")
            expect_bytes = [n if r == root else 0 for r in range(size)]
        elif op == "topk":
            steps, ratio, chunk = c0["steps"], c0["ratio"], c0["chunk"]
            grads = [[load(tmp, name, r, s, "in", np.float32) for s in range(steps)] for r in range(size)]
            want, pairs = topk_reference(grads, ratio, chunk)
            for s in range(steps):
                for r in range(size):
                    got = load(tmp, name, r, s, "out", np.float32)
                    ok = close_mean(got, want[s], size) if ratio >= 1 else np.array_equal(got, want[s], equal_nan=True)
                    if not ok:
                        bad = np.flatnonzero(~np.isclose(got, want[s], equal_nan=True))[:5]
                        problems.append(f"step {s} rank {r}: at {bad.tolist()} got {got[bad]} want {want[s][bad]}")
            if name == "topk_nan" and not np.isnan(want[1][7]):
                problems.append("the NaN was not sent")
            expect_bytes = [(steps * n * 4 if ratio >= 1 else pairs * 8)] * size
        else:
            problems.append(f"unknown op {op}")
            expect_bytes = [0] * size
        if size == 1:
            expect_bytes = [0]
        got_bytes = [p["bytes"] for p in per]
        if got_bytes != expect_bytes:
            problems.append(f"bytes_sent {got_bytes}, want {expect_bytes}")
        report(f"{tag} {name} ({op}, n={n})", not problems, "; ".join(problems[:4]))


def fail_run(tool, mpirun, mode, timeout_s, bound_s, expect):
    cmd = mpirun + ["-np", "2", tool, "fail", "--mode", mode, "--timeout", str(timeout_s)]
    rc, out, err, secs = run(cmd, bound_s + 60)
    name = f"np2 {mode} rank: job ends non-zero within {bound_s} s"
    report(name, rc not in (None, 0) and secs <= bound_s, f"rc {rc} after {secs:.1f} s; stderr: {err[-1500:]}")
    if expect:
        report(f"np2 {mode} rank: message '{expect}'", expect in err, f"stderr: {err[-1500:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    a = ap.parse_args()
    mpirun = [a.mpirun, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none"]
    # The launcher's variables must not leak in from an enclosing mpirun.
    for k in list(os.environ):
        if k.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_")):
            del os.environ[k]
    os.environ["OMP_NUM_THREADS"] = "1"
    check_run("np1 (no launcher)", a.tool, os.path.join(a.tmp, "np1"), 1, [])
    check_run("np2", a.tool, os.path.join(a.tmp, "np2"), 2, mpirun + ["-np", "2"])
    check_run("np3", a.tool, os.path.join(a.tmp, "np3"), 3, mpirun + ["-np", "3"])
    fail_run(a.tool, mpirun, "hang", 3, 3 + 12,
             "grpo: error: rank 0/2: gradients (all-reduce of 1048576 floats) did not complete within 3 s: "
             "another rank is hung or dead")
    fail_run(a.tool, mpirun, "kill", 5, 5 + 12, None)
    fail_run(a.tool, mpirun, "abort", 30, 12, "grpo: error: rank 1/2: test abort from rank 1")
    passed, failed = results.count(True), results.count(False)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

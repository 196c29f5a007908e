#!/usr/bin/python3
"""Data-parallel training under Open MPI: `mpirun -np 2 grpo train|sft` against the same run in one process.

usage: /usr/bin/python3 tests/train/dist_train_test.py --grpo PATH --tokenizer tokenizer.json --tmp DIR [--sanitized]

--sanitized (the ASan build's run): without the two 12-step top-k runs whose losses are compared (the release
build's check; the sparse top-k's code runs under ASan in dist_comm), and each comparison at one ZeRO level
(GRPO's and GRPO-LoRA's 2, SFT's 0, SFT-LoRA's and fp16's 1; the checkpoint runs' 1): every level and mode
still runs under ASan, their equality with one process is the release build's to prove. The -np 2 runs under
ASan were the longest test that runs alone.

Checks (weights compared per tensor as max|a - b| / max|a|, read here with numpy):
  grpo / sft   -np 2 with ZeRO 0, 1 and 2 (SFT also in fp16 with loss scaling) ends within 1e-5 of -np 1 with the same global batch after 3
               steps (GRPO: 4 prompts x 2 samples, mini-batches of 2 prompts, 2 epochs, KL k3; the same
               rollouts, so the same per-step rewards); the weights moved far more than the tolerance.
  top-k        compression.ratio 1 ("keep everything") gives the uncompressed run's bytes; ratio 0.05
               (error feedback) still lowers the SFT loss like the dense run does.
  checkpoint   a ZeRO-1 -np 2 run resumed from its checkpoint equals the uninterrupted run byte for byte,
               and its checkpoint holds the same files and tensor shapes as a single-process one.
  failures     with dist.timeout_s 5: a rank stopped with SIGSTOP mid-run makes the job exit non-zero
               within the timeout (+ margin) with one line naming the stuck collective; a rank killed
               with SIGKILL ends the job non-zero, also in bounded time.
Every run packs the same micro-batches (2 responses per forward): this deliberately aggressive
configuration (lr 1e-3, ratio clipping active) turns the float rounding of a different packing into
~1e-2 differences after 3 steps even in one process, so only equal packing can be compared at 1e-5.
Adam's eps is 1e-5 here: k_proj's bias has a gradient that is zero in exact arithmetic (softmax
ignores a shift shared by all keys), so its float noise differs with the summation order, and a tiny
eps would turn that noise into full-size Adam steps.
Prints one line per check and `N passed, M failed`; exit 0 iff all pass.
"""
import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from harness import check, summary  # noqa: E402

TOL = 1e-5
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none"]


def load(d, name="model.safetensors"):
    b = open(os.path.join(d, name), "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k != "__metadata__":
            s, e = v["data_offsets"]
            assert v["dtype"] == "F32", (k, v["dtype"])
            out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(v["shape"]).astype(np.float64)
    return out


def worst_diff(a, b):
    return max((float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30)), k) for k in a)


def run(args, np_=1, env=None, timeout=600):
    cmd = (MPIRUN + ["-np", str(np_)] if np_ > 1 else []) + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr[-1500:]}")
    return p


def rank_pid(mpirun_pid, rank):
    """The pid of rank `rank` among mpirun's children (Open MPI sets OMPI_COMM_WORLD_RANK)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if ppid == mpirun_pid and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(pid)
    return None


def failure(name, sig, args, tmp, env, attempt=1):
    """Starts a long run under -np 2, waits for its first step, sends sig to rank 1."""
    out = os.path.join(tmp, f"{name}-{attempt}")
    p = subprocess.Popen(MPIRUN + ["-np", "2"] + args + ["trainer.out_dir=" + out], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    metrics = os.path.join(out, "metrics.jsonl")
    t0 = time.time()
    started = lambda: os.path.exists(metrics) and os.path.getsize(metrics) > 0  # noqa: E731
    while time.time() - t0 < 120 and p.poll() is None and not started():
        time.sleep(0.2)
    pid = rank_pid(p.pid, 1) if p.poll() is None else None
    if pid is None:
        p.kill()
        _, err = p.communicate()
        # A job that ended before any signal (Open MPI's start-up on a busy machine has failed once in many
        # runs) gets one more try; the detail shows how it ended.
        if attempt == 1 and p.returncode not in (None, -signal.SIGKILL):
            return failure(name, sig, args, tmp, env, 2)
        check(f"failure/{name}: found rank 1", False, f"no rank 1 under mpirun after {time.time() - t0:.0f} s; "
              f"the job ended {p.returncode}: {err.strip()[-600:]!r}")
        return None
    os.kill(pid, sig)
    t1 = time.time()
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        os.kill(pid, signal.SIGKILL)
        check(f"failure/{name}: the job ends", False, "still running 60 s after the signal")
        return None
    return p.returncode, time.time() - t1, err


def top_k_trains(long, T, env):
    """A sparse top-k (5%, error feedback) still lowers the SFT loss over 12 steps like the dense run does."""
    run(long + ["--out", T("s2dense")], 2, env)
    run(long + ["--out", T("s2k05"), "--topk-ratio", "0.05"], 2, env)
    loss = lambda d: [m["loss"] for m in map(json.loads, open(os.path.join(d, "metrics.jsonl")))]  # noqa: E731
    ld, lk = loss(T("s2dense")), loss(T("s2k05"))
    drop = lambda l: (sum(l[:3]) - sum(l[-3:])) / 3  # noqa: E731
    check("topk/ratio-0.05 still lowers the loss", drop(lk) > 0.25 * drop(ld) and drop(lk) > 0,
          f"loss first/last 3 steps: dense {sum(ld[:3]) / 3:.3f} -> {sum(ld[-3:]) / 3:.3f}, "
          f"top-k 5% {sum(lk[:3]) / 3:.3f} -> {sum(lk[-3:]) / 3:.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--sanitized", action="store_true")
    a = ap.parse_args()
    grpo = os.path.abspath(a.grpo)
    tmp = os.path.abspath(a.tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    T = lambda *p: os.path.join(tmp, *p)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    model = T("model")
    run([grpo, "init", "--out", model, "--tokenizer", a.tokenizer, "--seed", "5"])
    init = load(model)
    r = random.Random(7)
    with open(T("prompts.jsonl"), "w") as f:
        for i in range(16):
            f.write(json.dumps({"prompt": f"{r.randrange(100)} + {r.randrange(100)} =", "answer": "x"}) + "\n")
    with open(T("sft.jsonl"), "w") as f:
        for _ in range(32):
            f.write(json.dumps({"prompt_ids": [r.randrange(1000) for _ in range(r.randrange(2, 8))],
                                "completion_ids": [r.randrange(1000) for _ in range(r.randrange(1, 12))]}) + "\n")

    # ---- GRPO: -np 2 (ZeRO 0/1/2) == -np 1
    g = [grpo, "train", "model.path=" + model, "data.train_file=" + T("prompts.jsonl"), "data.chat_template=false",
         "data.max_response_length=6", "rollout.n=2", "data.train_batch_size=4", "actor.mini_batch_size=2",
         "actor.ppo_epochs=2", "actor.micro_batch_size=2", "trainer.steps=3", "trainer.val_before_train=false", "actor.lr=1e-3",
         "actor.adam_eps=1e-5", "actor.kl_loss_coef=0.05", "trainer.seed=3", "reward.gsm8k.weight=0",
         "reward.format.weight=1", "reward.format.regex=.*[aeiou].*[aeiou].*[aeiou].*"]
    run(g + ["trainer.out_dir=" + T("g1")], env=env)
    w1 = load(T("g1"))
    r1 = [m["reward_mean"] for m in map(json.loads, open(T("g1", "metrics.jsonl")))]
    moved = worst_diff(w1, init)[0]
    for zero in (2,) if a.sanitized else (0, 1, 2):
        out = T(f"g2z{zero}")
        try:
            run(g + ["trainer.out_dir=" + out, f"dist.zero={zero}"], 2, env)
        except RuntimeError as e:
            check(f"grpo/np2-zero{zero}: runs", False, str(e))
            continue
        d, k = worst_diff(w1, load(out))
        r2 = [m["reward_mean"] for m in map(json.loads, open(os.path.join(out, "metrics.jsonl")))]
        check(f"grpo/np2-zero{zero} == np1 after 3 steps", d <= TOL and moved > 100 * TOL and r2 == r1,
              f"max rel {d:.1e} ({k}); weights moved {moved:.1e}; rewards per step {r2} vs {r1}")

    # ---- SFT: -np 2 (ZeRO 0/1/2) == -np 1
    s = [grpo, "sft", "--model", model, "--data", T("sft.jsonl"), "--steps", "3", "--batch-size", "8",
         "--micro-batch-size", "2", "--lr", "1e-3", "--adam-eps", "1e-5", "--no-shuffle"]
    run(s + ["--out", T("s1")], env=env)
    s1 = load(T("s1"))
    for zero in (0,) if a.sanitized else (0, 1, 2):
        out = T(f"s2z{zero}")
        try:
            run(s + ["--out", out, "--zero", str(zero)], 2, env)
        except RuntimeError as e:
            check(f"sft/np2-zero{zero}: runs", False, str(e))
            continue
        d, k = worst_diff(s1, load(out))
        check(f"sft/np2-zero{zero} == np1 after 3 steps", d <= TOL, f"max rel {d:.1e} ({k})")

    # ---- LoRA: the adapters' slab is what is all-reduced, ZeRO-sharded and top-k compressed
    ad = "adapter_model.safetensors"
    lg = g + ["actor.lora.rank=4", "actor.lora.alpha=8", "actor.lora.base_dtype=f32"]
    run(lg + ["trainer.out_dir=" + T("lg1")], env=env)
    lw1 = load(T("lg1"), ad)
    moved = max(float(np.abs(v).max()) for k, v in lw1.items() if "lora_B" in k)  # B starts at zero
    for zero in (2,) if a.sanitized else (0, 2):
        out = T(f"lg2z{zero}")
        run(lg + ["trainer.out_dir=" + out, f"dist.zero={zero}"], 2, env)
        d, k = worst_diff(lw1, load(out, ad))
        check(f"grpo-lora/np2-zero{zero} == np1 after 3 steps", d <= TOL and moved > 100 * TOL,
              f"max rel {d:.1e} ({k}); B moved to {moved:.1e}")
    ls = s + ["--lora-rank", "4", "--lora-base-dtype", "f32"]
    run(ls + ["--out", T("ls1")], env=env)
    for zero, extra in ((1, []),) if a.sanitized else ((1, []), (0, ["--topk-ratio", "1"])):
        out = T(f"ls2z{zero}{len(extra)}")
        run(ls + ["--out", out, "--zero", str(zero)] + extra, 2, env)
        d, k = worst_diff(load(T("ls1"), ad), load(out, ad))
        check(f"sft-lora/np2-zero{zero}{' topk 1' if extra else ''} == np1 after 3 steps", d <= TOL,
              f"max rel {d:.1e} ({k})")

    # fp16 with a loss scale: every rank must unscale, check and clip the same way (ZeRO shards too)
    run(s + ["--out", T("s1h"), "--precision", "fp16"], env=env)
    for zero in (1,) if a.sanitized else (1, 2):
        out = T(f"s2z{zero}h")
        run(s + ["--out", out, "--zero", str(zero), "--precision", "fp16"], 2, env)
        d, k = worst_diff(load(T("s1h")), load(out))
        n1 = [m["grad_norm"] for m in map(json.loads, open(T("s1h", "metrics.jsonl")))]
        n2 = [m["grad_norm"] for m in map(json.loads, open(os.path.join(out, "metrics.jsonl")))]
        close = all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(n1, n2))
        # The fp16 compute copy rounds to 11 significant bits: a master-weight difference at the
        # float32 noise level can flip one fp16 rounding, so weights agree to fp16's resolution.
        check(f"sft/np2-zero{zero}-fp16 == np1 fp16 (grad norms 1e-5, weights 2^-11)", d <= 2 ** -11 and close,
              f"max rel {d:.1e} ({k}); grad norms {n2} vs {n1}")

    # ---- top-k: ratio 1 reproduces the dense run; a sparse ratio still trains
    run(s + ["--out", T("s2k1"), "--topk-ratio", "1"], 2, env)
    same = open(T("s2k1", "model.safetensors"), "rb").read() == open(T("s2z0", "model.safetensors"), "rb").read()
    check("topk/ratio-1 == dense (bytes)", same)
    long = [x if x != "3" else "12" for x in s]
    if not a.sanitized:
        top_k_trains(long, T, env)

    # ---- checkpoints: ZeRO-1 under -np 2 resumes exactly; its files are a single-process checkpoint's
    c = g + ["trainer.save_every=1", "dist.zero=1"]
    run(c + ["trainer.out_dir=" + T("c2"), "trainer.steps=1"], 2, env)
    run(c + ["trainer.out_dir=" + T("c2"), "trainer.resume=true"], 2, env)
    run(c + ["trainer.out_dir=" + T("c2full")], 2, env)
    same = open(T("c2", "model.safetensors"), "rb").read() == open(T("c2full", "model.safetensors"), "rb").read()
    check("checkpoint/np2-zero1 resumed == uninterrupted (bytes)", same)
    run(g + ["trainer.out_dir=" + T("c1"), "trainer.save_every=1", "trainer.steps=1"], env=env)
    latest = lambda d: os.path.join(d, max((x for x in os.listdir(d) if x.startswith("checkpoint-")),
                                           key=lambda x: int(x.split("-")[1])))
    k1, k2 = latest(T("c1")), latest(T("c2full"))
    f1, f2 = sorted(os.listdir(k1)), sorted(os.listdir(k2))
    o1, o2 = load(k1, "optimizer.safetensors"), load(k2, "optimizer.safetensors")
    shapes = {k: v.shape for k, v in o1.items()} == {k: v.shape for k, v in o2.items()}
    check("checkpoint/np2-zero1 files and moment shapes == np1's", f1 == f2 and shapes, f"{f2}")

    # ---- failures end the job, never hang it
    long_run = g + ["trainer.steps=100000", "dist.timeout_s=5"]
    res = failure("stopped-rank", signal.SIGSTOP, long_run, tmp, env)
    if res:
        rc, secs, err = res
        msg = [l for l in err.splitlines() if l.startswith("grpo: error:")]
        check("failure/SIGSTOP rank 1: exit non-zero within timeout + 15 s, naming the collective",
              rc != 0 and secs <= 20 and msg and "did not complete within 5 s" in msg[0],
              f"exit {rc} after {secs:.1f} s; {msg[:1]}")
    res = failure("killed-rank", signal.SIGKILL, long_run, tmp, env)
    if res:
        rc, secs, err = res
        said = [l.strip() for l in err.splitlines() if "signal 9" in l or "rank 1/2" in l]
        check("failure/SIGKILL rank 1: exit non-zero within timeout + 15 s, saying which rank died", rc != 0
              and secs <= 20 and said, f"exit {rc} after {secs:.1f} s; {said[:1]}")
    sys.exit(summary())


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Two grpo binaries on the same work, in the same run: is a change slower? (the refactor's check)

usage: /usr/bin/python3 bench/ab.py --old OLD/grpo --new build/grpo [--model DIR] [--repeats 5]
           [--threads N] [--load]
For f32 and bf16, each binary in turn (old, new, new, old, ...: a noisy minute weighs on both, and neither
always runs second):
  prefill  `grpo score`, 2 sequences x 256 tokens per forward: the second forward of each process
  decode   `grpo generate` greedy, batch 1, prompt 64, 24 new tokens (decode_tokens_per_second)
  train    `grpo sft`, 3 steps of B=2 x 128 tokens: steps 2 and 3 of each process (elapsed_s)
Prints the medians (tokens/s) and new / old. --load first starts one competing single-threaded busy
loop for the whole run. Model: bench/cpu.py's qwen2.5-0.5b-shaped random weights (made on first use).
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--old", required=True)
ap.add_argument("--new", required=True)
ap.add_argument("--model", default="/tmp/grpo-bench-qwen2.5-0.5b-f32")
ap.add_argument("--repeats", type=int, default=5)
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--load", action="store_true")
a = ap.parse_args()
env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
if not os.path.exists(os.path.join(a.model, "model.safetensors")):
    subprocess.run([a.new, "init", "--out", a.model, "--preset", "qwen2.5-0.5b"], check=True)
tmp = tempfile.mkdtemp(prefix="grpo-ab-")
rng = random.Random(1)
B, T = 2, 256
score_in = "".join(json.dumps({"tokens": [rng.randrange(151936) for _ in range(T)]}) + "\n" for _ in range(B)) * 2
decode_in = json.dumps({"tokens": [rng.randrange(151936) for _ in range(64)]}) + "\n"
data = os.path.join(tmp, "sft.jsonl")
with open(data, "w") as f:
    for _ in range(6):
        ids = [rng.randrange(151936) for _ in range(128)]
        f.write(json.dumps({"prompt_ids": ids[:16], "completion_ids": ids[16:]}) + "\n")


def run(cmd, stdin=""):
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-600:]}")
    return p


def prefill(grpo, dt):
    p = run([grpo, "score", "--model", a.model, "--stats", "--dtype", dt, "--batch-tokens", str(B * T)], score_in)
    return [B * T / json.loads(p.stderr.strip().splitlines()[-1])["batch_seconds"][-1]]


def decode(grpo, dt):
    p = run([grpo, "generate", "--model", a.model, "--jsonl", "--stats", "--temperature", "0", "--max-new-tokens",
             "24", "--dtype", dt], decode_in)
    return [json.loads(p.stderr.strip().splitlines()[-1])["decode_tokens_per_second"]]


def train(grpo, dt):
    out = os.path.join(tmp, "out")
    shutil.rmtree(out, ignore_errors=True)
    run([grpo, "sft", "--model", a.model, "--data", data, "--out", out, "--steps", "3", "--batch-size", "2",
         "--no-shuffle", "--lr", "1e-5", "--precision", "bf16" if dt == "bf16" else "fp32"])
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [2 * 128 / json.loads(line)["elapsed_s"] for line in f if line.strip()][1:]


load = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if a.load else None
try:
    print(f"{'':16} {'old tok/s':>10} {'new tok/s':>10} {'new/old':>8}   ({a.repeats} repeats, {a.threads} threads"
          f"{', under one busy loop' if a.load else ''})")
    for name, fn in (("prefill", prefill), ("decode b1", decode), ("train step", train)):
        for dt in ("f32", "bf16"):
            got = {"old": [], "new": []}
            for i in range(a.repeats):
                for side in ("old", "new") if i % 2 == 0 else ("new", "old"):  # neither always runs second
                    got[side] += fn(getattr(a, side), dt)
            old, new = statistics.median(got["old"]), statistics.median(got["new"])
            print(f"{name + ' ' + dt:16} {old:10.1f} {new:10.1f} {new / old:8.3f}", flush=True)
finally:
    if load:
        load.kill()
    shutil.rmtree(tmp, ignore_errors=True)

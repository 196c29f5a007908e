#!/usr/bin/env python3
"""GPU benchmark: `grpo --device cuda` against transformers on the same GPU, in the same run.

usage: python3 bench/cuda.py --grpo build/grpo --tmp DIR [--shapes qwen2.5-0.5b qwen2.5-7b] [--repeats 3]

Ceilings (this run, torch on this GPU): bf16 matmul 8192^3 TFLOP/s and device copy bandwidth (bytes read
plus bytes written per second, over a 4 GiB copy). Models: random, made by transformers (tests/cuda/hf_parity.py).
  prefill  `grpo score --device cuda`, 4 sequences x 512 tokens per forward (median over --repeats), against
           a transformers bf16 forward of the same batch; TFLOP/s against the matmul ceiling
  decode   `grpo generate --device cuda --temperature 0`, prompt 128, 256 new tokens, batch 1 / 64 / 256
           (decode_tokens_per_second of --stats), against transformers' greedy generate (bf16, 256 new tokens
           forced); at batch 1 the weight bytes read per second against the copy bandwidth
Goals (issue 14): 7B batch-1 decode >= 80% of the copy bandwidth; batched decode and prefill >= 3x
transformers; prefill >= 50% of the bf16 ceiling. Medians; not a test. Without torch, transformers or a
GPU it prints SKIPPED and exits 77 (hf_parity's import does that).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "cuda"))
from hf_parity import SHAPES, load_hf, make_model  # noqa: E402  (first: SKIPPED, exit 77, without torch/GPU)
import torch  # noqa: E402


def cuda_time(fn, reps):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ceilings():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    t = cuda_time(lambda: a @ b, 10)
    x = torch.empty(1 << 31, device="cuda", dtype=torch.int16)  # 4 GiB
    y = torch.empty_like(x)
    y.copy_(x)
    c = cuda_time(lambda: y.copy_(x), 10)
    del a, b, x, y
    torch.cuda.empty_cache()
    return {"tflops": 2 * 8192 ** 3 / t / 1e12, "copy_gbps": 2 * (1 << 32) / c / 1e9}


def flops_per_token(s, T):
    C, I, L, H, KVH = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["num_attention_heads"], \
        s["num_key_value_heads"]
    D = s.get("head_dim", C // H)
    per_layer = 2 * C * (H * D + 2 * KVH * D) + 2 * H * D * C + 6 * C * I + 2 * 2 * H * D * (T + 1) / 2
    return L * per_layer + 2 * C * s["vocab_size"]


def grpo_stats(a, args, lines):
    p = subprocess.run([a.grpo] + args + ["--stats"], input=lines, capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        sys.exit(f"FAIL: grpo {' '.join(args[:3])} exited {p.returncode}: {p.stderr.strip()[-600:]}")
    n, want = sum(1 for l in p.stdout.splitlines() if l.strip()), lines.count("\n")
    if n != want:
        sys.exit(f"FAIL: grpo {' '.join(args[:3])} wrote {n} records for {want} input lines")
    return json.loads(p.stderr.strip().splitlines()[-1])


def bench_shape(a, shape, ceil):
    d = os.path.join(a.tmp, shape)
    if os.path.isfile(os.path.join(d, "config.json")):  # hf_parity.py's model of this shape, reused
        m = load_hf(shape, d, torch.bfloat16)  # the baseline in bf16 on any transformers version
    else:
        m = make_model(d, shape, 7)
    s = SHAPES[shape]
    V = s["vocab_size"]
    weights = sum(p.numel() for p in m.parameters()) * 2  # bf16 bytes, each read once per decode step
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (4, 512), generator=g)
    lines = "".join(json.dumps({"tokens": r}) + "\n" for r in ids.tolist()) * a.repeats
    st = grpo_stats(a, ["score", "--model", d, "--device", "cuda", "--batch-tokens", "2048"], lines)
    ours = 2048 / statistics.median(st["batch_seconds"])
    ids_cuda = ids.cuda()
    with torch.no_grad():
        hf = 2048 / cuda_time(lambda: m(input_ids=ids_cuda).logits, a.repeats)
    tf = ours * flops_per_token(s, 512) / 1e12
    print(f"{shape} prefill: grpo {ours:.0f} tok/s ({tf:.0f} TFLOP/s = {tf / ceil['tflops']:.0%} of the ceiling), "
          f"transformers {hf:.0f} tok/s, ratio {ours / hf:.2f}x", flush=True)
    for B in (1, 64, 256):
        prompts = torch.randint(0, V, (B, 128), generator=g)
        pl = "".join(json.dumps({"tokens": r}) + "\n" for r in prompts.tolist())
        st = grpo_stats(a, ["generate", "--model", d, "--device", "cuda", "--jsonl", "--temperature", "0",
                            "--max-new-tokens", "256"], pl)
        ours = st["decode_tokens_per_second"]
        pc = prompts.cuda()
        with torch.no_grad():
            secs = cuda_time(lambda: m.generate(input_ids=pc, do_sample=False, max_new_tokens=256, min_new_tokens=256),
                             1)
        hf = B * 256 / secs  # includes its prefill: a slight advantage to us, said here
        extra = ""
        if B == 1:
            gbps = ours * weights / 1e9
            extra = f"; weights read {gbps:.0f} GB/s = {gbps / ceil['copy_gbps']:.0%} of the copy bandwidth"
        print(f"{shape} decode b{B}: grpo {ours:.0f} tok/s, transformers {hf:.0f} tok/s (its prefill included), "
              f"ratio {ours / hf:.2f}x{extra}", flush=True)
    del m
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--shapes", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-7b"], choices=list(SHAPES))
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    ceil = ceilings()
    print(f"{torch.cuda.get_device_name()}: bf16 matmul {ceil['tflops']:.0f} TFLOP/s, copy {ceil['copy_gbps']:.0f} GB/s",
          flush=True)
    for shape in a.shapes:
        bench_shape(a, shape, ceil)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Prefill benchmark: `grpo score` vs PyTorch on the same qwen2.5-0.5b-shaped weights, same run.

usage: /usr/bin/python3 bench/prefill.py [--grpo build/grpo] [--model DIR] [--lengths 128 512]
           [--batch-tokens 2048] [--repeats 5] [--threads N]

Both sides compute per-token logprobs of B sequences of length T (B*T = --batch-tokens) with
OpenBLAS sgemm and --threads threads (default: all cores). PyTorch runs the batched reference
forward (tests/reference/qwen2_ref.py weights, float32, full (B,T,V) logits as HF does).
Reports the median tokens/s over --repeats forward passes and the achieved GFLOP/s.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "reference"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import qwen2_ref as ref  # noqa: E402


def flops_per_token(m, T):
    """Matmul FLOPs of one token's forward incl. the LM head, plus causal attention (avg T/2 keys)."""
    C, I, V, H, KVH, D = m.C, m.cfg["intermediate_size"], m.V, m.H, m.KVH, m.D
    per_layer = 2 * C * (H * D + 2 * KVH * D) + 2 * H * D * C + 2 * 3 * C * I + 2 * 2 * H * D * (T + 1) / 2
    return len(m.layers) * per_layer + 2 * C * V


def torch_forward_logprobs(m, ids):
    """Batched (B, T) forward in the reference's ops; returns (B, T-1) logprobs."""
    z = torch_hidden(m, ids)[:, :-1] @ m.lm_head.t()
    return z.gather(2, ids[:, 1:, None])[..., 0] - torch.logsumexp(z, -1)


def torch_hidden(m, ids):
    """Batched (B, T) forward in the reference's ops up to the final norm: (B, T, C)."""
    B, T = ids.shape
    H, KVH, D = m.H, m.KVH, m.D
    cos, sin = ref.rope_cos_sin(T, D, m.theta, m.dtype, m.inv_freq)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    x = m.embed[ids]
    for L in m.layers:
        h = ref.rms_norm(x, L["ln1"], m.eps)
        q = F.linear(h, L["wq"], L["bq"]).view(B, T, H, D)
        k = F.linear(h, L["wk"], L["bk"]).view(B, T, KVH, D)
        if L["qn"] is not None:  # Qwen3: each head's query and key normed over D, before RoPE
            q, k = ref.rms_norm(q, L["qn"], m.eps), ref.rms_norm(k, L["kn"], m.eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = F.linear(h, L["wv"], L["bv"]).view(B, T, KVH, D).transpose(1, 2)
        q = q * cos + ref.rotate_half(q) * sin
        k = k * cos + ref.rotate_half(k) * sin
        k = k.repeat_interleave(H // KVH, 1)
        v = v.repeat_interleave(H // KVH, 1)
        s = (q @ k.transpose(2, 3)) * (1.0 / math.sqrt(D))
        a = torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v
        x = x + F.linear(a.transpose(1, 2).reshape(B, T, H * D), L["wo"])
        h = ref.rms_norm(x, L["ln2"], m.eps)
        x = x + F.linear(F.silu(F.linear(h, L["wg"])) * F.linear(h, L["wu"]), L["wd"])
    return ref.rms_norm(x, m.norm, m.eps)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grpo", default=os.path.join(here, "..", "build", "grpo"))
    ap.add_argument("--model", default="/tmp/grpo-bench-qwen2.5-0.5b")
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        print(f"creating {a.model} (qwen2.5-0.5b preset, bf16 file)", file=sys.stderr)
        subprocess.run([a.grpo, "init", "--out", a.model, "--preset", "qwen2.5-0.5b", "--dtype", "bf16"], check=True)
    torch.set_num_threads(a.threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    m = ref.load_model(a.model, torch.float32)
    g = torch.Generator().manual_seed(0)
    print(f"threads={a.threads} OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} "
          f"torch={torch.__version__}")
    print(f"{'T':>5} {'B':>4} {'grpo tok/s':>11} {'GFLOP/s':>8} {'torch tok/s':>12} {'GFLOP/s':>8} {'ratio':>6}")
    for T in a.lengths:
        B = max(1, a.batch_tokens // T)
        ids = torch.randint(0, m.V, (B, T), generator=g)
        lines = "".join(json.dumps({"tokens": row}) + "\n" for row in ids.tolist()) * a.repeats
        p = subprocess.run([a.grpo, "score", "--model", a.model, "--stats", "--batch-tokens", str(B * T)],
                           input=lines, capture_output=True, text=True, env=env, check=True)
        stats = json.loads(p.stderr.strip().splitlines()[-1])
        assert len(stats["batch_seconds"]) == a.repeats, stats
        grpo_tps = B * T / statistics.median(stats["batch_seconds"])
        times = []
        with torch.no_grad():
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                torch_forward_logprobs(m, ids)
                times.append(time.perf_counter() - t0)
        torch_tps = B * T / statistics.median(times)
        fpt = flops_per_token(m, T)
        print(f"{T:5d} {B:4d} {grpo_tps:11.1f} {grpo_tps * fpt / 1e9:8.1f} {torch_tps:12.1f} "
              f"{torch_tps * fpt / 1e9:8.1f} {grpo_tps / torch_tps:6.2f}")


if __name__ == "__main__":
    main()

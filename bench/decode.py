#!/usr/bin/python3
"""Decode benchmark: `grpo generate` vs a batched KV-cache greedy decode in PyTorch, same weights, same run.

usage: /usr/bin/python3 bench/decode.py [--grpo build/grpo] [--model DIR] [--batches 1 8 64] [--prompt 128]
           [--new 128] [--threads N] [--torch-max-tokens 512] [--group-new 16]

For each batch size B: B random prompts of --prompt tokens, greedy, --new tokens each. grpo's figure is
decode_tokens_per_second from `--stats` (prefill excluded). PyTorch (float32, same threads) prefills the
B x prompt batch, then runs single-token steps over concatenated K/V caches; only the steps are timed.
PyTorch at large B is slow on few cores, so it runs at most --torch-max-tokens (B x steps) decode tokens;
the table says how many steps each side ran. GFLOP/s counts 2 x non-embedding params + 2 x C x V (head)
+ attention over the average context, per token; GB/s counts fp32 weights read once per step plus the
KV cache read by each sequence (grpo's kv_bytes_per_token), per step.
Then G=8 sampling (8 prompts x --n 8, T=1, --group-new tokens) with and without --no-shared-prefill.

--kv-compare [--repeats R]: instead, grpo alone with --kv-cache-dtype fp32 and bf16 taking turns (R runs each),
for each batch size: median decode tokens/s, the KV cache's MiB, bf16 / fp32, and the sequences whose greedy
tokens agree.
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
# the reference model lives in tests/reference
sys.path[0] = os.path.join(here, "..", "tests", "reference")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import qwen2_ref as ref  # noqa: E402


def torch_greedy(m, ids, steps):
    """Greedy decode of a (B, P) batch with a KV cache; returns (B, steps) tokens and the seconds of
    the decode steps (the prefill, which also yields the first token, is not timed)."""
    B, P = ids.shape
    H, KVH, D = m.H, m.KVH, m.D
    G = H // KVH
    cos, sin = ref.rope_cos_sin(P + steps, D, m.theta, m.dtype, m.inv_freq)
    cache = [None] * len(m.layers)

    def forward(x_ids, pos):
        T = x_ids.shape[1]
        c, s = cos[pos:pos + T], sin[pos:pos + T]
        x = m.embed[x_ids]
        for i, L in enumerate(m.layers):
            h = ref.rms_norm(x, L["ln1"], m.eps)
            q = F.linear(h, L["wq"], L["bq"]).view(B, T, H, D)
            k = F.linear(h, L["wk"], L["bk"]).view(B, T, KVH, D)
            if L["qn"] is not None:  # Qwen3: each head's query and key normed over D, before RoPE
                q, k = ref.rms_norm(q, L["qn"], m.eps), ref.rms_norm(k, L["kn"], m.eps)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = F.linear(h, L["wv"], L["bv"]).view(B, T, KVH, D).transpose(1, 2)
            q = q * c + ref.rotate_half(q) * s
            k = k * c + ref.rotate_half(k) * s
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            # GQA without copying K/V: the G query heads of one KV head are rows of one matmul
            sc = (q.reshape(B, KVH, G * T, D) @ k.transpose(2, 3)) * (1.0 / math.sqrt(D))
            if T > 1:  # prefill (pos == 0): causal mask, the same for each of the G heads
                sc = sc.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1).repeat(G, 1), float("-inf"))
            a = (torch.softmax(sc, -1) @ v).view(B, H, T, D)
            x = x + F.linear(a.transpose(1, 2).reshape(B, T, H * D), L["wo"])
            h = ref.rms_norm(x, L["ln2"], m.eps)
            x = x + F.linear(F.silu(F.linear(h, L["wg"])) * F.linear(h, L["wu"]), L["wd"])
        return ref.rms_norm(x[:, -1], m.norm, m.eps) @ m.lm_head.t()  # logits of the last position only

    with torch.no_grad():
        out = [forward(ids, 0).argmax(-1)]
        t0 = time.perf_counter()
        for step in range(steps - 1):
            out.append(forward(out[-1][:, None], P + step).argmax(-1))
        return torch.stack(out, 1), time.perf_counter() - t0


def grpo_generate(a, prompts, *opts):
    """Returns (records, stats, wall seconds)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    lines = "".join(json.dumps({"tokens": p}) + "\n" for p in prompts)
    t0 = time.perf_counter()
    p = subprocess.run([a.grpo, "generate", "--model", a.model, "--jsonl", "--stats", *map(str, opts)],
                       input=lines, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"grpo generate failed: {p.stderr.strip()[-500:]}")
    return [json.loads(l) for l in p.stdout.splitlines()], json.loads(p.stderr.strip().splitlines()[-1]), wall


def kv_compare(a, ids_of):
    """--kv-compare: fp32 and bf16 KV caches, taking turns."""
    print(f"threads={a.threads} prompt={a.prompt} new={a.new} model={a.model} repeats={a.repeats}")
    print(f"{'B':>4} {'fp32 tok/s':>11} {'bf16 tok/s':>11} {'ratio':>6} {'fp32 MiB':>9} {'bf16 MiB':>9} "
          f"{'same greedy':>12}")
    for B in a.batches:
        ids = ids_of(B)
        tps, mib, toks = {"fp32": [], "bf16": []}, {}, {}
        for r in range(a.repeats):
            for dt in (("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")):
                recs, st, _ = grpo_generate(a, ids, "--temperature", 0, "--max-new-tokens", a.new,
                                            "--kv-cache-dtype", dt)
                tps[dt].append(st["decode_tokens_per_second"])
                mib[dt], toks[dt] = st["kv_cache_bytes"] / 2**20, [x["tokens"] for x in recs]
        f, b = statistics.median(tps["fp32"]), statistics.median(tps["bf16"])
        same = sum(x == y for x, y in zip(toks["fp32"], toks["bf16"]))
        print(f"{B:4d} {f:11.1f} {b:11.1f} {b / f:6.2f} {mib['fp32']:9.1f} {mib['bf16']:9.1f} {same:>7d}/{B:<4d}")
        sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grpo", default=os.path.join(here, "..", "build", "grpo"))
    ap.add_argument("--model", default="/tmp/grpo-bench-qwen2.5-0.5b")  # the model bench/prefill.py uses
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--torch-max-tokens", type=int, default=512, help="cap on B x steps for PyTorch")
    ap.add_argument("--group-new", type=int, default=16, help="new tokens per sample in the G=8 runs")
    ap.add_argument("--kv-compare", action="store_true", help="grpo's fp32 and bf16 KV caches only")
    ap.add_argument("--repeats", type=int, default=3, help="with --kv-compare: runs of each")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        print(f"creating {a.model} (qwen2.5-0.5b preset, bf16 file)", file=sys.stderr)
        subprocess.run([a.grpo, "init", "--out", a.model, "--preset", "qwen2.5-0.5b", "--dtype", "bf16"], check=True)
    if a.kv_compare:
        V = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
        g = torch.Generator().manual_seed(0)
        kv_compare(a, lambda B: torch.randint(0, V, (B, a.prompt), generator=g).tolist())
        return
    torch.set_num_threads(a.threads)
    m = ref.load_model(a.model, torch.float32)
    C, V, P = m.C, m.V, a.prompt
    n_nonembed = sum(t.numel() for L in m.layers for t in L.values() if t is not None) + m.norm.numel()
    weight_bytes = 4 * (n_nonembed + V * C)  # fp32 slab: every layer and the head are read each step

    def flops_per_token(ctx):
        return 2 * n_nonembed + 2 * C * V + len(m.layers) * 4 * m.H * m.D * ctx  # QK^T and AV over ctx keys

    g = torch.Generator().manual_seed(0)
    print(f"threads={a.threads} OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} "
          f"torch={torch.__version__} prompt={P} new={a.new} model={a.model}")
    print(f"{'B':>4} {'steps g/t':>10} {'grpo tok/s':>11} {'torch tok/s':>12} {'ratio':>6} {'GFLOP/s':>8} "
          f"{'GB/s':>6} {'same greedy':>12}")
    for B in a.batches:
        ids = torch.randint(0, V, (B, P), generator=g)
        recs, st, _ = grpo_generate(a, ids.tolist(), "--temperature", 0, "--max-new-tokens", a.new)
        steps = max(1, min(a.new, a.torch_max_tokens // B))
        toks, secs = torch_greedy(m, ids, steps)
        torch_tps = B * (steps - 1) / secs if steps > 1 else float("nan")
        tps = st["decode_tokens_per_second"]
        ctx = P + st["generated_tokens"] / (2 * B)  # average context over grpo's decode
        gbs = (weight_bytes + B * ctx * st["kv_bytes_per_token"]) * (tps / B) / 1e9  # bytes per step x steps/s
        same = sum(r["tokens"][:steps] == t[:len(r["tokens"])] for r, t in zip(recs, toks.tolist()))
        print(f"{B:4d} {a.new:>4}/{steps:<5d} {tps:11.1f} {torch_tps:12.1f} {tps / torch_tps:6.2f} "
              f"{tps * flops_per_token(ctx) / 1e9:8.1f} {gbs:6.1f} {same:>7d}/{B:<4d}")
        sys.stdout.flush()
    print("(ratio = grpo / torch; torch ran fewer steps where steps g/t differ, so its average context is "
          "shorter, which favours it slightly; same greedy = sequences whose tokens agree over torch's steps; "
          "fp32 near-ties may differ)")

    print(f"\nG=8 sampling: 8 prompts x --n 8, T=1, prompt {P}, {a.group_new} new tokens")
    print(f"{'prefill':>20} {'prefill s':>10} {'decode s':>9} {'wall s':>7} {'tokens':>7} {'KV MiB':>7}")
    ids = torch.randint(0, V, (8, P), generator=g).tolist()
    for label, extra in [("shared", []), ("--no-shared-prefill", ["--no-shared-prefill"])]:
        _, st, wall = grpo_generate(a, ids, "--n", 8, "--temperature", 1, "--seed", 1,
                                    "--max-new-tokens", a.group_new, *extra)
        print(f"{label:>20} {st['prefill_seconds']:10.2f} {st['decode_seconds']:9.2f} {wall:7.2f} "
              f"{st['generated_tokens']:7d} {st['kv_cache_bytes'] / 2**20:7.1f}")
    print("(wall s includes loading the model)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""`grpo --device cuda` against Hugging Face transformers' own Qwen2ForCausalLM on the same GPU.

usage: python3 tests/cuda/hf_parity.py --grpo build/grpo --tmp DIR [--shapes tiny qwen2.5-0.5b qwen2.5-7b ...]

Needs torch with CUDA and transformers (the device machine's python3); without them it prints SKIPPED and
exits 77. For each shape (Qwen2, and Qwen3 through Qwen3ForCausalLM), a random model made by transformers itself (its own initialisation, std 0.02,
random biases and norms so nothing is trivially 0 or 1) is saved in bf16 safetensors; then:
  score   B sequences of T random tokens through `grpo score --device cuda`, HF in bf16 and HF in fp32 (the
          same bf16-valued weights, upcast). Our bf16 error against HF fp32 must be no worse than HF bf16's
          own error against HF fp32, in mean and in max abs over all log-probs.
  cpu     the same B sequences through `grpo score --device cpu --dtype bf16` (the same weights and rounding
          points): mean |cuda - cpu| over all log-probs within --cpu-tol (1e-4); the max is printed too (a
          summation order that flips one bf16 rounding moves the rest of that sequence more than that).
  greedy  `grpo generate --device cuda --temperature 0` against HF's greedy decoding in fp32: tokens agree
          until the first step where fp32's two best logits are closer than the bf16 error measured above
          (a near-tie, where either pick is right); after it, nothing is compared.
Every grpo call must write one record per input line (a missing or extra record is a FAIL).
One line per check (PASS/FAIL), then "N passed, N failed"; exit 1 on any failure.
"""
import argparse
import json
import os
import re
import subprocess
import sys

try:
    import torch
    import transformers
except ImportError as e:
    print(f"SKIPPED: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIPPED: torch sees no CUDA GPU")
    sys.exit(77)

SHAPES = {
    "tiny": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    # Qwen3 (transformers' Qwen3ForCausalLM: q/k norms, no q/k/v biases, head_dim its own)
    "qwen3-tiny": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=64, vocab_size=1000, tie_word_embeddings=False),
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
}


def model_class(shape):
    return transformers.Qwen3ForCausalLM if shape.startswith("qwen3") else transformers.Qwen2ForCausalLM


def make_model(d, shape, seed):
    """A transformers-made random model saved to d in bf16; returns the bf16 model on the GPU."""
    torch.manual_seed(seed)
    config_class = transformers.Qwen3Config if shape.startswith("qwen3") else transformers.Qwen2Config
    cfg = config_class(**SHAPES[shape], max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6,
                       use_sliding_window=False)
    with torch.device("cuda"):
        m = model_class(shape)(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.02)
            elif "norm" in name:
                p.normal_(1.0, 0.1)
    m = m.to(torch.bfloat16).eval()
    m.save_pretrained(d)
    with open(os.path.join(d, "config.json")) as f:  # rope_theta in both forms, for any reader
        c = json.load(f)
    c.setdefault("rope_theta", 1e6)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    return m


def load_hf(shape, d, dtype):
    """transformers' model of directory d, in dtype, on the GPU. The keyword is `dtype` from transformers
    4.56 and `torch_dtype` before it (an older transformers keeps an unknown `dtype=` as a config attribute
    and loads fp32), so pick by version, then check what was loaded."""
    major, minor = (int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    m = model_class(shape).from_pretrained(d, **{key: dtype}).cuda().eval()
    got = next(m.parameters()).dtype
    if got != dtype:
        raise RuntimeError(f"transformers {transformers.__version__} loaded {d} as {got}, not {dtype}")
    return m


def hf_logprobs(m, ids):
    with torch.no_grad():
        z = m(input_ids=ids).logits.float()
    return torch.log_softmax(z, -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]


def run(grpo, args, stdin):
    """grpo's output records (one JSON object a line); exactly one per input line, else an error."""
    p = subprocess.run([grpo] + args, input=stdin, capture_output=True, text=True, timeout=600)
    what = f"grpo {' '.join(args[:5])}"
    if p.returncode != 0:
        raise RuntimeError(f"{what} exited {p.returncode}: {p.stderr.strip()[-400:]}")
    recs = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    want = stdin.count("\n")
    if len(recs) != want:
        raise RuntimeError(f"{what} wrote {len(recs)} records for {want} input lines")
    return recs


def score(grpo, d, device, ids):
    """`grpo score` log-probs of ids (B, T) as a (B, T-1) tensor on the GPU."""
    lines = "".join(json.dumps({"tokens": r}) + "\n" for r in ids.tolist())
    lp = [r["logprobs"] for r in run(grpo, ["score", "--model", d, "--device", device, "--dtype", "bf16"], lines)]
    if any(len(x) != ids.shape[1] - 1 for x in lp):
        raise RuntimeError(f"grpo score --device {device}: a record without {ids.shape[1] - 1} log-probs")
    return torch.tensor(lp).cuda()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--cpu-tol", type=float, default=1e-4, help="mean |cuda - cpu| log-prob bound")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
    results = []

    def check(ok, name, detail=""):
        results.append(bool(ok))
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  [{detail}]" if detail else ""), flush=True)

    for si, shape in enumerate(a.shapes):
        d = os.path.join(a.tmp, shape)
        try:
            m16 = make_model(d, shape, 100 + si)
            m32 = load_hf(shape, d, torch.float32)
            g = torch.Generator().manual_seed(si)
            ids = torch.randint(0, SHAPES[shape]["vocab_size"], (a.batch, a.seq), generator=g).cuda()
            want = hf_logprobs(m32, ids)
            hf16 = hf_logprobs(m16, ids)
            ours = score(a.grpo, d, "cuda", ids)
            e_ours, e_hf = (ours - want).abs(), (hf16 - want).abs()
            detail = (f"vs HF fp32: ours mean {e_ours.mean():.2e} max {e_ours.max():.2e}; HF bf16 mean "
                      f"{e_hf.mean():.2e} max {e_hf.max():.2e}")
            check(e_ours.mean() <= e_hf.mean() and e_ours.max() <= e_hf.max(), f"{shape}: score", detail)
            e_cpu = (ours - score(a.grpo, d, "cpu", ids)).abs()
            check(e_cpu.mean() <= a.cpu_tol, f"{shape}: score cuda == cpu (bf16, mean within {a.cpu_tol:g})",
                  f"mean {e_cpu.mean():.2e} max {e_cpu.max():.2e}")

            # greedy, prompt = the first 64 tokens of each sequence
            prompts = ids[:, :64]
            recs = run(a.grpo, ["generate", "--model", d, "--device", "cuda", "--jsonl", "--temperature", "0",
                                "--max-new-tokens", str(a.new)],
                       "".join(json.dumps({"tokens": r}) + "\n" for r in prompts.tolist()))
            recs.sort(key=lambda r: r["index"])
            if [r["index"] for r in recs] != list(range(len(prompts))):
                raise RuntimeError(f"grpo generate: record indices {[r['index'] for r in recs]}, not 0..{len(prompts) - 1}")
            tie = float(e_hf.max()) * 2  # logits closer than bf16 noise can go either way
            agree, worst = 0, ""
            for r, p in zip(recs, prompts):
                seq = p.tolist()
                for t in r["tokens"]:
                    with torch.no_grad():
                        z = m32(input_ids=torch.tensor([seq]).cuda()).logits[0, -1].float()
                    top2 = torch.topk(z, 2)
                    if t != int(top2.indices[0]):
                        gap = float(top2.values[0] - top2.values[1])
                        if gap > tie:
                            worst = f"seq {r['index']} step {len(seq) - 64}: {t} vs {int(top2.indices[0])}, gap {gap:.3f}"
                        break
                    agree += 1
                    seq.append(t)
            check(not worst, f"{shape}: greedy == HF fp32 greedy until a near-tie",
                  worst or f"{agree} tokens agreed before the first near-tie or the end")
            del m16, m32
            torch.cuda.empty_cache()
        except Exception as e:  # one broken shape must not hide the others
            check(False, f"{shape}: {type(e).__name__}", str(e)[:400])
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

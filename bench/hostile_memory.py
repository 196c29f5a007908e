#!/usr/bin/python3
"""What a hostile input can make grpo allocate before it is refused: for each kind of input with a size cap
(tokenizer.json, config.json / tokenizer_config.json, the YAML config, a safetensors header, one JSONL line),
a file just under its cap built to be as expensive to parse as possible, and the peak resident memory
(ru_maxrss of the grpo process) it costs; then the same kind just over its cap, which must be refused with
one error line before the expensive part.

usage: /usr/bin/python3 bench/hostile_memory.py [--grpo build/grpo] [--tmp DIR] [--scale F]
Prints a markdown table (the README's "Hostile inputs" section quotes it). Memory is measured, not timed.
--scale F (0 < F < 1) builds each file under its cap at F of the just-under size (rows "under xF"), so the
run is quick and small; the files over the caps stay just over them (their refusal is what they test).
Not a test: CI runs it once with --scale (tests/bench/bench_smoke.py) so that it cannot rot.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

MIB = 1 << 20
ap = argparse.ArgumentParser()
ap.add_argument("--grpo", default="build/grpo")
ap.add_argument("--tmp", default=None)
ap.add_argument("--scale", type=float, default=1.0)
a = ap.parse_args()
tmp = a.tmp or tempfile.mkdtemp(prefix="grpo-hostile-")
os.makedirs(tmp, exist_ok=True)
grpo = os.path.abspath(a.grpo)
T = lambda *p: os.path.join(tmp, *p)


def run(args, stdin=None):
    """(peak RSS MiB, exit code, last stderr line) of one grpo run. /usr/bin/time measures it: a child of
    this (large) Python process would start with the parent's peak."""
    fin = open(stdin, "rb") if stdin else subprocess.DEVNULL
    p = subprocess.run(["/usr/bin/time", "-f", "maxrss %M", grpo] + args, stdin=fin, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, errors="replace")
    err = p.stderr.strip().splitlines()
    rss = int(err[-1].split()[-1]) / 1024
    return rss, p.returncode, next((l for l in err if l.startswith("grpo: error:")), "(no error)")


def arrays(n_bytes):
    """JSON text of about n_bytes: an array of empty arrays, the most parse nodes per byte."""
    return "[" + ",".join(["[]"] * max(1, (n_bytes - 2) // 3)) + "]"


model = T("model")
subprocess.run([grpo, "init", "--out", model], check=True, capture_output=True)
line = T("line.txt")
with open(line, "w") as f:
    f.write("x\n")

rows = []


def case(kind, cap, build, args, stdin=None):
    under = ("just under", cap - 64 * 1024)
    if a.scale != 1:
        under = (f"under x{a.scale:g}", int(under[1] * a.scale))
    for label, size in (under, ("just over", cap + 64 * 1024)):
        path = build(size)
        rss, rc, err = run(args(path), stdin(path) if stdin else None)
        rows.append((kind, f"{cap // MIB} MiB", label, f"{size / MIB:.1f} MiB", f"{rss:.0f}", rc, err[:90]))


def tokenizer(size):
    d = T(f"tok{size}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        f.write('{"model": {"type": "BPE", "vocab": {}, "merges": ' + arrays(size - 40) + "}}")
    return d


SEED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fuzz", "corpus", "tokenizer")


def vocab(size):
    """A loadable tokenizer (the fuzz seeds' small one) whose vocabulary fills the file: short entries."""
    d = T(f"voc{size}")
    os.makedirs(d, exist_ok=True)
    seed = sorted(os.listdir(SEED))[0]
    tok = json.loads(open(os.path.join(SEED, seed), "rb").read().split(b"\n=====\n")[0])
    voc = tok["model"]["vocab"]
    tok["added_tokens"] = []
    head = json.dumps(dict(tok, model=dict(tok["model"], vocab={}))).encode()
    room, parts, i = size - len(head) - len(json.dumps(voc).encode()), [], len(voc)
    while room > 24:
        e = f'"v{i}": {i}'
        parts.append(e)
        room -= len(e) + 2
        i += 1
    text = json.dumps(voc)[:-1] + ", " + ", ".join(parts) + "}"
    head = head.replace(b'"vocab": {}', b'"vocab": ' + text.encode(), 1)
    with open(os.path.join(d, "tokenizer.json"), "wb") as f:
        f.write(head)
    return d


def config(size):
    d = T(f"cfg{size}")
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(model, "model.safetensors"), d)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"pad": ' + arrays(size - 12) + "}")
    return d


def yaml(size):
    p = T(f"cfg{size}.yaml")
    with open(p, "w") as f:
        f.write("x: " + arrays(size - 4) + "\n")
    return p


def header(size):
    d = T(f"st{size}")
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(model, "config.json"), d)
    body = arrays(size - 20)
    h = ('{"t": ' + body + "}").encode()
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
    return d


def jsonl(size):
    p = T(f"line{size}.jsonl")
    with open(p, "w") as f:
        f.write('{"tokens": [' + ",".join(["0"] * ((size - 14) // 2)) + "]}\n")
    return p


case("tokenizer.json (parse nodes)", 64 * MIB, tokenizer, lambda d: ["tokenize", "--tokenizer", d], lambda d: line)
case("tokenizer.json (vocabulary)", 64 * MIB, vocab, lambda d: ["tokenize", "--tokenizer", d], lambda d: line)
case("config.json", 16 * MIB, config, lambda d: ["score", "--model", d], lambda d: line)
case("YAML config", 1 * MIB, yaml, lambda p: ["train", "--config", p, "--print-config"])
case("safetensors header", 16 * MIB, header, lambda d: ["score", "--model", d], lambda d: line)
case("JSONL line (score stdin)", 8 * MIB, jsonl, lambda p: ["score", "--model", model], lambda p: p)

print("| input | cap | file | size | peak RSS MiB | exit | error |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(str(x) for x in r) + " |")
if not a.tmp:
    shutil.rmtree(tmp)

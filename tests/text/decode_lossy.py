#!/usr/bin/python3
"""Decoding arbitrary bytes: `grpo tokenize --decode` of byte-token ids must equal Python's
bytes.decode("utf-8", errors="replace") (the Unicode "maximal subpart" policy, shared by HF and
transformers.js), for random byte strings full of truncated and invalid UTF-8.

usage: /usr/bin/python3 tests/text/decode_lossy.py --grpo PATH --tokenizer tokenizer.json
"""
import argparse
import json
import random
import subprocess
import sys


def byte_chars():
    """GPT-2's ByteLevel map (public algorithm): byte -> printable character."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra = [b for b in range(256) if b not in keep]
    m = {b: chr(b) for b in keep}
    m.update({b: chr(256 + i) for i, b in enumerate(extra)})
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tokenizer", required=True)
    a = ap.parse_args()
    vocab = json.load(open(a.tokenizer, encoding="utf-8"))["model"]["vocab"]
    byte_id = {b: vocab[c] for b, c in byte_chars().items()}
    r = random.Random(5)
    pool = [0x61, 0x20, 0x80, 0x8F, 0x90, 0xA0, 0xBF, 0xC2, 0xC3, 0xDF, 0xE0, 0xE1, 0xED, 0xEF,
            0xF0, 0xF1, 0xF4, 0xF5, 0xFF, 0xC0]
    cases = [bytes(r.choice(pool) for _ in range(r.randrange(0, 24))) for _ in range(3000)]
    cases += ["é✓😀".encode(), b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80"]
    lines = "".join(json.dumps({"ids": [byte_id[b] for b in c]}) + "\n" for c in cases)
    p = subprocess.run([a.grpo, "tokenize", "--tokenizer", a.tokenizer, "--jsonl", "--decode"],
                       input=lines, capture_output=True, text=True, encoding="utf-8")
    if p.returncode != 0:
        print(f"grpo failed: {p.stderr.strip()}")
        print("0 passed, 1 failed")
        return 1
    got = [json.loads(l)["text"] for l in p.stdout.splitlines()]
    bad = [i for i, (c, g) in enumerate(zip(cases, got)) if g != c.decode("utf-8", errors="replace")]
    if len(got) != len(cases) or bad:
        for i in bad[:5]:
            print(f"FAIL bytes {cases[i].hex()}: grpo {got[i]!r} python {cases[i].decode('utf-8', 'replace')!r}")
        print(f"0 passed, 1 failed ({len(bad)} of {len(cases)} differ)")
        return 1
    print(f"PASS {len(cases)} byte strings decode as Python's errors='replace'")
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

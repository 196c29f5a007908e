#!/usr/bin/env python3
"""Parquet data files (src/io/parquet.c) against an outside writer and readers, and as training data.

The corpus comes from tests/parquet/gen.mjs: arrow-rs (parquet-wasm, pinned in tests/parquet/package-lock.json)
writes ~300 rows of every column kind the data sets use (strings, integers, floats, booleans, structs, lists of
structs, lists of lists, maps, nulls at every level) in every compression x data page version x dictionary
setting and each value encoding; gen --verify has arrow-rs and hyparquet (an independent reader) read every
file back and agree with the rows written. Here grpo's reader (tests/io/records_cat.c) must give the rows
arrow-rs reads. Then bad files (one error line, never a crash), and training: a GRPO run on verl's GSM8K
layout in Parquet equals the same rows in JSONL and as plain text prompts (metrics and weights), and SFT on
conversation rows in Parquet equals the JSONL."""
import argparse
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
PEER = os.path.join(ROOT, "tests", "parquet")
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "rollout"))
import qwen2_ref as ref  # noqa: E402
import tools_test  # noqa: E402
from harness import check, run_groups  # noqa: E402

GRPO = CAT = TMP = CORPUS = MODEL = SCORER = None


def node(script, *args):
    p = subprocess.run(["node", os.path.join(PEER, script), *args], capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise AssertionError(f"{script} exited {p.returncode}: {p.stderr[-600:]}")
    return p.stdout


def cat(path, *cols):
    """grpo's rows of a file (records_cat): (exit code, rows, stderr)."""
    p = subprocess.run([CAT, path, *cols], capture_output=True, text=True, errors="replace", timeout=120)
    rows = [json.loads(ln) for ln in p.stdout.splitlines()] if p.returncode == 0 else None
    return p.returncode, rows, p.stderr


def same(ours, theirs):
    """Equal rows, under the two documented differences of a JSON object model: an int64 beyond 2^53 is a
    double here (the reference prints its digits), and NaN / Infinity are null (JSON has no such numbers)."""
    if isinstance(theirs, str) and isinstance(ours, (int, float)) and not isinstance(ours, bool):
        if re.fullmatch(r"-?\d+", theirs):
            return float(int(theirs)) == float(ours)
        return False
    if theirs in ("NaN", "Infinity", "-Infinity") and ours is None:
        return True
    if isinstance(theirs, dict):
        return isinstance(ours, dict) and list(ours) == list(theirs) and all(same(ours[k], theirs[k]) for k in theirs)
    if isinstance(theirs, list):
        return isinstance(ours, list) and len(ours) == len(theirs) and all(same(a, b) for a, b in zip(ours, theirs))
    if isinstance(theirs, float) and isinstance(ours, (int, float)) and not isinstance(ours, bool):
        return theirs == ours or (math.isnan(theirs) and math.isnan(ours))
    if isinstance(theirs, (int, float)):
        return ours == theirs
    return type(ours) is type(theirs) and ours == theirs


def setup():
    global CORPUS, MODEL, SCORER
    if not os.path.isdir(os.path.join(PEER, "node_modules", "parquet-wasm")):
        subprocess.run(["npm", "ci", "--prefix", PEER, "--no-audit", "--no-fund"], check=True, capture_output=True)
    CORPUS = os.path.join(TMP, "corpus")
    shutil.rmtree(CORPUS, ignore_errors=True)
    node("gen.mjs", CORPUS, "--verify")  # arrow-rs and hyparquet agree with the rows written, and the layouts hold
    SCORER = os.path.join(TMP, "scorer.py")
    with open(SCORER, "w") as f:  # logs each request; the reward: the response's code points mod 3
        f.write("import json, sys\nlog = open(sys.argv[1], 'a')\nfor line in sys.stdin:\n    log.write(line)\n"
                "    log.flush()\n    r = sum(map(ord, json.loads(line)['response'])) % 3\n"
                "    print(json.dumps({'reward': r}), flush=True)\n")
    SCORER = f"/usr/bin/python3 {SCORER}"
    MODEL = os.path.join(TMP, "model")
    tools_test.TMP, tools_test.GRPO = TMP, GRPO
    end = tools_test.write_byte_tokenizer(MODEL)
    ref.make_model(MODEL, seed=3, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vocab=260, tied=False,
                   max_pos=1024)
    with open(os.path.join(MODEL, "config.json")) as f:
        cfg = json.load(f)
    cfg["eos_token_id"] = end
    with open(os.path.join(MODEL, "config.json"), "w") as f:
        json.dump(cfg, f)


def g_read():
    manifest = json.load(open(os.path.join(CORPUS, "manifest.json")))
    ok_files, bad = 0, []
    for entry in manifest:
        path = os.path.join(CORPUS, entry["file"])
        theirs = [json.loads(ln) for ln in node("read.mjs", path).splitlines()]
        rc, ours, err = cat(path)
        if rc == 0 and len(ours) == len(theirs) and all(same(a, b) for a, b in zip(ours, theirs)):
            ok_files += 1
        else:
            bad.append(f"{entry['file']}: rc {rc} {err.strip()[:200]}")
    n = len(manifest)
    check(f"every file of the corpus ({n}: 4 compressions x page v1/v2 x dictionary on/off, each encoding, brotli, "
          "lz4_raw, Hadoop's lz4, dictionary fallback, empty, map, verl gsm8k) reads as arrow-rs reads it",
          ok_files == n, "; ".join(bad[:3]))
    rows = [json.loads(ln) for ln in open(os.path.join(CORPUS, "rows.jsonl"))]
    rc, ours, _ = cat(os.path.join(CORPUS, "case_snappy_v1_dicton.parquet"))
    check("the corpus holds nested nulls, empty lists, NUL bytes, long strings and many row groups",
          rc == 0 and len(ours) == len(rows) >= 300 and any("\0" in json.dumps(r, ensure_ascii=False) or
                                                           "\\u0000" in json.dumps(r) for r in rows))
    # column selection: only the named top-level columns, equal to those of the whole rows
    cols = list(rows[0])[:2]
    rc, part, _ = cat(os.path.join(CORPUS, "case_zstd_v2_dictoff.parquet"), *cols)
    check("reading only some columns gives those columns of the whole rows",
          rc == 0 and len(part) == len(ours) and all(list(p) == cols and all(same(p[c], o[c]) for c in cols)
                                                     for p, o in zip(part, ours)))


def one_error_line(rc, err, path):
    lines = err.strip().splitlines()
    return rc == 1 and len(lines) == 1 and lines[0].startswith("grpo: error: ") and path in lines[0]


def g_bad():
    src = os.path.join(CORPUS, "case_snappy_v1_dicton.parquet")
    data = open(src, "rb").read()
    bad = os.path.join(TMP, "bad.parquet")

    def with_bytes(b):
        open(bad, "wb").write(b)
        return cat(bad)

    rc, _, err = with_bytes(data[: len(data) // 2])
    check("a truncated file: one error line naming it (no end magic)", one_error_line(rc, err, bad) and
          "not a complete Parquet file" in err, err.strip())
    rc, _, err = with_bytes(b"PAR2" + data[4:])
    check("a wrong magic: read as JSONL, one error line naming file and line", rc == 1 and bad in err and
          err.count("\n") == 1, err.strip())
    footer_len = int.from_bytes(data[-8:-4], "little")
    rc, _, err = with_bytes(data[:-8] + (len(data)).to_bytes(4, "little") + b"PAR1")
    check("a footer length past the file: one error line", one_error_line(rc, err, bad) and "footer" in err,
          err.strip())
    # a corrupt page header: the first page's header begins at byte 4 (the first column chunk)
    rc, _, err = with_bytes(data[:4] + b"\xff" * 12 + data[16:])
    check("a corrupt page header: one error line naming the row group and column",
          one_error_line(rc, err, bad) and "row group 0, column" in err, err.strip())
    # hostile files a review made by hand (kept in the fuzz corpus): a DELTA_BYTE_ARRAY whose lengths wrap, 203
    # bytes of RLE claiming 2 x 2^26 values, rows without columns; and parquet-mr's v2 page of nulls with no
    # value bytes, which is valid
    corpus = os.path.join(ROOT, "tests", "fuzz", "corpus", "parquet")
    outcomes = []
    for name, want in (("review-delta_wrap", "a value longer than a page"), ("review-amp", "write smaller row groups"),
                       ("review-nocols", "rows without columns"), ("review-v2empty", None)):
        rc, rows, err = cat(os.path.join(corpus, name))
        outcomes.append(rc == 0 and len(rows) == 1 if want is None else
                        one_error_line(rc, err, name) and want in err)
    check("hand-made hostile files are refused in one line (wrapping lengths, an RLE amplification, no columns); "
          "an all-null v2 page without value bytes reads", all(outcomes), str(outcomes))
    # random damage: never a crash, a hang or a second line
    rng = random.Random(7)
    outcomes, worst = {0: 0, 1: 0}, ""
    small = open(os.path.join(CORPUS, "gsm8k.parquet"), "rb").read()
    for i in range(300):
        b = bytearray(small if i % 2 else data)
        for _ in range(rng.randint(1, 8)):
            k = rng.randrange(len(b))
            b[k] = rng.randrange(256)
        if i % 5 == 0:  # damage near the footer, where the metadata is
            k = len(b) - 8 - rng.randint(1, footer_len)
            b[k] = rng.randrange(256)
        rc, _, err = with_bytes(bytes(b))
        if rc in outcomes and (rc == 0 or one_error_line(rc, err, bad)):
            outcomes[rc] += 1
        else:
            worst = f"rc {rc}: {err.strip()[:300]}"
    check("300 randomly damaged files: each is read or refused in one error line (no crash)",
          sum(outcomes.values()) == 300 and outcomes[1] > 100, f"{outcomes} {worst}")


def train(out, data, *extra):
    shutil.rmtree(out, ignore_errors=True)
    args = [GRPO, "train", f"model.path={MODEL}", f"data.train_file={data}", f"trainer.out_dir={out}",
            "rollout.n=4", "data.train_batch_size=4", "data.max_prompt_length=320", "data.max_response_length=12",
            "trainer.steps=2", "actor.lr=1e-3", "data.shuffle=false", "trainer.dump_samples=true",
            # the random model never answers: a program reward of its text gives the groups a signal
            "reward.program.weight=1", f"reward.program.command={SCORER} {out}/requests.jsonl", *extra]
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise AssertionError(f"grpo train exited {p.returncode}: {p.stderr[-800:]}")
    metrics = [json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl"))]
    for m in metrics:
        for k in list(m):
            if "time" in k or "per_s" in k or k.endswith("_s") or "mem" in k or "rss" in k:
                del m[k]
    weights = hashlib.md5(open(os.path.join(out, "model.safetensors"), "rb").read()).hexdigest()
    return metrics, weights, p.stderr


def g_grpo():
    pq, jl = os.path.join(CORPUS, "gsm8k.parquet"), os.path.join(CORPUS, "gsm8k.jsonl")
    rows = [json.loads(ln) for ln in open(jl)]
    flat = os.path.join(TMP, "gsm8k_flat.jsonl")
    with open(flat, "w") as f:  # the same prompts as plain text, the answers at the top level
        for r in rows:
            f.write(json.dumps({"question": r["prompt"][0]["content"], "answer": r["reward_model"]["ground_truth"]})
                    + "\n")
    verl = ["data.prompt_key=prompt", "data.answer_key=reward_model.ground_truth", "reward.by_data_source=true"]
    a = train(os.path.join(TMP, "run_parquet"), pq, *verl)
    b = train(os.path.join(TMP, "run_jsonl"), jl, *verl)
    c = train(os.path.join(TMP, "run_flat"), flat, "data.prompt_key=question")
    check("GRPO on verl's GSM8K layout: Parquet and JSONL give identical metrics and weights (the policy moved)",
          a[0] == b[0] and a[1] == b[1] and len(a[0]) == 2 and all(m["grad_norm"] > 0 for m in a[0]),
          f"{a[0][:1]} vs {b[0][:1]}")
    check("... and equal the same prompts as plain strings (message list = one user turn; dotted answer key; "
          "data_source openai/gsm8k = the gsm8k reward)", a[0] == c[0] and a[1] == c[1])
    req = [json.loads(ln) for ln in open(os.path.join(TMP, "run_parquet", "requests.jsonl"))]
    by_q = {r["prompt"][0]["content"]: r["extra_info"] for r in rows}
    check("the reward program gets each row's extra_info (and its last user message as the prompt)",
          len(req) == 32 and all(by_q.get(q["prompt"]) == q["extra_info"] for q in req))
    # a list of files and filter_overlong_prompts
    lens = sorted(len(r["prompt"][0]["content"].encode()) for r in rows)
    cut = lens[len(lens) // 2] + 80  # the chat template adds ~70 byte tokens: about half the prompts are longer
    two = train(os.path.join(TMP, "run_two"), f"[{pq},{jl}]", *verl, f"data.max_prompt_length={cut}",
                "data.filter_overlong_prompts=true", "trainer.steps=1")
    m = re.search(r"skipped (\d+) training", two[2])
    check("data.train_file as a list of files, and filter_overlong_prompts counts and skips long prompts",
          m and 0 < int(m.group(1)) < 2 * len(rows) and int(m.group(1)) % 2 == 0, two[2].strip()[-300:])
    # configs/gsm8k-qwen2.5-1.5b.yaml reads verl's files as they are (small shapes for the tiny model)
    cfg = os.path.join(ROOT, "configs", "gsm8k-qwen2.5-1.5b.yaml")
    out = os.path.join(TMP, "run_config")
    shutil.rmtree(out, ignore_errors=True)
    p = subprocess.run([GRPO, "train", "--config", cfg, f"model.path={MODEL}", f"data.train_file={pq}",
                        f"data.val_file={pq}", "data.val_max_samples=4", "data.train_batch_size=4", "rollout.n=2",
                        "data.max_prompt_length=320", "data.max_response_length=8", "actor.mini_batch_size=4",
                        "actor.micro_batch_size=8", "trainer.steps=1", f"trainer.out_dir={out}"],
                       capture_output=True, text=True, timeout=600)
    check("configs/gsm8k-qwen2.5-1.5b.yaml trains on verl's GSM8K Parquet file as it is",
          p.returncode == 0 and os.path.exists(os.path.join(out, "model.safetensors")), p.stderr.strip()[-400:])
    # errors name file, row and key
    p = subprocess.run([GRPO, "train", f"model.path={MODEL}", f"data.train_file={pq}", "data.prompt_key=prompt",
                        "data.answer_key=reward_model.truth", f"trainer.out_dir={TMP}/run_err"],
                       capture_output=True, text=True, timeout=120)
    check("a missing key: one error line naming file, row and key",
          p.returncode == 1 and f"{pq}: row 1: \"reward_model.truth\"" in p.stderr and p.stderr.count("\n") == 1,
          p.stderr.strip())
    p = subprocess.run([GRPO, "train", f"model.path={MODEL}", f"data.train_file={pq}", "data.prompt_key=extra_info",
                        "data.answer_key=reward_model.ground_truth", f"trainer.out_dir={TMP}/run_err"],
                       capture_output=True, text=True, timeout=120)
    check("a column of the wrong type (a struct as the prompt): one error line naming file, row and key",
          p.returncode == 1 and f"{pq}: row 1: \"extra_info\" must be a string" in p.stderr, p.stderr.strip())
    p = subprocess.run([GRPO, "train", f"model.path={MODEL}", f"data.train_file={flat}", "data.prompt_key=question",
                        "reward.by_data_source=true", f"trainer.out_dir={TMP}/run_err"],
                       capture_output=True, text=True, timeout=120)
    check("reward.by_data_source on rows without data_source: one error line naming file and line",
          p.returncode == 1 and f"{flat}:1: no data_source has no rule reward" in p.stderr, p.stderr.strip())


def g_sft():
    rows = [json.loads(ln) for ln in open(os.path.join(CORPUS, "gsm8k.jsonl"))][:16]
    conv = os.path.join(TMP, "sft.jsonl")
    trl = os.path.join(TMP, "sft_trl.jsonl")
    with open(conv, "w") as f, open(trl, "w") as g:
        for r in rows:
            msgs = [{"role": "system", "content": "Answer briefly."}, r["prompt"][0],
                    {"role": "assistant", "content": "#### " + r["reward_model"]["ground_truth"]}]
            f.write(json.dumps({"messages": msgs}) + "\n")
            g.write(json.dumps({"prompt": msgs[:2], "completion": msgs[2:]}) + "\n")
    schema = os.path.join(TMP, "sft_schema.json")
    msg = {"list": {"struct": [{"name": "role", "type": "utf8"}, {"name": "content", "type": "utf8"}]}}
    json.dump({"fields": [{"name": "messages", "type": msg, "nullable": False}]}, open(schema, "w"))
    pq = os.path.join(TMP, "sft.parquet")
    node("write.mjs", conv, pq, "--schema", schema, "--compression", "zstd")
    outs = []
    for name, data in (("pq", pq), ("jsonl", conv), ("trl", trl)):
        out = os.path.join(TMP, "sft_" + name)
        shutil.rmtree(out, ignore_errors=True)
        p = subprocess.run([GRPO, "sft", "--model", MODEL, "--data", data, "--out", out, "--steps", "2",
                            "--batch-size", "4", "--lr", "1e-3", "--no-shuffle"], capture_output=True, text=True,
                           timeout=300)
        if p.returncode:
            raise AssertionError(f"grpo sft exited {p.returncode}: {p.stderr[-600:]}")
        loss = [json.loads(ln)["loss"] for ln in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in ln]
        outs.append((loss, hashlib.md5(open(os.path.join(out, "model.safetensors"), "rb").read()).hexdigest()))
    check("SFT on conversation rows: Parquet equals JSONL (losses and weights)", outs[0] == outs[1] and
          len(outs[0][0]) == 2, f"{outs[0][0]} vs {outs[1][0]}")
    check("... and TRL's conversational prompt/completion rows equal the messages rows", outs[1] == outs[2])


def main():
    global GRPO, CAT, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--cat", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    GRPO, CAT, TMP = a.grpo, a.cat, a.tmp
    os.makedirs(TMP, exist_ok=True)
    groups = {"read": g_read, "bad": g_bad, "grpo": g_grpo, "sft": g_sft}
    return run_groups(setup, groups, a.only)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Bad input to `grpo train` (data, model, run directory, unsupported options): each case must exit 1
with exactly one stderr line, starting "grpo: error:" and naming the file:line, key or directory.
(Configuration errors themselves are covered by config_test.py.)"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--grpo", required=True)
ap.add_argument("--tokenizer", required=True)
ap.add_argument("--tmp", required=True)
a = ap.parse_args()
shutil.rmtree(a.tmp, ignore_errors=True)
os.makedirs(a.tmp)
T = lambda *p: os.path.join(a.tmp, *p)

model = T("model")
subprocess.run([a.grpo, "init", "--out", model, "--tokenizer", a.tokenizer], check=True, capture_output=True)
bare = T("bare")  # a model without tokenizer.json
os.makedirs(bare)
for f in ("config.json", "model.safetensors"):
    shutil.copy(os.path.join(model, f), bare)


def data(name, lines):
    p = T(name)
    with open(p, "w") as f:
        f.write("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return p


good = {"prompt": "1+1=", "answer": "2"}
ok = data("ok.jsonl", [good, good])
ckpt_out = T("has-ckpt")
os.makedirs(os.path.join(ckpt_out, "checkpoint-3"))
base = ["model.path=" + model, "data.chat_template=false", "data.max_response_length=4", "rollout.n=2",
        "data.train_batch_size=2", "trainer.steps=1", "trainer.val_before_train=false"]
cases = [
    ("data file missing", ["data.train_file=" + T("nope.jsonl"), "trainer.out_dir=" + T("o1")], r"nope\.jsonl"),
    ("malformed JSON on line 2", ["data.train_file=" + data("bad.jsonl", [good, '{"prompt": "x"']),
                                  "trainer.out_dir=" + T("o2")], r"bad\.jsonl:2\b"),
    ("line 1 without the prompt key", ["data.train_file=" + data("nokey.jsonl", [{"question": "1+1=", "answer": "2"}]),
                                       "trainer.out_dir=" + T("o3")], r"nokey\.jsonl:1\b.*prompt"),
    ("line 2 without the answer key", ["data.train_file=" + data("noans.jsonl", [good, {"prompt": "x"}]),
                                       "trainer.out_dir=" + T("o4")], r"noans\.jsonl:2\b.*answer"),
    ("prompt longer than max_prompt_length", ["data.train_file=" + ok, "data.max_prompt_length=2",
                                              "trainer.out_dir=" + T("o5")], r"ok\.jsonl:1\b.*max_prompt_length"),
    ("model without tokenizer.json", ["data.train_file=" + ok, "model.path=" + bare, "trainer.out_dir=" + T("o6")],
     r"tokenizer\.json"),
    ("prompt + response past max_position_embeddings", ["data.train_file=" + ok, "data.max_response_length=5000",
                                                        "trainer.out_dir=" + T("o7")], r"max_position_embeddings"),
    ("entropy bonus (not implemented)", ["data.train_file=" + ok, "actor.entropy_coeff=0.1"], r"actor\.entropy_coeff"),
    ("optimizer offload (not implemented)", ["data.train_file=" + ok, "actor.offload_optimizer=true"],
     r"actor\.offload_optimizer"),
    ("out_dir with checkpoints, no resume", ["data.train_file=" + ok, "trainer.out_dir=" + ckpt_out], r"checkpoint"),
    ("resume without a checkpoint", ["data.train_file=" + ok, "trainer.out_dir=" + T("o8"), "trainer.resume=true"],
     r"checkpoint"),
]
passed = failed = 0
for label, args, pattern in cases:
    p = subprocess.run([a.grpo, "train"] + base + args, capture_output=True, text=True, timeout=300)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    err = [l for l in lines if l.startswith("grpo: error:")]
    good_case = p.returncode == 1 and len(err) == 1 and re.search(pattern, err[0]) and not p.stdout \
        and all(l.startswith("grpo train:") or l.startswith("grpo: error:") for l in lines)
    print(("PASS" if good_case else "FAIL") + f"  {label}  [rc {p.returncode}: {err[0] if err else lines[-3:]}]")
    passed += bool(good_case)
    failed += not good_case
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

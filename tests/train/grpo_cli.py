#!/usr/bin/env python3
"""`grpo train` as a command: bad input (data, model, run directory, unsupported options) must exit 1
with exactly one stderr line, starting "grpo: error:" and naming the file:line, key or directory
(configuration errors themselves are covered by config_test.py); a run resumed from a checkpoint
ends with the same weights, byte for byte, as an uninterrupted one, and so does a run whose Adam moments
are offloaded to a file during rollout (actor.offload_optimizer), which leaves no file behind."""
import argparse
import collections
import json
import math
import os
import re
import shutil
import signal
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
    ("out_dir with checkpoints, no resume", ["data.train_file=" + ok, "trainer.out_dir=" + ckpt_out], r"checkpoint"),
    ("resume without a checkpoint", ["data.train_file=" + ok, "trainer.out_dir=" + T("o8"), "trainer.resume=true"],
     r"checkpoint"),
    ("int8 rollout of a model whose intermediate size (176) is no multiple of 32",
     ["data.train_file=" + ok, "rollout.weight_dtype=int8", "trainer.out_dir=" + T("o9")],
     r"rollout\.weight_dtype: int8: .*intermediate \(176\).*multiples of 32"),
    ("dynamic sampling on correctness without a reward that judges it",
     ["data.train_file=" + ok, "algorithm.dynamic_sampling=true", "reward.gsm8k.weight=0", "reward.format.weight=1",
      "trainer.out_dir=" + T("o10")], r"algorithm\.filter_groups\.metric acc needs a reward that judges correctness"),
    ("validation sampled 4 times greedily", ["data.train_file=" + ok, "rollout.val_kwargs.n=4",
                                             "trainer.out_dir=" + T("o11")], r"rollout\.val_kwargs\.temperature above 0"),
]
passed = failed = 0


def report(ok, text):
    global passed, failed
    print(("PASS" if ok else "FAIL") + "  " + text)
    passed += bool(ok)
    failed += not ok


for label, args, pattern in cases:
    p = subprocess.run([a.grpo, "train"] + base + args, capture_output=True, text=True, timeout=300)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    err = [l for l in lines if l.startswith("grpo: error:")]
    good_case = p.returncode == 1 and len(err) == 1 and re.search(pattern, err[0]) and not p.stdout \
        and all(l.startswith("grpo train:") or l.startswith("grpo: error:") for l in lines)
    print(("PASS" if good_case else "FAIL") + f"  {label}  [rc {p.returncode}: {err[0] if err else lines[-3:]}]")
    passed += bool(good_case)
    failed += not good_case
# Resume: 3 steps at once vs 1 step, then --resume to 3 (sampling seeds derive from the step).
run = base[:-2] + ["data.train_file=" + ok, "trainer.steps=3", "trainer.save_every=1", "actor.lr=1e-3",
                   "trainer.val_before_train=false", "actor.kl_loss_coef=0.05"]
subprocess.run([a.grpo, "train"] + run + ["trainer.out_dir=" + T("ra")], check=True, capture_output=True)
subprocess.run([a.grpo, "train"] + run + ["trainer.out_dir=" + T("rb"), "trainer.steps=1"], check=True, capture_output=True)
subprocess.run([a.grpo, "train"] + run + ["trainer.out_dir=" + T("rb"), "trainer.resume=true"], check=True,
               capture_output=True)
wa, wb, wi = (open(os.path.join(d, "model.safetensors"), "rb").read() for d in (T("ra"), T("rb"), model))
steps = [json.loads(l)["step"] for l in open(T("rb", "metrics.jsonl"))]
same = wa == wb and wa != wi and steps == [1, 2, 3]
print(("PASS" if same else "FAIL") + f"  resume from checkpoint-1 == 3 uninterrupted steps (weights bytes, trained: "
      f"{wa != wi}; metrics steps {steps})")
passed += same
failed += not same
# Offloaded moments (resumed too): the same bytes as ra; the unlinked offload file leaves nothing behind.
subprocess.run([a.grpo, "train"] + run + ["trainer.out_dir=" + T("rc"), "trainer.steps=1", "actor.offload_optimizer=true"],
               check=True, capture_output=True)
p = subprocess.run([a.grpo, "train"] + run + ["trainer.out_dir=" + T("rc"), "trainer.resume=true",
                                              "actor.offload_optimizer=true"], capture_output=True, text=True)
wc = open(T("rc", "model.safetensors"), "rb").read()
ms = [json.loads(l) for l in open(T("rc", "metrics.jsonl"))]
left = [f for f in os.listdir(T("rc")) if "offload" in f]
same = p.returncode == 0 and wc == wa and not left and all(m["rss_rollout_gib"] > 0 for m in ms) \
    and "offloaded during rollout" in p.stderr
print(("PASS" if same else "FAIL") + f"  actor.offload_optimizer=true (resumed) == in-memory moments (weights bytes "
      f"{wc == wa}); files left: {left}; rss_rollout_gib {[m['rss_rollout_gib'] for m in ms]}")
passed += same
failed += not same
# LoRA with offloaded moments: resumed from checkpoint-1 == 3 uninterrupted steps (the adapter's bytes).
lora = run + ["actor.lora.rank=4", "actor.lora.alpha=8", "actor.offload_optimizer=true"]
subprocess.run([a.grpo, "train"] + lora + ["trainer.out_dir=" + T("la")], check=True, capture_output=True)
subprocess.run([a.grpo, "train"] + lora + ["trainer.out_dir=" + T("lb"), "trainer.steps=1"], check=True,
               capture_output=True)
subprocess.run([a.grpo, "train"] + lora + ["trainer.out_dir=" + T("lb"), "trainer.resume=true"], check=True,
               capture_output=True)
la, lb = (open(os.path.join(d, "adapter_model.safetensors"), "rb").read() for d in (T("la"), T("lb")))
same = la == lb and not os.path.exists(T("la", "model.safetensors"))
print(("PASS" if same else "FAIL") + f"  LoRA + offload: resume from checkpoint-1 == 3 uninterrupted steps (adapter "
      f"bytes {la == lb})")
passed += same
failed += not same
# SIGTERM after the first step: a checkpoint of the finished step (save_every 0 writes none otherwise), a
# message naming trainer.resume=true, exit 143; resuming then gives the uninterrupted run's bytes.
sig_run = [x for x in run if not x.startswith("trainer.save_every")] + ["trainer.out_dir=" + T("rs")]
p = subprocess.Popen([a.grpo, "train"] + sig_run, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
err = []
for line in p.stderr:
    err.append(line)
    if "step 1/" in line:
        p.send_signal(signal.SIGTERM)
        break
err += p.stderr.readlines()
rc = p.wait(timeout=600)
msg = next((l.strip() for l in err if "SIGTERM: stopped after step" in l), "")
ck = sorted(f for f in os.listdir(T("rs")) if f.startswith("checkpoint-"))
r2 = subprocess.run([a.grpo, "train"] + sig_run + ["trainer.resume=true"], capture_output=True, text=True)
ws = open(T("rs", "model.safetensors"), "rb").read() if r2.returncode == 0 else b""
ok = rc == 143 and "trainer.resume=true" in msg and len(ck) == 1 and ck[0] in msg and ws == wa
print(("PASS" if ok else "FAIL") + f"  SIGTERM: checkpoint {ck}, exit {rc}, message {msg!r}; resumed == uninterrupted "
      f"(weights bytes {ws == wa}; resume exit {r2.returncode})")
passed += ok
failed += not ok
# The model's own chat template with verl's data.apply_chat_template_kwargs, a prompt given as text parts (a text
# model: joined with "\n"): the dumped prompt is the template's rendering with the variable.
tmpl = T("template_model")
shutil.copytree(model, tmpl)
cfg = json.load(open(os.path.join(tmpl, "tokenizer_config.json")))
cfg["chat_template"] = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}{{ greeting | default('none') }}:{% endif %}")
json.dump(cfg, open(os.path.join(tmpl, "tokenizer_config.json"), "w"))
parts = data("parts.jsonl", [{"prompt": [{"role": "user", "content": [{"type": "text", "text": "1+1"},
                                                                      {"type": "text", "text": "= ?"}]}],
                              "answer": "2"}] * 2)
p = subprocess.run([a.grpo, "train"] + base[:1] + base[2:] + ["model.path=" + tmpl, "data.train_file=" + parts,
                    "data.apply_chat_template_kwargs.greeting=hello", "trainer.dump_samples=true",
                    "trainer.out_dir=" + T("tm")], capture_output=True, text=True)
ids = json.loads(open(T("tm", "samples.jsonl")).readline())["prompt_ids"] if p.returncode == 0 else []
text = subprocess.run([a.grpo, "tokenize", "--tokenizer", tmpl, "--jsonl", "--decode"], input=json.dumps(
    {"ids": ids}) + "\n", capture_output=True, text=True).stdout
ok = p.returncode == 0 and json.loads(text or "{}").get("text") == "user: 1+1\n= ?\nhello:"
print(("PASS" if ok else "FAIL") + f"  the model's chat template with data.apply_chat_template_kwargs and a prompt "
      f"of text parts: {text.strip()!r} {p.stderr[-300:] if p.returncode else ''}")
passed += ok
failed += not ok
# Dynamic sampling filters on correctness (verl's filter_groups.metric acc), not on the reward the overlong penalty
# shaped: the random model answers every prompt wrong, so no group passes and, with one generation batch allowed,
# the run stops naming the limit; responses cut by the stop string at different lengths get different penalties,
# so filtering on the reward (seq_reward, what grpo did before) keeps groups that would train on length alone.
ds = base + ["data.train_file=" + data("ds.jsonl", [good] * 4), "data.train_batch_size=4", "rollout.n=4",
             "data.max_response_length=8", "reward.overlong_buffer.len=6", "rollout.stop=[\"e\"]",
             "algorithm.dynamic_sampling=true", "trainer.dump_samples=true",
             "algorithm.filter_groups.max_num_gen_batches=1"]
p = subprocess.run([a.grpo, "train"] + ds + ["trainer.out_dir=" + T("ds-acc")], capture_output=True, text=True)
err = [l for l in p.stderr.splitlines() if l.startswith("grpo: error:")]
ok = p.returncode == 1 and len(err) == 1 and "1 generation batches of 4 prompts gave 0 of the 4 groups" in err[0] \
    and "max_num_gen_batches 1" in err[0]
report(ok, f"dynamic sampling on acc: no all-wrong group passes [rc {p.returncode}: {err}]")
out = T("ds-seq-reward")
p = subprocess.run([a.grpo, "train"] + ds + ["algorithm.filter_groups.metric=seq_reward", "trainer.out_dir=" + out],
                   capture_output=True, text=True)
m = json.loads(open(os.path.join(out, "metrics.jsonl")).readline()) if p.returncode == 0 else {}
samples = [json.loads(l) for l in open(os.path.join(out, "samples.jsonl"))] if p.returncode == 0 else []
groups = [[x["reward"] for x in samples[g * 4:g * 4 + 4]] for g in range(len(samples) // 4)]
ok = p.returncode == 0 and all(x["correct"] == 0 for x in samples) and len(groups) == 4 \
    and all(len(set(g)) > 1 for g in groups) and m.get("kept") == 16 and m.get("groups_dropped") == 0
report(ok, f"... while seq_reward keeps all-wrong groups whose shaped rewards differ: {groups} "
      f"(kept {m.get('kept')}) {p.stderr[-300:] if p.returncode else ''}")
# DAPO's generation batches: half the prompts get one reward whatever the response (their groups never pass), so a
# step takes two batches of 4 or more to fill its 4 groups, drops 4 or more and trains on the others only (the
# surplus dropped too); resumed from
# checkpoint-1 (the stream position in trainer_state.json) it ends with the uninterrupted run's bytes.
prog = T("reward_flat.py")
with open(prog, "w") as f:
    f.write("import json, sys\nfor line in sys.stdin:\n    d = json.loads(line)\n"
            "    r = 1.0 if 'flat' in d['prompt'] else float(sum(d['response'].encode()) % 97)\n"
            "    print(json.dumps({'reward': r}), flush=True)\n")
half = data("half.jsonl", [{"prompt": ("flat " if i % 2 else "vary ") + str(i), "answer": "2"} for i in range(8)])
dg = base + ["data.train_file=" + half, "data.train_batch_size=4", "rollout.n=4", "data.max_response_length=8",
             "algorithm.dynamic_sampling=true", "algorithm.filter_groups.metric=seq_reward", "reward.gsm8k.weight=0",
             "reward.program.weight=1", "reward.program.command=" + sys.executable + " " + prog, "trainer.steps=2",
             "trainer.save_every=1", "actor.lr=1e-3", "actor.kl_loss_coef=0.05"]
p = subprocess.run([a.grpo, "train"] + dg + ["trainer.out_dir=" + T("dg-a"), "trainer.dump_samples=true"],
                   capture_output=True, text=True)
ms = [json.loads(l) for l in open(T("dg-a", "metrics.jsonl"))] if p.returncode == 0 else []
seen = [json.loads(l)["prompt_index"] for l in open(T("dg-a", "samples.jsonl"))] if p.returncode == 0 else []
n_gen = [x.get("num_gen_batches", 0) for x in ms]
ok = p.returncode == 0 and len(ms) == 2 and all(x["kept"] == 16 and x["num_gen_batches"] >= 2 and x["groups_dropped"] >= 4
                                                for x in ms) and all(i % 2 == 0 for i in seen) and len(set(seen)) == 4
report(ok, f"data.gen_batch_size: {[(x.get('kept'), x.get('num_gen_batches'), x.get('groups_dropped')) for x in ms]}"
      f" (kept, generation batches, groups dropped) a step; trained prompts {sorted(set(seen))} "
      f"{p.stderr[-300:] if p.returncode else ''}")
subprocess.run([a.grpo, "train"] + dg + ["trainer.out_dir=" + T("dg-b"), "trainer.steps=1"], capture_output=True)
p = subprocess.run([a.grpo, "train"] + dg + ["trainer.out_dir=" + T("dg-b"), "trainer.resume=true"], capture_output=True)
ws = [open(T(d, "model.safetensors"), "rb").read() if os.path.exists(T(d, "model.safetensors")) else b""
      for d in ("dg-a", "dg-b")]
st = json.load(open(T("dg-b", "checkpoint-2", "trainer_state.json"))) if p.returncode == 0 else {}
ok = p.returncode == 0 and ws[0] == ws[1] and ws[0] != b"" and st.get("prompts_seen") == 4 * sum(n_gen)
report(ok, f"dynamic sampling resumed == uninterrupted (weights bytes {ws[0] == ws[1]}); "
      f"prompts_seen {st.get('prompts_seen')}")
# Validation as papers report it (rollout.val_kwargs): 4 samples a prompt at temperature 1, scored by a program that
# judges ("acc") and extracts an answer ("pred", for majority votes), as verl's compute_score dictionaries; mean@4,
# pass@k (k = 1, 2, 4: the unbiased estimator, math.comb's here) and maj@4 per data_source equal those of
# OUT/val_samples.jsonl, computed here.
judge = T("reward_judge.py")
with open(judge, "w") as f:
    f.write("import json, sys\nfor line in sys.stdin:\n    d = json.loads(line)\n"
            "    pred = str(sum(d['response'].encode()) % 3)\n"
            "    print(json.dumps({'reward': 1.0 if pred == '0' else 0.25, 'acc': pred == '0', 'pred': pred}), "
            "flush=True)\n")
val = data("val.jsonl", [{"prompt": f"v{i}", "answer": "0", "data_source": "a" if i < 4 else "b"} for i in range(6)])
out = T("val-k")
p = subprocess.run([a.grpo, "train"] + base + ["data.train_file=" + data("train2.jsonl", [good] * 2), "data.val_file=" + val,
                                               "trainer.val_before_train=true", "rollout.val_kwargs.n=4",
                                               "rollout.val_kwargs.temperature=1.0", "reward.gsm8k.weight=0",
                                               "reward.program.weight=1", "reward.program.command=" + sys.executable +
                                               " " + judge, "trainer.dump_samples=true", "trainer.out_dir=" + out],
                   capture_output=True, text=True)
got = json.loads(open(os.path.join(out, "metrics.jsonl")).readline()) if p.returncode == 0 else {}
vs = [json.loads(l) for l in open(os.path.join(out, "val_samples.jsonl"))] if p.returncode == 0 else []
want, by = {}, {}
for x in vs:
    by.setdefault(x["data_source"], {}).setdefault(x["prompt_index"], []).append(x)
for src, prompts in by.items():
    rows = list(prompts.values())
    n = 4
    want[f"val/{src}/acc/mean@4"] = sum(sum(x["correct"] for x in r) / n for r in rows) / len(rows)
    want[f"val/{src}/reward/mean@4"] = sum(sum(x["reward"] for x in r) / n for r in rows) / len(rows)
    for k in (1, 2, 4):
        want[f"val/{src}/acc/pass@{k}"] = sum(1 - math.comb(n - sum(x["correct"] for x in r), k) / math.comb(n, k)
                                              for r in rows) / len(rows)
    maj = []
    for r in rows:
        votes = collections.Counter(x["pred"] for x in r if x["pred"])
        top = votes.most_common(1)[0][0] if votes else None
        maj.append(next(x["correct"] for x in r if x["pred"] == top) if top is not None else 0)
    want[f"val/{src}/acc/maj@4"] = sum(maj) / len(rows)
want["val_accuracy"] = sum(x["correct"] for x in vs) / len(vs) if vs else None
bad = [k for k in want if k not in got or abs(got[k] - want[k]) > 1e-6]
mixed = sum(0 < sum(x["correct"] for x in r) < 4 for pr in by.values() for r in pr.values())
ok = p.returncode == 0 and len(vs) == 24 and sorted(by) == ["a", "b"] and not bad and mixed >= 2 \
    and 0 < want["val/a/acc/pass@1"] < want["val/a/acc/pass@2"] <= want["val/a/acc/pass@4"] \
    and max(v for k, v in want.items() if "maj@" in k) > 0
report(ok, f"rollout.val_kwargs.n=4: mean@4, pass@1/2/4 and maj@4 per data_source as the "
      f"dumped samples give them ({mixed} prompts with some right), e.g. a: "
      f"{ {k.split('/', 2)[2]: round(v, 4) for k, v in want.items() if k.startswith('val/a/')} }"
      + (f"; differ: {[(k, got.get(k), want[k]) for k in bad]}" if bad else "") + (p.stderr[-300:] if p.returncode else ""))
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

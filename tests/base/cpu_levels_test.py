#!/usr/bin/python3
"""The CPU levels on emulated CPUs (qemu-x86_64, user mode: the CPUID the binary sees is the model's):
- below the floor (Nehalem: no AVX; Sandy Bridge: AVX without AVX2/FMA) grpo refuses with one error line
  naming what the CPU lacks, before any AVX2 instruction runs;
- on an AVX2 CPU without AVX-512 (Haswell) every path runs (an AVX-512 instruction anywhere would be
  SIGILL): the op tests pass, `grpo doctor` reports the avx2 level with bf16 widened, and bf16 score,
  greedy generate, bf16 SFT and LoRA SFT on a bf16 base give the bytes of this machine capped with
  GRPO_CPU_ISA=avx2: the cap the other capped tests use stands for a real AVX2 CPU.

usage: /usr/bin/python3 tests/base/cpu_levels_test.py --grpo PATH --ops-test PATH --tmp DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--grpo", required=True)
ap.add_argument("--ops-test", required=True, help="the test_ops_grad executable")
ap.add_argument("--tmp", required=True)
a = ap.parse_args()
shutil.rmtree(a.tmp, ignore_errors=True)
os.makedirs(a.tmp)
T = lambda *p: os.path.join(a.tmp, *p)  # noqa: E731
QEMU = shutil.which("qemu-x86_64")
# GOMP_SPINCOUNT set: grpo then does not execute itself again (main.c), which would leave the emulator.
# Two threads everywhere, so the host and the emulated runs sum in the same order. GRPO_TUNING=off: the
# level's own decode kernel on both sides (at avx2 there is one kernel to choose; measuring it emulated
# would take minutes).
ENV = dict(os.environ, GOMP_SPINCOUNT="1000", OMP_NUM_THREADS="2", GRPO_TUNING="off")
for k in ("GRPO_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
    ENV.pop(k, None)


def run(cmd, cpu=None, stdin="", env=None, timeout=600):
    """cmd on this machine, or under qemu emulating `cpu`; (exit status, stdout, stderr without qemu's notes)."""
    full = ([QEMU, "-cpu", cpu] if cpu else []) + cmd
    p = subprocess.run(full, input=stdin, capture_output=True, text=True, env=dict(ENV, **(env or {})),
                       timeout=timeout)
    err = "".join(l for l in p.stderr.splitlines(True) if not l.startswith("qemu-x86_64: warning:"))
    return p.returncode, p.stdout, err


def floor():
    for cpu, lacks in (("Nehalem", "avx avx2 fma f16c"), ("SandyBridge", "avx2 fma f16c")):
        rc, out, err = run([a.grpo, "--version"], cpu)
        check(f"{cpu}: one error line naming the missing features, exit 1",
              rc == 1 and out == "" and err.count("\n") == 1 and
              err.startswith(f"grpo: error: this CPU lacks {lacks}") and "x86-64-v3" in err, (rc, err))
    rc, out, _ = run([a.grpo, "--version"], "Haswell-v4")
    check("Haswell: grpo starts", rc == 0 and out.startswith("grpo "), (rc, out))


def doctor():
    rc, out, err = run([a.grpo, "doctor", "--json"], "Haswell-v4")
    cpu = next((c for c in json.loads(out)["checks"] if c["id"] == "cpu"), {}) if out else {}
    v = cpu.get("values", {})
    check("Haswell: doctor reports the avx2 level, bf16 widened, the AVX2 decode kernel, PASS",
          (v.get("isa_machine"), v.get("isa_level"), v.get("bf16_matmul"), v.get("bf16_decode"), v.get("onednn_isa"),
           cpu.get("status")) == ("avx2", "avx2", "widened", "avx2", "avx2", "PASS"), (rc, cpu, err[-300:]))


def ops():
    # every op test emulated, its finite differences sampled (all of them took 13 minutes)
    rc, out, err = run([a.ops_test, "--sampled"], "Haswell-v4", timeout=1400)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    check("Haswell: every op test passes at its level (kernels and widened bf16 products)",
          rc == 0 and "CPU level avx2, bf16 products widened" in out and last.endswith(" 0 failed"),
          (rc, last, err[-300:]))


def same_as_capped(name, cmd, stdin="", outdir=None):
    """The emulated AVX2 CPU and this one capped at avx2 give the same bytes (stdout, or outdir's files)."""
    got = []
    for cpu, env in (("Haswell-v4", {}), (None, {"GRPO_CPU_ISA": "avx2"})):
        c = [x.replace("{out}", outdir + ("-emu" if cpu else "-cap")) if outdir else x for x in cmd]
        rc, out, err = run(c, cpu, stdin, env)
        if rc != 0:
            check(name, False, f"{'qemu' if cpu else 'capped'} run exited {rc}: {err[-400:]}")
            return
        if outdir:
            d = outdir + ("-emu" if cpu else "-cap")
            out = {f: open(os.path.join(d, f), "rb").read() for f in ("model.safetensors", "adapter_model.safetensors")
                   if os.path.exists(os.path.join(d, f))}
        got.append(out)
    same = got[0] == got[1]
    check(name, same and got[0], ("" if got[0] else "empty output") if same else "outputs differ")


def paths():
    d = T("model")
    ref.make_model(d, seed=3, hidden=72, layers=2, heads=4, kv_heads=2, intermediate=136, vocab=300, tied=False,
                   dtype="bf16")
    seqs = "".join(json.dumps({"tokens": [(i * 37 + 11 * n) % 299 for i in range(n)]}) + "\n" for n in (5, 40, 150))
    same_as_capped("Haswell = capped: score of a bf16 model", [a.grpo, "score", "--model", d], seqs)
    prompts = "".join(json.dumps({"tokens": [(i * 7 + n) % 299 for i in range(n)]}) + "\n" for n in (3, 20))
    same_as_capped("Haswell = capped: greedy bf16 generate (skinny decode kernel)",
                   [a.grpo, "generate", "--model", d, "--jsonl", "--temperature", "0", "--max-new-tokens", "12"],
                   prompts)
    data = T("sft.jsonl")
    with open(data, "w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt_ids": [(i * 13 + j) % 299 for j in range(12)],
                                "completion_ids": [(i * 5 + j) % 299 for j in range(20)]}) + "\n")
    sft = [a.grpo, "sft", "--model", d, "--data", data, "--steps", "2", "--batch-size", "4", "--out", "{out}"]
    same_as_capped("Haswell = capped: 2 SFT steps with --precision bf16 (weights)", sft + ["--precision", "bf16"],
                   outdir=T("sft-bf16"))
    same_as_capped("Haswell = capped: 2 LoRA SFT steps on the bf16 base (adapter)", sft + ["--lora-rank", "4"],
                   outdir=T("sft-lora"))


if not QEMU:
    print("qemu-x86_64 not found (Debian's qemu-user: scripts/deps.sh --test installs it)")
    sys.exit(1)
sys.exit(harness.run_groups(lambda: None, {"floor": floor, "doctor": doctor, "ops": ops, "paths": paths}))

#!/usr/bin/env python3
"""The training path through the Backend seam: SFT and GRPO (fp32, bf16, fp16, recompute, LoRA, KL, entropy bonus,
several mini-batches, offloaded moments, resumed runs, Qwen3) and bf16 score/generate on `--device cpu-staged`, the
CPU's own ops behind a device's paths (workspaces in the backend's memory, every crossing an explicit
upload/download, checkpoints and results staged through the host, offloaded moments copied out and back), must write
the same bytes as on the CPU: scripts/bitwise.py's listing twice, every line of the staged one equal to the CPU's.
(The emulated device's own training is device_train_test.py's.)

usage: device_seam_test.py --grpo build/grpo --tmp DIR
"""
import argparse
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # keep tests/reference free of __pycache__
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from harness import check, summary  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BITWISE = os.path.join(HERE, "..", "..", "scripts", "bitwise.py")
ap = argparse.ArgumentParser()
ap.add_argument("--grpo", required=True)
ap.add_argument("--tmp", required=True)
a = ap.parse_args()
shutil.rmtree(a.tmp, ignore_errors=True)
os.makedirs(a.tmp)


def listing(device):
    p = subprocess.run([sys.executable, BITWISE, "--grpo", a.grpo, "--tmp", os.path.join(a.tmp, device), "--no-vl",
                        "--device", device], capture_output=True, text=True, timeout=3000)
    if p.returncode != 0:
        return None, p.stdout[-300:] + p.stderr[-1200:]
    return dict(l.split(" ", 1) for l in p.stdout.splitlines() if l.strip()), ""


cpu, err_cpu = listing("cpu")
staged, err_staged = listing("cpu-staged")
check("scripts/bitwise.py ran on cpu and cpu-staged", cpu is not None and staged is not None, err_cpu + err_staged)
if cpu and staged:
    differ = [k for k in staged if cpu.get(k) != staged[k]]
    check(f"cpu-staged writes the CPU's bytes ({len(staged)} files and outputs)", len(staged) >= 80 and not differ,
          ", ".join(differ[:8]))

sys.exit(summary())

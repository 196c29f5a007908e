#!/usr/bin/python3
"""Training-step benchmark: `grpo sft` vs PyTorch (forward + backward + clip + AdamW, fp32), same weights,
same data, same run, with the model FLOP utilisation against an sgemm ceiling measured in the same run.

usage: /usr/bin/python3 bench/train.py [--grpo build/grpo] [--ceiling build/ceiling] [--model-dir DIR]
           [--seq-len 256] [--prompt-len 16] [--batch-size 4] [--micro-batch-size B] [--steps 5] [--repeats 1]
           [--threads N] [--skip-torch] [--skip-recompute] [--sgemm M N K] [--sgemm-reps 10]

Data: --batch-size synthetic pre-tokenized lines {"prompt_ids": P random ids, "completion_ids": T-P random
ids}, so every step trains on B sequences of T tokens (B*T tokens per step, B*(T-P) of them in the loss).
grpo: `grpo sft --steps K --batch-size B --micro-batch-size b --no-shuffle --lr 1e-5` (clip 1.0, weight
decay 0: its defaults); the step time is elapsed_s of metrics.jsonl (that step's duration).
PyTorch: the same model as float32 nn.Parameters (tests/reference/qwen2_ref.py reader; a tied head is the
embedding Parameter), a batched forward in the ops of bench/prefill.py, the LM head only on the positions
that predict a completion token, cross-entropy summed over the completion tokens / the batch's completion
tokens, backward per micro-batch, clip_grad_norm_(1.0), torch.optim.AdamW(lr 1e-5, weight_decay 0); its
sgemm is the system libblas.so.3. Both use --threads threads (OMP_NUM_THREADS for grpo and the sgemm,
torch.set_num_threads). Step time = median over the steps of all --repeats runs, each run's first step
excluded (it allocates the optimizer state); tokens/s = B*T / step time. Step-1 loss and grad norm of both
sides are printed as a check that they computed the same thing.

FLOPs per step (model FLOPs: what the math needs, the same figure for every run; --recompute's extra
forward is not counted):
    F = 6 * N * B * T  +  6 * L * H * D * B * T * (T + 1)
  N = weights that take part in matmuls = L * (C*H*D + 2*C*KVH*D + H*D*C + 3*C*I) + V*C
      (q, k, v, o, gate, up, down projections of every layer plus the LM head -- for a tied model the
      embedding matrix used as the head; the embedding lookup, biases and norm gains are not matmuls).
      6 = 2 (multiply-add) x 3 (forward, plus backward to activations and to weights: 2x the forward).
      The head is counted on all B*T positions (the usual 6*N*tokens); both programs need it only on the
      B*(T-P) positions that predict a completion token, 1.7% of F fewer at T=256, P=16.
  Attention: per layer and sequence the causal forward has T*(T+1)/2 query-key pairs per query head, each
      2*D FLOPs in Q K^T and 2*D in A V: 4*H*D*T*(T+1)/2; times 3 for forward + backward.
MFU = achieved FLOP/s / the fp32 matmul ceiling: oneDNN's fp32 matmul (row-major C[M,N] = A[M,K] B[N,K]^T, the
shape of a Linear) as grpo links it (build/ceiling), --threads threads, median of --sgemm-reps calls,
measured in a separate process at the start and at the end of the run; the higher of the two is used.
Peak RSS: each run is a separate child process and its own ru_maxrss comes from wait4() (maxima of
different runs never mix); it includes loading the model (and grpo's final save).
PyTorch's fp32 matmuls go through libblas.so.3: `scripts/deps.sh --bench` installs OpenBLAS for it.
Not a test: CI runs it once on a tiny model (tests/bench/bench_smoke.py) so that it cannot rot.
"""
import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
here = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------- child processes

def run_child(cmd, env, log_path):
    """Runs cmd with stdout+stderr to log_path; returns (exit code, wall s, peak RSS bytes of that child)."""
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        _, status, ru = os.wait4(p.pid, 0)  # this child's own rusage, not RUSAGE_CHILDREN's running max
        wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, wall, ru.ru_maxrss * 1024  # Linux: KiB


def tail(path, n=15):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def measure_sgemm(a, env, tmp, tag):
    """The fp32 matmul ceiling of the oneDNN that grpo links: build/ceiling (--ceiling; default beside grpo)."""
    log = os.path.join(tmp, f"sgemm-{tag}.log")
    M, N, K = a.sgemm
    tool = a.ceiling or os.path.join(os.path.dirname(os.path.abspath(a.grpo)), "ceiling")
    rc, _, _ = run_child([tool, "gemm", "f32", str(M), str(N), str(K), str(a.sgemm_reps)], env, log)
    if rc != 0:
        sys.exit(f"sgemm measurement failed:\n{tail(log)}")
    return json.loads(tail(log, 1))["gflops"]


# ----------------------------------------------------------------- PyTorch peer (own process)

def torch_worker(a):
    sys.path.insert(0, os.path.join(here, "..", "tests", "reference"))
    import math
    import torch
    import torch.nn.functional as F
    import qwen2_ref as ref
    torch.set_num_threads(a.threads)
    m = ref.load_model(a.model_dir, torch.float32)
    nn = torch.nn
    tied = m.lm_head is m.embed
    embed = nn.Parameter(m.embed)
    head = embed if tied else nn.Parameter(m.lm_head)
    norm = nn.Parameter(m.norm)
    # None: a bias or q/k norm the model has not (Qwen3 has q/k norms, no biases)
    layers = [{k: None if t is None else nn.Parameter(t) for k, t in L.items()} for L in m.layers]
    params = [embed, norm] + ([] if tied else [head]) + [p for L in layers for p in L.values() if p is not None]
    del m.layers, m.embed, m.lm_head, m.norm

    with open(a.data) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    P = len(rows[0]["prompt_ids"])
    assert all(len(r["prompt_ids"]) == P and len(r["prompt_ids"]) + len(r["completion_ids"]) == a.seq_len
               for r in rows), "the worker expects equal prompt/completion lengths"
    data = torch.tensor([r["prompt_ids"] + r["completion_ids"] for r in rows], dtype=torch.long)
    H, KVH, D, T = m.H, m.KVH, m.D, a.seq_len
    cos, sin = ref.rope_cos_sin(T, D, m.theta, torch.float32, m.inv_freq)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)

    def nll_sum(ids):
        """Sum over the completion tokens of -log p(token | prefix); ids (b, T)."""
        b = ids.shape[0]
        x = embed[ids]
        for L in layers:
            h = ref.rms_norm(x, L["ln1"], m.eps)
            q = F.linear(h, L["wq"], L["bq"]).view(b, T, H, D)
            k = F.linear(h, L["wk"], L["bk"]).view(b, T, KVH, D)
            if L["qn"] is not None:  # Qwen3: each head's query and key normed over D, before RoPE
                q, k = ref.rms_norm(q, L["qn"], m.eps), ref.rms_norm(k, L["kn"], m.eps)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = F.linear(h, L["wv"], L["bv"]).view(b, T, KVH, D).transpose(1, 2)
            q = q * cos + ref.rotate_half(q) * sin
            k = k * cos + ref.rotate_half(k) * sin
            k = k.repeat_interleave(H // KVH, 1)
            v = v.repeat_interleave(H // KVH, 1)
            s = (q @ k.transpose(2, 3)) * (1.0 / math.sqrt(D))
            o = torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v
            x = x + F.linear(o.transpose(1, 2).reshape(b, T, H * D), L["wo"])
            h = ref.rms_norm(x, L["ln2"], m.eps)
            x = x + F.linear(F.silu(F.linear(h, L["wg"])) * F.linear(h, L["wu"]), L["wd"])
        # the head only where a completion token is predicted: positions P-1 .. T-2
        z = ref.rms_norm(x[:, P - 1:T - 1], norm, m.eps) @ head.t()
        return F.cross_entropy(z.reshape(-1, m.V), ids[:, P:].reshape(-1), reduction="sum")

    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    B, mb = a.batch_size, a.micro_batch_size
    n_tok = B * (T - P)
    times, losses, norms = [], [], []
    for s in range(a.steps):
        idx = torch.tensor([(s * B + j) % len(rows) for j in range(B)])  # --no-shuffle stream order
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for j in range(0, B, mb):
            # bf16: fp32 master weights, the forward's matmuls in bf16 (autocast), as `grpo sft --precision bf16`
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.torch_dtype == "bf16"):
                loss = nll_sum(data[idx[j:j + mb]]) / n_tok
            loss.backward()
            total += loss.item()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(total)
        norms.append(float(gn))
        print(f"torch step {s + 1}: {times[-1]:.2f} s loss {total:.6f} grad_norm {float(gn):.6f}", flush=True)
    print(json.dumps({"step_s": times, "loss": losses, "grad_norm": norms, "torch": torch.__version__}))


# ----------------------------------------------------------------- grpo

def step_times_from_metrics(recs, wall):
    """elapsed_s is the duration of that step (fwd/bwd of every micro-batch, clip, AdamW; src/train/sft.c)."""
    e = [float(r["elapsed_s"]) for r in recs]
    if sum(e) > wall:
        sys.exit(f"metrics elapsed_s {e} sum to more than the run's wall time {wall:.1f} s: not per-step durations?")
    return e


def run_grpo(a, env, tmp, data, recompute, rep):
    out = os.path.join(tmp, f"out-{'rc' if recompute else 'plain'}-{rep}")
    cmd = [a.grpo, "sft", "--model", a.model_dir, "--data", data, "--out", out, "--steps", str(a.steps),
           "--batch-size", str(a.batch_size), "--micro-batch-size", str(a.micro_batch_size),
           "--no-shuffle", "--lr", "1e-5"] + (["--recompute"] if recompute else [])
    log = out + ".log"
    rc, wall, rss = run_child(cmd, env, log)
    if rc != 0:
        sys.exit(f"grpo sft failed (exit {rc}): {shlex.join(cmd)}\n{tail(log)}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(l) for l in f if l.strip()]
    if len(recs) != a.steps:
        sys.exit(f"{out}/metrics.jsonl has {len(recs)} steps, expected {a.steps}")
    want_tok = a.batch_size * (a.seq_len - a.prompt_len)
    if any(r.get("tokens") != want_tok for r in recs):
        print(f"warning: metrics tokens {[r.get('tokens') for r in recs]} != {want_tok}", file=sys.stderr)
    steps = step_times_from_metrics(recs, wall)
    shutil.rmtree(out, ignore_errors=True)  # the saved fp32 model is 2 GB
    return {"cmd": cmd, "step_s": steps, "rss": rss, "wall": wall,
            "loss": [r.get("loss") for r in recs], "grad_norm": [r.get("grad_norm") for r in recs]}


# ----------------------------------------------------------------- main

def step_flops(cfg, B, T):
    C, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KVH, L = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    D = cfg.get("head_dim", C // H)  # Qwen3: its own
    N = L * (C * H * D + 2 * C * KVH * D + H * D * C + 3 * C * I) + V * C
    return 6 * N * B * T + 6 * L * H * D * B * T * (T + 1), N


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grpo", default=os.path.join(here, "..", "build", "grpo"))
    ap.add_argument("--ceiling", help="the ceiling binary (default: the one beside --grpo)")
    ap.add_argument("--model-dir", default="/tmp/grpo-bench-qwen2.5-0.5b")  # shared with prefill/decode
    ap.add_argument("--seq-len", type=int, default=256, help="T: tokens per sequence (prompt + completion)")
    ap.add_argument("--prompt-len", type=int, default=16, help="P: prompt tokens (not in the loss)")
    ap.add_argument("--batch-size", type=int, default=4, help="B: sequences per optimizer step")
    ap.add_argument("--micro-batch-size", type=int, default=None, help="b (default: B)")
    ap.add_argument("--steps", type=int, default=5, help="steps per run; the first is not timed")
    ap.add_argument("--repeats", type=int, default=1, help="runs (processes) per configuration")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-recompute", action="store_true", help="no `grpo sft --recompute` run")
    ap.add_argument("--sgemm", type=int, nargs=3, default=[2048, 4864, 896], metavar=("M", "N", "K"))
    ap.add_argument("--sgemm-reps", type=int, default=10)
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--torch-dtype", default="f32", choices=["f32", "bf16"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.micro_batch_size = a.micro_batch_size or a.batch_size
    if a.torch_worker:
        return torch_worker(a)
    if a.steps < 2 or not 0 < a.prompt_len < a.seq_len:
        sys.exit("need --steps >= 2 and 0 < --prompt-len < --seq-len")

    if not os.path.exists(os.path.join(a.model_dir, "config.json")):
        print(f"creating {a.model_dir} (qwen2.5-0.5b preset, bf16 file)", file=sys.stderr)
        subprocess.run([a.grpo, "init", "--out", a.model_dir, "--preset", "qwen2.5-0.5b", "--dtype", "bf16"],
                       check=True)
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))  # OPENBLAS_CORETYPE etc. pass through as set
    B, T, P, K = a.batch_size, a.seq_len, a.prompt_len, a.steps
    flops, N = step_flops(cfg, B, T)
    tmp = tempfile.mkdtemp(prefix="grpo-bench-train-")
    try:
        import random
        r = random.Random(0)
        V = min(cfg["vocab_size"], cfg.get("bos_token_id", cfg["vocab_size"]))  # ordinary (non-special) ids
        data = os.path.join(tmp, "data.jsonl")
        with open(data, "w") as f:
            for _ in range(B):
                ids = [r.randrange(V) for _ in range(T)]
                f.write(json.dumps({"prompt_ids": ids[:P], "completion_ids": ids[P:]}) + "\n")

        ct = os.environ.get("OPENBLAS_CORETYPE")
        print(f"command: {'OPENBLAS_CORETYPE=' + shlex.quote(ct) + ' ' if ct else ''}"
              f"{shlex.join([sys.executable] + sys.argv)}")
        print("load average at start: %.2f %.2f %.2f" % os.getloadavg())
        print(f"threads={a.threads} OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} "
              f"model={a.model_dir} T={T} prompt={P} B={B} micro-batch={a.micro_batch_size} steps={K} "
              f"repeats={a.repeats} tokens/step={B * T}", flush=True)
        ceil0 = measure_sgemm(a, env, tmp, "start")

        rows = []  # (label, step times pooled, peak rss, first-step loss, first-step grad norm)
        configs = [False] + ([] if a.skip_recompute else [True])
        grpo_cmds = []
        for rc_flag in configs:
            steps, rss, first = [], 0, None
            for rep in range(a.repeats):
                res = run_grpo(a, env, tmp, data, rc_flag, rep)
                grpo_cmds.append(res["cmd"])
                steps += res["step_s"][1:]
                rss = max(rss, res["rss"])
                first = first or (res["loss"][0], res["grad_norm"][0])
                print(f"  grpo{' --recompute' if rc_flag else ''} run {rep + 1}: steps "
                      f"{' '.join(f'{s:.2f}' for s in res['step_s'])} s, wall {res['wall']:.1f} s, "
                      f"peak RSS {res['rss'] / 2**30:.2f} GiB", flush=True)
            rows.append(("grpo --recompute" if rc_flag else "grpo", steps, rss, first))

        torch_version = None
        if not a.skip_torch:
            steps, rss, first = [], 0, None
            for rep in range(a.repeats):
                log = os.path.join(tmp, f"torch-{rep}.log")
                cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", "--data", data,
                       "--model-dir", a.model_dir, "--seq-len", str(T), "--batch-size", str(B),
                       "--micro-batch-size", str(a.micro_batch_size), "--steps", str(K),
                       "--threads", str(a.threads)]
                rc, wall, prss = run_child(cmd, env, log)
                if rc != 0:
                    sys.exit(f"PyTorch worker failed (exit {rc}):\n{tail(log)}")
                res = json.loads(tail(log, 1))
                torch_version = res["torch"]
                steps += res["step_s"][1:]
                rss = max(rss, prss)
                first = first or (res["loss"][0], res["grad_norm"][0])
                print(f"  PyTorch run {rep + 1}: steps {' '.join(f'{s:.2f}' for s in res['step_s'])} s, "
                      f"wall {wall:.1f} s, peak RSS {prss / 2**30:.2f} GiB", flush=True)
            rows.append((f"PyTorch {torch_version}", steps, rss, first))

        ceil1 = measure_sgemm(a, env, tmp, "end")
        print("load average at end: %.2f %.2f %.2f" % os.getloadavg())
        ceiling = max(ceil0, ceil1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    M_, N_, K_ = a.sgemm
    print()
    print("| run | step s | tokens/s | GFLOP/s | MFU | peak RSS GiB | step-1 loss | step-1 grad norm |")
    print("|---|---|---|---|---|---|---|---|")
    tps = {}
    for label, steps, rss, (loss, gn) in rows:
        st = statistics.median(steps)
        tps[label] = B * T / st
        print(f"| {label} | {st:.2f} | {B * T / st:.1f} | {flops / st / 1e9:.1f} | {flops / st / 1e9 / ceiling:.1%} "
              f"| {rss / 2**30:.2f} | {loss:.6f} | {gn:.6f} |")
    print()
    if torch_version:
        t = tps[f"PyTorch {torch_version}"]
        print(f"ratio grpo / PyTorch (tokens/s): {tps['grpo'] / t:.2f}"
              + (f"; grpo --recompute / PyTorch: {tps['grpo --recompute'] / t:.2f}" if not a.skip_recompute else ""))
    print(f"FLOPs per step: {flops / 1e12:.3f} TFLOP = 6*N*B*T + 6*L*H*D*B*T*(T+1), N = {N / 1e6:.1f} M "
          f"matmul weights (incl. the LM head), B*T = {B * T}")
    print(f"fp32 matmul ceiling ({M_}x{N_}x{K_}, NN^T, {a.threads} threads, oneDNN, median of {a.sgemm_reps}): "
          f"{ceil0:.1f} GFLOP/s at the start, {ceil1:.1f} at the "
          f"end; MFU uses {ceiling:.1f}")
    print("step s = median over timed steps (first step of each run excluded); "
          "peak RSS per process (wait4), incl. model load and grpo's final save")
    for c in dict.fromkeys(map(shlex.join, grpo_cmds)):
        print(f"grpo command: OMP_NUM_THREADS={a.threads} {c}")


if __name__ == "__main__":
    main()

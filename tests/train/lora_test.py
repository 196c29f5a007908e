#!/usr/bin/python3
"""LoRA in `grpo sft`, `grpo score`, `grpo generate` and `grpo merge` against PyTorch (PEFT's lora.Linear).

usage: /usr/bin/python3 tests/train/lora_test.py --grpo PATH --tmp DIR [--only GROUP ...] [--threads N]

The peer is tests/reference/qwen2_ref.py with an adapter attached (qwen2_ref.attach_lora): every targeted
projection computes linear(x, W, b) + (alpha / r) * (x A^T) B^T, PEFT's lora_B(lora_A(x)) * scaling, the
branch in the compute dtype from the unrounded input x (with a bf16 base only the base product's operands
are rounded, as qwen2_ref.linear rounds them). Only A and B are nn.Parameters; the trainer around them is
sft_parity.py's: torch.optim.AdamW with HF's groups (every LoRA tensor decays: no "bias"/"norm" in its
name), clip_grad_norm_ over the adapters, LambdaLR with HF's lambdas. Groups:

  reference  the peer itself: the adapter forward equals the float64 forward of the merged weights
             (W + scale B A), B = 0 equals the base, autograd of A and B vs finite differences
  sft        --adapter INIT (random non-zero A and B, so every gradient is non-trivial), 3 steps, lr 1e-2,
             wd 0.1, linear schedule, active clipping, micro-batches: all-linear on an untied Qwen2 GQA
             model; q,v,o,down on a tied Qwen3 model with head_dim 16 (o_proj's in = H*D != hidden);
             --lora-base-dtype bf16 vs the peer with the bf16 base's rounding points; micro-batch sizes
             1 and 4. Adapters within 1e-5 per tensor (max|a-b| / max|b|), metrics as sft_parity; the bf16
             case is held to the float64 peer within 2x of torch fp32's own distance (see BF16_SFT)
  init       --lora-rank 4 --lora-alpha 8 --lr 0: PEFT's init (B = 0, A ~ U(+-1/sqrt(in))), PEFT's tensor
             names / shapes / F32 and adapter_config.json, no model.safetensors; short target names;
             step-1 loss = the base model's loss; the same seed gives the same adapter
  merge      grpo merge = W + scale B A (f32 and bf16 output, other tensors untouched, tokenizer files
             copied); grpo score --adapter vs grpo score of the merged model vs the float64 peer
             (<= 1e-4 on log-probs); score --dtype bf16 --adapter vs the peer with bf16 rounding points;
             greedy generate --adapter == generate on the merged model
  resume     --save-every 2: checkpoint-2's adapter and Adam moments vs the peer; --steps 2 then --steps 4
             --resume == --steps 4 (bit-identical, or <= 1e-7), with --adapter and with --lora-rank init
  bad        bad adapters (peft_type, use_dora, use_rslora, a wrong shape, a missing tensor, an unknown
             target module, no such dir) and --lora-targets with an unknown name: exit status 1..127 (no
             signal), one `grpo: error:` line (the last on stderr) naming the file and key / tensor
Prints one line per check and finally `N passed, M failed`; exit 0 iff all pass.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, HERE)
import torch  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check, median_abs, run_groups  # noqa: E402
from sft_parity import decay_groups, lr_lambda, make_data, metrics_diff, rel, sft_args, write_jsonl  # noqa: E402

# Tolerances.
WEIGHT_TOL = 1e-5    # the issue's: adapters after training, max|a-b| / max|b| per tensor (sft_parity's bar;
                     # the detail lines print torch's own fp32-vs-fp64 spread, the noise floor, for each case)
LOGPROB_TOL = 1e-4   # score: |logprob| differences, fp32 forward vs float64 (as tests/model/parity.py)
MERGE_TOL = 1e-6     # merged f32 weight vs W + scale B A in float64, max|a-b| / max|b| per tensor: an fp32
                     # product over r <= 8 terms plus one add is a few ulps (2^-24 = 6e-8) of the largest value
RESUME_TOL = 1e-7    # resumed vs uninterrupted adapters (the same arithmetic: bit-identical expected)
ERR = "grpo: error: "

MODELS = {
    "qwen2-gqa2": dict(seed=31, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=96, tied=False,
                       max_pos=256),
    "qwen3-gqa2-d16": dict(seed=32, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=48, vocab=80, tied=True,
                           max_pos=256, arch="qwen3", head_dim=16, eps=1e-5),
}
ALL = list(ref.LORA_TARGETS)
# sft cases: (model, rank, alpha, targets, base dtype). alpha / r: 4 and 1.
SFT_CASES = {
    "qwen2-all-linear": ("qwen2-gqa2", 4, 16, ALL, "f32"),
    "qwen3-q-v-o-down": ("qwen3-gqa2-d16", 8, 8, ["q_proj", "v_proj", "o_proj", "down_proj"], "f32"),
}
SFT = dict(steps=3, lr=1e-2, batch=4, micro=2, clip=0.5, wd=0.1, warmup=0, sched="linear")
# The bf16-base case. A bf16 base rounds the projections' operands (and output gradients), so an fp32 run's
# ulp-level differences flip roundings: torch's own fp32 replay differs from its float64 replay with the same
# rounding points by ~3e-4 per tensor in the step-1 gradients, and Adam turns that into adapter differences
# of 4.6e-4 (max) / 4e-5 (mean) per tensor at lr 1e-2, 1.6e-5 / 1.4e-6 at lr 1e-3, beyond the 1e-5 bar
# whatever grpo does. So, as tests/model/parity.py does for bf16 scores: lr 1e-3, and grpo's distance to the
# float64 peer (mean |a-b| / max|b|, worst tensor) must be within 2x of torch fp32's own distance, while the
# wrong numerics (an f32 base; the LoRA branch from the bf16-rounded input) are more than 10x the bar away.
BF16_SFT = dict(SFT, lr=1e-3)

GRPO = TMP = None
DIRS, DATA, INITS = {}, {}, {}


# ------------------------------------------------------------------ running grpo

def grpo(args, stdin="", timeout=900):
    return subprocess.run([GRPO] + [str(a) for a in args], input=stdin, capture_output=True, text=True,
                          encoding="utf-8", errors="replace", timeout=timeout)


def tail(p, n=600):
    return p.stderr.strip()[-n:].replace("\n", " | ")


def must(p, what):
    if p.returncode != 0:
        raise RuntimeError(f"`grpo {what}` exited {p.returncode}: {tail(p)}")
    return p


def read_metrics(out):
    return [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") if l.strip()]


def read_adapter(d):
    """(adapter_config.json, {name: tensor as stored}) with the test's own strict safetensors reader."""
    with open(os.path.join(d, "adapter_config.json")) as f:
        acfg = json.load(f)
    return acfg, ref.load_safetensors(os.path.join(d, "adapter_model.safetensors"))


def run_lora_sft(model, data, out, cfg, *extra, fresh=True):
    """grpo sft with LoRA options into out; returns (adapter tensors, metrics, seconds)."""
    if fresh:
        shutil.rmtree(out, ignore_errors=True)
    t0 = time.time()
    must(grpo(["sft", "--model", model, "--data", data, "--out", out, *sft_args(cfg), *extra]),
         f"sft ... {' '.join(map(str, extra))}")
    dt = time.time() - t0
    return read_adapter(out)[1], read_metrics(out), dt


def score_lines(seqs):
    return "".join(json.dumps({"tokens": s}) + "\n" for s in seqs)


def grpo_score(model, seqs, *extra):
    p = must(grpo(["score", "--model", model, *extra], score_lines(seqs)), f"score {' '.join(map(str, extra))}")
    out = [json.loads(l)["logprobs"] for l in p.stdout.splitlines() if l.strip()]
    if len(out) != len(seqs):
        raise RuntimeError(f"grpo score: {len(seqs)} lines in, {len(out)} out")
    return out


def max_abs(a, b):
    return max(abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v))


def mean_abs(a, b):
    d = [abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v)]
    return sum(d) / len(d)


def tensors_diff(got, want):
    """(worst relative diff, tensor name); raises if the names differ."""
    if set(got) != set(want):
        raise AssertionError(f"tensor names differ: extra {sorted(set(got) - set(want))[:3]}, "
                             f"missing {sorted(set(want) - set(got))[:3]}")
    return max(((rel(got[n].double(), want[n].double()), n) for n in want), key=lambda x: x[0])


def by_target(got, want):
    """Worst relative diff per kind of adapter tensor (q_proj.A, ..., down_proj.B): localises a mismatch."""
    kinds = {}
    for n in want:
        k = n.split(".")[-3].replace("_proj", "") + "." + n.split(".")[-2][-1]
        kinds[k] = max(kinds.get(k, 0.0), rel(got[n].double(), want[n].double()))
    return " ".join(f"{k}={v:.1e}" for k, v in sorted(kinds.items()))


# ------------------------------------------------------------------ the peer

class TorchLora:
    """Base model frozen (qwen2_ref.load_model: bf16 rounds its weights and projection operands), the
    adapter's A and B as nn.Parameters attached with qwen2_ref.attach_lora."""

    def __init__(self, model_dir, init, scale, dtype=torch.float32, bf16=False):
        self.m = ref.load_model(model_dir, dtype, bf16=bf16)
        self.names = list(init)
        self.params = {n: torch.nn.Parameter(init[n].to(dtype).clone()) for n in self.names}
        ref.attach_lora(self.m, self.params, scale)

    def completion_logprobs(self, sample):
        seq = sample["prompt_ids"] + sample["completion_ids"]
        P = len(sample["prompt_ids"])
        h = ref.hidden_states(self.m, torch.tensor(seq[:-1], dtype=torch.long))[P - 1:]
        lp = torch.log_softmax(ref.linear(self.m, h, self.m.lm_head), -1)
        return lp.gather(1, torch.tensor(seq[P:], dtype=torch.long)[:, None])[:, 0]

    def nll_sum(self, samples):
        tot, n = 0, 0
        for s in samples:
            lp = self.completion_logprobs(s)
            tot = tot - lp.sum()
            n += lp.numel()
        return tot, n


def proj_lora_from_rounded_x(m, li, target, x, w, b=None):
    """qwen2_ref.proj with the LoRA branch fed the bf16-rounded operand: the numerics the contract rules out."""
    y = ref.linear(m, x, w, b)
    ab = getattr(m, "lora", None) and m.lora.get((li, target))
    if ab:
        A, B = ab
        y = y + ((ref.round_bf16(x) @ A.t()) @ B.t()) * m.lora_scale
    return y


def torch_lora_sft(model_dir, init, scale, samples, cfg, dtype=torch.float32, bf16=False, variant=None):
    """The reference trainer. Returns ({PEFT name: final tensor}, [per-step metrics], {name: (exp_avg,
    exp_avg_sq)}). variant (yardsticks and diagnosis, never what grpo must do): "no-decay", "no-clip",
    "scale-alpha" (scale = alpha, not alpha / r), "lora-x-rounded" (the branch from the bf16-rounded input)."""
    if variant == "lora-x-rounded":
        saved = ref.proj
        ref.proj = proj_lora_from_rounded_x
        try:
            return torch_lora_sft(model_dir, init, scale, samples, cfg, dtype, bf16)
        finally:
            ref.proj = saved
    if variant == "scale-alpha":
        scale = scale * int(init[next(n for n in init if n.endswith("lora_A.weight"))].shape[0])
    R = TorchLora(model_dir, init, scale, dtype, bf16)
    P = R.params
    dn, nd = decay_groups(R.names)
    assert not nd, "every LoRA tensor decays"
    opt = torch.optim.AdamW([P[n] for n in dn], lr=cfg["lr"], betas=(0.9, 0.999), eps=cfg.get("eps", 1e-8),
                            weight_decay=0.0 if variant == "no-decay" else cfg["wd"])
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg["sched"], cfg["steps"], cfg["warmup"]))
    B, n = cfg["batch"], len(samples)
    params = [P[k] for k in R.names]
    metrics = []
    for s in range(cfg["steps"]):
        batch = [samples[(s * B + j) % n] for j in range(B)]
        opt.zero_grad(set_to_none=True)
        tot, ntok = R.nll_sum(batch)
        loss = tot / ntok
        loss.backward()
        if cfg["clip"] > 0 and variant != "no-clip":
            gn = float(torch.nn.utils.clip_grad_norm_(params, cfg["clip"]))
        else:
            gn = float(torch.norm(torch.stack([torch.norm(p.grad.detach(), 2) for p in params]), 2))
        lr_used = opt.param_groups[0]["lr"]
        opt.step()
        sch.step()
        metrics.append({"step": s + 1, "loss": float(loss), "grad_norm": gn, "lr": lr_used, "tokens": ntok})
    state = {k: (opt.state[P[k]]["exp_avg"].detach().clone(), opt.state[P[k]]["exp_avg_sq"].detach().clone())
             for k in R.names}
    return {k: P[k].detach().clone() for k in R.names}, metrics, state


# ------------------------------------------------------------------ fixtures

def setup():
    for name, kw in MODELS.items():
        d = os.path.join(TMP, "model-" + name)
        shutil.rmtree(d, ignore_errors=True)
        ref.make_model(d, **kw)
        DIRS[name] = d
        # 10 lines, batch 4: step 3 wraps around to lines 0, 1
        samples = make_data(kw["seed"] + 1000, kw["vocab"], 10)
        DATA[name] = (samples, write_jsonl(os.path.join(TMP, f"data-{name}.jsonl"), samples))


def model_cfg(name):
    with open(os.path.join(DIRS[name], "config.json")) as f:
        return json.load(f)


def init_adapter(model, r, alpha, targets, seed=5, b_std=0.05):
    """A random non-zero adapter dir for `model` (written once per argument set); returns (dir, tensors)."""
    key = (model, r, alpha, tuple(targets), seed, b_std)
    if key not in INITS:
        d = os.path.join(TMP, f"adapter-init-{model}-r{r}-a{alpha}-{'-'.join(t[:-5] for t in targets)}-s{seed}")
        shutil.rmtree(d, ignore_errors=True)
        t = ref.make_lora(model_cfg(model), r, targets, seed, b_std)
        ref.save_lora(d, t, r, alpha, targets, base=DIRS[model])
        INITS[key] = (d, t)
    return INITS[key]


# ------------------------------------------------------------------ reference

def merged_model(model_dir, tensors, scale, dtype=torch.float64):
    """qwen2_ref Model of W + scale B A (float64 merge), computing in dtype."""
    m = ref.load_model(model_dir, dtype)
    merged = ref.merge_lora(ref.load_weights(model_dir), tensors, scale)
    w = {n: merged[n].to(dtype) for n in ref.expected_shapes(m.cfg)}
    m.layers = ref.layer_dicts(m.cfg, w)
    return m


def c_reference_checks():
    for name in MODELS:
        d = DIRS[name]
        targets = SFT_CASES["qwen2-all-linear" if name == "qwen2-gqa2" else "qwen3-q-v-o-down"][3]
        r, alpha = 4, 8
        adir, t = init_adapter(name, r, alpha, targets, seed=7)
        seqs = [s["prompt_ids"] + s["completion_ids"] for s in DATA[name][0][:4]]
        with_lora = ref.score(ref.load_model(d, torch.float64, adapter=adir), seqs)
        merged = ref.score(merged_model(d, t, alpha / r), seqs)
        base = ref.score(ref.load_model(d, torch.float64), seqs)
        zero = {n: (v if n.endswith("lora_A.weight") else torch.zeros_like(v)) for n, v in t.items()}
        m0 = ref.attach_lora(ref.load_model(d, torch.float64), zero, alpha / r)
        dm, db, d0 = max_abs(with_lora, merged), mean_abs(with_lora, base), max_abs(ref.score(m0, seqs), base)
        check(f"reference/{name}/adapter-forward-equals-merged-weights", dm < 1e-12 and db > 1e-2 and d0 == 0,
              f"max |diff| {dm:.1e}; the adapter moves log-probs by {db:.2e} on average; B = 0 vs base {d0:.1e}")
    # autograd of A and B vs central finite differences (float64). (Not through a bf16 base: its rounding is
    # piecewise constant, so finite differences there measure jumps; the bf16 backward is qwen2_ref.linear's,
    # which sft_parity.py's bf16 group holds grpo to.)
    name = "qwen2-gqa2"
    _, t = init_adapter(name, 4, 16, ALL, seed=5)
    R = TorchLora(DIRS[name], t, 4.0, torch.float64)
    batch = DATA[name][0][:3]
    tot, _ = R.nll_sum(batch)
    tot.backward()
    worst = 0.0
    for nm in (ref.lora_module(0, "q_proj") + ".lora_A.weight", ref.lora_module(1, "down_proj") + ".lora_B.weight",
               ref.lora_module(1, "v_proj") + ".lora_A.weight", ref.lora_module(0, "gate_proj") + ".lora_B.weight",
               ref.lora_module(1, "o_proj") + ".lora_B.weight", ref.lora_module(0, "k_proj") + ".lora_A.weight"):
        p = R.params[nm]
        for idx in ((0, 1), (1, 2)):
            g, h = float(p.grad[idx]), 1e-6
            with torch.no_grad():
                p[idx] += h
                fp = float(R.nll_sum(batch)[0])
                p[idx] -= 2 * h
                fm = float(R.nll_sum(batch)[0])
                p[idx] += h
            worst = max(worst, abs((fp - fm) / (2 * h) - g) / max(1e-3, abs(g)))
    check(f"reference/{name}/autograd-vs-finite-differences", worst < 1e-6, f"max rel err {worst:.1e}")


# ------------------------------------------------------------------ sft

TORCH = {}


def torch_case(case, cfg, dtype=torch.float32, variant=None):
    model, r, alpha, targets, base = SFT_CASES[case]
    key = (case, tuple(sorted(cfg.items())), dtype, variant)
    if key not in TORCH:
        _, t = init_adapter(model, r, alpha, targets)
        TORCH[key] = torch_lora_sft(DIRS[model], t, alpha / r, DATA[model][0], cfg, dtype, base == "bf16", variant)
    return TORCH[key]


def grpo_case(case, cfg, tag=""):
    model, r, alpha, targets, base = SFT_CASES[case]
    adir, _ = init_adapter(model, r, alpha, targets)
    out = os.path.join(TMP, f"out-sft-{case}{tag}")
    return run_lora_sft(DIRS[model], DATA[model][1], out, cfg, "--adapter", adir, "--lora-base-dtype", base) + (out,)


def c_sft():
    for case, (model, r, alpha, targets, base) in SFT_CASES.items():
        adir, init = init_adapter(model, r, alpha, targets)
        want, want_m, _ = torch_case(case, SFT)
        w64, _, _ = torch_case(case, SFT, torch.float64)
        spread = tensors_diff(want, w64)[0]
        got, got_m, secs, out = grpo_case(case, SFT)
        clipped = all(m["grad_norm"] > SFT["clip"] for m in want_m)
        check(f"sft/{case}/torch-clipping-active", clipped,
              "grad_norm " + ", ".join(f"{m['grad_norm']:.3f}" for m in want_m) + f" > clip {SFT['clip']}")
        ok_m, desc = metrics_diff(got_m, want_m)
        check(f"sft/{case}/metrics-loss-grad_norm-lr-tokens", ok_m, desc)
        r_, worst = tensors_diff(got, want)
        detail = f"max rel {r_:.2e} ({worst.split('layers.')[-1]}); by target {by_target(got, want)}; " \
                 f"torch fp32-vs-fp64 {spread:.1e}; grpo {secs:.2f}s"
        if r_ > WEIGHT_TOL:
            detail += "; closest torch variants: " + "; ".join(
                f"{v} {tensors_diff(got, torch_case(case, SFT, variant=v)[0])[0]:.1e}"
                for v in ("no-decay", "no-clip", "scale-alpha"))
        check(f"sft/{case}/adapters-vs-torch-AdamW", r_ <= WEIGHT_TOL, detail)
        moved = max(rel(want[n], init[n]) for n in want)
        check(f"sft/{case}/adapters-moved", moved > 100 * WEIGHT_TOL
              and min(rel(got[n], init[n]) for n in init) > 0, f"max rel change {moved:.1e}")
        acfg = json.load(open(os.path.join(out, "adapter_config.json")))
        check(f"sft/{case}/output-adapter-dir",
              acfg.get("r") == r and acfg.get("lora_alpha") == alpha and acfg.get("peft_type") == "LORA"
              and sorted(acfg.get("target_modules") or []) == sorted(targets)
              and all(t.dtype == torch.float32 for t in got.values())
              and not os.path.exists(os.path.join(out, "model.safetensors")),
              f"r {acfg.get('r')}, lora_alpha {acfg.get('lora_alpha')}, target_modules {acfg.get('target_modules')}; "
              f"files {sorted(os.listdir(out))}")
    c_sft_bf16()


def mean_rel(got, want):
    """Worst tensor's mean |a-b| / max|b| (and its name)."""
    return max(((float((got[n].double() - want[n].double()).abs().mean() / want[n].double().abs().max()), n)
                for n in want), key=lambda x: x[0])


def c_sft_bf16():
    case, model, r, alpha = "qwen2-all-linear-bf16-base", "qwen2-gqa2", 4, 16
    adir, init = init_adapter(model, r, alpha, ALL)
    samples, data = DATA[model]

    def peer(dtype, bf16, variant=None):
        return torch_lora_sft(DIRS[model], init, alpha / r, samples, BF16_SFT, dtype, bf16, variant)
    w64, m64, _ = peer(torch.float64, True)
    w32, m32, _ = peer(torch.float32, True)
    wf, _, _ = peer(torch.float64, False)
    wv, _, _ = peer(torch.float64, True, "lora-x-rounded")
    got, got_m, secs = run_lora_sft(DIRS[model], data, os.path.join(TMP, f"out-sft-{case}"), BF16_SFT,
                                    "--adapter", adir, "--lora-base-dtype", "bf16")
    if set(got) != set(w64):
        raise AssertionError(f"tensor names differ: {sorted(set(got) ^ set(w64))[:4]}")
    (e_g, n_g), (e_t, _), (e_f, _), (e_v, _) = (mean_rel(x, w64) for x in (got, w32, wf, wv))
    # Torch fp32's own distance is a sample of the rounding-flip noise above, and moves with its BLAS (OpenBLAS
    # and the reference BLAS sum in other orders): the bar is the geometric midpoint between that noise (2x,
    # + 1e-7) and the nearest wrong numerics, so grpo must sit on the noise's side, by a factor.
    noise, wrong = 2 * e_t + 1e-7, min(e_f, e_v)
    bar = max(noise, (noise * wrong) ** 0.5)
    check(f"sft/{case}/wrong-numerics-far-beyond-the-bar", wrong > 10 * noise and wrong > 3 * bar,
          f"mean rel to the float64 peer: f32-base peer {e_f:.1e}, branch-from-rounded-x peer {e_v:.1e}; noise "
          f"{noise:.1e}, bar {bar:.1e}")
    check(f"sft/{case}/adapters-vs-peer-bf16-rounding-points", e_g <= bar,
          f"mean rel to the float64 bf16-base peer (worst tensor): grpo {e_g:.1e} ({n_g.split('layers.')[-1]}), "
          f"torch fp32 {e_t:.1e} (bar: geometric midpoint of 2x + 1e-7 and the wrong numerics = {bar:.1e}); "
          f"max rel: grpo {tensors_diff(got, w64)[0]:.1e}, "
          f"torch fp32 {tensors_diff(w32, w64)[0]:.1e}; grpo vs torch fp32 {tensors_diff(got, w32)[0]:.1e}; "
          f"f32-base peer {e_f:.1e}, branch-from-rounded-x peer {e_v:.1e}; grpo {secs:.2f}s")
    # metrics: sft_parity's 1e-5 bar, or 2x torch fp32's own distance where that is beyond it. loss and
    # grad_norm only at step 1 (the initial weights): after an update, bf16 rounding flips move them by up to
    # ~1e-4 relative in any fp32 implementation (measured: grpo 7e-5 at step 3, torch fp32 with OpenBLAS 1e-8
    # but 9e-6 on grad_norm, the f32-base wrong numerics 2e-5), so no bar there tells right from wrong; the
    # adapters' distance above does, by 100x. lr and tokens at every step.
    bad, worst = [], {}
    if [m.get("step") for m in got_m] != [m["step"] for m in m64]:
        bad.append(f"steps {[m.get('step') for m in got_m]}")
    for g, t, w in zip(got_m, m32, m64):
        for k in ("loss", "grad_norm", "lr") if w["step"] == 1 else ("lr",):
            v = g.get(k)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                bad.append(f"step {w['step']} {k}={v!r}")
                continue
            d, dt = abs(v - w[k]), abs(t[k] - w[k])
            worst[k] = max(worst.get(k, 0.0), d / abs(w[k]))
            if d > max(1e-5 * abs(w[k]), 2 * dt):
                bad.append(f"step {w['step']} {k} grpo {v!r} peer f64 {w[k]!r} torch fp32 {t[k]!r}")
        if g.get("tokens") != w["tokens"]:
            bad.append(f"step {w['step']} tokens grpo {g.get('tokens')} peer {w['tokens']}")
    check(f"sft/{case}/metrics-vs-peer", not bad,
          ", ".join(f"{k} rel {v:.1e}" for k, v in worst.items()) + ("; " + "; ".join(bad[:4]) if bad else ""))
    moved = min(rel(got[n], init[n]) for n in init)
    check(f"sft/{case}/adapters-moved", moved > 100 * noise, f"smallest rel change {moved:.1e}")


def c_accum():
    case = "qwen2-all-linear"
    want, want_m, _ = torch_case(case, SFT)
    runs = {}
    for mb in (1, 4):
        cfg = dict(SFT, micro=mb)
        got, got_m, secs, _ = grpo_case(case, cfg, f"-mb{mb}")
        runs[mb] = got
        ok_m, desc = metrics_diff(got_m, want_m)
        r_, worst = tensors_diff(got, want)
        check(f"accum/{case}/micro-batch-{mb}-vs-torch", r_ <= WEIGHT_TOL and ok_m,
              f"adapters max rel {r_:.2e} ({worst.split('layers.')[-1]}); metrics {desc}; grpo {secs:.2f}s")


# ------------------------------------------------------------------ init

def c_init():
    d = os.path.join(TMP, "model-init")
    shutil.rmtree(d, ignore_errors=True)
    kw = dict(seed=41, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=96, vocab=64, tied=False, max_pos=128)
    ref.make_model(d, **kw)
    cfg = json.load(open(os.path.join(d, "config.json")))
    samples = make_data(42, kw["vocab"], 4)
    data = write_jsonl(os.path.join(TMP, "data-init.jsonl"), samples)
    out = os.path.join(TMP, "out-init")
    shutil.rmtree(out, ignore_errors=True)
    base_args = ["--data", data, "--steps", 1, "--lr", 0, "--batch-size", 4, "--no-shuffle"]
    p = grpo(["sft", "--model", d, "--out", out, *base_args, "--lora-rank", 4, "--lora-alpha", 8])
    must(p, "sft --lora-rank 4 --lora-alpha 8 --lr 0")
    files = sorted(os.listdir(out))
    check("init/output-files", "adapter_config.json" in files and "adapter_model.safetensors" in files
          and "metrics.jsonl" in files and not any(f.startswith("model.safetensors") for f in files), f"{files}")
    acfg, t = read_adapter(out)
    want_cfg = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "bias": "none",
                "task_type": "CAUSAL_LM", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False}
    # numbers by value (lora_alpha may be written 8.0), but r an integer (PEFT sizes nn.Linear with it) and the
    # flags JSON booleans
    bad = {k: acfg.get(k, "<missing>") for k, v in want_cfg.items()
           if acfg.get(k, "<missing>") != v or isinstance(v, bool) != isinstance(acfg.get(k), bool)
           or (k == "r" and not isinstance(acfg.get(k), int))}
    tm = acfg.get("target_modules")
    check("init/adapter_config-fields", not bad and isinstance(tm, list) and sorted(tm) == sorted(ALL)
          and isinstance(acfg.get("base_model_name_or_path"), str),
          f"wrong: {bad}; target_modules {tm!r}; base_model_name_or_path {acfg.get('base_model_name_or_path')!r}")
    want_shapes = ref.lora_shapes(cfg, 4, ALL)
    got_shapes = {n: tuple(v.shape) for n, v in t.items()}
    diff = sorted(set(got_shapes.items()) ^ set(want_shapes.items()))
    check("init/peft-tensor-names-shapes-f32", not diff and all(v.dtype == torch.float32 for v in t.values()),
          f"{len(t)} tensors" + (f"; differ: {diff[:4]}" if diff else "") + f"; e.g. {sorted(t)[0]}")
    if diff:
        return
    Bs = [n for n in t if n.endswith("lora_B.weight")]
    check("init/B-all-zero", all(int((t[n] != 0).sum()) == 0 for n in Bs), f"{len(Bs)} B tensors")
    # A ~ U(-b, b), b = 1/sqrt(in): std b/sqrt(3). Per tensor (>= 256 elements) the sample std's relative
    # sd is 0.447/sqrt(N) <= 2.8%, so 20% is > 7 sd; pooled (14 tensors, 3840 elements: sd 0.7%) 10% is > 10 sd, and a
    # histogram bin's share (0.1, sd 0.005) off by 0.03 is 6 sd.
    pooled, worst_std, worst_max, worst_mean, over = [], 0.0, 1.0, 0.0, []
    for n in t:
        if not n.endswith("lora_A.weight"):
            continue
        a = t[n].double()
        b = 1 / math.sqrt(a.shape[1])
        u = a / b  # ~ U(-1, 1)
        pooled.append(u.flatten())
        if float(u.abs().max()) > 1 + 1e-6:
            over.append(n)
        worst_std = max(worst_std, abs(float(u.std()) * math.sqrt(3) - 1))
        worst_max = min(worst_max, float(u.abs().max()))
        worst_mean = max(worst_mean, abs(float(u.mean())) / math.sqrt(1 / (3 * u.numel())))
    allu = torch.cat(pooled)
    pstd = float(allu.std()) * math.sqrt(3)
    hist = torch.histc(allu, bins=10, min=-1, max=1) / allu.numel()
    check("init/A-kaiming-uniform-1/sqrt(in)",
          not over and worst_max > 0.8 and worst_std < 0.2 and abs(pstd - 1) < 0.1 and worst_mean < 5
          and float((hist - 0.1).abs().max()) < 0.03,
          f"max|A|/bound: all <= 1 {not over}, smallest max {worst_max:.3f}; std / (bound/sqrt 3): pooled {pstd:.3f}, "
          f"worst tensor off by {worst_std:.3f}; worst |mean| {worst_mean:.1f} sd; histogram of A/bound in 10 bins "
          f"{[round(float(x), 3) for x in hist]}")
    As = [t[n] for n in t if n.endswith("lora_A.weight")]
    check("init/A-tensors-distinct", all(not torch.equal(As[i][:, :8], As[j][:, :8])
                                         for i in range(len(As)) for j in range(i)), f"{len(As)} A tensors")
    # B = 0: the model is the base, so step 1's loss is the base model's; the default base dtype is bf16, held
    # to torch fp32 with the bf16 rounding points at sft_parity's metric bar (1e-5 relative)
    with torch.no_grad():
        tot, ntok = TorchLora(d, t, 2.0, torch.float32, bf16=True).nll_sum(samples)
        tot_f, _ = TorchLora(d, t, 2.0, torch.float32).nll_sum(samples)
    want_l, f32_l = float(tot / ntok), float(tot_f / ntok)
    m = read_metrics(out)
    got = m[0].get("loss") if m else None
    check("init/step1-loss-equals-base-model-loss-bf16-base",
          got is not None and abs(got - want_l) <= 1e-5 * abs(want_l) and abs(f32_l - want_l) > 1e-4 * abs(want_l),
          f"grpo {got!r}, base model with the bf16 base (the default) {want_l:.7f}, with an f32 base {f32_l:.7f}")
    # short names and a subset
    out2 = os.path.join(TMP, "out-init-short")
    shutil.rmtree(out2, ignore_errors=True)
    must(grpo(["sft", "--model", d, "--out", out2, *base_args, "--lora-rank", 2, "--lora-alpha", 4,
               "--lora-targets", "q,down"]), "sft --lora-targets q,down")
    acfg2, t2 = read_adapter(out2)
    want2 = ref.lora_shapes(cfg, 2, ["q_proj", "down_proj"])
    got2 = {n: tuple(v.shape) for n, v in t2.items()}
    check("init/short-target-names-q,down", got2 == want2 and sorted(acfg2.get("target_modules") or [])
          == ["down_proj", "q_proj"] and acfg2.get("r") == 2 and acfg2.get("lora_alpha") == 4,
          f"target_modules {acfg2.get('target_modules')!r}, {len(t2)} tensors (want {len(want2)})")
    # the same seed gives the same adapter
    out3 = os.path.join(TMP, "out-init-again")
    shutil.rmtree(out3, ignore_errors=True)
    must(grpo(["sft", "--model", d, "--out", out3, *base_args, "--lora-rank", 4, "--lora-alpha", 8]),
         "sft --lora-rank 4 (again)")
    t3 = read_adapter(out3)[1]
    check("init/same-seed-same-adapter", set(t3) == set(t) and all(torch.equal(t3[n], t[n]) for n in t))


# ------------------------------------------------------------------ merge

def c_merge():
    d = os.path.join(TMP, "model-merge")
    shutil.rmtree(d, ignore_errors=True)
    from grpo_parity import write_byte_tokenizer  # a real tokenizer.json, so that the files get copied
    ref.make_model(d, seed=51, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=259, tied=False,
                   max_pos=256)
    write_byte_tokenizer(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    r, alpha, targets = 8, 16, ["q_proj", "k_proj", "o_proj", "up_proj", "down_proj"]  # v, gate untouched
    adir = os.path.join(TMP, "adapter-merge")
    shutil.rmtree(adir, ignore_errors=True)
    t = ref.make_lora(cfg, r, targets, 52, b_std=0.05)
    ref.save_lora(adir, t, r, alpha, targets, base=d)
    scale = alpha / r
    base_w = ref.load_weights(d)
    want = ref.merge_lora(base_w, t, scale)
    out = os.path.join(TMP, "out-merged")
    shutil.rmtree(out, ignore_errors=True)
    must(grpo(["merge", "--model", d, "--adapter", adir, "--out", out]), "merge")
    mw = ref.load_weights(out)
    adapted = {n for n in want if any(f".{tg}.weight" in n for tg in targets) and ".layers." in n}
    worst = max(((rel(mw[n].double(), want[n]), n) for n in adapted), key=lambda x: x[0]) if set(mw) == set(want) \
        else (float("inf"), f"tensor names differ: {sorted(set(mw) ^ set(want))[:4]}")
    same = [n for n in want if n not in adapted and n in mw and torch.equal(mw[n], base_w[n])]
    moved = min(rel(want[n], base_w[n].double()) for n in adapted)
    check("merge/f32-weights-are-W+scale*B@A", worst[0] <= MERGE_TOL and len(same) == len(want) - len(adapted)
          and all(mw[n].dtype == torch.float32 for n in mw) and moved > 1e-2,
          f"max rel {worst[0]:.1e} ({worst[1]}) over {len(adapted)} adapted weights (smallest change by the "
          f"adapter {moved:.1e}); {len(same)}/{len(want) - len(adapted)} other tensors bit-identical")
    cout = json.load(open(os.path.join(out, "config.json")))
    # the model-defining keys (sft_parity's list and the architecture): grpo writes config.json itself, as for a
    # full fine-tune, without keys that are inert here (sliding_window with use_sliding_window false)
    keys = ("architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
            "max_position_embeddings", "eos_token_id", "bos_token_id", "use_sliding_window")
    cdiff = {k: (cfg.get(k), cout.get(k)) for k in keys if cfg.get(k) != cout.get(k)}
    tok_same = all(os.path.exists(os.path.join(out, f)) and open(os.path.join(out, f), "rb").read()
                   == open(os.path.join(d, f), "rb").read() for f in ("tokenizer.json", "tokenizer_config.json"))
    check("merge/plain-hf-dir-config-and-tokenizer-files", not cdiff and tok_same and not os.path.exists(
        os.path.join(out, "adapter_config.json")) and cout.get("torch_dtype") == "float32",
          f"config differences {cdiff}; tokenizer files copied {tok_same}; files {sorted(os.listdir(out))}")
    ref.load_model(out)  # the independent loader accepts it (raises otherwise)

    # score: base + adapter == merged == float64 peer
    import random
    rng = random.Random(53)
    seqs = [[rng.randrange(259) for _ in range(n)] for n in (2, 7, 16, 33, 64)]
    s_ad = grpo_score(d, seqs, "--adapter", adir, "--dtype", "f32")
    s_mg = grpo_score(out, seqs, "--dtype", "f32")
    s_base = grpo_score(d, seqs, "--dtype", "f32")
    peer = ref.score(ref.load_model(d, torch.float64, adapter=adir), seqs)
    d1, d2, d3, eff = max_abs(s_ad, s_mg), max_abs(s_ad, peer), max_abs(s_mg, peer), mean_abs(s_base, peer)
    check("merge/score-adapter-vs-score-merged", d1 <= LOGPROB_TOL, f"max |diff| {d1:.1e}")
    check("merge/score-adapter-vs-float64-peer", d2 <= LOGPROB_TOL and d3 <= LOGPROB_TOL and eff > 1e-2,
          f"adapter {d2:.1e}, merged {d3:.1e}; the adapter moves log-probs by {eff:.2e} on average")

    # bf16: merge --dtype bf16 is the bf16 rounding of the merged weights (a double rounding f64 -> f32 -> bf16
    # can land one bf16 ulp away only on a value within an f32 ulp of a bf16 tie)
    outb = os.path.join(TMP, "out-merged-bf16")
    shutil.rmtree(outb, ignore_errors=True)
    must(grpo(["merge", "--model", d, "--adapter", adir, "--out", outb, "--dtype", "bf16"]), "merge --dtype bf16")
    mb = ref.load_weights(outb)
    n_off, n_tot, far = 0, 0, []
    for n in want:
        if n not in mb or mb[n].dtype != torch.bfloat16:
            far.append(n)
            continue
        w = want[n].float().to(torch.bfloat16)
        off = mb[n] != w
        n_off += int(off.sum())
        n_tot += w.numel()
        ulp = (w.float().abs() * 2 ** -7).clamp(min=2 ** -133)
        if bool(((mb[n].float() - w.float()).abs() > ulp * 1.0001).any()):
            far.append(n)
    cb = json.load(open(os.path.join(outb, "config.json")))
    check("merge/bf16-output-is-rounded-merge", not far and n_off <= max(2, n_tot // 1000)
          and cb.get("torch_dtype") == "bfloat16",
          f"{n_off}/{n_tot} elements one ulp off; tensors off by more / not bf16: {far[:3]}; "
          f"torch_dtype {cb.get('torch_dtype')!r}")

    # score --dtype bf16 with an adapter: bf16 base (rounding points of qwen2_ref.linear), the branch in fp32.
    # Yardstick as tests/model/parity.py: a flipped bf16 rounding moves later log-probs by up to ~1e-2, so grpo's
    # median |diff| to the float64 peer with the same rounding points must be within 2x of torch fp32's own, and
    # the mean far below what the rounding moves (the unrounded f64 peer). The median, not the mean: oneDNN's AMX
    # GEMM sums in another order than the reference, and the few roundings that flip then move whole tails (on a
    # Sapphire Rapids: mean 1.2e-4, median 1.9e-7 against torch fp32's 2.2e-7; with AVX512-BF16, mean 2.1e-7)
    want_b = ref.score(ref.load_model(d, torch.float64, bf16=True, adapter=adir), seqs)
    t32_b = ref.score(ref.load_model(d, torch.float32, bf16=True, adapter=adir), seqs)
    got_b = grpo_score(d, seqs, "--adapter", adir, "--dtype", "bf16")
    e_g, e_t, e_x = mean_abs(got_b, want_b), mean_abs(t32_b, want_b), mean_abs(peer, want_b)
    m_g, m_t = median_abs(got_b, want_b), median_abs(t32_b, want_b)
    check("merge/score-bf16-adapter-vs-peer-bf16-base", m_g <= 2 * m_t + 1e-6 and e_g <= e_x / 3,
          f"mean |diff| to the bf16-base peer: grpo {e_g:.2e}, torch fp32 {e_t:.2e}, unrounded {e_x:.2e}; "
          f"max grpo {max_abs(got_b, want_b):.2e}; median grpo {m_g:.2e}, torch {m_t:.2e}")

    # generate: greedy with the adapter == greedy on the merged model (tokens and their log-probs)
    prompts = "".join(json.dumps({"tokens": s[:5]}) + "\n" for s in seqs[2:])
    gen = ["generate", "--jsonl", "--temperature", 0, "--max-new-tokens", 12, "--dtype", "f32"]
    g_ad = must(grpo([*gen, "--model", d, "--adapter", adir], prompts), "generate --adapter").stdout
    g_mg = must(grpo([*gen, "--model", out], prompts), "generate (merged)").stdout
    g_bs = must(grpo([*gen, "--model", d], prompts), "generate (base)").stdout
    ja = [json.loads(l) for l in g_ad.splitlines() if l.strip()]
    jm = [json.loads(l) for l in g_mg.splitlines() if l.strip()]
    jb = [json.loads(l) for l in g_bs.splitlines() if l.strip()]
    same_tok = len(ja) == len(jm) == 3 and all(a["tokens"] == b["tokens"] for a, b in zip(ja, jm))
    lpd = max((abs(x - y) for a, b in zip(ja, jm) for x, y in zip(a["logprobs"], b["logprobs"])), default=0.0) \
        if same_tok else float("inf")
    check("merge/generate-adapter-equals-generate-merged", same_tok and lpd <= LOGPROB_TOL
          and any(a["tokens"] != b["tokens"] for a, b in zip(ja, jb)),
          f"tokens equal {same_tok}; logprobs max |diff| {lpd:.1e}; differs from the base's generation "
          f"{any(a['tokens'] != b['tokens'] for a, b in zip(ja, jb))}")


# ------------------------------------------------------------------ resume

RES = dict(steps=4, lr=1e-2, batch=2, micro=1, clip=1.0, wd=0.1, warmup=0, sched="constant")


def ckpt_files_ok(ck, names):
    files = sorted(os.listdir(ck)) if os.path.isdir(ck) else []
    need = {"adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "trainer_state.json"}
    if not need <= set(files):
        return False, f"{os.path.basename(ck)}: files {files}"
    opt = ref.load_safetensors(os.path.join(ck, "optimizer.safetensors"))
    want = {f"exp_avg.{n}" for n in names} | {f"exp_avg_sq.{n}" for n in names}
    moments = {n for n in opt if n.startswith(("exp_avg.", "exp_avg_sq."))}
    if moments != want:
        return False, f"optimizer moments: extra {sorted(moments - want)[:3]}, missing {sorted(want - moments)[:3]}"
    if any(n in files for n in ("model.safetensors",)):
        return False, f"{os.path.basename(ck)} holds a model.safetensors"
    return True, f"{len(opt)} optimizer tensors"


def c_resume():
    name = "qwen2-gqa2"
    model, (samples, data) = DIRS[name], DATA[name]
    r, alpha = 4, 16
    adir, init = init_adapter(name, r, alpha, ALL)
    cfg2 = dict(RES, steps=2)
    for label, lora in (("adapter-init", ["--adapter", adir, "--lora-base-dtype", "f32"]),
                        ("rank-init", ["--lora-rank", 4, "--lora-alpha", 8, "--lora-targets", "q_proj,down_proj",
                                       "--lora-base-dtype", "f32"])):
        A = os.path.join(TMP, f"out-resume-{label}-straight")
        a_w, a_m, secs = run_lora_sft(model, data, A, RES, "--save-every", 2, *lora)
        names = sorted(a_w)
        for k in (2, 4):
            ok, det = ckpt_files_ok(os.path.join(A, f"checkpoint-{k}"), names)
            check(f"resume/{label}/checkpoint-{k}-files", ok, det)
        if label == "adapter-init":
            # checkpoint-2 and the final adapters vs the peer; the Adam moments too
            w2, _, st2 = torch_lora_sft(model, init, alpha / r, samples, dict(RES, steps=2))
            w4, m4, _ = torch_lora_sft(model, init, alpha / r, samples, RES)
            ck = os.path.join(A, "checkpoint-2")
            c_w = ref.load_safetensors(os.path.join(ck, "adapter_model.safetensors"))
            opt = ref.load_safetensors(os.path.join(ck, "optimizer.safetensors"))
            ea = max(rel(opt[f"exp_avg.{n}"].double(), st2[n][0].double()) for n in names)
            es = max(rel(opt[f"exp_avg_sq.{n}"].double(), st2[n][1].double()) for n in names)
            rw = tensors_diff(c_w, w2)[0]
            check(f"resume/{label}/checkpoint-2-adapters-and-moments-vs-torch",
                  rw <= WEIGHT_TOL and ea <= WEIGHT_TOL and es <= WEIGHT_TOL,
                  f"adapters {rw:.1e}, exp_avg {ea:.1e}, exp_avg_sq {es:.1e} (max rel per tensor)")
            rf = tensors_diff(a_w, w4)[0]
            ok_m, desc = metrics_diff(a_m, m4)
            check(f"resume/{label}/final-vs-torch", rf <= WEIGHT_TOL and ok_m, f"adapters {rf:.1e}; {desc}")
        B = os.path.join(TMP, f"out-resume-{label}-interrupted")
        run_lora_sft(model, data, B, cfg2, "--save-every", 2, *lora)
        b_w, b_m, _ = run_lora_sft(model, data, B, RES, "--save-every", 2, *lora, "--resume", fresh=False)
        bitwise = open(os.path.join(A, "adapter_model.safetensors"), "rb").read() == \
            open(os.path.join(B, "adapter_model.safetensors"), "rb").read()
        rd, wn = tensors_diff(b_w, a_w)
        ma = {m["step"]: m for m in a_m}
        mb = {m["step"]: m for m in b_m}
        mdiff = [s for s in (3, 4) if s not in mb or any(ma[s].get(k) != mb[s].get(k) for k in ("loss", "grad_norm"))]
        check(f"resume/{label}/steps-2-then-resume-to-4-equals-4", rd <= RESUME_TOL and not mdiff,
              f"{'bit-identical files' if bitwise else f'max rel {rd:.1e} ({wn})'}; metrics of steps 3, 4 "
              f"{'equal' if not mdiff else f'differ at {mdiff}'}")


# ------------------------------------------------------------------ bad input

def c_bad():
    name = "qwen2-gqa2"
    model = DIRS[name]
    cfg = model_cfg(name)
    r, alpha = 2, 4
    good = ref.make_lora(cfg, r, ALL, 61)

    def bad_dir(label, config=None, tensors=None, targets=ALL):
        d = os.path.join(TMP, f"adapter-bad-{label}")
        shutil.rmtree(d, ignore_errors=True)
        ref.save_lora(d, good if tensors is None else tensors, r, alpha, ALL, base=model, config=config)
        if targets is not ALL:  # lora_config normalises (and checks) target names: write the raw list
            acfg = json.load(open(os.path.join(d, "adapter_config.json")))
            acfg["target_modules"] = targets
            with open(os.path.join(d, "adapter_config.json"), "w") as f:
                json.dump(acfg, f, indent=2)
        return d

    wrong = dict(good)
    wname = ref.lora_module(1, "v_proj") + ".lora_A.weight"
    wrong[wname] = torch.zeros(r, cfg["hidden_size"] + 1)
    missing = dict(good)
    mname = ref.lora_module(0, "down_proj") + ".lora_B.weight"
    del missing[mname]
    cases = [
        ("peft-type", bad_dir("peft-type", {"peft_type": "PREFIX_TUNING"}), ["adapter_config.json", "peft_type"]),
        ("use-dora", bad_dir("use-dora", {"use_dora": True}), ["adapter_config.json", "use_dora"]),
        ("use-rslora", bad_dir("use-rslora", {"use_rslora": True}), ["adapter_config.json", "use_rslora"]),
        ("wrong-shape", bad_dir("wrong-shape", tensors=wrong),
         ["adapter_model.safetensors", "layers.1.self_attn.v_proj.lora_A"]),
        ("missing-tensor", bad_dir("missing-tensor", tensors=missing),
         ["adapter_model.safetensors", "layers.0.mlp.down_proj.lora_B"]),
        ("unknown-target", bad_dir("unknown-target", targets=["q_proj", "qkv_proj"]),
         ["adapter_config.json", "qkv_proj"]),
        ("no-such-dir", os.path.join(TMP, "adapter-does-not-exist"), ["adapter-does-not-exist"]),
    ]
    data = DATA[name][1]
    seq = score_lines([DATA[name][0][0]["prompt_ids"] + DATA[name][0][0]["completion_ids"]])
    for label, adir, words in cases:
        outm = os.path.join(TMP, f"out-bad-merge-{label}")
        outs = os.path.join(TMP, f"out-bad-sft-{label}")
        for o in (outm, outs):
            shutil.rmtree(o, ignore_errors=True)
        for cmd, p in (("score", grpo(["score", "--model", model, "--adapter", adir], seq)),
                       ("merge", grpo(["merge", "--model", model, "--adapter", adir, "--out", outm])),
                       ("sft", grpo(["sft", "--model", model, "--data", data, "--out", outs, "--adapter", adir,
                                     "--steps", 1]))):
            why = contract_error(p, words)
            check(f"bad/{label}/{cmd}", why is None, why or err_line(p))
    p = grpo(["sft", "--model", model, "--data", data, "--out", os.path.join(TMP, "out-bad-targets"), "--steps", 1,
              "--lora-rank", 2, "--lora-targets", "q_proj,qkv_proj"])
    why = contract_error(p, ["qkv_proj"])
    check("bad/lora-targets-option-unknown-name/sft", why is None, why or err_line(p))


def err_line(p):
    return next((l for l in p.stderr.splitlines() if l.startswith(ERR)), "")


def contract_error(p, words):
    """None if p failed the contract way, else why not: exit status 1..127 (not a signal), exactly one
    `grpo: error:` line, the last stderr line, naming every one of words; no crash text; empty stdout."""
    lines = p.stderr.strip().splitlines()
    errs = [l for l in lines if l.startswith(ERR)]
    if not 0 < p.returncode < 128:
        return f"exit {p.returncode}: {tail(p, 300)}"
    if len(errs) != 1 or lines[-1] != errs[0]:
        return f"{len(errs)} '{ERR.strip()}' lines / not last: {tail(p, 300)}"
    if any(w in p.stderr for w in ("Traceback", "Segmentation", "Aborted", "AddressSanitizer", "assert")):
        return f"crash text on stderr: {tail(p, 300)}"
    missing = [w for w in words if w not in errs[0]]
    if missing:
        return f"the error line does not name {missing}: {errs[0]!r}"
    if p.stdout.strip():
        return f"stdout not empty: {p.stdout[:100]!r}"
    return None


GROUPS = {"reference": c_reference_checks, "sft": c_sft, "accum": c_accum, "init": c_init, "merge": c_merge,
          "resume": c_resume, "bad": c_bad}


def main():
    global GRPO, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--only", nargs="*", help="groups to run: " + " ".join(GROUPS))
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (tiny tensors: 1)")
    a = ap.parse_args()
    GRPO, TMP = os.path.abspath(a.grpo), os.path.abspath(a.tmp)
    os.makedirs(TMP, exist_ok=True)
    torch.set_num_threads(a.threads)
    return run_groups(setup, GROUPS, a.only)


if __name__ == "__main__":
    sys.exit(main())

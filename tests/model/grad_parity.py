#!/usr/bin/python3
"""Gradient parity: grad_tool's dL/dparam and logp vs float64 torch autograd.

usage: /usr/bin/python3 tests/model/grad_parity.py --grad-tool PATH_TO_GRAD_TOOL --tmp DIR

For tiny random Qwen2 models (tests/reference/qwen2_ref.py make_model, f32 weights) and packed
batches of sequences, L = sum_i dlogp_i * logp_i with logp_i = log_softmax(logits_i)[targets_i]
(targets_i = -1 contributes nothing). The reference is a separate differentiable float64 forward
written here (checked first against qwen2_ref.logits), whose leaves are the model's weights.
Checks, per run: every gradient tensor within REL_TOL of the reference (error relative to the
reference tensor's largest magnitude), logp within LOGP_TOL (exactly 0 where target < 0), and
--recompute and --fused (the SFT path) within RECOMPUTE_TOL of the plain run. "entropy" batches add
sum_i dent_i * H_i (H_i the entropy of row i's softmax at temperature 0.7, GRPO's entropy bonus) to
L and also check H_i (LOGP_TOL).
Prints one line per check, the worst error per tensor kind, and finally `N passed, M failed`;
exit 0 iff all pass.
"""
import argparse
import bisect
import json
import math
import os
import random
import re
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/reference free of __pycache__
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import qwen2_ref as ref  # noqa: E402

REL_TOL = 1e-4        # fixed by the issue: max|g_c - g_t| / max|g_t| per tensor
LOGP_TOL = 1e-4       # abs
RECOMPUTE_TOL = 1e-5  # rel, --recompute vs plain C run
TINY = 1e-30

# Mixed lengths: 1 (a lone token), 129 and 140 cross the 128-query attention block, unsorted.
LENGTHS = [33, 1, 140, 5, 129, 2, 17]

T = dict(layers=2, intermediate=88)
CASES = [
    # Qwen3: q/k norms, no biases, head_dim not hidden/heads (H*D = 96 != 64)
    ("qwen3-tied-gqa2-d24", dict(T, seed=205, hidden=64, heads=4, kv_heads=2, vocab=400, tied=True, arch="qwen3",
                                 head_dim=24)),
    ("qwen3-untied-gqa4-d32", dict(T, seed=206, hidden=48, heads=8, kv_heads=2, vocab=350, tied=False,
                                   arch="qwen3", head_dim=32, rope_theta=1e6)),
    # Llama (modeling_llama.py): no biases, Llama 3's RoPE rescaling (an original context of 128: D = 16's
    # frequencies in all three bands)
    ("llama-tied-gqa2-llama3", dict(T, seed=207, hidden=64, heads=4, kv_heads=2, vocab=400, tied=True, arch="llama",
                                    rope_theta=5e5, rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                  "original_max_position_embeddings": 128})),
    # Mistral (modeling_mistral.py) with a 40-key sliding window: the 129- and 140-token rows' later query blocks
    # start past key 0
    ("mistral-untied-gqa2-window40", dict(T, seed=208, hidden=64, heads=4, kv_heads=2, vocab=400, tied=False,
                                          arch="mistral", sliding_window=40)),
    # Gemma 3 (modeling_gemma3.py): local layers (a 40-key window, RoPE base 1e4) and a global one, (1 + w) norms,
    # post-norms, sqrt(hidden)-scaled embeddings, GELU-tanh, query_pre_attn_scalar 20
    ("gemma3-tied-gqa2-window40", dict(T, seed=209, hidden=64, heads=4, kv_heads=2, vocab=400, tied=True,
                                       arch="gemma3", head_dim=24, rope_theta=1e6, sliding_window=40, pattern=3,
                                       query_scalar=20)),
    ("untied-mha-h32", dict(T, seed=201, hidden=32, heads=4, kv_heads=4, vocab=300, tied=False)),
    ("tied-gqa2-h64", dict(T, seed=202, hidden=64, heads=4, kv_heads=2, vocab=512, tied=True)),
    ("untied-mqa4-h64", dict(T, seed=203, hidden=64, heads=4, kv_heads=1, vocab=600, tied=False)),
    ("tied-gqa4x2-theta1e6-eps1e-5", dict(T, seed=204, hidden=64, heads=8, kv_heads=2, vocab=400, tied=True,
                                          rope_theta=1e6, eps=1e-5)),
]


# ----------------------------------------------------------------- float64 differentiable reference

def leaves(model_dir):
    """{HF name: float64 leaf tensor requiring grad} and the config."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    raw = ref.load_weights(model_dir)
    return {n: t.to(torch.float64).requires_grad_(True) for n, t in raw.items()}, cfg


def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, D, inv):
    """x (T, heads, D), rotate-half layout: pairs (i, i + D/2) rotated by pos * inv[i] (transformers' inv_freq:
    theta^(-2i/D), or Llama 3's rescaling of it)."""
    Tn, half = x.shape[0], D // 2
    ang = torch.arange(Tn, dtype=torch.float64)[:, None] * inv[None, :]  # (T, half)
    c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, b * c + a * s], -1)


def seq_logits(P, cfg, toks):
    """Logits (T, V) of one sequence, positions from 0."""
    H, KVH = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, eps = ref.head_dim(cfg), cfg["rms_norm_eps"]
    gemma = ref.is_gemma(cfg)  # modeling_gemma3.py: (1 + w) norms, post-norms, GELU-tanh, local/global layers

    def norm(x, name):
        return rmsnorm(x, 1 + P[name] if gemma else P[name], eps)

    n = len(toks)
    ids = torch.tensor(toks, dtype=torch.long)
    x = P["model.embed_tokens.weight"][ids] * ref.embed_scale(cfg)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        inv = ref.layer_inv_freq(cfg, l, D)
        causal = ~ref.causal_mask(n, ref.layer_window(cfg, l))
        h = norm(x, p + "input_layernorm.weight")
        zero = torch.zeros((), dtype=torch.float64)  # no q/k/v biases (Qwen3)
        q = (h @ P[p + "self_attn.q_proj.weight"].t() + P.get(p + "self_attn.q_proj.bias", zero)).view(n, H, D)
        k = (h @ P[p + "self_attn.k_proj.weight"].t() + P.get(p + "self_attn.k_proj.bias", zero)).view(n, KVH, D)
        v = (h @ P[p + "self_attn.v_proj.weight"].t() + P.get(p + "self_attn.v_proj.bias", zero)).view(n, KVH, D)
        if p + "self_attn.q_norm.weight" in P:  # Qwen3: RMSNorm over each head, before RoPE
            q = norm(q, p + "self_attn.q_norm.weight")
            k = norm(k, p + "self_attn.k_norm.weight")
        q, k = rope(q, D, inv), rope(k, D, inv)
        heads = []
        for hh in range(H):
            g = hh // (H // KVH)  # query head hh reads kv head hh / (H/KVH)
            s = (q[:, hh, :] @ k[:, g, :].t()) * ref.attn_scale(cfg, D)
            s = s.masked_fill(~causal, float("-inf"))
            heads.append(torch.softmax(s, -1) @ v[:, g, :])
        a = torch.cat(heads, -1)  # (n, H*D), head-major columns
        o = a @ P[p + "self_attn.o_proj.weight"].t()
        x = x + (norm(o, p + "post_attention_layernorm.weight") if gemma else o)
        h = norm(x, p + ("pre_feedforward_layernorm.weight" if gemma else "post_attention_layernorm.weight"))
        gate = h @ P[p + "mlp.gate_proj.weight"].t()
        up = h @ P[p + "mlp.up_proj.weight"].t()
        act = torch.nn.functional.gelu(gate, approximate="tanh") if gemma else gate * torch.sigmoid(gate)
        d = (act * up) @ P[p + "mlp.down_proj.weight"].t()
        x = x + (norm(d, p + "post_feedforward_layernorm.weight") if gemma else d)
    x = norm(x, "model.norm.weight")
    W = P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"]
    return x @ W.t()


def torch_grads(model_dir, batch):
    """(logp concatenated (N,) float64, {HF name: dL/dparam float64}, entropy (N,) or None).
    With batch["dent"]: L += sum dent_i * H_i, H_i the entropy of row i's distribution (rows with a
    target); batch["logit_scale"] multiplies the logits first (1/temperature, as GRPO)."""
    P, cfg = leaves(model_dir)
    L = torch.zeros((), dtype=torch.float64)
    lps, ents = [], []
    scale = batch.get("logit_scale", 1.0)
    dents = batch.get("dent", [None] * len(batch["tokens"]))
    for toks, tg, dl, de in zip(batch["tokens"], batch["targets"], batch["dlogp"], dents):
        lsm = F.log_softmax(seq_logits(P, cfg, toks) * scale, -1)
        tgt = torch.tensor(tg, dtype=torch.long)
        zero = torch.zeros((), dtype=torch.float64)
        lp = torch.where(tgt >= 0, lsm.gather(1, tgt.clamp(min=0)[:, None])[:, 0], zero)
        L = L + (torch.tensor(dl, dtype=torch.float64) * lp).sum()
        lps.append(lp.detach())
        if de is not None:
            H = torch.where(tgt >= 0, -(lsm.exp() * lsm).sum(-1), zero)
            L = L + (torch.tensor(de, dtype=torch.float64) * H).sum()
            ents.append(H.detach())
    L.backward()
    grads = {n: t.grad if t.grad is not None else torch.zeros_like(t) for n, t in P.items()}
    return torch.cat(lps), grads, torch.cat(ents) if ents else None


# ----------------------------------------------------------------- batches

def f32(x):
    return float(torch.tensor(x, dtype=torch.float32))  # dlogp exactly representable in the C tool's float


def random_batch(seed, V, lengths=LENGTHS):
    """Random tokens/targets (~20% -1); dlogp random everywhere (also where target < 0: must be ignored)."""
    r = random.Random(seed)
    b = {"tokens": [], "targets": [], "dlogp": []}
    for n in lengths:
        b["tokens"].append([r.randrange(V) for _ in range(n)])
        b["targets"].append([-1 if r.random() < 0.2 else r.randrange(V) for _ in range(n)])
        b["dlogp"].append([f32(r.uniform(-1.5, 1.5)) for _ in range(n)])
    return b


def entropy_batch(seed, V, lengths=LENGTHS):
    """A random batch whose loss also weights each row's entropy (GRPO's entropy bonus), at temperature 0.7."""
    b = random_batch(seed, V, lengths)
    r = random.Random(seed + 99)
    b["dent"] = [[f32(r.uniform(-1.0, 1.0)) for _ in toks] for toks in b["tokens"]]
    b["logit_scale"] = f32(1 / 0.7)
    return b


def sft_batch(seed, V, lengths=LENGTHS):
    """SFT-like: target = next token in a completion suffix, dlogp = -1/ntargets on every position."""
    r = random.Random(seed)
    b = {"tokens": [], "targets": [], "dlogp": []}
    for n in lengths:
        toks = [r.randrange(V) for _ in range(n)]
        p = r.randrange(n)  # prompt length
        b["tokens"].append(toks)
        b["targets"].append([toks[i + 1] if p - 1 <= i < n - 1 else -1 for i in range(n)])
    nt = sum(t >= 0 for tg in b["targets"] for t in tg)
    b["dlogp"] = [[f32(-1.0 / nt)] * len(tg) for tg in b["targets"]]
    return b


# ----------------------------------------------------------------- C side

def run_tool(tool, model_dir, batch, path, flags=()):
    inp = path + ".json"
    with open(inp, "w") as f:
        json.dump(batch, f)
    out = path + "".join(f.replace("--", ".") for f in flags) + ".safetensors"
    if os.path.exists(out):
        os.remove(out)
    args = [tool, model_dir, inp, out] + list(flags)
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` exited {p.returncode}: {p.stderr.strip()[-400:]}")
    got = ref.load_safetensors(out)
    for name, t in got.items():
        if t.dtype != torch.float32:
            raise RuntimeError(f"{name}: stored as {ref.ST_TAGS[t.dtype]}, expected F32")
    return got


def kind(name):
    return re.sub(r"layers\.\d+\.", "layers.*.", name[len("grad."):] if name.startswith("grad.") else name)


def rel_err(a, b):
    """max|a - b| / max(max|b|, TINY), both as float64."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    return float((a - b).abs().max()) / max(float(b.abs().max()), TINY) if b.numel() else 0.0


def diagnose(n, gc, gt, cfg):
    """A few hints for a failing tensor: best-fit factor (sign/scale bugs), transposition, and for
    the attention projections which heads are wrong (GQA mapping bugs)."""
    gc, gt = gc.to(torch.float64), gt.to(torch.float64)
    s = float((gc * gt).sum()) / max(float((gt * gt).sum()), TINY)
    hints = [f"best-fit factor {s:.4g} (rel err after it {rel_err(gc, s * gt):.1e})"]
    if gc.dim() == 2 and gc.shape[0] == gc.shape[1]:
        hints.append(f"transposed rel {rel_err(gc.t(), gt):.1e}")
    H, KVH = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = ref.head_dim(cfg)
    nh = H if ".q_proj." in n or ".o_proj." in n else KVH if (".k_proj." in n or ".v_proj." in n) else 0
    if nh:
        scale = max(float(gt.abs().max()), TINY)
        errs = []
        for h in range(nh):
            blk = (lambda t: t[:, h * D:(h + 1) * D]) if ".o_proj." in n else (lambda t: t[h * D:(h + 1) * D])
            errs.append(float((blk(gc) - blk(gt)).abs().max()) / scale)
        hints.append("per-head rel " + " ".join(f"{e:.0e}" for e in errs))
    elif gc.dim() == 2:
        rows = ((gc - gt).abs().amax(1) > REL_TOL * float(gt.abs().max())).nonzero()[:, 0].tolist()
        hints.append(f"{len(rows)}/{gc.shape[0]} rows off (first {rows[:5]})")
    return ", ".join(hints)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grad-tool", required=True)
    ap.add_argument("--tmp", required=True)
    a = ap.parse_args()
    tool = os.path.abspath(a.grad_tool)
    os.makedirs(a.tmp, exist_ok=True)
    results = []
    worst_kind = {}     # tensor kind -> (max rel err, where)
    worst_rc = [0.0]    # recompute vs plain

    def case(name, fn):
        try:
            msg = fn()
            results.append(True)
            print(f"PASS  {name:50s} {msg or ''}")
        except Exception as e:  # report and keep going: one broken case shouldn't hide the rest
            results.append(False)
            print(f"FAIL  {name:50s} {type(e).__name__}: {e}")
        sys.stdout.flush()

    # The reference forward must match the shared reference model before it can judge gradients.
    def ref_forward():
        worst = 0.0
        for name, kw in CASES:
            d = os.path.join(a.tmp, name)
            ref.make_model(d, dtype="f32", **kw)
            m = ref.load_model(d, "float64")
            P, cfg = leaves(d)
            for toks in random_batch(kw["seed"], kw["vocab"], [1, 140, 9])["tokens"]:
                with torch.no_grad():
                    worst = max(worst, float((seq_logits(P, cfg, toks) - ref.logits(m, toks)).abs().max()))
        if worst > 1e-10:
            raise RuntimeError(f"float64 autograd forward vs qwen2_ref.logits: max diff {worst:.3e}")
        return f"max logits diff vs qwen2_ref {worst:.1e}"
    case("reference-forward-vs-qwen2_ref", ref_forward)

    if not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
        print(f"note: {tool} is not an executable file; grad_tool cases will fail")

    for name, kw in CASES:
        d = os.path.join(a.tmp, name)
        if not os.path.exists(os.path.join(d, "model.safetensors")):
            ref.make_model(d, dtype="f32", **kw)
        batches = [("random", random_batch(kw["seed"] * 7 + 1, kw["vocab"]))]
        if kw["tied"] or kw["kv_heads"] == 1:
            batches.append(("sft", sft_batch(kw["seed"] * 7 + 2, kw["vocab"])))
        batches.append(("entropy", entropy_batch(kw["seed"] * 7 + 3, kw["vocab"])))
        for bname, batch in batches:
            tag = f"{name}/{bname}"
            state = {}

            def grads(d=d, batch=batch, bname=bname, tag=tag, state=state):
                lp_t, g_t, ent_t = torch_grads(d, batch)
                with open(os.path.join(d, "config.json")) as f:
                    cfg = json.load(f)
                got = run_tool(tool, d, batch, os.path.join(a.tmp, f"{os.path.basename(d)}-{bname}"))
                state["got"] = got
                want = {"grad." + n for n in g_t} | {"logp"} | ({"entropy"} if ent_t is not None else set())
                if set(got) != want:
                    raise RuntimeError(f"tensor names: missing {sorted(want - set(got))[:4]}, "
                                       f"unexpected {sorted(set(got) - want)[:4]}")
                bad, worst = [], (0.0, "")
                for n, gt in g_t.items():
                    gc = got["grad." + n]
                    if tuple(gc.shape) != tuple(gt.shape):
                        bad.append(f"{n}: shape {tuple(gc.shape)} != {tuple(gt.shape)}")
                        continue
                    e = rel_err(gc, gt)
                    k = kind(n)
                    if e > worst_kind.get(k, (-1.0, ""))[0]:
                        worst_kind[k] = (e, tag)
                    worst = max(worst, (e, n))
                    if not e <= REL_TOL:  # also catches NaN
                        bad.append(f"{n} rel {e:.2e} [{diagnose(n, gc, gt, cfg)}]")
                lp_c = got["logp"].to(torch.float64)
                if tuple(lp_c.shape) != tuple(lp_t.shape):
                    raise RuntimeError(f"logp shape {tuple(lp_c.shape)} != {tuple(lp_t.shape)}")
                tg = torch.tensor([t for s in batch["targets"] for t in s])
                lerr = float((lp_c - lp_t).abs().max())
                nz = int((lp_c[tg < 0] != 0).sum())
                if not lerr <= LOGP_TOL:  # name the first positions that are off: (sequence, position)
                    starts = [0]
                    for toks in batch["tokens"]:
                        starts.append(starts[-1] + len(toks))
                    off = ((lp_c - lp_t).abs() > LOGP_TOL).nonzero()[:, 0].tolist()
                    seqs = [bisect.bisect_right(starts, i) - 1 for i in off[:3]]
                    where = [(b, i - starts[b]) for b, i in zip(seqs, off)]
                    bad.append(f"logp max abs err {lerr:.2e} at {len(off)} positions, first (seq, pos) {where}")
                if nz:
                    bad.append(f"logp nonzero at {nz} positions with target -1")
                if ent_t is not None:
                    eerr = float((got["entropy"].to(torch.float64) - ent_t).abs().max())
                    lerr = max(lerr, eerr)
                    if not eerr <= LOGP_TOL:
                        bad.append(f"entropy max abs err {eerr:.2e}")
                if bad:
                    raise RuntimeError(f"{len(bad)} problems: " + "; ".join(bad[:6]))
                return f"worst grad rel {worst[0]:.2e} ({worst[1]}), logp abs {lerr:.2e}"
            case(tag, grads)

            def variant(flags, d=d, batch=batch, bname=bname, state=state):
                if "got" not in state:
                    raise RuntimeError("plain run failed; nothing to compare against")
                got = run_tool(tool, d, batch, os.path.join(a.tmp, f"{os.path.basename(d)}-{bname}"), flags)
                base = state["got"]
                if set(got) != set(base):
                    raise RuntimeError(f"tensor names differ from the plain run: {sorted(set(got) ^ set(base))[:4]}")
                worst, bad = (0.0, ""), []
                for n in base:
                    e = rel_err(got[n], base[n])
                    worst = max(worst, (e, n))
                    if not e <= RECOMPUTE_TOL:
                        bad.append(f"{n} rel {e:.2e}")
                worst_rc[0] = max(worst_rc[0], worst[0])
                if bad:
                    raise RuntimeError(f"{' '.join(flags)} differs: " + "; ".join(bad[:6]))
                return f"worst rel vs plain {worst[0]:.2e} ({worst[1]})"
            # activation checkpointing; the SFT path (head backward fused into the forward)
            case(tag + " --recompute", lambda: variant(["--recompute"]))
            if "dent" not in batch:  # the fused head has no entropy term
                case(tag + " --fused", lambda: variant(["--fused"]))

    if worst_kind:
        print(f"max rel error per tensor kind (tolerance {REL_TOL:g}):")
        for k in sorted(worst_kind):
            e, where = worst_kind[k]
            print(f"  {k:48s} {e:.3e}  ({where})")
        print(f"  {'--recompute / --fused vs plain (all tensors)':48s} {worst_rc[0]:.3e}")
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

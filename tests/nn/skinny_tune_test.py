#!/usr/bin/python3
"""The decode kernels chosen by measurement (src/nn/skinny.h, skinny_tune.c) through `grpo generate --stats`
and `grpo doctor`:
- a fresh tuning file, for fp32, bf16 and int8 (Q8_0): every kernel this level runs timed at 1, 3, 6 and 12
  rows, the pick the one whose
  times relative to the fastest of ours add up least (recomputed here from what it reports), kept in the file
  under this CPU's key; the next process reads it (cached) and decodes the same tokens;
- each kernel of ours pinned through the file decodes fp32 greedy tokens and log-probs that agree with the
  float64 PyTorch reference (tests/reference/qwen2_ref.py); the bf16 kernels are held to sums in double per
  op (test_ops_grad) and to PyTorch end to end by generate_test's bf16 group, with whichever kernel is chosen;
- a corrupt file, or an entry naming a kernel this level lacks, is measured again and replaced; an unwritable
  place, an empty GRPO_TUNING_FILE (keep nothing) and GRPO_TUNING=off never cost the run;
- three processes starting at once on a fresh file measure once (the lock) and agree;
- `grpo doctor` lists the entry.

usage: /usr/bin/python3 tests/nn/skinny_tune_test.py --grpo PATH --tmp DIR
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
import torch  # noqa: E402
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--grpo", required=True)
ap.add_argument("--tmp", required=True)
a = ap.parse_args()
shutil.rmtree(a.tmp, ignore_errors=True)
os.makedirs(a.tmp)
T = lambda *p: os.path.join(a.tmp, *p)  # noqa: E731
OURS = ("avx2", "avx512", "avx512_bf16", "avx512_vnni")
PROMPTS = [[(i * 37 + 11 * n) % 299 for i in range(n)] for n in (5, 17, 30)]
LP_TOL = 1e-4  # fp32 decode log-probs against the float64 reference


def generate(model, env, dtype="f32", check_rc=True):
    e = dict(os.environ, **env)
    lines = "".join(json.dumps({"tokens": p}) + "\n" for p in PROMPTS)
    p = subprocess.run([a.grpo, "generate", "--model", model, "--jsonl", "--stats", "--temperature", "0",
                        "--max-new-tokens", "10", "--dtype", dtype], input=lines, capture_output=True, text=True,
                       env=e)
    if check_rc and p.returncode != 0:
        raise RuntimeError(f"generate exited {p.returncode}: {p.stderr[-600:]}")
    stats = json.loads(p.stderr.strip().splitlines()[-1]) if p.returncode == 0 else {}
    recs = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    k = stats.get("decode_kernels", "missing")
    if k == "missing":
        raise RuntimeError(f"no decode_kernels in --stats: {p.stderr[-300:]}")
    return recs, k, p


def level():
    p = subprocess.run([a.grpo, "doctor", "--json"], capture_output=True, text=True)
    return next(c for c in json.loads(p.stdout)["checks"] if c["id"] == "cpu")["values"]["isa_level"]


def runs_here(kernel, dtype):
    """Does kernel run dtype (F32, BF16, Q8_0: --dtype int8) at this level?"""
    lv = ["avx2", "avx512", "avx512_bf16", "amx"].index(level())
    need = {"avx2": 0, "avx512": 1, "avx512_bf16": 2, "avx512_vnni": 2, "onednn": 0}[kernel]
    if dtype == "Q8_0":
        return lv >= need and kernel in ("avx2", "avx512_vnni")
    return lv >= need and (kernel != "avx512_bf16" or dtype == "BF16") and kernel != "avx512_vnni"


def pick_ok(k):
    """The pick's times, relative to the fastest of ours at each row count, add up least (to a part in a
    million: the file keeps nanoseconds, grpo picked from the unrounded times)."""
    ms = k["ms"]
    ours = [x for x in OURS if x in ms["1"]]
    fastest = {r: min(ms[r][x] for x in ours) for r in ms}
    total = {x: sum(ms[r][x] / fastest[r] for r in ms) for x in ours}
    return k["kernel"] in ours and total[k["kernel"]] <= min(total.values()) * (1 + 1e-6)


def models():
    ref.make_model(T("f32"), seed=5, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=160, vocab=300,
                   tied=False)
    ref.make_model(T("bf16"), seed=6, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=160, vocab=300,
                   tied=True, dtype="bf16")


def fresh():
    f = T("cache", "sub", "tuning.json")  # missing folders are made
    env = {"GRPO_TUNING_FILE": f}
    for model, dt, opt in (("f32", "F32", "f32"), ("bf16", "BF16", "bf16"), ("f32", "Q8_0", "int8")):
        recs, k, _ = generate(T(model), env, dtype=opt)
        rows_ok = k and sorted(k["ms"]) == ["1", "12", "3", "6"] and all(
            sorted(k["ms"][r]) == sorted(x for x in OURS + ("onednn",) if runs_here(x, dt)) and
            all(v > 0 for v in k["ms"][r].values()) for r in k["ms"])
        check(f"{dt}: measured afresh, every kernel of the level timed at 1, 3, 6 and 12 rows",
              k and not k["cached"] and rows_ok and k["threads"] >= 1, k)
        check(f"{dt}: the pick adds up the least relative time (never oneDNN)", k and pick_ok(k), k and k["kernel"])
        entries = json.load(open(f))
        key = next((e for e in entries if e.endswith(f"| {dt}")), None)
        check(f"{dt}: kept in the file under this CPU's key", key and entries[key]["kernel"] == k["kernel"] and
              "| level " + level() + " |" in key, list(entries))
        again, k2, _ = generate(T(model), env, dtype=opt)
        check(f"{dt}: the next process reads it (cached) and decodes the same tokens",
              k2["cached"] and k2["kernel"] == k["kernel"] and [r["tokens"] for r in again] ==
              [r["tokens"] for r in recs], (k2["kernel"], k2["cached"]))
    p = subprocess.run([a.grpo, "doctor"], capture_output=True, text=True, env=dict(os.environ, **env))
    line = next((l for l in p.stdout.splitlines() if "decode_kernels" in l), "")
    check("doctor lists each dtype's kernel on this CPU", all(d + ": " in line for d in ("F32", "BF16", "Q8_0")),
          line[:300])


def pinned():
    """Each kernel of ours, pinned through the file, against the float64 reference."""
    f = T("pinned.json")
    env = {"GRPO_TUNING_FILE": f}
    _, k, _ = generate(T("f32"), env)
    entries = json.load(open(f))
    key = next(iter(entries))
    m = ref.load_model(T("f32"))
    for kernel in OURS:
        if not runs_here(kernel, "F32"):
            continue
        entries[key]["kernel"] = kernel
        json.dump(entries, open(f, "w"))
        recs, got, _ = generate(T("f32"), env)
        worst, same = 0.0, True
        for p, r in zip(PROMPTS, recs):
            seq = p + r["tokens"]
            with torch.no_grad():
                z = ref.hidden_states(m, torch.tensor(seq[:-1]))[len(p) - 1:] @ m.lm_head.t()  # (new, V)
            lp = torch.log_softmax(z, -1).gather(1, torch.tensor(r["tokens"])[:, None])[:, 0].tolist()
            worst = max([worst] + [abs(x - y) for x, y in zip(lp, r["logprobs"])])
            # greedy: each token the reference's argmax, or within a near-tie of it (fp32 vs float64 sums)
            same = same and all(z[i, t] >= z[i].max() - 1e-4 for i, t in enumerate(r["tokens"]))
        check(f"F32 pinned to {kernel}: greedy tokens and log-probs = float64 PyTorch",
              got["kernel"] == kernel and got["cached"] and same and worst <= LP_TOL,
              f"kernel {got['kernel']}, max |dlogp| {worst:.2e}")


def faults():
    f = T("corrupt.json")
    open(f, "w").write("{not json")
    _, k, _ = generate(T("f32"), {"GRPO_TUNING_FILE": f})
    check("a corrupt file: measured again and replaced by a valid one",
          k and not k["cached"] and len(json.load(open(f))) == 1, k and k["kernel"])
    key = next(iter(json.load(open(f))))
    bad = {key: dict(json.load(open(f))[key], kernel="avx512_bf16")}  # no fp32 dot-product kernel
    json.dump(bad, open(f, "w"))
    _, k, _ = generate(T("f32"), {"GRPO_TUNING_FILE": f})
    check("an entry naming a kernel that cannot run it: measured again",
          k and not k["cached"] and json.load(open(f))[key]["kernel"] != "avx512_bf16", k and k["kernel"])
    for label, env in (("an unwritable place", {"GRPO_TUNING_FILE": "/proc/no/such/tuning.json"}),
                       ("GRPO_TUNING_FILE empty (keep nothing)", {"GRPO_TUNING_FILE": ""})):
        ks = [generate(T("f32"), env)[1] for _ in range(2)]
        check(f"{label}: the run goes on, measured each time", all(k and not k["cached"] for k in ks), ks[0])
    _, k, p = generate(T("f32"), {"GRPO_TUNING": "off", "GRPO_TUNING_FILE": T("off.json")})
    check("GRPO_TUNING=off: nothing measured or kept", k is None and not os.path.exists(T("off.json")),
          p.stderr[-200:])


def concurrent():
    f = T("race.json")
    env = dict(os.environ, GRPO_TUNING_FILE=f, OMP_NUM_THREADS="1")
    lines = "".join(json.dumps({"tokens": p}) + "\n" for p in PROMPTS)
    procs = [subprocess.Popen([a.grpo, "generate", "--model", T("bf16"), "--jsonl", "--stats", "--temperature",
                               "0", "--max-new-tokens", "10"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    outs = [p.communicate(lines) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a generate failed: {[(p.returncode, e[-200:]) for p, (_, e) in zip(procs, outs)]}")
    ks = [json.loads(err.strip().splitlines()[-1])["decode_kernels"] for _, err in outs]
    check("three processes on a fresh file: one measures, two read it, all run the same kernel and tokens",
          sum(not k["cached"] for k in ks) == 1 and len({k["kernel"] for k in ks}) == 1 and
          len({o for o, _ in outs}) == 1, [(k["kernel"], k["cached"]) for k in ks])


sys.exit(harness.run_groups(models, {"fresh": fresh, "pinned": pinned, "faults": faults, "concurrent": concurrent}))

#!/usr/bin/python3
"""`grpo sft` robustness: bit-identical resume, SIGKILL during checkpoint writes, fp16 loss scaling
and overflow skips, NaN samples, and bad input.

usage: /usr/bin/python3 tests/train/sft_robustness.py --grpo PATH --tmp DIR [--only GROUP ...]
Groups:
  resume    a run resumed from checkpoint-2 or -4 ends with the same model.safetensors bytes as an
            uninterrupted one (no shuffle + constant lr; shuffle + cosine/warmup/decay/clip; fp16 with a
            dynamic loss scale that skips and doubles; --steps 4 then --steps 6 --resume); --keep.
  kill      the tiny preset (~10M parameters, ~120 MB per checkpoint with the optimizer) trains with
            --save-every 1 and is SIGKILLed repeatedly, mostly right when a .checkpoint-N.tmp appears;
            after each kill every checkpoint-N must load (strict safetensors, JSON, `grpo score`), and
            --resume must finish with the uninterrupted run's bytes. Reports how many kills hit a write.
  overflow  fp16 with --loss-scale 1e30: skipped steps, halving scale, untouched weights, --max-skips;
            static scale (--loss-scale-window 0); doubling after N clean steps.
  nan       a NaN embedding row used only by data line 3: warning names FILE:3, the step is skipped,
            nothing else becomes NaN; --max-skips 1 exits 1.
  errors    bad options / data / checkpoints: exit 1, empty stdout, exactly one stderr line
            "grpo: error: ..." naming the file:line / option / key.
Prints one line per check and finally `N passed, M failed`; exit 0 iff all pass.
Models: tests/reference/qwen2_ref.py make_model (f32) and `grpo init --preset tiny`.
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # keep tests/reference free of __pycache__
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import torch  # noqa: E402
import qwen2_ref as ref  # noqa: E402

ERR = "grpo: error: "
SMALL = dict(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=128, max_pos=128, dtype="f32")
TINY_V = 151936
GRPO = TMP = None
M = {}  # model name -> directory


# ------------------------------------------------------------------ running grpo

def grpo(args, stdin="", timeout=600):
    return subprocess.run([GRPO] + [str(a) for a in args], input=stdin, capture_output=True, text=True,
                          encoding="utf-8", errors="replace", timeout=timeout)


def sft(model, data, out, *opts):
    return grpo(["sft", "--model", model, "--data", data, "--out", out, *opts])


def tail(p, n=300):
    return p.stderr.strip()[-n:].replace("\n", " | ")


def ok_sft(model, data, out, *opts):
    p = sft(model, data, out, *opts)
    if p.returncode != 0:
        raise RuntimeError(f"`grpo sft ... --out {os.path.basename(out)} {' '.join(map(str, opts))}` "
                           f"exited {p.returncode}: {tail(p)}")
    return p


def err_lines(p):
    return [l for l in p.stderr.splitlines() if l.startswith(ERR)]


def one_error(p):
    """None if p failed the contract way (exit 1, one `grpo: error:` line, the last one), else why not."""
    errs = err_lines(p)
    lines = p.stderr.strip().splitlines()
    if p.returncode != 1:
        return f"exit {p.returncode} (want 1)"
    if len(errs) != 1:
        return f"{len(errs)} '{ERR.strip()}' lines"
    if lines[-1] != errs[0]:
        return "the error line is not the last stderr line"
    return None


# ------------------------------------------------------------------ files

def write_lines(path, lines):
    with open(path, "w") as f:
        for l in lines:
            f.write((l if isinstance(l, str) else json.dumps(l)) + "\n")
    return path


def rand_data(seed, n, V, plen=(3, 8), clen=(2, 6), avoid=()):
    r = random.Random(seed)

    def tok():
        while True:
            t = r.randrange(V)
            if t not in avoid:
                return t
    return [{"prompt_ids": [tok() for _ in range(r.randint(*plen))],
             "completion_ids": [tok() for _ in range(r.randint(*clen))]} for _ in range(n)]


NONFINITE = re.compile(r"(?<![\w\"])-?(nan|inf|infinity)(?![\w\"])", re.I)


def metrics(out):
    """metrics.jsonl records; bare nan/inf tokens (not JSON) read as null so that other checks still run."""
    p = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(p):
        return []
    return [json.loads(NONFINITE.sub("null", l)) for l in open(p) if l.strip()]


def strict_json_lines(path):
    """Lines of a JSONL file that are not strict JSON (NaN/Infinity/nan are not JSON)."""
    def no_const(x):
        raise ValueError(f"non-JSON constant {x}")
    bad = []
    for i, l in enumerate(open(path), 1):
        if l.strip():
            try:
                json.loads(l, parse_constant=no_const)
            except ValueError:
                bad.append(f"line {i}: {l.strip()[:90]}")
    return bad


def by_step(ms):
    return {m["step"]: m for m in ms}  # a resumed run may append: the last record of a step wins


def ckpts(out):
    if not os.path.isdir(out):
        return []
    return sorted(int(n[len("checkpoint-"):]) for n in os.listdir(out)
                  if re.fullmatch(r"checkpoint-\d+", n) and os.path.isdir(os.path.join(out, n)))


def tmps(out):
    if not os.path.isdir(out):
        return set()
    return {n for n in os.listdir(out) if n.startswith(".checkpoint-") and n.endswith(".tmp")}


def tmp_ids(out):
    """{.checkpoint-N.tmp name: (inode, ctime)}: a save that recreates a stale .tmp gives a new identity."""
    ids = {}
    for n in tmps(out):
        try:
            st = os.stat(os.path.join(out, n))
            ids[n] = (st.st_ino, st.st_ctime_ns)
        except OSError:
            pass
    return ids


def tmp_step(name):
    try:
        return int(name[len(".checkpoint-"):-len(".tmp")])
    except ValueError:
        return -1


def bits(t):
    return t.contiguous().view(torch.uint8) if t.numel() else t


def same_model(a, b):
    """(ok, detail): file bytes identical; otherwise say whether the tensors or only the header differ."""
    ba, bb = open(a, "rb").read(), open(b, "rb").read()
    if ba == bb:
        return True, f"{len(ba)} bytes identical"
    return False, tensor_diff(a, b) or "tensors bitwise equal but the files differ (header/metadata)"


def tensor_diff(a, b):
    """None if all tensors are bitwise equal, else a description of the differences."""
    ta, tb = ref.load_safetensors(a), ref.load_safetensors(b)
    if set(ta) != set(tb):
        return (f"tensor names differ: only in first {sorted(set(ta) - set(tb))[:3]}, "
                f"only in second {sorted(set(tb) - set(ta))[:3]}")
    diff = [n for n in ta if ta[n].dtype != tb[n].dtype or ta[n].shape != tb[n].shape
            or not torch.equal(bits(ta[n]), bits(tb[n]))]
    if not diff:
        return None
    worst = max(diff, key=lambda n: (ta[n].double() - tb[n].double()).abs().nan_to_num(1e30).max().item()
                if ta[n].shape == tb[n].shape else 1e30)
    mx = (ta[worst].double() - tb[worst].double()).abs().max().item() if ta[worst].shape == tb[worst].shape else -1
    return f"{len(diff)}/{len(ta)} tensors differ; worst {worst}: max |diff| {mx:.3e}"


def metric_mismatch(ma, mb, steps):
    """First metrics difference between two runs over the given steps (diagnostic)."""
    a, b = by_step(ma), by_step(mb)
    for s in steps:
        if s not in a or s not in b:
            return f"step {s} missing from metrics ({'first' if s not in a else 'resumed'} run)"
        for k in ("loss", "grad_norm", "lr", "tokens", "loss_scale", "skipped"):
            if a[s].get(k) != b[s].get(k):
                return f"step {s} {k}: uninterrupted {a[s].get(k)!r} vs resumed {b[s].get(k)!r}"
    return None


def st_read(path):
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def st_write(path, header, data):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + data)


# ------------------------------------------------------------------ 1. resume

def g_resume(check):
    d, V = M["small"], SMALL["vocab"]
    data = write_lines(os.path.join(TMP, "resume.jsonl"), rand_data(1, 7, V))  # 7 lines: epochs cross steps
    base = ["--steps", 6, "--save-every", 2, "--batch-size", 2, "--micro-batch-size", 1, "--lr", 1e-2]
    plain = base + ["--no-shuffle"]
    fancy = base + ["--seed", 5, "--lr-schedule", "cosine", "--warmup", 2, "--weight-decay", 0.1, "--clip", 0.5]

    def resumed_from(A, opts, k, label):
        """Copy run A, drop its checkpoints after k and its final model, --resume: must give A's bytes."""
        B = f"{A}-from{k}"
        shutil.rmtree(B, ignore_errors=True)
        shutil.copytree(A, B)
        for j in ckpts(B):
            if j > k:
                shutil.rmtree(os.path.join(B, f"checkpoint-{j}"))
        os.remove(os.path.join(B, "model.safetensors"))
        p = sft(d, data, B, *opts, "--resume")
        if p.returncode != 0:
            check(False, f"{label}: resume from checkpoint-{k}", f"exit {p.returncode}: {tail(p)}")
            return
        ok, detail = same_model(os.path.join(A, "model.safetensors"), os.path.join(B, "model.safetensors"))
        steps = [s for s in range(k + 1, opt_steps(opts) + 1)]
        mm = metric_mismatch(metrics(A), metrics(B), steps)
        check(ok, f"{label}: resume from checkpoint-{k} == uninterrupted (final model.safetensors bytes)",
              detail + ("" if ok or mm is None else f"; first metrics difference: {mm}"))

    for label, opts in [("no-shuffle, constant lr", plain),
                        ("shuffle seed 5, cosine, warmup 2, wd 0.1, clip 0.5", fancy)]:
        A = os.path.join(TMP, "resume-" + ("plain" if opts is plain else "fancy"))
        shutil.rmtree(A, ignore_errors=True)
        ok_sft(d, data, A, *opts, "--keep", 3)
        check(ckpts(A) == [2, 4, 6] and len(metrics(A)) == 6, f"{label}: --keep 3 keeps checkpoints 2, 4, 6",
              f"checkpoints {ckpts(A)}, {len(metrics(A))} metrics lines")
        for k in (2, 4):
            resumed_from(A, opts + ["--keep", 3], k, label)

    # shuffling must actually reorder (else the shuffle resume above proves nothing about the sampler state)
    U = os.path.join(TMP, "resume-fancy-noshuffle")
    shutil.rmtree(U, ignore_errors=True)
    ok_sft(d, data, U, *fancy, "--no-shuffle")
    ok, _ = same_model(os.path.join(TMP, "resume-fancy", "model.safetensors"), os.path.join(U, "model.safetensors"))
    check(not ok, "shuffled run differs from the --no-shuffle run (the order is really permuted)")

    # --steps 4, then extend to --steps 6 with --resume (constant lr: the same as 6 at once); default --keep 2
    C = os.path.join(TMP, "resume-extend")
    shutil.rmtree(C, ignore_errors=True)
    opts4 = list(plain)
    opts4[opts4.index("--steps") + 1] = 4
    ok_sft(d, data, C, *opts4)
    after4 = ckpts(C)
    p = sft(d, data, C, *plain, "--resume")
    if p.returncode != 0:
        check(False, "--steps 4, then --steps 6 --resume", f"exit {p.returncode}: {tail(p)}")
    else:
        ok, detail = same_model(os.path.join(TMP, "resume-plain", "model.safetensors"),
                                os.path.join(C, "model.safetensors"))
        check(ok, "--steps 4, then --steps 6 --resume == 6 steps at once", detail)
        check(after4 == [2, 4] and ckpts(C) == [4, 6], "default --keep 2 keeps only the newest two",
              f"after 4 steps {after4}, after 6 {ckpts(C)}")
    # the newest checkpoint is already at --steps: nothing to train, the final model is (re)written
    Z = os.path.join(TMP, "resume-plain-done")
    shutil.rmtree(Z, ignore_errors=True)
    shutil.copytree(os.path.join(TMP, "resume-plain"), Z)
    os.remove(os.path.join(Z, "model.safetensors"))
    p = sft(d, data, Z, *plain, "--resume")  # default --keep 2 while 3 checkpoints exist
    ok, detail = same_model(os.path.join(TMP, "resume-plain", "model.safetensors"),
                            os.path.join(Z, "model.safetensors")) if p.returncode == 0 else (False, tail(p))
    check(p.returncode == 0 and ok, "--resume with checkpoint-6 == --steps 6: exits 0, writes the same model", detail)
    # 3 checkpoints with --keep 2 is what a SIGKILL between a checkpoint's rename and the removal of the
    # oldest leaves; a run that saves nothing more must still end with only the newest --keep
    check(ckpts(Z) == [4, 6], "... and leaves only the newest --keep 2 checkpoints (found 2, 4, 6)",
          f"checkpoints {ckpts(Z)}")
    # a SIGKILL while the oldest checkpoint is being removed leaves it half deleted: resuming (from the
    # newest) must work and the next save must finish removing it
    H = os.path.join(TMP, "resume-plain-halfpruned")
    shutil.rmtree(H, ignore_errors=True)
    shutil.copytree(os.path.join(TMP, "resume-plain"), H)
    for fn in ("model.safetensors", "optimizer.safetensors"):
        os.remove(os.path.join(H, "checkpoint-2", fn))
    opts8 = list(plain)
    opts8[opts8.index("--steps") + 1] = 8
    p = sft(d, data, H, *opts8, "--resume")
    check(p.returncode == 0 and ckpts(H) == [6, 8],
          "a half-deleted oldest checkpoint: --resume to 8 works, checkpoints end as 6, 8",
          f"exit {p.returncode}, checkpoints {ckpts(H)}" + (f": {tail(p, 150)}" if p.returncode else ""))
    K1 = os.path.join(TMP, "resume-keep1")
    shutil.rmtree(K1, ignore_errors=True)
    ok_sft(d, data, K1, *plain, "--keep", 1)
    check(ckpts(K1) == [6], "--keep 1 keeps only checkpoint-6", f"checkpoints {ckpts(K1)}")

    # fp16 with a dynamic loss scale that overflows, halves and doubles: the scale and the count of clean
    # steps since the last change must be restored. The start scale comes from a probe of the gradient norm.
    P = os.path.join(TMP, "resume-fp16-probe")
    shutil.rmtree(P, ignore_errors=True)
    ok_sft(d, data, P, "--steps", 1, "--batch-size", 2, "--no-shuffle", "--lr", 1e-2)
    g = metrics(P)[0]["grad_norm"]
    # 4x the scale at which the whole norm in one element would overflow fp16: for this model the run then
    # skips every few steps and doubles in between, so the checkpoints fall mid-window between skips
    start = 2.0 ** math.ceil(math.log2(4 * 65504.0 / g))
    f16 = ["--steps", 9, "--save-every", 3, "--keep", 3, "--batch-size", 2, "--micro-batch-size", 1, "--lr", 1e-2,
           "--no-shuffle", "--precision", "fp16", "--loss-scale", start, "--loss-scale-window", 2,
           "--max-skips", 20]
    A = os.path.join(TMP, "resume-fp16")
    shutil.rmtree(A, ignore_errors=True)
    ok_sft(d, data, A, *f16)
    ms = metrics(A)
    scales = [m["loss_scale"] for m in ms]
    skips = sum(bool(m["skipped"]) for m in ms)
    grows = sum(b > a for a, b in zip(scales, scales[1:]))
    check(len(ms) == 9 and 1 <= skips < 9 and grows >= 1,
          "fp16 reference run: the dynamic scale both halves (skips) and doubles (a meaningful resume test)",
          f"grad_norm {g:.3g}, start {start:g}; scales {scales}; skipped {[m['skipped'] for m in ms]}")
    for k in (3, 6):
        resumed_from(A, f16, k, "fp16, dynamic loss scale (window 2)")


def opt_steps(opts):
    return int(opts[opts.index("--steps") + 1])


# ------------------------------------------------------------------ 2. SIGKILL during checkpoint writes

def validate_ckpt(c, cfg0, shapes0):
    """None if checkpoint dir c is complete and loadable, else why not."""
    try:
        cfg = json.load(open(os.path.join(c, "config.json")))
        for k in ("hidden_size", "vocab_size", "num_hidden_layers", "tie_word_embeddings"):
            if cfg.get(k) != cfg0.get(k):
                return f"config.json {k} {cfg.get(k)!r} != {cfg0.get(k)!r}"
        w = ref.load_safetensors(os.path.join(c, "model.safetensors"))
        if {n: tuple(t.shape) for n, t in w.items()} != shapes0:
            return "model.safetensors: tensor names/shapes differ from the model's"
        bad = [n for n, t in w.items() if not torch.isfinite(t.float()).all()]
        if bad:
            return f"model.safetensors: non-finite values in {bad[:2]}"
        del w
        opt = ref.load_safetensors(os.path.join(c, "optimizer.safetensors"))
        if not opt:
            return "optimizer.safetensors holds no tensors"
        del opt
        json.load(open(os.path.join(c, "trainer_state.json")))
    except Exception as e:  # noqa: BLE001 -- any failure to read is the finding
        return f"{type(e).__name__}: {str(e)[:200]}"
    p = grpo(["score", "--model", c], '{"tokens": [1, 2, 3, 4]}\n')
    recs = [json.loads(l) for l in p.stdout.splitlines() if l.strip()] if p.returncode == 0 else []
    if p.returncode != 0 or len(recs) != 1 or len(recs[0]["logprobs"]) != 3 \
            or not all(math.isfinite(x) for x in recs[0]["logprobs"]):
        return f"`grpo score` failed: exit {p.returncode} {tail(p, 200)}"
    return None


def g_kill(check):
    d = M["tiny"]
    data = write_lines(os.path.join(TMP, "kill.jsonl"), rand_data(2, 8, TINY_V, plen=(4, 8), clen=(3, 6)))
    steps = 8
    opts = ["--steps", steps, "--save-every", 1, "--batch-size", 2, "--lr", 1e-3, "--seed", 1]
    cfg0 = json.load(open(os.path.join(d, "config.json")))
    shapes0 = {n: tuple(t.shape) for n, t in ref.load_safetensors(os.path.join(d, "model.safetensors")).items()}

    R = os.path.join(TMP, "kill-ref")
    shutil.rmtree(R, ignore_errors=True)
    t0 = time.time()
    ok_sft(d, data, R, *opts)
    t_ref = time.time() - t0
    check(ckpts(R) == [steps - 1, steps] and not tmps(R), "uninterrupted run: only the newest 2 checkpoints, no .tmp",
          f"{t_ref:.1f} s for {steps} steps; checkpoints {ckpts(R)}, tmp {sorted(tmps(R))}")

    W = os.path.join(TMP, "kill-run")
    shutil.rmtree(W, ignore_errors=True)
    log = os.path.join(TMP, "kill-run.stderr")
    rng = random.Random(7)
    events, problems, validated = [], [], {}
    kills = mid = 0
    for attempt in range(12):
        newest = max(ckpts(W), default=0)
        if newest >= steps - 1:
            break
        # tmp: when .checkpoint-<target>.tmp appears (+ a small delay): inside the write;
        # renamed: when checkpoint-<target> appears: while the older checkpoints are being removed;
        # random: any moment of the run
        mode = ["tmp", "tmp", "renamed", "random"][attempt % 4]
        # target newest+1: a write that redoes a killed one over its stale .tmp; newest+2: progress
        target = newest + (1 if attempt % 3 == 1 else 2)
        delay = rng.choice([0, 0, 0.001, 0.005, 0.02])
        stale = tmp_ids(W)  # left by earlier kills: only a recreated one counts
        args = [GRPO, "sft", "--model", d, "--data", data, "--out", W] + [str(o) for o in opts] \
            + (["--resume"] if ckpts(W) else [])
        with open(log, "w") as errf:
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=errf)
        t_start = time.time()
        t_kill = t_start + rng.uniform(0.02, max(0.05, t_ref * (steps - newest) / steps))
        hit, deadline = None, t_start + 300
        while proc.poll() is None:
            fresh = {n for n, i in tmp_ids(W).items() if stale.get(n) != i}
            if mode == "tmp":
                cand = sorted(n for n in fresh if tmp_step(n) >= target)
                if cand:
                    if delay:
                        time.sleep(delay)
                    hit = cand[0]
                    proc.send_signal(signal.SIGKILL)
                    break
            elif mode == "renamed":
                if max(ckpts(W), default=0) >= target:
                    hit = None
                    time.sleep(delay / 4)  # 0 .. 5 ms: the rename's fsync, then the removal of old ones
                    proc.send_signal(signal.SIGKILL)
                    break
            elif time.time() >= t_kill or max(ckpts(W), default=0) >= min(target, steps - 1):
                hit = min(fresh, key=tmp_step) if fresh else None
                proc.send_signal(signal.SIGKILL)
                break
            if time.time() > deadline:
                proc.send_signal(signal.SIGKILL)
                problems.append(f"attempt {attempt}: no progress in 300 s")
                break
            time.sleep(0.0005)
        rc = proc.wait()
        if rc == 0:
            events.append(f"#{attempt} {mode}: finished before the kill")
            break
        if rc != -signal.SIGKILL:
            problems.append(f"attempt {attempt}: exit {rc}: {open(log).read().strip()[-200:]}")
            break
        kills += 1
        inside = hit is not None and tmp_ids(W).get(hit, stale.get(hit)) != stale.get(hit)
        if inside:
            mid += 1
            parts = sorted(os.listdir(os.path.join(W, hit)))
            sizes = ",".join(f"{n}:{os.path.getsize(os.path.join(W, hit, n)) >> 20}M" for n in parts
                             if os.path.isfile(os.path.join(W, hit, n)))
            events.append(f"#{attempt} {mode}: in {hit} [{sizes}]")
        else:
            events.append(f"#{attempt} {mode}: {'after ' + hit if hit else 'outside a write'} "
                          f"(checkpoints {ckpts(W)})")
        for k in ckpts(W):
            c = os.path.join(W, f"checkpoint-{k}")
            try:
                key = (k, os.stat(os.path.join(c, "model.safetensors")).st_ino,
                       os.stat(os.path.join(c, "model.safetensors")).st_mtime_ns)
            except OSError:
                key = (k, None, None)
            if key in validated:
                continue
            why = validate_ckpt(c, cfg0, shapes0)
            validated[key] = why
            if why:
                problems.append(f"after kill #{attempt}: checkpoint-{k}: {why}")
    n_valid = sum(v is None for v in validated.values())
    check(not problems, "every checkpoint-N after every SIGKILL loads (JSON, strict safetensors, `grpo score`)",
          f"{n_valid} checkpoint versions checked" + ("; " + "; ".join(problems[:4]) if problems else ""))
    check(kills >= 4 and mid >= 1, "SIGKILLs landed, some inside a checkpoint write",
          f"{kills} kills, {mid} with a .checkpoint-N.tmp being written: " + "; ".join(events))

    p = sft(d, data, W, *opts, *(["--resume"] if ckpts(W) else []))
    if p.returncode != 0:
        check(False, "--resume after the kills finishes", f"exit {p.returncode}: {tail(p)}")
    else:
        ok, detail = same_model(os.path.join(R, "model.safetensors"), os.path.join(W, "model.safetensors"))
        check(ok, "--resume after the kills == uninterrupted run (final model.safetensors bytes)", detail)
        check(ckpts(W) == [steps - 1, steps], "after the final resume only the newest 2 checkpoints remain",
              f"checkpoints {ckpts(W)}")
        left = sorted(tmps(W))
        print(f"NOTE  stale .checkpoint-*.tmp dirs left in --out after the final resume: {left or 'none'}")
        st = [m["step"] for m in metrics(W)]
        print(f"NOTE  metrics.jsonl after the kills and resumes: {len(st)} records for {len(set(st))} steps "
              f"(steps redone after a resume are {'appended again' if len(st) > len(set(st)) else 'not duplicated'})")
    p = sft(d, data, W, *opts)
    why = one_error(p)
    check(why is None and p.stdout == "" and re.search(r"checkpoint|--resume", err_lines(p)[0] if err_lines(p) else ""),
          "--out with checkpoints, no --resume: exit 1, one error line", why or tail(p))


# ------------------------------------------------------------------ 3. fp16 overflow / loss scale

def g_overflow(check):
    d, V = M["small"], SMALL["vocab"]
    data = write_lines(os.path.join(TMP, "overflow.jsonl"), rand_data(3, 6, V))
    common = ["--batch-size", 2, "--no-shuffle", "--lr", 1e-2, "--precision", "fp16"]

    def run(name, *opts):
        o = os.path.join(TMP, name)
        shutil.rmtree(o, ignore_errors=True)
        return o, sft(d, data, o, *common, *opts)

    def rel(a, b):
        return abs(a - b) <= 1e-5 * abs(b)

    o, p = run("ovf-dynamic", "--steps", 3, "--loss-scale", 1e30)
    ms = metrics(o)
    sc = [m["loss_scale"] for m in ms]
    check(p.returncode == 0 and len(ms) == 3 and all(m["skipped"] is True for m in ms),
          "--loss-scale 1e30: every step skipped (metrics skipped true), run still exits 0 (3 < --max-skips 5)",
          f"exit {p.returncode}; skipped {[m.get('skipped') for m in ms]} {tail(p, 150) if p.returncode else ''}")
    check(len(sc) == 3 and (rel(sc[0], 1e30) or rel(sc[0], 5e29)) and all(rel(sc[i + 1], sc[i] / 2) for i in range(2)),
          "the dynamic scale halves at each skipped step", f"loss_scale {sc}")
    if p.returncode == 0:
        why = tensor_diff(os.path.join(d, "model.safetensors"), os.path.join(o, "model.safetensors"))
        check(why is None, "weights after only skipped steps == input model (every tensor bitwise, f32 -> f32)",
              why or "")
    warn = [l for l in p.stderr.splitlines() if re.search(r"skip|overflow|non-finite|inf", l, re.I)]
    check(len(warn) >= 3, "a warning line per skipped step", f"{len(warn)} lines, e.g. {warn[:1]}")

    o, p = run("ovf-maxskips", "--steps", 6, "--loss-scale", 1e30, "--max-skips", 2)
    why = one_error(p)
    check(why is None and p.stdout == "", "--max-skips 2: exit 1 with one error line", why or tail(p, 200))
    ms = metrics(o)
    check(len(ms) == 2 and all(m["skipped"] for m in ms), "... after exactly 2 skipped steps (metrics.jsonl)",
          f"{len(ms)} metrics lines; error: {err_lines(p)[-1:] }")

    o, p = run("ovf-static", "--steps", 3, "--loss-scale", 1e30, "--loss-scale-window", 0)
    sc = [m["loss_scale"] for m in metrics(o)]
    check(p.returncode == 0 and len(sc) == 3 and all(rel(s, 1e30) for s in sc)
          and all(m["skipped"] for m in metrics(o)),
          "static scale 1e30 (--loss-scale-window 0): skipped, scale stays 1e30", f"exit {p.returncode}; {sc}")
    o, p = run("ovf-static-fit", "--steps", 4, "--loss-scale", 1024, "--loss-scale-window", 0)
    ms = metrics(o)
    check(p.returncode == 0 and [m["loss_scale"] for m in ms] == [1024] * 4 and not any(m["skipped"] for m in ms),
          "static scale 1024: no skips, scale stays 1024", f"exit {p.returncode}; {[m['loss_scale'] for m in ms]}")

    o, p = run("ovf-double", "--steps", 5, "--loss-scale", 8, "--loss-scale-window", 2)
    ms = metrics(o)
    sc = [m["loss_scale"] for m in ms]
    used, after = [8, 8, 16, 16, 32], [8, 16, 16, 32, 32]
    check(p.returncode == 0 and not any(m["skipped"] for m in ms) and sc in (used, after),
          "--loss-scale 8 --loss-scale-window 2: doubles after every 2 clean steps",
          f"loss_scale {sc} ({'used by the step' if sc == used else 'after the step' if sc == after else '?'})")


# ------------------------------------------------------------------ 4. NaN in the data path

def g_nan(check):
    d, V = M["nan"], SMALL["vocab"]
    X = M["nan_id"]
    lines = rand_data(4, 5, V, avoid={X})
    lines[2]["prompt_ids"][0] = X  # the first prompt token: every later position sees it
    data = write_lines(os.path.join(TMP, "nan.jsonl"), lines)
    base = ["--batch-size", 1, "--steps", 5, "--no-shuffle", "--lr", 1e-2]
    o = os.path.join(TMP, "nan-run")
    shutil.rmtree(o, ignore_errors=True)
    p = sft(d, data, o, *base)
    named = [l for l in p.stderr.splitlines() if re.search(r"nan\.jsonl:3\b", l)]
    sk = [m.get("skipped") for m in metrics(o)]
    check(p.returncode == 0 and named, "NaN embedding used by line 3: a warning names nan.jsonl:3",
          f"exit {p.returncode}; {named[:1] or tail(p, 200)}")
    check(sk == [False, False, True, False, False], "only step 3 is skipped", f"skipped {sk}")
    mpath = os.path.join(o, "metrics.jsonl")
    bad = strict_json_lines(mpath) if os.path.exists(mpath) else ["missing"]
    check(not bad, "metrics.jsonl stays strict JSON for the NaN step (no bare nan)", "; ".join(bad[:2]))
    if p.returncode == 0:
        w0 = ref.load_safetensors(os.path.join(d, "model.safetensors"))
        w = ref.load_safetensors(os.path.join(o, "model.safetensors"))
        bad = [n for n, t in w.items() if n != "model.embed_tokens.weight" and not torch.isfinite(t).all()]
        e = w["model.embed_tokens.weight"]
        rows = [i for i in range(V) if i != X and not torch.isfinite(e[i]).all()]
        changed = sum(not torch.equal(w[n], w0[n]) for n in w if n != "model.embed_tokens.weight")
        check(not bad and not rows and changed > 0, "no NaN leaked into the weights; the clean steps trained",
              f"non-finite tensors {bad[:3]}, embed rows {rows[:5]}, {changed} tensors changed")

    # physical line numbers: a blank line 2 moves the NaN sample to line 4 (stream position unchanged)
    data2 = write_lines(os.path.join(TMP, "nanblank.jsonl"), [lines[0], "", lines[1], lines[2], lines[3], lines[4]])
    o2 = os.path.join(TMP, "nan-blank")
    shutil.rmtree(o2, ignore_errors=True)
    p = sft(d, data2, o2, *base)
    named = [l for l in p.stderr.splitlines() if re.search(r"nanblank\.jsonl:4\b", l)]
    sk = [m.get("skipped") for m in metrics(o2)]
    check(p.returncode == 0 and named and sk == [False, False, True, False, False],
          "with a blank line 2 the warning names nanblank.jsonl:4 (the file's line), step 3 skipped",
          f"exit {p.returncode}; skipped {sk}; {named[:1] or tail(p, 200)}")

    o3 = os.path.join(TMP, "nan-maxskips")
    shutil.rmtree(o3, ignore_errors=True)
    p = sft(d, data, o3, *base, "--max-skips", 1)
    why = one_error(p)
    check(why is None and p.stdout == "", "NaN sample with --max-skips 1: exit 1, one error line",
          why or tail(p, 200))


# ------------------------------------------------------------------ 5. bad input

def g_errors(check):
    d, V = M["small"], SMALL["vocab"]
    nt = os.path.join(TMP, "err-model-no-tokenizer")  # the small model has no tokenizer.json either
    good = {"prompt_ids": [1, 2, 3], "completion_ids": [4, 5]}
    data = write_lines(os.path.join(TMP, "err-good.jsonl"), [good] * 4)
    out = os.path.join(TMP, "err-out")

    def D(name, lines, model=d):  # argv training on a data file NAME.jsonl holding these lines
        return ["sft", "--model", model, "--data", write_lines(os.path.join(TMP, name + ".jsonl"), lines), "--out", out]

    # a run with checkpoints 1 and 2 whose newest one gets corrupted
    CK = os.path.join(TMP, "err-ckpt")
    shutil.rmtree(CK, ignore_errors=True)
    ok_sft(d, data, CK, "--steps", 2, "--save-every", 1, "--batch-size", 2)

    def corrupt(name, fn):
        def setup():
            c = os.path.join(TMP, "err-ckpt-" + name)
            shutil.rmtree(c, ignore_errors=True)
            shutil.copytree(CK, c)
            fn(os.path.join(c, "checkpoint-2"))
            return c
        return setup

    def garbage(fn, text):
        return lambda c: open(os.path.join(c, fn), "w").write(text)

    def truncate(fn):
        def m(c):
            b = open(os.path.join(c, fn), "rb").read()
            open(os.path.join(c, fn), "wb").write(b[:len(b) // 2])
        return m

    def drop_first_tensor(c):
        p = os.path.join(c, "optimizer.safetensors")
        h, data_ = st_read(p)
        name = sorted(k for k in h if k != "__metadata__")[0]
        b, e = h.pop(name)["data_offsets"]
        for k, v in h.items():
            if k != "__metadata__" and v["data_offsets"][0] >= e:
                v["data_offsets"] = [x - (e - b) for x in v["data_offsets"]]
        st_write(p, h, data_[:b] + data_[e:])

    def empty_state(c):
        open(os.path.join(c, "trainer_state.json"), "w").write("{}")

    def mkempty():
        e = os.path.join(TMP, "err-empty-out")
        shutil.rmtree(e, ignore_errors=True)
        os.makedirs(e)
        return e

    # a model with a tokenizer for text lines: the fuzz seeds' small BPE tokenizer (tests/fuzz/make_seeds.py)
    tm = os.path.join(TMP, "err-model-tokenizer")
    ref.make_model(tm, seed=23, tied=True, **dict(SMALL, vocab=320))
    seeds = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus", "tokenizer")
    seed = open(os.path.join(seeds, sorted(f for f in os.listdir(seeds) if f.startswith("seed-"))[0]), "rb").read()
    open(os.path.join(tm, "tokenizer.json"), "wb").write(seed.split(b"\n=====\n")[0])
    open(os.path.join(tm, "tokenizer_config.json"), "w").write('{"eos_token": "<|endoftext|>"}')
    text = {"prompt": "hi", "completion": "there"}

    S = ["sft", "--model", d, "--data", data, "--out", out]
    cases = [  # (label, argv or callable(dir) -> argv, regex the error line must match)
        ("missing --model", ["sft", "--data", data, "--out", out], r"--model"),
        ("missing --data", ["sft", "--model", d, "--out", out], r"--data"),
        ("missing --out", ["sft", "--model", d, "--data", data], r"--out"),
        ("data file does not exist", ["sft", "--model", d, "--data", os.path.join(TMP, "nope.jsonl"), "--out", out],
         r"nope\.jsonl"),
        ("malformed JSON on line 3", D("err-json", [good, good, '{"prompt_ids": [1, 2', good]),
         r"err-json\.jsonl:3\b"),
        ("line 2 without completion", D("err-nocomp", [good, {"prompt_ids": [1, 2]}]), r"err-nocomp\.jsonl:2\b"),
        ("line 2 empty completion_ids", D("err-emptycomp", [good, {"prompt_ids": [1], "completion_ids": []}]),
         r"err-emptycomp\.jsonl:2\b"),
        ("line 2 completion id == vocab", D("err-vocab", [good, {"prompt_ids": [1], "completion_ids": [2, V]}]),
         r"err-vocab\.jsonl:2\b"),
        ("line 2 prompt id -1", D("err-neg", [good, {"prompt_ids": [-1, 3], "completion_ids": [2]}]),
         r"err-neg\.jsonl:2\b"),
        ("line 2 empty prompt_ids", D("err-emptyprompt", [good, {"prompt_ids": [], "completion_ids": [2]}]),
         r"err-emptyprompt\.jsonl:2\b"),
        ("text line 2, model dir without tokenizer.json",
         D("err-text", [good, {"prompt": "hi", "completion": "there"}], model=nt),
         r"err-text\.jsonl:2\b|tokenizer\.json"),
        ("text line 2 with an empty completion", D("err-text-empty", [text, dict(text, completion="")], model=tm),
         r"err-text-empty\.jsonl:2\b.*completion is empty"),
        ("--batch-size 3 --micro-batch-size 2", S + ["--batch-size", 3, "--micro-batch-size", 2],
         r"--micro-batch-size|--batch-size"),
        ("--lr -1", S + ["--lr", -1], r"--lr"),
        ("--precision bogus", S + ["--precision", "bogus"], r"--precision"),
        ("--save-dtype bogus", S + ["--save-dtype", "bogus"], r"--save-dtype"),
        ("--lr-schedule bogus", S + ["--lr-schedule", "bogus"], r"--lr-schedule"),
        ("--steps 0", S + ["--steps", 0], r"--steps"),
        ("unknown option --frobnicate", S + ["--frobnicate"], r"--frobnicate"),
        ("--out is the --model directory", ["sft", "--model", d, "--data", data, "--out", d], r"--out.*--model"),
        ("--resume, --out does not exist", ["sft", "--model", d, "--data", data, "--out",
                                            os.path.join(TMP, "err-no-such-out"), "--resume"], r"checkpoint"),
        ("--resume, --out has no checkpoint",
         lambda: ["sft", "--model", d, "--data", data, "--out", mkempty(), "--resume"], r"checkpoint"),
        ("--resume, newest trainer_state.json not JSON",
         corrupt("state-garbage", garbage("trainer_state.json", "{not json")),
         r"checkpoint-2.*trainer_state\.json|trainer_state\.json"),
        ("--resume, newest trainer_state.json truncated", corrupt("state-trunc", truncate("trainer_state.json")),
         r"trainer_state\.json"),
        ("--resume, newest trainer_state.json is {}", corrupt("state-empty", empty_state), r"trainer_state\.json"),
        ("--resume, newest trainer_state.json missing",
         corrupt("state-missing", lambda c: os.remove(os.path.join(c, "trainer_state.json"))), r"trainer_state\.json"),
        ("--resume with another --batch-size than the checkpoint's",
         lambda: ["sft", "--model", d, "--data", data, "--out", corrupt("bs", lambda c: None)(), "--steps", 4,
                  "--batch-size", 1, "--resume"], r"--batch-size"),
        ("--resume, newest optimizer.safetensors truncated", corrupt("opt-trunc", truncate("optimizer.safetensors")),
         r"optimizer\.safetensors"),
        ("--resume, newest optimizer.safetensors lacks a tensor", corrupt("opt-drop", drop_first_tensor),
         r"optimizer\.safetensors"),
        ("--resume, newest optimizer.safetensors header garbage",
         corrupt("opt-hdr", lambda c: open(os.path.join(c, "optimizer.safetensors"), "r+b").write(
             b"\x10" + b"\0" * 7 + b"not json")),
         r"optimizer\.safetensors"),
    ]
    os.makedirs(nt, exist_ok=True)
    shutil.copy(os.path.join(d, "config.json"), nt)
    shutil.copy(os.path.join(d, "model.safetensors"), nt)
    for label, argv, pattern in cases:
        if callable(argv):
            r = argv()
            argv = r if isinstance(r, list) else ["sft", "--model", d, "--data", data, "--out", r,
                                                  "--steps", 4, "--save-every", 1, "--batch-size", 2, "--resume"]
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(os.path.join(TMP, "err-no-such-out"), ignore_errors=True)
        p = grpo(argv)
        why = one_error(p)
        errs = err_lines(p)
        if why is None and p.stdout != "":
            why = f"stdout not empty: {p.stdout[:80]!r}"
        if why is None and len(p.stderr.strip().splitlines()) != 1:
            why = f"{len(p.stderr.strip().splitlines())} stderr lines"
        if why is None and not re.search(pattern, errs[0]):
            why = f"error does not match /{pattern}/"
        check(why is None, f"error: {label}", (why + ": " if why else "") + tail(p, 220))


def g_signal(check):
    """SIGTERM/SIGINT during training: a checkpoint of the step just finished, a message saying how to go
    on, exit 128 + signal; --resume then ends with the uninterrupted run's bytes. A second signal ends the
    process at once. Also: a batch larger than the data set trains (it once died on an internal error)."""
    d, V = M["small"], SMALL["vocab"]
    data = write_lines(os.path.join(TMP, "sig.jsonl"), rand_data(3, 9, V))
    opts = ["--steps", 400, "--batch-size", 2, "--lr", 1e-3, "--no-shuffle"]
    A = os.path.join(TMP, "sig-uninterrupted")
    shutil.rmtree(A, ignore_errors=True)
    ok_sft(d, data, A, *opts)
    for sig, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
        B = os.path.join(TMP, "sig-" + name)
        shutil.rmtree(B, ignore_errors=True)
        p = subprocess.Popen([GRPO, "sft", "--model", d, "--data", data, "--out", B, *map(str, opts)],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        err = []
        for line in p.stderr:  # the first step is done: the loop is running
            err.append(line)
            if "step 1/" in line:
                p.send_signal(sig)
                break
        err += p.stderr.readlines()
        rc = p.wait(timeout=300)
        msg = next((l for l in err if f"{name}: stopped after step" in l), "")
        said = any(f"grpo: {name}: stopping after this step" in l for l in err)  # from the handler, at once
        k = ckpts(B)
        check(rc == 128 + sig and said and "--resume" in msg and len(k) == 1 and f"checkpoint-{k[0]}" in msg and
              not os.path.exists(os.path.join(B, "model.safetensors")),
              f"{name}: said at once, then a checkpoint of the finished step, a message, exit {128 + sig}",
              f"exit {rc}, said {said}, checkpoints {k}, message {msg.strip()!r}")
        p2 = sft(d, data, B, *opts, "--resume")
        ok, detail = (False, f"resume exit {p2.returncode}: {tail(p2)}") if p2.returncode else \
            same_model(os.path.join(A, "model.safetensors"), os.path.join(B, "model.safetensors"))
        check(ok, f"{name}: --resume == uninterrupted (model.safetensors bytes)", detail)
    B = os.path.join(TMP, "sig-twice")
    shutil.rmtree(B, ignore_errors=True)
    p = subprocess.Popen([GRPO, "sft", "--model", d, "--data", data, "--out", B, *map(str, opts)],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in p.stderr:
        if "step 1/" in line:  # two different signals: pending together, both delivered (two SIGINTs may merge)
            p.send_signal(signal.SIGINT)
            p.send_signal(signal.SIGTERM)
            break
    p.stderr.read()
    rc = p.wait(timeout=300)
    check(rc in (-signal.SIGINT, -signal.SIGTERM), "a second signal ends the process at once",
          f"exit {rc} (want killed by SIGINT or SIGTERM)")
    big = os.path.join(TMP, "sig-big-batch")
    shutil.rmtree(big, ignore_errors=True)
    p = sft(d, data, big, "--steps", 3, "--batch-size", 20, "--micro-batch-size", 20)
    check(p.returncode == 0, "a batch larger than the data set (20 of 9 samples) trains", tail(p))


GROUPS = {"resume": g_resume, "kill": g_kill, "overflow": g_overflow, "nan": g_nan, "errors": g_errors,
          "signal": g_signal}


def make_models(need):
    M["small"] = os.path.join(TMP, "small")
    ref.make_model(M["small"], seed=21, tied=False, **SMALL)
    if "nan" in need:
        M["nan"] = d = os.path.join(TMP, "nan-model")
        t = ref.make_model(d, seed=22, tied=False, **SMALL)  # untied: the NaN row is only an input embedding
        M["nan_id"] = X = SMALL["vocab"] - 7
        t["model.embed_tokens.weight"][X] = float("nan")
        ref.save_safetensors(os.path.join(d, "model.safetensors"), t, {"format": "pt"})
    if "kill" in need:
        M["tiny"] = d = os.path.join(TMP, "tiny")
        p = grpo(["init", "--out", d, "--preset", "tiny", "--seed", 1, "--force"])
        if p.returncode != 0:
            raise RuntimeError(f"grpo init failed: {tail(p)}")


def main():
    global GRPO, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--only", nargs="+", choices=list(GROUPS), help="run only these groups")
    a = ap.parse_args()
    GRPO, TMP = os.path.abspath(a.grpo), os.path.abspath(a.tmp)
    os.makedirs(TMP, exist_ok=True)
    torch.set_num_threads(1)
    results = []

    def check(ok, name, detail=""):
        results.append(bool(ok))
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  [{detail}]" if detail else ""))
        sys.stdout.flush()

    need = a.only or list(GROUPS)
    make_models(need)
    for gname, fn in GROUPS.items():
        if gname not in need:
            continue
        t0 = time.time()
        try:
            fn(check)
        except Exception as e:  # one broken group must not hide the others
            check(False, f"{gname}: {type(e).__name__}", str(e)[:400])
        print(f"--    {gname}: {time.time() - t0:.1f} s")
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

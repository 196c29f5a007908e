#!/usr/bin/python3
"""Faults of long runs, for `grpo train`:

  disk full   the run's directory on a small tmpfs (a private mount namespace: `unshare -rm`), filled by a
              filler file to a chosen free space, so that the write that fails is config.yaml, samples.jsonl,
              metrics.jsonl, a checkpoint or the final model in turn. Each failure must be one error line
              naming the file and "No space left on device", exit 1, no temporary file left beside the
              final ones, every older checkpoint byte-identical; freeing the space and resuming must end with
              the bytes of an uninterrupted run.
  quota       a file-size limit (RLIMIT_FSIZE, `ulimit -f`) below the checkpoint's size: the same, with
              "File too large", and no death by SIGXFSZ.
(Signals during training: sft_robustness.py and grpo_cli.py.)

usage: faults_test.py --grpo PATH --tokenizer QWEN_TOKENIZER_JSON --tmp DIR
Prints PASS/FAIL lines and "N passed, M failed"; exits 77 (skipped) where no mount namespace can be made.
"""
import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from harness import check, summary  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--grpo", required=True)
ap.add_argument("--tokenizer", required=True)
ap.add_argument("--tmp", required=True)
ap.add_argument("--in-namespace", action="store_true", help=argparse.SUPPRESS)
a = ap.parse_args()
a.grpo, a.tmp = os.path.abspath(a.grpo), os.path.abspath(a.tmp)

if not a.in_namespace:  # once more, in a private mount namespace where we may mount a tmpfs
    shutil.rmtree(a.tmp, ignore_errors=True)
    os.makedirs(a.tmp)
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        print(f"SKIP: no private mount namespace (unshare -rm: {probe.stderr.decode().strip()})")
        sys.exit(77)
    sys.exit(subprocess.run(["unshare", "-rm", sys.executable] + sys.argv + ["--in-namespace"]).returncode)

T = lambda *p: os.path.join(a.tmp, *p)
MNT = T("mnt")
os.makedirs(MNT)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", MNT], check=True)
ENOSPC, EFBIG = os.strerror(28), os.strerror(27)

model = T("model")
subprocess.run([a.grpo, "init", "--out", model, "--tokenizer", a.tokenizer], check=True, capture_output=True)
with open(T("ok.jsonl"), "w") as f:
    f.write('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n')
RUN = ["model.path=" + model, "data.chat_template=false", "data.max_response_length=4", "rollout.n=2",
       "data.train_batch_size=2", "trainer.val_before_train=false", "data.train_file=" + T("ok.jsonl"),
       "actor.lr=1e-3", "trainer.dump_samples=true"]


def train(out, *extra, limit=None):
    pre = (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))) if limit else None
    return subprocess.run([a.grpo, "train"] + RUN + ["trainer.out_dir=" + out] + list(extra), capture_output=True,
                          text=True, timeout=600, preexec_fn=pre)


def digest(d):
    """{relative path: sha256} of every file under d."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def fill(free):
    """Leaves about `free` bytes free on the tmpfs (a filler file takes the rest)."""
    filler = os.path.join(MNT, "filler")
    if os.path.exists(filler):
        os.remove(filler)
    st = os.statvfs(MNT)
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - free))


def unfill():
    os.remove(os.path.join(MNT, "filler"))


def one_error(p, *words):
    """(ok, the error line): exit 1, one stderr line starting "grpo: error:", holding every word."""
    err = [l for l in p.stderr.splitlines() if l.startswith("grpo: error:")]
    line = err[0] if err else p.stderr.strip()[-200:]
    return p.returncode == 1 and len(err) == 1 and all(w in line for w in words), line


def leftovers(d):
    """Temporary files of atomic writes left anywhere under d (a .checkpoint-N.tmp is the next save's)."""
    return [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if ".tmp." in f]


# References: uninterrupted runs of 1 and 2 steps on a real disk.
ref = {}
for steps in (1, 2):
    p = train(T(f"ref{steps}"), f"trainer.steps={steps}")
    assert p.returncode == 0, p.stderr
    ref[steps] = open(T(f"ref{steps}", "model.safetensors"), "rb").read()
page = os.statvfs(MNT).f_frsize

# --- the run's small files: config.yaml, samples.jsonl, metrics.jsonl (a fresh run, no checkpoints)
hit = {}
for pages in range(4):
    out = os.path.join(MNT, f"small{pages}")
    os.makedirs(out)
    fill(pages * page)
    p = train(out, "trainer.steps=2", "trainer.save_every=0")
    unfill()
    if p.returncode == 0:
        continue
    good, line = one_error(p, out, ENOSPC)
    name = next((n for n in ("config.yaml", "samples.jsonl", "metrics.jsonl", "model.safetensors", "tokenizer.json")
                 if n in line), "?")
    hit[name] = good and not leftovers(out)
    check(f"disk full with {pages} pages free: one error naming the file ({name}) and ENOSPC, nothing half-written",
          hit[name], f"rc {p.returncode}: {line}; left {leftovers(out)}")
check("disk full: config.yaml, samples.jsonl and metrics.jsonl each met a full disk",
      {"config.yaml", "samples.jsonl", "metrics.jsonl"} <= set(hit), str(sorted(hit)))

# --- checkpoints and the final model: a run with checkpoint-1, resumed to step 2 on a disk that holds
# half a checkpoint (the save of checkpoint-2 fails), then one that holds checkpoint-2 but not the final model.
base = os.path.join(MNT, "base")
p = train(base, "trainer.steps=1", "trainer.save_every=1")
assert p.returncode == 0, p.stderr
ck1 = digest(os.path.join(base, "checkpoint-1"))
ck_bytes = sum(os.path.getsize(os.path.join(base, "checkpoint-1", f)) for f in ck1)
final_bytes = sum(os.path.getsize(os.path.join(base, f)) for f in ("model.safetensors", "tokenizer.json"))
for what, free, needle in [("checkpoint-2", ck_bytes // 2, ".checkpoint-2.tmp/"),
                           ("the final model", ck_bytes + final_bytes // 2, "")]:
    out = os.path.join(MNT, "resume-" + what.replace(" ", "-"))
    shutil.copytree(base, out)
    for f in ("model.safetensors", "tokenizer.json"):  # the final model of step 1 goes: it will be rewritten
        os.remove(os.path.join(out, f))
    fill(free)
    p = train(out, "trainer.steps=2", "trainer.save_every=1", "trainer.resume=true")
    good, line = one_error(p, out + "/" + needle, ENOSPC)
    intact = digest(os.path.join(out, "checkpoint-1")) == ck1
    check(f"disk full writing {what}: one error naming it and ENOSPC, checkpoint-1 intact, nothing half-written",
          good and intact and not leftovers(out), f"rc {p.returncode}: {line}; checkpoint-1 intact {intact}; "
          f"left {leftovers(out)}")
    unfill()
    p = train(out, "trainer.steps=2", "trainer.save_every=1", "trainer.resume=true")
    w = open(os.path.join(out, "model.safetensors"), "rb").read() if p.returncode == 0 else b""
    steps = [json.loads(l)["step"] for l in open(os.path.join(out, "metrics.jsonl"))] if p.returncode == 0 else []
    check(f"disk full writing {what}: space freed, resumed == 2 uninterrupted steps (weights bytes)",
          w == ref[2] and steps == [1, 2] and not os.path.exists(os.path.join(out, ".checkpoint-2.tmp")),
          f"rc {p.returncode} {p.stderr.strip()[-200:]}; metrics steps {steps}")

# --- a quota of sorts: a file-size limit between the model's size and the optimizer file's
out = T("quota")
limit = os.path.getsize(os.path.join(base, "checkpoint-1", "model.safetensors")) + (1 << 20)
p = train(out, "trainer.steps=1", "trainer.save_every=1", limit=limit)
good, line = one_error(p, "optimizer.safetensors", EFBIG)
check("file-size limit (RLIMIT_FSIZE) under the checkpoint: one error naming the file and EFBIG, no SIGXFSZ death",
      good and not leftovers(out), f"rc {p.returncode}: {line}")
p = train(out, "trainer.steps=1", "trainer.save_every=1")  # its metrics.jsonl is a run of sorts: kept
check("file-size limit: run again, the failed run's metrics.jsonl is not replaced without trainer.overwrite",
      p.returncode == 1 and "trainer.overwrite=true" in p.stderr, p.stderr.strip()[-200:])
p = train(out, "trainer.steps=1", "trainer.save_every=1", "trainer.overwrite=true")
check("file-size limit: without it the run starts again (no checkpoint was made) and finishes == 1 step",
      p.returncode == 0 and open(os.path.join(out, "model.safetensors"), "rb").read() == ref[1],
      f"rc {p.returncode} {p.stderr.strip()[-200:]}")

sys.exit(summary())

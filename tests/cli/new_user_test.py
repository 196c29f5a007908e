#!/usr/bin/env python3
"""What a new user meets, command by command (issue 25): nothing a user made is lost (a second run into
a finished run's folder is refused, --force / trainer.overwrite=true replace it, a second Ctrl-C says it
stops without a checkpoint and names the newest one); LoRA SFT resumes without --lora-rank; errors name
the position, the word, the key, the errno and both values of a resume mismatch; the commands fit together
(tokenize --jsonl | score, OpenAI's max_tokens in generate, unknown per-line keys refused); the validation
accuracy before training is step 0 of metrics.jsonl; init --help lists every preset; score writes the
lines before a bad one; progress lines count parameters in k/M and say "1 step"."""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import harness  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--grpo", required=True)
ap.add_argument("--tokenizer", required=True)
ap.add_argument("--tmp", required=True)
a = ap.parse_args()
shutil.rmtree(a.tmp, ignore_errors=True)
os.makedirs(a.tmp)
T = lambda *p: os.path.join(a.tmp, *p)  # noqa: E731
MODEL = T("model")


def check(ok, name, detail=""):  # the condition first: it reads as the claim
    harness.check(name, ok, detail)


def grpo(*args, stdin=None):
    return subprocess.run([a.grpo, *map(str, args)], input=stdin, capture_output=True, text=True, timeout=600)


def one_error(p, pattern):
    """Exit 1, one `grpo: error:` line matching pattern."""
    err = [l for l in p.stderr.splitlines() if l.startswith("grpo: error:")]
    return p.returncode == 1 and len(err) == 1 and re.search(pattern, err[0]) is not None


def last_error(p):
    return (p.stderr.strip().splitlines() or ["(no stderr)"])[-1][:400]


def write(name, lines):
    with open(T(name), "w") as f:
        f.write("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return T(name)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


SFT_DATA = []
GRPO_DATA = []


def setup():
    p = grpo("init", "--out", MODEL, "--tokenizer", a.tokenizer)
    assert p.returncode == 0, last_error(p)
    SFT_DATA.append(write("sft.jsonl", [{"prompt_ids": [1, 2, 3 + i], "completion_ids": [4, 5, 6]} for i in range(8)]))
    GRPO_DATA.append(write("grpo.jsonl", [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(4)]))


def sft(out, *opts):
    return grpo("sft", "--model", MODEL, "--data", SFT_DATA[0], "--out", out, "--batch-size", 2, *opts)


GRPO_BASE = ["data.chat_template=false", "data.max_response_length=4", "rollout.n=2", "data.train_batch_size=2",
             "trainer.val_before_train=false"]


def train(out, *opts):
    return grpo("train", "model.path=" + MODEL, "data.train_file=" + GRPO_DATA[0], *GRPO_BASE, "trainer.out_dir=" + out,
                *opts)


def g_kept():
    """1: a second run into a finished run's folder is refused and leaves it as it was; --force replaces it."""
    out = T("sft1")
    p = sft(out, "--steps", 4)
    check(p.returncode == 0, "sft: a first run into sft1", last_error(p))
    before = {f: read(os.path.join(out, f)) for f in ("metrics.jsonl", "model.safetensors")}
    p = sft(out, "--steps", 2)
    same = all(read(os.path.join(out, f)) == b for f, b in before.items())
    check(one_error(p, r"--out .*sft1 already holds a finished run \(metrics\.jsonl\); pass --force") and same,
          "sft: a second run into sft1 is refused, naming --force; metrics.jsonl and the model are untouched",
          last_error(p))
    p = sft(out, "--steps", 2, "--force")
    check(p.returncode == 0 and len(metrics(out)) == 2, "sft --force replaces the run (metrics.jsonl: 2 lines)",
          last_error(p))
    p = sft(out, "--steps", 2, "--force", "--resume")
    check(one_error(p, r"--resume and --force"), "sft --resume --force: one of them", last_error(p))
    ck = T("sft-ckpt")
    p = sft(ck, "--steps", 2, "--save-every", 1)
    p = sft(ck, "--steps", 2)
    check(one_error(p, r"already holds a run \(.*checkpoint-2\); pass --resume to continue it, --force to replace"),
          "sft into a folder with checkpoints names --resume and --force", last_error(p))
    p = sft(ck, "--steps", 3, "--force", "--save-every", 3)
    ckpts = sorted(d for d in os.listdir(ck) if d.startswith("checkpoint-"))
    check(p.returncode == 0 and ckpts == ["checkpoint-3"], "sft --force removes the old run's checkpoints",
          f"{ckpts} {last_error(p)}")
    p = grpo("sft", "--model", MODEL, "--data", SFT_DATA[0], "--out", MODEL, "--force")
    check(one_error(p, r"--out .*model is the --model directory") and os.path.exists(os.path.join(MODEL, "model.safetensors")),
          "sft --out MODEL --force: refused, the model kept", last_error(p))

    run = T("run_ns")  # GRPO without checkpoints, twice
    p = train(run, "trainer.steps=2")
    check(p.returncode == 0 and len(metrics(run)) == 2, "train: a first run into run_ns (2 metrics lines)", last_error(p))
    before = read(os.path.join(run, "metrics.jsonl"))
    p = train(run, "trainer.steps=1")
    check(one_error(p, r"trainer\.out_dir .*run_ns already holds a finished run .*trainer\.overwrite=true") and
          read(os.path.join(run, "metrics.jsonl")) == before,
          "train: a second run into run_ns is refused, naming trainer.overwrite=true; metrics.jsonl untouched",
          last_error(p))
    p = train(run, "trainer.steps=1", "trainer.overwrite=true")
    check(p.returncode == 0 and len(metrics(run)) == 1, "train trainer.overwrite=true replaces it (1 metrics line)",
          last_error(p))


def g_second_signal():
    """2: a second SIGINT says it stops now, without a checkpoint, and names the newest checkpoint."""
    for saves in (False, True):
        out = T("sig-" + ("saves" if saves else "none"))
        opts = ["--steps", 100000, "--lr", 1e-4] + (["--save-every", 1] if saves else [])
        p = subprocess.Popen([a.grpo, "sft", "--model", MODEL, "--data", SFT_DATA[0], "--out", out, "--batch-size", "2",
                              *map(str, opts)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        err = []
        for line in p.stderr:
            err.append(line)
            if "step 3/" in line:
                p.send_signal(signal.SIGINT)
            if "stopping after this step" in line:  # the handler ran: now the second one
                p.send_signal(signal.SIGINT)
                break
        err += p.stderr.readlines()
        rc = p.wait(timeout=300)
        first = [l for l in err if "SIGINT: stopping after this step" in l]
        second = [l for l in err if "SIGINT, a second signal: stopping now, without a checkpoint; " in l]
        ckpts = sorted((int(d.split("-")[1]) for d in os.listdir(out) if re.fullmatch(r"checkpoint-\d+", d)))
        if saves:
            want = f"the newest checkpoint is {out}/checkpoint-{ckpts[-1]}" if ckpts else "(no checkpoint on disk)"
        else:
            want = "no checkpoint was saved in this run"
        check(rc == -signal.SIGINT and len(first) == 1 and len(second) == 1 and second[0].strip().endswith(want),
              f"second SIGINT ({'--save-every 1' if saves else 'no checkpoints'}): killed at once, the first message "
              f"once, the second names {'the newest checkpoint' if saves else 'none'}", f"rc {rc}, first {first}, second {second}, want {want!r}")


def g_lora_resume():
    """3: a LoRA SFT run resumes without --lora-rank (its adapter_config.json decides) to the same bytes."""
    A, B = T("lora-a"), T("lora-b")
    opts = ["--steps", 4, "--lora-rank", 4, "--lora-alpha", 8, "--lora-targets", "q,v", "--save-every", 2,
            "--lr", 1e-3]
    p = sft(A, *opts)
    check(p.returncode == 0 and re.search(r"\d+(\.\d+)?k trained LoRA parameters", p.stderr),
          "LoRA sft: runs; the progress line counts its parameters in k", last_error(p))
    shutil.copytree(A, B)
    shutil.rmtree(os.path.join(B, "checkpoint-4"))
    for f in ("adapter_model.safetensors", "adapter_config.json"):
        os.remove(os.path.join(B, f))
    p = sft(B, "--steps", 4, "--save-every", 2, "--lr", 1e-3, "--resume")
    same = p.returncode == 0 and read(os.path.join(A, "adapter_model.safetensors")) == \
        read(os.path.join(B, "adapter_model.safetensors"))
    check(same, "LoRA sft --resume without --lora-rank == the uninterrupted run (adapter bytes)", last_error(p))
    p = sft(B, "--steps", 6, "--lora-rank", 8, "--resume")
    check(one_error(p, r"--lora-rank 8: adapter .*checkpoint-4 has r = 4"), "--resume with another --lora-rank: "
          "names both ranks", last_error(p))
    full = T("full-ckpt")
    sft(full, "--steps", 2, "--save-every", 2)
    p = sft(full, "--steps", 4, "--lora-rank", 4, "--resume")
    check(one_error(p, r"full fine-tuning checkpoint"), "--resume --lora-rank on a full checkpoint: refused",
          last_error(p))


def g_errors():
    """6: errors name the position and id, the bad word, errno and the config key, and both values."""
    p = grpo("score", "--model", MODEL, stdin='{"tokens": [1, 2]}\n{"tokens": [1, 2, 999999999]}\n')
    check(one_error(p, r'stdin line 2: "tokens"\[2\] is 999999999, not an id in \[0, 151936\)'),
          "score: a bad id names the line, position and id", last_error(p))
    p = grpo("tokenize", "--tokenizer", a.tokenizer, "--decode", stdin="abc 999999999\n")
    check(one_error(p, r'stdin: "abc" \(word 1\) is not a token id$'), "tokenize --decode quotes the bad word only",
          last_error(p))
    p = grpo("tokenize", "--tokenizer", a.tokenizer, "--decode", stdin="1 2 12abc 3\n")
    check(one_error(p, r'"12abc" \(word 3\)'), "tokenize --decode: a word that only starts with digits is refused",
          last_error(p))
    p = train(T("nov"), "data.val_file=" + T("nov.jsonl"), "trainer.steps=1")
    check(one_error(p, r"data\.val_file: cannot open .*nov\.jsonl: No such file or directory"),
          "train: a missing data file names its key and errno", last_error(p))
    out = T("mismatch")
    sft(out, "--steps", 2, "--save-every", 2)
    for opt, val, pattern in (("--batch-size", 4, r"made with --batch-size 2, this run has 4"),
                              ("--seed", 7, r"made with --seed 0, this run has 7"),
                              ("--no-shuffle", None, r"made with shuffling \(--no-shuffle\) on, this run has off")):
        p = sft(out, "--steps", 4, "--resume", opt, *([val] if val is not None else []))
        check(one_error(p, pattern), f"sft --resume {opt}: names the setting and both values", last_error(p))
    p = grpo("sft", "--model", MODEL, "--data", write("more.jsonl", [{"prompt_ids": [1], "completion_ids": [2]}] * 9),
             "--out", out, "--batch-size", 2, "--steps", 4, "--resume")
    check(one_error(p, r"made with a --data of 8 samples, this run's has 9"), "sft --resume on other data: both "
          "sample counts", last_error(p))
    # a missing file or directory names the option or key that named it (issue 46, 3), one wording everywhere
    nope, nodir = T("nope.json"), T("nope")
    missing = [(["generate", "--model", MODEL, "--tools", nope, "hi"], "option --tools: cannot open"),
               (["train", "model.path=" + MODEL, "data.train_file=" + GRPO_DATA[0],
                 "rollout.multi_turn.tools_file=" + nope], "rollout.multi_turn.tools_file: cannot open"),
               (["serve", "--model", MODEL, "--api-key-file", nope], "option --api-key-file: cannot open"),
               (["train", "--config", nope], "option --config: cannot open"),
               (["train", "model.path=" + nodir, "data.train_file=" + GRPO_DATA[0]], "model.path: .* does not exist"),
               (["score", "--model", nodir], "option --model: .* does not exist"),
               (["sft", "--model", nodir, "--data", SFT_DATA[0], "--out", T("o")], "option --model: .* does not exist"),
               (["sft", "--model", MODEL, "--data", nope, "--out", T("o")], "option --data: cannot open"),
               (["export", "--model", nodir, "--format", "onnx", "--out", T("o")], "option --model: .* does not exist"),
               (["tokenize", "--tokenizer", nope], "option --tokenizer: .* does not exist")]
    for args, pattern in missing:
        p = grpo(*args, stdin="")
        check(one_error(p, pattern), f"{args[0]}: a missing path names {pattern.split(':')[0]}", last_error(p))
    # options that contradict each other (issue 46, 4): one line naming the option, before the model loads
    for opts, pattern in ((["--raw", "--jsonl"], r"option --raw: for plain mode"),
                          (["--raw", "--tools", T("tools.json")], r"option --tools: .*--raw skips"),
                          (["--raw", "--no-thinking"], r"option --no-thinking: .*--raw skips")):
        p = grpo("generate", "--model", MODEL, *opts, stdin="hi")
        check(one_error(p, pattern) and p.stdout == "", f"generate {' '.join(opts[:2])}: refused in one line",
              last_error(p))


def g_fit():
    """7, 8, 12: tokenize --jsonl | score; generate's per-line keys; score writes the lines before a bad one."""
    texts = [{"text": "Hello world"}, {"text": "GRPO in C"}]
    tok = grpo("tokenize", "--tokenizer", a.tokenizer, "--jsonl", stdin="".join(json.dumps(t) + "\n" for t in texts))
    piped = grpo("score", "--model", MODEL, stdin=tok.stdout)
    ids = [json.loads(l)["ids"] for l in tok.stdout.splitlines()]
    direct = grpo("score", "--model", MODEL, stdin="".join(json.dumps({"tokens": i}) + "\n" for i in ids))
    check(tok.returncode == 0 and piped.returncode == 0 and piped.stdout == direct.stdout and len(ids) == 2,
          "grpo tokenize --jsonl | grpo score == score of {\"tokens\"}", last_error(piped))

    gen = ["generate", "--model", MODEL, "--jsonl", "--temperature", 0]
    a3 = grpo(*gen, stdin='{"tokens": [1, 2, 3], "max_tokens": 3}\n')
    b3 = grpo(*gen, stdin='{"tokens": [1, 2, 3], "max_new_tokens": 3}\n')
    n3 = len(json.loads(a3.stdout)["tokens"]) if a3.returncode == 0 else -1
    check(a3.returncode == 0 and a3.stdout == b3.stdout and n3 == 3, "generate: OpenAI's \"max_tokens\" is "
          "max_new_tokens", last_error(a3))
    ids_line = grpo(*gen, stdin='{"ids": [1, 2, 3], "max_new_tokens": 3}\n')
    check(ids_line.returncode == 0 and ids_line.stdout == b3.stdout, "generate: \"ids\" is \"tokens\"",
          last_error(ids_line))
    for line, pattern in (('{"tokens": [1], "temperature": 5}', r'line 2: "temperature" cannot be set per line.*'
                           r'--temperature'),
                          ('{"tokens": [1], "max_tokenz": 3}', r'line 2: unknown key "max_tokenz"'),
                          ('{"tokens": [1], "prompt": "x"}', r'line 2: both "tokens" and "prompt"')):
        p = grpo(*gen, stdin='{"tokens": [1]}\n' + line + "\n")
        check(one_error(p, pattern), f"generate --jsonl refuses {line}", last_error(p))

    good = [json.dumps({"tokens": [1 + i, 2, 3]}) for i in range(5)]
    ref = grpo("score", "--model", MODEL, stdin="\n".join(good) + "\n")
    for batch in (8, 2048):
        p = grpo("score", "--model", MODEL, "--batch-tokens", batch,
                 stdin="\n".join(good) + '\n{"tokens": "x"}\n' + good[0] + "\n")
        check(one_error(p, r"stdin line 6") and p.stdout == ref.stdout and len(p.stdout.splitlines()) == 5,
              f"score --batch-tokens {batch}: the 5 lines before a bad line 6 are written first",
              f"{len(p.stdout.splitlines())} lines; {last_error(p)}")


def g_val_step0():
    """9: the validation accuracy before training is step 0 of metrics.jsonl; 13: "1 step"."""
    out = T("val0")
    p = train(out, "data.val_file=" + GRPO_DATA[0], "trainer.val_before_train=true", "trainer.steps=1")
    said = re.search(r"validation accuracy before training: ([0-9.]+)", p.stderr)
    ms = metrics(out) if p.returncode == 0 else []
    zero = [m for m in ms if m.get("step") == 0]
    check(said and len(zero) == 1 and {"step", "val_accuracy"} <= set(zero[0])
          and all(k.startswith("val/") for k in set(zero[0]) - {"step", "val_accuracy"}) and
          abs(zero[0]["val_accuracy"] - float(said.group(1))) < 6e-4 and ms[0] is zero[0],
          "train: the accuracy before training is metrics.jsonl's first line, step 0", f"{zero} {last_error(p)}")
    check(re.search(r", 1 step, ", p.stderr) is not None, "train's progress line says \"1 step\"", p.stderr[:300])
    p = sft(T("one-step"), "--steps", 1)
    check(re.search(r"\b1 step of 2\b", p.stderr) and re.search(r"\b9\.\d\dM parameters", p.stderr),
          "sft's progress line says \"1 step\" and counts ~9.8M parameters", p.stderr[:300])


def g_init_help():
    """11: grpo init --help lists every preset (as --preset's error does), --force, and Qwen3."""
    p = grpo("init", "--out", T("x"), "--preset", "no-such")
    known = re.search(r"known: (.*)\)", p.stderr)
    presets = known.group(1).split(", ") if known else []
    h = grpo("init", "--help").stdout
    check(len(presets) >= 10 and all(x in h for x in presets) and "--force" in h.split("\n")[0] and "Qwen3" in h,
          "init --help: every preset, --force in the usage line, Qwen3", h[:300])


def g_train_file_word():
    """5: `grpo train g.yaml` suggests --config."""
    cfg = write("g.yaml", ["actor:", "  lr: 1e-6"])
    p = grpo("train", cfg)
    check(one_error(p, r'"[^"]*g\.yaml" is a configuration file: pass it as --config '), "train g.yaml: suggests "
          "--config", last_error(p))


GROUPS = {"kept": g_kept, "second_signal": g_second_signal, "lora_resume": g_lora_resume, "errors": g_errors,
          "fit": g_fit, "val_step0": g_val_step0, "init_help": g_init_help, "train_file_word": g_train_file_word}
sys.exit(harness.run_groups(setup, GROUPS))

#!/usr/bin/python3
"""Reward models (reward.reward_model, `grpo score` on one, `grpo init --reward-model`).

The peer: a float64 forward written from transformers' Qwen2ForSequenceClassification / Qwen3ForSequenceClassification
(tests/reference/qwen2_ref.py: the decoder, then the score head over the final-normed hidden states pooled at the
last token, as the classes do for a row without padding), and Jinja2 (python3-jinja2, the engine of transformers'
apply_chat_template) rendering the reward model's own chat template as verl's reward loop asks it to
(verl-project/verl 1dda039b, verl/experimental/reward_loop/reward_loop.py _preprocess_reward_inputs: the prompt's
messages, the response as the assistant's turn, add_generation_prompt false).

  score     `grpo score` on random reward models written by `grpo init --reward-model` (Qwen2 and Qwen3 shapes) vs
            the float64 forward: fp32 weights within 2e-5 of the score's scale (float32 sums over a 64-wide model),
            bf16 weights (and the emulated CUDA device's kernels, --device emu) against the same forward with bf16
            weights and operands (qwen2_ref's bf16 mode) within 1e-4
            (float32 sums as fp32's, but an operand whose sum lands on a bf16 rounding boundary may round the other
            way: one such flip moves a score by ~1e-3 of an activation's share; none was seen, 1e-7 measured)
  refused   a causal LM given as the reward model, a reward model given as the policy or to `grpo generate`, a
            classifier of 2 labels, a reward model without a chat template, a max_length past its positions: one
            `grpo: error:` line each
  loop      a GRPO step with reward.exact (weight 1) and the reward model (weight 0.5, fp32): each sample's reward is
            exact + 0.5 x the forward's score of the conversation Jinja2 renders, within 2e-5, and so is each
            validation sample's; the metric reward_model_score_mean is their mean; max_length cuts a conversation to
            its last tokens and counts it

usage: /usr/bin/python3 tests/train/reward_model_test.py --grpo build/grpo --tmp DIR
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, HERE)
import jinja2  # noqa: E402
import torch  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from grpo_parity import make_small_model, read_jsonl_bytes, write_byte_tokenizer  # noqa: E402
from harness import check as harness_check, group, summary  # noqa: E402

F32_TOL = 2e-5
BF16_TOL = 1e-4
GRPO = TMP = None


def check(ok, what):
    harness_check(what, ok)


def run(*args, stdin=None):
    return subprocess.run([GRPO, *args], input=stdin, capture_output=True, text=True, timeout=600)


def one_error_line(p):
    err = p.stderr.strip()
    return p.returncode != 0 and err.startswith("grpo: error:") and "\n" not in err, err


# The reward model's own template: it starts with its bos_token (which verl's reward loop removes) and ends with a
# token of its own tokenizer, <|score|>, which the policy's does not have.
RM_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
               "{% endfor %}<|score|>")


def make_rm(d, preset, seed):
    """`grpo init --reward-model`, with the byte tokenizer plus <|rm|> (its bos_token) and <|score|>, and RM_TEMPLATE."""
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    write_byte_tokenizer(d)
    tj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    for i, t in enumerate(("<|rm|>", "<|score|>")):
        tj["added_tokens"].append({"id": 259 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                                   "normalized": False, "special": True})
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    tc = json.load(open(os.path.join(d, "tokenizer_config.json")))
    tc["chat_template"], tc["bos_token"] = RM_TEMPLATE, "<|rm|>"
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)
    p = run("init", "--out", d, "--preset", preset, "--seed", str(seed), "--reward-model", "--force")
    if p.returncode != 0:
        raise RuntimeError(p.stderr)


def rel_err(a, b):
    return abs(a - b) / max(1.0, abs(b))


def score_lines(rm_dir, seqs, dtype):
    how = ["--device", "emu"] if dtype == "emu" else ["--dtype", dtype]
    p = run("score", "--model", rm_dir, *how, stdin="".join(json.dumps({"tokens": s}) + "\n" for s in seqs))
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return [json.loads(l)["score"] for l in p.stdout.splitlines()]


def test_score():
    gen = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, 259, (n,), generator=gen).tolist() for n in (1, 5, 17, 40, 3)]
    for preset in ("tiny", "qwen3-tiny"):
        d = os.path.join(TMP, f"rm-{preset}")
        make_rm(d, preset, 11)
        cfg = json.load(open(os.path.join(d, "config.json")))
        check(cfg["architectures"] == [("Qwen3" if "qwen3" in preset else "Qwen2") + "ForSequenceClassification"]
              and len(cfg["id2label"]) == 1, f"score/{preset}: grpo init wrote {cfg['architectures']}, "
              f"id2label {cfg['id2label']}")
        for dtype, tol in (("f32", F32_TOL), ("bf16", BF16_TOL), ("emu", BF16_TOL)):
            if dtype == "emu" and preset != "tiny":  # the emulated device's kernels (bf16), once
                continue
            m = ref.load_model(d, torch.float64, bf16=dtype != "f32")
            want = [r[0] for r in ref.reward_scores(m, seqs)]
            got = score_lines(d, seqs, dtype)
            scale = max(abs(w) for w in want)
            worst = max(abs(g - w) for g, w in zip(got, want)) / scale
            check(len(got) == len(want) and worst <= tol,
                  f"score/{preset}/{dtype}: {len(got)} sequences of 1..40 tokens, worst |grpo - torch| / max|score| "
                  f"{worst:.2e} (tol {tol:g}; scores {', '.join(f'{w:.4f}' for w in want)})")


def test_refused(policy):
    rm = os.path.join(TMP, "rm-tiny")
    cfg = json.load(open(os.path.join(rm, "config.json")))
    two = os.path.join(TMP, "rm-two-labels")
    shutil.rmtree(two, ignore_errors=True)
    shutil.copytree(rm, two)
    del cfg["id2label"], cfg["label2id"]  # transformers' default: 2 labels
    with open(os.path.join(two, "config.json"), "w") as f:
        json.dump(cfg, f)
    plain = os.path.join(TMP, "rm-no-template")
    shutil.rmtree(plain, ignore_errors=True)
    shutil.copytree(rm, plain)
    tc = json.load(open(os.path.join(plain, "tokenizer_config.json")))
    del tc["chat_template"]
    with open(os.path.join(plain, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)
    data = os.path.join(TMP, "prompts.jsonl")
    base = ["train", f"data.train_file={data}", f"trainer.out_dir={os.path.join(TMP, 'out-refused')}",
            "trainer.steps=1", "data.train_batch_size=2", "rollout.n=2", "data.max_prompt_length=48",
            "data.max_response_length=10"]
    cases = [
        ("causal-lm-as-reward-model", [*base, f"model.path={policy}", f"reward.reward_model.model_path={policy}"],
         "not a reward model"),
        ("reward-model-as-policy", [*base, f"model.path={rm}"], "a reward model"),
        ("generate-with-reward-model", ["generate", "--model", rm], "a reward model"),
        ("two-labels", ["score", "--model", two], "2 labels"),
        ("no-chat-template", [*base, f"model.path={policy}", f"reward.reward_model.model_path={plain}"],
         "no chat template"),
        ("max-length-past-positions", [*base, f"model.path={policy}", f"reward.reward_model.model_path={rm}",
                                       "reward.reward_model.max_length=5000"], "max_position_embeddings 2048"),
    ]
    for name, args, needle in cases:
        p = run(*args, stdin="")
        ok, err = one_error_line(p)
        check(ok and needle in err, f"refused/{name}: rc {p.returncode}, {err!r}")


def conversation_ids(rm_dir, prompt, response, max_length):
    """The tokens the reward model reads: Jinja2's rendering of [user prompt, assistant response] (no generation
    prompt) less the leading bos_token (verl's), tokenized by grpo with the reward model's own tokenizer (its parity
    with Hugging Face's is tests/text's), the last max_length."""
    tc = json.load(open(os.path.join(rm_dir, "tokenizer_config.json")))
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    msgs = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    text = env.from_string(tc["chat_template"]).render(messages=msgs, add_generation_prompt=False,
                                                       eos_token=tc.get("eos_token"), bos_token=tc["bos_token"])
    assert text.startswith(tc["bos_token"]) and text.endswith("<|score|>")
    text = text[len(tc["bos_token"]):]
    p = run("tokenize", "--tokenizer", os.path.join(rm_dir, "tokenizer.json"), "--jsonl",
            stdin=json.dumps({"text": text}) + "\n")
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    ids = json.loads(p.stdout)["ids"]
    return ids[-max_length:], len(ids) > max_length


def test_loop(policy):
    rm = os.path.join(TMP, "rm-tiny")
    m = ref.load_model(rm, torch.float64)
    data = os.path.join(TMP, "prompts.jsonl")
    for tag, max_length in (("whole", None), ("max-length-40", 40)):
        out = os.path.join(TMP, "out-loop-" + tag)
        shutil.rmtree(out, ignore_errors=True)
        args = ["train", f"model.path={policy}", f"data.train_file={data}", f"trainer.out_dir={out}",
                "trainer.steps=1", "data.train_batch_size=4", "rollout.n=4", "data.max_prompt_length=48",
                "data.max_response_length=10", "data.chat_template=false", "trainer.dump_samples=true",
                "reward.gsm8k.weight=0", "reward.exact.weight=1", f"reward.reward_model.model_path={rm}",
                "reward.reward_model.weight=0.5", "reward.reward_model.dtype=f32", "reward.reward_model.micro_batch_size=3"]
        if max_length:
            args.append(f"reward.reward_model.max_length={max_length}")
        else:  # the validation scores with it too
            args += [f"data.val_file={data}", "trainer.val_before_train=true", "rollout.val_kwargs.n=2",
                     "rollout.val_kwargs.temperature=1.0"]
        p = run(*args)
        check(p.returncode == 0, f"loop/{tag}: grpo train with a reward model ran (rc {p.returncode}) "
                                 f"{p.stderr.strip()[-300:] if p.returncode else ''}")
        if p.returncode != 0:
            continue
        rows = [json.loads(l) for l in open(data)]
        metrics = read_jsonl_bytes(os.path.join(out, "metrics.jsonl"))[-1]
        worst, scores, cut = 0.0, [], 0
        for s in read_jsonl_bytes(os.path.join(out, "samples.jsonl")):
            ids, was_cut = conversation_ids(rm, s["prompt"], s["response"], max_length or 10 ** 9)
            score = ref.reward_scores(m, [ids])[0][0]
            exact = float(s["response"].strip() == rows[s["prompt_index"]]["answer"])
            worst = max(worst, rel_err(s["reward"], exact + 0.5 * score))
            scores.append(score)
            cut += was_cut
        check(worst <= F32_TOL, f"loop/{tag}: {len(scores)} rewards = exact + 0.5 x the forward's score of Jinja2's "
                                f"conversation, worst rel {worst:.2e}")
        if not max_length:
            val = read_jsonl_bytes(os.path.join(out, "val_samples.jsonl"))
            vw = 0.0
            for s in val:
                ids, _ = conversation_ids(rm, rows[s["prompt_index"]]["prompt"], s["response"], 10 ** 9)
                exact = float(s["response"].strip() == rows[s["prompt_index"]]["answer"])
                vw = max(vw, rel_err(s["reward"], exact + 0.5 * ref.reward_scores(m, [ids])[0][0]))
            check(len(val) == 16 and vw <= F32_TOL, f"loop/{tag}: {len(val)} validation rewards, worst rel {vw:.2e}")
        mean = sum(scores) / len(scores)
        check(rel_err(metrics.get("reward_model_score_mean", float("nan")), mean) <= F32_TOL,
              f"loop/{tag}: reward_model_score_mean {metrics.get('reward_model_score_mean')} vs {mean:.6g}")
        check(metrics.get("reward_model_truncated") == cut and (cut > 0) == bool(max_length),
              f"loop/{tag}: reward_model_truncated {metrics.get('reward_model_truncated')}, conversations over "
              f"max_length {cut}")
        check("reward models" in p.stderr, f"loop/{tag}: the memory plan counts the reward model")


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_digit_rm(d):
    """A reward model built by hand whose score grows with the share of digits in the conversation: embeddings
    [is digit, 1, 0...]; one layer whose attention has zero queries and keys, so the last token averages the values
    (the normed digit feature) of every token, written by o_proj into feature 2; no MLP; the score head reads
    feature 2 of the final norm, 2 f sqrt(C) / sqrt(1 + 4 f^2) for a digit share f (the last token, the template's
    "\n", is not a digit)."""
    shutil.rmtree(d, ignore_errors=True)
    C = 8
    ref.make_model(d, seed=1, hidden=C, layers=1, heads=1, kv_heads=1, intermediate=C, vocab=259, tied=False,
                   max_pos=1024)
    w = {k: torch.zeros_like(t) for k, t in ref.load_weights(d).items() if k != "lm_head.weight"}
    eos = write_byte_tokenizer(d)
    vocab = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))["model"]["vocab"]
    w["model.embed_tokens.weight"][:, 1] = 1.0
    for ch in "0123456789":
        w["model.embed_tokens.weight"][vocab[ch], 0] = 1.0
    for k in ("model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
              "model.norm.weight"):
        w[k][:] = 1.0
    w["model.layers.0.self_attn.v_proj.weight"][0, 0] = 1.0
    w["model.layers.0.self_attn.o_proj.weight"][2, 0] = 1.0
    w["score.weight"] = torch.zeros(1, C)
    w["score.weight"][0, 2] = 1.0
    ref.save_safetensors(os.path.join(d, "model.safetensors"), w, {"format": "pt"})
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg.update(architectures=["Qwen2ForSequenceClassification"], id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0},
               eos_token_id=eos)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    tc = json.load(open(os.path.join(d, "tokenizer_config.json")))
    tc["chat_template"] = CHATML
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)


def test_demo(policy):
    """GRPO with the reward model alone raises its score on held-out prompts: the validation before training
    (step 0) against the one after the last step."""
    rm = os.path.join(TMP, "rm-digits")
    make_digit_rm(rm)
    m = ref.load_model(rm, torch.float64)
    want = [ref.reward_scores(m, [ids])[0][0] for ids in ([30, 31, 40], [30, 15, 40], [15, 16, 40])]
    check(want[0] == 0 and 0 < want[1] < want[2], f"demo: the constructed model scores 0, 1 and 2 digits of 3 "
          f"tokens {', '.join(f'{x:.3f}' for x in want)}")
    train, val = os.path.join(TMP, "demo-train.jsonl"), os.path.join(TMP, "demo-val.jsonl")
    with open(train, "w") as f:
        for i in range(32):
            f.write(json.dumps({"prompt": f"Tell me about item {i}.", "answer": ""}) + "\n")
    with open(val, "w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt": f"Describe thing {100 + i}!", "answer": ""}) + "\n")
    out = os.path.join(TMP, "out-demo")
    shutil.rmtree(out, ignore_errors=True)
    p = run("train", f"model.path={policy}", f"data.train_file={train}", f"data.val_file={val}", f"trainer.out_dir={out}",
            "trainer.steps=12", "trainer.val_every=12", "trainer.val_before_train=true", "data.train_batch_size=4",
            "rollout.n=8", "data.max_prompt_length=48", "data.max_response_length=16", "data.chat_template=false",
            "reward.gsm8k.weight=0", f"reward.reward_model.model_path={rm}", "actor.lr=1e-2", "actor.use_kl_loss=false",
            "rollout.val_kwargs.n=8", "rollout.val_kwargs.temperature=1.0")
    check(p.returncode == 0, f"demo: grpo train ran (rc {p.returncode}) {p.stderr.strip()[-300:] if p.returncode else ''}")
    if p.returncode:
        return
    vals = [r for r in read_jsonl_bytes(os.path.join(out, "metrics.jsonl")) if "val_accuracy" in r]
    key = "val/unknown/reward/mean@8"
    before, after = vals[0][key], vals[-1][key]
    check(len(vals) == 2 and after > 2 * before > 0,
          f"demo: the reward model's mean score on 8 held-out prompts x 8 samples, {before:.4f} before -> "
          f"{after:.4f} after 12 steps")


def make_judge(d):
    """A random causal LM with the byte tokenizer and a ChatML template; it stops at <|endoftext|> or <|im_end|>."""
    shutil.rmtree(d, ignore_errors=True)
    ref.make_model(d, seed=21, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=259, tied=False,
                   max_pos=1024)
    write_byte_tokenizer(d)
    tc = json.load(open(os.path.join(d, "tokenizer_config.json")))
    tc["chat_template"] = CHATML
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)


def greedy(m, ids, stops, max_new):
    """Greedy decoding by the float64 forward: the new tokens, a final stop token left out (as grpo's text)."""
    out = []
    for _ in range(max_new):
        t = int(torch.argmax(ref.logits(m, ids + out)[-1]))
        if t in stops:
            break
        out.append(t)
    return out


def test_judge(policy):
    """reward.judge: each sample's reward is weight x the number the regex finds last in the judge's greedy answer
    to the rubric, or failure_score; the judge's answer replayed by the float64 forward from Jinja2's rendering."""
    judge = os.path.join(TMP, "judge")
    make_judge(judge)
    data = os.path.join(TMP, "prompts.jsonl")
    rows = [json.loads(l) for l in open(data)]
    rubric = "Grade {response} (question: {prompt}; answer {answer}). {prompt}"
    out = os.path.join(TMP, "out-judge")

    def judged(out, regex, *more):
        """One step with the judge alone (weight 0.5, failures -1) reading the rubric with regex."""
        shutil.rmtree(out, ignore_errors=True)
        return run("train", f"model.path={policy}", f"data.train_file={data}", f"trainer.out_dir={out}",
                   "trainer.steps=1", "data.train_batch_size=4", "rollout.n=4", "data.max_prompt_length=48",
                   "data.max_response_length=10", "data.chat_template=false", "trainer.dump_samples=true",
                   "reward.gsm8k.weight=0", f"reward.judge.model_path={judge}", "reward.judge.weight=0.5",
                   "reward.judge.dtype=f32", f"reward.judge.rubric='{rubric}'", f"reward.judge.regex='{regex}'",
                   "reward.judge.max_new_tokens=12", "reward.judge.failure_score=-1", *more)
    p = judged(out, "([0-9])", "reward.judge.micro_batch_size=3")
    check(p.returncode == 0, f"judge: grpo train with a judge ran (rc {p.returncode}) "
                             f"{p.stderr.strip()[-300:] if p.returncode else ''}")
    if p.returncode:
        return
    m = ref.load_model(judge, torch.float64)
    tc = json.load(open(os.path.join(judge, "tokenizer_config.json")))
    tmpl = jinja2.Environment().from_string(tc["chat_template"])
    samples = read_jsonl_bytes(os.path.join(out, "samples.jsonl"))
    texts, answers = [], []
    for s in samples:
        row = rows[s["prompt_index"]]
        vals = {"prompt": row["prompt"], "response": s["response"], "answer": row["answer"]}
        filled = re.sub(r"\{(prompt|response|answer)\}", lambda g: vals[g.group(1)], rubric)
        texts.append(tmpl.render(messages=[{"role": "user", "content": filled}], add_generation_prompt=True))
    tok = run("tokenize", "--tokenizer", judge, "--jsonl", stdin="".join(json.dumps({"text": t}) + "\n" for t in texts))
    ids = [json.loads(l)["ids"] for l in tok.stdout.splitlines()]
    gen = [greedy(m, x, {256, 258}, 12) for x in ids]
    dec = run("tokenize", "--tokenizer", judge, "--jsonl", "--decode",
              stdin="".join(json.dumps({"ids": g}) + "\n" for g in gen))
    answers = [json.loads(l)["text"] for l in dec.stdout.splitlines()]
    want, failures = [], 0
    for a in answers:
        found = re.findall(r"([0-9])", a)
        failures += not found
        want.append(0.5 * (float(found[-1]) if found else -1.0))
    worst = max(abs(s["reward"] - w) for s, w in zip(samples, want))
    check(len(answers) == len(samples) == 16 and worst <= 1e-6,
          f"judge: 16 rewards = 0.5 x the last digit of the float64 forward's greedy answer (or -1), worst "
          f"{worst:.1e}; {failures} answers without one")
    metrics = read_jsonl_bytes(os.path.join(out, "metrics.jsonl"))[-1]
    check(0 < failures < 16 and metrics.get("judge_failures") == failures,
          f"judge: judge_failures {metrics.get('judge_failures')} vs {failures}")
    mean = sum(2 * w for w in want) / len(want)
    check(rel_err(metrics.get("judge_score_mean", float("nan")), mean) <= 1e-6,
          f"judge: judge_score_mean {metrics.get('judge_score_mean')} vs {mean:.6g}")
    check("judgements had no score" in p.stderr, "judge: the failures are warned about")
    bad = run("train", f"model.path={policy}", f"data.train_file={data}", f"trainer.out_dir={out}-bad",
              "data.max_prompt_length=48", "data.max_response_length=10", f"reward.judge.model_path={judge}",
              "reward.judge.regex='([0-9'")
    ok, err = one_error_line(bad)
    check(ok and "reward.judge.regex" in err, f"judge: a regex that does not compile: {err!r}")
    bad = run("train", f"model.path={policy}", f"data.train_file={data}", f"trainer.out_dir={out}-bad",
              "data.max_prompt_length=48", "data.max_response_length=10", f"reward.judge.model_path={judge}",
              "reward.judge.max_length=12", "reward.judge.max_new_tokens=12")
    ok, err = one_error_line(bad)
    check(ok and "leaves no room for a rubric" in err, f"judge: max_length without room for a rubric: {err!r}")
    # a regex without a group that can match empty: the last non-empty match, all of it (a run of digits)
    out2 = out + "-nogroup"
    p = judged(out2, "[0-9]*")
    got = [s["reward"] for s in read_jsonl_bytes(os.path.join(out2, "samples.jsonl"))] if p.returncode == 0 else []
    want = [0.5 * (float(re.findall(r"[0-9]+", a)[-1]) if re.findall(r"[0-9]+", a) else -1.0) for a in answers]
    check(got == want, f"judge: regex [0-9]* scores the last run of digits of the same answers ({p.stderr[-200:] if p.returncode else ''})")


def main():
    global GRPO, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    args = ap.parse_args()
    GRPO, TMP = os.path.abspath(args.grpo), os.path.abspath(args.tmp)
    os.makedirs(TMP, exist_ok=True)
    torch.set_num_threads(1)
    policy = os.path.join(TMP, "policy")
    shutil.rmtree(policy, ignore_errors=True)
    make_small_model(policy, seed=5, tied=True, kv_heads=2)
    with open(os.path.join(TMP, "prompts.jsonl"), "w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt": f"Q{i}: what is {i} + {2 * i + 1}?", "answer": str(3 * i + 1)}) + "\n")
    group("score", test_score)
    group("refused", lambda: test_refused(policy))
    group("loop", lambda: test_loop(policy))
    group("demo", lambda: test_demo(policy))
    group("judge", lambda: test_judge(policy))
    sys.exit(summary())


if __name__ == "__main__":
    main()

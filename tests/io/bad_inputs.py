#!/usr/bin/python3
"""Bad-input test: broken model files, configs, stdin and command lines must give one clear line
"grpo: error: ..." on stderr and exit status 1 -- never a crash, a hang or a silent success.

usage: /usr/bin/python3 tests/io/bad_inputs.py --grpo PATH_TO_GRPO_BINARY --tmp DIR
Valid tiny models come from the independent reference (tests/reference/qwen2_ref.py); every
broken case is a copy of one of them with a single change, and the baselines prove the
unchanged copies load and score. Prints "PASS name" / "FAIL name: why" per case and finally
"N passed, M failed"; exit 0 iff all pass.
"""
import argparse
import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # keep tests/reference free of __pycache__
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import qwen2_ref as ref  # noqa: E402

SMALL = dict(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, vocab=100)
BASES = {  # name -> make_model arguments
    "f32-tied": dict(SMALL, seed=1, tied=True, dtype="f32"),
    "bf16-untied": dict(SMALL, seed=2, tied=False, dtype="bf16"),
    "f32-3shards": dict(SMALL, seed=3, tied=False, dtype="f32", shards=3),
}
ST, CFG, IDX = "model.safetensors", "config.json", "model.safetensors.index.json"
SHARD1, SHARD2 = "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"
L0 = "model.layers.0."
QW, QB, KB = L0 + "self_attn.q_proj.weight", L0 + "self_attn.q_proj.bias", L0 + "self_attn.k_proj.bias"
KW = L0 + "self_attn.k_proj.weight"
LN1, NORM = L0 + "input_layernorm.weight", "model.norm.weight"
GOOD = '{"tokens": [1, 2, 3, 4]}\n'
ERR = "grpo: error: "


# ------------------------------------------------------------------ file surgery (mutations)
# A mutation is a function of the case's model directory that breaks exactly one thing.

def st_read(path):
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def st_write(path, header, data):
    """header: a dict, or raw JSON text (str) written as is."""
    h = (header if isinstance(header, str) else json.dumps(header)).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + data)


def header(fn, file=ST):
    """Edit the safetensors header in place: fn(h) mutates the dict or returns raw JSON text."""
    def m(d):
        h, data = st_read(os.path.join(d, file))
        st_write(os.path.join(d, file), fn(h) or h, data)
    return m


def entry(name, **fields):
    return header(lambda h: h[name].update(fields))


def raw_bytes(fn, file=ST):
    def m(d):
        p = os.path.join(d, file)
        b = open(p, "rb").read()
        open(p, "wb").write(fn(b))
    return m


def drop_tensor(name, file=ST):
    """Remove a tensor from header and data consistently (later offsets shift down)."""
    def m(d):
        h, data = st_read(os.path.join(d, file))
        b, e = h.pop(name)["data_offsets"]
        for k, v in h.items():
            if k != "__metadata__" and v["data_offsets"][0] >= e:
                v["data_offsets"] = [o - (e - b) for o in v["data_offsets"]]
        st_write(os.path.join(d, file), h, data[:b] + data[e:])
    return m


def duplicate_key(name, new_data):
    """Raw header text naming `name` twice; new_data: the copy gets its own appended bytes."""
    def m(d):
        h, data = st_read(os.path.join(d, ST))
        e = dict(h[name])
        if new_data:
            e["data_offsets"] = [len(data), len(data) + e["data_offsets"][1] - e["data_offsets"][0]]
        text = json.dumps(h)[:-1] + ", " + json.dumps(name) + ": " + json.dumps(e) + "}"
        st_write(os.path.join(d, ST), text, data + (data[slice(*h[name]["data_offsets"])] if new_data else b""))
    return m


def edit_json(file, fn):
    def m(d):
        p = os.path.join(d, file)
        obj = json.load(open(p))
        obj = fn(obj) or obj
        open(p, "w").write(json.dumps(obj))
    return m


def cfg(**kv):  # set config keys; value None deletes the key
    def fn(c):
        for k, v in kv.items():
            c.pop(k) if v is None else c.__setitem__(k, v)
    return edit_json(CFG, fn)


def write(file, text):
    return lambda d: open(os.path.join(d, file), "w").write(text)


def remove(file):
    return lambda d: os.remove(os.path.join(d, file))


def remap(tensor, shard):  # the index claims `tensor` lives in `shard`
    return edit_json(IDX, lambda x: x["weight_map"].__setitem__(tensor, shard))


def tree_hashes(d):
    return {f: hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest() if os.path.isfile(os.path.join(d, f))
            else "(not a file)" for f in sorted(os.listdir(d))}


# ------------------------------------------------------------------ the cases
# argv and words may use "{d}" for the case's directory; a tuple in words means any one of them.
# same_ok: a run that exits 0 with exactly the unmodified base's output also passes.
Case = collections.namedtuple("Case", "name base mutate argv stdin words stdout_empty post same_ok",
                              defaults=(None, False))


def load(name, mutate, *words, base="f32-tied", same_ok=False):
    return Case(name, base, mutate, ["score", "--model", "{d}"], GOOD, words, True, same_ok=same_ok)


def stdin(name, lines, *words):
    return Case(name, "f32-tied", None, ["score", "--model", "{d}"], "".join(l + "\n" for l in lines), words, False)


def cli(name, argv, *words, base=None, post=None):
    return Case(name, base, None, argv, "", words, True, post)


def unchanged(d):
    after = tree_hashes(d)
    return None if after == BEFORE[d] else f"files in {d} changed: {after} != {BEFORE[d]}"


def absent(d):
    return f"{d} was created" if os.path.exists(d) else None


def stale_copy(tensor, into):
    """`into` also holds a zeroed copy of `tensor`, which the index maps to another shard."""
    def m(d):
        src = json.load(open(os.path.join(d, IDX)))["weight_map"][tensor]
        hs, ds = st_read(os.path.join(d, src))
        h, data = st_read(os.path.join(d, into))
        b, e = hs[tensor]["data_offsets"]
        h[tensor] = dict(hs[tensor], data_offsets=[len(data), len(data) + e - b])
        st_write(os.path.join(d, into), h, data + bytes(e - b))
    return m


def header_len_minus_one(d):
    """The header padded with spaces, its length field one short: every tensor shifts by one byte."""
    path = os.path.join(d, ST)
    h, data = st_read(path)
    text = (json.dumps(h) + " " * 8).encode()
    with open(path, "wb") as f:
        f.write((len(text) - 1).to_bytes(8, "little") + text + data)


def gap_before_last(d):
    """4 unused bytes before the last tensor's data (its offsets moved past them)."""
    path = os.path.join(d, ST)
    h, data = st_read(path)
    last = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
    b, e = h[last]["data_offsets"]
    h[last]["data_offsets"] = [b + 4, e + 4]
    st_write(path, h, data[:b] + bytes(4) + data[b:])


def empty_entries(n):  # n zero-size tensors at offset 0 (a valid file, which must load quickly)
    return header(lambda h: json.dumps(dict(h, **{f"e{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
                                                  for i in range(n)})))


def config_text(fn):  # rewrite config.json's text: fn(text) -> text
    def m(d):
        path = os.path.join(d, CFG)
        text = open(path).read()
        open(path, "w").write(fn(text))
    return m


SD = "{d}/" + ST
CASES = [
    # --- safetensors container
    load("st-shorter-than-8-bytes", raw_bytes(lambda b: b[:5]), SD, "truncated"),
    load("st-empty-file", raw_bytes(lambda b: b""), SD, "truncated"),
    load("st-header-len-past-eof", raw_bytes(lambda b: len(b).to_bytes(8, "little") + b[8:]), SD, "header length"),
    load("st-header-len-2^64-1", raw_bytes(lambda b: b"\xff" * 8 + b[8:]), SD, "header length"),
    load("st-header-len-0", raw_bytes(lambda b: b"\0" * 8 + b[8:]), SD, "not a valid JSON object"),
    load("st-header-not-json", header(lambda h: "this is not json"), SD, "not a valid JSON object"),
    load("st-header-json-array", header(lambda h: "[1, 2, 3]"), SD, "not a valid JSON object"),
    load("st-truncated-data", raw_bytes(lambda b: b[:-6]), SD, NORM, "data_offsets", "truncated"),
    load("st-truncated-into-header", raw_bytes(lambda b: b[:40]), SD, "header length"),
    load("st-offsets-end-before-begin", entry(LN1, data_offsets=[128, 0]), SD, LN1, "data_offsets"),
    load("st-offsets-not-integers", entry(LN1, data_offsets=[0, "128"]), SD, LN1, "data_offsets"),
    load("st-offsets-one-number", entry(LN1, data_offsets=[0]), SD, LN1, "data_offsets"),
    load("st-size-mismatch", entry(NORM, shape=[31]), SD, NORM, "bytes"),
    load("st-overlapping-offsets", header(lambda h: h[KB].update(
        data_offsets=[h[QB]["data_offsets"][0], h[QB]["data_offsets"][0] + 64])), SD, QB, KB, "overlapping"),
    load("st-unknown-dtype", entry(LN1, dtype="F33"), SD, LN1, "unknown dtype", "F33"),
    load("st-dtype-not-string", entry(LN1, dtype=32), SD, LN1, "dtype"),
    load("st-unsupported-dtype-I32", entry(LN1, dtype="I32"), SD, LN1, "I32"),
    load("st-unsupported-dtype-I16-bf16", entry(LN1, dtype="I16"), SD, LN1, "I16", base="bf16-untied"),
    load("st-too-many-dims", entry(LN1, shape=[1] * 8 + [32]), SD, LN1, "shape"),
    load("st-negative-dim", entry(LN1, shape=[-32]), SD, LN1, "shape"),
    load("st-fractional-dim", entry(LN1, shape=[32.5]), SD, LN1, "shape"),
    load("st-entry-not-object", header(lambda h: h.__setitem__(LN1, [1, 2])), SD, LN1, "not an object"),
    load("st-duplicate-name", duplicate_key(LN1, True), SD, LN1, "twice"),
    load("st-duplicate-name-same-offsets", duplicate_key(LN1, False), SD, LN1, ("twice", "overlapping")),
    load("st-header-trailing-garbage", header(lambda h: json.dumps(h) + " garbage"), SD, "JSON"),
    # a hostile-input run's findings: a 10 MB header of 150,000 empty entries took 32 s (a quadratic
    # duplicate check); a header length off by one shifted every tensor and was accepted; so were
    # bytes after the data
    load("st-150000-empty-entries", empty_entries(150000), same_ok=True),
    load("st-header-len-off-by-one", header_len_minus_one, SD, "after the last tensor"),
    load("st-trailing-bytes", raw_bytes(lambda b: b + bytes(16)), SD, "16 bytes after the last tensor"),
    load("st-gap-between-tensors", gap_before_last, SD, "gap"),
    load("st-name-with-newline",
         header(lambda h: h.__setitem__("bad\nname", {"dtype": "X", "shape": [], "data_offsets": [0, 0]})), SD, "bad"),
    # --- model directory
    cli("dir-missing", ["score", "--model", "{d}/nope"], "{d}/nope"),
    load("dir-no-safetensors", remove(ST), "{d}", "no model.safetensors"),
    load("dir-safetensors-is-directory", lambda d: (os.remove(os.path.join(d, ST)), os.mkdir(os.path.join(d, ST))), SD),
    load("dir-missing-tensor", drop_tensor(QB), "{d}", QB, "missing tensor"),
    load("dir-wrong-shape", entry(QW, shape=[16, 64]), SD, QW, "[16, 64]", "[32, 32]"),
    load("dir-transposed-1d", entry(NORM, shape=[1, 32]), SD, NORM, "[1, 32]", "[32]"),
    load("dir-untied-no-lm_head", drop_tensor("lm_head.weight"), "{d}", "lm_head.weight", base="bf16-untied"),
    load("dir-index-missing-shard", remap(QW, "missing.safetensors"), "{d}/missing.safetensors", base="f32-3shards"),
    load("dir-index-tensor-not-in-shard", remap(QW, SHARD2), "{d}/" + SHARD2, QW, "missing from the shard",
         base="f32-3shards"),
    load("dir-index-malformed", write(IDX, '{"weight_map": {'), "{d}/" + IDX, "malformed JSON", base="f32-3shards"),
    load("dir-index-no-weight_map", write(IDX, '{"metadata": {}}'), "{d}/" + IDX, "weight_map", base="f32-3shards"),
    load("dir-index-path-in-name", remap(QW, "../" + SHARD2), "{d}/" + IDX, QW, base="f32-3shards"),
    load("dir-index-value-not-string", remap(QW, 3), "{d}/" + IDX, QW, base="f32-3shards"),
    # the index says shard 2, so a stale copy in shard 1 must be rejected or ignored, never used
    load("dir-index-stale-copy-in-other-shard", stale_copy(KW, SHARD1), KW, base="f32-3shards", same_ok=True),
    load("dir-shard-truncated", raw_bytes(lambda b: b[:-4], SHARD2), "{d}/" + SHARD2, "truncated", base="f32-3shards"),
    # --- config.json
    load("cfg-missing", remove(CFG), "{d}/" + CFG),
    load("cfg-trailing-garbage", lambda d: open(os.path.join(d, CFG), "a").write(" garbage"), "{d}/" + CFG),
    load("cfg-malformed", write(CFG, '{"hidden_size": 32,'), "{d}/" + CFG, "malformed JSON"),
    load("cfg-empty", write(CFG, ""), "{d}/" + CFG, "malformed JSON"),
    load("cfg-not-object", write(CFG, "[1, 2]"), "{d}/" + CFG, "not a JSON object"),
    # a Qwen2 file called Llama: its q/k/v biases have no place in Llama's layout (not dropped silently)
    load("cfg-llama", cfg(architectures=["LlamaForCausalLM"]), "{d}/model.safetensors", "q_proj.bias",
         "LlamaForCausalLM"),
    load("cfg-model_type-other", cfg(architectures=None, model_type="gemma2"), "{d}/" + CFG, '"gemma2"'),
    load("cfg-no-arch-no-model_type", cfg(architectures=None, model_type=None), "{d}/" + CFG, "architecture"),
    load("cfg-sliding-window", cfg(use_sliding_window=True), "{d}/" + CFG, "sliding-window"),
    load("cfg-sliding-window-not-bool", cfg(use_sliding_window="no"), "{d}/" + CFG, "use_sliding_window"),
    load("cfg-missing-hidden_size", cfg(hidden_size=None), "{d}/" + CFG, '"hidden_size"', "missing"),
    load("cfg-hidden_size-string", cfg(hidden_size="64"), "{d}/" + CFG, '"hidden_size"', "integer"),
    load("cfg-hidden_size-fraction", cfg(hidden_size=32.5), "{d}/" + CFG, '"hidden_size"', "integer"),
    load("cfg-hidden-not-multiple-of-heads", cfg(hidden_size=30), "{d}/" + CFG, "hidden_size 30",
         "num_attention_heads 4"),
    load("cfg-heads-not-multiple-of-kv", cfg(num_key_value_heads=3), "{d}/" + CFG, "num_key_value_heads 3"),
    load("cfg-zero-layers", cfg(num_hidden_layers=0), "{d}/" + CFG, "num_hidden_layers"),
    load("cfg-negative-vocab", cfg(vocab_size=-5), "{d}/" + CFG, "vocab_size"),
    load("cfg-odd-head-dim", cfg(hidden_size=36, num_attention_heads=4, num_key_value_heads=2), "{d}/" + CFG, "even"),
    load("cfg-head_dim-mismatch", cfg(head_dim=16), "{d}/" + CFG, "head_dim 16"),
    # Qwen3: its MoE sibling, a RoPE variant, a Qwen2 file called Qwen3 (no q/k norms), a bad head_dim
    load("cfg-qwen3-moe", cfg(architectures=["Qwen3MoeForCausalLM"]), "{d}/" + CFG, "Qwen3MoeForCausalLM"),
    load("cfg-rope_parameters-yarn", cfg(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
         "{d}/" + CFG, "rope_parameters.rope_type", '"yarn"'),
    load("cfg-rope_parameters-not-object", cfg(rope_parameters=[1e6]), "{d}/" + CFG, "rope_parameters"),
    load("cfg-qwen3-without-q_norm", cfg(architectures=["Qwen3ForCausalLM"], model_type="qwen3"),
         "{d}", "model.layers.0.self_attn.q_norm.weight", "missing tensor"),
    # attention_bias also puts a bias on o_proj (transformers' Qwen3, Llama), which the layout has not
    load("cfg-qwen3-attention_bias", cfg(architectures=["Qwen3ForCausalLM"], model_type="qwen3", attention_bias=True),
         "{d}/" + CFG, "attention_bias", "Qwen3ForCausalLM"),
    # Llama and Mistral: what their rows refuse, each in one line naming the key
    load("cfg-llama-mlp_bias", cfg(architectures=["LlamaForCausalLM"], model_type="llama", mlp_bias=True),
         "{d}/" + CFG, "mlp_bias", "LlamaForCausalLM"),
    load("cfg-llama-rope-yarn", cfg(architectures=["LlamaForCausalLM"], model_type="llama",
                                    rope_scaling={"rope_type": "yarn", "factor": 4.0}),
         "{d}/" + CFG, "rope_scaling.rope_type", '"yarn"', "llama3"),
    load("cfg-llama3-no-factors", cfg(architectures=["LlamaForCausalLM"], model_type="llama",
                                      rope_scaling={"rope_type": "llama3", "factor": 8.0}),
         "{d}/" + CFG, "llama3", "low_freq_factor"),
    load("cfg-llama-rope-factor-below-1", cfg(architectures=["LlamaForCausalLM"], model_type="llama",
                                          rope_scaling={"rope_type": "linear", "factor": 0.5}),
         "{d}/" + CFG, "factor 0.5"),
    load("cfg-mistral-sliding-window-negative", cfg(architectures=["MistralForCausalLM"], model_type="mistral",
                                                    sliding_window=-16), "{d}/" + CFG, "sliding_window -16"),
    load("cfg-mistral-sliding-window-string", cfg(architectures=["MistralForCausalLM"], model_type="mistral",
                                                  sliding_window="4k"), "{d}/" + CFG, "sliding_window"),
    # Gemma 3: what its row refuses (Gemma 2's soft-caps, another activation, layer types that do not repeat)
    load("cfg-gemma3-softcap", cfg(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                                   final_logit_softcapping=30.0), "{d}/" + CFG, "final_logit_softcapping"),
    load("cfg-gemma3-activation", cfg(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                                      hidden_activation="silu"), "{d}/" + CFG, "hidden_activation", '"silu"'),
    load("cfg-gemma3-rope-local-zero", cfg(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                                           rope_local_base_freq=0), "{d}/" + CFG, "rope_local_base_freq"),
    load("cfg-gemma3-layer-types", cfg(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                                       num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"]),
         "{d}/" + CFG, "layer_types", "layer 1"),
    load("cfg-qwen3-head_dim-zero", cfg(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=0),
         "{d}/" + CFG, "head_dim"),
    load("cfg-rope_scaling", cfg(rope_scaling={"type": "linear", "factor": 2.0}), "{d}/" + CFG, "rope_scaling"),
    load("cfg-hidden_act-gelu", cfg(hidden_act="gelu"), "{d}/" + CFG, '"gelu"'),
    load("cfg-hidden_act-number", cfg(hidden_act=3.0), "{d}/" + CFG, '"hidden_act"', "string"),
    # duplicate keys: the last wins, as in Python and Hugging Face (here a wrong vocab_size, which the
    # weights then refuse; with the first winning it loaded silently)
    load("cfg-duplicate-key-last-wins", config_text(lambda t: t.replace("{", '{"vocab_size": 999, ', 1)
                                                    .replace('"vocab_size": 100', '"vocab_size": 100, "vocab_size": 101')),
         SD, "model.embed_tokens.weight", "[101, 32]"),
    load("cfg-rope_theta-negative", cfg(rope_theta=-1), "{d}/" + CFG, "rope_theta"),
    load("cfg-eos-not-id", cfg(eos_token_id="</s>"), "{d}/" + CFG, '"eos_token_id"'),
    load("cfg-vocab-mismatch-weights", cfg(vocab_size=101), SD, "model.embed_tokens.weight", "[100, 32]", "[101, 32]"),
    # sizes far beyond the weights file must fail on the file, not in arithmetic or allocation
    load("cfg-huge-hidden", cfg(hidden_size=1 << 40), "{d}"),
    load("cfg-huge-layers", cfg(num_hidden_layers=1 << 33), "{d}"),
    load("cfg-layers-2^57", cfg(num_hidden_layers=1 << 57), "{d}"),  # sizes wrap to a small buffer
    # --- grpo score stdin
    stdin("score-bad-json-line-2", [GOOD.strip(), '{"tokens": [1, 2', GOOD.strip()], "stdin line 2", "JSON"),
    stdin("score-two-objects-on-a-line", ['{"tokens": [1, 2]}{"tokens": [3, 4]}'], "stdin line 1"),
    stdin("score-not-object", ["[1, 2, 3]"], "stdin line 1", "JSON object"),
    stdin("score-blank-line", [GOOD.strip(), ""], "stdin line 2"),
    stdin("score-tokens-missing", ['{"input_ids": [1, 2]}'], "stdin line 1", '"tokens"', '"ids"'),
    stdin("score-tokens-and-ids", ['{"tokens": [1, 2], "ids": [1, 2]}'], "stdin line 1", "give one"),
    stdin("score-tokens-not-array", ['{"tokens": "1 2 3"}'], "stdin line 1", '"tokens"'),
    stdin("score-tokens-empty", ['{"tokens": []}'], "stdin line 1", "empty"),
    stdin("score-id-equals-vocab", ['{"tokens": [1, 2, 100]}'], "stdin line 1", '"tokens"[2] is 100', "[0, 100)"),
    stdin("score-id-negative", ['{"tokens": [-1, 2]}'], "stdin line 1", '"tokens"[0] is -1', "[0, 100)"),
    stdin("score-id-fraction", ['{"tokens": [1, 1.5]}'], "stdin line 1", '"tokens"[1] is 1.5'),
    stdin("score-id-string", ['{"tokens": [1, "2"]}'], "stdin line 1", '"tokens"[1] is "2"'),
    stdin("score-id-huge", ['{"tokens": [1, 1e300]}'], "stdin line 1", '"tokens"[1] is 1e+300'),
    stdin("score-too-long", [GOOD.strip(), json.dumps({"tokens": [1] * 513})], "stdin line 2", "513",
          "max_position_embeddings 512"),
    # --- size caps (README "Hostile inputs"): refused before the expensive parse
    load("cap-config-json-over-16MiB", write(CFG, '{"pad": "' + "x" * (16 << 20) + '"}'), "{d}/" + CFG, "16 MiB"),
    load("cap-safetensors-header-over-16MiB", header(lambda h: json.dumps(h) + " " * (16 << 20)), "{d}/" + ST,
         "16 MiB"),
    stdin("cap-stdin-line-over-8MiB", ['{"tokens": [' + " " * (8 << 20) + "1]}"], "stdin:1", "8 MiB"),
    Case("cap-tokenizer-json-over-64MiB", "f32-tied", write("tokenizer.json", "{}" + " " * (64 << 20)),
         ["tokenize", "--tokenizer", "{d}/tokenizer.json"], "", ("{d}/tokenizer.json", "64 MiB"), True),
    Case("cap-yaml-config-over-1MiB", "f32-tied", write("big.yaml", "#" * (1 << 20) + "\n"),
         ["train", "--config", "{d}/big.yaml", "--print-config"], "", ("{d}/big.yaml", "1 MiB"), True),
    # --- command line
    cli("cli-unknown-command", ["frobnicate"], '"frobnicate"', "unknown command"),
    cli("cli-unknown-option", ["score", "--model", "{d}", "--frob"], '"--frob"', base="f32-tied"),
    cli("cli-missing-model", ["score"], "--model", "missing"),
    cli("cli-model-without-value", ["score", "--model"], "--model"),
    *[cli("cli-batch-tokens-" + v, ["score", "--model", "{d}", "--batch-tokens", v], "--batch-tokens", f'"{v}"',
          base="f32-tied") for v in ("0", "abc", "12x", "-5")],
    cli("init-unknown-preset", ["init", "--out", "{d}/m", "--preset", "qwen9"], "--preset", '"qwen9"',
        post=lambda d: absent(d + "/m")),
    cli("init-bad-dtype", ["init", "--out", "{d}/m", "--dtype", "f64"], "--dtype", '"f64"',
        post=lambda d: absent(d + "/m")),
    cli("init-bad-seed", ["init", "--out", "{d}/m", "--seed", "-1"], "--seed", post=lambda d: absent(d + "/m")),
    cli("init-into-existing-model", ["init", "--out", "{d}"], "{d}", "--force", base="f32-tied",
        post=unchanged),
    cli("init-into-dir-with-only-weights", ["init", "--out", "{d}"], "{d}", "--force", base="bf16-untied",
        post=unchanged),
    cli("init-out-is-a-file", ["init", "--out", "{d}/config.json"], "{d}/config.json", "not a directory",
        base="f32-tied", post=unchanged),
]
BASE_OUT = {}  # base -> its output for GOOD
BEFORE = {}  # case dir -> file hashes before the run (for the init-into-existing cases)


# ------------------------------------------------------------------ driver

# Under AddressSanitizer a failed huge allocation should return NULL, as malloc does, not abort.
ASAN = [os.environ.get("ASAN_OPTIONS"), "allocator_may_return_null=1"]
ENV = dict(os.environ, ASAN_OPTIONS=":".join(filter(None, ASAN)))


def run(grpo, argv, stdin_text):
    # Every case is a tiny model (an ASan run takes well under a second): 20 s is a hang, like the 32 s
    # header parse was.
    return subprocess.run([grpo] + argv, input=stdin_text, capture_output=True, text=True, timeout=20,
                          errors="replace", env=ENV)


def check_error(p, words, stdout_empty, d):
    """None when p is a clean one-line error naming all `words`, else why not."""
    p.stderr = "".join(l for l in p.stderr.splitlines(True) if "WARNING: AddressSanitizer failed to allocate" not in l)
    if p.returncode < 0:
        return f"killed by signal {-p.returncode}; stderr: {p.stderr.strip()[-300:]!r}"
    if p.returncode != 1:
        return f"exit {p.returncode} (want 1); stderr: {p.stderr.strip()[-300:]!r}"
    if not p.stderr.endswith("\n") or p.stderr.count("\n") != 1:
        return f"stderr is not exactly one line: {p.stderr[-400:]!r}"
    if not p.stderr.startswith(ERR):
        return f"stderr does not start with {ERR!r}: {p.stderr.strip()!r}"
    for w in words:
        alts = [x.format(d=d) for x in (w if isinstance(w, tuple) else (w,))]
        if not any(a in p.stderr for a in alts):
            return f"message lacks {' or '.join(map(repr, alts))}: {p.stderr.strip()!r}"
    if stdout_empty and p.stdout:
        return f"unexpected stdout {p.stdout[:200]!r}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    a = ap.parse_args()
    grpo, tmp = os.path.abspath(a.grpo), os.path.abspath(a.tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    results = []

    def report(name, why):
        results.append(why is None)
        print(f"PASS {name}" if why is None else f"FAIL {name}: {why}")
        sys.stdout.flush()

    for b, kw in BASES.items():
        ref.make_model(os.path.join(tmp, "base", b), **kw)

    def fresh(name, base):
        d = os.path.join(tmp, name)
        if base:
            shutil.copytree(os.path.join(tmp, "base", base), d)
        else:
            os.makedirs(d)
        return d

    # Baselines: each unmodified base scores (so every broken copy is broken only by its change),
    # and so does a valid file the loader must not reject: an empty tensor sharing its offset with
    # the next one, listed after it.
    def add_empty(h):
        h2 = {}
        for k, v in h.items():
            h2[k] = v
            if k == LN1:
                h2["extra.empty"] = {"dtype": "F32", "shape": [0, 4], "data_offsets": [v["data_offsets"][0]] * 2}
        return json.dumps(h2)
    baselines = [(b, None) for b in BASES] + [("f32-tied", header(add_empty))]
    for b in BASES:
        BASE_OUT[b] = run(grpo, ["score", "--model", os.path.join(tmp, "base", b)], GOOD).stdout
    for b, mutate in baselines:
        name = "baseline-" + b + ("-extra-empty-tensor" if mutate else "")
        d = fresh(name, b)
        if mutate:
            mutate(d)
        seqs = [[1, 2, 3, 4], [5], list(range(100)), [99] * 512]
        try:
            p = run(grpo, ["score", "--model", d], "".join(json.dumps({"tokens": s}) + "\n" for s in seqs))
            lines = p.stdout.splitlines()
            why = (f"exit {p.returncode}: {p.stderr.strip()[-300:]!r}" if p.returncode != 0 else
                   f"stderr not empty: {p.stderr[-300:]!r}" if p.stderr else
                   f"{len(lines)} output lines for {len(seqs)} sequences" if len(lines) != len(seqs) else
                   next((f"line {i}: bad {l[:80]!r}" for i, (l, s) in enumerate(zip(lines, seqs))
                         if len(json.loads(l)["logprobs"]) != len(s) - 1), None))
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
        report(name, why)

    for c in CASES:
        try:
            d = fresh(c.name, c.base)
            if c.mutate:
                c.mutate(d)
            BEFORE[d] = tree_hashes(d)
            p = run(grpo, [x.format(d=d) for x in c.argv], c.stdin)
            if c.same_ok and p.returncode == 0 and not p.stderr and p.stdout == BASE_OUT.get(c.base):
                why = None
            else:
                why = check_error(p, c.words, c.stdout_empty, d) or (c.post(d) if c.post else None)
        except Exception as e:  # report and keep going: one broken case shouldn't hide the rest
            why = f"{type(e).__name__}: {e}"
        report(c.name, why)

    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

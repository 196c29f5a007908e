#!/usr/bin/env python3
"""The `grpo train` configuration (src/train/grpo_config.c, src/base/yaml.c) against PyYAML.

For each YAML file (block and flow style, comments, quoting, YAML 1.1 booleans, 1e-6, lists, anchors
and merges, multi-line strings) and override list, config_tool's resolved JSON must equal what PyYAML
parses, merged over the defaults (config_tool with no arguments) and typed by the key table
(config_tool --schema). PyYAML's pure-Python loader is the peer: it shares no code with libyaml.
Bad inputs must exit 1 with one "grpo: error:" line naming the file:line (lines from PyYAML's marks)
or the override, and the key. README.md's table must equal `config_tool --markdown`.

    config_test.py --tool build/tests/config_tool --doc README.md --tmp /tmp/cfg
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys

import yaml

ap = argparse.ArgumentParser()
ap.add_argument("--tool", required=True)
ap.add_argument("--doc", required=True, help="Markdown file holding the table between the config-table markers")
ap.add_argument("--tmp", required=True)
args = ap.parse_args()
os.makedirs(args.tmp, exist_ok=True)

passed = failed = 0


def check(ok, name, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {name}")
    else:
        failed += 1
        print(f"FAIL {name}: {detail}")


def run(*argv):
    return subprocess.run([args.tool, *argv], capture_output=True, text=True, timeout=60)


def flat_json(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = prefix + k
        if isinstance(v, dict) and key not in MAPS:  # a map key's value is one value
            out.update(flat_json(v, key + "."))
        else:
            out[key] = v
    return out


SCHEMA = {k["name"]: k for k in json.loads(run("--schema").stdout)}
MAPS = {n for n, k in SCHEMA.items() if k["type"] == "map"}
MAP_ALIASES = {"data.apply_chat_template_kwargs": "data.chat_template_kwargs"}  # verl's name
r = run()
DEFAULTS = flat_json(json.loads(r.stdout))
check(r.returncode == 0 and set(DEFAULTS) == set(SCHEMA), "defaults cover every key of the table",
      f"{r.stderr} {set(DEFAULTS) ^ set(SCHEMA)}")
KINDS = ["gsm8k", "boxed", "format", "exact", "program"]


# ---- the peer: PyYAML's loader, keeping each scalar's text and whether PyYAML resolves it to null ----
class Raw(str):
    is_null = False


def construct_raw(loader, node):
    s = Raw(node.value)
    s.is_null = node.tag == "tag:yaml.org,2002:null"
    return s


class RawLoader(yaml.SafeLoader):  # pure Python (not CSafeLoader): independent of libyaml
    pass


for t in ("null", "bool", "int", "float", "str", "timestamp", "binary", "value"):
    RawLoader.add_constructor("tag:yaml.org,2002:" + t, construct_raw)

EMPTY_MAP = object()


def flatten(obj, prefix, out):
    """PyYAML's structure as dotted keys (merges already applied by the SafeConstructor)."""
    for k, v in obj.items():
        key = prefix + str(k)
        if isinstance(v, dict):
            if v:
                flatten(v, key + ".", out)
            else:
                out.append((key, EMPTY_MAP))
        else:
            out.append((key, v))
    return out


def pyyaml_entries(text):
    doc = yaml.load(text, Loader=RawLoader)
    if doc is None or (isinstance(doc, Raw) and doc.is_null):
        return []
    return flatten(doc, "", [])


def resolves_to_bool(text):
    """What PyYAML's own resolver makes of a plain scalar: the YAML 1.1 booleans."""
    try:
        v = yaml.load(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    return v if isinstance(v, bool) else None


INT_RE = re.compile(r"[-+]?[0-9]+")
FLOAT_RE = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?")


def typed(key, v):
    """The value a key takes from a parsed scalar or list; raises ValueError when the key refuses it."""
    k = SCHEMA[key]
    t = k["type"]
    if t == "map" and v is EMPTY_MAP:
        return {}
    if t == "map":  # a scalar: JSON text of an object
        m = json.loads(str(v)) if not isinstance(v, list) and not v.is_null else None
        if not isinstance(m, dict):
            raise ValueError("map")
        return m
    if v is EMPTY_MAP:
        raise ValueError("mapping")
    if isinstance(v, list):
        if t != "list" or any(x.is_null for x in v):
            raise ValueError("list")
        return [str(x) for x in v]
    if v.is_null:
        if t == "list":
            return []
        if not k["nullable"]:
            raise ValueError("null")
        return None
    if t == "list":
        return [str(v)]
    if t == "string":
        return str(v)
    if t == "bool":
        b = resolves_to_bool(str(v))
        if b is None:
            raise ValueError("bool")
        return b
    if t == "enum":
        aliases = dict(a.split("=") for a in k["aliases"].split("|") if a)
        if aliases.get(v, v) not in k["values"]:
            raise ValueError("enum")
        return aliases.get(v, str(v))
    if t == "int":
        if not INT_RE.fullmatch(v) or not k["min"] <= int(v) <= k["max"]:
            raise ValueError("int")
        return int(v)
    if not FLOAT_RE.fullmatch(v):
        raise ValueError("float")
    x = float(v)
    if not k["min"] <= x <= k["max"] or (k["min_open"] and x == k["min"]):
        raise ValueError("float range")
    return x


def map_key(key):
    """(map key, NAME) of "MAP.NAME" (verl's spelling too), (map key, None) of the map itself, else None."""
    for spelling, name in [*((m, m) for m in MAPS), *MAP_ALIASES.items()]:
        if key == spelling:
            return name, None
        if key.startswith(spelling + "."):
            sub = key[len(spelling) + 1:]
            if "." in sub:
                raise ValueError("map: NAME with a dot")
            return name, sub
    return None


def map_value(v):
    """A template variable from a YAML scalar: null, a boolean, a number (whole: an int), else the string."""
    if isinstance(v, list):
        return [map_value(x) for x in v]
    if v is EMPTY_MAP:
        raise ValueError("map value")
    if v.is_null:
        return None
    b = resolves_to_bool(str(v))
    if b is not None and str(v) in ("true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "false",
                                    "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"):
        return b
    if FLOAT_RE.fullmatch(str(v)):
        x = float(v)
        return int(x) if x.is_integer() and abs(x) < 1e15 else x
    return str(v)


def expected_config(file_text, overrides):
    """Defaults, then the file's keys, then the overrides', as the documented rules say."""
    cfg = dict(DEFAULTS)
    file_entries = pyyaml_entries(file_text) if file_text is not None else []
    over_entries = []
    for o in overrides:
        key, val = o.split("=", 1)
        v = yaml.load(val, Loader=RawLoader)
        if v == {}:
            v = EMPTY_MAP
        elif v is None:
            v = Raw("")
            v.is_null = True
        over_entries += flatten(v, key + ".", []) if isinstance(v, dict) and v else [(key, v)]
    named = {k for k in KINDS for key, _ in file_entries if key == f"reward.{k}" or key.startswith(f"reward.{k}.")}
    if named:
        for k in KINDS:
            cfg[f"reward.{k}.weight"] = 1.0 if k in named else 0.0
    for key, v in file_entries + over_entries:
        if key in [f"reward.{k}" for k in KINDS]:
            if v is EMPTY_MAP or (not isinstance(v, list) and v.is_null):
                cfg[key + ".weight"] = 1.0
            else:
                cfg[key + ".weight"] = typed(key + ".weight", v)
        elif map_key(key):
            name, sub = map_key(key)
            if sub is None:
                cfg[name] = typed(name, v)
            else:
                cfg[name] = {**cfg[name], sub: map_value(v)}
        elif key in SCHEMA:
            cfg[key] = typed(key, v)
        elif any(s.startswith(key + ".") for s in SCHEMA) and (v is EMPTY_MAP or v.is_null):
            pass  # an empty section
        else:
            raise KeyError(key)
    return cfg


def write(name, text):
    path = os.path.join(args.tmp, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def same(a, b):
    if set(a) != set(b):
        return f"keys differ: {set(a) ^ set(b)}"
    diff = [f"{k}: tool {a[k]!r} != peer {b[k]!r}" for k in a if a[k] != b[k] or type(a[k]) is not type(b[k])]
    return "; ".join(diff)


def check_valid(name, text, overrides=()):
    argv = []
    if text is not None:
        argv = ["--config", write(name + ".yaml", text)]
    r = run(*argv, *overrides)
    if r.returncode != 0:
        check(False, name, r.stderr.strip())
        return None
    got = flat_json(json.loads(r.stdout))
    want = expected_config(text, overrides)
    d = same(got, want)
    check(not d, name, d)
    return got


# ---- valid files ----
check_valid("block_nested_comments", """\
# GSM8K with Qwen2.5-0.5B-Instruct
data:
  train_file: data/gsm8k/train.jsonl   # a comment after a value
  val_file: "data/gsm8k/test.jsonl"
  prompt_key: question
  answer_key: 'answer'
  train_batch_size: 16
  max_response_length: 512
model:
  path: /models/Qwen2.5-0.5B-Instruct
  ref_dtype: bf16
rollout:
  n: 4
  temperature: 0.7
  top_p: 0.95
  top_k: 50
actor:
  # optimiser
  lr: 1e-6
  weight_decay: 0.0
  clip_ratio_high: 0.28
  loss_agg_mode: seq-mean-token-sum-norm
  mini_batch_size: 8
  micro_batch_size: 4
trainer:
  steps: 200
  out_dir: runs/gsm8k-0.5b
""")

check_valid("flow_style", """{data: {train_batch_size: 4, shuffle: false}, actor: {lr: 3.0e-6, kl_loss_type: k2,
  mini_batch_size: 2}, rollout: {stop: ["</answer>", '\\n', "\\n\\n"], n: 16}}
""")

check_valid("dotted_keys_in_yaml", """\
actor.lr: 2e-6
actor.clip_ratio_c: 3
trainer: {seed: 42, save_every: 10}
reward.gsm8k.method: flexible
reward.format.dotall: no
""")

check_valid("yaml11_booleans", """\
data:
  chat_template: no
  shuffle: Off
algorithm:
  norm_adv_by_std: NO
  dynamic_sampling: yes
  mask_truncated: On
actor:
  use_kl_loss: False
  recompute: TRUE
  offload_optimizer: "true"
trainer:
  resume: 'Yes'
  val_before_train: off
  dump_samples: ON
""")

check_valid("number_spellings", """\
actor:
  lr: 1E-6
  weight_decay: .5
  grad_clip: 5.
  beta1: +0.5
  beta2: 0.99e0
  adam_eps: 1.0e-08
  entropy_coeff: 1e+2
  clip_ratio_low: 0
  loss_scale: 65536
  lr_warmup_steps: +3
  ppo_epochs: 007
rollout:
  temperature: -0.0
reward:
  gsm8k: {weight: -1.5, format_score: 0.1}
""")

check_valid("verl_kl_names", "actor: {kl_loss_type: low_var_kl}\nalgorithm: {kl_penalty: mse}\n")
check_valid("verl_kl_names_override", None, ["actor.kl_loss_type=kl", "algorithm.kl_penalty=low_var_kl"])

check_valid("lists", """\
rollout:
  stop:
    - "</answer>"
    - '#### '
    - plain text with spaces
""")
check_valid("list_single_string", "rollout:\n  stop: </answer>\n")
check_valid("list_null_and_empty", "rollout: {stop: ~}\n")
check_valid("list_empty_flow", "rollout: {stop: []}\n")

check_valid("nulls", """\
data:
  train_file: ~
  val_file: null
  val_max_samples:
  prompt_key: "null"
model:
  path: NULL
actor:
  mini_batch_size: Null
trainer:
  steps: ~
""")

check_valid("quoted_strings", r"""data:
  prompt_key: "tab\there \u00e9 \"quoted\""
  answer_key: 'it''s # not a comment'
model:
  path: "/path with spaces/é/模型"
trainer:
  out_dir: 'C:\runs\x'
reward:
  format:
    regex: '^<think>.*?</think>\s*<answer>(\d+)</answer>$'
""")

check_valid("multiline_strings", """\
reward:
  program:
    weight: 1
    command: >
      python3 score.py
      --strict
    timeout_s: 2.5
  format:
    regex: |
      ^<think>
      .*</think>$
data:
  prompt_key: a plain
    scalar over lines
""")

check_valid("anchors_aliases_merge", """\
actor:
  lr: &lr 2e-6
  kl_loss_coef: *lr
reward:
  gsm8k: &g {weight: 0.5, format_score: 0.1}
  boxed:
    <<: *g
    weight: 0.25
algorithm:
  kl_coef: *lr
""")

check_valid("merge_list_earlier_wins", """\
reward:
  boxed: &b {weight: 0.5, format_score: 0.25}
  gsm8k:
    <<: [*b, {weight: 3.0, method: flexible, clip_chars: 300}]
    format_score: 0.125
""")

check_valid("reward_kinds_replace_default", """\
reward:
  boxed:
  format: {}
  exact: 0.5
""")
check_valid("reward_options_only_still_name_the_kind", "reward:\n  format:\n    regex: '<answer>'\n")
check_valid("reward_program", "reward:\n  program: {command: ./score.sh, weight: 2}\n  gsm8k: 1\n")
check_valid("empty_sections", "actor:\n  # lr: 1e-6\ndata: {}\nreward:\n")
check_valid("empty_file", "")
check_valid("only_comments", "# nothing set\n\n# at all\n")
check_valid("document_markers", "---\nactor: {lr: 5e-7}\n...\n")
check_valid("tilde_document", "~\n")

# ---- overrides ----
check_valid("overrides_alone", None, ["actor.lr=2e-6", "rollout.n=4", "data.chat_template=false",
                                       "model.path=/m/Qwen2.5-1.5B-Instruct", "trainer.steps=~"])
check_valid("overrides_over_file", "actor: {lr: 1e-6, ppo_epochs: 2}\nreward: {boxed: }\n",
            ["actor.lr=5e-6", "reward.gsm8k.weight=0.5", "actor.lr=7e-6"])
check_valid("override_values_are_yaml", None, [
    'rollout.stop=["</answer>", "\\n\\n"]', "reward.format={weight: 0.2, regex: 'a|b'}",
    "data.prompt_key='quoted: with colon'", "data.val_file=", "reward.boxed=", "trainer.out_dir=runs/x=y",
    "actor.precision=bf16", "trainer.resume=yes"])
check_valid("override_list_scalar", None, ["rollout.stop=</answer>"])
check_valid("override_section_empty", None, ["actor={}", "actor.lr=3e-6"])
check_valid("chat_template_kwargs", "data:\n  chat_template_kwargs:\n    enable_thinking: false\n    name: x\n",
            ["data.apply_chat_template_kwargs.add_vision_id=yes", "data.chat_template_kwargs.depth=3",
             "data.chat_template_kwargs.name=null"])
check_valid("chat_template_kwargs_json", None, ['data.chat_template_kwargs={"a": [1, "x", true], "b": "c"}'])


# ---- every key at once, written by PyYAML's emitter (block, flow and as overrides) ----
def random_value(k, rng):
    t = k["type"]
    if t == "int":
        lo, hi = k["min"], min(k["max"], k["min"] + 1000)
        return rng.randint(lo, hi)
    if t == "float":
        lo, hi = max(k["min"], -1e3), min(k["max"], k["min"] + 10.0, 1e3)
        return rng.uniform(lo if not k["min_open"] else lo + (hi - lo) * 1e-3, hi)
    if t == "bool":
        return rng.random() < 0.5
    if t == "enum":
        return rng.choice(k["values"])
    if t == "map":
        return {"enable_thinking": rng.random() < 0.5, "depth": rng.randint(0, 9)}
    words = ["x", "yes", "1e3", "a: b", "#c", " lead", "trail ", "é", "\"q\"", "it's", "[br]", "{c}", "*", "-", "null"]
    if t == "string":
        return "".join(rng.choice(words) for _ in range(rng.randint(1, 4)))
    return ["".join(rng.choice(words) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(0, 3))]


def nest(flat):
    out = {}
    for key, v in flat.items():
        d = out
        parts = key.split(".")
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = v
    return out


rng = random.Random(6)
for trial in range(6):
    vals = {name: random_value(k, rng) for name, k in SCHEMA.items()}
    # Keys that must agree with each other (checked by the loader).
    vals.update({"data.train_batch_size": 8, "actor.mini_batch_size": 4, "rollout.n": 4,
                 "actor.micro_batch_size": rng.choice([1, 2, 4, 8, 16]), "actor.clip_ratio_c": rng.choice([0.0, 3.0]),
                 "data.max_response_length": 300, "reward.overlong_buffer.len": rng.randint(0, 299),
                 "reward.gsm8k.weight": 1.0})
    if vals["actor.use_kl_loss"]:
        vals["algorithm.use_kl_in_reward"] = False
    vals["data.gen_batch_size"] = rng.choice([None, 8, 12])  # a multiple of the mini-batch; more: dynamic sampling
    if vals["data.gen_batch_size"] not in (None, 8):
        vals["algorithm.dynamic_sampling"] = True
    if vals["algorithm.filter_groups.metric"] == "seq_final_reward" or \
            vals["algorithm.adv_estimator"] == "reinforce_plus_plus":
        vals["algorithm.use_kl_in_reward"] = False
    if vals["actor.clip_ratio_c"]:
        vals["actor.policy_loss.loss_mode"] = "vanilla"  # the dual clip is vanilla's
    vals["rollout.val_kwargs.temperature"] = max(vals["rollout.val_kwargs.temperature"], 0.5)
    if None not in (vals["data.min_pixels"], vals["data.max_pixels"]) and vals["data.min_pixels"] > vals["data.max_pixels"]:
        vals["data.min_pixels"], vals["data.max_pixels"] = vals["data.max_pixels"], vals["data.min_pixels"]
    vals["actor.lora.dropout"] = 0.0  # the only value the loader accepts
    lb, ub = "actor.policy_loss.clip_cov_lb", "actor.policy_loss.clip_cov_ub"
    if vals[lb] >= vals[ub]:  # clip_cov's window: lower below upper
        vals[lb], vals[ub] = min(vals[lb], vals[ub]), max(vals[lb], vals[ub]) + abs(vals[ub]) + 1.0
    # rejection sampling's options and bounds are parsed (verl's names and forms): a pair the loader accepts
    vals["algorithm.rollout_correction.rollout_rs"], vals["algorithm.rollout_correction.rollout_rs_threshold"] = \
        rng.choice([(None, None), ("token_k1", "0.5_2"), ("seq_mean_k3, token_k2", "0.01"),
                    ("seq_max_k2,seq_sum_k1,seq_max_k2", "0.1, 0.2_2.5")])
    vals["actor.lora.target_modules"] = rng.choice([[], ["q_proj", "v_proj"], ["all-linear"], ["down", "up"]])
    if vals["actor.lora.rank"] > 0 or vals["model.adapter"] is not None:
        vals["actor.precision"] = "fp32"  # LoRA trains fp32 adapters
        vals["actor.vision.train_merger"] = False  # a trained merger is full fine-tuning
    if vals["reward.program.weight"] != 0 and vals["reward.program.command"] is None:
        vals["reward.program.command"] = "./score"
    for style in ("block", "flow", "overrides"):
        name = f"emitted_{style}_{trial}"
        if style == "overrides":
            ovs = [f"{k}={yaml.safe_dump(v, default_flow_style=True, width=1 << 30).strip()}" for k, v in vals.items()]
            ovs = [o[:-4] if o.endswith("\n...") else o for o in ovs]
            r = run(*ovs)
        else:
            text = yaml.safe_dump(nest(vals), default_flow_style=(style == "flow"), allow_unicode=trial % 2 == 0)
            r = run("--config", write(name + ".yaml", text))
        if r.returncode != 0:
            check(False, name, r.stderr.strip())
            continue
        got = flat_json(json.loads(r.stdout))
        d = same(got, {k: (float(v) if SCHEMA[k]["type"] == "float" else v) for k, v in vals.items()})
        check(not d, name, d)

# The resolved JSON reads back as a config file (JSON is YAML) to the same configuration.
r1 = run("actor.lr=2e-6", "rollout.stop=[\"a\\tb\", 'é']", "reward.program={weight: 1, command: \"sh -c 'x'\"}")
path = write("roundtrip.json", r1.stdout)
r2 = run("--config", path)
check(r1.returncode == 0 and r2.stdout == r1.stdout, "json_reads_back_as_config", r1.stderr + r2.stderr)


# ---- bad inputs: exit 1, one "grpo: error:" line naming the place and the key ----
def key_line(text, dotted):
    """1-based line of a dotted key's last part, from PyYAML's composed node marks."""
    node, rest, line = yaml.compose(text), dotted, None
    while rest and isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if rest == k.value or rest.startswith(k.value + "."):
                rest, node, line = rest[len(k.value) + 1:], v, k.start_mark.line + 1
                break
        else:
            break
    return line


def check_error(name, text, overrides, *needles):
    argv = ["--config", write(name + ".yaml", text)] if text is not None else []
    r = run(*argv, *overrides)
    lines = r.stderr.strip().splitlines()
    ok = r.returncode == 1 and len(lines) == 1 and lines[0].startswith("grpo: error: ") and r.stdout == ""
    missing = [n for n in needles if n not in r.stderr]
    check(ok and not missing, name, f"rc={r.returncode} stderr={r.stderr.strip()!r} missing={missing}")


def suggestion(bad_key, as_override=False):
    """(exit code, the key named by "did you mean", the error) for an unknown key in a file or an override."""
    if as_override:
        r = run(bad_key + "=1")
    else:
        text = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(bad_key.split(".")[:-1]))
        text = "# a config\n\n" + text + "  " * (bad_key.count(".")) + bad_key.split(".")[-1] + ": 1\n"
        r = run("--config", write(f"unknown_{bad_key}.yaml", text))
        if f"unknown_{bad_key}.yaml:{key_line(text, bad_key)}:" not in r.stderr:
            return r.returncode, "(no file:line)", r.stderr.strip()
    m = re.search(r'unknown key "([^"]+)" \(did you mean "([^"]+)"\?\)', r.stderr)
    return r.returncode, m.group(2) if m and m.group(1) == bad_key else None, r.stderr.strip()


# Typos, verl's long names, another section's key, words of the last part, the issue's examples (verl and
# TRL names; the README's mapping table is checked row by row below), and a name like no key at all.
for bad_key, want in [("actor.lr_rate", "actor.lr"), ("data.train_files", "data.train_file"),
                      ("rollout.temprature", "rollout.temperature"),
                      ("actor_rollout_ref.actor.optim.lr", "actor.lr"),
                      ("actor_rollout_ref.rollout.n", "rollout.n"), ("rollout.lr", "actor.lr"),
                      ("reward.gsm8k.wieght", "reward.gsm8k.weight"), ("actor.learning_rate", "actor.lr"),
                      ("trainer.total_training_steps", "trainer.steps"),
                      ("rollout.max_tokens", "data.max_response_length"), ("rollout.num_generations", "rollout.n"),
                      ("actor.beta", "actor.kl_loss_coef"), ("trainer.output_dir", "trainer.out_dir"),
                      ("trainer.overwrite_output_dir", "trainer.overwrite"), ("foo.bar", None)]:
    rc, got, err = suggestion(bad_key)
    tail = "README.md's configuration table lists every key" in err if want is None else True
    check(rc == 1 and got == want and tail, f"unknown_key {bad_key} -> {want}", err)

# Every verl name in the README's "For verl users" table suggests the key it maps to (braces expanded).
readme = open(args.doc).read()
table = readme[readme.index("#### For verl users"):readme.index("#### Every key")]
def expand(t):
    """"actor.{a,b}" -> ["actor.a", "actor.b"]."""
    if "{" not in t:
        return [t]
    head, rest = t.split("{", 1)
    inner, tail = rest.split("}", 1)
    return [head + x + tail for x in inner.split(",")]


rows = 0
for line in table.splitlines():
    if not line.startswith("| `"):
        continue
    left, right = ([n for c in re.findall(r"`([^`]+)`", cell) if "." in c for n in expand(c)]
                   for cell in line.split("|")[1:3])
    if len(right) == 1 and right[0].endswith("."):  # "`actor.` the same"
        right = [right[0] + v.rsplit(".", 1)[1] for v in left]
    check(len(left) == len(right), f"README verl row pairs its names: {line[:80]}", (left, right))
    for v, o in zip(left, right):
        if v in SCHEMA:
            continue
        rows += 1
        rc, got, err = suggestion(v, as_override=True)
        check(rc == 1 and got == o, f"README verl row: {v} -> {o}", err)
check(rows >= 20, "the README's verl table gave the rows checked above", rows)
r = run("actor.lr_rate=1")
check(r.returncode == 1 and 'override "actor.lr_rate=1": unknown key "actor.lr_rate" (did you mean "actor.lr"?)' in r.stderr,
      "unknown_key_in_override", r.stderr.strip())

# Malformed YAML: the line and column are where PyYAML's own parser stops too.
for name, text in [("unclosed_flow", "actor:\n  lr: [1\n"), ("bad_indent", "actor:\n  lr: 1\n bad: 2\n"),
                   ("unterminated_quote", 'data:\n  prompt_key: "abc\n'), ("tab_indent", "rollout:\n\tn: 4\n"),
                   ("mapping_in_plain", "actor: lr: 1\n"), ("undefined_alias", "actor: {lr: *nope}\n"),
                   ("bad_token", "actor: {lr: @x}\n"), ("flow_mapping_colon", "actor: {lr: 1\nppo_epochs: 2\n")]:
    try:
        yaml.load(text, Loader=yaml.SafeLoader)
        check(False, f"malformed_{name}", "PyYAML accepts it")
        continue
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
    check_error(f"malformed_{name}", text, [], f"malformed_{name}.yaml:{mark.line + 1}:{mark.column + 1}: ")
bad_utf8 = os.path.join(args.tmp, "bad_utf8.yaml")
with open(bad_utf8, "wb") as f:
    f.write(b"actor:\n  lr: \xff\n")
r = run("--config", bad_utf8)
check(r.returncode == 1 and f"{bad_utf8}:2:7: invalid leading UTF-8 octet" in r.stderr, "malformed_utf8", r.stderr.strip())

types_and_ranges = [
    ("int_not_integer", "actor:\n  ppo_epochs: 1.5\n", "actor.ppo_epochs", "an integer >= 1"),
    ("int_text", "data:\n  train_batch_size: eight\n", "data.train_batch_size", "an integer >= 1"),
    ("int_hex", "trainer: {seed: 0x10}\n", "trainer.seed", "an integer >= 0"),
    ("float_text", "actor:\n  lr: fast\n", "actor.lr", "a number in [0, 1000]"),
    ("float_inf", "actor:\n  lr: .inf\n", "actor.lr", "a number"),
    ("bool_text", "data:\n  shuffle: maybe\n", "data.shuffle", "true or false"),
    ("bool_number", "data:\n  shuffle: 1\n", "data.shuffle", "true or false"),
    ("enum_value", "actor:\n  loss_agg_mode: token_mean\n", "actor.loss_agg_mode",
     "one of token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"),
    ("enum_case", "actor:\n  kl_loss_type: K3\n", "actor.kl_loss_type", "one of k1, k2, k3 (or kl, mse, low_var_kl)"),
    ("list_for_scalar", "actor:\n  lr: [1, 2]\n", "actor.lr", "got a list"),
    ("mapping_for_scalar", "actor:\n  lr: {a: 1}\n", "actor.lr.a", "unknown key"),
    ("empty_mapping_for_scalar", "actor:\n  lr: {}\n", "actor.lr", "got a mapping"),
    ("null_not_allowed", "data:\n  prompt_key: ~\n", "data.prompt_key", "got null"),
    ("null_in_list", "rollout:\n  stop: [a, ~]\n", "rollout.stop", "a list of strings"),
    ("list_of_mappings", "rollout:\n  stop: [{a: 1}]\n", "rollout.stop", "only plain values"),
    ("range_n", "rollout:\n  n: 1\n", "rollout.n", "an integer >= 2"),
    ("range_clip", "actor:\n  clip_ratio_low: 1.5\n", "actor.clip_ratio_low", "a number in [0, 1]"),
    ("range_top_p_open", "rollout:\n  top_p: 0\n", "rollout.top_p", "a number in (0, 1]"),
    ("range_negative_lr", "actor:\n  lr: -1e-6\n", "actor.lr", "[0, 1000]"),
    ("range_int64", "trainer:\n  seed: 99999999999999999999\n", "trainer.seed", "an integer >= 0"),
    ("reward_weight_list", "reward:\n  boxed: [1]\n", "reward.boxed.weight", "a number"),
    ("section_as_value", "actor: 5\n", "actor", '"actor" is a section (of keys such as "actor.ppo_epochs")'),
]
for name, text, key, want in types_and_ranges:
    check_error(name, text, [], f"{name}.yaml:{key_line(text, key)}: ", key, want)

check_error("duplicate_key", "actor:\n  lr: 1e-6\n  beta1: 0.9\n  lr: 2e-6\n", [],
            "duplicate_key.yaml:4: ", '"actor.lr"', "line 2")
check_error("duplicate_section", "actor:\n  lr: 1e-6\ndata: {}\nactor:\n  beta1: 0.5\n", [],
            "duplicate_section.yaml:4: ", '"actor"', "line 1")
check_error("duplicate_dotted", "actor: {lr: 1e-6}\nactor.lr: 2e-6\n", [], "duplicate_dotted.yaml:2: ", '"actor.lr"', "line 1")
check_error("second_document", "actor: {lr: 1e-6}\n---\nactor: {lr: 2e-6}\n", [], "second_document.yaml:3: ")
check_error("top_level_list", "- actor\n- data\n", [], "top_level_list.yaml:1: ", "mapping")
check_error("recursive_alias", "actor: &a {lr: 1, x: *a}\n", [], "recursive_alias.yaml:1: ")
bomb = "a0: &a0 {" + ", ".join(f"k{i}: 1" for i in range(10)) + "}\n"
for lvl in range(1, 7):
    bomb += f"a{lvl}: &a{lvl} {{" + ", ".join(f"k{i}: *a{lvl - 1}" for i in range(10)) + "}\n"
check_error("alias_bomb", bomb, [], "alias_bomb.yaml:", "more than 10000 keys")
check_error("nul_byte", 'data:\n  prompt_key: "a\\0b"\n', [], "nul_byte.yaml:2: ", "NUL byte")
check_error("too_deep", "a: " + "{b: " * 100 + "1" + "}" * 100 + "\n", [], "too_deep.yaml:1: ", "nesting deeper")
r = run("--config", os.path.join(args.tmp, "no_such_dir", "missing.yaml"))
check(r.returncode == 1 and r.stderr.count("\n") == 1 and "missing.yaml" in r.stderr, "missing_file", r.stderr.strip())

check_error("override_without_equals", None, ["actor.lr"], 'override "actor.lr": expected dotted.key=value')
check_error("override_empty_key", None, ["=3"], 'override "=3"')
check_error("override_malformed", None, ["rollout.stop=[a, b"], 'override "rollout.stop=[a, b"', "column")
check_error("override_block_mapping", None, ["data.prompt_key=a: b"], 'override "data.prompt_key=a: b"', "quote it")
check_error("override_type", None, ["rollout.n=four"], 'override "rollout.n=four"', "rollout.n", "an integer >= 2")
check_error("override_after_good_file", "actor: {lr: 1e-6}\n", ["actor.precision=fp64"],
            'override "actor.precision=fp64"', "one of fp32, bf16, fp16")

conflicts = [
    ("mini_batch_divides", "data: {train_batch_size: 8}\nactor:\n  mini_batch_size: 3\n", [],
     "conflict_mini_batch_divides.yaml:3: ", "actor.mini_batch_size 3 does not divide data.train_batch_size 8"),
    ("micro_batch_divides", None, ["rollout.n=3", "actor.micro_batch_size=5"], "actor.micro_batch_size 5", "24"),
    ("both_kl", "algorithm:\n  use_kl_in_reward: true\n", [], "conflict_both_kl.yaml:2: ", "choose one"),
    ("dual_clip", None, ["actor.clip_ratio_c=0.5"], 'override "actor.clip_ratio_c=0.5"', "above 1"),
    ("overlong_len", None, ["reward.overlong_buffer.len=256"], "data.max_response_length 256"),
    ("program_without_command", "reward:\n  program: {weight: 1}\n", [], "reward.program.command is null"),
    ("no_reward", None, ["reward.gsm8k.weight=0"], "every reward weight is 0"),
    ("lora_precision", "actor:\n  precision: bf16\n  lora: {rank: 8}\n", [], "conflict_lora_precision.yaml:2: ",
     "actor.precision must be fp32 with LoRA"),
    ("lora_dropout", None, ["actor.lora.rank=8", "actor.lora.dropout=0.05"], 'override "actor.lora.dropout=0.05"',
     "only 0 is supported"),
    ("lora_target", None, ["actor.lora.target_modules=[q_proj, lm_head]"], "actor.lora.target_modules",
     'unknown module "lm_head"'),
    ("dual_clip_of_gspo", None, ["actor.policy_loss.loss_mode=gspo", "actor.clip_ratio_c=3"], "actor.clip_ratio_c",
     "not of actor.policy_loss.loss_mode gspo"),
    ("gen_batch_without_dynamic_sampling", None, ["data.gen_batch_size=16"], "data.gen_batch_size 16",
     "without algorithm.dynamic_sampling"),
    ("gen_batch_not_whole_mini_batches", None, ["data.gen_batch_size=10", "algorithm.dynamic_sampling=true",
                                                 "actor.mini_batch_size=4"], "not a multiple of the mini-batch (4"),
    ("reinforce_plus_plus_with_kl_in_reward", None, ["algorithm.adv_estimator=reinforce_plus_plus",
                                                     "actor.use_kl_loss=false", "algorithm.use_kl_in_reward=true"],
     "per-token returns-to-go of the KL rewards are not implemented"),
    ("rollout_rs_unknown_option", None, ["algorithm.rollout_correction.rollout_rs=token_k1,token_k4",
                                          "algorithm.rollout_correction.rollout_rs_threshold=2"],
     "algorithm.rollout_correction.rollout_rs", 'unknown option "token_k4"'),
    ("rollout_rs_without_threshold", None, ["algorithm.rollout_correction.rollout_rs=seq_mean_k3"],
     'override "algorithm.rollout_correction.rollout_rs=seq_mean_k3"', "needs algorithm.rollout_correction."),
    ("rollout_rs_k2_with_lower", None, ["algorithm.rollout_correction.rollout_rs=token_k2",
                                        "algorithm.rollout_correction.rollout_rs_threshold=0.5_2"],
     "token_k2 takes one upper bound"),
    ("rollout_rs_thresholds_count", None, ["algorithm.rollout_correction.rollout_rs=token_k1,seq_max_k3",
                                           "algorithm.rollout_correction.rollout_rs_threshold=2,3,4"],
     "one per option (2), not 3"),
    ("rollout_rs_k1_bounds", None, ["algorithm.rollout_correction.rollout_rs=seq_sum_k1",
                                    "algorithm.rollout_correction.rollout_rs_threshold=3_2"],
     "lower bound 3 above upper bound 2"),
    ("clip_cov_window", None, ["actor.policy_loss.loss_mode=clip_cov", "actor.policy_loss.clip_cov_lb=2",
                               "actor.policy_loss.clip_cov_ub=2"],
     "actor.policy_loss.clip_cov_lb (2) must be below actor.policy_loss.clip_cov_ub (2)"),
    ("seq_final_reward_with_kl_in_reward", None, ["algorithm.dynamic_sampling=true", "actor.use_kl_loss=false",
                                                   "algorithm.use_kl_in_reward=true",
                                                   "algorithm.filter_groups.metric=seq_final_reward"],
     "seq_final_reward with algorithm.use_kl_in_reward"),
]
# A hostile-input run: merge keys fanning out over 10 levels took 28 s (YAML's "billion laughs"), and
# 100,000 "[" took 21 s inside libyaml before any depth limit applied.
BOMB = "m0: &m0 {a: 1}\n" + "".join(f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 10)}]}}\n" for i in range(1, 11))
conflicts += [
    ("yaml_merge_bomb", BOMB, [], "YAML bomb"),
    ("yaml_deep_flow", "actor: " + "[" * 100000 + "\n", [], "conflict_yaml_deep_flow.yaml:1: ",
     "nesting deeper than 64"),
    ("yaml_deep_flow_override", None, ["actor.lr=" + "[" * 100000], 'override "actor.lr=[[[', '[[[..."',
     "nesting deeper than 64"),
]
for name, text, ovs, *needles in conflicts:
    check_error("conflict_" + name, text, ovs, *needles)

# ---- config_tool --yaml (what `grpo train` writes as OUT/config.yaml) reads back to the same config ----
# PyYAML must read it to the values of the JSON print, and --config must resolve it to the same JSON,
# byte for byte, for strings that need quoting (YAML indicators, words YAML 1.1 types, controls, the
# characters YAML folds or forbids, non-ASCII) and floats that YAML 1.1 would read as strings.
HOSTILE = ["a: b", "# not a comment", "x #y", "  leading and trailing  ", "true", "False", "null", "~", "123",
           "-7", "1e-6", "0x10", "yes", "off", "2001-12-14", ".inf", "ünïcödé ✓ 中文 😀", "line1\nline2\ttab\r",
           'quote " and back\\slash', "'single'", "- dash", "[x, y]", "{a: 1}", "&anchor *alias !tag %x @y `z`",
           "|a", ">b", "?c", "", " ", ":", "-", "key:value", "end\\",
           "\x01\x1f\x7f\x80\x85\x9f\xa0\u2028\u2029\ufeff\ufffe\uffff\U0010ffff"]


def yaml_quote(t):
    """A YAML double-quoted scalar with every character outside printable ASCII escaped."""
    out = []
    for ch in t:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= o < 0x7f:
            out.append(ch)
        elif o <= 0xffff:
            out.append("\\u%04x" % o)
        else:
            out.append("\\U%08x" % o)
    return '"' + "".join(out) + '"'


def check_yaml_print(name, text, overrides=()):
    src = write("yamlprint_" + name, text) if text is not None else None
    pre = ["--config", src] if src else []
    j = run(*pre, *overrides)
    y = run("--yaml", *pre, *overrides)
    if j.returncode or y.returncode:
        check(False, "yaml_print_" + name, j.stderr + y.stderr)
        return
    want = json.loads(j.stdout)
    try:
        got = yaml.load(y.stdout, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        check(False, "yaml_print_" + name + "_pyyaml", e)
        return
    fg = flat_json(got)
    check(got == want, "yaml_print_" + name + "_pyyaml_equals_json",
          [(k, v, fg.get(k)) for k, v in flat_json(want).items() if fg.get(k) != v][:5])
    leaves = [l for l in y.stdout.splitlines() if not l.endswith(":")]
    indent_ok = all(re.fullmatch(r"(  )*[a-z_0-9]+: \S.*|(  )*[a-z_0-9]+:", l) for l in y.stdout.splitlines())
    check(len(leaves) == len(SCHEMA) and set(flat_json(got)) == set(SCHEMA) and indent_ok and y.stdout.endswith("\n"),
          "yaml_print_" + name + "_block_style_one_key_a_line", (len(leaves), len(SCHEMA), y.stdout[:300]))
    back = run("--config", write("yamlprint_" + name + "_out", y.stdout))
    check(back.returncode == 0 and back.stdout == j.stdout, "yaml_print_" + name + "_reads_back_with_config",
          (back.stderr.strip(), back.stdout[:200], j.stdout[:200]))


check_yaml_print("defaults", None)
check_yaml_print("hostile_strings", "data:\n  prompt_key: %s\n  answer_key: %s\n  train_file: %s\n  val_file: %s\n"
                 "model:\n  path: %s\n  adapter: %s\ntrainer:\n  out_dir: %s\nrollout:\n  stop: [%s]\n"
                 "reward:\n  program: {command: %s}\n" % (
                     yaml_quote(HOSTILE[16]), yaml_quote(HOSTILE[-1]), yaml_quote(HOSTILE[0]), yaml_quote("null"),
                     yaml_quote(HOSTILE[3]), yaml_quote(HOSTILE[17]), yaml_quote("123"),
                     ", ".join(yaml_quote(t) for t in HOSTILE), yaml_quote(HOSTILE[1])))
check_yaml_print("floats_and_enums", None, ["actor.lr=1e-6", "actor.weight_decay=2.5e-07", "actor.adam_eps=1e-30",
                                            "reward.program.memory_mb=1e9", "actor.kl_loss_type=low_var_kl",
                                            "trainer.seed=9007199254740993", "data.val_max_samples=3"])

# ---- README.md: the table between the markers is config_tool --markdown, byte for byte ----
with open(args.doc, encoding="utf-8") as f:
    doc = f.read()
m = re.search(r"<!-- config-table:begin -->\n(.*?)<!-- config-table:end -->", doc, re.S)
table = run("--markdown").stdout
check(m is not None and m.group(1) == table, "doc_table_matches_the_code",
      f"regenerate: {args.tool} --markdown, between the config-table markers of {args.doc}")
documented = set(re.findall(r"^\| `([^`]+)` \|", table, re.M))
check(documented == set(SCHEMA), "every_key_documented", str(set(SCHEMA) ^ documented))

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

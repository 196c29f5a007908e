#!/usr/bin/python3
"""The vision-language demo of `grpo train --demo-vl` (src/cli/demo_vl.c), run in its shortened "smoke" form.

usage: /usr/bin/python3 tests/train/demo_vl_test.py --grpo PATH --tmp DIR [--full]

`grpo train --demo-vl-smoke` runs the demo's pipeline (a tiny random Qwen2.5-VL, images of red and blue squares,
SFT warm-up from a careless teacher that counts the blue squares too in 60% of its answers, GRPO with the vision
tower frozen, held-out evaluation) with fewer SFT and GRPO steps. Checks:
  data       every image (read by Pillow) is 56 x 56 RGB; each answer is the number of red squares counted in
             its pixels here (the SFT completions: that or all squares); no held-out image is a training one
  frozen     the trained model's vision tower equals the initial one, tensor for tensor
  learning   the summary lines agree with demo_result.json; held-out accuracy after GRPO beats the SFT warm-up
             (smoke: by >= 10 points)
  peer       the reported accuracies are reproduced by greedy decoding with the float64 reference (the tower of
             tests/model/vision_test.py and its M-RoPE language model) on the saved models, within one image
--full also runs the full demo and checks the issue's goal: >= +20 points in <= 10 minutes.
Prints one line per check and finally `N passed, M failed`; exit 0 iff all pass.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import torch
from PIL import Image

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("reference", "io", "model"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))
import harness  # noqa: E402
import image_test  # noqa: E402
import qwen2_ref as ref  # noqa: E402
import vision_test  # noqa: E402
from harness import check  # noqa: E402

GRPO = TMP = None
VL_TEXT = "<|vision_start|><|image_pad|><|vision_end|>"


def run_demo(workdir, flag, timeout):
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    p = subprocess.run([GRPO, "train", flag], cwd=workdir, capture_output=True, text=True, timeout=timeout)
    if p.returncode:
        raise AssertionError(f"grpo train {flag} exited {p.returncode}: {p.stderr[-800:]}")
    return os.path.join(workdir, "runs", "demo-vl"), p.stderr


def rows(path):
    return [json.loads(x) for x in open(path)]


def counts(path):
    """Red and blue squares in the image's pixels: a quadrant holds one square at most."""
    a = np.array(Image.open(path).convert("RGB")).astype(int)
    red = blue = 0
    for qy in (0, 28):
        for qx in (0, 28):
            q = a[qy:qy + 28, qx:qx + 28]
            red += bool(((q[..., 0] >= 190) & (q[..., 1] <= 60) & (q[..., 2] <= 60)).any())
            blue += bool(((q[..., 2] >= 190) & (q[..., 0] <= 60) & (q[..., 1] <= 60)).any())
    return red, blue


def check_data(d):
    data = os.path.join(d, "data")
    val, train, sft = (rows(os.path.join(data, f"{k}.jsonl")) for k in ("val", "train", "sft"))
    sizes, wrong, careless, hashes = set(), 0, 0, {}
    for split, rs in (("val", val), ("train", train), ("sft", sft)):
        hashes[split] = set()
        for r in rs:
            path = os.path.join(data, r["images"][0])
            im = Image.open(path)
            sizes.add((im.size, im.mode))
            hashes[split].add(hashlib.sha256(im.tobytes()).hexdigest())
            red, blue = counts(path)
            got = int(r["answer" if split != "sft" else "completion"])
            if split == "sft":
                careless += got != red and got == red + blue
                wrong += got not in (red, red + blue)
            else:
                wrong += got != red
    check("data: every image is 56 x 56 RGB", sizes == {((56, 56), "RGB")}, str(sizes))
    check(f"data: answers are the red squares counted in the pixels here ({len(val)} val, {len(train)} train); "
          f"SFT completions that or all squares", wrong == 0, f"{wrong} wrong")
    check("data: the careless teacher counted the blue squares too in some demonstrations",
          careless > len(sft) // 5, f"{careless} of {len(sft)}")
    check("data: no held-out image is a training or SFT image",
          not hashes["val"] & (hashes["train"] | hashes["sft"]))
    return val


def reference_accuracy(model, val, data):
    """Greedy pass@1 of the saved model by the float64 reference: features of the reference tower, M-RoPE."""
    cfg = json.load(open(os.path.join(model, "config.json")))
    m = ref.load_model(model)
    m.pad = cfg["image_token_id"]
    raw = ref.load_weights(model)
    vis = {k[len("visual."):]: t.double() for k, t in raw.items() if k.startswith("visual.")}
    vc = cfg["vision_config"]
    text = val[0]["prompt"].replace("<image>", VL_TEXT)
    ids = [int(x) for x in subprocess.run([GRPO, "tokenize", "--tokenizer", model], input=text, capture_output=True,
                                          text=True, timeout=60).stdout.split()]
    eos = cfg["eos_token_id"]
    outs = []
    with torch.no_grad():
        for r in val:
            _, _, patches, grid = image_test.reference(os.path.join(data, r["images"][0]), 56 * 56, 56 * 56)
            feats = vision_test.tower(vis, vc, patches.astype(np.float64), grid)
            units = grid[0] * grid[1] * grid[2] // 4
            at = ids.index(m.pad)
            toks = ids[:at] + [m.pad] * units + ids[at + 1:]
            n0, out = len(toks), []
            for _ in range(3):
                pos3, _ = vision_test.get_rope_index(toks + [0], [tuple(grid)], m.pad)
                section = tuple(cfg["rope_scaling"]["mrope_section"])
                row = vision_test.vl_logprob_rows(m, toks + [0], feats, pos3, section)
                nxt = int(row[len(toks) - 1].argmax())
                toks.append(nxt)
                if nxt == eos:
                    break
                out.append(nxt)
            outs.append(out)
    dec = subprocess.run([GRPO, "tokenize", "--tokenizer", model, "--jsonl", "--decode"], capture_output=True,
                         text=True, timeout=60, input="".join(json.dumps({"ids": o}) + "\n" for o in outs))
    texts = [json.loads(x)["text"] for x in dec.stdout.splitlines()]
    return 100.0 * sum(t == r["answer"] for t, r in zip(texts, val)) / len(val)


def check_run(d, err, min_gain, label, val):
    res = json.load(open(os.path.join(d, "demo_result.json")))
    m = re.search(r"after SFT ([\d.]+)%, after GRPO ([\d.]+)% \(([+-][\d.]+) points\)", err)
    check(f"{label}: the summary line agrees with demo_result.json", m and
          abs(float(m.group(1)) - 100 * res["accuracy_before_grpo"]) < 0.06 and
          abs(float(m.group(2)) - 100 * res["accuracy_after_grpo"]) < 0.06, err[-400:])
    gain = 100 * (res["accuracy_after_grpo"] - res["accuracy_before_grpo"])
    check(f"{label}: held-out accuracy after GRPO beats SFT by >= {min_gain} points ({gain:+.1f})",
          gain >= min_gain, json.dumps(res))
    init = ref.load_weights(os.path.join(d, "init"))
    final = ref.load_weights(os.path.join(d, "grpo"))
    vis = [k for k in init if k.startswith("visual.")]
    check(f"{label}: the vision tower after SFT and GRPO equals the initial one ({len(vis)} tensors: frozen)",
          vis and all(torch.equal(init[k], final[k]) for k in vis))
    return res, gain


def g_smoke():
    d, err = run_demo(os.path.join(TMP, "smoke"), "--demo-vl-smoke", 3600)
    val = check_data(d)
    res, _ = check_run(d, err, 10.0, "smoke", val)
    tol = 100.0 / len(val) + 1e-9  # one image may flip between batch layouts (a near tie in fp32)
    data = os.path.join(d, "data")
    for stage, key in (("sft", "accuracy_before_grpo"), ("grpo", "accuracy_after_grpo")):
        acc = reference_accuracy(os.path.join(d, stage), val, data)
        check(f"peer: the float64 reference's greedy accuracy of the {stage} model ({acc:.1f}%) reproduces the "
              f"demo's {100 * res[key]:.1f}%", abs(acc - 100 * res[key]) <= tol)


def g_full():
    d, err = run_demo(os.path.join(TMP, "full"), "--demo-vl", 3600)
    val = check_data(d)
    res, gain = check_run(d, err, 20.0, "full", val)
    check(f"full: the whole demo took {res['time_total_s']:.0f} s <= 600 s", res["time_total_s"] <= 600)


def main():
    global GRPO, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--full", action="store_true")
    a = ap.parse_args()
    GRPO, TMP = os.path.abspath(a.grpo), os.path.abspath(a.tmp)
    os.makedirs(TMP, exist_ok=True)
    torch.set_num_threads(2)
    vision_test.TMP = image_test.TMP = TMP
    groups = [("smoke", g_smoke)] + ([("full", g_full)] if a.full else [])
    return harness.run_groups(lambda: None, groups)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""grpo's vision-language forward (CPU, fp32) against Hugging Face transformers' own
Qwen2_5_VLForConditionalGeneration and Qwen2VLForConditionalGeneration: the peer the issue names for the device
run (transformers is installed only on the device machine; this script needs no GPU).

usage: python3 tests/cuda/hf_vl_parity.py --vl-tool PATH --tmp DIR

Needs torch, transformers and Pillow; without them it prints SKIPPED and exits 77. For each kind, a tiny random
model made by transformers itself (its initialisation, biases and norms randomised so none is trivially 0 or 1)
is saved in fp32 (transformers' own layout and names) with a preprocessor_config.json; a random RGB image goes
through transformers' PIL-based Qwen2VL image processor (Qwen2VLImageProcessorPil in transformers 5, whose
Qwen2VLImageProcessor resizes with torchvision) and, separately, through vl_tool --score (tests/model/vl_tool.c:
grpo's processor, tower, M-RoPE and language model on token ids where -1 stands for the image's pads). Checks:
grpo's sequence is the ids with the image's grid product / 4 pads; transformers applied M-RoPE (its rope_deltas
is the sequence's); every next-token log-prob equals the log-softmax of transformers' logits (fp32, 1e-4).
One line per check (PASS/FAIL), then "N passed, N failed"; exit 1 on any failure.
"""
import argparse
import inspect
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from harness import check, summary  # noqa: E402

try:
    import numpy as np
    import torch
    import transformers
    from PIL import Image
except ImportError as e:
    print(f"SKIPPED: {e}")
    sys.exit(77)

PAD, MIN_PX, MAX_PX = 151655, 56 * 56, 48 * 28 * 28
MEAN, STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
TEXT = dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
            hidden_act="silu", use_sliding_window=False)
ROPE = dict(mrope_section=[2, 3, 3], rope_theta=1e6)  # head_dim 16: sections add up to 8
VISION = {
    "qwen2_5_vl": dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                       window_size=112, fullatt_block_indexes=[1], patch_size=14, spatial_merge_size=2,
                       temporal_patch_size=2, in_channels=3, hidden_act="silu"),
    "qwen2_vl": dict(depth=2, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2, patch_size=14,
                     spatial_merge_size=2, temporal_patch_size=2, in_channels=3, hidden_act="quick_gelu"),
}


def make(kind, d, seed):
    """transformers' random model of `kind`, saved to d in fp32 with a preprocessor_config.json."""
    torch.manual_seed(seed)
    v5 = int(transformers.__version__.split(".")[0]) >= 5
    text = dict(TEXT)
    if v5:
        text["rope_parameters"] = dict(ROPE, rope_type="default")
    else:
        text.update(rope_theta=ROPE["rope_theta"], rope_scaling={"type": "mrope",
                                                                 "mrope_section": ROPE["mrope_section"]})
    cls, cfg_cls = ((transformers.Qwen2_5_VLForConditionalGeneration, transformers.Qwen2_5_VLConfig)
                    if kind == "qwen2_5_vl" else
                    (transformers.Qwen2VLForConditionalGeneration, transformers.Qwen2VLConfig))
    cfg = cfg_cls(text_config=text, vision_config=VISION[kind], image_token_id=PAD, video_token_id=151656,
                  vision_start_token_id=151652, vision_end_token_id=151653, tie_word_embeddings=False)
    m = cls(cfg).float().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.02)
            elif "norm" in name or "ln_q" in name:
                p.normal_(1.0, 0.1)
    m.save_pretrained(d, safe_serialization=True)
    with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
        json.dump({"min_pixels": MIN_PX, "max_pixels": MAX_PX, "patch_size": 14, "temporal_patch_size": 2,
                   "merge_size": 2, "image_mean": MEAN, "image_std": STD,
                   "image_processor_type": "Qwen2VLImageProcessor"}, f)
    return m


def vl_tool_score(tool, d, image, ids, out):
    """vl_tool --score: (the ids with the image's pads, their next-token log-probs)."""
    r = subprocess.run([tool, "--score", d, image, out, *map(str, ids)], capture_output=True, text=True,
                       timeout=120)
    if r.returncode:
        raise RuntimeError(f"vl_tool exited {r.returncode}: {r.stderr[-400:]}")
    b = open(out, "rb").read()
    n = struct.unpack("<i", b[:4])[0]
    toks = list(struct.unpack(f"<{n}i", b[4:4 + 4 * n]))
    lp = list(struct.unpack(f"<{n}f", b[4 + 4 * n:4 + 8 * n]))
    return toks, lp


def compare(m, kind, toks, lp, enc):
    """transformers' forward of toks with the image (enc: its processor's output) against vl_tool's lp."""
    ids = torch.tensor([toks])
    extra = {}
    if "mm_token_type_ids" in inspect.signature(m.forward).parameters:  # transformers >= 5.3: M-RoPE from it
        extra["mm_token_type_ids"] = (ids == PAD).int()
    with torch.no_grad():
        out = m(input_ids=ids, pixel_values=enc["pixel_values"], image_grid_thw=enc["image_grid_thw"], **extra)
    # M-RoPE: text after the image resumes at (its start + the larger of the grid's merged height and width),
    # so the last position is below the sequence's length by rope_deltas
    t, h, w = (int(x) for x in enc["image_grid_thw"][0])
    start = toks.index(PAD)
    last = start + max(h, w) // 2 + (len(toks) - 1 - (start + t * h * w // 4))
    delta = getattr(out, "rope_deltas", None)
    check(f"{kind}: transformers used M-RoPE positions (rope_deltas {last + 1 - len(toks)})",
          delta is not None and int(delta.reshape(-1)[0]) == last + 1 - len(toks),
          f"rope_deltas {None if delta is None else delta.tolist()}")
    want = torch.log_softmax(out.logits[0].double(), -1)
    n = len(toks)
    d = np.abs(np.array(lp[:-1], np.float64) - want[torch.arange(n - 1), torch.tensor(toks[1:])].numpy())
    check(f"{kind}: every next-token log-prob of an image prompt equals transformers' {type(m).__name__} "
          "(fp32, 1e-4)", bool(np.isfinite(d).all()) and float(d.max()) <= 1e-4,
          f"max diff {float(np.nanmax(d)):.2e} over {n - 1} positions, finite {np.isfinite(d).all()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vl-tool", required=True)
    ap.add_argument("--tmp", required=True)
    a = ap.parse_args()
    os.makedirs(a.tmp, exist_ok=True)
    rng = np.random.default_rng(7)
    image = os.path.join(a.tmp, "image.png")
    img = Image.fromarray(rng.integers(0, 256, (110, 150, 3), dtype=np.uint8), "RGB")
    img.save(image)
    try:  # transformers 5: the PIL processor has its own class (Qwen2VLImageProcessor resizes with torchvision)
        cls = getattr(transformers, "Qwen2VLImageProcessorPil", None) or transformers.Qwen2VLImageProcessor
        proc = cls(min_pixels=MIN_PX, max_pixels=MAX_PX, patch_size=14, temporal_patch_size=2, merge_size=2,
                   image_mean=MEAN, image_std=STD)
        enc = proc(images=[Image.open(image).convert("RGB")], return_tensors="pt")
    except Exception as e:  # noqa: BLE001 - reported as a failure
        check("transformers' Qwen2-VL image processor reads the image", False, repr(e)[-400:])
        enc = None
    ids = [151644, 872, 198, 151652, -1, 151653, 3838, 374, 432, 30, 151645, 198, 151644, 77091, 198, 32, 2518]
    for seed, kind in enumerate(VISION if enc is not None else []):
        d = os.path.join(a.tmp, kind)
        try:
            m = make(kind, d, seed)
            toks, lp = vl_tool_score(a.vl_tool, d, image, ids, os.path.join(a.tmp, kind + ".bin"))
        except Exception as e:  # noqa: BLE001 - reported as the check's failure
            check(f"{kind}: transformers makes the model and vl_tool scores it", False, repr(e)[-400:])
            continue
        units = int(enc["image_grid_thw"].prod()) // 4
        want_toks = [t for i in ids for t in ([PAD] * units if i < 0 else [i])]
        check(f"{kind}: grpo's sequence is the ids with the processor's grid / 4 image pads", toks == want_toks,
              f"{sum(t == PAD for t in toks)} pads vs {enc['image_grid_thw'].tolist()}")
        if toks != want_toks:
            continue
        try:
            compare(m, kind, toks, lp, enc)
        except Exception as e:  # noqa: BLE001 - reported as the check's failure
            check(f"{kind}: transformers' forward of the image prompt", False, repr(e)[-400:])
    sys.exit(summary())


if __name__ == "__main__":
    main()

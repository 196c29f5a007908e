#!/usr/bin/env python3
"""Images (src/io/image.c) and the Qwen2-VL image processor (src/model/vl_processor.c) against Pillow.

The peer: Pillow (Debian's python3-pil) decodes each image and converts it to RGB, and a reference written from
transformers' Qwen2VLImageProcessor (the slow, Pillow-based one: convert_to_rgb, smart_resize, Pillow's bicubic
resize, rescale in float64 then float32, normalise in float32, the patch reshape and permute) makes the patches.
grpo's image_tool (tests/io/image_tool.c) must give the same decoded pixels, the same resized pixels and
bit-identical patches and grid for 42 images of odd sizes, aspect ratios and modes (PNG: RGB, RGBA, grey,
grey + alpha, palettes of 8 and 4 bits with transparency, 1-bit, 16-bit grey (clamped, Pillow's mode I),
RGB and RGBA, a file without IEND; JPEG: 4:2:0, 4:4:4, grey, progressive, low quality, junk before EOI;
WebP: lossy, lossless, with alpha), small images scaled up to min_pixels, large ones down to max_pixels.
Bad images (truncated, not an image, an aspect ratio over 200, a header claiming a bomb of pixels, CMYK) give
one error line naming the file, never a crash."""
import argparse
import math
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from harness import check, run_groups  # noqa: E402

TOOL = TMP = None
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 1280


# ---------------------------------------------------------------- the reference (transformers' math)
def smart_resize(height, width, factor=28, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS):
    if max(height, width) / min(height, width) > 200:
        raise ValueError("aspect")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def reference(path, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch=14, temporal=2, merge=2):
    im = Image.open(path)
    if im.mode != "RGB":  # transformers.image_transforms.convert_to_rgb
        im = im.convert("RGB")
    arr = np.array(im)
    h, w = arr.shape[:2]
    rh, rw = smart_resize(h, w, patch * merge, min_pixels, max_pixels)
    resized = np.array(Image.fromarray(arr).resize((rw, rh), resample=Image.BICUBIC))
    x = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)   # rescale
    x = (x - np.array(MEAN, dtype=np.float32)) / np.array(STD, dtype=np.float32)  # normalize (float32)
    x = x.transpose(2, 0, 1)  # channels first
    frames = np.stack([x] * temporal)
    c, gh, gw = 3, rh // patch, rw // patch
    p = frames.reshape(1, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    p = p.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(gh * gw, c * temporal * patch * patch)
    return arr, resized, p, (1, gh, gw)


def ours(path, *extra):
    out = os.path.join(TMP, "out.bin")
    r = subprocess.run([TOOL, path, out, *map(str, extra)], capture_output=True, text=True, errors="replace",
                       timeout=120)
    if r.returncode:
        return None, r
    data = open(out, "rb").read()
    w, h, rw, rh, gt, gh, gw, dim = struct.unpack("<8i", data[:32])
    at = 32
    dec = np.frombuffer(data, np.uint8, w * h * 3, at).reshape(h, w, 3)
    at += w * h * 3
    res = np.frombuffer(data, np.uint8, rw * rh * 3, at).reshape(rh, rw, 3)
    at += rw * rh * 3
    patches = np.frombuffer(data, np.float32, gt * gh * gw * dim, at).reshape(gt * gh * gw, dim)
    return (dec, res, patches, (gt, gh, gw)), r


# ---------------------------------------------------------------- images
def content(w, h, seed):
    """Smooth colour ramps, a disc and noise: edges and gradients that resampling must get exactly."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 255 / max(w - 1, 1))
    g = (y * 255 / max(h - 1, 1))
    b = 255 * (((x - w / 2) ** 2 + (y - h / 2) ** 2) < (min(w, h) / 3) ** 2)
    img = np.stack([r, g, b], -1) + rng.normal(0, 18, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def write_png16(path, arr16, color_type):
    """A 16-bit PNG (Pillow cannot write 16-bit colour): big-endian samples, filter 0 rows."""
    h, w = arr16.shape[:2]
    raw = b"".join(b"\0" + arr16[y].astype(">u2").tobytes() for y in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(raw))
                          + png_chunk(b"IEND", b""))


def make_images():
    d = os.path.join(TMP, "img")
    os.makedirs(d, exist_ok=True)
    files = []

    def save(name, im, **kw):
        path = os.path.join(d, name)
        im.save(path, **kw)
        files.append(path)

    sizes = [(37, 53), (10, 10), (14, 14), (30, 30), (56, 56), (57, 55), (640, 480), (479, 641), (1000, 700),
             (2048, 1536), (12, 2000), (1999, 11), (333, 77), (100, 101), (5, 5), (9, 40)]
    for i, (w, h) in enumerate(sizes):
        save(f"rgb_{w}x{h}.png", Image.fromarray(content(w, h, i)))
    base = Image.fromarray(content(123, 97, 99))
    rgba = base.convert("RGBA")
    rgba.putalpha(Image.fromarray(content(123, 97, 7)[:, :, 0]))
    save("rgba.png", rgba)
    save("l.png", base.convert("L"))
    la = base.convert("LA")
    la.putalpha(Image.fromarray(content(123, 97, 8)[:, :, 1]))
    save("la.png", la)
    save("p8.png", base.convert("P", palette=Image.ADAPTIVE, colors=200), transparency=3)
    save("p4.png", base.convert("P", palette=Image.ADAPTIVE, colors=12), bits=4)
    save("bilevel.png", base.convert("1"))
    arr = content(71, 45, 5).astype(np.uint16) * 257 + np.random.default_rng(3).integers(0, 257, (45, 71, 3))
    grey = np.random.default_rng(4).integers(0, 1200, (33, 47))  # values over 255: Pillow's mode I clamps them
    for name, a, ct in (("rgb16.png", arr, 2), ("rgba16.png", np.concatenate([arr, arr[:, :, :1]], -1), 6),
                        ("grey16.png", grey, 0)):
        path = os.path.join(d, name)
        write_png16(path, a.astype(np.uint16), ct)
        files.append(path)
    path = os.path.join(d, "no_iend.png")  # a file that stops after its image data: Pillow opens it
    open(path, "wb").write(open(os.path.join(d, "rgb_37x53.png"), "rb").read()[:-12])
    files.append(path)
    for i, (w, h) in enumerate([(640, 480), (97, 131), (1280, 20), (15, 15)]):
        im = Image.fromarray(content(w, h, 40 + i))
        save(f"q95_{w}x{h}.jpg", im, quality=95)
        save(f"q30_444_{w}x{h}.jpg", im, quality=30, subsampling=0)
    data = open(os.path.join(d, "q95_640x480.jpg"), "rb").read()
    path = os.path.join(d, "junk_before_eoi.jpg")  # libjpeg warns about the extra bytes; Pillow opens the file
    open(path, "wb").write(data[:-2] + b"\x00junk" * 4 + data[-2:])
    files.append(path)
    save("grey.jpg", base.convert("L"), quality=90)
    save("progressive.jpg", base, quality=85, progressive=True)
    save("lossy.webp", base, quality=80)
    save("lossless.webp", base, lossless=True)
    save("alpha.webp", rgba, quality=70)
    save("alpha_lossless.webp", rgba, lossless=True)
    save("big.webp", Image.fromarray(content(1500, 1100, 77)), quality=60)
    return files


def g_images():
    files = make_images()
    bad = []
    for path in files:
        want = reference(path)
        got, r = ours(path)
        if got is None:
            bad.append(f"{os.path.basename(path)}: {r.stderr.strip()[:200]}")
            continue
        same = (np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[3] == want[3]
                and got[2].shape == want[2].shape and np.array_equal(got[2].view(np.uint32),
                                                                     want[2].astype(np.float32).view(np.uint32)))
        if not same:
            parts = [n for n, ok in (("decode", np.array_equal(got[0], want[0])),
                                     ("resize", got[1].shape == want[1].shape and np.array_equal(got[1], want[1])),
                                     ("grid", got[3] == want[3])) if not ok]
            bad.append(f"{os.path.basename(path)}: {parts or 'patches'}")
    check(f"{len(files)} images (PNG modes incl. 16-bit grey, colour and alpha, palettes, no IEND; JPEG incl. junk "
          "before EOI; WebP; 5 x 5 to 2048 x 1536, aspect ratios up to 182): decoded pixels, resized pixels, grid and patches (bitwise) equal Pillow + transformers' "
          "math", not bad and len(files) >= 30, "; ".join(bad[:4]))
    # min_pixels / max_pixels given (a model's preprocessor_config.json, or the data's own)
    path = files[6]  # 640 x 480
    for lo, hi in ((256 * 28 * 28, 512 * 28 * 28), (4 * 28 * 28, 16 * 28 * 28), (1024 * 1024, 2048 * 1024)):
        want = reference(path, lo, hi)
        got, r = ours(path, lo, hi)
        check(f"min_pixels {lo}, max_pixels {hi}: grid and patches equal", got is not None and got[3] == want[3] and
              np.array_equal(got[2], want[2].astype(np.float32)), r.stderr.strip()[:200])


def g_bad():
    d = os.path.join(TMP, "bad")
    os.makedirs(d, exist_ok=True)
    good = os.path.join(TMP, "img", "rgb_640x480.png")
    jpg = os.path.join(TMP, "img", "q95_640x480.jpg")
    webp = os.path.join(TMP, "img", "lossy.webp")
    cases = []
    for src in (good, jpg, webp):
        data = open(src, "rb").read()
        for frac in (0.5, 0.9):
            path = os.path.join(d, f"cut{int(frac * 100)}_{os.path.basename(src)}")
            open(path, "wb").write(data[: int(len(data) * frac)])
            cases.append((path, ""))
    path = os.path.join(d, "text.png")
    open(path, "w").write("hello, not an image\n")
    cases.append((path, "not a PNG, JPEG or WebP"))
    for name, size, want in (("thin.png", (2010, 10), "aspect ratio"),):
        path = os.path.join(d, name)
        Image.fromarray(content(*size, 1)).save(path)
        cases.append((path, want))
    # a header claiming 100,000 x 100,000 pixels: refused before decoding
    ihdr = struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)
    path = os.path.join(d, "bomb.png")
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(b"\0" * 64))
                           + png_chunk(b"IEND", b""))
    cases.append((path, "over the cap"))
    path = os.path.join(d, "cmyk.jpg")
    Image.fromarray(content(40, 40, 2)).convert("CMYK").save(path)
    cases.append((path, "CMYK"))
    fails = []
    for path, want in cases:
        got, r = ours(path)
        lines = r.stderr.strip().splitlines()
        ok = got is None and r.returncode == 1 and len(lines) == 1 and lines[0].startswith("grpo: error:") and \
            path in lines[0] and want in lines[0]
        if not ok:
            fails.append(f"{os.path.basename(path)}: rc {r.returncode} {r.stderr.strip()[:160]}")
    check(f"{len(cases)} bad images (truncated PNG/JPEG/WebP, not an image, too thin, a pixel bomb, CMYK): one "
          "error line naming the file", not fails, "; ".join(fails[:3]))


def main():
    global TOOL, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    TOOL, TMP = a.tool, a.tmp
    os.makedirs(TMP, exist_ok=True)
    return run_groups(lambda: None, {"images": g_images, "bad": g_bad}, a.only)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""`grpo report`: a crafted run (nulls, a resumed run repeating steps, validation lines, unknown keys, a
partial last line, hostile sample text) checked point by point against Python's own reading of the
JSONL, y tick labels distinct and on the same value-to-pixel line as the data; real `grpo train` and
`grpo sft` runs (config.yaml as YAML: PyYAML reads the values of --print-config, and --config reads it
back to the same config; an older run's one-line JSON config.yaml shown as YAML; SFT runs get no notes
about the files SFT never writes); headless Chromium renders the report (screenshot kept as the CI
artifact TMP/report.png, its pixels decoded with zlib, the charts spanning the page's width, console
empty, a negative control proving console errors are caught; legend and tick labels measured in the
page, inside their chart); bad inputs give one error line."""
import argparse
import html
import html.parser
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

ap = argparse.ArgumentParser()
ap.add_argument("--grpo", required=True)
ap.add_argument("--tokenizer", required=True)
ap.add_argument("--tmp", required=True)
ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
a = ap.parse_args()
shutil.rmtree(a.tmp, ignore_errors=True)
os.makedirs(a.tmp)
T = lambda *p: os.path.join(a.tmp, *p)
passed = failed = 0


def check(label, ok, detail=""):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + label + ("" if ok else ": " + str(detail)[:600]))
    passed += bool(ok)
    failed += not ok


class Page(html.parser.HTMLParser):
    """Charts (path data by data-key), sample cells, config text, scripts and external references."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.svgs, self.paths, self.circles, self.tags, self.refs = [], {}, {}, [], []
        self.cells, self.pre, self._cell, self._pre, self.text = [], "", None, False, []
        self.charts, self._svg, self._text = [], None, None  # per chart: title, width, texts, paths
        self.val_rows, self._val, self._vcell = [], False, None  # the validation table's rows of cell texts

    def handle_starttag(self, tag, attrs):
        d = dict(attrs)
        self.tags.append(tag)
        self.refs += [v for k, v in attrs if k in ("src", "href") and v]
        if tag == "svg":
            self.svgs.append(d.get("aria-label"))
            self._svg = {"title": d.get("aria-label"), "width": float(d["viewbox"].split()[2]), "texts": [],
                         "paths": {}}
            self.charts.append(self._svg)
        if tag == "text" and self._svg is not None:
            self._text = {"class": d.get("class", ""), "x": float(d["x"]), "y": float(d["y"]),
                          "anchor": d.get("text-anchor", "start"), "text": ""}
            self._svg["texts"].append(self._text)
        if tag == "path" and "data-key" in d:
            self.paths.setdefault(d["data-key"], []).append(d.get("d", ""))
            if self._svg is not None:
                self._svg["paths"].setdefault(d["data-key"], []).append(d.get("d", ""))
        if tag == "circle" and "data-key" in d:
            self.circles.setdefault(d["data-key"], []).append((float(d["cx"]), float(d["cy"])))
        if tag == "td" and d.get("class") == "text":
            self._cell = ""
        if tag == "pre":
            self._pre = True
        if tag == "table":
            self._val = d.get("class") == "val"
        if tag == "tr" and self._val:
            self.val_rows.append([])
        if tag in ("td", "th") and self._val:
            self._vcell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._vcell is not None:
            self.val_rows[-1].append(self._vcell)
            self._vcell = None
        if tag == "table":
            self._val = False
        if tag == "td" and self._cell is not None:
            self.cells.append(self._cell)
            self._cell = None
        if tag == "pre":
            self._pre = False
        if tag == "svg":
            self._svg = None
        if tag == "text":
            self._text = None

    def handle_data(self, data):
        self.text.append(data)
        if self._text is not None:
            self._text["text"] += data
        if self._cell is not None:
            self._cell += data
        if self._pre:
            self.pre += data
        if self._vcell is not None:
            self._vcell += data


def parse(path):
    p = Page()
    with open(path, encoding="utf-8") as f:
        p.feed(f.read())
    return p


def runs(d):
    """Path data -> list of runs, each a list of (x, y) from its M/L commands."""
    out = []
    for cmd, x, y in re.findall(r"([ML])([-\d.]+) ([-\d.]+)", d):
        if cmd == "M":
            out.append([])
        out[-1].append((float(x), float(y)))
    return out


def merged(lines):
    """Python's reading of metrics.jsonl: complete lines only, per step the last value of each key wins."""
    rows = {}
    for l in lines:
        o = json.loads(l)
        rows.setdefault(o["step"], {}).update(o)
    return dict(sorted(rows.items()))


def affine_ok(pairs, tol=0.02):
    """(value, pixel) pairs lie on one line pixel = a*value + b (rounding to 0.01 px allowed)."""
    pts = sorted(set(pairs))
    if len(pts) < 2:
        return True, None
    (v0, p0), (v1, p1) = pts[0], pts[-1]
    if v1 == v0:
        return all(abs(p - p0) < tol for _, p in pts), 0
    s = (p1 - p0) / (v1 - v0)
    return all(abs(p0 + s * (v - v0) - p) < tol * (1 + abs(s) * 1e-6) for v, p in pts), s


def check_series(label, page, rows, key):
    """The path of `key` has one point per finite value, gaps at nulls/missing, x affine in step,
    y affine in value and decreasing upward (SVG y grows down)."""
    want = [(s, r.get(key)) for s, r in rows.items()]
    finite = [(s, v) for s, v in want if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    n_runs, prev = 0, False
    for s, v in want:
        cur = (s, v) in finite
        n_runs += cur and not prev
        prev = cur
    d = page.paths.get(key, [])
    if not finite:
        check(f"{label}: {key} has no data, no path", not d, d)
        return
    got = runs(d[0]) if len(d) == 1 else None
    pts = [p for r in got for p in r] if got else []
    if not got or len(pts) != len(finite) or len(got) != n_runs:
        check(f"{label}: {key} points and gaps", False, (len(pts), len(finite), len(got or []), n_runs))
        return
    okx, sx = affine_ok([(s, x) for (s, _), (x, _) in zip(finite, pts)])
    oky, sy = affine_ok([(v, y) for (_, v), (_, y) in zip(finite, pts)])
    lone = sum(len(r) == 1 for r in got)
    check(f"{label}: {key} {len(pts)} points in {n_runs} runs match the data",
          okx and oky and (sx is None or sx > 0) and (sy is None or sy <= 0) and len(page.circles.get(key, [])) == lone,
          (okx, oky, sx, sy, lone, page.circles.get(key)))


def is_ytick(t):
    return "tick" in t["class"].split() and t["anchor"] == "end"


def check_ticks(label, page):
    """Each chart's y tick labels differ from each other, and each label's value sits at its pixel on the
    same value-to-pixel line as the chart's data (the line through the first and last points of a
    series; stacked areas are covered by the pixel check of their own test)."""
    bad = []
    for c in page.charts:
        ticks = [(t["text"], t["y"] - 4) for t in c["texts"] if is_ytick(t)]
        labels = [t for t, _ in ticks]
        if len(ticks) < 2 or len(set(labels)) != len(labels):
            bad.append((c["title"], labels))
            continue
        pairs = [(float(t), y) for t, y in ticks]
        if not affine_ok(pairs)[0]:
            bad.append((c["title"], "ticks not affine", pairs))
    check(f"{label}: y tick labels distinct and evenly placed in every chart ({len(page.charts)})",
          page.charts and not bad, bad)


def check_ticks_match_series(label, page, rows, title, key):
    """The tick labels of chart `title` and the points of `key` lie on one value-to-pixel line."""
    c = next((c for c in page.charts if c["title"] == title), None)
    if c is None or key not in c["paths"]:
        check(f"{label}: {title} has {key}", False, [x["title"] for x in page.charts])
        return
    ticks = [(float(t["text"]), t["y"] - 4) for t in c["texts"] if is_ytick(t)]
    vals = [r[key] for r in rows.values() if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    pts = [p for run_ in runs(c["paths"][key][0]) for p in run_]
    labels = [t["text"] for t in c["texts"] if is_ytick(t)]
    data = sorted(zip(vals, (y for _, y in pts)))
    (v0, p0), (v1, p1) = data[0], data[-1]
    slope = (p1 - p0) / (v1 - v0) if v1 != v0 else None
    # Where the data's line puts each label's value, against where the label is (pixels are rounded to 0.01).
    off = [abs(p0 + slope * (v - v0) - y) for v, y in ticks] if slope is not None else [1e9]
    check(f"{label}: {title} tick labels {labels} on the data's value-to-pixel line",
          len(vals) == len(pts) and len(set(labels)) == len(labels) and max(off) < 0.1, (off, ticks, data[:3]))


def report(*args):
    return subprocess.run([a.grpo, "report"] + list(args), capture_output=True, text=True, timeout=120)


# --- a crafted run --------------------------------------------------------------------------------------
run = T("crafted")
os.makedirs(run)
lines = []
for s in range(1, 9):  # the first session: steps 1..8
    lines.append({"step": s, "reward_mean": 0.1 * s + 0.05 * (s % 3), "reward_std": 0.2, "accuracy": None if s == 3 else s / 10,
                  "kl": 0.001 * s * s, "entropy": None, "pg_loss": -0.01 * s, "clip_frac": 0.02 * (s % 4),
                  "response_length_mean": 40 + 3 * s, "response_length_max": 64 + s, "grad_norm": 1.0 / s, "lr": 1e-6,
                  "time_rollout_s": 2 + 0.1 * s, "time_reward_s": 0.05, "time_reference_s": 0.5, "time_old_logprob_s": 0.4,
                  "time_update_s": 3 - 0.1 * s, "time_step_s": 6.0, "tokens_per_s": 1000 + 10 * s, "peak_rss_gib": 1.5,
                  "rss_rollout_gib": 1.2, "future_metric": [1, 2]})
    if s % 4 == 0:
        lines.append({"step": s, "val_accuracy": 0.3 + s / 100})
for s in range(6, 12):  # resumed from the checkpoint at step 5: steps 6..11 again, other values
    lines.append({"step": s, "reward_mean": 1 - 0.03 * s, "accuracy": 0.5, "kl": None if s == 9 else 0.002 * s,
                  "entropy": None, "clip_frac": 0.1, "response_length_mean": 30 + s, "grad_norm": 0.5, "time_rollout_s": 1.0,
                  "time_reward_s": 0.1, "time_update_s": 2.0, "time_step_s": 3.1, "tokens_per_s": 2000 - s})
text = "".join(json.dumps(l) + "\n" for l in lines)
with open(os.path.join(run, "metrics.jsonl"), "w") as f:
    f.write(text + '{"step": 12, "reward_mean": 0.')  # the run is writing step 12
hostile = ["<script>alert('x')</script>", "a & b < c > d \"quoted\"", "ünïcödé ✓ 中文", "line1\nline2\ttab",
           "</td></tr></table><img src=http://example.com/x.png>", "nul\u0000byte", "x" * 2500, "plain"]
samples = []
for step in (10, 11, 10, 11):  # a resume rewrites steps 10 and 11: the last step-11 block wins
    for i in range(10):
        samples.append({"step": step, "prompt_index": i // 2, "sample": i % 2, "prompt": "P%d-%d %s" % (step, i, hostile[i % 8]),
                        "prompt_ids": [1, 2], "response_ids": [3], "response": hostile[(i + 3) % 8] + " #%d" % len(samples),
                        "reward": 0.5 * (i % 3), "advantage": i - 4.5, "correct": i % 2})
with open(os.path.join(run, "samples.jsonl"), "w") as f:
    f.write("".join(json.dumps(s) + "\n" for s in samples) + '{"step": 12, "prom')
config = "model:\n  path: /models/<qwen> & co\ntrainer:\n  out_dir: runs/x  # \"quoted\"\n"
with open(os.path.join(run, "config.yaml"), "w") as f:
    f.write(config)
p = report(run)
out = os.path.join(run, "report.html")
check("crafted: exit 0, report.html written, no temporary left", p.returncode == 0 and os.path.exists(out)
      and sorted(os.listdir(run)) == ["config.yaml", "metrics.jsonl", "report.html", "samples.jsonl"], (p.returncode, p.stderr))
page = parse(out)
rows = merged(text.splitlines())
for key in ("reward_mean", "accuracy", "val_accuracy", "kl", "entropy", "clip_frac", "response_length_mean",
            "response_length_max", "grad_norm", "tokens_per_s", "pg_loss", "lr", "peak_rss_gib"):
    check_series("crafted", page, rows, key)
raw = open(out, encoding="utf-8").read()
check("crafted: self-contained (no script, no external reference, CSP default-src 'none')",
      "script" not in page.tags and not page.refs and "default-src 'none'" in raw and "http://example" not in
      re.sub(r"&[a-z]+;|<td class=\"text\">[^<]*", "", raw), (page.refs, [t for t in page.tags if t == "script"]))
titles = set(page.svgs)
check("crafted: the charts the issue asks for", {"Reward (mean)", "Accuracy", "KL", "Clip fraction", "Response length (tokens)",
                                                  "Gradient norm", "Step time by phase (s)", "Tokens per second"} <= titles
      and "Entropy" not in titles, titles)
phases = ["time_rollout_s", "time_reward_s", "time_reference_s", "time_old_logprob_s", "time_update_s"]
areas = {k: runs(page.paths[k][0])[0] for k in phases if k in page.paths}
# Each layer runs along its top edge (one point per step) and back along the layer below.
ok = set(areas) == set(phases) and all(len(areas[k]) == 2 * len(rows) for k in phases)
pairs = [(sum(r.get(k) or 0 for k in phases[:j + 1]), areas[phases[j]][i][1]) for j in range(5)
         for i, r in enumerate(rows.values())] if ok else []
check("crafted: step time stacked by phase (top edges affine in cumulative sums)", ok and affine_ok(pairs)[0], list(areas))
last = [s for s in samples if s["step"] == 11][-10:][:8]
want_cells = []
for s in last:
    for t in (s["prompt"], s["response"]):
        t = t.replace("\u0000", "\ufffd")
        b = t.encode()
        want_cells.append(t if len(b) <= 2000 else b[:2000].decode() + " [… %d more bytes]" % (len(b) - 2000))
check("crafted: samples of the last step after the resume, text exact after HTML parsing", page.cells == want_cells,
      (len(page.cells), page.cells[:2], want_cells[:2]))
check("crafted: config shown verbatim", page.pre == config, page.pre)
body = " ".join(page.text)
check_ticks("crafted", page)
check_ticks_match_series("crafted", page, rows, "Reward (mean)", "reward_mean")
check_ticks_match_series("crafted", page, rows, "Response length (tokens)", "response_length_mean")
check("crafted: resumed and in-progress noted", "resumed 1 time" in body and "in progress" in body and
      "%d steps (1 to 11)" % len(rows) in body, body[:300])

# --- tick labels of series that vary in their last digits (entropy 11.9201..11.9209), or are very small or
# very large: neighbouring labels must differ, and each must name the value at its height.
tiny = T("tiny")
os.makedirs(tiny)
tlines = [{"step": s, "entropy": 11.9201 + 0.0001 * (s - 1), "lr": 1e-6 + 2.5e-7 * s,
           "tokens_per_s": 1.2e6 + 3e4 * s, "grad_norm": 1.000000001 + 1e-9 * s, "kl": -0.003 + 0.001 * s}
          for s in range(1, 10)]
with open(os.path.join(tiny, "metrics.jsonl"), "w") as f:
    f.write("".join(json.dumps(l) + "\n" for l in tlines))
p = report(tiny)
check("tiny variation: report written", p.returncode == 0, p.stderr)
tp = parse(os.path.join(tiny, "report.html"))
trows = merged(json.dumps(l) for l in tlines)
check_ticks("tiny variation", tp)
for title, key in (("Entropy", "entropy"), ("Learning rate", "lr"), ("Tokens per second", "tokens_per_s"),
                   ("Gradient norm", "grad_norm"), ("KL", "kl")):
    check_series("tiny variation", tp, trows, key)
    check_ticks_match_series("tiny variation", tp, trows, title, key)
tnotes = " ".join(tp.text)
check("a GRPO-like run without config.yaml and samples.jsonl: both noted",
      "no config.yaml" in tnotes and "no samples.jsonl" in tnotes, tnotes[-300:])

# --- edge cases that still make a report ----------------------------------------------------------------
os.makedirs(T("empty"))
open(T("empty", "metrics.jsonl"), "w").close()
p = report(T("empty"))
check("empty metrics.jsonl (run just started): a report without charts", p.returncode == 0 and
      not parse(T("empty", "report.html")).svgs and "no steps yet" in open(T("empty", "report.html")).read(), p.stderr)
one = T("one.jsonl")
with open(one, "w") as f:
    f.write(json.dumps({"step": 1, "reward_mean": 0.25, "kl": 0.0}) + "\n")
p = report(one, "-o", T("one.html"))
pg = parse(T("one.html"))
check("one step: file argument, -o, flat and single-point charts draw a dot", p.returncode == 0 and
      len(pg.circles.get("reward_mean", [])) == 1 and len(pg.circles.get("kl", [])) == 1, (p.stderr, pg.circles))
p2 = report(one, "--out", T("one_out.html"))
help_text = report("--help").stdout
check("--out works as -o (the same file, byte for byte), and --help names both", p2.returncode == 0 and
      open(T("one_out.html"), "rb").read() == open(T("one.html"), "rb").read() and
      re.search(r"--out.*\n(.*\n)*.*-o\b", help_text) is not None, (p2.stderr, help_text))

# --- validation: the latest validation line's per-source keys (verl's val/SOURCE/VALUE/METRIC) as a table
vd = T("validation")
os.makedirs(vd)


def val_line(step, scale, sources):
    o = {"step": step, "val_accuracy": 0.5 * scale}
    for src in sources:
        for i, m in enumerate(("acc/mean@4", "reward/mean@4", "acc/pass@1", "acc/pass@2", "acc/pass@4", "acc/maj@4")):
            o[f"val/{src}/{m}"] = scale * (0.1 + 0.05 * i) + len(src) / 1000
    return o


vlines = [val_line(0, 1.0, ["openai/gsm8k"]), {"step": 1, "reward_mean": 0.5}, {"step": 2, "reward_mean": 0.6},
          val_line(2, 1.5, ["openai/gsm8k", "<b>&math</b>"]), val_line(2, 1.7, ["openai/gsm8k", "<b>&math</b>"]),
          {"step": 3, "reward_mean": 0.7}, val_line(1, 9.0, ["stale"])]  # a resumed run's earlier step: not the latest
with open(os.path.join(vd, "metrics.jsonl"), "w") as f:
    f.write("".join(json.dumps(l) + "\n" for l in vlines))
p = report(vd)
vp = parse(os.path.join(vd, "report.html"))
latest = vlines[4]  # step 2's second line: the latest step's last
rows_want = list(dict.fromkeys(k[4:k.rindex("/")] for k in latest if k.startswith("val/")))
cols_want = list(dict.fromkeys(k[k.rindex("/") + 1:] for k in latest if k.startswith("val/")))
want = [["data_source / value"] + cols_want] + [
    [r] + [f"{latest[f'val/{r}/{c}']:.4g}" if f"val/{r}/{c}" in latest else "–" for c in cols_want] for r in rows_want]
check("validation: the latest step's per-source mean@n, pass@k and maj@n in a table (source names escaped)",
      p.returncode == 0 and vp.val_rows == want and "Validation (step 2)" in "".join(vp.text),
      (p.stderr, vp.val_rows[:3], want[:3]))

# --- real runs -------------------------------------------------------------------------------------------
model = T("model")
subprocess.run([a.grpo, "init", "--out", model, "--tokenizer", a.tokenizer], check=True, capture_output=True)
with open(T("gsm.jsonl"), "w") as f:
    f.write("".join(json.dumps({"prompt": "%d+%d=" % (i, i), "answer": str(2 * i)}) + "\n" for i in range(4)))
train_args = ["model.path=" + model, "data.train_file=" + T("gsm.jsonl"), "data.chat_template=false",
              "data.max_response_length=6", "rollout.n=2", "data.train_batch_size=2", "trainer.steps=3",
              "trainer.val_before_train=false", "trainer.dump_samples=true", "trainer.out_dir=" + T("grpo_run"),
              "actor.kl_loss_coef=0.01", "actor.lr=2.5e-6",
              "rollout.stop=[\"a: b\", \"# c\", \"true\", \"\\n\", \"ü ✓\"]"]
g = subprocess.run([a.grpo, "train"] + train_args, capture_output=True, text=True, timeout=600)
check("grpo train run for the report", g.returncode == 0, g.stderr[-500:])
p = report(T("grpo_run"))
if g.returncode == 0:
    pg = parse(T("grpo_run", "report.html"))
    # config.yaml: block YAML that PyYAML reads to --print-config's values and --config reads back as is.
    import yaml
    want_json = subprocess.run([a.grpo, "train", "--print-config"] + train_args, capture_output=True, text=True,
                               timeout=60)
    cfg_text = open(T("grpo_run", "config.yaml"), encoding="utf-8").read()
    cfg_lines = cfg_text.splitlines()
    check("grpo train: config.yaml is block YAML, one key a line, indented by section",
          len(cfg_lines) > 50 and cfg_lines[0] == "data:" and "  lr: 2.5e-06" in cfg_lines
          and not any(l.startswith("{") for l in cfg_lines), cfg_lines[:5])
    check("grpo train: PyYAML reads config.yaml to the values of --print-config",
          want_json.returncode == 0 and yaml.safe_load(cfg_text) == json.loads(want_json.stdout),
          (want_json.stderr, cfg_text[:300]))
    back = subprocess.run([a.grpo, "train", "--config", T("grpo_run", "config.yaml"), "--print-config"],
                          capture_output=True, text=True, timeout=60)
    check("grpo train: --config OUT/config.yaml resolves to the same config", back.returncode == 0 and
          back.stdout == want_json.stdout, (back.stderr, back.stdout[:200]))
    check("grpo train: the report shows config.yaml as it is (YAML)", pg.pre == cfg_text, pg.pre[:200])
    check_ticks("grpo train", pg)
    # An older run's config.yaml: one line of JSON, shown as block YAML that reads as the same values.
    old = T("old_run")
    shutil.copytree(T("grpo_run"), old)
    with open(os.path.join(old, "config.yaml"), "w", encoding="utf-8") as f:
        f.write(want_json.stdout)
    p = report(old)
    po = parse(os.path.join(old, "report.html"))
    try:
        old_ok = yaml.safe_load(po.pre) == json.loads(want_json.stdout)
    except yaml.YAMLError as e:
        old_ok = e
    check("older run: one-line JSON config.yaml shown as indented YAML with the same values", p.returncode == 0 and
          old_ok is True and po.pre.startswith("data:\n  train_file: ") and "older grpo" in " ".join(po.text),
          (p.stderr, old_ok, po.pre[:200]))
    mlines = open(T("grpo_run", "metrics.jsonl")).read().splitlines()
    rr = merged(mlines)
    for key in ("reward_mean", "kl", "clip_frac", "response_length_mean", "grad_norm", "tokens_per_s", "entropy"):
        check_series("grpo train", pg, rr, key)
    dumped = [json.loads(l) for l in open(T("grpo_run", "samples.jsonl"))]
    lastg = [s for s in dumped if s["step"] == max(s["step"] for s in dumped)][:8]
    check("grpo train: samples table = first 8 of the last step", pg.cells == [t for s in lastg for t in (s["prompt"], s["response"])],
          (len(pg.cells), len(lastg)))
sft_data = T("sft.jsonl")
with open(sft_data, "w") as f:
    f.write("".join(json.dumps({"prompt_ids": [1, 2, 3 + i], "completion_ids": [4 + i, 5]}) + "\n" for i in range(8)))
s_ = subprocess.run([a.grpo, "sft", "--model", model, "--data", sft_data, "--out", T("sft_run"),
                     "--steps", "4", "--batch-size", "2"], capture_output=True, text=True, timeout=600)
check("grpo sft run for the report", s_.returncode == 0, s_.stderr[-500:])
p = report(T("sft_run"))
if s_.returncode == 0:
    pg = parse(T("sft_run", "report.html"))
    rs = merged(open(T("sft_run", "metrics.jsonl")).read().splitlines())
    for key in ("loss", "grad_norm", "lr"):
        check_series("grpo sft", pg, rs, key)
    for r in rs.values():  # tokens/s of a step: its target tokens over its seconds
        r["tokens_per_s"] = r["tokens"] / r["elapsed_s"]
    check_series("grpo sft", pg, rs, "tokens_per_s")
    check_ticks("grpo sft", pg)
    body = " ".join(pg.text)
    check("grpo sft: no notes about config.yaml and samples.jsonl, which SFT does not write",
          sorted(os.listdir(T("sft_run"))).count("config.yaml") == 0 and "config.yaml" not in body
          and "samples.jsonl" not in body and "grpo sft" in body, body[-400:])

# --- Chromium renders it ---------------------------------------------------------------------------------


def chromium(url, *extra):
    ud = T("chromium-profile")
    cmd = [a.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + ud, "--enable-logging=stderr",
           "--v=0", "--no-first-run", "--hide-scrollbars"] + list(extra) + [url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def console(stderr):
    return [l for l in stderr.splitlines() if ":CONSOLE" in l]


def png_pixels(path):
    """(width, height, rows of RGB tuples) from an 8-bit RGB/RGBA non-interlaced PNG, decoded with zlib."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = hdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0, hdr
    bpp = 3 if ctype == 2 else 4
    raw, stride, prev, rows = zlib.decompress(idat), w * bpp, bytearray(w * bpp), []
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, ul = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + left) & 255
            elif f == 2:
                line[i] = (line[i] + up) & 255
            elif f == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(up - ul), abs(left - ul), abs(left + up - 2 * ul)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else ul)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(w)])
        prev = line
    return w, h, rows


if not os.path.exists(a.chromium):
    check("chromium installed (scripts/deps.sh --test)", False, a.chromium)
else:
    neg = T("negative.html")
    with open(neg, "w") as f:
        f.write("<!DOCTYPE html><html><body><script>console.error('negative-control-7f3a')</script></body></html>")
    c = chromium("file://" + neg, "--dump-dom")
    check("chromium: negative control's console.error is caught", any("negative-control-7f3a" in l for l in console(c.stderr)),
          c.stderr[-400:])
    target = os.path.join(run, "report.html")
    c = chromium("file://" + target, "--dump-dom")
    dom = Page()
    dom.feed(c.stdout)
    n_paths = sum(1 for ds in page.paths.values() for d in ds if d.strip())
    check("chromium: DOM has every chart and non-empty path", c.returncode == 0 and dom.svgs == page.svgs and
          sum(1 for ds in dom.paths.values() for d in ds if d.strip()) == n_paths and n_paths >= 15, (len(dom.svgs), n_paths))
    check("chromium: no console messages (errors, CSP violations)", not console(c.stderr), console(c.stderr))
    shot = T("report.png")  # kept: the CI artifact
    c = chromium("file://" + target, "--screenshot=" + shot, "--window-size=1000,1200")
    check("chromium: screenshot written", c.returncode == 0 and os.path.exists(shot), c.stderr[-400:])
    if os.path.exists(shot):
        w, h, px = png_pixels(shot)
        blue = sum(1 for r in px for p in r if abs(p[0] - 0x1f) < 40 and abs(p[1] - 0x77) < 40 and abs(p[2] - 0xb4) < 40)
        colors = len({p for r in px[h // 4:] for p in r[::3]})
        check("screenshot: series colour drawn and the page is not one colour (%dx%d, %d blue px, %d colours)"
              % (w, h, blue, colors), blue > 500 and colors > 50, (blue, colors))
    # The charts fill the page's width: on a 1400 px wide window (where fixed 460 px charts left a third
    # empty) the series colour spans from near the left edge to near the right one.
    wide = T("report_wide.png")
    c = chromium("file://" + target, "--screenshot=" + wide, "--window-size=1400,900")
    if c.returncode == 0 and os.path.exists(wide):
        w, h, px = png_pixels(wide)
        xs = [x for r in px for x, p in enumerate(r)
              if abs(p[0] - 0x1f) < 40 and abs(p[1] - 0x77) < 40 and abs(p[2] - 0xb4) < 40]
        span = (max(xs) - min(xs)) / w if xs else 0
        check("screenshot at 1400 px: the charts span %.0f%% of the width (at least 85%%)" % (100 * span),
              span >= 0.85, (min(xs or [0]), max(xs or [0]), w))
    else:
        check("screenshot at 1400 px written", False, c.stderr[-400:])
    # Legend, title and tick labels measured by Chromium's own text layout (getBBox), on a copy of the report
    # with the content security policy removed and a script appended that writes the measurements into the DOM.
    probe = T("measure.html")
    src = open(target, encoding="utf-8").read()
    src = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", src)
    src = src.replace("</body>", """<script>
const out = [];
for (const svg of document.querySelectorAll("svg.chart")) {
  const w = svg.viewBox.baseVal.width, h = svg.viewBox.baseVal.height, texts = [];
  for (const t of svg.querySelectorAll("text")) {
    const b = t.getBBox();
    texts.push({cls: t.getAttribute("class"), text: t.textContent,
                x0: b.x, x1: b.x + b.width, y0: b.y, y1: b.y + b.height});
  }
  out.push({title: svg.getAttribute("aria-label"), w: w, h: h, texts: texts});
}
const pre = document.createElement("pre");
pre.id = "measured";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script></body>""")
    with open(probe, "w", encoding="utf-8") as f:
        f.write(src)
    c = chromium("file://" + probe, "--dump-dom", "--window-size=1400,900")
    m = re.search(r'<pre id="measured">(.*?)</pre>', c.stdout, re.S)
    measured = json.loads(html.unescape(m.group(1))) if m else []
    outside, overlap = [], []
    for ch in measured:
        for t in ch["texts"]:
            if t["x0"] < -0.5 or t["x1"] > ch["w"] + 0.5 or t["y0"] < -0.5 or t["y1"] > ch["h"] + 0.5:
                outside.append((ch["title"], t["text"], round(t["x0"], 1), round(t["x1"], 1)))
        leg = [t for t in ch["texts"] if t["cls"] == "legend"]
        for i, p_ in enumerate(leg):
            for q in leg[i + 1:]:
                apart_x = p_["x1"] - 0.5 <= q["x0"] or q["x1"] - 0.5 <= p_["x0"]
                apart_y = p_["y1"] - 0.5 <= q["y0"] or q["y1"] - 0.5 <= p_["y0"]
                if not apart_x and not apart_y:
                    overlap.append((ch["title"], p_["text"], q["text"]))
    check("chromium: every text of every chart (titles, legends, tick labels) inside its chart, measured (%d charts)"
          % len(measured), measured and len(measured) == len(page.svgs) and not outside, (outside, c.stderr[-300:]))
    check("chromium: legend entries do not overlap", measured and not overlap, overlap)
    stack = next((ch for ch in measured if ch["title"] == "Step time by phase (s)"), None)
    legend = sorted(t["text"] for t in stack["texts"] if t["cls"] == "legend") if stack else []
    check("chromium: the stacked step-time chart has a legend entry, inside the chart, for every phase",
          legend == sorted(phases), legend)

# --- bad input: one error line naming the file/line/option, exit 1 -----------------------------------------


def bad(name, content):
    d = T("bad_" + name)
    os.makedirs(d)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write(content)
    return d


os.makedirs(T("no_metrics"))
ok_line = json.dumps({"step": 1, "reward_mean": 0.5}) + "\n"
cases = [
    ("missing path", [T("nope")], r"nope"),
    ("directory without metrics.jsonl", [T("no_metrics")], r"metrics\.jsonl"),
    ("malformed JSON on line 3", [bad("json", ok_line * 2 + '{"step": 3,,}\n' + ok_line)], r"metrics\.jsonl:3\b"),
    ("line 2 without step", [bad("nostep", ok_line + '{"reward_mean": 1}\n')], r"metrics\.jsonl:2\b.*step"),
    ("negative step", [bad("negstep", '{"step": -1}\n')], r"metrics\.jsonl:1\b.*step"),
    ("a string where a number belongs", [bad("type", ok_line + '{"step": 2, "kl": "high"}\n')], r"metrics\.jsonl:2\b.*\"kl\""),
    ("not an object", [bad("array", "[1, 2]\n")], r"metrics\.jsonl:1\b"),
    ("unknown option", [run, "--frobnicate"], r"--frobnicate"),
    ("two runs", [run, run], r"argument"),
    ("no run", [], r"run directory"),
    ("-o into a missing directory", [run, "-o", T("no", "such", "r.html")], r"no/such"),
    ("--out into a missing directory", [run, "--out", T("no", "such", "r.html")], r"no/such"),
    ("both -o and --out", [run, "-o", T("a.html"), "--out", T("b.html")], r"-o.*--out"),
]
sd = bad("samples", ok_line)
with open(os.path.join(sd, "samples.jsonl"), "w") as f:
    f.write(json.dumps({"step": 1, "response": "x"}) + "\n" + '{"step": 1, "response": 5}\n')
cases.append(("samples.jsonl line 2 response not a string", [sd], r"samples\.jsonl:2\b.*response"))
for label, args, pattern in cases:
    p = report(*args)
    err = [l for l in p.stderr.splitlines() if l.strip()]
    check("error: " + label, p.returncode == 1 and len(err) == 1 and err[0].startswith("grpo: error:")
          and re.search(pattern, err[0]) is not None, (p.returncode, p.stderr))

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

#!/usr/bin/python3
"""Rewards (src/rl/reward.c) against a Python peer: verl's published reward functions, ported
verbatim below, Python's `re` for the format regex, and fixture programs for the external scorer.

usage: /usr/bin/python3 tests/rl/reward_test.py --tool PATH --tmp DIR [--seed S] [--only GROUP ...]
Groups:
  gsm8k    generated responses/answers (commas, $, negative, decimals, several ####, no answer,
           unicode, full GSM8K solutions as ground truth): verl's extract_solution (strict, flexible,
           clipped), the ground truth, value and correctness for several score/format_score settings.
  boxed    last_boxed_only_string, remove_boxed, strip_string (incl. the cases where verl raises),
           is_equiv, the numeric extension, value and correctness.
  format   re.fullmatch over generated tagged responses and several patterns (DOTALL on and off).
  exact    trimmed equality.
  sum      weighted sums of several kinds: total, per-spec values, accuracy.
  program  fixture scorers (tests/rl/fixtures/scorer.py): good replies, timeouts, crashes, early
           exits (EPIPE), garbage replies, a huge request, invalid UTF-8, clean shutdown with and
           without a cooperative program, and process-group cleanup; the caller always survives.
  errors   bad specs make the tool exit 1 with one "grpo: error:" line.
Prints one line per check and finally `N passed, M failed`; exit 0 iff all pass.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
SCORER = os.path.join(HERE, "fixtures", "scorer.py")
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import scorer as scorer_fixture  # noqa: E402  (its score() is the program's reward function)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from harness import check, summary  # noqa: E402

# ================================================================ the peer
# verl's reward functions (Apache-2.0, Bytedance), ported verbatim from the sources in the search
# index; only formatting and gsm8k's `clip` argument differ:
#   gsm8k.py  verl-project/verl@092781d12d17 verl/utils/reward_score/gsm8k.py: extract_solution with
#             re.findall and the last match (verl >= 0.3). Later verl clips the response to its last
#             _SOLUTION_CLIP_CHARS = 300 characters first; that is `clip` here (0 = off, the C default).
#   math.py   volcengine/verl@eb032d2fc7e3 and verl-project/verl@9b250f14006c
#             verl/utils/reward_score/math.py: compute_score, is_equiv, remove_boxed,
#             last_boxed_only_string, fix_fracs, fix_a_slash_b, remove_right_units, fix_sqrt,
#             strip_string (lm-evaluation-harness hendrycks_math). Those two snapshots carry local
#             additions (`_canonical_int_if_safe` inside is_equiv; `method`/`format_score` arguments of
#             compute_score) that are not in verl's released function and are not ported.
# After them, the extensions documented in src/rl/reward.h, written here independently with Python's
# re and float(): numeric comparison, ground-truth reduction, ASCII trimming.

# ---------------------------------------------------------------- verl gsm8k.py

def extract_solution(solution_str, method="strict", clip=0):
    assert method in ["strict", "flexible"]
    if clip and len(solution_str) > clip:  # later verl: _SOLUTION_CLIP_CHARS = 300
        solution_str = solution_str[-clip:]
    if method == "strict":
        # this also tests the formatting of the model
        solutions = re.findall("#### (\\-?[0-9\\.\\,]+)", solution_str)
        if len(solutions) == 0:
            final_answer = None
        else:
            # take the last solution
            final_answer = solutions[-1].replace(",", "").replace("$", "")
    elif method == "flexible":
        answer = re.findall("(\\-?[0-9\\.\\,]+)", solution_str)
        final_answer = None
        if len(answer) == 0:
            # no reward is there is no answer
            pass
        else:
            invalid_str = ["", "."]
            # find the last number that is not '.'
            for final_answer in reversed(answer):
                if final_answer not in invalid_str:
                    break
    return final_answer


def gsm8k_compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    """verl's compute_score (string comparison), kept for reference; the C reward uses
    gsm8k_reward below, which differs only in how the answer is compared."""
    answer = extract_solution(solution_str=solution_str, method=method)
    if answer is None:
        return 0
    else:
        if answer == ground_truth:
            return score
        else:
            return format_score


# ---------------------------------------------------------------- verl math.py

def math_compute_score(solution_str, ground_truth) -> float:
    retval = 0.0
    try:
        string_in_last_boxed = last_boxed_only_string(solution_str)
        if string_in_last_boxed is not None:
            answer = remove_boxed(string_in_last_boxed)
            if is_equiv(answer, ground_truth):
                retval = 1.0
    except Exception as e:
        print(e)
    return retval


def is_equiv(str1, str2, verbose=False):
    if str1 is None and str2 is None:
        print("WARNING: Both None")
        return True
    if str1 is None or str2 is None:
        return False
    try:
        ss1 = strip_string(str1)
        ss2 = strip_string(str2)
        if verbose:
            print(ss1, ss2)
        return ss1 == ss2
    except Exception:
        return str1 == str2


def remove_boxed(s):
    if "\\boxed " in s:
        left = "\\boxed "
        assert s[: len(left)] == left
        return s[len(left):]
    left = "\\boxed{"
    assert s[: len(left)] == left
    assert s[-1] == "}"
    return s[len(left): -1]


def last_boxed_only_string(string):
    idx = string.rfind("\\boxed")
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None
    i = idx
    right_brace_idx = None
    num_left_braces_open = 0
    while i < len(string):
        if string[i] == "{":
            num_left_braces_open += 1
        if string[i] == "}":
            num_left_braces_open -= 1
            if num_left_braces_open == 0:
                right_brace_idx = i
                break
        i += 1
    retval = None if right_brace_idx is None else string[idx: right_brace_idx + 1]
    return retval


def fix_fracs(string):
    substrs = string.split("\\frac")
    new_str = substrs[0]
    if len(substrs) > 1:
        substrs = substrs[1:]
        for substr in substrs:
            new_str += "\\frac"
            if substr[0] == "{":
                new_str += substr
            else:
                try:
                    assert len(substr) >= 2
                except:  # noqa: E722
                    return string
                a = substr[0]
                b = substr[1]
                if b != "{":
                    if len(substr) > 2:
                        post_substr = substr[2:]
                        new_str += "{" + a + "}{" + b + "}" + post_substr
                    else:
                        new_str += "{" + a + "}{" + b + "}"
                else:
                    if len(substr) > 2:
                        post_substr = substr[2:]
                        new_str += "{" + a + "}" + b + post_substr
                    else:
                        new_str += "{" + a + "}" + b
    string = new_str
    return string


def fix_a_slash_b(string):
    if len(string.split("/")) != 2:
        return string
    a = string.split("/")[0]
    b = string.split("/")[1]
    try:
        a = int(a)
        b = int(b)
        assert string == "{}/{}".format(a, b)
        new_string = "\\frac{" + str(a) + "}{" + str(b) + "}"
        return new_string
    except:  # noqa: E722
        return string


def remove_right_units(string):
    # "\\text{ " only ever occurs (at least in the val set) when describing units
    if "\\text{ " in string:
        splits = string.split("\\text{ ")
        assert len(splits) == 2
        return splits[0]
    else:
        return string


def fix_sqrt(string):
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    new_string = splits[0]
    for split in splits[1:]:
        if split[0] != "{":
            a = split[0]
            new_substr = "\\sqrt{" + a + "}" + split[1:]
        else:
            new_substr = "\\sqrt" + split
        new_string += new_substr
    return new_string


def strip_string(string):
    # linebreaks
    string = string.replace("\n", "")
    # remove inverse spaces
    string = string.replace("\\!", "")
    # replace \\ with \
    string = string.replace("\\\\", "\\")
    # replace tfrac and dfrac with frac
    string = string.replace("tfrac", "frac")
    string = string.replace("dfrac", "frac")
    # remove \left and \right
    string = string.replace("\\left", "")
    string = string.replace("\\right", "")
    # Remove circ (degrees)
    string = string.replace("^{\\circ}", "")
    string = string.replace("^\\circ", "")
    # remove dollar signs
    string = string.replace("\\$", "")
    # remove units (on the right)
    string = remove_right_units(string)
    # remove percentage
    string = string.replace("\\%", "")
    string = string.replace("\\%", "")  # verl writes "\%", the same string
    # " 0." equivalent to " ." and "{0." equivalent to "{." Alternatively, add "0" if "." is the start of the string
    string = string.replace(" .", " 0.")
    string = string.replace("{.", "{0.")
    # if empty, return empty string
    if len(string) == 0:
        return string
    if string[0] == ".":
        string = "0" + string
    # to consider: get rid of e.g. "k = " or "q = " at beginning
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:
        string = string.split("=")[1]
    # fix sqrt3 --> sqrt{3}
    string = fix_sqrt(string)
    # remove spaces
    string = string.replace(" ", "")
    # \frac1b or \frac12 --> \frac{1}{b} and \frac{1}{2}, etc.
    string = fix_fracs(string)
    # manually change 0.5 --> \frac{1}{2}
    if string == "0.5":
        string = "\\frac{1}{2}"
    # NOTE: X/Y changed to \frac{X}{Y} in dataset, but in simple cases fix in case the model output is X/Y
    string = fix_a_slash_b(string)
    return string


# ---------------------------------------------------------------- the extensions (reward.h)

WS = " \t\n\r\f\v"  # the C side trims ASCII whitespace only
_DEC = r"(?:(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]*)?|\.[0-9]+)"
_NUM = re.compile(r"([+-]?)(?:\\frac\{(" + _DEC + r")\}\{(" + _DEC + r")\}|(" + _DEC + r"))")


def parse_number(s):
    """reward_parse_number: a finite float, or None."""
    m = _NUM.fullmatch(s)
    if not m:
        return None
    if m.group(4) is not None:
        v = float(m.group(4).replace(",", ""))
    else:
        den = float(m.group(3).replace(",", ""))
        if den == 0:
            return None
        v = float(m.group(2).replace(",", "")) / den
    if v != v or v in (float("inf"), float("-inf")):
        return None
    return -v if m.group(1) == "-" else v


def gsm8k_ground_truth(answer):
    return answer.split("####")[-1].strip(WS).replace(",", "").replace("$", "")


def gsm8k_is_correct(extracted, gt):
    e = extracted.replace(",", "").replace("$", "")
    a, b = parse_number(e), parse_number(gt)
    if a is not None and b is not None:
        return a == b
    return e == gt


def gsm8k_reward(response, answer, method="strict", format_score=0.0, score=1.0, clip=0):
    """(value, correct, extracted, ground_truth)"""
    got = extract_solution(response, method, clip)
    gt = gsm8k_ground_truth(answer)
    if got is None:
        return 0.0, False, None, gt
    ok = gsm8k_is_correct(got, gt)
    return (score if ok else format_score), ok, got, gt


def strip_or_none(s):
    try:
        return strip_string(s)
    except Exception:
        return None


def boxed_reward(response, answer, format_score=0.0, score=1.0):
    """(value, correct, diagnostics) following math_compute_score, with the ground truth reduced to
    its last \\boxed{} and the numeric comparison of the stripped strings."""
    last = last_boxed_only_string(response)
    try:
        content = remove_boxed(last) if last is not None else None
    except AssertionError:
        content = None
    sa = strip_or_none(answer)
    sc = strip_or_none(content) if content is not None else None
    diag = dict(last_boxed=last, content=content, strip_content=sc, strip_answer=sa,
                is_equiv=is_equiv(content, answer) if content is not None else None,
                number_content=parse_number(sc) if sc is not None else None,
                number_answer=parse_number(sa) if sa is not None else None)
    if content is None:
        return 0.0, False, diag
    gt = answer
    lb = last_boxed_only_string(answer)
    if lb is not None:
        try:
            gt = remove_boxed(lb)
        except AssertionError:
            pass
    ok = is_equiv(content, gt)
    if not ok:
        x, y = strip_or_none(content), strip_or_none(gt)
        if x is not None and y is not None:
            u, v = parse_number(x), parse_number(y)
            ok = u is not None and v is not None and u == v
    return (score if ok else format_score), ok, diag


def format_reward(response, pattern, dotall=True):
    return 1.0 if re.fullmatch(pattern, response, re.DOTALL if dotall else 0) else 0.0


def exact_reward(response, answer):
    return 1.0 if response.strip(WS) == answer.strip(WS) else 0.0


# ================================================================ harness

TOOL = TMP = None


def run_tool(cases, raw_lines=(), timeout=120):
    """Feeds cases (dicts) plus raw byte lines to the tool; returns (outputs, rc, stderr, seconds)."""
    data = b"".join(json.dumps(c, ensure_ascii=False).encode("utf-8") + b"\n" for c in cases)
    data += b"".join(raw_lines)
    t0 = time.time()
    p = subprocess.run([TOOL], input=data, capture_output=True, timeout=timeout)
    dt = time.time() - t0
    outs = []
    for l in p.stdout.decode("utf-8", "replace").splitlines():
        try:
            outs.append(json.loads(l))
        except ValueError:
            outs.append({"unparsable": l[:200]})
    return outs, p.returncode, p.stderr.decode("utf-8", "replace"), dt


def compare(name, cases, expect, fields):
    """Runs cases; expect[i] is a dict of field -> wanted value; reports mismatches."""
    outs, rc, err, dt = run_tool(cases)
    if rc != 0 or len(outs) != len(cases):
        check(name, False, f"tool rc {rc}, {len(outs)}/{len(cases)} lines, stderr {err.strip()[-300:]}")
        return
    bad = []
    for c, o, e in zip(cases, outs, expect):
        diffs = {k: (o.get(k), e[k]) for k in fields if k in e and o.get(k) != e[k]}
        if diffs:
            bad.append((c, diffs))
    detail = f"{len(cases)} cases, {len(bad)} mismatches, {dt:.2f} s"
    if bad:
        detail += "; first: " + "; ".join(f"{json.dumps(c, ensure_ascii=False)[:300]} -> {d}" for c, d in bad[:3])
    check(name, not bad, detail)
    return outs


# ================================================================ corpora

UNI = ["é", "ß", "中文", "数学", "😀", "𝟙", "١٢٣", "１２", "\u00a0", "Ω", "ñ", "e\u0301", "∞", "π", "√", "≤",
       "\u2003", "\u3000", "🙂🙂", "Ж"]
WORDS = ["the", "answer", "is", "so", "we", "get", "total", "apples", "=", "+", "*", "(", ")", ":", ";"]


def rand_text(rng, n):
    pieces = WORDS + UNI + [" ", " ", " ", "\n", ",", ".", "$", "-", "#", "##", "####", "#### ", "1", "23", "4.5"]
    return "".join(rng.choice(pieces) for _ in range(n))


def number_variants(rng, v):
    """Ways a response may write the integer or decimal v (a str); odd strings only as themselves."""
    if not re.fullmatch(r"-?[0-9]*\.?[0-9]*", v) or v in ("", ".", "-", "-."):
        return [v]
    neg = v.startswith("-")
    body = v[1:] if neg else v
    ip, _, fp = body.partition(".")
    grouped = f"{int(ip):,}" if ip else ip
    sign = "-" if neg else ""
    out = [v, sign + grouped + ("." + fp if fp else ""), v + ".", v + (".00" if not fp else "0"),
           sign + "0" + body if ip else sign + "0" + body, "$" + v, sign + "$" + grouped]
    if not fp:
        out.append(v + ".0")
    return out


def rand_value(rng):
    r = rng.random()
    if r < 0.5:
        return str(rng.choice([0, 1, 5, 12, 72, 100, 999, 1000, 1234, 5600, 12345, 1000000, 7654321]) * rng.choice([1, 1, 1, -1]))
    if r < 0.8:
        return rng.choice(["3.5", "0.25", "-0.75", "12.5", "1234.5", ".5", "-.5", "0.1", "100.01"])
    return rng.choice(["1,2,3", "1.2.3", ".", "..", "-.", ",", "-", "1e5", "+5", "007", "-0", "0.0", "1,23", "12,345,678"])


def gsm8k_case(rng):
    if rng.random() < 0.2:
        return soup(rng, rng.randint(0, 14)), soup(rng, rng.randint(0, 6))
    v = rand_value(rng)
    variants = number_variants(rng, v)
    r = rng.random()
    if r < 0.25:
        gt = v
    elif r < 0.5:
        gt = rand_text(rng, rng.randint(0, 8)) + " <<3*4=12>>12\n#### " + rng.choice(variants)
    elif r < 0.6:
        gt = rng.choice(["#### 1 #### ", "##### ", "#####", "######## ", "### "]) + rng.choice(variants)
    elif r < 0.7:
        gt = rng.choice(variants)
    else:
        gt = rand_value(rng)
    parts = []
    for _ in range(rng.randint(0, 4)):
        k = rng.random()
        if k < 0.3:
            parts.append("#### " + rng.choice(number_variants(rng, rand_value(rng)) if rng.random() < 0.5 else [rand_value(rng)]))
        elif k < 0.4:
            parts.append(rng.choice(["####5", "# ### 5", "#### ", "#### $5", "#### -$5", "#### --5", "##### 9", "#### -,", "#### ..."]))
        else:
            parts.append(rand_text(rng, rng.randint(0, 12)))
    if rng.random() < 0.6:
        parts.append(rng.choice(["The answer is ", "#### ", "#### ", "so ", "=", ""]) + rng.choice(variants) + rng.choice(["", ".", " ", "\n", " apples", "😀"]))
    resp = rng.choice(["", " ", "\n"]).join(parts)
    if rng.random() < 0.05:
        resp = rand_text(rng, rng.randint(0, 5))  # often no number at all
    return resp, gt


BOX_FAMILIES = [
    ["\\frac{1}{2}", "\\frac12", "\\dfrac{1}{2}", "\\tfrac12", "0.5", ".5", "1/2", "\\frac{2}{4}", "0.50", "\\frac{1}{2.0}"],
    ["3", "3.0", "3.00", "03", "+3", "3.", "\\text{3}", "3\\%", "3^\\circ", "3^{\\circ}", "x=3", "k = 3", "3 \\text{ cm}",
     "\\$3", "3\\!", "\\mbox{3}", "3\n", " 3 "],
    ["\\sqrt{2}", "\\sqrt2", "\\sqrt 2", "√2", "2\\sqrt{2}", "2\\sqrt2"],
    ["\\left( 1, 2 \\right)", "(1,2)", "(1, 2)", "\\left(1,2\\right)"],
    ["1,000", "1000", "1{,}000", "1,000.0", "1000.00", "10,00"],
    ["-\\frac{3}{4}", "-3/4", "\\frac{-3}{4}", "-0.75", "-.75", "- 0.75"],
    ["\\{1,2\\}", "\\{1, 2\\}", "{1,2}", "\\left\\{1,2\\right\\}"],
    ["\\infty", "\\infty ", "\\inf"],
    ["α", "\\alpha", "\\frac αβ", "\\frac{α}{β}", "αβ", "中文", "😀/2"],
    ["\\frac", "a\\frac", "\\sqrt", "2\\sqrt", "1 \\text{ m} \\text{ s}", "\\frac1", "\\frac{1}\\frac", "\\frac\\frac12"],
    ["5/0", "\\frac{5}{0}", "0/5", "0", "0.0", "-0"],
    ["1/2/3", "a/b", "-0/1", "1/-2", "01/2", "-1/2", "12/34", "١/٢"],
    ["\\!\\!5", "\\\\5", "5\\\\", "k=5", "ab=5", "abc=5", "a=b=5", "5 \\text{ apples}"],
    [".5 .5", "{.5}", " .5", "x = .5", "0.5\\%"],
]


SOUP = ["\\frac", "\\sqrt", "{", "}", "1", "2", "12", " ", ".", "/", "=", "\\text{ ", "\\text{", "\\%", "\\$", "$",
        "\\left", "\\right", "\\!", "\\\\", "\\", "dfrac", "tfrac", "^\\circ", "^{\\circ}", "α", "😀", "-", "0", "\n",
        "\\boxed", "\\boxed ", "\\boxed{", "\\fbox{", "#### ", "####", ",", "a", "k", "x", "\\mbox{", "%", "+"]


def soup(rng, n):
    """Token soup: every normalisation step and every raising path, in any order."""
    return "".join(rng.choice(SOUP) for _ in range(n))


TRICKY = ["2\\\\\\%%", "50\\%", "\\frac", "\\sqrt", "2\\sqrt", "1 \\text{ m} \\text{ s}", "3 \\text{ m}", "\\frac1",
          "\\frac\\frac12", "0.5", ".5", "a=b", "k=\\frac12", "abc=5", "\\frac αβ", "1/2", "-0/1", "01/2", "1/-2",
          "\\\\frac12", "\\left(1\\right)", "90^\\circ", "\\$5", "x\\!y", "\\dfrac{1}{2}", "{.5}", "\\text{ 5}"]


def boxed_content(rng):
    fam = rng.choice(BOX_FAMILIES)
    return fam, rng.choice(fam)


def boxed_case(rng):
    if rng.random() < 0.3:
        return soup(rng, rng.randint(0, 14)), soup(rng, rng.randint(0, 8))
    fam, c = boxed_content(rng)
    gt = rng.choice(fam) if rng.random() < 0.8 else boxed_content(rng)[1]
    r = rng.random()
    if r < 0.15:
        gt = "\\boxed{" + gt + "}"
    elif r < 0.2:
        gt = "so the answer is $\\boxed{" + gt + "}$."
    elif r < 0.22:
        gt = "\\boxed " + gt
    pre = rand_text(rng, rng.randint(0, 6))
    k = rng.random()
    if k < 0.45:
        resp = pre + "\\boxed{" + c + "}" + rng.choice(["", ".", "$", " done"])
    elif k < 0.55:
        resp = pre + "$\\boxed{" + c + "}$"
    elif k < 0.62:
        resp = pre + "\\boxed " + c + rng.choice(["$ more", "", "$"])
    elif k < 0.67:
        resp = pre + "\\fbox{" + c + "}"
    elif k < 0.72:
        resp = pre + "\\boxed{" + c  # never closed
    elif k < 0.8:
        resp = "\\boxed{" + boxed_content(rng)[1] + "} then " + pre + "\\boxed{" + c + "}"
    elif k < 0.85:
        resp = pre + "\\boxed{\\text{{" + c + "}}}"
    elif k < 0.9:
        resp = pre + rng.choice(["\\boxed5 {x}", "}{\\boxed{1}}", "\\boxed{}", "\\boxed{{}}", "\\boxed}{2}", "\\boxed{a}}", "\\boxed{\\boxed{7}}"])
    elif k < 0.95:
        resp = pre + c  # no box
    else:
        resp = pre + "\\boxed{" + c + "} and \\boxed " + c
    return resp, gt


FORMAT_PATTERNS = [
    ("^<think>.*?</think>\\s*<answer>.*?</answer>$", True),
    ("^<think>.*?</think>\\s*<answer>.*?</answer>$", False),
    ("<answer>[^<]*</answer>", True),
    ("(?:yes|no)\\s*", True),
    ("\\w+ \\w+", True),
    ("(a|ab)(c|bcd)(d*)", True),
    ("<think>\\n.*\\n</think>\\n<answer>\\n.*\\n</answer>", True),
    ("[0-9]+(\\.[0-9]+)?", False),
    (".*#### -?[0-9,.]+.*", True),
]
FMT_WS = [" ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2003", ""]


def format_response(rng):
    think = rand_text(rng, rng.randint(0, 6))
    ans = rand_text(rng, rng.randint(0, 3))
    if rng.random() < 0.3:
        think = "\n" + think + "\n"
        ans = "\n" + ans + "\n"
    ws = "".join(rng.choice(FMT_WS) for _ in range(rng.randint(0, 3)))
    r = rng.random()
    if r < 0.4:
        s = f"<think>{think}</think>{ws}<answer>{ans}</answer>"
    elif r < 0.5:
        s = f"<think>{think}</think>{ws}<answer>{ans}</answer>" + rng.choice(["\n", " ", "x", "\n\n"])
    elif r < 0.55:
        s = rng.choice(["x", " ", "\n"]) + f"<think>{think}</think>{ws}<answer>{ans}</answer>"
    elif r < 0.6:
        s = f"<think>{think}</think>{ws}<answer>{ans}"
    elif r < 0.65:
        s = f"<think>{think}</think>x<answer>{ans}</answer>"
    elif r < 0.9:
        s = rng.choice(["yes", "no", "yes  ", "no\n", "yes\u3000", "yesno", "ab cd", "é ñ", "abcd", "abcdd", "abbcd",
                        "acd", "12", "1.5", "1.", "a b c", "<answer>12</answer>", "<answer>a\nb</answer>",
                        "<answer><</answer>", "a #### 5", "#### -1,000.5\n", "#### x", "\n#### 3\n",
                        "<think>\nx\n</think>\n<answer>\n5\n</answer>", "<think>\n\n</think>\n<answer>\n\n</answer>"])
    else:
        s = rand_text(rng, rng.randint(0, 10))
    return s


# ================================================================ groups

def test_gsm8k(rng, n):
    cases, expect = [], []
    settings = [dict(), dict(method="flexible"), dict(method="strict", clip_chars=20),
                dict(method="flexible", clip_chars=7), dict(score=2.5, format_score=0.1),
                dict(method="flexible", format_score=-0.5)]
    for i in range(n):
        resp, gt = gsm8k_case(rng)
        params = settings[i % len(settings)]
        v, ok, got, g = gsm8k_reward(resp, gt, params.get("method", "strict"), params.get("format_score", 0.0),
                                     params.get("score", 1.0), params.get("clip_chars", 0))
        cases.append(dict(kind="gsm8k", params=params, response=resp, answer=gt))
        expect.append(dict(extracted=got, ground_truth=g, score=v, values=[v], correct=int(ok)))
    outs = compare("gsm8k: extract_solution, ground truth, value, correctness vs verl peer", cases, expect,
                   ["extracted", "ground_truth", "score", "values", "correct"])
    if outs:
        n_correct = sum(o["correct"] == 1 for o in outs)
        n_none = sum(o["extracted"] is None for o in outs)
        # verl's own string comparison would miss these; the numeric comparison is the extension
        n_numeric = sum(1 for c, o in zip(cases, outs) if o["correct"] == 1 and o["extracted"] is not None
                        and o["extracted"].replace(",", "") != o["ground_truth"])
        check("gsm8k: corpus covers correct, wrong and missing answers", n_correct > n // 10 and n_none > n // 20
              and n - n_correct - n_none > n // 10, f"{n_correct} correct ({n_numeric} only numerically), "
              f"{n_none} without answer, {n - n_correct - n_none} wrong")
    # verl's compute_score (string equality) agrees wherever the strings already match exactly
    same = all(gsm8k_compute_score(c["response"], e["ground_truth"]) == 1 for c, e in zip(cases, expect)
               if c["params"] == {} and e["extracted"] is not None and e["extracted"] == e["ground_truth"])
    check("gsm8k: agrees with verl compute_score where the strings match", same)
    fixed = [("#### 1,234", "1234", 1), ("#### -5", "-5", 1), ("#### $5", "5", 0), ("#### 3.50", "3.5", 1),
             ("a #### 1 b #### 2", "2", 1), ("no answer", "0", 0), ("#### 72.", "x\n#### 72", 1)]
    cases = [dict(kind="gsm8k", response=r, answer=a) for r, a, _ in fixed]
    expect = [dict(score=float(gsm8k_reward(r, a)[0])) for r, a, _ in fixed]
    want = [float(w) for _, _, w in fixed]
    check("gsm8k: table cases (peer agrees with the table)", [e["score"] for e in expect] == want)
    compare("gsm8k: table cases", cases, expect, ["score"])


def test_boxed(rng, n):
    cases, expect = [], []
    settings = [dict(), dict(), dict(score=1.0, format_score=0.2)]
    for i in range(n):
        resp, gt = boxed_case(rng)
        params = settings[i % len(settings)]
        v, ok, diag = boxed_reward(resp, gt, params.get("format_score", 0.0), params.get("score", 1.0))
        e = dict(diag, score=v, values=[v], correct=int(ok))
        cases.append(dict(kind="boxed", params=params, response=resp, answer=gt))
        expect.append(e)
    for x in TRICKY:  # directed: each raising path and order-sensitive replacement
        for resp, gt in (("\\boxed{" + x + "}", x), ("\\boxed{1}", x), ("\\boxed " + x, "\\boxed{" + x + "}")):
            v, ok, diag = boxed_reward(resp, gt)
            cases.append(dict(kind="boxed", params={}, response=resp, answer=gt))
            expect.append(dict(diag, score=v, values=[v], correct=int(ok)))
    outs = compare("boxed: last_boxed_only_string, remove_boxed, strip_string, is_equiv, value vs verl peer",
                   cases, expect, ["last_boxed", "content", "strip_content", "strip_answer", "is_equiv",
                                   "number_content", "number_answer", "score", "values", "correct"])
    if outs:
        raised = sum(1 for c in cases if strip_or_none(c["answer"]) is None)
        n_correct = sum(o["correct"] == 1 for o in outs)
        n_numeric = sum(1 for o in outs if o["correct"] == 1 and o["is_equiv"] is False)
        n_none = sum(o["content"] is None for o in outs)
        check("boxed: corpus covers raises, correct, numeric-only, missing", raised > 0 and n_numeric > 0 and
              n_correct > n // 10 and n_none > n // 20,
              f"{raised} answers where strip_string raises, {n_correct} correct ({n_numeric} only numerically), "
              f"{n_none} without a usable box")
    # verl's compute_score agrees wherever is_equiv decides (no numeric rescue, plain ground truth)
    agree = all(math_compute_score(c["response"], c["answer"]) == (1.0 if e["is_equiv"] else 0.0)
                for c, e in zip(cases, expect) if e["content"] is not None)
    check("boxed: is_equiv matches verl compute_score", agree)


def test_format(rng, n):
    cases, expect = [], []
    for i in range(n):
        pat, dotall = FORMAT_PATTERNS[i % len(FORMAT_PATTERNS)]
        resp = format_response(rng)
        params = {} if i % len(FORMAT_PATTERNS) == 0 else dict(pattern=pat, dotall=dotall)
        v = format_reward(resp, pat, dotall)
        cases.append(dict(kind="format", params=params, response=resp, answer=""))
        expect.append(dict(score=v, values=[v], correct=-1))
    outs = compare("format: PCRE2 full match vs re.fullmatch", cases, expect, ["score", "values", "correct"])
    if outs:
        per = [0] * len(FORMAT_PATTERNS)
        for i, o in enumerate(outs):
            per[i % len(FORMAT_PATTERNS)] += o["score"] == 1
        each = (n + len(FORMAT_PATTERNS) - 1) // len(FORMAT_PATTERNS)
        check("format: every pattern sees matches and non-matches", all(0 < h < each - 10 for h in per),
              f"matches per pattern (of ~{each}): {per}")
    # invalid UTF-8 cannot match (documented); the default pattern otherwise would
    raw = [b'{"kind":"format","response":"<think>\xff</think><answer>1</answer>","answer":""}\n']
    outs, rc, err, _ = run_tool([], raw)
    check("format: invalid UTF-8 scores 0", rc == 0 and outs and outs[0]["score"] == 0, err)


def test_exact(rng, n):
    cases, expect = [], []
    for _ in range(n):
        core = rand_text(rng, rng.randint(0, 5))
        pad = lambda: "".join(rng.choice([" ", "\t", "\n", "\r", "\f", "\v", "\u00a0", ""]) for _ in range(rng.randint(0, 3)))
        ans = core if rng.random() < 0.6 else rand_text(rng, rng.randint(0, 5))
        resp, ans = pad() + core + pad(), pad() + ans + pad()
        v = exact_reward(resp, ans)
        cases.append(dict(kind="exact", response=resp, answer=ans))
        expect.append(dict(score=v, values=[v], correct=int(v == 1)))
    compare("exact: trimmed equality", cases, expect, ["score", "values", "correct"])


def after_think(r):
    """What a thinking model answered: after the last </think>; nothing while a <think> is unclosed."""
    if "</think>" in r:
        return r.split("</think>")[-1]
    return "" if "<think>" in r else r


def think_wrap(rng, resp):
    """resp behind a reasoning block holding decoy answers, or one of the odd shapes around it."""
    decoy = rng.choice(["#### 99999", "\\boxed{-7}", "so 12345", "#### 1\n\\boxed{1}", ""])
    shape = rng.randrange(6)
    if shape == 0:
        return resp  # no tags at all
    if shape == 1:
        return "<think>" + rand_text(rng, 3) + decoy + "</think>\n\n" + resp
    if shape == 2:
        return "<think>\n" + decoy + "\n</think>" + rand_text(rng, 2) + "</think>" + resp  # two closes
    if shape == 3:
        return "<think>" + decoy + resp  # unclosed: the reasoning ran out of tokens
    if shape == 4:
        return decoy + "</think>" + resp  # a close without an open
    return resp + "<think>" + decoy  # an answer, then reasoning that never closes


def test_think(rng, n):
    """strip_think: gsm8k, boxed and exact score what follows the reasoning (peer: after_think + the scorers)."""
    cases, expect = [], []
    for i in range(n):
        kind = ("gsm8k", "boxed", "exact")[i % 3]
        if kind == "gsm8k":
            resp, gt = gsm8k_case(rng)
        elif kind == "boxed":
            resp, gt = boxed_case(rng)
        else:
            gt = rand_text(rng, rng.randint(1, 4))
            resp = gt if rng.random() < 0.6 else rand_text(rng, 3)
        resp = think_wrap(rng, resp)
        tail = after_think(resp)
        if kind == "gsm8k":
            v, ok = gsm8k_reward(tail, gt)[:2]
        elif kind == "boxed":
            v, ok = boxed_reward(tail, gt)[:2]
        else:
            v = exact_reward(tail, gt)
            ok = v == 1
        cases.append(dict(kind=kind, params=dict(strip_think=True), response=resp, answer=gt))
        expect.append(dict(score=v, values=[v], correct=int(ok)))
    outs = compare("strip_think: gsm8k/boxed/exact after the last </think> vs the peers", cases, expect,
                   ["score", "values", "correct"])
    if outs:
        # the decoys matter: without strip_think some of the same responses score differently
        plain = [dict(c, params={}) for c in cases]
        outs2, rc, err, _ = run_tool(plain)
        differ = sum(a["score"] != b["score"] for a, b in zip(outs, outs2 or []))
        check("strip_think: the reasoning's decoy answers change some scores when not stripped", differ > n // 20,
              f"{differ} of {n} differ" + (f"; {err}" if rc else ""))


def test_sum(rng, n):
    specs = [dict(kind="gsm8k", weight=0.7, params=dict(method="flexible")),
             dict(kind="format", weight=0.3, params=dict(pattern=".*####.*")),
             dict(kind="exact", weight=-0.25),
             dict(kind="boxed", weight=1.5, params=dict(format_score=0.1))]
    cases, expect = [], []
    for _ in range(n):
        resp, gt = (gsm8k_case if rng.random() < 0.5 else boxed_case)(rng)
        vals = [gsm8k_reward(resp, gt, "flexible")[:2], (format_reward(resp, ".*####.*"), None),
                (exact_reward(resp, gt), exact_reward(resp, gt) == 1), boxed_reward(resp, gt, 0.1)[:2]]
        total = 0.0
        for s, (v, _) in zip(specs, vals):
            total += s["weight"] * v
        correct = int(all(ok for _, ok in vals if ok is not None))
        cases.append(dict(specs=specs, response=resp, answer=gt))
        expect.append(dict(score=total, values=[v for v, _ in vals], correct=correct))
    compare("sum: weighted total, per-spec values, accuracy (all correctness kinds)", cases, expect,
            ["score", "values", "correct"])


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def prog(mode="good", n=3, timeout=5.0, grace=2.0, pidfile=None, tag=""):
    cmd = f"{sys.executable} {SCORER} --mode {mode} --n {n}" + (f" --pidfile {pidfile}" if pidfile else "")
    return dict(command=cmd + (f" # {tag}" if tag else ""), timeout=timeout, grace=grace)


def program_cases(params, responses, prompt="p", answer="a"):
    return [dict(kind="program", params=params, prompt=prompt, response=r, answer=answer) for r in responses]


def test_program(rng):
    py = scorer_fixture.score
    # --- good: many requests with awkward strings, one process
    strs = ["", "plain", 'quo"te', "back\\slash", "new\nline", "tab\t", "ctl\x01\x1f", "é中文😀", "\u2028\u2029",
            "#### 42", "{\"reward\": 9}", " spaced "]
    reqs = [(rng.choice(strs) + rand_text(rng, rng.randint(0, 8)), rng.choice(strs), rng.choice(strs)) for _ in range(150)]
    params = prog()
    cases = [dict(kind="program", params=params, prompt=p, response=r, answer=a) for p, r, a in reqs]
    cases.append(dict(op="free"))
    outs, rc, err, dt = run_tool(cases)
    ok = rc == 0 and len(outs) == len(cases)
    mism = [i for i, ((p, r, a), o) in enumerate(zip(reqs, outs)) if o.get("score") != py(p, r, a)] if ok else []
    last = outs[-2] if ok else {}
    check("program good: every reward equals the fixture's score()", ok and not mism,
          f"rc {rc}, {len(mism)} mismatches of {len(reqs)}, first {mism[:3]}, {dt:.2f} s {err[-200:]}")
    check("program good: one start, counters", ok and (last["calls"], last["failures"], last["timeouts"],
          last["restarts"], last["starts"]) == (150, 0, 0, 0, 1), str(last))
    check("program good: clean shutdown is quick", ok and outs[-1]["freed"] == 1 and outs[-1]["seconds"] < 1.5,
          str(outs[-1]) if ok else "")

    # --- timeouts: restarted on the next call
    resp = ["a", "SLEEP", "bb", "SLEEP", "SLEEP", "ccc", "dddd"]
    params = prog("sleep", timeout=0.4)
    outs, rc, err, dt = run_tool(program_cases(params, resp))
    want_ok = ["SLEEP" not in r for r in resp]
    got_ok = [o["program_failures"] == 0 for o in outs]
    scores_ok = all(o["score"] == (py("p", r, "a") if w else 0.0) for o, r, w in zip(outs, resp, want_ok))
    last = outs[-1] if outs else {}
    check("program timeout: timed-out calls score 0, others exact", rc == 0 and got_ok == want_ok and scores_ok,
          f"rc {rc} {got_ok} {err[-200:]}")
    check("program timeout: counters (3 timeouts, 3 restarts)", (last.get("calls"), last.get("failures"),
          last.get("timeouts"), last.get("restarts"), last.get("starts")) == (7, 3, 3, 3, 4), str(last))
    check("program timeout: each timeout costs about the timeout", 1.2 <= dt < 1.2 + 4.0, f"{dt:.2f} s for 3 x 0.4 s")

    # --- crash after N replies (no reply, EOF): restarted, pattern repeats
    n_calls, n_ok = 11, 3
    params = prog("crash", n=n_ok)
    outs, rc, err, dt = run_tool(program_cases(params, [f"r{i}" for i in range(n_calls)]))
    want, served, fails, starts = [], 0, 0, 1
    for i in range(n_calls):  # simulate: a fresh process serves n_ok, then dies on the next request
        if served == n_ok:
            want.append(False)
            fails += 1
            served = -1
        else:
            if served == -1:
                starts += 1
                served = 0
            want.append(True)
            served += 1
    got = [o["program_failures"] == 0 for o in outs]
    last = outs[-1] if outs else {}
    check("program crash: failures where the simulation says, caller survives", rc == 0 and got == want,
          f"rc {rc} got {got} want {want} {err[-200:]}")
    check("program crash: counters", (last.get("calls"), last.get("failures"), last.get("timeouts"),
          last.get("restarts"), last.get("starts")) == (n_calls, fails, 0, starts - 1, starts), f"{last} want "
          f"failures {fails} starts {starts}")

    # --- exits after replying: the next request meets a closed socket (EPIPE, no SIGPIPE)
    params = prog("exit", n=2)
    lines = [json.dumps(c).encode() + b"\n" for c in program_cases(params, ["a", "b", "c", "d", "e"])]
    p = subprocess.Popen([TOOL], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    outs = []
    for l in lines:
        p.stdin.write(l)
        p.stdin.flush()
        outs.append(json.loads(p.stdout.readline()))
        time.sleep(0.15)  # let an exiting program finish exiting
    p.stdin.close()
    rc = p.wait(timeout=30)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.stderr.close()
    got = [o["program_failures"] == 0 for o in outs]
    check("program exit: write to a dead program fails softly (EPIPE), no SIGPIPE", rc == 0 and
          got == [True, True, False, True, True] and "writing the request failed" in outs[2]["last_error"],
          f"rc {rc} {got} {outs[2].get('last_error')} {err[-200:]}")

    # --- garbage replies
    payloads = [("not json", False), ('{"reward": "0.5"}', False), ('{"score": 1}', False), ("[1]", False),
                ('{"reward": null}', False), ('{"reward": 1e999}', False), ('{"reward": true}', False),
                ("1.5", False), ('{"reward": 2', False), ("", False), ('{"reward": 0.5} trailing', False),
                ('{"reward": 7}', True), ('\n\n{"reward": 0.25}', True), ('{"reward": -3e-5, "x": [1]}', True),
                ("x" * (1 << 20) + "y" * 1000, False)]
    resp = []
    for pl, _ in payloads:
        resp += ["GARBAGE:" + pl, "fine"]
    params = prog("garbage")
    outs, rc, err, dt = run_tool(program_cases(params, resp))
    want_scores = []
    for pl, good in payloads:
        want_scores.append(json.loads(pl.strip())["reward"] if good else 0.0)
        want_scores.append(py("p", "fine", "a"))
    got_scores = [o["score"] for o in outs]
    n_bad = sum(1 for _, g in payloads if not g)
    last = outs[-1] if outs else {}
    check("program garbage: bad replies score 0, good ones (blank lines skipped) count", rc == 0 and
          got_scores == want_scores, f"rc {rc} got {got_scores[:12]} want {want_scores[:12]} {err[-200:]}")
    check("program garbage: counters", (last.get("calls"), last.get("failures"), last.get("timeouts"),
          last.get("restarts")) == (len(resp), n_bad, 0, n_bad), f"{last} want failures {n_bad}")

    # --- huge request (socket buffer full: nonblocking send + poll) and a reader that stops early
    big = "é" * 3_000_000
    outs, rc, err, dt = run_tool(program_cases(prog(), [big, "small"]) +
                                 program_cases(dict(command="head -c 10 >/dev/null; sleep 0.5", timeout=3), [big, "x"]))
    check("program huge request: 6 MB request scored", rc == 0 and len(outs) == 4 and
          outs[0]["score"] == py("p", big, "a") and outs[1]["score"] == py("p", "small", "a"), f"rc {rc} {err[-200:]}")
    check("program huge request to a program that stops reading: fails softly", rc == 0 and len(outs) == 4 and
          outs[2]["program_failures"] == 1 and outs[3]["program_failures"] == 1,
          str([o.get("last_error") for o in outs[2:]]))

    # --- invalid UTF-8 goes out as U+FFFD
    params = prog(tag="utf8")
    raw = [json.dumps(dict(kind="program", params=params, prompt="p", answer="a")).encode()[:-1] +
           b', "response": "a\xff\xc3b"}\n']
    outs, rc, err, _ = run_tool([], raw)
    check("program invalid UTF-8: sent as U+FFFD", rc == 0 and outs and outs[0]["score"] == py("p", "a\ufffd\ufffdb", "a"),
          f"{outs} {err[-200:]}")

    # --- programs that never start properly
    outs, rc, err, _ = run_tool(program_cases(dict(command="exit 3", timeout=1), ["a", "b", "c"]) +
                                program_cases(dict(command="/nonexistent/scorer", timeout=1), ["a", "b"]))
    check("program dead on start / command not found: every call 0, counted, restarted",
          rc == 0 and [o["program_failures"] for o in outs] == [1] * 5 and outs[2]["restarts"] == 2
          and outs[4]["failures"] == 2, f"rc {rc} {[o.get('last_error') for o in outs]}")

    # --- memory_mb: a scorer whose allocation passes its data limit fails that call (scored 0, counted);
    # the same scorer under the default limit scores. (Its limit is RLIMIT_DATA, set before exec.)
    hog = (f"{sys.executable} -c \"import sys, json; b = bytearray(256 << 20); "
           f"[print(json.dumps({{'reward': 1.0}}), flush=True) for _ in sys.stdin]\"")
    outs, rc, err, _ = run_tool(program_cases(dict(command=hog, timeout=5, memory_mb=64), ["a", "b"]) +
                                program_cases(dict(command=hog + " # default", timeout=5), ["a", "b"]))
    got = [(o.get("score"), o.get("program_failures")) for o in outs]
    check("program memory_mb: past its data limit it scores 0 and is counted; under the default it scores",
          rc == 0 and got == [(0.0, 1), (0.0, 1), (1.0, 0), (1.0, 0)], f"rc {rc} {got} {err[-300:]}")

    # --- weighted sum with a program
    specs = [dict(kind="program", weight=0.5, params=prog(tag="sum")), dict(kind="gsm8k", weight=2.0)]
    cases = [dict(specs=specs, prompt="q", response=r, answer="7") for r in ["#### 7", "#### 8", "no"]]
    outs, rc, err, _ = run_tool(cases)
    want = [0.5 * py("q", r, "7") + 2.0 * (1.0 if r == "#### 7" else 0.0) for r in ["#### 7", "#### 8", "no"]]
    check("program in a weighted sum", rc == 0 and [o["score"] for o in outs] == want and
          [o["correct"] for o in outs] == [1, 0, 0], f"{outs} want {want}")

    # --- shutdown: a program ignoring EOF is killed after grace; nothing is left running
    pidfile = os.path.join(TMP, "pids.txt")
    if os.path.exists(pidfile):
        os.remove(pidfile)
    coop = prog(pidfile=pidfile)
    stubborn = prog("noeof", grace=0.3, pidfile=pidfile)
    bg = dict(command=f"sleep 60 & echo $! >> {pidfile}; {sys.executable} {SCORER}", timeout=5, grace=0.2)
    cases = (program_cases(coop, ["a"]) + [dict(op="free")] + program_cases(stubborn, ["a"]) + [dict(op="free")] +
             program_cases(bg, ["a"]) + [dict(op="free")] + program_cases(prog("crash", n=0, pidfile=pidfile), ["a", "b"]))
    t0 = time.time()
    outs, rc, err, dt = run_tool(cases)
    frees = [o for o in outs if "freed" in o]
    time.sleep(0.2)
    pids = [int(x) for x in open(pidfile).read().split()] if os.path.exists(pidfile) else []
    left = [p for p in pids if alive(p)]
    check("program shutdown: cooperative exit is quick", len(frees) == 3 and frees[0]["seconds"] < 1.0, str(frees))
    check("program shutdown: EOF-ignoring program killed after the grace period",
          len(frees) == 3 and 0.3 <= frees[1]["seconds"] < 1.5, str(frees))
    # pids: the cooperative and the stubborn scorer, the background sleep, two starts of the crashing one
    check("program shutdown: the whole process group goes (background child of sh), tool exits at once",
          len(frees) == 3 and frees[2]["seconds"] < 1.5 and len(pids) == 5 and not left,
          f"pids {pids} alive {left} (tool {dt:.2f} s)")
    check("program shutdown: the tool did not wait for leftovers", dt < 10, f"{dt:.2f} s")

    # --- leftovers out of the process group's reach: a child in a session of its own (setsid), and one
    # more level below a setsid'd shell. Killed at each restart and at shutdown; the tool's stderr (a
    # pipe here, read to EOF by run_tool, as `| tee` would) is not held open by them.
    os.remove(pidfile)
    daemon = dict(command=f"setsid sleep 300 & echo $! >> {pidfile}; setsid sh -c 'sleep 300 & echo $! >> {pidfile}; "
              f"wait' & {sys.executable} {SCORER} --mode crash --n 1", timeout=5, grace=0.2)
    outs, rc, err, dt = run_tool(program_cases(daemon, ["a", "b", "c"]) + [dict(op="free")], timeout=60)
    time.sleep(0.2)
    pids = [int(x) for x in open(pidfile).read().split()] if os.path.exists(pidfile) else []
    left = [p for p in pids if alive(p)]
    check("program leftovers in their own session (setsid, two levels): killed at restart and shutdown, stderr "
          "not held; the crash is seen at once", rc == 0 and len(outs) == 4 and len(pids) == 4 and not left and dt < 3,
          f"rc {rc}, pids {pids} alive {left}, {dt:.2f} s {err[-200:]}")

    # --- floods and a program that never reads: each call scores 0 within its timeout, counted, no hang
    floods = [("yes", "reply"), ("cat /dev/zero", "1 MiB"), ("yes 'x' | tr -d '\\n'", "1 MiB"), ("exec sleep 300", "")]
    for cmd, what in floods:
        t0 = time.time()
        outs, rc, err, dt = run_tool(program_cases(dict(command=cmd, timeout=1, grace=0.2), ["a", "é" * 3_000_000, "c"])
                                     + [dict(op="free")], timeout=60)
        calls = [o for o in outs if "score" in o]
        check(f"program flood/no reader `{cmd}`: every call 0 and counted, within its timeout",
              rc == 0 and len(calls) == 3 and all(o["score"] == 0.0 and o["program_failures"] == 1 for o in calls)
              and calls[-1]["failures"] == 3 and dt < 3 * 1 + 5 and what in calls[0]["last_error"],
              f"rc {rc} {[o.get('last_error') for o in calls]} {dt:.2f} s {err[-200:]}")

    # --- grpo itself dies (SIGKILL: no cleanup at all): its scorer goes with it (PR_SET_PDEATHSIG)
    os.remove(pidfile)
    p = subprocess.Popen([TOOL], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    p.stdin.write(json.dumps(program_cases(prog(pidfile=pidfile), ["a"])[0]).encode() + b"\n")
    p.stdin.flush()
    first = p.stdout.readline()
    p.kill()
    p.wait()
    time.sleep(0.3)
    pids = [int(x) for x in open(pidfile).read().split()] if os.path.exists(pidfile) else []
    check("program: a killed grpo leaves no scorer running", first and len(pids) == 1 and not alive(pids[0]),
          f"pids {pids} alive {[q for q in pids if alive(q)]}")


def test_errors():
    bad = [(dict(kind="format", params=dict(pattern="(")), "does not compile"),
           (dict(kind="program", params=dict(timeout=1)), "no command"),
           (dict(kind="gsm8k", params=dict(method="loose")), "strict or flexible"),
           (dict(kind="gsm8k", params=dict(pattern="x")), "no param"),
           (dict(kind="program", params=dict(command="true", timeout=0)), "timeout"),
           (dict(kind="boxed", params=dict(score="high")), "finite number"),
           (dict(kind="nope"), "unknown kind")]
    for case, msg in bad:
        case = dict(case, response="r", answer="a")
        p = subprocess.run([TOOL], input=json.dumps(case).encode() + b"\n", capture_output=True)
        err = p.stderr.decode()
        check(f"errors: {msg}", p.returncode == 1 and err.count("\n") == 1 and err.startswith("grpo: error: ")
              and msg in err, f"rc {p.returncode} {err!r}")


def main():
    global TOOL, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--n", type=int, default=20000, help="generated cases per rule kind")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    TOOL, TMP = os.path.abspath(a.tool), os.path.abspath(a.tmp)
    os.makedirs(TMP, exist_ok=True)
    rng = random.Random(a.seed)
    groups = dict(gsm8k=lambda: test_gsm8k(rng, a.n), boxed=lambda: test_boxed(rng, a.n),
                  format=lambda: test_format(rng, a.n // 4), exact=lambda: test_exact(rng, a.n // 10),
                  sum=lambda: test_sum(rng, a.n // 10), think=lambda: test_think(rng, a.n // 10),
                  program=lambda: test_program(rng), errors=test_errors)
    t0 = time.time()
    for name, fn in groups.items():
        if not a.only or name in a.only:
            fn()
    sys.exit(summary(t0))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""guided_regex's automaton (src/rollout/regex_dfa.c) against outside peers, through tests/rollout/regex_tool.

For each of the 47 patterns covering the syntax it takes (literals and escapes, UTF-8, ".", classes and their
negations, \\d \\w \\s and theirs, groups, alternation, every quantifier and its lazy form, counted repeats,
^ and $ at the ends) and every string up to 3 characters over the pattern's alphabet plus each pattern's own
examples and 200 random longer strings:
  full     the automaton ends in a matching state exactly when Python's re.fullmatch(pattern, s, re.ASCII) matches;
  prefix   it has not died exactly when the regex module's fullmatch(..., partial=True) says s begins a match;
  least    its fewest bytes of a match equal the shortest match among those strings (where one is that short),
           and from each state it has, the distance to a match is never more than a tested match shows.
REGEX_ECMA (JSON Schema's "pattern"), 6 patterns of the classes Python and ECMA-262 read differently, every string
up to 3 characters over an alphabet of ASCII and non-ASCII spaces and line terminators:
  ecma     the automaton never matches what JavaScript's RegExp (node, the "u" flag as ajv uses it) does not, and
           matches exactly what it does on the strings without a character it keeps out (non-ASCII spaces, line
           terminators, U+2000-U+207F); Python's {,n}, (?P<name>), \\a, \\U and []...] are refused, ECMA's (?<name>)
           taken.
Patterns it refuses (lookaround, backreferences, \\b, flags, possessive quantifiers, non-ASCII ranges) give an
error naming the construct; malformed ones, which Python's re.compile refuses too, an error as well.
Prints one line per check and `N passed, M failed`; exit 0 iff all pass."""
import argparse
import itertools
import json
import random
import re
import subprocess
import sys
import os

import regex

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import harness  # noqa: E402

PATTERNS = [  # (pattern, alphabet of the enumerated strings, examples)
    (r"abc", "abcx", ["abc"]),
    (r"a|bc|", "abcx", ["bc"]),
    (r"(ab)*c", "abc", ["ababc", "c"]),
    (r"(?:ab)+c?", "abc", ["abab", "ababc"]),
    (r"a?b??c*?", "abc", ["acc", "b"]),
    (r"\d{3}-\d{4}", "01-a9", ["555-1234", "000-0000"]),
    (r"[A-Z][a-z]{2,5} [0-9]+", "Aaz 09", ["Abc 1", "Zzzzzz 1234"]),
    (r"\w+@\w+\.(com|org)", "a_@.co", ["a@b.com", "x_1@y.org"]),
    (r"[^a-c]+", "abcd\n-é", ["xyz", "é\n"]),
    (r"[-a]|[a-]|[]a]|[\]]", "-a]b", ["-", "]"]),
    (r"\s+\S", " \tax\n", [" \t\na"]),
    (r"\W\D", "a1 é_", [" a", "éé"]),
    (r".+", "a\né", ["héllo"]),
    (r"(.|\n){2,3}", "a\né", ["\n\n"]),
    (r"héllo|wörld", "héloöwrd", ["héllo", "wörld"]),
    (r"[éà]x", "éàxa", ["éx", "àx"]),
    (r"\u00e9\x41\n\t", "éA\n\t", ["éA\n\t"]),
    (r"\U0001F600+", "\U0001F600a", ["\U0001F600\U0001F600"]),
    (r"\.\*\+\?\(\)\[\]\{\}\|\\\^\$", ".*+?()[]{}|\\^$", [".*+?()[]{}|\\^$"]),
    (r"a{3}", "ab", ["aaa"]),
    (r"a{2,}", "ab", ["aa", "aaaaaa"]),
    (r"a{,2}b", "ab", ["b", "aab"]),
    (r"(a|b){0,0}c", "abc", ["c"]),
    (r"(ab|a)(bc|c)", "abc", ["abc", "abbc", "ac"]),
    (r"((a|b)c?){2}d", "abcd", ["acbd", "abd"]),
    (r"x{2}?y", "xy", ["xxy"]),
    (r"a{1,3}?", "a", ["a", "aaa"]),
    (r"a{x}", "a{x}", ["a{x}"]),
    (r"^(yes|no)!?$", "yesno!", ["yes!", "no"]),
    (r"(?P<n>\d+)\.\d*", "12.", ["12.", "1.5"]),
    (r"[\d\s]+", "1 a\n", ["1 2\n3"]),
    (r"[^\d\s]+", "1 a\né", ["ab"]),
    (r"[\w.-]+", "a.-!", ["a.b-c"]),
    (r"(\(\d\))?\d{2}", "(1)2", ["(1)23", "12"]),
    (r'\{"a": (true|false)\}', '{"a: truefls}', ['{"a": true}']),
    (r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?", "-0.1e+5", ["-0.5e+10", "12", "0"]),
    (r"(a*)*b", "ab", ["b", "aab"]),
    (r"(a|aa)+$", "a", ["aaaa"]),
    (r"", "ab", [""]),
    (r"()|a", "a", ["", "a"]),
    (r"[a-c][x-z]?|q", "acxzq", ["cz", "q"]),
    (r"\\d", "\\d1", ["\\d"]),
    (r"[\\]", "\\a", ["\\"]),
    (r"[\x41-\x43]+", "ABCD", ["CAB"]),
    (r".{280}", "a\né", ["é" * 280]),  # counted runs of UTF-8 characters: thousands of states
    (r'"[^"]{0,500}"', 'a"é', ['"' + "é" * 500 + '"']),
    (r"[^\n]{1,200}\n", "a\né", ["é" * 200 + "\n"]),
]
# The regex module's partial matching errs with lazy quantifiers (it takes "---a" to begin a match of "-{3,}?é"):
# the greedy form, the same full matches, is its pattern for those.
GREEDY = {r"a?b??c*?": r"a?b?c*", r"x{2}?y": r"x{2}y", r"a{1,3}?": r"a{1,3}"}
REFUSED = [  # patterns grpo refuses, and a word its error names
    (r"a(?=b)", "(?="), (r"(?!a)b", "(?!"), (r"(?<=a)b", "(?<"), (r"(a)\1", "\\1"), (r"\bword\b", "\\b"),
    (r"(?i)abc", "(?i"), (r"a*+", "possessive"), (r"[à-é]+x", None), (r"[^é]", "negated"), (r"a^b", "^"),
    (r"a$b", "$"), (r"\Aab\Z", "\\A"), (r"a{1001}", "1000"), (r"(?P=n)", "(?P"), (r"\p{L}", "\\p"),
]
MALFORMED = ["{1}a", "(", "a)", "[a", "[é", "*a", "a**", "a{3,2}", "+", "a|*", "\\", "[b-a]", "(?P<n", "\\x4",
             "\\u12", "^*", "^{2}", "[\\d-z]", "(?P<>a)", "(?P<1>a)", "(?P<a)b>c)"]


ECMA = [r".+", r"\S\s", r"[^a]\W", r"a.|\D+", r"[\s\S]*", r"\w\S?"]
ECMA_ALPHABET = "a1 \r\n\t\u00a0\u2028\u2029\u3000\ufeff\u1680\u2014\u00e9\u20ac"


def ecma_out(c):
    """Whether REGEX_ECMA keeps c out of its wide classes (U+00A0, U+1680, U+2000-U+207F, U+3000, U+FEFF)."""
    return c in "\u00a0\u1680\u3000\ufeff" or "\u2000" <= c <= "\u207f"


ECMA_REFUSED = [(r"a{,3}", "{,n}"), (r"(?P<n>a)", "(?P"), (r"\a", "\\a"), (r"\U0001F600", "\\U"), (r"[]a]", "[]"),
                (r"(?<=a)b", "(?<")]
# Products (regex_intersect, as a schema's pattern, format and lengths are combined) over an alphabet, and the
# longest match (regex_longest; None: no bound), each against Python's re on every string up to 7 characters.
PRODUCTS = [(r"[a-c]+", r"a{1,3}b?", "abc"), (r"(ab|c)*", r"[abc]{0,4}", "abc"), (r"a*b*", r"b*a*", "ab"),
            (r"[ab]{2,4}", r"a+b?|b", "ab"), (r"[a-c]*a", r"c[a-c]*", "abc"), (r"é?[ab]", r"[éab]{2}", "éab")]
ECMA_TAKEN = [(r"(?<n>a)b", ["ab"]), (r"a{0,2}", ["", "aa"])]
JS_FULL = """let s = ""; process.stdin.on("data", d => s += d).on("end", () => {
  const out = JSON.parse(s).map(([p, ss]) => { const re = new RegExp("^(?:" + p + ")$", "u");
                                               return ss.map(x => re.test(x)); });
  process.stdout.write(JSON.stringify(out)); });"""


def run(tool, items, ecma=False, and_=None):
    inp = "".join(json.dumps({"pattern": p, "strings": ss, "ecma": ecma, "and": and_}) + "\n" for p, ss in items)
    p = subprocess.run([tool], input=inp, capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise AssertionError(f"regex_tool exited {p.returncode}: {p.stderr[-1000:]}")
    return [json.loads(line) for line in p.stdout.splitlines()]


def strings_for(alphabet, examples, rng):
    chars = sorted(set(alphabet))
    out = {""}
    for n in range(1, 4):
        out |= {"".join(rng.choice(chars) for _ in range(n)) for _ in range(400)}
    for e in examples:  # each example and its prefixes (at character boundaries), and with a character more
        out |= {e[:i] for i in range(len(e) + 1)} | {e + c for c in chars}
    out |= {"".join(rng.choice(chars) for _ in range(rng.randint(4, 12))) for _ in range(200)}
    return sorted(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    a = ap.parse_args()
    rng = random.Random(7)
    items = [(p, strings_for(al, ex, rng)) for p, al, ex in PATTERNS]
    results = run(a.tool, items)
    bad_full, bad_prefix, bad_least, bad_dist, errors, states = [], [], [], [], [], []
    for (p, ss), r in zip(items, results):
        if "error" in r:
            errors.append((p, r["error"]))
            continue
        states.append(r["states"])
        full = [re.fullmatch(p, s, re.ASCII) is not None for s in ss]
        prefix = [regex.fullmatch(GREEDY.get(p, p), s, flags=regex.ASCII, partial=True) is not None for s in ss]
        ours_full = [w >= 0 and dd == 0 for w, dd in zip(r["walk"], r["dist"])]
        ours_prefix = [w >= 0 for w in r["walk"]]
        bad_full += [(p, s) for s, x, y in zip(ss, full, ours_full) if x != y]
        bad_prefix += [(p, s) for s, x, y in zip(ss, prefix, ours_prefix) if x != y]
        lengths = [len(s.encode()) for s, m in zip(ss, full) if m]
        shortest = min(lengths, default=None)
        if shortest is not None and shortest <= 3 and shortest != r["least"]:  # every string that short was tried
            bad_least.append((p, r["least"], shortest))
        for s, w, dd in zip(ss, r["walk"], r["dist"]):
            longer = [len(t.encode()) - len(s.encode()) for t, m in zip(ss, full) if m and t.startswith(s)]
            if w >= 0 and longer and dd > min(longer):
                bad_dist.append((p, s, dd, min(longer)))
    n = sum(len(ss) for _, ss in items)
    harness.check(f"all {len(PATTERNS)} supported patterns compile (states: {min(states, default=0)} to "
                  f"{max(states, default=0)})", not errors, str(errors[:5]))
    harness.check(f"full matches of {n} strings equal Python's re.fullmatch (re.ASCII)", not bad_full,
                  str(bad_full[:8]))
    harness.check(f"the automaton lives on exactly the prefixes of matches (the regex module's partial=True)",
                  not bad_prefix, str(bad_prefix[:8]))
    harness.check("the fewest bytes of a match equal the shortest match found by re", not bad_least,
                  str(bad_least[:8]))
    harness.check("no state's distance to a match exceeds a match the strings show", not bad_dist,
                  str(bad_dist[:8]))
    strings = [""] + ["".join(t) for n in (1, 2, 3) for t in itertools.product(ECMA_ALPHABET, repeat=n)]
    ours = run(a.tool, [(p, strings) for p in ECMA], ecma=True)
    js = json.loads(subprocess.run(["node", "-e", JS_FULL], input=json.dumps([(p, strings) for p in ECMA]),
                                   capture_output=True, text=True, timeout=120, check=True).stdout)
    wrong = [(p, s, w >= 0 and dd == 0, j) for p, r, jj in zip(ECMA, ours, js)
             for s, w, dd, j in zip(strings, r["walk"], r["dist"], jj)
             if (w >= 0 and dd == 0) != j and (not j or not any(ecma_out(c) for c in s))]
    harness.check(f"REGEX_ECMA on {len(ECMA)} patterns x {len(strings)} strings: never a match JavaScript's RegExp "
                  "refuses, the same matches where no character it keeps out is", not wrong, str(wrong[:8]))
    refused = run(a.tool, [(p, []) for p, _ in ECMA_REFUSED], ecma=True)
    taken = run(a.tool, ECMA_TAKEN, ecma=True)
    wrong = [(p, r) for (p, word), r in zip(ECMA_REFUSED, refused) if word not in r.get("error", "")]
    wrong += [(p, r) for (p, ss), r in zip(ECMA_TAKEN, taken) if "error" in r or r["dist"] != [0] * len(ss)]
    harness.check(f"REGEX_ECMA refuses {len(ECMA_REFUSED)} constructs of Python's that ECMA-262 reads otherwise, "
                  "naming each, and takes ECMA's named groups", not wrong, str(wrong))
    bad = []
    for p, q, alphabet in PRODUCTS:
        strings = [""] + ["".join(t) for n in range(1, 8) for t in itertools.product(alphabet, repeat=n)]
        r, = run(a.tool, [(p, strings)], and_=q)
        ours = [w >= 0 and dd == 0 for w, dd in zip(r.get("walk", []), r.get("dist", []))]
        python = [bool(re.fullmatch(p, s) and re.fullmatch(q, s)) for s in strings]
        longest = max((len(s.encode()) for s, m in zip(strings, python) if m), default=-1)
        unbounded = any(m and len(s) == 7 for s, m in zip(strings, python))
        if ours != python or r["longest"] != (-1 if unbounded else longest):
            bad.append((p, q, r.get("error"), r.get("longest"), longest, unbounded))
    harness.check(f"{len(PRODUCTS)} products of two patterns match exactly what both do (re.fullmatch) on every "
                  "string up to 7 characters, and their longest match is the longest there (no bound where one "
                  "has 7)", not bad, str(bad))
    refused = run(a.tool, [(p, []) for p, _ in REFUSED])
    wrong = [(p, r) for (p, word), r in zip(REFUSED, refused)
             if "error" not in r or (word and word not in r["error"])]
    harness.check(f"{len(REFUSED)} unsupported constructs are refused, each error naming it", not wrong,
                  str(wrong))
    malformed = run(a.tool, [(p, []) for p in MALFORMED])
    python_ok = []
    for p in MALFORMED:
        try:
            re.compile(p)
            python_ok.append(p)
        except re.error:
            pass
    harness.check(f"{len(MALFORMED)} malformed patterns, each refused by Python's re.compile, are errors here",
                  not python_ok and all("error" in r for r in malformed),
                  f"python took {python_ok}; {[(p, r) for p, r in zip(MALFORMED, malformed) if 'error' not in r]}")
    sys.exit(harness.summary())


if __name__ == "__main__":
    main()

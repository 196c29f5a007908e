"""The test scripts' shared harness: check() prints a PASS/FAIL line per check, group() runs a group of
checks, summary() prints the final `N passed, M failed` line and returns the exit status."""
import sys
import time
import traceback

RESULTS = []  # (name, ok) per check, in order


def check(name, ok, detail=""):
    RESULTS.append((name, bool(ok)))
    print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  [{detail}]" if detail else ""))
    sys.stdout.flush()


def group(name, fn):
    """Run one group of checks; an exception fails the group and the rest still run."""
    t0 = time.time()
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        check(name, False, f"{type(e).__name__}: {str(e)[:1500]} @ {traceback.format_exc().splitlines()[-3][:200]}")
    print(f"----  {name}: {time.time() - t0:.1f}s")
    sys.stdout.flush()


def run_groups(setup, groups, only=None):
    """setup(), then each (name, fn) of groups (pairs, or a dict) that `only` (None: all) names; the summary."""
    t0 = time.time()
    group("setup", setup)
    for name, fn in (groups.items() if isinstance(groups, dict) else groups):
        if not only or name in only:
            group(name, fn)
    return summary(t0)


def summary(t0=None):
    """Print `N passed, M failed` (and the seconds since t0); 0 iff at least one check ran and all passed, else 1."""
    passed = sum(ok for _, ok in RESULTS)
    took = f"  ({time.time() - t0:.1f}s)" if t0 is not None else ""
    print(f"{passed} passed, {len(RESULTS) - passed} failed{took}")
    return 0 if RESULTS and passed == len(RESULTS) else 1


def median_abs(a, b):
    """The median |x - y| over the paired items of two lists of rows (log-probs per sequence): where a flipped
    rounding moves a few tokens far, the median shows whether the rest agree."""
    flat = sorted(abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v))
    return flat[len(flat) // 2]

#!/usr/bin/env python3
"""Do two bench-agent.sh runs agree? Every ratio of the first run beside the second's.

    python3 scripts/bench-agree.py target/bench-agent-run1.json target/bench-agent-run2.json

A ratio agrees when the two values differ by at most 20% of their mean (AGREE_TOLERANCE to
change it). Prints a table and a verdict per ratio; exits 1 only when a file cannot be read.
"""
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)["ratios"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"bench-agree: cannot read the ratios of {path}: {e}; run scripts/bench-agent.sh with BENCH_OUT={path}")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tolerance = float(os.environ.get("AGREE_TOLERANCE", "0.2"))
    a, b = load(sys.argv[1]), load(sys.argv[2])
    keys = [k for k in a if k in b]
    missing = sorted(set(a) ^ set(b))
    width = max(len(a[k]["what"]) for k in keys)
    print(f"{'ratio':<{width}}  {'run 1':>10}  {'run 2':>10}  {'differ':>7}  within {tolerance:.0%}")
    agree = 0
    for k in keys:
        x, y = float(a[k]["value"]), float(b[k]["value"])
        mean = (x + y) / 2
        diff = abs(x - y) / mean if mean else 0.0
        ok = diff <= tolerance
        agree += ok
        print(f"{a[k]['what']:<{width}}  {x:>10.3f}  {y:>10.3f}  {diff:>7.1%}  {'MET' if ok else 'NOT MET'}")
    print(f"{agree} of {len(keys)} ratios agree within {tolerance:.0%}")
    if missing:
        print(f"in one run only: {', '.join(missing)}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Do two bench-agent.sh runs agree? Every ratio of the first run beside the second's.

    python3 scripts/bench-agree.py target/bench-agent-run1.json target/bench-agent-run2.json

A ratio agrees when the two values differ by at most 20% of their mean (AGREE_TOLERANCE to
change it). Prints a table and a verdict per ratio. Exits 1 when a file cannot be read, and
with --strict also when a ratio does not agree (for a CI job that gates on it).
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
    args = [a for a in sys.argv[1:] if a != "--strict"]
    strict = len(args) != len(sys.argv) - 1
    if len(args) != 2:
        sys.exit(__doc__)
    tolerance = float(os.environ.get("AGREE_TOLERANCE", "0.2"))
    a, b = load(args[0]), load(args[1])
    keys = [k for k in a if k in b]
    if not keys:
        sys.exit(f"bench-agree: {args[0]} and {args[1]} share no ratio: are both from scripts/bench-agent.sh?")
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
    if strict and agree < len(keys):
        sys.exit(1)


if __name__ == "__main__":
    main()

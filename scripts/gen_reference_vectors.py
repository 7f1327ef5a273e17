#!/usr/bin/env python3
"""Generate reference vectors for omen-signals from the real reference libraries.

sacreBLEU (sentence BLEU, 13a tokenisation), numpy (softmax entropy, std ddof=0,
percentiles), pandas (Series.skew) and scipy (theilslopes) compute the expected
values; the Rust tests in crates/omen-signals/tests/ compare against them.

Usage:
    python3 scripts/gen_reference_vectors.py            # (re)write the fixtures
    python3 scripts/gen_reference_vectors.py --check    # fail if they differ

The pinned versions live in scripts/requirements-reference.txt; `make fixtures`
creates the venv and runs this script.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import sacrebleu
import scipy
from sacrebleu.metrics.bleu import BLEU
from scipy.stats import theilslopes

OUT_DIR = Path(__file__).resolve().parent.parent / "crates" / "omen-signals" / "tests" / "fixtures"

# Window-score constants from DESIGN.md.
STD_EPSILON = 1e-8
SKEW_WEIGHT = 0.3


def versions() -> dict:
    return {
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "sacrebleu": sacrebleu.__version__,
        "scipy": scipy.__version__,
    }


# ---------------------------------------------------------------- BLEU / repetition

HANDWRITTEN_BLEU = [
    ("The cat sat on the mat.", ["The cat sat on the mat."]),
    ("The cat sat on a mat.", ["The cat sat on the mat."]),
    ("the the the the the the", ["The cat sat on the mat."]),
    ("", ["The cat sat on the mat."]),
    ("A cat.", [""]),
    ("Paris is the capital of France.", ["The capital of France is Paris."]),
    ("It costs $3.50, or 1,000 yen.", ["It costs $3.50 or 1,000 yen."]),
    ("Version 2.0.1 was released in 2024-05-03.", ["Version 2.0.1 was released on 2024-05-03."]),
    ("5-3=2 and x-y; a - b", ["5-3=2 and x-y; a - b"]),
    ("Use &quot;quotes&quot; &amp; &lt;tags&gt; &amp;lt;", ['Use "quotes" & <tags> &lt;']),
    ("split-\nword and <skipped> tokens", ["splitword and tokens"]),
    ("trailing hyphen-\n", ["trailing hyphen-"]),
    ("a-<skipped>\n", ["a-"]),
    ("<ski-\npped> stays", ["<skipped> stays"]),
    ("Hello,world.Hello , world .", ["Hello, world. Hello, world."]),
    ("tabs\tand\x1cunit\x1fseparators\u00a0nbsp\u3000ideographic", ["tabs and unit separators nbsp ideographic"]),
    ("Ünïcödé — “smart quotes” … café", ["Ünïcödé — “smart quotes” … café"]),
    ("(parens) [brackets] {braces} ~tilde `tick` ^caret |pipe| \\back/slash", ["(parens) [brackets] {braces}"]),
    ("e.g. i.e., U.S.A. 3.,4 .5 ,6", ["e.g. i.e., U.S.A. 3.,4 .5 ,6"]),
    ("one two three", ["one two three four", "one two", "three two one"]),
    ("the quick brown fox jumps over the lazy dog", ["a quick brown fox jumped over a lazy dog", "the fast brown fox leaps over the lazy dog"]),
    ("I don't know, it's O'Neil's.", ["I do not know, it is O'Neil's."]),
    ("   leading and trailing spaces   \n\n", ["leading and trailing spaces"]),
    ("answer: 42\n\nanswer: 42\nanswer: 42", ["answer: 42"]),
]

ALPHABET = list("abcde xyz XY 0123456789 .,.,-- ;:!?'\"()&<>$%/\\\t\n") + [
    "&amp;", "&quot;", "&lt;", "&gt;", "<skipped>", "-\n", "é", "—", "\u00a0", "\x1c",
    " the ", " cat ", " sat ", " mat ", "3.14", "1,000",
]
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "fast", "3.5", "1,2", "x-y", "don't", "Hi!", "(ok)"]


def random_text(rng: random.Random, pieces: int) -> str:
    out = []
    for _ in range(pieces):
        if rng.random() < 0.6:
            out.append(rng.choice(WORDS) + rng.choice([" ", " ", " ", ". ", ", ", "\n", "-\n", ""]))
        else:
            out.append(rng.choice(ALPHABET))
    return "".join(out)


def tokenize_13a(text: str) -> list[str]:
    # Exactly what BLEU._preprocess_segment does for the default settings.
    return BLEU(tokenize="13a").tokenizer(text.rstrip()).split()


def repetition_ratio(tokens: list[str]) -> float:
    trigrams = [tuple(tokens[i : i + 3]) for i in range(len(tokens) - 2)]
    if not trigrams:
        return 0.0
    return 1.0 - len(set(trigrams)) / len(trigrams)


def bleu_cases() -> list[dict]:
    rng = random.Random(20261202)
    cases = list(HANDWRITTEN_BLEU)
    for i in range(400):
        ref = random_text(rng, rng.randint(0, 30))
        if rng.random() < 0.5:
            # a perturbed copy of the reference: realistic partial overlap
            words = ref.split(" ")
            rng.shuffle(words[: max(1, len(words) // 3)])
            hyp = " ".join(words) + random_text(rng, rng.randint(0, 5))
        else:
            hyp = random_text(rng, rng.randint(0, 30))
        refs = [ref] + ([random_text(rng, rng.randint(0, 20))] if i % 7 == 0 else [])
        cases.append((hyp, refs))
    out = []
    for hyp, refs in cases:
        s = sacrebleu.sentence_bleu(hyp, refs)
        tokens = tokenize_13a(hyp)
        out.append(
            {
                "hypothesis": hyp,
                "references": refs,
                "score": s.score,
                "precisions": list(s.precisions),
                "brevity_penalty": s.bp,
                "sys_len": s.sys_len,
                "ref_len": s.ref_len,
                "counts": list(s.counts),
                "totals": list(s.totals),
                "hypothesis_tokens": tokens,
                "repetition_ratio": repetition_ratio(tokens),
            }
        )
    return out


# ---------------------------------------------------------------- TLE

def entropy_bits_f64(logits: np.ndarray) -> float:
    x = logits.astype(np.float64)
    x = x[np.isfinite(x)]
    m = x.max()
    z = np.exp(x - m)
    p = z / z.sum()
    nz = p[p > 0]
    return float(-(nz * np.log2(nz)).sum())


def tle_cases() -> dict:
    rng = np.random.default_rng(7)
    full = []
    shapes = [
        ("peaked", 32000, lambda n: rng.normal(0, 2, n).astype(np.float32) + np.where(np.arange(n) == 17, 25, 0).astype(np.float32)),
        ("flat", 4096, lambda n: np.zeros(n, np.float32)),
        ("gaussian", 32000, lambda n: rng.normal(0, 3, n).astype(np.float32)),
        ("large_offset", 5000, lambda n: (rng.normal(0, 1, n) + 1000).astype(np.float32)),
        ("wide_range", 3000, lambda n: rng.uniform(-200, 60, n).astype(np.float32)),
        ("single", 1, lambda n: np.array([3.5], np.float32)),
        ("two_equal", 2, lambda n: np.array([-1.0, -1.0], np.float32)),
        ("masked", 1000, lambda n: np.where(rng.random(n) < 0.3, -np.inf, rng.normal(0, 2, n)).astype(np.float32)),
    ]
    for name, n, make in shapes:
        x = make(n)
        # JSON has no -inf: encode masked logits as null.
        values = [None if not np.isfinite(v) else float(v) for v in x]
        full.append({"name": name, "logits": values, "entropy_bits": entropy_bits_f64(x)})

    topk = []
    for i in range(60):
        vocab = int(rng.choice([50, 1000, 32000, 128256]))
        k = int(rng.integers(1, 21))
        logits = rng.normal(0, rng.uniform(0.5, 6), vocab)
        logits[rng.integers(vocab)] += rng.uniform(0, 15)
        lse = np.logaddexp.reduce(logits)
        logprobs = np.sort(logits - lse)[::-1][:k]
        p = np.exp(logprobs)
        known = p.sum()
        residual = max(0.0, 1.0 - known)
        h_k = float(-(p * np.log2(p)).sum())
        p_min = p.min()
        lower = h_k + residual * math.log2(1.0 / p_min) if residual > 0 else h_k
        upper = h_k + residual * math.log2((vocab - k) / residual) if residual > 0 else h_k
        full_h = entropy_bits_f64(logits)
        topk.append(
            {
                "vocab_size": vocab,
                "logprobs": [float(v) for v in logprobs],
                "known_mass": float(known),
                "residual_mass": residual,
                "lower_bits": lower,
                "upper_bits": max(upper, lower),
                "true_entropy_bits": full_h,
            }
        )
    return {"full": full, "topk": topk}


# ---------------------------------------------------------------- window score

def window_series() -> list[tuple[str, np.ndarray, int]]:
    rng = np.random.default_rng(42)
    n = 4000
    t = np.arange(n)
    spikes = rng.normal(0, 1, n)
    spikes[rng.integers(0, n, 25)] += rng.choice([-40, 60, 300], 25)
    near_const = 1.0 + np.where(rng.random(n) < 0.05, rng.normal(0, 1e-9, n), 0.0)
    steps = np.repeat(rng.normal(0, 5, n // 200), 200)
    quantised = np.round(rng.normal(0.5, 0.2, n) * 16) / 16
    const_runs = np.where((t // 300) % 2 == 0, 0.75, np.round(rng.normal(3, 1, n), 1))
    return [
        ("gaussian", rng.normal(0, 1, n), 60),
        ("random_walk_offset", 1e6 + np.cumsum(rng.normal(0, 1, n)), 60),
        ("spikes", spikes, 30),
        ("near_constant", near_const, 50),
        ("steps", steps, 20),
        ("quantised", quantised, 64),
        ("constant_runs", const_runs, 40),
        ("seasonal_trend", 50 + 0.01 * t + 10 * np.sin(2 * np.pi * t / 288) + rng.normal(0, 0.5, n), 96),
        ("lognormal_latency", rng.lognormal(-3, 0.6, n), 3),
    ]


def window_cases() -> list[dict]:
    out = []
    for name, x, w in window_series():
        z_col, skew_col, score_col, std_col, mean_col = [], [], [], [], []
        for i in range(w, len(x)):
            win = x[i - w : i]
            mean = win.mean()
            std = win.std(ddof=0)
            skew = pd.Series(win).skew()
            # pandas >= 3.1 returns NaN for a degenerate window (all values equal); omen's
            # definition (docs/signals.md) takes the skew term as 0 there.
            if win.max() == win.min():
                assert math.isnan(skew), (name, i, skew)
                skew = 0.0
            z = abs(x[i] - mean) / (std + STD_EPSILON)
            z_col.append(float(z))
            skew_col.append(float(skew))
            score_col.append(float(z + SKEW_WEIGHT * abs(skew)))
            std_col.append(float(std))
            mean_col.append(float(mean))
        out.append(
            {
                "name": name,
                "window": w,
                "values": [float(v) for v in x],
                "mean": mean_col,
                "std": std_col,
                "z": z_col,
                "skew": skew_col,
                "score": score_col,
            }
        )
    return out


# ---------------------------------------------------------------- trend and quantiles

def theil_sen_cases() -> list[dict]:
    rng = np.random.default_rng(3)
    cases = []
    specs = [
        ("linear_noise", np.arange(30.0), lambda x: 2.0 + 0.5 * x + rng.normal(0, 1, x.size)),
        ("outliers", np.arange(40.0), lambda x: 10 - 0.2 * x + np.where(rng.random(x.size) < 0.1, 30, 0)),
        ("ties_in_x", np.repeat(np.arange(10.0), 3), lambda x: 1.0 + 0.3 * x + rng.normal(0, 0.2, x.size)),
        ("ties_in_y", np.arange(25.0), lambda x: np.round(0.1 * x + rng.normal(0, 0.3, x.size))),
        ("flat", np.arange(14.0), lambda x: np.full(x.size, 3.0)),
        ("short", np.array([0.0, 1.0, 2.0]), lambda x: np.array([1.0, 3.0, 2.0])),
        ("daily_kv_usage", np.arange(28.0), lambda x: 0.55 + 0.01 * x + rng.normal(0, 0.01, x.size)),
        ("irregular_x", np.sort(rng.uniform(0, 60, 45)), lambda x: 100 - 1.5 * x + rng.normal(0, 5, x.size)),
    ]
    for name, x, f in specs:
        y = f(x)
        for alpha in (0.95, 0.9):
            r = theilslopes(y, x, alpha=alpha)
            cases.append(
                {
                    "name": name,
                    "confidence": alpha,
                    "x": [float(v) for v in x],
                    "y": [float(v) for v in y],
                    "slope": float(r.slope),
                    "intercept": float(r.intercept),
                    "low_slope": float(r.low_slope),
                    "high_slope": float(r.high_slope),
                }
            )
    return cases


def quantile_cases() -> list[dict]:
    rng = np.random.default_rng(11)
    cases = []
    for n in (1, 2, 5, 100, 1001):
        data = rng.lognormal(0, 1, n)
        qs = [0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0]
        cases.append(
            {
                "data": [float(v) for v in data],
                "q": qs,
                "expected": [float(np.quantile(data, q, method="linear")) for q in qs],
            }
        )
    return cases


# ---------------------------------------------------------------- main

def render(obj) -> str:
    return json.dumps(obj, indent=None, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"


# numpy's SIMD reductions (sum, log) differ in the last bit between CPUs (AVX2 vs AVX-512),
# so --check compares numbers to this relative tolerance; everything else must be equal.
CHECK_REL_TOL = 1e-12


def same_values(a, b) -> bool:
    """Equal structure and strings; floats equal to CHECK_REL_TOL relative."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return False
        return abs(a - b) <= CHECK_REL_TOL * max(abs(a), abs(b)) or a == b
    return a == b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed fixtures instead of writing")
    args = parser.parse_args()

    fixtures = {
        "bleu.json": {"generator": versions(), "cases": bleu_cases()},
        "tle.json": {"generator": versions(), **tle_cases()},
        "window.json": {"generator": versions(), "std_epsilon": STD_EPSILON, "skew_weight": SKEW_WEIGHT, "cases": window_cases()},
        "theil_sen.json": {"generator": versions(), "cases": theil_sen_cases()},
        "quantile.json": {"generator": versions(), "cases": quantile_cases()},
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    stale = []
    for name, obj in fixtures.items():
        text = render(obj)
        path = OUT_DIR / name
        if args.check:
            if not path.exists() or not same_values(json.loads(path.read_text(encoding="utf-8")), json.loads(text)):
                stale.append(str(path))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path} ({len(text)} bytes)")
    if stale:
        print("reference fixtures differ from what the pinned libraries compute:", file=sys.stderr)
        for p in stale:
            print(f"  {p}", file=sys.stderr)
        print("fix: run `make fixtures` and commit the result (or restore the pinned versions in "
              "scripts/requirements-reference.txt)", file=sys.stderr)
        return 1
    if args.check:
        print(f"reference fixtures: {len(fixtures)} files match the pinned reference libraries")
    return 0


if __name__ == "__main__":
    sys.exit(main())

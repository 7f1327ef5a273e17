#!/usr/bin/env python3
"""Packs the project's SKAB copy into data/skab: what the SKAB tests and evaluation read, gzipped.

Usage: scripts/pack-skab.py [SOURCE] [DEST]   (defaults: ../shared/data/skab, data/skab)

Kept: data/<folder>/<n>.csv (every column: the LSTM-AE trains on the sensors),
published/<algorithm>/<folder>/<n>.csv (the leaderboard detectors' predictions),
published-scores.jsonl (what SKAB's own scorer gives on them), LICENSE (GPL-3.0, the
data's) and README.md. CSVs are gzipped with mtime 0, so a re-run changes no byte.
"""
import gzip
import shutil
import sys
from pathlib import Path


def write_gz(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(src.read_bytes())


def main() -> None:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/skab")
    dest = Path(sys.argv[2] if len(sys.argv) > 2 else "data/skab")
    if not (src / "published-scores.jsonl").is_file():
        sys.exit(f"{src}: no published-scores.jsonl; pass the SKAB copy as the first argument")
    n = 0
    for part in ("data", "published"):
        for f in sorted((src / part).rglob("*.csv")):
            write_gz(f, dest / f.relative_to(src).with_suffix(".csv.gz"))
            n += 1
    for name in ("published-scores.jsonl", "LICENSE", "README.md"):
        shutil.copyfile(src / name, dest / name)
    print(f"packed {n} CSVs from {src} into {dest}")


if __name__ == "__main__":
    main()

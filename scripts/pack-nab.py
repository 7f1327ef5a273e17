#!/usr/bin/env python3
"""Packs a NAB checkout into data/nab: what the tests and the NAB evaluation read, gzipped.

Usage: scripts/pack-nab.py [SOURCE] [DEST]   (defaults: ../shared/data/nab, data/nab)

Kept: data/<category>/<file>.csv (gzipped), labels/, config/, README.md, LICENSE.txt,
results/final_results.json, and for each published detector in DETECTORS its per-file
score tables (plain) and per-row results reduced to the columns the port reads
(timestamp, anomaly_score; numenta also raw_score, which HtmLikelihood's test replays).
The per-row S(t) and label columns are dropped: the port recomputes them.
"""
import csv
import gzip
import io
import shutil
import sys
from pathlib import Path

DETECTORS = ["ARTime", "numenta", "contextOSE", "null"]
ROW_COLUMNS = {"numenta": ["timestamp", "anomaly_score", "raw_score"]}
DEFAULT_COLUMNS = ["timestamp", "anomaly_score"]


def write_gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0: the same input packs to the same bytes, so a re-run shows no git change.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(text.encode())


def columns_of(src: Path, keep: list[str]) -> str:
    with open(src, newline="") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    missing = [c for c in keep if c not in header]
    if missing:
        sys.exit(f"{src}: no column {missing}; is this an unmodified NAB results file?")
    idx = [header.index(c) for c in keep]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for r in rows:
        if r:
            w.writerow([r[i] for i in idx])
    return out.getvalue()


def main() -> None:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/nab")
    dest = Path(sys.argv[2] if len(sys.argv) > 2 else "data/nab")
    if not (src / "labels/combined_windows.json").is_file():
        sys.exit(f"{src}: not a NAB checkout (no labels/combined_windows.json); pass its path")
    if dest.exists():
        shutil.rmtree(dest)
    for name in ["README.md", "LICENSE.txt", "labels", "config", "results/final_results.json"]:
        s, d = src / name, dest / name
        d.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if s.is_dir() else shutil.copy)(s, d)
    files = sorted(p.relative_to(src / "data") for p in (src / "data").glob("*/*.csv"))
    for rel in files:
        write_gz(dest / "data" / f"{rel}.gz", (src / "data" / rel).read_text())
    for det in DETECTORS:
        (dest / "results" / det).mkdir(parents=True, exist_ok=True)
        for table in sorted((src / "results" / det).glob(f"{det}_*_scores.csv")):
            shutil.copy(table, dest / "results" / det / table.name)
        keep = ROW_COLUMNS.get(det, DEFAULT_COLUMNS)
        for rel in files:
            row_file = src / "results" / det / rel.parent / f"{det}_{rel.name}"
            if not row_file.is_file():
                sys.exit(f"{row_file}: missing; the NAB checkout lacks {det}'s result for {rel}")
            write_gz(dest / "results" / det / rel.parent / f"{det}_{rel.name}.gz", columns_of(row_file, keep))
    print(f"packed {len(files)} data files and {len(DETECTORS)} detectors' results into {dest}")


if __name__ == "__main__":
    main()

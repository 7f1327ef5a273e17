#!/usr/bin/env python3
"""Write the embedded demo traces under deploy/traces/ (deterministic).

Default: deploy/traces/demo-degradation.jsonl.gz, 35 days (5 weeks) at
10-minute resolution of one vLLM-like replica with a daily cycle and quieter
weekends: KV usage creeps up until its daily p95 crosses the 0.95 SLO in the
fifth week (the forecast should warn about 14 days before), KV fragmentation
creeps towards its 1.8 SLO (crossed after the trace ends, so it is warned of in
the last days), a slow VRAM leak and a TTFT drift stay far from their SLOs,
and on day 20.5 a silent model change shifts TLE and RCI (an abrupt fault the
window scores should flag, kept as a lasting change). `make run` replays it.

--healthy: deploy/traces/demo-healthy.jsonl.gz, the same shape (same signals,
labels, days and step) of a healthy replica: no drift beyond noise and no
model change (KV usage flat around 0.55, KVF flat around 1.15, VRAM and TTFT
flat, TLE and RCI steady). scripts/test-e2e.sh replays it and expects no alert.
"""

import argparse
import gzip
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

TRACES = Path(__file__).resolve().parent.parent / "deploy" / "traces"
OUT = TRACES / "demo-degradation.jsonl.gz"
OUT_HEALTHY = TRACES / "demo-healthy.jsonl.gz"
START = int(datetime(2026, 11, 2, tzinfo=timezone.utc).timestamp() * 1000)
STEP_MS = 10 * 60_000
DAYS = 35
CHANGE_DAY = 20.5
# 2026-11-02 is a Monday: days 5, 6, 12, 13, ... are weekend days with less traffic.
WEEKEND = (5, 6)


def degradation() -> list[str]:
    rng = np.random.default_rng(2026)
    steps = DAYS * 24 * 6
    lines = []
    for i in range(steps):
        ts = START + i * STEP_MS
        day = i / (24 * 6)
        daily = math.sin(2 * math.pi * (day % 1.0) - math.pi / 2)  # low at night, high mid-day
        weekend = int(day) % 7 in WEEKEND
        out = []
        for layer in range(4):
            usage = 0.55 + 0.011 * day - (0.025 if weekend else 0.0) + 0.06 * daily + rng.normal(0, 0.01)
            out.append(("kvcache_usage_ratio", {"gpu": "0", "layer": str(layer)}, min(max(usage, 0.0), 1.0)))
            kvf = 1.12 + (0.011 + 0.001 * layer) * day + abs(rng.normal(0, 0.02))
            out.append(("kv_fragmentation", {"gpu": "0", "layer": str(layer)}, max(kvf, 1.0)))
        ttft = 0.08 * (1 + 0.02 * day) * (1 + 0.25 * max(daily, 0)) * math.exp(rng.normal(0, 0.15))
        out.append(("canary_ttft_seconds", {"canary": "capital"}, ttft))
        changed = day >= CHANGE_DAY
        out.append(("tle_bits", {"canary": "capital"}, (1.45 if changed else 1.20) + rng.normal(0, 0.004)))
        out.append(("rci", {"canary": "capital"}, min(max((0.22 if changed else 0.08) + rng.normal(0, 0.01), 0.0), 1.0)))
        out.append(("gpu_memory_used_bytes", {"gpu": "0"}, 60e9 + 0.25e9 * day + rng.normal(0, 0.05e9)))
        out.append(("gpu_memory_total_bytes", {"gpu": "0"}, 80e9))
        for signal, labels, value in out:
            lines.append(line(ts, signal, labels, value))
    return lines


def healthy() -> list[str]:
    rng = np.random.default_rng(2027)
    steps = DAYS * 24 * 6
    lines = []
    for i in range(steps):
        ts = START + i * STEP_MS
        day = i / (24 * 6)
        daily = math.sin(2 * math.pi * (day % 1.0) - math.pi / 2)
        out = []
        for layer in range(4):
            usage = 0.55 + 0.02 * daily + rng.normal(0, 0.01)
            out.append(("kvcache_usage_ratio", {"gpu": "0", "layer": str(layer)}, min(max(usage, 0.0), 1.0)))
            kvf = 1.15 + rng.normal(0, 0.01)
            out.append(("kv_fragmentation", {"gpu": "0", "layer": str(layer)}, max(kvf, 1.0)))
        ttft = 0.08 * (1 + 0.1 * max(daily, 0)) * math.exp(rng.normal(0, 0.1))
        out.append(("canary_ttft_seconds", {"canary": "capital"}, ttft))
        out.append(("tle_bits", {"canary": "capital"}, 1.20 + rng.normal(0, 0.004)))
        out.append(("rci", {"canary": "capital"}, min(max(0.08 + rng.normal(0, 0.01), 0.0), 1.0)))
        out.append(("gpu_memory_used_bytes", {"gpu": "0"}, 60e9 + rng.normal(0, 0.05e9)))
        out.append(("gpu_memory_total_bytes", {"gpu": "0"}, 80e9))
        for signal, labels, value in out:
            lines.append(line(ts, signal, labels, value))
    return lines


def line(ts: int, signal: str, labels: dict, value: float) -> str:
    return json.dumps({"ts_ms": ts, "signal": signal, "labels": labels, "value": float(f"{value:.6g}")}, sort_keys=True)


def write(out: Path, lines: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(out, "wb", mtime=0) as f:
        f.write(("\n".join(lines) + "\n").encode())
    print(f"wrote {out} ({len(lines)} samples, {out.stat().st_size} bytes)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--healthy", action="store_true", help=f"write {OUT_HEALTHY.name} (no drift, no model change) instead")
    args = ap.parse_args()
    if args.healthy:
        write(OUT_HEALTHY, healthy())
    else:
        write(OUT, degradation())


if __name__ == "__main__":
    main()

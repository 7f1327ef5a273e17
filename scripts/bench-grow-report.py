#!/usr/bin/env python3
"""Table, JSON summary and plot of scripts/bench-grow.sh's points (bench-agent.sh JSONs).

    python3 scripts/bench-grow-report.py target/bench-grow

Reads series-{1,4,16}x.json and history-{1,7,30}d.json from the folder, prints a table and
each target's verdict, writes summary.json and, when matplotlib imports, bench-grow.svg.
Exits 1 when a point is missing or unreadable (the verdicts themselves do not fail it).
"""
import json
import os
import sys

SERIES_POINTS = [("series-1x", 1), ("series-4x", 4), ("series-16x", 16)]
HISTORY_POINTS = [("history-1d", 1), ("history-7d", 7), ("history-30d", 30)]


def point(folder, name):
    path = os.path.join(folder, name + ".json")
    try:
        with open(path) as f:
            run = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"bench-grow-report: cannot read {path}: {e}; run scripts/bench-grow.sh first")
    w = run["wrk"]
    return {
        "point": name,
        "gpus": run["load"]["gpus"],
        "layers": run["load"]["layers"],
        "live_series": run["per_sample"]["live_series"],
        "cpu_us_per_sample": run["ratios"]["cpu_us_per_sample"]["value"],
        "tick_mean_ms": run["per_sample"]["tick_mean_ms"],
        "ticks": run["per_sample"]["ticks"],
        "latest_p99_ms": w["scores_latest"]["p99_ms"],
        "series_p99_ms": w["scores_series"]["p99_ms"],
        "latest_p50_1conn_ms": w["one_connection"]["scores_latest"]["p50_ms"],
        "series_p50_1conn_ms": w["one_connection"]["scores_series"]["p50_ms"],
        "rss_peak_mb": run["agent"]["rss_peak_mb"],
        "rss_bytes_per_series": run["ratios"]["rss_bytes_per_series"]["value"],
        "latest_bytes": w["scores_latest"]["response_bytes"],
        "store": run.get("store", "new"),
    }


def grows(rows, key):
    first, last = rows[0][key], rows[-1][key]
    return last / first if first and last is not None else float("nan")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = sys.argv[1]
    series = [point(folder, n) for n, _ in SERIES_POINTS]
    history = [point(folder, n) for n, _ in HISTORY_POINTS]
    for row, (_, d) in zip(history, HISTORY_POINTS):
        row["days"] = d
    n_ratio = series[-1]["live_series"] / series[0]["live_series"]

    def check(what, value, limit):
        return {"what": what, "value": round(value, 3), "limit": limit, "verdict": "MET" if value <= limit else "NOT MET"}

    targets = [
        check("CPU per sample, 16x / 1x series", grows(series, "cpu_us_per_sample"), 1.5),
        check("tick time, 16x / 1x series (limit: the series ratio)", grows(series, "tick_mean_ms"), round(n_ratio, 2)),
        check("/scores/latest p99 (every series), 16x / 1x (limit: the series ratio)", grows(series, "latest_p99_ms"), round(n_ratio, 2)),
        check("/scores one-series p99, 16x / 1x series", grows(series, "series_p99_ms"), 2.0),
        check("CPU per sample, 30 / 1 days of history", grows(history, "cpu_us_per_sample"), 1.5),
        check("tick time, 30 / 1 days of history", grows(history, "tick_mean_ms"), 2.0),
        check("/scores one-series p99, 30 / 1 days of history", grows(history, "series_p99_ms"), 2.0),
        check("/scores/latest p99, 30 / 1 days of history", grows(history, "latest_p99_ms"), 2.0),
    ]
    cols = [("point", "{}"), ("live_series", "{}"), ("cpu_us_per_sample", "{:.2f}"), ("tick_mean_ms", "{:.2f}"),
            ("series_p99_ms", "{:.2f}"), ("latest_p99_ms", "{:.2f}"), ("series_p50_1conn_ms", "{:.3f}"),
            ("rss_peak_mb", "{:.1f}"), ("rss_bytes_per_series", "{:.0f}")]
    print("| " + " | ".join(c for c, _ in cols) + " |")
    print("|" + "---|" * len(cols))
    for row in series + history:
        print("| " + " | ".join("—" if row[c] is None else f.format(row[c]) for c, f in cols) + " |")
    print()
    for t in targets:
        print(f"{t['what']}: {t['value']} (limit {t['limit']}) {t['verdict']}")
    summary = {"series": series, "history": history, "targets": targets}
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print(f"\nJSON: {os.path.join(folder, 'summary.json')}")
    try:
        import matplotlib
        matplotlib.use("svg")
        matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: a tenth of the size
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed (scripts/requirements-bench.txt)")
        return
    panels = [("cpu_us_per_sample", "CPU per pushed sample (µs)"), ("tick_mean_ms", "tick time, mean (ms)"),
              ("series_p99_ms", "/scores one series, p99 (ms)"), ("latest_p99_ms", "/scores/latest, p99 (ms)"),
              ("rss_peak_mb", "RSS peak (MB)")]
    fig, axes = plt.subplots(2, len(panels), figsize=(3.2 * len(panels), 6.2), constrained_layout=True)
    for col, (key, title) in enumerate(panels):
        ax = axes[0][col]
        ax.plot([r["live_series"] for r in series], [r[key] for r in series], "o-", color="tab:blue")
        ax.set_xscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("live series (1x, 4x, 16x)", fontsize=8)
        ax.set_ylim(bottom=0)
        ax = axes[1][col]
        ax.plot([r["days"] for r in history], [r[key] for r in history], "s-", color="tab:orange")
        ax.set_xlabel(f"days of history ({history[0]['live_series']} live series)", fontsize=8)
        ax.set_ylim(bottom=0)
    fig.suptitle("omen agent cost as series and history grow (scripts/bench-grow.sh)", fontsize=10)
    out = os.path.join(folder, "bench-grow.svg")
    fig.savefig(out)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()

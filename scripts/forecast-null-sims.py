#!/usr/bin/env python3
"""Null simulation behind the acceleration test of omen's forecast
(`recent_acceleration` in crates/omen-agent/src/engine/forecast.rs).

The forecast follows the last `forecast.recent_days` (7) when their Theil-Sen slope
interval lies wholly above the interval of all the days (both at `forecast.confidence`,
0.9), today and the day before. On series WITHOUT acceleration (a line plus Gaussian,
Student-t(3) or weekly-dipping noise, 14, 21 and 28 days) the test should fire in under
1% of forecasts, the criterion the regime split's critical value was chosen by. Prints
the share of false accelerations for the test on one day and on two.

Run: .venv-ref/bin/python scripts/forecast-null-sims.py  (numpy and scipy from
scripts/requirements-reference.txt; scipy.stats.theilslopes is the reference the Rust
Theil-Sen matches to 1e-12).
"""

import numpy as np
from scipy.stats import theilslopes

CONFIDENCE = 0.9
RECENT_DAYS = 7
TRIALS = 400


def accelerates(x: np.ndarray, y: np.ndarray) -> bool:
    _, _, _, all_high = theilslopes(y, x, CONFIDENCE)
    _, _, recent_low, _ = theilslopes(y[-RECENT_DAYS:], x[-RECENT_DAYS:], CONFIDENCE)
    return recent_low > all_high


def noise(kind: str, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if kind == "gauss":
        return rng.standard_normal(len(x))
    if kind == "t3":
        return rng.standard_t(3, len(x))
    return rng.standard_normal(len(x)) + np.where(x % 7 >= 5, -2.0, 0.0)  # weekend dip


def main() -> None:
    rng = np.random.default_rng(7)
    for days_asked in (1, 2):
        hits = trials = 0
        for kind in ("gauss", "t3", "weekly"):
            for n in (14, 21, 28):
                for _ in range(TRIALS):
                    x = np.arange(n, dtype=float)
                    y = 0.01 * x + noise(kind, x, rng)
                    fired = accelerates(x, y) and (days_asked == 1 or accelerates(x[:-1], y[:-1]))
                    hits += fired
                    trials += 1
        print(f"test asked on {days_asked} day(s): false acceleration in {100 * hits / trials:.2f}% of forecasts")


if __name__ == "__main__":
    main()

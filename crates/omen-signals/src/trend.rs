//! Theil-Sen trend with Sen's confidence interval (as `scipy.stats.theilslopes`,
//! method "separate") and the time-to-breach forecast behind the 14-day warning.

use statrs::distribution::{ContinuousCDF, Normal};

use crate::{invalid, SignalError};

/// The early-warning horizon in days.
pub const EARLY_WARNING_DAYS: f64 = 14.0;

/// A robust linear trend y = intercept + slope * x with an interval on the slope.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TheilSen {
    /// Median of the pairwise slopes.
    pub slope: f64,
    /// median(y) - slope * median(x).
    pub intercept: f64,
    /// Lower end of the slope's confidence interval.
    pub low_slope: f64,
    /// Upper end of the slope's confidence interval.
    pub high_slope: f64,
    /// median(x): the fitted lines with the interval's slopes pass through (median x, median y).
    pub x_median: f64,
    /// median(y).
    pub y_median: f64,
    /// The confidence level of the interval.
    pub confidence: f64,
}

/// Median of sorted values as numpy computes it: the mean of the two middle values for even n.
fn median_sorted(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// Median as numpy computes it (mean of the two middle values for even n); `values` must be non-empty.
pub fn median(values: &[f64]) -> f64 {
    debug_assert!(!values.is_empty());
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    median_sorted(&sorted)
}

/// sum of k(k-1)(2k+5) over groups of tied values (Sen 1968, eq. 2.6).
fn tie_correction(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
        .chunk_by(|a, b| a == b)
        .map(|g| g.len() as f64)
        .filter(|&k| k > 1.0)
        .map(|k| k * (k - 1.0) * (2.0 * k + 5.0))
        .sum()
}

/// Theil-Sen fit of `y` over `x` with a two-sided interval at `confidence` (e.g. 0.95).
pub fn theil_sen(x: &[f64], y: &[f64], confidence: f64) -> Result<TheilSen, SignalError> {
    if x.len() != y.len() {
        return Err(SignalError::LengthMismatch {
            left: "x",
            left_len: x.len(),
            right: "y",
            right_len: y.len(),
        });
    }
    if x.len() < 2 {
        return Err(SignalError::Empty { input: "x", needed: 2 });
    }
    for (name, values) in [("x", x), ("y", y)] {
        if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(SignalError::NonFinite { input: name, index, value });
        }
    }
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(invalid("confidence", confidence, "the confidence level must be in (0, 1), e.g. 0.95"));
    }
    let mut slopes = Vec::with_capacity(x.len() * (x.len() - 1) / 2);
    for i in 0..x.len() {
        for j in 0..x.len() {
            let dx = x[i] - x[j];
            if dx > 0.0 {
                slopes.push((y[i] - y[j]) / dx);
            }
        }
    }
    if slopes.is_empty() {
        return Err(invalid("x", "all equal", "a trend needs at least two distinct x values"));
    }
    slopes.sort_by(f64::total_cmp);
    let slope = median_sorted(&slopes);
    let (x_median, y_median) = (median(x), median(y));
    let intercept = y_median - slope * x_median;

    let alpha = if confidence > 0.5 { 1.0 - confidence } else { confidence };
    let z = Normal::new(0.0, 1.0).expect("standard normal").inverse_cdf(alpha / 2.0);
    let n = y.len() as f64;
    let nt = slopes.len() as f64;
    let sigma_sq = (n * (n - 1.0) * (2.0 * n + 5.0) - tie_correction(x) - tie_correction(y)) / 18.0;
    let (low_slope, high_slope) = if sigma_sq >= 0.0 {
        let sigma = sigma_sq.sqrt();
        let upper_index = (((nt - z * sigma) / 2.0).round_ties_even() as i64).min(slopes.len() as i64 - 1);
        let lower_index = (((nt + z * sigma) / 2.0).round_ties_even() as i64 - 1).max(0);
        (slopes[lower_index.max(0) as usize], slopes[upper_index.max(0) as usize])
    } else {
        (f64::NAN, f64::NAN)
    };
    Ok(TheilSen { slope, intercept, low_slope, high_slope, x_median, y_median, confidence })
}

/// Whether the SLO is breached by going above or below its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreachDirection {
    /// Breach when the indicator rises above the threshold (TTFT p99, KV usage, KVF, RCI).
    Above,
    /// Breach when it falls below (VRAM headroom).
    Below,
}

impl BreachDirection {
    /// The other direction: where a breach lies after a decreasing transform such as 1/x.
    pub fn flipped(self) -> Self {
        match self {
            Self::Above => Self::Below,
            Self::Below => Self::Above,
        }
    }
}

/// When a trend crosses its SLO threshold, in days from `now`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreachForecast {
    /// Days until the central trend crosses; `None` when it never does (flat or moving away).
    pub days_to_breach: Option<f64>,
    /// Earliest crossing over the slope interval.
    pub earliest_days: Option<f64>,
    /// Latest crossing over the slope interval; `None` when some slope in it never crosses.
    pub latest_days: Option<f64>,
    /// The central trend is already beyond the threshold at `now`.
    pub already_breached: bool,
}

/// Days added to the lead when deciding to warn: the daily indicator changes once a day, so
/// a forecast that crosses `lead_days` does so up to a day late; warning at `lead_days + 1`
/// keeps an accurate forecast's warning at least `lead_days` ahead.
pub const WARNING_MARGIN_DAYS: f64 = 1.0;

impl BreachForecast {
    /// Early warning (the rule before `warns`): the breach is within `horizon_days` and so is
    /// the interval's far end. An accurate forecast warns a little under `horizon_days` ahead.
    pub fn early_warning(&self, horizon_days: f64) -> bool {
        matches!((self.days_to_breach, self.latest_days), (Some(d), Some(l)) if d <= horizon_days && l <= horizon_days)
    }

    /// Early warning at least `lead_days` ahead: the central breach is within `lead_days` +
    /// [`WARNING_MARGIN_DAYS`], and the whole slope interval points towards the breach (a
    /// trend that may be flat, a plateau, does not warn).
    pub fn warns(&self, lead_days: f64) -> bool {
        matches!((self.days_to_breach, self.latest_days), (Some(d), Some(_)) if d <= lead_days + WARNING_MARGIN_DAYS)
    }
}

/// Critical value of the level-shift statistic of [`current_regime_start`]. On series
/// without a shift (a line plus noise, 8 to 28 points) the statistic stays under 22.1 in
/// 99% of series with Gaussian or Student-t(3) noise, and under 24.8 with a weekend dip of
/// two standard deviations (2,000 to 3,000 simulated series per case and length; it grows
/// with the length because the slope it removes is estimated from the same points).
pub const REGIME_SHIFT_CRITICAL: f64 = 25.0;

/// Points on each side of a candidate level shift: a shift is seen once this many days follow it.
pub const REGIME_MIN_SIDE: usize = 3;

/// Sum of absolute deviations from the median.
fn absolute_deviation(values: &[f64]) -> f64 {
    let m = median(values);
    values.iter().map(|v| (v - m).abs()).sum()
}

/// Where the current regime of a daily series starts: at a significant level shift, or at
/// 0 when there is none. The series less its typical daily change (the median of
/// its day-to-day slopes, which a single step hardly moves) is split where two medians fit
/// it best (least absolute deviation, so a step is located exactly); the split counts when
/// |median after - median before| / sigma * sqrt(k (n - k) / n) exceeds
/// [`REGIME_SHIFT_CRITICAL`], with sigma the robust spread of the day-to-day changes / sqrt 2.
/// A step (a deploy, a restart that frees a leak) then starts a new regime, and so does the
/// point where a trend that bends (accelerates or levels off) leaves its earlier line.
pub fn current_regime_start(x: &[f64], y: &[f64]) -> usize {
    match best_split(x, y) {
        Some((split, statistic)) if statistic > REGIME_SHIFT_CRITICAL => split,
        _ => 0,
    }
}

/// The split of [`current_regime_start`] and its statistic, significant or not; None for a
/// series too short or not ordered by x.
fn best_split(x: &[f64], y: &[f64]) -> Option<(usize, f64)> {
    let n = x.len();
    if n != y.len() || n < 2 * REGIME_MIN_SIDE || x.windows(2).any(|w| w[1] <= w[0]) {
        return None;
    }
    let changes: Vec<f64> = y.windows(2).map(|w| w[1] - w[0]).collect();
    let daily: Vec<f64> = x.windows(2).zip(&changes).map(|(w, dy)| dy / (w[1] - w[0])).collect();
    let slope = median(&daily);
    let centre = median(&changes);
    let spread: Vec<f64> = changes.iter().map(|c| (c - centre).abs()).collect();
    // A series without day-to-day noise (all changes alike) still has a scale: a step in it
    // is then as significant as it gets, and a flat one shifts by 0.
    let magnitude = y.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let sigma = (1.4826 * median(&spread) / std::f64::consts::SQRT_2).max(1e-9 * magnitude).max(1e-12);
    if !(sigma.is_finite() && slope.is_finite()) {
        return None;
    }
    let residuals: Vec<f64> = x.iter().zip(y).map(|(&xi, &yi)| yi - slope * xi).collect();
    let split = (REGIME_MIN_SIDE..=n - REGIME_MIN_SIDE)
        .map(|k| (absolute_deviation(&residuals[..k]) + absolute_deviation(&residuals[k..]), k))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map_or(0, |(_, k)| k);
    let shift = median(&residuals[split..]) - median(&residuals[..split]);
    Some((split, shift.abs() / sigma * ((split * (n - split)) as f64 / n as f64).sqrt()))
}

/// Where every regime of a daily series starts, in order (0 first): binary segmentation by
/// [`current_regime_start`]'s test, each side of a significant shift searched again.
pub fn regime_starts(x: &[f64], y: &[f64]) -> Vec<usize> {
    fn split(x: &[f64], y: &[f64], offset: usize, out: &mut Vec<usize>) {
        let k = current_regime_start(x, y);
        if k == 0 {
            return;
        }
        split(&x[..k], &y[..k], offset, out);
        out.push(offset + k);
        split(&x[k..], &y[k..], offset + k, out);
    }
    let mut out = vec![0];
    if x.len() != y.len() {
        return out;
    }
    split(x, y, 0, &mut out);
    // With three or more levels one split of the whole can fall beside a step (two medians
    // fit a staircase equally well at several places); each boundary is placed again
    // between its neighbours, where it is the only step.
    for i in 1..out.len() {
        let (lo, hi) = (out[i - 1], out.get(i + 1).copied().unwrap_or(x.len()));
        if let Some((k, _)) = best_split(&x[lo..hi], &y[lo..hi]) {
            out[i] = lo + k;
        }
    }
    out
}

/// Resets seen before the next one is counted on: two complete cycles show a rhythm, one
/// (a restart and a second one) may be chance.
const MIN_RESETS: usize = 3;

/// Most a cycle may differ from the shortest one for resets to count as regular.
const RESET_CYCLE_SPREAD: f64 = 1.5;

/// Days from the latest reset to the next one when a series is reset regularly, as a leak
/// that periodic restarts free: the regimes of [`regime_starts`] that begin with a shift
/// away from the breach (a reset), at least two complete cycles between resets, the longest
/// at most 1.5 times the shortest, and the current regime begun by a reset. Returns
/// (typical cycle in days, day of the latest reset); None for a series without such resets.
pub fn reset_cycle(x: &[f64], y: &[f64], direction: BreachDirection) -> Option<(f64, f64)> {
    let starts = regime_starts(x, y);
    let is_reset = |b: usize| {
        let (before, after) = (median(&y[b.saturating_sub(2)..b]), median(&y[b..(b + 2).min(y.len())]));
        match direction {
            BreachDirection::Above => after < before,
            BreachDirection::Below => after > before,
        }
    };
    let resets: Vec<usize> = starts[1..].iter().copied().filter(|&b| is_reset(b)).collect();
    let latest = *starts.last()?;
    if resets.last() != Some(&latest) || resets.len() < MIN_RESETS {
        return None;
    }
    let cycles: Vec<f64> = resets.windows(2).map(|w| x[w[1]] - x[w[0]]).collect();
    let (shortest, longest) =
        cycles.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &c| (lo.min(c), hi.max(c)));
    (longest <= RESET_CYCLE_SPREAD * shortest).then(|| (median(&cycles), x[latest]))
}

/// Days in a week; a day's weekday is its day number since the epoch modulo this.
const WEEK_DAYS: usize = 7;

/// A daily series' weekly profile: each weekday's typical departure from the trend, so that
/// the trend is fitted to the series less its weekly cycle (every day counts once, unlike a
/// trailing worst value that repeats one high day for a week) and the breach is judged on
/// the worst weekday.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WeeklyProfile {
    /// Offset of each weekday from the trend, indexed by `floor(x) mod 7`, in y's units.
    pub offsets: [f64; WEEK_DAYS],
}

/// Days of history before a weekly profile is estimated: two of each weekday.
pub const WEEKLY_PROFILE_MIN_DAYS: usize = 2 * WEEK_DAYS;

fn weekday(x: f64) -> usize {
    (x.floor() as i64).rem_euclid(WEEK_DAYS as i64) as usize
}

impl WeeklyProfile {
    /// The profile of `y` over days `x` (days since the epoch): each weekday's median
    /// residual from the Theil-Sen line of the whole series. `None` with fewer than
    /// [`WEEKLY_PROFILE_MIN_DAYS`] points or a weekday seen less than twice.
    pub fn of(x: &[f64], y: &[f64]) -> Option<Self> {
        if x.len() != y.len() || x.len() < WEEKLY_PROFILE_MIN_DAYS {
            return None;
        }
        let fit = theil_sen(x, y, 0.9).ok()?;
        let mut residuals: [Vec<f64>; WEEK_DAYS] = Default::default();
        for (&xi, &yi) in x.iter().zip(y) {
            residuals[weekday(xi)].push(yi - (fit.intercept + fit.slope * xi));
        }
        if residuals.iter().any(|r| r.len() < 2) {
            return None;
        }
        let mut offsets = residuals.map(|r| median(&r));
        // Centred, so that the profile moves no level into or out of the trend.
        let centre = median(&offsets);
        offsets.iter_mut().for_each(|o| *o -= centre);
        Some(Self { offsets })
    }

    /// The offset of `day`'s weekday (days since the epoch).
    pub fn offset_on(&self, day: f64) -> f64 {
        self.offsets[weekday(day)]
    }

    /// `y` less each day's weekday offset.
    pub fn adjust(&self, x: &[f64], y: &[f64]) -> Vec<f64> {
        x.iter().zip(y).map(|(&xi, &yi)| yi - self.offsets[weekday(xi)]).collect()
    }

    /// The worst weekday's offset towards a breach in `direction`.
    pub fn worst(&self, direction: BreachDirection) -> f64 {
        let it = self.offsets.iter().copied();
        match direction {
            BreachDirection::Above => it.fold(f64::NEG_INFINITY, f64::max),
            BreachDirection::Below => it.fold(f64::INFINITY, f64::min),
        }
    }
}

/// Trailing worst value over `window` points (max for [`BreachDirection::Above`], min for
/// [`BreachDirection::Below`]): element i is the worst of `values[i+1-window..=i]`, for the
/// complete windows only (so `values.len() + 1 - window` elements; empty when too short).
///
/// An SLO on a daily indicator breaks on its worst day, so the forecast follows the weekly
/// worst case: with `window = 7` a weekly cycle (weekend load dip) drops out of the trend.
pub fn trailing_worst(values: &[f64], window: usize, direction: BreachDirection) -> Vec<f64> {
    if window == 0 || values.len() < window {
        return Vec::new();
    }
    let worse = |a: f64, b: f64| match direction {
        BreachDirection::Above => a.max(b),
        BreachDirection::Below => a.min(b),
    };
    // O(n * window) is fine here: the input is one point per day over a 28-day lookback.
    values.windows(window).map(|w| w.iter().copied().reduce(worse).expect("window > 0")).collect()
}

/// Days from `now` until the line through (x0, y0) with `slope` crosses `threshold`.
fn crossing_days(
    x0: f64,
    y0: f64,
    slope: f64,
    now: f64,
    threshold: f64,
    direction: BreachDirection,
) -> Option<f64> {
    let at_now = y0 + slope * (now - x0);
    let beyond = match direction {
        BreachDirection::Above => at_now >= threshold,
        BreachDirection::Below => at_now <= threshold,
    };
    if beyond {
        return Some(0.0);
    }
    let towards = match direction {
        BreachDirection::Above => slope > 0.0,
        BreachDirection::Below => slope < 0.0,
    };
    if !towards || !slope.is_finite() {
        return None;
    }
    Some((threshold - at_now) / slope)
}

/// Half a day: the simulator and the user count a breach from the start of the first day
/// whose daily value crosses, while the trend crosses somewhere within the half day either
/// side of that day's midpoint.
const DAY_GRANULARITY: f64 = 0.5;

/// The predictive interval of the breach, in days from `now`: the trend `fit` with the
/// slopes of its interval, and a daily value that may lie z * `residual_scale` either
/// side of the trend (z the normal quantile of the two-sided `confidence`) (the breach comes earlier when the days scatter above the line and
/// later when below), widened by the half day a daily breach is counted in. `None` for the
/// far end when some slope of the interval never crosses.
pub fn breach_interval(
    fit: &TheilSen,
    residual_scale: f64,
    confidence: f64,
    now: f64,
    threshold: f64,
    direction: BreachDirection,
) -> (Option<f64>, Option<f64>) {
    let z =
        Normal::new(0.0, 1.0).expect("standard normal").inverse_cdf(0.5 + confidence.clamp(0.0, 0.999) / 2.0);
    let spread = (z * residual_scale).max(0.0);
    let (towards, away) = match direction {
        BreachDirection::Above => (threshold - spread, threshold + spread),
        BreachDirection::Below => (threshold + spread, threshold - spread),
    };
    let slopes = [fit.low_slope, fit.slope, fit.high_slope];
    let cross = |t: f64, s: f64| crossing_days(fit.x_median, fit.y_median, s, now, t, direction);
    let earliest = slopes.iter().filter_map(|&s| cross(towards, s)).reduce(f64::min);
    let latest: Option<Vec<f64>> = slopes.iter().map(|&s| cross(away, s)).collect();
    (
        earliest.map(|d| (d - DAY_GRANULARITY).max(0.0)),
        latest.and_then(|l| l.into_iter().reduce(f64::max)).map(|d| d + DAY_GRANULARITY),
    )
}

/// The robust scale of `y` around the line `fit`: 1.4826 times the median absolute residual.
pub fn residual_scale(fit: &TheilSen, x: &[f64], y: &[f64]) -> f64 {
    let residuals: Vec<f64> =
        x.iter().zip(y).map(|(&xi, &yi)| (yi - (fit.intercept + fit.slope * xi)).abs()).collect();
    if residuals.is_empty() {
        0.0
    } else {
        1.4826 * median(&residuals)
    }
}

/// Forecast of when the trend `fit` (x in days) crosses `threshold`, seen from day `now`.
pub fn days_to_breach(
    fit: &TheilSen,
    now: f64,
    threshold: f64,
    direction: BreachDirection,
) -> BreachForecast {
    let central = crossing_days(fit.x_median, fit.y_median, fit.slope, now, threshold, direction);
    let ends = [fit.low_slope, fit.high_slope]
        .map(|s| crossing_days(fit.x_median, fit.y_median, s, now, threshold, direction));
    let earliest = ends.iter().chain(std::iter::once(&central)).flatten().copied().reduce(f64::min);
    let latest = match ends {
        [Some(a), Some(b)] => central.map(|c| c.max(a).max(b)),
        _ => None,
    };
    BreachForecast {
        days_to_breach: central,
        earliest_days: earliest,
        latest_days: latest,
        already_breached: central == Some(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn exact_line_is_recovered() {
        let x: Vec<f64> = (0..20).map(f64::from).collect();
        let y: Vec<f64> = x.iter().map(|v| 3.0 + 0.5 * v).collect();
        let fit = theil_sen(&x, &y, 0.95).unwrap();
        assert_eq!(fit.slope, 0.5);
        assert_eq!(fit.intercept, 3.0);
        assert_eq!((fit.low_slope, fit.high_slope), (0.5, 0.5));
    }

    #[test]
    fn breach_in_ten_days() {
        // KV usage 0.50 today rising 0.04/day; SLO 0.90 -> 10 days.
        let x: Vec<f64> = (0..15).map(f64::from).collect();
        let y: Vec<f64> = x.iter().map(|d| 0.50 - 0.04 * 14.0 + 0.04 * d).collect();
        let fit = theil_sen(&x, &y, 0.95).unwrap();
        let f = days_to_breach(&fit, 14.0, 0.90, BreachDirection::Above);
        assert!((f.days_to_breach.unwrap() - 10.0).abs() < 1e-9, "{f:?}");
        assert!(f.early_warning(EARLY_WARNING_DAYS));
        let away = days_to_breach(&fit, 14.0, 0.2, BreachDirection::Below);
        assert_eq!(away.days_to_breach, None);
        assert!(!away.early_warning(EARLY_WARNING_DAYS));
    }

    #[test]
    fn the_breach_interval_holds_the_day_and_the_scatter() {
        // An exact line: only the half day a daily breach is counted in.
        let x: Vec<f64> = (0..15).map(f64::from).collect();
        let y: Vec<f64> = x.iter().map(|d| 0.50 - 0.04 * 14.0 + 0.04 * d).collect();
        let fit = theil_sen(&x, &y, 0.9).unwrap();
        assert_eq!(residual_scale(&fit, &x, &y), 0.0);
        let (lo, hi) = breach_interval(&fit, 0.0, 0.9, 14.0, 0.90, BreachDirection::Above);
        assert!((lo.unwrap() - 9.5).abs() < 1e-9 && (hi.unwrap() - 10.5).abs() < 1e-9, "{lo:?} {hi:?}");
        // Days scattering 0.02 around it: 1.645 * 0.02 / 0.04 = 0.82 days more either side.
        let (lo, hi) = breach_interval(&fit, 0.02, 0.9, 14.0, 0.90, BreachDirection::Above);
        let spread = 1.6448536269514722 * 0.02 / 0.04;
        assert!((lo.unwrap() - (9.5 - spread)).abs() < 1e-6 && (hi.unwrap() - (10.5 + spread)).abs() < 1e-6);
        // Moving away: no breach, no far end.
        let (lo, hi) = breach_interval(&fit, 0.02, 0.9, 14.0, 0.2, BreachDirection::Below);
        assert_eq!((lo, hi), (None, None));
    }

    proptest! {
        #[test]
        fn the_breach_interval_brackets_the_central_forecast(
            ys in prop::collection::vec(-1.0f64..1.0, 8..30), slope in 0.01f64..0.2,
        ) {
            let x: Vec<f64> = (0..ys.len()).map(|i| i as f64).collect();
            let y: Vec<f64> = x.iter().zip(&ys).map(|(xi, n)| slope * xi + 0.1 * n).collect();
            let fit = theil_sen(&x, &y, 0.9).unwrap();
            let now = x.len() as f64;
            let threshold = slope * (now + 20.0);
            let f = days_to_breach(&fit, now, threshold, BreachDirection::Above);
            let (lo, hi) = breach_interval(&fit, residual_scale(&fit, &x, &y), 0.9, now, threshold, BreachDirection::Above);
            if let (Some(d), Some(lo)) = (f.days_to_breach, lo) {
                prop_assert!(lo <= d, "{lo} > {d}");
            }
            if let (Some(d), Some(hi)) = (f.days_to_breach, hi) {
                prop_assert!(d <= hi, "{d} > {hi}");
            }
        }
    }

    #[test]
    fn already_breached_is_zero_days() {
        let fit = theil_sen(&[0.0, 1.0, 2.0], &[5.0, 5.0, 5.0], 0.95).unwrap();
        let f = days_to_breach(&fit, 2.0, 4.0, BreachDirection::Above);
        assert!(f.already_breached);
        assert_eq!(f.days_to_breach, Some(0.0));
    }

    #[test]
    fn trailing_worst_takes_complete_windows() {
        let v = [1.0, 3.0, 2.0, 0.5, 4.0];
        assert_eq!(trailing_worst(&v, 3, BreachDirection::Above), vec![3.0, 3.0, 4.0]);
        assert_eq!(trailing_worst(&v, 3, BreachDirection::Below), vec![1.0, 0.5, 0.5]);
        assert_eq!(trailing_worst(&v, 1, BreachDirection::Above), v.to_vec());
        assert!(trailing_worst(&v, 6, BreachDirection::Above).is_empty());
        assert!(trailing_worst(&v, 0, BreachDirection::Above).is_empty());
    }

    proptest! {
        #[test]
        fn trailing_worst_bounds_every_value_in_its_window(
            v in proptest::collection::vec(-1e3f64..1e3, 1..40),
            window in 1usize..10,
        ) {
            let hi = trailing_worst(&v, window, BreachDirection::Above);
            let lo = trailing_worst(&v, window, BreachDirection::Below);
            prop_assert_eq!(hi.len(), (v.len() + 1).saturating_sub(window));
            for (i, (h, l)) in hi.iter().zip(&lo).enumerate() {
                let w = &v[i..i + window];
                prop_assert!(w.iter().all(|x| x <= h && x >= l));
                prop_assert!(w.contains(h) && w.contains(l));
            }
        }
    }

    #[test]
    fn errors() {
        assert!(theil_sen(&[1.0], &[1.0], 0.95).is_err());
        assert!(theil_sen(&[1.0, 1.0], &[1.0, 2.0], 0.95).is_err());
        assert!(theil_sen(&[1.0, 2.0], &[1.0], 0.95).is_err());
        assert!(theil_sen(&[1.0, f64::NAN], &[1.0, 2.0], 0.95).is_err());
    }

    proptest! {
        #[test]
        fn interval_contains_slope(ys in prop::collection::vec(-100.0f64..100.0, 3..40)) {
            let x: Vec<f64> = (0..ys.len()).map(|i| i as f64).collect();
            let fit = theil_sen(&x, &ys, 0.95).unwrap();
            prop_assert!(fit.low_slope <= fit.slope && fit.slope <= fit.high_slope, "{:?}", fit);
        }

        #[test]
        fn noisy_interval_never_warns_early(seed in 0u64..1000) {
            // A flat series with noise has an interval straddling 0: the far end never crosses.
            let ys: Vec<f64> = (0..28).map(|i| 0.5 + 0.05 * (((i as u64 * 2654435761 + seed) % 97) as f64 / 97.0 - 0.5)).collect();
            let x: Vec<f64> = (0..28).map(|i| i as f64).collect();
            let fit = theil_sen(&x, &ys, 0.95).unwrap();
            let f = days_to_breach(&fit, 27.0, 0.9, BreachDirection::Above);
            if fit.low_slope <= 0.0 { prop_assert!(!f.early_warning(EARLY_WARNING_DAYS)); }
        }
    }

    /// Deterministic noise in [-1, 1): splitmix64 of the index and seed.
    fn noise(i: usize, seed: u64) -> f64 {
        let mut z = (seed << 32 | i as u64).wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }

    #[test]
    fn warning_needs_the_lead_plus_a_day_and_a_slope_interval_towards_the_breach() {
        let f = |d: f64, far: Option<f64>| BreachForecast {
            days_to_breach: Some(d),
            earliest_days: Some(d),
            latest_days: far,
            already_breached: false,
        };
        assert!(f(14.9, Some(40.0)).warns(14.0));
        assert!(f(15.0, Some(15.0)).warns(14.0));
        assert!(!f(15.1, Some(15.1)).warns(14.0));
        assert!(!f(3.0, None).warns(14.0), "a slope interval that reaches 0 never warns");
    }

    #[test]
    fn a_step_starts_the_regime_and_a_noisy_line_has_one_regime() {
        let x: Vec<f64> = (0..28).map(|i| 20_000.5 + i as f64).collect();
        for seed in 0..20 {
            let line: Vec<f64> = (0..28).map(|i| 1.0 + 0.01 * i as f64 + 0.01 * noise(i, seed)).collect();
            assert_eq!(current_regime_start(&x, &line), 0, "seed {seed}");
            let step: Vec<f64> =
                line.iter().enumerate().map(|(i, v)| v + if i >= 19 { 0.3 } else { 0.0 }).collect();
            assert_eq!(current_regime_start(&x, &step), 19, "seed {seed}");
        }
        // Too short, or unordered: no split.
        assert_eq!(current_regime_start(&x[..5], &[1.0, 1.0, 1.0, 5.0, 5.0]), 0);
        assert_eq!(current_regime_start(&[3.0, 2.0, 1.0, 4.0, 5.0, 6.0], &[1.0; 6]), 0);
    }

    /// A leak of `rate` a day that a restart frees every `every` days, from day 0.
    fn sawtooth(days: usize, every: usize, rate: f64, seed: u64) -> (Vec<f64>, Vec<f64>) {
        let x: Vec<f64> = (0..days).map(|i| 20_000.5 + i as f64).collect();
        let y = (0..days).map(|i| 10.0 - rate * (i % every) as f64 + 0.02 * noise(i, seed)).collect();
        (x, y)
    }

    #[test]
    fn regular_restarts_give_their_cycle_and_a_leak_or_a_step_none() {
        for seed in 0..20 {
            // Headroom falls with the leak and jumps back at each restart (a breach below).
            let (x, y) = sawtooth(28, 7, 0.6, seed);
            assert_eq!(regime_starts(&x, &y), [0, 7, 14, 21], "seed {seed}");
            let (cycle, latest) = reset_cycle(&x, &y, BreachDirection::Below).unwrap();
            assert_eq!((cycle, latest), (7.0, x[21]), "seed {seed}");
            // The same shape read as a breach above: the jumps move towards it, not resets.
            assert_eq!(reset_cycle(&x, &y, BreachDirection::Above), None);
            // A plain leak, and a leak with one restart (one cycle is no rhythm): none.
            let leak: Vec<f64> = (0..28).map(|i| 10.0 - 0.3 * i as f64 + 0.02 * noise(i, seed)).collect();
            assert_eq!(reset_cycle(&x, &leak, BreachDirection::Below), None);
            let (x2, y2) = sawtooth(28, 14, 0.3, seed);
            assert_eq!(reset_cycle(&x2, &y2, BreachDirection::Below), None, "seed {seed}");
        }
        // Restarts at irregular times (3 and 9 days apart) are no cycle to count on.
        let x: Vec<f64> = (0..28).map(|i| 20_000.5 + i as f64).collect();
        let resets = [4usize, 7, 16, 19];
        let y: Vec<f64> = (0..28)
            .map(|i| {
                let since = resets.iter().filter(|&&r| r <= i).max().map_or(i, |&r| i - r);
                10.0 - 0.5 * since as f64 + 0.02 * noise(i, 3)
            })
            .collect();
        assert_eq!(reset_cycle(&x, &y, BreachDirection::Below), None);
    }

    #[test]
    fn a_weekly_profile_recovers_its_offsets_and_leaves_the_line() {
        let x: Vec<f64> = (0..28).map(|i| 20_000.5 + i as f64).collect();
        let pattern = [0.0, 0.0, -0.2, -0.3, 0.05, 0.0, 0.0];
        let y: Vec<f64> = x.iter().map(|&xi| 2.0 + 0.02 * xi + pattern[weekday(xi)]).collect();
        let p = WeeklyProfile::of(&x, &y).unwrap();
        for (o, want) in p.offsets.iter().zip(pattern) {
            assert!((o - want).abs() < 1e-9, "{:?}", p.offsets);
        }
        assert!((p.worst(BreachDirection::Above) - 0.05).abs() < 1e-9);
        assert!((p.worst(BreachDirection::Below) + 0.3).abs() < 1e-9);
        let adjusted = p.adjust(&x, &y);
        assert!(x.iter().zip(&adjusted).all(|(&xi, a)| (a - (2.0 + 0.02 * xi)).abs() < 1e-9));
        assert!(WeeklyProfile::of(&x[..13], &y[..13]).is_none(), "two of each weekday are needed");
    }

    proptest! {
        #[test]
        fn the_regime_start_ignores_a_level_and_a_trend(
            offset in -100.0f64..100.0, slope in -1.0f64..1.0, seed in 0u64..1000, step_at in 3usize..25,
        ) {
            let x: Vec<f64> = (0..28).map(|i| 20_000.5 + i as f64).collect();
            let base: Vec<f64> = (0..28)
                .map(|i| noise(i, seed) + if i >= step_at { 50.0 } else { 0.0 })
                .collect();
            let moved: Vec<f64> = base.iter().zip(&x).map(|(v, xi)| v + offset + slope * (xi - x[0])).collect();
            prop_assert_eq!(current_regime_start(&x, &base), step_at);
            prop_assert_eq!(current_regime_start(&x, &moved), step_at);
        }
    }
}

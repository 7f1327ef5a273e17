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

impl BreachForecast {
    /// Early warning: the breach is within `horizon_days` and so is the interval's far end.
    pub fn early_warning(&self, horizon_days: f64) -> bool {
        matches!((self.days_to_breach, self.latest_days), (Some(d), Some(l)) if d <= horizon_days && l <= horizon_days)
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
}

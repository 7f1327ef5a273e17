//! Delta-Metric between an A and a B run of the same requests, and bootstrap
//! confidence intervals for percentile differences, so that a change smaller
//! than the noise is called noise.

use rand::{Rng, RngExt};

use crate::{invalid, SignalError};

/// Relative change d = (M_B - M_A) / max(|M_A|, 1e-6).
pub fn delta_metric(a: f64, b: f64) -> f64 {
    (b - a) / a.abs().max(1e-6)
}

/// Quantile with linear interpolation between order statistics (numpy's default, R type 7).
///
/// `sorted` must be sorted ascending and non-empty; `q` is in [0, 1].
/// statrs's `quantile` uses R type 8, which differs from what users compare against.
pub fn quantile_linear(sorted: &[f64], q: f64) -> f64 {
    debug_assert!(!sorted.is_empty());
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    let frac = pos - lo as f64;
    // numpy's _lerp form: a + (b - a) * t, switched to b - (b - a) * (1 - t) for t >= 0.5.
    let (a, b) = (sorted[lo], sorted[hi]);
    let diff = b - a;
    if frac >= 0.5 {
        b - diff * (1.0 - frac)
    } else {
        a + diff * frac
    }
}

/// Which way B moved relative to A, judged by the confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaVerdict {
    /// The whole interval is above 0.
    Increase,
    /// The whole interval is below 0.
    Decrease,
    /// The interval contains 0: indistinguishable from noise.
    Noise,
}

/// A bootstrap estimate of quantile(B) - quantile(A) with its interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BootstrapInterval {
    /// quantile(B) - quantile(A) on the observed samples.
    pub estimate: f64,
    /// Lower end of the percentile-bootstrap interval.
    pub lower: f64,
    /// Upper end.
    pub upper: f64,
    /// Confidence level, e.g. 0.95.
    pub confidence: f64,
    /// Number of bootstrap resamples.
    pub resamples: usize,
    /// Direction of the change, or noise.
    pub verdict: DeltaVerdict,
}

fn check_samples(name: &'static str, xs: &[f64]) -> Result<Vec<f64>, SignalError> {
    if xs.is_empty() {
        return Err(SignalError::Empty { input: name, needed: 1 });
    }
    if let Some((index, &value)) = xs.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(SignalError::NonFinite { input: name, index, value });
    }
    let mut sorted = xs.to_vec();
    sorted.sort_by(f64::total_cmp);
    Ok(sorted)
}

/// Percentile-bootstrap interval of quantile_q(B) - quantile_q(A).
///
/// A and B are resampled independently with replacement `resamples` times using
/// `rng` (inject a seeded generator for reproducible reports).
pub fn percentile_difference_ci<R: Rng + ?Sized>(
    a: &[f64],
    b: &[f64],
    q: f64,
    confidence: f64,
    resamples: usize,
    rng: &mut R,
) -> Result<BootstrapInterval, SignalError> {
    if !(0.0..=1.0).contains(&q) {
        return Err(invalid("q", q, "the quantile must be in [0, 1] (0.99 for p99)"));
    }
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(invalid("confidence", confidence, "the confidence level must be in (0, 1), e.g. 0.95"));
    }
    if resamples < 100 {
        return Err(invalid(
            "resamples",
            resamples,
            "use at least 100 bootstrap resamples (1000 or more is usual)",
        ));
    }
    let sa = check_samples("a", a)?;
    let sb = check_samples("b", b)?;
    let estimate = quantile_linear(&sb, q) - quantile_linear(&sa, q);
    let mut diffs = Vec::with_capacity(resamples);
    let mut buf_a = vec![0.0; sa.len()];
    let mut buf_b = vec![0.0; sb.len()];
    for _ in 0..resamples {
        let qa = resampled_quantile(&sa, &mut buf_a, q, rng);
        let qb = resampled_quantile(&sb, &mut buf_b, q, rng);
        diffs.push(qb - qa);
    }
    Ok(interval_from_differences(estimate, diffs, confidence))
}

/// The percentile interval at `confidence` of bootstrap differences `diffs` (B - A, one per
/// resample) around `estimate`, and its verdict: an increase or decrease only when the whole
/// interval lies on one side of 0.
pub fn interval_from_differences(estimate: f64, mut diffs: Vec<f64>, confidence: f64) -> BootstrapInterval {
    diffs.sort_by(f64::total_cmp);
    let tail = (1.0 - confidence) / 2.0;
    let lower = quantile_linear(&diffs, tail);
    let upper = quantile_linear(&diffs, 1.0 - tail);
    let verdict = if lower > 0.0 {
        DeltaVerdict::Increase
    } else if upper < 0.0 {
        DeltaVerdict::Decrease
    } else {
        DeltaVerdict::Noise
    };
    BootstrapInterval { estimate, lower, upper, confidence, resamples: diffs.len(), verdict }
}

/// Quantile of one bootstrap resample of `sorted`, drawn into `buf`.
fn resampled_quantile<R: Rng + ?Sized>(sorted: &[f64], buf: &mut [f64], q: f64, rng: &mut R) -> f64 {
    let n = sorted.len();
    for slot in buf.iter_mut() {
        *slot = sorted[rng.random_range(0..n)];
    }
    buf.sort_unstable_by(f64::total_cmp);
    quantile_linear(buf, q)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn delta_is_relative_with_floor() {
        assert_eq!(delta_metric(2.0, 3.0), 0.5);
        assert_eq!(delta_metric(0.0, 1e-6), 1.0);
        assert_eq!(delta_metric(-4.0, -2.0), 0.5);
    }

    #[test]
    fn quantile_matches_hand_values() {
        let xs = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile_linear(&xs, 0.5), 2.5);
        assert_eq!(quantile_linear(&xs, 0.0), 1.0);
        assert_eq!(quantile_linear(&xs, 1.0), 4.0);
        assert_eq!(quantile_linear(&[7.0], 0.99), 7.0);
    }

    #[test]
    fn same_distribution_is_noise_and_a_shift_is_seen() {
        let mut rng = StdRng::seed_from_u64(1);
        let a: Vec<f64> = (0..400).map(|_| rng.random_range(0.0..1.0)).collect();
        // B holds the same values in another order: any interval must straddle 0.
        let b: Vec<f64> = a.iter().rev().copied().collect();
        let r = percentile_difference_ci(&a, &b, 0.9, 0.95, 500, &mut rng).unwrap();
        assert_eq!(r.estimate, 0.0);
        assert_eq!(r.verdict, DeltaVerdict::Noise, "{r:?}");
        let shifted: Vec<f64> = b.iter().map(|x| x + 0.3).collect();
        let r = percentile_difference_ci(&a, &shifted, 0.9, 0.95, 500, &mut rng).unwrap();
        assert_eq!(r.verdict, DeltaVerdict::Increase, "{r:?}");
        assert!(r.lower < r.estimate && r.estimate < r.upper);
    }

    #[test]
    fn bad_arguments_are_errors() {
        let mut rng = StdRng::seed_from_u64(1);
        assert!(percentile_difference_ci(&[], &[1.0], 0.5, 0.95, 200, &mut rng).is_err());
        assert!(percentile_difference_ci(&[1.0], &[f64::NAN], 0.5, 0.95, 200, &mut rng).is_err());
        assert!(percentile_difference_ci(&[1.0], &[1.0], 1.5, 0.95, 200, &mut rng).is_err());
        assert!(percentile_difference_ci(&[1.0], &[1.0], 0.5, 1.0, 200, &mut rng).is_err());
        assert!(percentile_difference_ci(&[1.0], &[1.0], 0.5, 0.9, 10, &mut rng).is_err());
    }
}

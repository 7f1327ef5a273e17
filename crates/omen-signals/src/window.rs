//! Sliding-window anomaly score of a sample against the `w` samples before it:
//! score = |x - mean(W)| / (std(W) + 1e-8) + 0.3 |skew(W)|, std with ddof = 0 and
//! skew the bias-corrected sample skewness (pandas `Series.skew`). A window whose
//! values are all equal has no defined skewness; its skew term is 0.
//!
//! The streaming form keeps shifted power sums, O(1) per sample, and re-derives
//! them exactly from the window (O(w), so O(1) amortised) every `w` samples and
//! whenever a large value has left the window, which bounds the cancellation
//! error of the running sums; docs/signals.md gives the error argument.

use crate::{invalid, SignalError};

/// Added to the standard deviation so that a constant window does not divide by 0.
pub const STD_EPSILON: f64 = 1e-8;
/// Weight of |skew| in the score.
pub const SKEW_WEIGHT: f64 = 0.3;

/// The score of one sample and the window statistics behind it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowScore {
    /// z + 0.3 |skew|.
    pub score: f64,
    /// |x - mean| / (std + 1e-8).
    pub z: f64,
    /// Bias-corrected sample skewness of the window (0 for a degenerate window).
    pub skew: f64,
    /// Mean of the window.
    pub mean: f64,
    /// Population standard deviation of the window.
    pub std: f64,
}

fn combine(x_minus_mean: f64, std: f64, skew: f64, mean: f64) -> WindowScore {
    let z = x_minus_mean.abs() / (std + STD_EPSILON);
    WindowScore { score: z + SKEW_WEIGHT * skew.abs(), z, skew, mean, std }
}

/// Bias-corrected skewness from the count and the 2nd and 3rd central sums, as pandas.
fn skewness(n: f64, m2: f64, m3: f64) -> f64 {
    if m2 <= 0.0 {
        return 0.0;
    }
    (m3 / (m2 * m2.sqrt())) * (n * (n - 1.0).sqrt() / (n - 2.0))
}

/// The score computed directly from the window with two passes (the reference form).
pub fn window_anomaly_score_direct(window: &[f64], x: f64) -> Result<WindowScore, SignalError> {
    if window.len() < 3 {
        return Err(SignalError::Empty { input: "window", needed: 3 });
    }
    if let Some((index, &value)) = window.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(SignalError::NonFinite { input: "window", index, value });
    }
    if !x.is_finite() {
        return Err(SignalError::NonFinite { input: "sample", index: 0, value: x });
    }
    let n = window.len() as f64;
    let mean = window.iter().sum::<f64>() / n;
    let degenerate = window.iter().all(|&v| v == window[0]);
    let (mut m2, mut m3) = (0.0, 0.0);
    for &v in window {
        let d = v - mean;
        m2 += d * d;
        m3 += d * d * d;
    }
    let std = (m2 / n).sqrt();
    let skew = if degenerate { 0.0 } else { skewness(n, m2, m3) };
    Ok(combine(x - mean, if degenerate { 0.0 } else { std }, skew, if degenerate { window[0] } else { mean }))
}

/// Streaming window score: push samples, get the score of each against the window before it.
#[derive(Debug, Clone)]
pub struct WindowAnomaly {
    window: usize,
    ring: Vec<f64>,
    head: usize,
    /// Sums of d, d^2, d^3 over the window with d = x - shift.
    shift: f64,
    s1: f64,
    s2: f64,
    s3: f64,
    /// Largest |d| added since the last rebase: bounds the rounding left in the sums.
    peak_deviation: f64,
    since_rebase: usize,
    pushed: u64,
}

impl WindowAnomaly {
    /// A largest-deviation-squared to variance ratio above this forces a rebase.
    /// One outlier in a window of n gives a ratio of about n, so 4n keeps it while it is inside.
    fn rebase_ratio(&self) -> f64 {
        4.0 * self.window as f64
    }

    /// A scorer over windows of `window` samples (at least 3, as skewness needs).
    pub fn new(window: usize) -> Result<Self, SignalError> {
        if window < 3 {
            return Err(invalid("window", window, "the window needs at least 3 samples for a skewness"));
        }
        Ok(Self {
            window,
            ring: Vec::with_capacity(window),
            head: 0,
            shift: 0.0,
            s1: 0.0,
            s2: 0.0,
            s3: 0.0,
            peak_deviation: 0.0,
            since_rebase: 0,
            pushed: 0,
        })
    }

    /// Window length.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Samples pushed so far.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Whether the window is full, so that the next push returns a score.
    pub fn is_warm(&self) -> bool {
        self.ring.len() == self.window
    }

    /// Scores `x` against the current window (if full), then slides it in.
    ///
    /// A non-finite sample is rejected and leaves the state unchanged.
    pub fn push(&mut self, x: f64) -> Result<Option<WindowScore>, SignalError> {
        if !x.is_finite() {
            return Err(SignalError::NonFinite { input: "sample", index: self.pushed as usize, value: x });
        }
        let score = if self.is_warm() { Some(self.score_of(x)) } else { None };
        self.insert(x);
        Ok(score)
    }

    /// The score `x` would get against the current window, without sliding it in.
    pub fn peek(&self, x: f64) -> Option<WindowScore> {
        (self.is_warm() && x.is_finite()).then(|| self.score_of(x))
    }

    fn score_of(&self, x: f64) -> WindowScore {
        let n = self.window as f64;
        let mean_d = self.s1 / n;
        let m2 = (self.s2 - self.s1 * mean_d).max(0.0);
        let m3 = self.s3 - 3.0 * mean_d * self.s2 + 2.0 * mean_d * mean_d * self.s1;
        let std = (m2 / n).sqrt();
        // (x - shift) - mean_d avoids forming the mean, whose rounding a tiny std would amplify.
        combine((x - self.shift) - mean_d, std, skewness(n, m2, m3), self.shift + mean_d)
    }

    fn insert(&mut self, x: f64) {
        self.pushed += 1;
        if self.ring.is_empty() {
            self.shift = x;
        }
        if self.ring.len() == self.window {
            let old = std::mem::replace(&mut self.ring[self.head], x);
            let d = old - self.shift;
            let d2 = d * d;
            self.s1 -= d;
            self.s2 -= d2;
            self.s3 -= d2 * d;
            self.head = (self.head + 1) % self.window;
        } else {
            self.ring.push(x);
        }
        let d = x - self.shift;
        let d2 = d * d;
        self.s1 += d;
        self.s2 += d2;
        self.s3 += d2 * d;
        self.peak_deviation = self.peak_deviation.max(d.abs());
        self.since_rebase += 1;

        let n = self.ring.len() as f64;
        let variance = (self.s2 - self.s1 * self.s1 / n).max(0.0) / n;
        if self.since_rebase >= self.window
            || self.peak_deviation * self.peak_deviation > self.rebase_ratio() * variance
        {
            self.rebase();
        }
    }

    /// Recomputes the sums from the window, shifted to the sample nearest its mean.
    fn rebase(&mut self) {
        let n = self.ring.len() as f64;
        let mean = self.ring.iter().sum::<f64>() / n;
        // A sample of the window as the shift makes an all-equal window exactly zero.
        self.shift = self
            .ring
            .iter()
            .copied()
            .min_by(|a, b| (a - mean).abs().total_cmp(&(b - mean).abs()))
            .unwrap_or(mean);
        let (mut s1, mut s2, mut s3, mut peak) = (0.0, 0.0, 0.0, 0.0f64);
        for &v in &self.ring {
            let d = v - self.shift;
            let d2 = d * d;
            s1 += d;
            s2 += d2;
            s3 += d2 * d;
            peak = peak.max(d.abs());
        }
        (self.s1, self.s2, self.s3, self.peak_deviation) = (s1, s2, s3, peak);
        self.since_rebase = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_small_windows_and_bad_samples() {
        assert!(WindowAnomaly::new(2).is_err());
        let mut w = WindowAnomaly::new(3).unwrap();
        assert!(w.push(f64::NAN).is_err());
        assert_eq!(w.pushed(), 0);
        assert!(window_anomaly_score_direct(&[1.0, 2.0], 1.0).is_err());
    }

    #[test]
    fn warm_up_then_scores() {
        let mut w = WindowAnomaly::new(3).unwrap();
        assert_eq!(w.push(1.0).unwrap(), None);
        assert_eq!(w.push(2.0).unwrap(), None);
        assert_eq!(w.push(3.0).unwrap(), None);
        let s = w.push(2.0).unwrap().unwrap();
        // window [1,2,3]: mean 2, symmetric -> z 0, skew 0
        assert!(s.score.abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn constant_window_is_degenerate() {
        let mut w = WindowAnomaly::new(10).unwrap();
        for _ in 0..10 {
            w.push(0.1).unwrap();
        }
        let s = w.push(0.1).unwrap().unwrap();
        assert_eq!((s.z, s.skew, s.std), (0.0, 0.0, 0.0));
        let s = w.push(0.1 + 1e-9).unwrap().unwrap();
        assert!((s.z - 1e-9 / 1e-8).abs() < 1e-6);
    }

    #[test]
    fn spike_leaving_the_window_leaves_no_residue() {
        let mut w = WindowAnomaly::new(20).unwrap();
        let mut series: Vec<f64> = (0..20).map(|i| 1.0 + 1e-9 * (i % 3) as f64).collect();
        series.push(1e9);
        series.extend((0..40).map(|i| 1.0 + 1e-9 * (i % 5) as f64));
        for (i, &x) in series.iter().enumerate() {
            let s = w.push(x).unwrap();
            if i >= 20 {
                let direct = window_anomaly_score_direct(&series[i - 20..i], x).unwrap();
                let s = s.unwrap();
                if i > 41 {
                    assert!(
                        (s.score - direct.score).abs() <= 1e-6 * direct.score.max(1.0),
                        "i={i} {s:?} {direct:?}"
                    );
                }
            }
        }
    }

    proptest! {
        #[test]
        fn streaming_equals_direct(values in prop::collection::vec(-1e3f64..1e3, 3..400), w in 3usize..40, offset in -1e6f64..1e6) {
            let values: Vec<f64> = values.iter().map(|v| v + offset).collect();
            let mut s = WindowAnomaly::new(w).unwrap();
            for (i, &x) in values.iter().enumerate() {
                let got = s.push(x).unwrap();
                if i >= w {
                    let direct = window_anomaly_score_direct(&values[i - w..i], x).unwrap();
                    let got = got.unwrap();
                    // the direct two-pass form itself carries eps * |offset| / std of rounding
                    let tol = 1e-9 * direct.score.max(1.0) + 1e-12 * (offset.abs() + 1e3) / (direct.std + STD_EPSILON);
                    prop_assert!((got.score - direct.score).abs() <= tol, "i={} got={:?} direct={:?}", i, got, direct);
                } else {
                    prop_assert!(got.is_none());
                }
            }
        }

        #[test]
        fn score_is_non_negative(values in prop::collection::vec(-1e6f64..1e6, 3..100)) {
            let mut s = WindowAnomaly::new(3).unwrap();
            for x in values {
                if let Some(sc) = s.push(x).unwrap() {
                    prop_assert!(sc.score >= 0.0 && sc.z >= 0.0 && sc.std >= 0.0);
                }
            }
        }
    }
}

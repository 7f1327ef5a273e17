//! NAB's numenta detector post-processing, ported: the anomaly likelihood of nupic's
//! `AnomalyLikelihood` (moving average of 10 raw scores, a normal fit re-estimated every
//! 100 rows over a history of 8640, the upper tail probability, the red-to-yellow
//! filter, the log scale) and the detector's spatial-anomaly rule (a value more than 5%
//! of the seen range beyond it scores 1). Checked in omen-model's tests against NAB's
//! published numenta results: from their `raw_score` column it reproduces their
//! `anomaly_score` column.

use std::collections::VecDeque;

use crate::{invalid, SignalError};

/// Moving-average window of raw scores (nupic's `averagingWindow`).
const AVERAGING_WINDOW: usize = 10;
/// Raw scores kept for the fit (nupic's `historicWindowSize`).
const HISTORY: usize = 8640;
/// Rows between two fits (NAB's `reestimationPeriod`).
const REESTIMATION_PERIOD: u64 = 100;
/// Tail probability at or below which a row is red (1 - nupic's redThreshold 0.99999).
const RED_TAIL: f64 = 1e-5;
/// What a red row after a red row is lowered to (1 - nupic's yellowThreshold 0.999).
const YELLOW_TAIL: f64 = 1e-3;
/// The spatial-anomaly tolerance, a fraction of the seen range (NAB's `spatialTolerance`).
const SPATIAL_TOLERANCE: f64 = 0.05;

/// nupic's rounded sqrt(2) in its Q function.
#[allow(clippy::approx_constant)]
const NUPIC_SQRT_2: f64 = 1.4142;

/// A normal distribution (mean, standard deviation).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Normal {
    mean: f64,
    stdev: f64,
}

/// nupic's `nullDistribution`: nothing is unlikely under it.
const NULL: Normal = Normal { mean: 0.5, stdev: 1e3 };

/// nupic's `tailProbability`: P(X > x), the lower half by symmetry about the mean.
fn tail_probability(x: f64, d: Normal) -> f64 {
    if x < d.mean {
        return 1.0 - tail_probability(2.0 * d.mean - x, d);
    }
    let z = (x - d.mean) / d.stdev;
    // nupic divides by 1.4142, not sqrt(2); kept so that scores match NAB's to the last digits.
    0.5 * statrs::function::erf::erfc(z / NUPIC_SQRT_2)
}

/// nupic's `estimateNormal` (population variance), with or without its lower bounds on the
/// mean (0.03) and variance (0.0003).
fn estimate_normal(values: &[f64], lower_bounds: bool) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    if lower_bounds {
        (mean.max(0.03), var.max(0.0003))
    } else {
        (mean, var)
    }
}

/// nupic's `computeLogLikelihood`: `ln(1.0000000001 - L) / ln(1e-10)`, clamped to [0, 1]
/// (the formula itself dips to -4.3e-12 at L = 0).
pub fn htm_log_likelihood(likelihood: f64) -> f64 {
    ((1.000_000_000_1 - likelihood).ln() / -23.025_850_847_200_09).clamp(0.0, 1.0)
}

/// The numenta detector's final score from a raw anomaly score, one row at a time.
#[derive(Debug, Clone)]
pub struct HtmLikelihood {
    learning: usize,
    probation: u64,
    iteration: u64,
    /// (metric value, raw score) of the last [`HISTORY`] rows.
    history: VecDeque<(f64, f64)>,
    distribution: Option<Normal>,
    window: VecDeque<f64>,
    window_total: f64,
    /// The unfiltered tail probability of the previous row.
    previous_tail: Option<f64>,
    min_value: Option<f64>,
    max_value: Option<f64>,
}

impl HtmLikelihood {
    /// A detector for a file with `probation` probationary rows (NAB: min(15%, 750));
    /// half of them are nupic's learning period, the rest its estimation samples.
    pub fn new(probation: usize) -> Result<Self, SignalError> {
        if probation < 2 {
            return Err(invalid("probation", probation, "must be at least 2 rows"));
        }
        Ok(Self {
            learning: probation / 2,
            probation: probation as u64,
            iteration: 0,
            history: VecDeque::with_capacity(HISTORY + 1),
            distribution: None,
            window: VecDeque::with_capacity(AVERAGING_WINDOW + 1),
            window_total: 0.0,
            previous_tail: None,
            min_value: None,
            max_value: None,
        })
    }

    /// nupic's `estimateAnomalyLikelihoods` over the history: the fit, and the unfiltered
    /// tail probability of the history's last moving average under it.
    fn estimate(&self) -> (Normal, Option<f64>) {
        let shifted_out = (self.iteration as usize).saturating_sub(HISTORY);
        let skip = (self.iteration as usize).min(self.learning.saturating_sub(shifted_out));
        let mut averages = Vec::with_capacity(self.history.len());
        let mut window = VecDeque::with_capacity(AVERAGING_WINDOW + 1);
        let mut total = 0.0;
        for &(_, raw) in &self.history {
            window.push_back(raw);
            total += raw;
            if window.len() > AVERAGING_WINDOW {
                total -= window.pop_front().expect("longer than the window");
            }
            averages.push(total / window.len() as f64);
        }
        let distribution = if averages.len() <= skip {
            NULL
        } else {
            let (mean, var) = estimate_normal(&averages[skip..], true);
            let metric: Vec<f64> = self.history.iter().skip(skip).map(|r| r.0).collect();
            // nupic's "HACK ALERT": a flat metric is reported as not anomalous.
            if estimate_normal(&metric, false).1 < 1.5e-5 {
                NULL
            } else {
                Normal { mean, stdev: var.sqrt() }
            }
        };
        (distribution, averages.last().map(|&a| tail_probability(a, distribution)))
    }

    /// Adds one row (its metric value and raw anomaly score in [0, 1]) and returns the
    /// detector's final score in [0, 1].
    pub fn push(&mut self, value: f64, raw: f64) -> Result<f64, SignalError> {
        let index = self.iteration as usize;
        if !value.is_finite() {
            return Err(SignalError::NonFinite { input: "value", index, value });
        }
        if !raw.is_finite() {
            return Err(SignalError::NonFinite { input: "raw score", index, value: raw });
        }
        // The spatial rule uses the range before this row.
        let spatial = match (self.min_value, self.max_value) {
            (Some(lo), Some(hi)) if lo != hi => {
                let tolerance = (hi - lo) * SPATIAL_TOLERANCE;
                value > hi + tolerance || value < lo - tolerance
            }
            _ => false,
        };
        self.min_value = Some(self.min_value.map_or(value, |m| m.min(value)));
        self.max_value = Some(self.max_value.map_or(value, |m| m.max(value)));

        self.window.push_back(raw);
        self.window_total += raw;
        if self.window.len() > AVERAGING_WINDOW {
            self.window_total -= self.window.pop_front().expect("longer than the window");
        }
        let likelihood = if self.iteration < self.probation {
            0.5
        } else {
            if self.distribution.is_none() || self.iteration % REESTIMATION_PERIOD == 0 {
                let (d, last_tail) = self.estimate();
                self.distribution = Some(d);
                self.previous_tail = last_tail;
            }
            let d = self.distribution.expect("estimated above");
            let average = self.window_total / self.window.len() as f64;
            let tail = tail_probability(average, d);
            let filtered = match self.previous_tail {
                Some(prev) if tail <= RED_TAIL && prev <= RED_TAIL => YELLOW_TAIL,
                _ => tail,
            };
            self.previous_tail = Some(tail);
            1.0 - filtered
        };
        self.history.push_back((value, raw));
        if self.history.len() > HISTORY {
            self.history.pop_front();
        }
        self.iteration += 1;
        Ok(if spatial { 1.0 } else { htm_log_likelihood(likelihood) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn probation_scores_the_log_of_one_half_and_a_jump_scores_one() {
        let mut h = HtmLikelihood::new(20).unwrap();
        // 10, 12, 11, 10, 12, ...: inside the range seen once the range is not a point.
        let first: Vec<f64> = (0..20).map(|i| h.push([10.0, 12.0, 11.0][i % 3], 0.0).unwrap()).collect();
        // NAB's numenta results open with 0.0301029996659: the log score of 0.5.
        assert!(first.iter().all(|&s| (s - 0.030_102_999_665_9).abs() < 1e-9), "{first:?}");
        assert_eq!(h.push(100.0, 0.0).unwrap(), 1.0, "far beyond the seen range");
        assert!(HtmLikelihood::new(1).is_err());
        assert!(h.push(f64::NAN, 0.0).is_err() && h.push(1.0, f64::INFINITY).is_err());
    }

    #[test]
    fn a_burst_of_raw_anomalies_is_red_once_then_yellow() {
        let mut h = HtmLikelihood::new(200).unwrap();
        for i in 0..400 {
            h.push((i % 7) as f64, if i % 50 == 0 { 0.3 } else { 0.0 }).unwrap();
        }
        let burst: Vec<f64> = (0..6).map(|i| h.push((i % 7) as f64, 1.0).unwrap()).collect();
        let red = burst.iter().position(|&s| s >= 0.5).expect("a red row");
        // After the first red row, a red row is lowered to yellow: ln(1e-3)/ln(1e-10) = 0.3.
        assert!((burst[red + 1] - 0.3).abs() < 1e-6, "{burst:?}");
    }

    proptest! {
        #[test]
        fn scores_are_in_the_unit_interval(
            rows in proptest::collection::vec((-50.0f64..50.0, 0.0f64..1.0), 1..500),
            probation in 2usize..100,
        ) {
            let mut h = HtmLikelihood::new(probation).unwrap();
            for (v, r) in rows {
                let s = h.push(v, r).unwrap();
                prop_assert!((0.0..=1.0).contains(&s), "{}", s);
            }
        }
    }
}

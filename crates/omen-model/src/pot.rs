//! Peaks-over-threshold (EVT): a generalised Pareto tail fitted to the errors
//! above a high initial quantile gives the threshold exceeded with probability
//! `risk`; reconstruction errors then map to a [0, 1] severity with that
//! threshold at the warning level (0.6).

use serde::{Deserialize, Serialize};

use crate::ModelError;

/// A fitted POT threshold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PotThreshold {
    /// Initial threshold t (the `initial_quantile` of the errors).
    pub initial: f64,
    /// GPD shape (gamma).
    pub shape: f64,
    /// GPD scale (sigma).
    pub scale: f64,
    /// Final threshold z_q, exceeded with probability `risk` under the fitted tail.
    pub threshold: f64,
    /// The risk q.
    pub risk: f64,
}

impl PotThreshold {
    /// Fits on validation errors; `initial_quantile` e.g. 0.98, `risk` e.g. 1e-3.
    pub fn fit(errors: &[f64], initial_quantile: f64, risk: f64) -> Result<Self, ModelError> {
        if !(0.5..1.0).contains(&initial_quantile) {
            return Err(ModelError::Parameter {
                parameter: "initial_quantile",
                reason: format!("{initial_quantile} must be in [0.5, 1)"),
            });
        }
        if !(risk > 0.0 && risk < 1.0 - initial_quantile) {
            return Err(ModelError::Parameter {
                parameter: "risk",
                reason: format!("{risk} must be in (0, {})", 1.0 - initial_quantile),
            });
        }
        if let Some((i, &v)) = errors.iter().enumerate().find(|(_, v)| !v.is_finite() || **v < 0.0) {
            return Err(ModelError::NonFinite { row: i, feature: 0, value: v });
        }
        let mut sorted = errors.to_vec();
        sorted.sort_by(f64::total_cmp);
        let initial = omen_signals::quantile_linear(&sorted, initial_quantile);
        let excesses: Vec<f64> = sorted.iter().filter(|&&e| e > initial).map(|e| e - initial).collect();
        if excesses.len() < 10 || sorted.len() < 100 {
            return Err(ModelError::TooFew {
                what: "validation errors above the initial threshold",
                have: excesses.len(),
                need: 10,
            });
        }
        // Method of moments for the GPD: robust and closed-form (Grimshaw's MLE is an option later).
        let n = excesses.len() as f64;
        let mean = excesses.iter().sum::<f64>() / n;
        let var = excesses.iter().map(|y| (y - mean) * (y - mean)).sum::<f64>() / (n - 1.0);
        let ratio = if var > 0.0 { mean * mean / var } else { 1.0 };
        let shape = 0.5 * (1.0 - ratio);
        let scale = 0.5 * mean * (ratio + 1.0);
        let tail = risk * sorted.len() as f64 / n;
        let threshold = if shape.abs() < 1e-9 {
            initial - scale * tail.ln()
        } else {
            initial + scale / shape * (tail.powf(-shape) - 1.0)
        };
        Ok(Self { initial, shape, scale, threshold, risk })
    }
}

/// Severity at the POT threshold: a window scoring at least this alarms (the agent's
/// warning level).
pub const ALARM_SEVERITY: f64 = 0.6;

/// Maps an error to a severity: 0.6 at the POT threshold, rising towards 1 beyond it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SeverityMap {
    /// The POT threshold (errors at it map to the warning level).
    pub threshold: f64,
}

impl SeverityMap {
    /// Severity of a reconstruction error in [0, 1].
    pub fn severity(&self, error: f64) -> f64 {
        if !error.is_finite() || self.threshold <= 0.0 {
            return if error.is_nan() { 0.0 } else { 1.0 };
        }
        if error <= self.threshold {
            ALARM_SEVERITY * (error / self.threshold).max(0.0)
        } else {
            ALARM_SEVERITY
                + (1.0 - ALARM_SEVERITY) * (1.0 - (-(error - self.threshold) / self.threshold).exp())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn exponential_errors_give_the_analytic_quantile() {
        // Exponential(1) errors: the tail beyond any t is exponential, so z_q = -ln(q).
        let n = 200_000;
        let errors: Vec<f64> = (0..n).map(|i| -((i as f64 + 0.5) / n as f64).ln()).collect();
        let pot = PotThreshold::fit(&errors, 0.98, 1e-4).unwrap();
        assert!(pot.shape.abs() < 0.05, "{pot:?}");
        assert!((pot.threshold - (1e4f64).ln()).abs() < 0.1, "{pot:?}");
    }

    #[test]
    fn parameters_are_checked() {
        let e: Vec<f64> = (0..1000).map(|i| i as f64).collect();
        assert!(PotThreshold::fit(&e, 0.2, 1e-3).is_err());
        assert!(PotThreshold::fit(&e, 0.98, 0.5).is_err());
        assert!(PotThreshold::fit(&e[..50], 0.98, 1e-3).is_err());
        assert!(PotThreshold::fit(&[f64::NAN; 200], 0.98, 1e-3).is_err());
    }

    proptest! {
        #[test]
        fn severity_is_monotone_in_unit_interval(a in 0.0f64..100.0, b in 0.0f64..100.0, t in 0.01f64..10.0) {
            let m = SeverityMap { threshold: t };
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(m.severity(lo) <= m.severity(hi));
            prop_assert!((0.0..=1.0).contains(&m.severity(hi)));
            prop_assert!((m.severity(t) - 0.6).abs() < 1e-12);
        }
    }
}

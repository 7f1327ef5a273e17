//! The per-series detector the pipeline runs on every live sample (`signals.detector`).
//! The NAB evaluation (`omen evaluate-detectors`) scores this same object's score stream
//! at NAB's swept threshold; the agent maps scores to risk with the configured bounds.

use omen_signals::{day_fraction_utc, LearningNoveltySurprise, SignalError, WindowAnomaly, WindowScore};

use crate::config::{DetectorKind, SignalsConfig};

/// What one sample did to its series' detector.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Detection {
    /// The window score, once the window is full: the old normal a change is judged against.
    pub window: Option<WindowScore>,
    /// The configured detector's anomaly score, once it scores (the window score, or the
    /// NoveltySurprise score in [0, 1]).
    pub score: Option<f64>,
    /// That score mapped to a risk in [0, 1] by the detector's normal and full bounds.
    pub risk: f64,
}

/// One series' detector: the window score always, and NoveltySurprise when configured.
#[derive(Debug, Clone)]
pub struct SeriesDetector {
    window: WindowAnomaly,
    novelty: Option<LearningNoveltySurprise>,
    /// Scores mapped to risk 0 and 1.
    normal: f64,
    full: f64,
}

impl SeriesDetector {
    /// The detector `signals` configures (validated at start-up).
    pub fn new(signals: &SignalsConfig) -> Result<Self, SignalError> {
        Self::with_learning(signals, signals.novelty_surprise.learning_samples)
    }

    /// [`Self::new`] learning from `learning` samples instead of
    /// `novelty_surprise.learning_samples` (NAB gives each file its probationary period).
    pub fn with_learning(signals: &SignalsConfig, learning: usize) -> Result<Self, SignalError> {
        let n = &signals.novelty_surprise;
        let (novelty, normal, full) = match signals.detector {
            DetectorKind::Window => (None, signals.anomaly_normal, signals.anomaly_full),
            DetectorKind::NoveltySurprise => (
                Some(LearningNoveltySurprise::new(learning, n.range_pad, n.detector_config())?),
                n.risk_normal,
                n.risk_full,
            ),
        };
        Ok(Self { window: WindowAnomaly::new(signals.window)?, novelty, normal, full })
    }

    /// Adds the sample `x` at `ts_ms`. Fails only on a non-finite value.
    pub fn push(&mut self, ts_ms: i64, x: f64) -> Result<Detection, SignalError> {
        let window = self.window.push(x)?;
        let score = match self.novelty.as_mut() {
            Some(n) => n.push(x, day_fraction_utc(ts_ms))?,
            None => window.map(|w| w.score),
        };
        let risk = score.map_or(0.0, |s| ((s - self.normal) / (self.full - self.normal)).clamp(0.0, 1.0));
        Ok(Detection { window, score, risk })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signals(yaml: &str) -> SignalsConfig {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn the_window_detector_scores_once_its_window_is_full() {
        let mut d = SeriesDetector::new(&signals("{detector: window, window: 5}")).unwrap();
        // A value is scored against the 5 before it.
        for i in 0..5 {
            let out = d.push(i * 1000, 1.0 + (i % 2) as f64 * 0.1).unwrap();
            assert_eq!((out.window, out.score, out.risk), (None, None, 0.0));
        }
        let calm = d.push(5000, 1.0).unwrap();
        assert!(calm.score.is_some());
        assert_eq!(calm.score, calm.window.map(|w| w.score));
        assert_eq!(calm.risk, 0.0);
        let jump = d.push(6000, 100.0).unwrap();
        assert!(jump.score.unwrap() >= 12.0 && jump.risk == 1.0, "{jump:?}");
    }

    #[test]
    fn novelty_surprise_learns_then_flags_a_value_beyond_its_range() {
        let cfg = signals("{detector: novelty_surprise, window: 5, novelty_surprise: {learning_samples: 20, refractory: 5}}");
        let mut d = SeriesDetector::new(&cfg).unwrap();
        for i in 0..20 {
            let out = d.push(i * 60_000, 1.0 + (i % 3) as f64 * 0.1).unwrap();
            assert_eq!(out.score, None, "learning");
            assert_eq!(out.risk, 0.0);
            assert_eq!(out.window.is_some(), i >= 5);
        }
        let jump = d.push(20 * 60_000, 5.0).unwrap();
        assert_eq!(jump.score, Some(1.0));
        assert_eq!(jump.risk, 1.0);
        assert!(d.push(21 * 60_000, f64::NAN).is_err());
    }

    #[test]
    fn with_learning_overrides_the_configured_period() {
        let cfg = signals("{detector: novelty_surprise, window: 3}");
        let mut d = SeriesDetector::with_learning(&cfg, 2).unwrap();
        assert_eq!(d.push(0, 1.0).unwrap().score, None);
        assert_eq!(d.push(1, 1.0).unwrap().score, None);
        assert!(d.push(2, 1.0).unwrap().score.is_some());
    }
}

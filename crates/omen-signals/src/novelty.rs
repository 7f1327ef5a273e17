//! Post-processing of anomaly scores for sparse, early detections (what NAB rewards):
//! an HTM-style anomaly likelihood of a raw score, a range-novelty flag for values
//! beyond everything seen so far, and a context-model surprise of each value.
//!
//! The likelihood follows the idea of Ahmad et al., "Unsupervised real-time anomaly
//! detection for streaming data" (2017): a raw score is judged by how unlikely the
//! short-term mean of recent scores is under a normal fit to that mean over a long
//! history, reported on a log scale so that only very unlikely runs come near 1.

use std::collections::{HashMap, VecDeque};

use crate::{invalid, SignalError};

/// Parameters of [`AnomalyLikelihood`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LikelihoodConfig {
    /// Raw scores averaged into the short-term mean (HTM uses 10).
    pub short_window: usize,
    /// Short-term means kept for the normal fit (HTM uses 8640, a month of 5-minute rows).
    pub history: usize,
    /// Means needed before any likelihood is reported.
    pub learning: usize,
    /// Floor on the fitted standard deviation, so a flat history does not make every wiggle certain.
    pub min_std: f64,
}

impl Default for LikelihoodConfig {
    fn default() -> Self {
        Self { short_window: 10, history: 8640, learning: 300, min_std: 0.03 }
    }
}

/// Streaming anomaly likelihood of a raw score; O(1) per push.
#[derive(Debug, Clone)]
pub struct AnomalyLikelihood {
    config: LikelihoodConfig,
    short: VecDeque<f64>,
    short_sum: f64,
    means: VecDeque<f64>,
    sum: f64,
    sum_sq: f64,
    pushed: u64,
}

/// `ln(1e-10)`: the log scale's floor; a likelihood of 1 maps to 1.
const LOG_FLOOR: f64 = -23.025_850_929_940_457;

/// Maps a likelihood in [0, 1] to [0, 1] on a log scale: `ln(1 - L + 1e-10) / ln(1e-10)`.
/// 0.9 maps to 0.1, 0.999 to 0.3, 1 - 1e-10 to 0.97, 1 to 1.
pub fn log_likelihood_score(likelihood: f64) -> f64 {
    ((1.0 - likelihood + 1e-10).ln() / LOG_FLOOR).clamp(0.0, 1.0)
}

impl AnomalyLikelihood {
    /// A likelihood estimator; fails on a zero window, a learning period of 0 or longer
    /// than the history, or a non-positive `min_std`.
    pub fn new(config: LikelihoodConfig) -> Result<Self, SignalError> {
        if config.short_window == 0 {
            return Err(invalid("short_window", 0, "must be at least 1"));
        }
        if config.learning == 0 || config.learning > config.history {
            return Err(invalid(
                "learning",
                config.learning,
                format!("must be in 1..=history ({})", config.history),
            ));
        }
        if !(config.min_std > 0.0 && config.min_std.is_finite()) {
            return Err(invalid("min_std", config.min_std, "must be a finite number > 0"));
        }
        Ok(Self {
            config,
            short: VecDeque::with_capacity(config.short_window + 1),
            short_sum: 0.0,
            means: VecDeque::with_capacity(config.history + 1),
            sum: 0.0,
            sum_sq: 0.0,
            pushed: 0,
        })
    }

    /// Adds one raw score and returns the likelihood score of the run it ends, in
    /// [0, 1] on the [`log_likelihood_score`] scale; `None` while learning.
    pub fn push(&mut self, raw: f64) -> Result<Option<f64>, SignalError> {
        if !raw.is_finite() {
            return Err(SignalError::NonFinite {
                input: "raw score",
                index: self.pushed as usize,
                value: raw,
            });
        }
        self.pushed += 1;
        self.short.push_back(raw);
        self.short_sum += raw;
        if self.short.len() > self.config.short_window {
            self.short_sum -= self.short.pop_front().expect("longer than the window");
        }
        let mean_now = self.short_sum / self.short.len() as f64;
        // Judged against the history before it, then added to it.
        let out = (self.means.len() >= self.config.learning).then(|| {
            let n = self.means.len() as f64;
            let mean = self.sum / n;
            let std = (self.sum_sq / n - mean * mean).max(0.0).sqrt().max(self.config.min_std);
            let tail =
                0.5 * statrs::function::erf::erfc((mean_now - mean) / (std * std::f64::consts::SQRT_2));
            log_likelihood_score(1.0 - tail)
        });
        self.means.push_back(mean_now);
        self.sum += mean_now;
        self.sum_sq += mean_now * mean_now;
        if self.means.len() > self.config.history {
            let old = self.means.pop_front().expect("longer than the history");
            self.sum -= old;
            self.sum_sq -= old * old;
        }
        // Running sums drift by rounding over millions of pushes; refresh them once per history.
        if self.pushed % self.config.history as u64 == 0 {
            self.sum = self.means.iter().sum();
            self.sum_sq = self.means.iter().map(|m| m * m).sum();
            self.short_sum = self.short.iter().sum();
        }
        Ok(out)
    }
}

/// Flags values beyond the range of everything seen before, widened by `tolerance` x range,
/// at most once per `refractory` pushes (a lasting excursion is one alarm, not hundreds).
#[derive(Debug, Clone)]
pub struct RangeNovelty {
    tolerance: f64,
    refractory: u64,
    low: f64,
    high: f64,
    last_flag: Option<u64>,
    pushed: u64,
}

impl RangeNovelty {
    /// A novelty flag; `tolerance` >= 0 is the fraction of the seen range a value must exceed it by.
    pub fn new(tolerance: f64, refractory: u64) -> Result<Self, SignalError> {
        if !(tolerance >= 0.0 && tolerance.is_finite()) {
            return Err(invalid("tolerance", tolerance, "must be a finite number >= 0"));
        }
        Ok(Self {
            tolerance,
            refractory,
            low: f64::INFINITY,
            high: f64::NEG_INFINITY,
            last_flag: None,
            pushed: 0,
        })
    }

    /// Adds one value; true when it is new ground (and not within `refractory` of the last flag).
    pub fn push(&mut self, x: f64) -> Result<bool, SignalError> {
        if !x.is_finite() {
            return Err(SignalError::NonFinite { input: "value", index: self.pushed as usize, value: x });
        }
        let index = self.pushed;
        self.pushed += 1;
        let margin = self.tolerance * (self.high - self.low);
        let novel = self.high >= self.low && (x > self.high + margin || x < self.low - margin);
        self.low = self.low.min(x);
        self.high = self.high.max(x);
        let flag = novel && self.last_flag.is_none_or(|last| index - last >= self.refractory);
        if flag {
            self.last_flag = Some(index);
        }
        Ok(flag)
    }
}

/// How surprising a value is after the values before it, an analogue of HTM's prediction
/// error: values are quantised into `bins` equal bins over `[low, high)` (plus one bin
/// below and one above), and an order-`order` context model counts which bin followed
/// each run of the previous `order` bins. The surprise is `1 - P(bin | context)` with
/// add-`alpha` smoothing, from the longest context seen before (backing off to shorter
/// ones, down to the plain bin frequencies; the very first value scores 1). About 0 on a
/// pattern seen many times, near 1 on a new one. Memory is bounded: at most
/// `(bins + 2)^k` contexts of each length k <= order.
#[derive(Debug, Clone)]
pub struct ContextSurprise {
    low: f64,
    width: f64,
    bins: usize,
    order: usize,
    alpha: f64,
    /// Per context length k (0..=order): context code -> (count per bin, total).
    counts: Vec<HashMap<u64, (Vec<f64>, f64)>>,
    recent: VecDeque<u16>,
    pushed: u64,
}

impl ContextSurprise {
    /// Most bins: context codes of length `order` must fit in a u64.
    pub const MAX_BINS: usize = 1024;

    /// A surprise model over `[low, high)`; fails unless `low < high` (both finite),
    /// 1 <= `bins` <= [`Self::MAX_BINS`], `order` <= 4 and `alpha` > 0.
    pub fn new(low: f64, high: f64, bins: usize, order: usize, alpha: f64) -> Result<Self, SignalError> {
        if !(low.is_finite() && high.is_finite() && low < high) {
            return Err(invalid("high", high, format!("must be finite and above low ({low})")));
        }
        if bins == 0 || bins > Self::MAX_BINS {
            return Err(invalid("bins", bins, format!("must be in 1..={}", Self::MAX_BINS)));
        }
        if order > 4 {
            return Err(invalid("order", order, "must be at most 4"));
        }
        if !(alpha > 0.0 && alpha.is_finite()) {
            return Err(invalid("alpha", alpha, "must be a finite number > 0"));
        }
        Ok(Self {
            low,
            width: (high - low) / bins as f64,
            bins,
            order,
            alpha,
            counts: vec![HashMap::new(); order + 1],
            recent: VecDeque::with_capacity(order + 1),
            pushed: 0,
        })
    }

    /// The bin of `x`: 0 below `low`, `bins + 1` at or above `high`.
    fn bin(&self, x: f64) -> u16 {
        let b = ((x - self.low) / self.width).floor();
        if b < 0.0 {
            0
        } else if b >= self.bins as f64 {
            (self.bins + 1) as u16
        } else {
            b as u16 + 1
        }
    }

    /// Code of the last `k` bins.
    fn context(&self, k: usize) -> u64 {
        let base = (self.bins + 2) as u64;
        self.recent.iter().skip(self.recent.len() - k).fold(0u64, |code, &b| code * base + u64::from(b))
    }

    /// Adds one value and returns its surprise in [0, 1].
    pub fn push(&mut self, x: f64) -> Result<f64, SignalError> {
        if !x.is_finite() {
            return Err(SignalError::NonFinite { input: "value", index: self.pushed as usize, value: x });
        }
        self.pushed += 1;
        let bin = usize::from(self.bin(x));
        let n_bins = (self.bins + 2) as f64;
        let longest = self.order.min(self.recent.len());
        let mut surprise = 1.0;
        for k in (0..=longest).rev() {
            if let Some((next, total)) = self.counts[k].get(&self.context(k)) {
                surprise = 1.0 - (next[bin] + self.alpha) / (total + self.alpha * n_bins);
                break;
            }
        }
        for k in 0..=longest {
            let code = self.context(k);
            let (next, total) = self.counts[k].entry(code).or_insert_with(|| (vec![0.0; self.bins + 2], 0.0));
            next[bin] += 1.0;
            *total += 1.0;
        }
        self.recent.push_back(bin as u16);
        if self.recent.len() > self.order {
            self.recent.pop_front();
        }
        Ok(surprise.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn small(learning: usize, history: usize) -> LikelihoodConfig {
        LikelihoodConfig { short_window: 3, history, learning, min_std: 0.03 }
    }

    #[test]
    fn log_scale_matches_its_definition() {
        assert!(log_likelihood_score(0.5) < 0.04);
        assert!((log_likelihood_score(0.9) - (0.1f64 + 1e-10).ln() / LOG_FLOOR).abs() < 1e-12);
        assert!((log_likelihood_score(0.999) - 0.3).abs() < 1e-6);
        assert!((log_likelihood_score(1.0 - 1e-10) - 2e-10f64.ln() / LOG_FLOOR).abs() < 1e-6);
        assert_eq!(log_likelihood_score(1.0), 1.0);
        assert_eq!(log_likelihood_score(0.0), 0.0);
    }

    #[test]
    fn a_run_of_high_scores_after_quiet_ones_is_unlikely() {
        let mut lk = AnomalyLikelihood::new(small(20, 100)).unwrap();
        let quiet: Vec<Option<f64>> =
            (0..40).map(|i| lk.push(0.1 + 0.01 * (i % 3) as f64).unwrap()).collect();
        assert!(quiet[..20].iter().all(Option::is_none), "learning: {quiet:?}");
        assert!(quiet[20..].iter().all(|s| s.unwrap() < 0.3), "{quiet:?}");
        // A small rise is a little unlikely, a jump to 0.9 is near certain.
        let rise = lk.push(0.16).unwrap().unwrap();
        assert!(quiet[39].unwrap() < rise && rise < 0.9, "{rise}");
        let spike: Vec<f64> = (0..3).map(|_| lk.push(0.9).unwrap().unwrap()).collect();
        assert!(spike.iter().all(|&s| s > 0.99), "{spike:?}");
    }

    #[test]
    fn bad_parameters_and_inputs_are_named() {
        let e = AnomalyLikelihood::new(LikelihoodConfig { learning: 0, ..Default::default() }).unwrap_err();
        assert!(e.to_string().contains("learning"), "{e}");
        assert!(AnomalyLikelihood::new(LikelihoodConfig { short_window: 0, ..Default::default() }).is_err());
        assert!(AnomalyLikelihood::new(LikelihoodConfig { min_std: 0.0, ..Default::default() }).is_err());
        let mut lk = AnomalyLikelihood::new(Default::default()).unwrap();
        assert!(matches!(lk.push(f64::NAN), Err(SignalError::NonFinite { .. })));
        assert!(RangeNovelty::new(-0.1, 0).is_err());
        assert!(RangeNovelty::new(0.0, 0).unwrap().push(f64::INFINITY).is_err());
    }

    #[test]
    fn novelty_flags_new_ground_once_per_refractory_period() {
        let mut nv = RangeNovelty::new(0.1, 3).unwrap();
        let flags: Vec<bool> = [5.0, 6.0, 5.5, 6.05, 6.2, 7.0, 8.0, 9.0, 9.5, 12.0, 0.0]
            .iter()
            .map(|&x| nv.push(x).unwrap())
            .collect();
        // 6.0 is new (range 0); 6.05 is within 10% of the range [5, 6]; 6.2 is beyond it;
        // 7.0 and 8.0 are within 3 of the flag at 6.2; 9.0 (index 7) is 3 after it.
        assert_eq!(flags, [false, true, false, false, true, false, false, true, false, false, true]);
    }

    #[test]
    fn a_repeated_pattern_stops_surprising_and_a_new_value_does() {
        let mut cs = ContextSurprise::new(0.0, 4.0, 4, 2, 0.1).unwrap();
        let pattern = [0.5, 1.5, 2.5, 3.5];
        let mut last_round = Vec::new();
        for round in 0..30 {
            let s: Vec<f64> = pattern.iter().map(|&x| cs.push(x).unwrap()).collect();
            if round == 0 {
                assert_eq!(s[0], 1.0, "the first value has no model yet");
            }
            last_round = s;
        }
        assert!(last_round.iter().all(|&s| s < 0.05), "{last_round:?}");
        // A known value out of turn, then a value beyond the range: both surprising.
        assert!(cs.push(2.5).unwrap() > 0.9);
        assert!(cs.push(9.0).unwrap() > 0.9);
        assert!(ContextSurprise::new(1.0, 1.0, 4, 2, 0.1).is_err());
        assert!(ContextSurprise::new(0.0, 1.0, 0, 2, 0.1).is_err());
        assert!(ContextSurprise::new(0.0, 1.0, 4, 5, 0.1).is_err());
        assert!(ContextSurprise::new(0.0, 1.0, 4, 2, 0.0).is_err());
        assert!(cs.push(f64::NAN).is_err());
    }

    proptest! {
        #[test]
        fn surprise_is_a_probability_complement_and_repeats_make_it_fall(
            xs in proptest::collection::vec(-10.0f64..10.0, 1..200),
            bins in 1usize..20,
            order in 0usize..4,
        ) {
            let mut cs = ContextSurprise::new(-5.0, 5.0, bins, order, 0.5).unwrap();
            for &x in &xs {
                let s = cs.push(x).unwrap();
                prop_assert!((0.0..=1.0).contains(&s));
            }
            // The same value over and over: each repeat is no more surprising than the one before.
            let mut prev = f64::INFINITY;
            for _ in 0..order + 1 {
                cs.push(xs[0]).unwrap();
            }
            for _ in 0..20 {
                let s = cs.push(xs[0]).unwrap();
                prop_assert!(s <= prev + 1e-12, "{} after {}", s, prev);
                prev = s;
            }
        }
    }

    proptest! {
        #[test]
        fn likelihood_is_a_score_and_its_running_sums_match_a_direct_fit(
            raw in proptest::collection::vec(0.0f64..1.0, 1..400),
        ) {
            let cfg = LikelihoodConfig { short_window: 4, history: 50, learning: 10, min_std: 0.03 };
            let mut lk = AnomalyLikelihood::new(cfg).unwrap();
            let mut means = Vec::new();
            for (i, &r) in raw.iter().enumerate() {
                let got = lk.push(r).unwrap();
                let short = &raw[(i + 1).saturating_sub(4)..=i];
                let m = short.iter().sum::<f64>() / short.len() as f64;
                let hist = &means[means.len().saturating_sub(50)..];
                if hist.len() >= 10 {
                    let n = hist.len() as f64;
                    let mu = hist.iter().sum::<f64>() / n;
                    let sd = (hist.iter().map(|x| (x - mu) * (x - mu)).sum::<f64>() / n).sqrt().max(0.03);
                    let want = log_likelihood_score(1.0 - 0.5 * statrs::function::erf::erfc((m - mu) / (sd * std::f64::consts::SQRT_2)));
                    let got = got.unwrap();
                    prop_assert!((0.0..=1.0).contains(&got));
                    prop_assert!((got - want).abs() < 1e-6, "{} vs {}", got, want);
                } else {
                    prop_assert!(got.is_none());
                }
                means.push(m);
            }
        }

        #[test]
        fn novelty_never_flags_within_the_refractory_period_or_inside_the_range(
            xs in proptest::collection::vec(-100.0f64..100.0, 1..300),
            refractory in 0u64..20,
        ) {
            let mut nv = RangeNovelty::new(0.0, refractory).unwrap();
            let mut last: Option<usize> = None;
            for (i, &x) in xs.iter().enumerate() {
                let flag = nv.push(x).unwrap();
                let seen = &xs[..i];
                let beyond = !seen.is_empty() && seen.iter().all(|&s| x > s) || !seen.is_empty() && seen.iter().all(|&s| x < s);
                if flag {
                    prop_assert!(beyond);
                    prop_assert!(last.is_none_or(|l| (i - l) as u64 >= refractory));
                    last = Some(i);
                }
            }
        }
    }
}

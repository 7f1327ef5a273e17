//! Scores for sparse, early detections (what NAB rewards): a range-novelty flag for
//! values beyond everything seen so far, and a context-model surprise of each value.
//! NAB's numenta post-processing (the anomaly likelihood) is htm_likelihood.rs.

use std::collections::{HashMap, VecDeque};

use crate::{invalid, SignalError};

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
/// `(bins + 2)^k` contexts of each length k <= order, per tag ([`Self::push_tagged`]).
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

    /// Code of `tag` and the last `k` bins (unique per k: base^k exceeds every k-bin code).
    fn context(&self, tag: u16, k: usize) -> u64 {
        let base = (self.bins + 2) as u64;
        self.recent
            .iter()
            .skip(self.recent.len() - k)
            .fold(u64::from(tag), |code, &b| code * base + u64::from(b))
    }

    /// Adds one value and returns its surprise in [0, 1].
    pub fn push(&mut self, x: f64) -> Result<f64, SignalError> {
        self.push_tagged(x, 0)
    }

    /// [`Self::push`] with `tag` as part of every context: the same run of bins under two
    /// tags is two contexts, so a pattern that depends on, say, the time of day (tag = its
    /// bucket) is learned per bucket. Bins seen before belong to the same history whatever
    /// their tag.
    pub fn push_tagged(&mut self, x: f64, tag: u16) -> Result<f64, SignalError> {
        if !x.is_finite() {
            return Err(SignalError::NonFinite { input: "value", index: self.pushed as usize, value: x });
        }
        self.pushed += 1;
        let bin = usize::from(self.bin(x));
        let n_bins = (self.bins + 2) as f64;
        let longest = self.order.min(self.recent.len());
        let mut surprise = 1.0;
        for k in (0..=longest).rev() {
            if let Some((next, total)) = self.counts[k].get(&self.context(tag, k)) {
                surprise = 1.0 - (next[bin] + self.alpha) / (total + self.alpha * n_bins);
                break;
            }
        }
        for k in 0..=longest {
            let code = self.context(tag, k);
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

/// Parameters of [`NoveltySurprise`]. The defaults are the set leave-one-category-out
/// chose on NAB's 51 files (for 5 of its 6 folds; docs/nab.md, `omen evaluate-detectors`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NoveltySurpriseConfig {
    /// Equal bins over the value range.
    pub bins: usize,
    /// Context length, values.
    pub order: usize,
    /// Add-alpha smoothing.
    pub alpha: f64,
    /// Time-of-day buckets of the second surprise model.
    pub day_buckets: u16,
    /// Range-novelty tolerance, a fraction of the seen range.
    pub tolerance: f64,
    /// Rows between two novelty flags.
    pub refractory: u64,
}

impl Default for NoveltySurpriseConfig {
    fn default() -> Self {
        Self { bins: 32, order: 4, alpha: 1.0, day_buckets: 8, tolerance: 0.01, refractory: 100 }
    }
}

/// omen's NAB detector: 1 on range novelty, else the larger of two context surprises of
/// the value, one plain and one with the time of day in its context.
#[derive(Debug, Clone)]
pub struct NoveltySurprise {
    day_buckets: u16,
    learning: u64,
    pushed: u64,
    novelty: RangeNovelty,
    plain: ContextSurprise,
    by_time_of_day: ContextSurprise,
}

impl NoveltySurprise {
    /// A detector binning `[low, high)` (e.g. the learning rows' range, widened); it scores
    /// 0 for the first `learning` rows while its models learn.
    pub fn new(
        low: f64,
        high: f64,
        learning: u64,
        config: NoveltySurpriseConfig,
    ) -> Result<Self, SignalError> {
        if config.day_buckets == 0 {
            return Err(invalid("day_buckets", 0, "must be at least 1"));
        }
        let c = config;
        Ok(Self {
            day_buckets: c.day_buckets,
            learning,
            pushed: 0,
            novelty: RangeNovelty::new(c.tolerance, c.refractory)?,
            plain: ContextSurprise::new(low, high, c.bins, c.order, c.alpha)?,
            by_time_of_day: ContextSurprise::new(low, high, c.bins, c.order, c.alpha)?,
        })
    }

    /// Adds a value seen at `day_fraction` of its day (0 at midnight, in [0, 1)) and
    /// returns its score in [0, 1].
    pub fn push(&mut self, x: f64, day_fraction: f64) -> Result<f64, SignalError> {
        Ok(self.push_parts(x, day_fraction)?.score())
    }

    /// [`Self::push`], returning the parts the score is made of.
    pub fn push_parts(&mut self, x: f64, day_fraction: f64) -> Result<SurpriseParts, SignalError> {
        if !(0.0..1.0).contains(&day_fraction) {
            return Err(invalid("day_fraction", day_fraction, "must be in [0, 1)"));
        }
        let bucket = ((day_fraction * f64::from(self.day_buckets)) as u16).min(self.day_buckets - 1);
        let novel = self.novelty.push(x)?;
        let plain = self.plain.push(x)?;
        let by_time_of_day = self.by_time_of_day.push_tagged(x, bucket)?;
        self.pushed += 1;
        Ok(SurpriseParts { novel, plain, by_time_of_day, learning: self.pushed <= self.learning })
    }
}

/// [`NoveltySurprise`] for a live stream: it learns its value range from the first
/// `learning` values, widened by `pad` x that range on each side, then replays them into
/// the detector and scores every value after them. This is how NAB runs a detector
/// (its probationary rows are the learning rows) and how the agent runs one per series,
/// so a NAB score of this object is the score the agent's detector gets.
#[derive(Debug, Clone)]
pub struct LearningNoveltySurprise {
    learning: usize,
    pad: f64,
    config: NoveltySurpriseConfig,
    /// The learning values and their day fractions, until the detector exists.
    buffer: Vec<(f64, f64)>,
    detector: Option<NoveltySurprise>,
}

impl LearningNoveltySurprise {
    /// A detector that learns from its first `learning` (>= 1) values; `pad` >= 0.
    pub fn new(learning: usize, pad: f64, config: NoveltySurpriseConfig) -> Result<Self, SignalError> {
        if learning == 0 {
            return Err(invalid("learning", learning, "must be at least 1 value"));
        }
        if !(pad.is_finite() && pad >= 0.0) {
            return Err(invalid("pad", pad, "must be a finite fraction >= 0"));
        }
        // Check the parameters now rather than when the learning rows are in.
        NoveltySurprise::new(0.0, 1.0, 0, config)?;
        Ok(Self { learning, pad, config, buffer: Vec::new(), detector: None })
    }

    /// Adds a value seen at `day_fraction` of its day; `None` while learning, then its
    /// score in [0, 1].
    pub fn push(&mut self, x: f64, day_fraction: f64) -> Result<Option<f64>, SignalError> {
        if let Some(d) = self.detector.as_mut() {
            return d.push(x, day_fraction).map(Some);
        }
        if !x.is_finite() {
            return Err(invalid("value", x, "must be finite"));
        }
        if !(0.0..1.0).contains(&day_fraction) {
            return Err(invalid("day_fraction", day_fraction, "must be in [0, 1)"));
        }
        self.buffer.push((x, day_fraction));
        if self.buffer.len() < self.learning {
            return Ok(None);
        }
        let (low, high) = learned_range(self.buffer.iter().map(|&(v, _)| v), self.pad);
        let mut d = NoveltySurprise::new(low, high, self.learning as u64, self.config)?;
        for (v, t) in std::mem::take(&mut self.buffer) {
            d.push(v, t)?;
        }
        self.detector = Some(d);
        Ok(None)
    }

    /// Whether the learning values are all in and values are being scored.
    pub fn is_scoring(&self) -> bool {
        self.detector.is_some()
    }
}

/// The range of finite `values` widened by `pad` x that range on each side. The margin
/// is at least 1e-9 and 1e-12 of the largest magnitude, so a flat start still has a range
/// whatever its scale (GPU bytes are ~1e10, where 1e-9 is below the precision), and the
/// ends stay within +-f64::MAX / 4, so the width is finite.
pub fn learned_range(values: impl IntoIterator<Item = f64>, pad: f64) -> (f64, f64) {
    let (lo, hi) =
        values.into_iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(v), h.max(v)));
    let limit = f64::MAX / 4.0;
    let (lo, hi) = (lo.clamp(-limit, limit), hi.clamp(-limit, limit));
    let margin = ((hi - lo) * pad).max(1e-9).max(lo.abs().max(hi.abs()) * 1e-12);
    ((lo - margin).max(-limit), (hi + margin).min(limit))
}

/// What one [`NoveltySurprise`] score is made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SurpriseParts {
    /// Range novelty flagged the value.
    pub novel: bool,
    /// The plain context surprise.
    pub plain: f64,
    /// The surprise with the time of day in its context.
    pub by_time_of_day: f64,
    /// The value is one of the learning rows, whose surprises are not reported.
    pub learning: bool,
}

impl SurpriseParts {
    /// The detector's score: 1 on novelty, 0 while learning, else the larger surprise.
    pub fn score(&self) -> f64 {
        if self.novel {
            1.0
        } else if self.learning {
            0.0
        } else {
            self.plain.max(self.by_time_of_day)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bad_parameters_and_inputs_are_named() {
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

    #[test]
    fn a_tag_separates_contexts() {
        // Tag 0 is always followed by 0.5, tag 1 by 2.5: learned per tag, while without tags
        // the two alternate and each stays half surprising.
        let mut tagged = ContextSurprise::new(0.0, 4.0, 4, 0, 0.1).unwrap();
        let mut plain = ContextSurprise::new(0.0, 4.0, 4, 0, 0.1).unwrap();
        let (mut t_last, mut p_last) = (1.0, 1.0);
        for i in 0..100u16 {
            let x = if i % 2 == 0 { 0.5 } else { 2.5 };
            t_last = tagged.push_tagged(x, i % 2).unwrap();
            p_last = plain.push(x).unwrap();
        }
        assert!(t_last < 0.05, "{t_last}");
        assert!((0.4..0.6).contains(&p_last), "{p_last}");
    }

    #[test]
    fn the_detector_flags_novelty_learns_a_daily_pattern_and_checks_its_inputs() {
        let cfg =
            NoveltySurpriseConfig { bins: 4, order: 1, day_buckets: 2, refractory: 0, ..Default::default() };
        let mut d = NoveltySurprise::new(0.0, 4.0, 8, cfg).unwrap();
        // Mornings at 0.5, evenings at 2.5, then the pattern holds.
        let mut last = 1.0;
        for i in 0..200 {
            let (x, t) = if i % 2 == 0 { (0.5, 0.25) } else { (2.5, 0.75) };
            last = d.push(x, t).unwrap();
            if i < 8 {
                assert!(last == 0.0 || last == 1.0, "learning rows score 0 unless novel: {last}");
            }
        }
        assert!(last < 0.35, "{last}");
        assert_eq!(d.push(9.0, 0.5).unwrap(), 1.0, "beyond the range seen");
        assert!(d.push(1.0, 1.0).is_err());
        assert!(NoveltySurprise::new(0.0, 4.0, 8, NoveltySurpriseConfig { day_buckets: 0, ..cfg }).is_err());
    }

    #[test]
    fn learning_checks_its_parameters_and_inputs() {
        let cfg = NoveltySurpriseConfig::default();
        assert!(LearningNoveltySurprise::new(0, 0.2, cfg).is_err());
        assert!(LearningNoveltySurprise::new(5, -1.0, cfg).is_err());
        assert!(
            LearningNoveltySurprise::new(5, 0.2, NoveltySurpriseConfig { day_buckets: 0, ..cfg }).is_err()
        );
        let mut d = LearningNoveltySurprise::new(2, 0.2, cfg).unwrap();
        assert!(d.push(f64::NAN, 0.5).is_err());
        assert!(d.push(1.0, 1.0).is_err());
        assert_eq!(d.push(1.0, 0.5).unwrap(), None);
        assert!(!d.is_scoring());
        assert_eq!(d.push(1.0, 0.5).unwrap(), None, "a flat learning period still gets a range");
        assert!(d.is_scoring());
        assert_eq!(d.push(5.0, 0.5).unwrap(), Some(1.0), "beyond the learned range");
        assert!(d.push(f64::INFINITY, 0.5).is_err());
    }

    proptest! {
        #[test]
        fn any_finite_learning_values_give_a_usable_range(
            values in proptest::collection::vec(prop_oneof![-1e308f64..1e308, -1e12f64..1e12, Just(8.1e10)], 1..50),
            pad in 0.0f64..1.0,
        ) {
            let (low, high) = learned_range(values.iter().copied(), pad);
            prop_assert!(low.is_finite() && high.is_finite() && low < high && (high - low).is_finite());
            let mut d = LearningNoveltySurprise::new(values.len(), pad, NoveltySurpriseConfig::default()).unwrap();
            for &v in &values {
                prop_assert_eq!(d.push(v, 0.5).unwrap(), None);
            }
            let s = d.push(values[0], 0.5).unwrap().unwrap();
            prop_assert!((0.0..=1.0).contains(&s));
        }
    }

    proptest! {
        #[test]
        fn learning_then_scoring_equals_the_detector_built_on_the_learning_range(
            xs in proptest::collection::vec((-50.0f64..50.0, 0.0f64..1.0), 1..300),
            learning in 1usize..100,
            pad in 0.0f64..0.5,
        ) {
            let cfg = NoveltySurpriseConfig { bins: 8, order: 2, refractory: 10, ..Default::default() };
            let mut live = LearningNoveltySurprise::new(learning, pad, cfg).unwrap();
            let seen = &xs[..learning.min(xs.len())];
            let (low, high) = learned_range(seen.iter().map(|&(v, _)| v), pad);
            let mut batch = NoveltySurprise::new(low, high, learning as u64, cfg).unwrap();
            for (i, &(x, t)) in xs.iter().enumerate() {
                let want = batch.push(x, t).unwrap();
                let got = live.push(x, t).unwrap();
                if i < learning {
                    prop_assert_eq!(got, None);
                } else {
                    prop_assert_eq!(got, Some(want));
                }
            }
        }
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

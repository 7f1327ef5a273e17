//! Per-series detection: each series' anomaly score from the configured detector
//! (crate::detector), the onset of a suspected change, and the debounced risk that the
//! health score ranks.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use omen_signals::catalogue;
use omen_sources::Sample;

use super::ingest::Batch;
use super::{to_labels, Contributor, Engine, LevelShift};
use crate::config::SignalsConfig;
use crate::detector::{Detection, SeriesDetector};
use crate::metrics::{GaugeHandle, LiveMetrics};
use omen_store::SeriesId;

/// A series stops counting towards health (and as a model input) when it has been silent this long.
const STALE_MS: i64 = 15 * 60_000;

/// A sample counts as still away from the old normal beyond this many of its sigmas.
const HOLD_SIGMAS: f64 = 3.0;

/// How many contributors a health summary names.
const MAX_CONTRIBUTORS: usize = 10;

/// How many lasting shifts a health summary keeps.
const MAX_CHANGES: usize = 20;

/// A suspected change: where the series stood before it, and whether it held.
#[derive(Debug, Clone, Copy)]
struct Onset {
    ts_ms: i64,
    /// Window mean and std just before the onset: the old normal.
    mean: f64,
    std: f64,
    /// +1 above the old normal, -1 below.
    direction: f64,
    risk: f64,
    /// Samples after the onset that stayed away from the old normal, and their sum.
    held: usize,
    held_sum: f64,
    /// Whether the new level is the one the series had a week before, at the same time of
    /// the week (a weekly cycle: weekend traffic, a weekly restart); asked once the change
    /// holds (`None` before). Such a change carries no risk and is not listed as a lasting
    /// shift; the forecasts still see it (`Engine::shift_onsets`).
    weekly: Option<bool>,
}

/// A week in ms: a change that returns to the level of a week before is the weekly cycle.
const WEEK_MS: i64 = 7 * omen_signals::DAY_MS;

/// How much of the level a week before a change, on each side of it, is compared.
const WEEK_BEFORE_SPAN_MS: i64 = omen_signals::HOUR_MS;

/// Whether the same change happened a week before: the series' mean over the hour that
/// ended one week before the onset lies within [`HOLD_SIGMAS`] of the old normal's sigma
/// of the old normal, and its mean over the hour that started then lies as near `o`'s new
/// level (the mean of the samples that held, or `x` before any held); from the store's
/// minute aggregates. A level merely seen a week before (a regression back to last week's
/// incident) does not count. No data a week before (a new series, the first week, minute
/// retention under 8 days) or a failed read answers no: the change counts.
fn seen_a_week_before(
    store: &omen_store::Store,
    signal: &str,
    labels: &BTreeMap<String, String>,
    o: &Onset,
    x: f64,
) -> bool {
    let from = o.ts_ms - WEEK_MS - WEEK_BEFORE_SPAN_MS;
    let until = o.ts_ms - WEEK_MS + WEEK_BEFORE_SPAN_MS;
    let level = if o.held > 0 { o.held_sum / o.held as f64 } else { x };
    let near = |a: f64, b: f64| (a - b).abs() <= HOLD_SIGMAS * (o.std + omen_signals::STD_EPSILON);
    match store.range(signal, labels, from, until, WEEK_BEFORE_SPAN_MS, omen_store::Resolution::Minute) {
        Ok(series) => series.iter().find(|s| s.labels == *labels).is_some_and(|s| {
            // Buckets start at `from`: the hour before the week-old onset, then the hour after.
            let mean_from = |start: i64| s.points.iter().find(|p| p.0 == start).map(|p| p.1);
            let before = mean_from(from).is_some_and(|m| near(m, o.mean));
            before && mean_from(from + WEEK_BEFORE_SPAN_MS).is_some_and(|m| near(m, level))
        }),
        Err(e) => {
            tracing::debug!("cannot read {signal} {labels:?} a week before a change, so it counts: {e:#}");
            false
        }
    }
}

/// One scored series: its detector, its onset, its live gauges and its store ids.
pub(super) struct SeriesState {
    detector: SeriesDetector,
    onset: Option<Onset>,
    /// Time of the last raw sample stored (decimation).
    last_raw_ms: Option<i64>,
    last_anomaly_raw_ms: Option<i64>,
    last_score: f64,
    /// Latest value, read by the model as its input.
    pub(super) last_value: f64,
    pub(super) last_ts: i64,
    /// Live gauge of the series' value and of its anomaly score (None past the series limit).
    value_gauge: Option<GaugeHandle>,
    anomaly_gauge: Option<GaugeHandle>,
    /// The series' labels plus `signal`: the labels of its anomaly score.
    pub(super) anomaly_labels: BTreeMap<String, String>,
    /// Whether the series' anomaly-risk gauge is exported.
    pub(super) risk_published: bool,
    /// Store ids of the series and of its anomaly score, once the store has them (ingest.rs).
    pub(super) store_id: Option<SeriesId>,
    pub(super) anomaly_store_id: Option<SeriesId>,
}

/// Scored series by signal, then labels: looked up by reference, without building a key.
pub(super) type SeriesMap = HashMap<String, HashMap<BTreeMap<String, String>, SeriesState>>;

impl SeriesState {
    /// A series first seen with sample `s`, scored by the detector `signals` configures.
    fn new(s: &Sample, signals: &SignalsConfig, live: &LiveMetrics) -> Self {
        let mut anomaly_labels = s.labels.clone();
        anomaly_labels.insert("signal".into(), s.signal.clone());
        Self {
            detector: SeriesDetector::new(signals).expect("config validated the detector's parameters"),
            onset: None,
            last_raw_ms: None,
            last_anomaly_raw_ms: None,
            last_score: 0.0,
            last_value: s.value,
            last_ts: s.ts_ms,
            value_gauge: live.gauge_handle(&s.signal, to_labels(&s.labels), s.value),
            anomaly_gauge: None,
            anomaly_labels,
            risk_published: false,
            store_id: None,
            anomaly_store_id: None,
        }
    }

    /// Whether the series has been heard from within `STALE_MS` of `now_ms`.
    pub(super) fn is_fresh(&self, now_ms: i64) -> bool {
        now_ms - self.last_ts <= STALE_MS
    }

    /// Risk of the series: that of its onset once the change has held for `persistence`
    /// samples, unless it is the weekly cycle.
    fn held_risk(&self, persistence: usize) -> f64 {
        match self.onset {
            Some(o) if o.held + 1 >= persistence && o.weekly != Some(true) => o.risk,
            _ => 0.0,
        }
    }
}

impl Engine {
    /// Publishes and scores `s`, the `i`th sample of the batch, with its series' detector,
    /// and adds to `batch` whether to keep it raw and, once the detector scores, its anomaly score.
    /// Fails only on a non-finite value, which every source rejects before.
    pub(super) fn score_sample(&mut self, i: usize, s: &Sample, batch: &mut Batch) -> Result<()> {
        let state = match self.series.get_mut(&s.signal).and_then(|f| f.get_mut(&s.labels)) {
            Some(state) => state,
            None => {
                let state = SeriesState::new(s, &self.cfg.signals, &self.live);
                let family = match self.series.get_mut(&s.signal) {
                    Some(f) => f,
                    None => self.series.entry(s.signal.clone()).or_default(),
                };
                family.entry(s.labels.clone()).or_insert(state)
            }
        };
        match &state.value_gauge {
            Some(g) => g.set(s.value),
            // Past the series limit: set_gauge counts the shed sample.
            None => self.live.set_gauge(&s.signal, to_labels(&s.labels), s.value),
        }
        state.last_value = s.value;
        state.last_ts = s.ts_ms;
        batch.push(batch.keep(&mut state.last_raw_ms, s.ts_ms), state.store_id);
        // Values were validated as finite by every source; a failure here is a bug upstream.
        let detection = state.detector.push(s.ts_ms, s.value)?;
        let lasting = track_onset(state, &self.cfg.signals, s.ts_ms, s.value, &detection);
        if let Some(o) = state.onset.as_mut() {
            if o.weekly.is_none() && o.held + 1 >= self.cfg.signals.persistence {
                o.weekly = Some(seen_a_week_before(&self.store, &s.signal, &s.labels, o, s.value));
            }
        }
        if let Some(score) = detection.score {
            state.last_score = score;
            match &state.anomaly_gauge {
                Some(g) => g.set(score),
                None => {
                    state.anomaly_gauge = self.live.gauge_handle(
                        catalogue::ANOMALY_SCORE.name,
                        to_labels(&state.anomaly_labels),
                        score,
                    )
                }
            }
            let keep_score = batch.keep(&mut state.last_anomaly_raw_ms, s.ts_ms);
            let anomaly = Sample {
                ts_ms: s.ts_ms,
                signal: catalogue::ANOMALY_SCORE.name.into(),
                labels: state.anomaly_labels.clone(),
                value: score,
            };
            batch.push_anomaly(anomaly, keep_score, state.anomaly_store_id, i);
        }
        if let Some(o) = lasting {
            self.record_shift(&s.signal, &s.labels, s.ts_ms, o);
        }
        Ok(())
    }

    /// Exports the risk of every fresh series whose change holds as `anomaly_risk`, and
    /// withdraws it once the change is released, so an alert rule can name the signal.
    pub(super) fn publish_risks(&mut self, now_ms: i64) {
        let persistence = self.cfg.signals.persistence;
        for family in self.series.values_mut() {
            for state in family.values_mut() {
                let risk = if state.is_fresh(now_ms) { state.held_risk(persistence) } else { 0.0 };
                // Labels are built only for the few series at risk or just released.
                if risk > 0.0 {
                    self.live.set_gauge(catalogue::ANOMALY_RISK.name, to_labels(&state.anomaly_labels), risk);
                    state.risk_published = true;
                } else if state.risk_published {
                    self.live.remove_gauge(catalogue::ANOMALY_RISK.name, &to_labels(&state.anomaly_labels));
                    state.risk_published = false;
                }
            }
        }
    }

    /// The fresh series at risk at `now_ms`, riskiest first (ties by signal), at most
    /// `MAX_CONTRIBUTORS`.
    pub(super) fn contributors(&self, now_ms: i64) -> Vec<Contributor> {
        let mut contributors: Vec<Contributor> = self
            .series
            .iter()
            .flat_map(|(signal, family)| family.iter().map(move |(labels, st)| (signal, labels, st)))
            .filter(|(_, _, st)| st.is_fresh(now_ms))
            .map(|(signal, labels, st)| Contributor {
                signal: signal.clone(),
                labels: labels.clone(),
                risk: st.held_risk(self.cfg.signals.persistence),
                anomaly_score: st.last_score,
                value: st.last_value,
            })
            .filter(|c| c.risk > 0.0)
            .collect();
        contributors.sort_by(|a, b| b.risk.total_cmp(&a.risk).then_with(|| a.signal.cmp(&b.signal)));
        contributors.truncate(MAX_CONTRIBUTORS);
        contributors
    }
}

/// Follows a suspected change. A score alone fades (a window absorbs a level shift, a
/// surprise model learns the new level), so a change is judged against the window it
/// broke away from: it opens when the detector's risk is above 0, counts once
/// `persistence` samples in a row stay beyond 3 sigma of that old normal (a lone spike
/// does not), and is released when values return or after `latch`. A change still away
/// when `latch` runs out is a lasting shift: it is returned, and the new level is normal.
fn track_onset(
    state: &mut SeriesState,
    signals: &SignalsConfig,
    ts_ms: i64,
    x: f64,
    d: &Detection,
) -> Option<Onset> {
    let mut lasting = None;
    if let Some(o) = state.onset.as_mut() {
        let away = (x - o.mean) * o.direction > HOLD_SIGMAS * (o.std + omen_signals::STD_EPSILON);
        let expired = ts_ms - o.ts_ms > signals.latch.as_millis() as i64;
        if away && !expired {
            o.held += 1;
            o.held_sum += x;
            o.risk = o.risk.max(d.risk);
            return None;
        }
        if away && o.held + 1 >= signals.persistence {
            lasting = Some(*o);
        }
        state.onset = None;
        if lasting.is_some() {
            // The new level is the normal now; a later change opens against it.
            return lasting;
        }
    }
    if let (Some(w), true) = (d.window, d.risk > 0.0) {
        state.onset = Some(Onset {
            ts_ms,
            mean: w.mean,
            std: w.std,
            direction: if x >= w.mean { 1.0 } else { -1.0 },
            risk: d.risk,
            held: 0,
            held_sum: 0.0,
            weekly: None,
        });
    }
    lasting
}

impl Engine {
    /// Keeps a lasting shift of a series for the forecasts (`shift_onsets`) and, unless it
    /// is the weekly cycle, in /scores/latest (the last 20), the `level_shifts` counter and
    /// the `level_shift` series stored at its onset.
    fn record_shift(&mut self, signal: &str, labels: &BTreeMap<String, String>, now_ms: i64, o: Onset) {
        let onsets = self.shift_onsets.entry(signal.to_owned()).or_default();
        let newest = if o.direction > 0.0 { &mut onsets.up_ms } else { &mut onsets.down_ms };
        *newest = Some(newest.map_or(o.ts_ms, |t| t.max(o.ts_ms)));
        if o.weekly == Some(true) {
            return;
        }
        let after = if o.held > 0 { o.held_sum / o.held as f64 } else { o.mean };
        let shift = LevelShift {
            signal: signal.to_owned(),
            labels: labels.clone(),
            since_ms: o.ts_ms,
            confirmed_ms: now_ms,
            before: o.mean,
            after,
            shift_sigmas: (after - o.mean) / (o.std + omen_signals::STD_EPSILON),
        };
        self.live.level_shifts.get_or_create(&vec![("signal".to_owned(), signal.to_owned())]).inc();
        let mut stored_labels = labels.clone();
        stored_labels.insert("signal".into(), signal.to_owned());
        self.pending_shifts.push(Sample {
            ts_ms: o.ts_ms,
            signal: catalogue::LEVEL_SHIFT.name.into(),
            labels: stored_labels,
            value: shift.shift_sigmas,
        });
        self.changes.push_front(shift);
        self.changes.truncate(MAX_CHANGES);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::engine;
    use super::super::Level;
    use omen_sources::Sample;

    fn kvf(ts_ms: i64, value: f64) -> Sample {
        Sample {
            ts_ms,
            signal: "kv_fragmentation".into(),
            labels: [("layer".to_owned(), "0".to_owned())].into(),
            value,
        }
    }

    #[test]
    fn sustained_anomaly_raises_health_and_names_the_signal() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "signals: {detector: window, window: 20, persistence: 3}\n");
        let t0 = 1_793_577_600_000;
        for i in 0..60 {
            e.process(vec![kvf(t0 + i * 10_000, 1.2 + 0.01 * ((i * 7) % 5) as f64)]).unwrap();
        }
        let calm = e.tick(t0 + 600_000).unwrap();
        assert_eq!(calm.level, Level::Ok, "{calm:?}");
        for i in 60..64 {
            e.process(vec![kvf(t0 + i * 10_000, 3.5)]).unwrap();
        }
        let s = e.tick(t0 + 640_000).unwrap();
        assert!(s.health_score >= 0.8, "{s:?}");
        assert_eq!(s.level, Level::Critical);
        assert_eq!(s.contributors[0].signal, "kv_fragmentation");
        match &s.reasons[..] {
            [super::super::Reason::Anomaly { signal, risk, .. }] => {
                assert_eq!((signal.as_str(), *risk), ("kv_fragmentation", s.health_score))
            }
            other => panic!("one anomaly reason expected: {other:?}"),
        }
        let event = e.events().iter().find(|ev| ev.alert == "health" && ev.level == Level::Critical).unwrap();
        assert!(event.reason.starts_with("kv_fragmentation{layer=0} changed: risk"), "{event:?}");
        assert!(calm.reasons.is_empty());
    }

    #[test]
    fn novelty_surprise_flags_a_held_change_after_learning_and_withdraws_its_risk() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = "signals: {detector: novelty_surprise, window: 20, persistence: 3, novelty_surprise: {learning_samples: 40, refractory: 10}}\n";
        let mut e = engine(dir.path(), yaml);
        let t0 = 1_793_577_600_000;
        for i in 0..60 {
            e.process(vec![kvf(t0 + i * 10_000, 1.2 + 0.01 * ((i * 7) % 5) as f64)]).unwrap();
        }
        assert_eq!(e.tick(t0 + 600_000).unwrap().level, Level::Ok);
        for i in 60..64 {
            e.process(vec![kvf(t0 + i * 10_000, 3.5)]).unwrap();
        }
        let s = e.tick(t0 + 640_000).unwrap();
        assert_eq!(s.level, Level::Critical, "{s:?}");
        assert_eq!(s.contributors[0].signal, "kv_fragmentation");
        // The first value beyond the learned range was novel (score 1, risk 1); the change
        // keeps that risk while it holds, although later values surprise less.
        assert_eq!(s.contributors[0].risk, 1.0, "{s:?}");
        let labels =
            vec![("layer".to_owned(), "0".to_owned()), ("signal".to_owned(), "kv_fragmentation".to_owned())];
        assert_eq!(e.live.gauge("anomaly_risk", &labels), Some(1.0));
        // Back to the old level: the change is released and the risk withdrawn.
        for i in 64..70 {
            e.process(vec![kvf(t0 + i * 10_000, 1.2)]).unwrap();
        }
        e.tick(t0 + 700_000).unwrap();
        assert_eq!(e.live.gauge("anomaly_risk", &labels), None);
    }

    /// KVF of one layer every 5 minutes from Monday 2026-11-02 until noon on the second
    /// Saturday, at `level(day)` plus a little noise. The health level 20 minutes into each
    /// Saturday, the lasting shifts listed at the end, and the newest shift down the
    /// forecasts know of.
    fn weekly_cycle(level: impl Fn(i64) -> f64) -> (Level, Level, usize, Option<i64>) {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "signals: {detector: window, window: 20, persistence: 3}\n");
        let t0 = 1_793_577_600_000;
        let step = 300_000;
        let day = 86_400_000;
        let mut levels = Vec::new();
        for i in 0..(12 * day + day / 2) / step {
            let ts = t0 + i * step;
            e.process(vec![kvf(ts, level((ts - t0) / day) + 0.01 * ((i * 7) % 5) as f64)]).unwrap();
            if ts == t0 + 5 * day + 20 * 60_000 || ts == t0 + 12 * day + 20 * 60_000 {
                levels.push(e.tick(ts).unwrap().level);
            }
        }
        let shifts = e.tick(t0 + 12 * day + day / 2).unwrap().changes.len();
        let down = e.shift_onsets.get("kv_fragmentation").and_then(|o| o.down_ms);
        (levels[0], levels[1], shifts, down)
    }

    #[test]
    fn a_change_back_to_the_level_of_a_week_before_is_the_weekly_cycle() {
        let t0 = 1_793_577_600_000;
        let second_saturday = t0 + 12 * 86_400_000;
        // The first weekend is a change (nothing a week before says otherwise); the second,
        // the same change at the same time of the week, is the weekly cycle: no risk, not
        // listed, but the forecasts still know of it.
        let weekends = |d: i64| if matches!(d, 5 | 6 | 12) { 0.8 } else { 1.2 };
        let (first, second, shifts, down) = weekly_cycle(weekends);
        assert_eq!((first, second), (Level::Critical, Level::Ok));
        assert_eq!(down, Some(second_saturday), "the forecasts see the weekly shift");
        // A second Saturday at a level never seen is a change, and a lasting shift.
        let (_, unseen, shifts_unseen, _) = weekly_cycle(|d| if d == 12 { 2.0 } else { weekends(d) });
        assert_eq!(unseen, Level::Critical);
        assert_eq!(shifts_unseen, shifts + 1, "the unseen level is listed, the weekly one not");
        // A level seen a week before without the change then (the series sat there from
        // Friday on) is no weekly cycle: the change counts.
        let (_, no_change_then, _, _) = weekly_cycle(|d| if matches!(d, 4..=6 | 12) { 0.8 } else { 1.2 });
        assert_eq!(no_change_then, Level::Critical);
    }

    #[test]
    fn a_change_that_outlasts_the_latch_is_kept_as_a_level_shift() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = "signals: {detector: window, window: 20, persistence: 3, latch: 10m}\n";
        let mut e = engine(dir.path(), yaml);
        let t0 = 1_793_577_600_000;
        for i in 0..60 {
            e.process(vec![kvf(t0 + i * 10_000, 1.2 + 0.01 * ((i * 7) % 5) as f64)]).unwrap();
        }
        // From sample 60 on, the series lives at 3.5: past the 10-minute latch it is a shift.
        for i in 60..140 {
            e.process(vec![kvf(t0 + i * 10_000, 3.5)]).unwrap();
        }
        let s = e.tick(t0 + 140 * 10_000).unwrap();
        assert_eq!(s.level, Level::Ok, "the new level is normal: {s:?}");
        let [shift] = &s.changes[..] else { panic!("one shift expected: {:?}", s.changes) };
        assert_eq!((shift.signal.as_str(), shift.since_ms), ("kv_fragmentation", t0 + 60 * 10_000));
        assert!(shift.confirmed_ms > shift.since_ms + 600_000, "{shift:?}");
        assert!((1.2..1.25).contains(&shift.before) && shift.after == 3.5, "{shift:?}");
        assert!(shift.shift_sigmas > 50.0, "{shift:?}");
        let counter = e
            .live
            .level_shifts
            .get_or_create(&vec![("signal".to_owned(), "kv_fragmentation".to_owned())])
            .get();
        assert_eq!(counter, 1);
        let all = Default::default();
        let stored =
            e.store.range("level_shift", &all, t0, t0 + 150 * 10_000, 10_000, omen_store::Resolution::Raw);
        let stored = stored.unwrap();
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].points, [(shift.since_ms, shift.shift_sigmas)]);
        assert_eq!(stored[0].labels.get("signal").map(String::as_str), Some("kv_fragmentation"));
        // It stays in the summary on later ticks.
        assert_eq!(e.tick(t0 + 150 * 10_000).unwrap().changes.len(), 1);
    }

    #[test]
    fn single_spike_is_debounced() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "signals: {detector: window, window: 20, persistence: 3}\n");
        let t0 = 1_793_577_600_000;
        for i in 0..40 {
            let v = if i == 30 { 50.0 } else { 1.0 + 0.01 * (i % 3) as f64 };
            e.process(vec![kvf(t0 + i * 10_000, v)]).unwrap();
        }
        assert_eq!(e.tick(t0 + 31 * 10_000).unwrap().level, Level::Ok);
    }
}

//! Cardinality limits (config `limits`): a batch that would create series past a cap is
//! refused whole before anything is stored, and series silent for `series_idle_timeout`
//! (event time) leave memory and /metrics. Derived signals (anomaly scores, health,
//! forecasts) are the engine's own and are bounded by the series they come from.

use std::collections::{BTreeMap, HashMap};

use omen_signals::catalogue;
use omen_sources::Sample;

use super::{to_labels, Engine};

/// A batch refused because it would create series past a cap of `limits`; nothing of it was stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct SeriesLimitExceeded {
    /// The config key of the cap, e.g. `limits.max_series_per_signal`.
    pub key: &'static str,
    /// The cap.
    pub cap: usize,
    /// The signal whose series would pass the cap (per-signal cap only).
    pub signal: Option<String>,
    /// Series held now (of the signal, or in all).
    pub existing: usize,
    /// Series the batch would add.
    pub new: usize,
}

impl SeriesLimitExceeded {
    fn describe(&self) -> String {
        let holder = match &self.signal {
            Some(signal) => format!("signal {signal:?} has"),
            None => "the agent holds".to_owned(),
        };
        format!(
            "{holder} {} series and this push would add {} more, past {} = {}; nothing was stored. \
             Drop a label whose values keep changing (ids, timestamps), or raise {}",
            self.existing, self.new, self.key, self.cap, self.key
        )
    }

    /// The cap's name without the section, for the `limit` label of the rejection counter.
    pub fn limit_label(&self) -> &'static str {
        self.key.trim_start_matches("limits.")
    }
}

impl Engine {
    /// Series the engine holds, over all signals.
    pub fn series_count(&self) -> usize {
        self.series.values().map(HashMap::len).sum()
    }

    /// Refuses `samples` when the series they would create pass a cap. Batches that cannot
    /// reach a cap (the usual case: known series) are passed without a lookup per sample.
    pub(super) fn admit(&self, samples: &[Sample]) -> Result<(), SeriesLimitExceeded> {
        let limits = &self.cfg.limits;
        let total = self.series_count();
        let largest = self.series.values().map(HashMap::len).max().unwrap_or(0);
        if total + samples.len() <= limits.max_series
            && largest + samples.len() <= limits.max_series_per_signal
        {
            return Ok(());
        }
        let mut new: HashMap<&str, Vec<&BTreeMap<String, String>>> = HashMap::new();
        for s in samples {
            if catalogue::is_derived(&s.signal) {
                continue;
            }
            let known = self.series.get(&s.signal).is_some_and(|family| family.contains_key(&s.labels));
            if !known {
                let added = new.entry(&s.signal).or_default();
                if !added.contains(&&s.labels) {
                    added.push(&s.labels);
                }
            }
        }
        let mut new_total = 0;
        for (signal, added) in &new {
            let existing = self.series.get(*signal).map_or(0, HashMap::len);
            if existing + added.len() > limits.max_series_per_signal {
                return Err(SeriesLimitExceeded {
                    key: "limits.max_series_per_signal",
                    cap: limits.max_series_per_signal,
                    signal: Some((*signal).to_owned()),
                    existing,
                    new: added.len(),
                });
            }
            new_total += added.len();
        }
        if total + new_total > limits.max_series {
            return Err(SeriesLimitExceeded {
                key: "limits.max_series",
                cap: limits.max_series,
                signal: None,
                existing: total,
                new: new_total,
            });
        }
        Ok(())
    }

    /// Drops the series with no sample since `now_ms - series_idle_timeout`, with their
    /// gauges and anomaly-score gauges; returns how many went.
    pub(super) fn evict_idle(&mut self, now_ms: i64) -> usize {
        let timeout = self.cfg.limits.series_idle_timeout;
        if timeout.is_zero() {
            return 0;
        }
        let cutoff = now_ms - timeout.as_millis() as i64;
        let mut evicted = 0;
        for (signal, family) in &mut self.series {
            family.retain(|labels, state| {
                if state.last_ts >= cutoff {
                    return true;
                }
                self.live.remove_gauge(signal, &to_labels(labels));
                self.live.remove_gauge(catalogue::ANOMALY_SCORE.name, &to_labels(&state.anomaly_labels));
                self.live.remove_gauge(catalogue::ANOMALY_RISK.name, &to_labels(&state.anomaly_labels));
                evicted += 1;
                false
            });
        }
        self.series.retain(|_, family| !family.is_empty());
        if evicted > 0 {
            self.live.series_evicted.inc_by(evicted as u64);
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::engine;
    use super::*;

    const T0: i64 = 1_793_613_600_000;

    fn sample(signal: &str, id: usize, ts_ms: i64) -> Sample {
        Sample {
            ts_ms,
            signal: signal.into(),
            labels: [("id".to_owned(), id.to_string())].into(),
            value: 1.0,
        }
    }

    #[test]
    fn a_batch_past_a_cap_is_refused_whole_and_known_series_keep_working() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "limits: {max_series_per_signal: 3, max_series: 5}\n");
        e.process((0..3).map(|i| sample("a", i, T0)).collect()).unwrap();
        // A fourth series of `a`, even beside known ones: refused, nothing stored.
        let refused = e.process(vec![sample("a", 0, T0 + 1), sample("a", 9, T0 + 1)]).unwrap_err();
        let refused = refused.downcast::<SeriesLimitExceeded>().unwrap();
        assert_eq!(refused.key, "limits.max_series_per_signal");
        assert_eq!((refused.cap, refused.existing, refused.new), (3, 3, 1));
        assert!(refused.to_string().contains("signal \"a\" has 3 series"), "{refused}");
        assert_eq!(e.series_count(), 3);
        // The same label set twice in one batch is one new series.
        e.process(vec![sample("b", 1, T0), sample("b", 1, T0 + 1)]).unwrap();
        // Known series keep working.
        e.process((0..3).map(|i| sample("a", i, T0 + 2)).collect()).unwrap();
        // The total cap: 4 held, 2 more would make 6 > 5.
        let refused = e.process(vec![sample("c", 1, T0 + 3), sample("c", 2, T0 + 3)]).unwrap_err();
        let refused = refused.downcast::<SeriesLimitExceeded>().unwrap();
        assert_eq!((refused.key, refused.signal.as_deref(), refused.new), ("limits.max_series", None, 2));
        assert_eq!(refused.limit_label(), "max_series");
        e.process(vec![sample("c", 1, T0 + 3)]).unwrap();
        assert_eq!(e.series_count(), 5);
        let rejected =
            e.live.series_rejected.get_or_create(&vec![("limit".into(), "max_series".into())]).get();
        assert_eq!(rejected, 1);
    }

    #[test]
    fn silent_series_leave_memory_and_the_gauges() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "limits: {series_idle_timeout: 10m}\nhealth: {interval: 1m}\n");
        e.process(vec![sample("a", 1, T0), sample("a", 2, T0)]).unwrap();
        let gauge_labels = to_labels(&[("id".to_owned(), "1".to_owned())].into());
        assert_eq!(e.live.gauge("a", &gauge_labels), Some(1.0));
        // Series 2 keeps reporting; series 1 falls silent for more than 10 minutes.
        for minute in 1..=12 {
            e.process(vec![sample("a", 2, T0 + minute * 60_000)]).unwrap();
        }
        assert_eq!(e.series_count(), 1);
        assert_eq!(e.live.series_held.get(), 1, "omen_series follows the eviction");
        assert_eq!(e.live.gauge("a", &gauge_labels), None, "gone from /metrics");
        assert!(e.live.gauge("a", &to_labels(&[("id".to_owned(), "2".to_owned())].into())).is_some());
        assert_eq!(e.live.series_evicted.get(), 1);
        // It comes back as a new series when it reports again.
        e.process(vec![sample("a", 1, T0 + 13 * 60_000)]).unwrap();
        assert_eq!(e.series_count(), 2);
        assert_eq!(e.live.series_held.get(), 2);
        // One tick a minute of event time, each timed into omen_tick_duration_seconds.
        let text = crate::metrics::render(&crate::metrics::registry(e.live.clone()));
        let ticks: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("omen_tick_duration_seconds_count "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no tick count in {text}"));
        assert!((12..=14).contains(&ticks), "{ticks} ticks for 13 minutes of event time");
        assert!(text.contains("# TYPE omen_series gauge\nomen_series 2\n"), "{text}");
    }
}

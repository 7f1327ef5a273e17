//! The pipeline: samples -> window anomaly scores per series -> health score ->
//! daily aggregates -> forecasts. Shared by `omen run` (live) and `omen replay`
//! (offline); time is event time, the newest sample seen (or the caller's clock).
//!
//! This module orchestrates; each step lives in its own file: `ingest` (what a batch
//! stores), `detection` (per-series scoring and onsets), `health` (the score and its
//! level), `forecast` (SLO trends), `rollup` (day roll-ups and retention) and `model`
//! (the LSTM autoencoder).

mod detection;
mod explain;
mod forecast;
mod health;
mod ingest;
mod limits;
#[cfg(feature = "lstm")]
mod model;
mod rollup;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use anyhow::Result;
use omen_signals::catalogue;
use omen_sources::Sample;

use crate::config::Config;
use crate::metrics::{Labels, LiveMetrics};
use omen_store::Store;

pub use explain::{explain, LatencyAttribution, LatencyExplanation, LatencyModel};
pub use forecast::{
    daily_indicator, CombineSeries, DailyStatistic, FittedTrend, IndicatorDefinition, SloForecast,
    TrendPoint, WarnedForecast,
};
pub use health::{AlertEvent, Contributor, HealthSummary, Level, LevelShift, Reason};
pub use limits::SeriesLimitExceeded;

use detection::SeriesMap;
use ingest::Batch;

/// The pipeline state.
pub struct Engine {
    cfg: Arc<Config>,
    store: Arc<Store>,
    live: Arc<LiveMetrics>,
    series: SeriesMap,
    /// Latest (used, total) bytes per GPU, until both are known (ingest.rs).
    gpu_memory: HashMap<BTreeMap<String, String>, (Option<f64>, Option<f64>)>,
    clock_ms: i64,
    last_tick_ms: Option<i64>,
    last_retention_ms: i64,
    /// The first day (index since the epoch) the last retention kept in the day tier.
    day_retention_first_kept: Option<i64>,
    rolled_until_day_ms: Option<i64>,
    /// A day roll-up in progress: (day, next series id) (rollup.rs).
    roll_up_cursor: Option<(i64, i64)>,
    /// Bumped whenever the store's day aggregates change (a roll-up step, retention).
    day_agg_generation: u64,
    /// Each SLO indicator's daily values, with what they were read for (forecast.rs).
    daily_cache: HashMap<IndicatorDefinition, (forecast::DailyKey, Vec<(f64, f64)>)>,
    /// Each SLO's fit with the daily values it was fitted to (see `Engine::forecasts`).
    fit_cache: HashMap<String, (Vec<(f64, f64)>, forecast::SloFit)>,
    summary: Arc<RwLock<Option<HealthSummary>>>,
    health_level: Level,
    /// The SLOs under an early warning at the last tick, with the warning as it started.
    warnings: HashMap<String, forecast::WarnedForecast>,
    events: Vec<AlertEvent>,
    /// Lasting level shifts, newest first (detection.rs).
    changes: std::collections::VecDeque<LevelShift>,
    /// The newest lasting shift of each signal, up and down (any series): a forecast holds
    /// a new warning after a shift away from the breach that its regime does not know yet.
    shift_onsets: HashMap<String, forecast::ShiftOnsets>,
    /// Per SLO, the last check of such a shift: (hour, onset, whether it undid the trend).
    reset_checks: HashMap<String, (i64, i64, bool)>,
    /// Their `level_shift` samples, stored at the next tick.
    pending_shifts: Vec<Sample>,
    /// The coupled latency model's last result, and when it was computed (explain.rs).
    explanation: Option<LatencyExplanation>,
    explained_at_ms: Option<i64>,
    /// The source series behind the LSTM-AE's last score, with their shares of its error,
    /// largest first (empty without a live score).
    model_contributions: Vec<(String, f64)>,
    /// The LSTM autoencoder, scored once per tick when configured.
    #[cfg(feature = "lstm")]
    model: Option<crate::lstm_live::LiveModel>,
    /// The last model tick failed (logged once per failure spell).
    #[cfg(feature = "lstm")]
    model_failing: bool,
    /// Trains, validates and swaps the model when `model.path` is unset (model_training.rs).
    #[cfg(feature = "lstm")]
    trainer: Option<crate::model_training::AutoTrainer>,
}

/// Series labels as the live metrics take them.
fn to_labels(map: &BTreeMap<String, String>) -> Labels {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

impl Engine {
    /// A pipeline writing to `store` and publishing to `live`.
    pub fn new(cfg: Arc<Config>, store: Arc<Store>, live: Arc<LiveMetrics>) -> Result<Self> {
        let rolled_until_day_ms = store.meta("rolled_until_day_ms")?.and_then(|v| v.parse().ok());
        // The early warnings a previous run left: they go on with their start.
        let warnings = match store.meta(forecast::WARNINGS_META_KEY)? {
            None => HashMap::new(),
            Some(json) => serde_json::from_str(&json).unwrap_or_else(|e| {
                tracing::warn!("the store's early warnings cannot be read ({e}); they start anew");
                HashMap::new()
            }),
        };
        Ok(Self {
            cfg,
            store,
            live,
            series: HashMap::new(),
            gpu_memory: HashMap::new(),
            clock_ms: 0,
            last_tick_ms: None,
            last_retention_ms: 0,
            day_retention_first_kept: None,
            rolled_until_day_ms,
            day_agg_generation: 0,
            daily_cache: HashMap::new(),
            fit_cache: HashMap::new(),
            roll_up_cursor: None,
            explanation: None,
            explained_at_ms: None,
            summary: Arc::new(RwLock::new(None)),
            health_level: Level::Ok,
            warnings,
            events: Vec::new(),
            changes: std::collections::VecDeque::new(),
            shift_onsets: HashMap::new(),
            reset_checks: HashMap::new(),
            pending_shifts: Vec::new(),
            model_contributions: Vec::new(),
            #[cfg(feature = "lstm")]
            model: None,
            #[cfg(feature = "lstm")]
            model_failing: false,
            #[cfg(feature = "lstm")]
            trainer: None,
        })
    }

    /// Scores `model` at every tick from the latest value of its source series.
    #[cfg(feature = "lstm")]
    pub fn set_model(&mut self, model: crate::lstm_live::LiveModel) {
        self.model = Some(model);
    }

    /// Trains the model itself with `trainer` (a model it returns at start is scored at once).
    #[cfg(feature = "lstm")]
    pub fn set_trainer(&mut self, trainer: crate::model_training::AutoTrainer) {
        self.trainer = Some(trainer);
    }

    /// The LSTM-AE's status for /scores/latest (None without a `model` section).
    fn model_status(&self, now_ms: i64) -> Option<crate::model_training::ModelStatus> {
        #[cfg(feature = "lstm")]
        {
            if let Some(t) = &self.trainer {
                return Some(t.status(now_ms));
            }
            self.model.as_ref().map(|m| crate::model_training::ModelStatus {
                origin: "file",
                state: "active",
                path: Some(m.path().to_owned()),
                trained_until_ms: None,
                age_seconds: None,
                inputs: m.sources().to_vec(),
                validation: None,
                last_training: None,
                recent_trainings: Vec::new(),
                next_training_ms: None,
            })
        }
        #[cfg(not(feature = "lstm"))]
        {
            let _ = now_ms;
            None
        }
    }

    /// Shared handle to the latest health summary.
    pub fn summary_handle(&self) -> Arc<RwLock<Option<HealthSummary>>> {
        self.summary.clone()
    }

    /// Alert transitions seen so far.
    pub fn events(&self) -> &[AlertEvent] {
        &self.events
    }

    /// Writes the store's open minute aggregates (at shutdown).
    pub fn flush(&self) -> Result<()> {
        self.store.flush()?;
        Ok(())
    }

    /// The store's file.
    pub fn store_path(&self) -> &std::path::Path {
        self.store.path()
    }

    /// Event time: the newest timestamp processed.
    pub fn clock_ms(&self) -> i64 {
        self.clock_ms
    }

    /// Scores, stores and publishes a batch; ticks when event time passes the health interval.
    /// Returns after the batch is committed to the store. A batch that would create series
    /// past a cap of `limits` is refused whole with a [`SeriesLimitExceeded`] error.
    pub fn process(&mut self, samples: Vec<Sample>) -> Result<usize> {
        if let Err(refused) = self.admit(&samples) {
            self.live
                .series_rejected
                .get_or_create(&vec![("limit".into(), refused.limit_label().into())])
                .inc();
            return Err(refused.into());
        }
        let mut batch = Batch::new(samples.len(), self.cfg.store.raw_min_interval.as_millis() as i64);
        for (i, s) in samples.iter().enumerate() {
            self.clock_ms = self.clock_ms.max(s.ts_ms);
            self.observe_special(s, &mut batch.derived);
            if catalogue::is_derived(&s.signal) {
                // The engine's own signals (replayed) are published and stored, not scored.
                self.live.set_gauge(&s.signal, to_labels(&s.labels), s.value);
                batch.push(true, None);
                continue;
            }
            self.score_sample(i, s, &mut batch)?;
        }
        let n = samples.len();
        self.commit(samples, batch)?;
        self.live.samples_ingested.inc_by(n as u64);
        let due = match self.last_tick_ms {
            None => true,
            Some(t) => self.clock_ms - t >= self.cfg.health.interval.as_millis() as i64,
        };
        if due && self.clock_ms > 0 {
            let started = std::time::Instant::now();
            self.tick(self.clock_ms)?;
            self.live.tick_seconds.observe(started.elapsed().as_secs_f64());
        }
        self.live.series_held.set(self.series_count() as i64);
        Ok(n)
    }

    /// Recomputes health, forecasts, day roll-ups and retention at event time `now_ms`.
    pub fn tick(&mut self, now_ms: i64) -> Result<HealthSummary> {
        self.last_tick_ms = Some(now_ms);
        // Roll-ups first: the forecasts read the days they complete.
        self.roll_up_days(now_ms)?;
        let contributors = self.contributors(now_ms);
        self.publish_risks(now_ms);
        let mut forecasts = self.forecasts(now_ms)?;
        // What the tick stores: the model's score, the health score, the forecasts.
        let mut out = std::mem::take(&mut self.pending_shifts);
        #[cfg(feature = "lstm")]
        {
            if let Some(model) = self.trainer.as_mut().and_then(|t| t.tick(now_ms, &self.store)) {
                self.model = Some(model);
            }
            self.score_model(now_ms, &mut out);
        }
        // The warnings first: health counts the warnings that stand after this tick.
        self.publish_forecasts(now_ms, &mut forecasts, &mut out);
        let health = self.health_score(&contributors, &forecasts);
        let level = Level::of(health, &self.cfg.health);
        let reasons = if level == Level::Ok { Vec::new() } else { self.reasons(&contributors, &forecasts) };
        self.publish_health(now_ms, health, &mut out);
        self.track_level(now_ms, level, &reasons);
        self.store.insert(&out)?;
        self.apply_retention(now_ms)?;
        self.evict_idle(now_ms);
        self.refresh_explanation(now_ms)?;
        let summary = HealthSummary {
            ts_ms: now_ms,
            health_score: health,
            level,
            contributors,
            reasons,
            changes: self.changes.iter().cloned().collect(),
            forecasts,
            latency_model: self.explanation.clone(),
            model: self.model_status(now_ms),
        };
        *self.summary.write().unwrap_or_else(|e| e.into_inner()) = Some(summary.clone());
        Ok(summary)
    }
}

/// What the tests in each step's file share.
#[cfg(test)]
mod testing {
    use std::sync::Arc;

    use super::Engine;
    use crate::config::Config;
    use crate::metrics::LiveMetrics;
    use omen_store::Store;

    /// An engine on a fresh store in `dir`, configured by `yaml`.
    pub(super) fn engine(dir: &std::path::Path, yaml: &str) -> Engine {
        let cfg = Arc::new(Config::from_yaml(yaml).unwrap());
        let store = Arc::new(Store::open(&dir.join("omen.db")).unwrap());
        Engine::new(cfg, store, Arc::new(LiveMetrics::new())).unwrap()
    }
}

//! The pipeline: samples -> window anomaly scores per series -> health score ->
//! daily aggregates -> forecasts. Shared by `omen run` (live) and `omen replay`
//! (offline); time is event time, the newest sample seen (or the caller's clock).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use anyhow::Result;
use omen_signals::{days_to_breach, theil_sen, trailing_worst, BreachDirection, WindowAnomaly};
use omen_sources::Sample;
use serde::Serialize;

use crate::config::{Config, Direction, SloConfig, SloIndicator, TrendScale};
use crate::metrics::{GaugeHandle, Labels, LiveMetrics};
use crate::store::{SeriesId, Store, DAY_MS};

/// Signals the engine itself produces; they are not scored again (nor used as model inputs).
pub const DERIVED: &[&str] = &[
    "anomaly_score",
    "health_score",
    "forecast_days_to_breach",
    "forecast_days_to_breach_upper",
    "lstm_ae_score",
];

/// A series stops counting towards health when it has been silent this long.
const STALE_MS: i64 = 15 * 60_000;

/// Severity bands of the health score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Below the warning threshold.
    Ok,
    /// [warning, critical).
    Warning,
    /// >= critical.
    Critical,
}

/// One series' share in the health score.
#[derive(Debug, Clone, Serialize)]
pub struct Contributor {
    /// Signal name.
    pub signal: String,
    /// Series labels.
    pub labels: BTreeMap<String, String>,
    /// Risk in [0, 1] from the debounced window score.
    pub risk: f64,
    /// Latest window anomaly score.
    pub anomaly_score: f64,
    /// Latest value.
    pub value: f64,
}

/// Forecast of one SLO.
#[derive(Debug, Clone, Serialize)]
pub struct SloForecast {
    /// SLO name.
    pub slo: String,
    /// Threshold.
    pub threshold: f64,
    /// Days of data the trend used.
    pub days: usize,
    /// Latest point the trend used: the worst daily value of the last `worst_of_days` days.
    pub latest: Option<f64>,
    /// Trend slope per day, in the indicator's units (linear scale), ln units (log scale) or
    /// 1/units (reciprocal scale: negative while the indicator rises).
    pub slope_per_day: Option<f64>,
    /// The scale the trend was fitted on.
    pub scale: TrendScale,
    /// Days until breach (None: not forecast to breach).
    pub days_to_breach: Option<f64>,
    /// Far end of the interval.
    pub days_to_breach_upper: Option<f64>,
    /// Early warning: breach and the interval's far end within the horizon.
    pub early_warning: bool,
}

/// What the last tick concluded; served by /scores/latest.
#[derive(Debug, Clone, Serialize)]
pub struct HealthSummary {
    /// Event time of the tick, ms.
    pub ts_ms: i64,
    /// Health score in [0, 1].
    pub health_score: f64,
    /// Its band.
    pub level: Level,
    /// Series ranked by risk (the signals that moved).
    pub contributors: Vec<Contributor>,
    /// Per-SLO forecasts.
    pub forecasts: Vec<SloForecast>,
}

/// A change of the health level or of an early warning, for reports.
#[derive(Debug, Clone, Serialize)]
pub struct AlertEvent {
    /// Event time, ms.
    pub ts_ms: i64,
    /// `health` or `forecast:<slo>`.
    pub alert: String,
    /// New state.
    pub level: Level,
    /// The top contributing signal or the SLO.
    pub reason: String,
    /// For an early warning: the forecast days to breach when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub days_to_breach: Option<f64>,
}

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
    /// Samples after the onset that stayed away from the old normal.
    held: usize,
}

/// A sample counts as still away from the old normal beyond this many of its sigmas.
const HOLD_SIGMAS: f64 = 3.0;

struct SeriesState {
    scorer: WindowAnomaly,
    onset: Option<Onset>,
    /// Time of the last raw sample stored (decimation).
    last_raw_ms: Option<i64>,
    last_anomaly_raw_ms: Option<i64>,
    last_score: f64,
    last_value: f64,
    last_ts: i64,
    /// Live gauge of the series' value and of its anomaly score (None past the series limit).
    value_gauge: Option<GaugeHandle>,
    anomaly_gauge: Option<GaugeHandle>,
    /// The series' labels plus `signal`: the labels of its anomaly score.
    anomaly_labels: BTreeMap<String, String>,
    /// Store ids of the series and of its anomaly score, once the store has them.
    store_id: Option<SeriesId>,
    anomaly_store_id: Option<SeriesId>,
}

/// Scored series by signal, then labels: looked up by reference, without building a key.
type SeriesMap = HashMap<String, HashMap<BTreeMap<String, String>, SeriesState>>;

/// The pipeline state.
pub struct Engine {
    cfg: Arc<Config>,
    store: Arc<Store>,
    live: Arc<LiveMetrics>,
    series: SeriesMap,
    gpu_memory: HashMap<String, (Option<f64>, Option<f64>)>,
    clock_ms: i64,
    last_tick_ms: Option<i64>,
    last_retention_ms: i64,
    rolled_until_day_ms: Option<i64>,
    summary: Arc<RwLock<Option<HealthSummary>>>,
    health_level: Level,
    warnings: HashMap<String, bool>,
    events: Vec<AlertEvent>,
    /// The LSTM autoencoder, scored once per tick when configured.
    #[cfg(feature = "lstm")]
    model: Option<crate::lstm_live::LiveModel>,
    /// The last model tick failed (logged once per failure spell).
    #[cfg(feature = "lstm")]
    model_failing: bool,
}

fn to_labels(map: &BTreeMap<String, String>) -> Labels {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

impl Engine {
    /// A pipeline writing to `store` and publishing to `live`.
    pub fn new(cfg: Arc<Config>, store: Arc<Store>, live: Arc<LiveMetrics>) -> Result<Self> {
        let rolled_until_day_ms = store.meta("rolled_until_day_ms")?.and_then(|v| v.parse().ok());
        Ok(Self {
            cfg,
            store,
            live,
            series: HashMap::new(),
            gpu_memory: HashMap::new(),
            clock_ms: 0,
            last_tick_ms: None,
            last_retention_ms: 0,
            rolled_until_day_ms,
            summary: Arc::new(RwLock::new(None)),
            health_level: Level::Ok,
            warnings: HashMap::new(),
            events: Vec::new(),
            #[cfg(feature = "lstm")]
            model: None,
            #[cfg(feature = "lstm")]
            model_failing: false,
        })
    }

    /// Scores `model` at every tick from the latest value of its source series.
    #[cfg(feature = "lstm")]
    pub fn set_model(&mut self, model: crate::lstm_live::LiveModel) {
        self.model = Some(model);
    }

    /// One LSTM-AE step: the latest value of each source series (stale ones count as missing).
    /// It cannot fail the tick: a failing model only withdraws its score.
    #[cfg(feature = "lstm")]
    fn score_model(&mut self, now_ms: i64, out: &mut Vec<Sample>) {
        let Some(model) = self.model.as_mut() else { return };
        // Keys as SeriesKey displays them (`signal{k="v"}`), the form the model names its sources in;
        // only the model's own signals are read, not every live series.
        let signals: std::collections::BTreeSet<&str> =
            model.sources().iter().map(|s| s.split('{').next().unwrap_or(s)).collect();
        let mut latest: HashMap<String, f64> = HashMap::new();
        for signal in signals {
            let Some(by_labels) = self.series.get(signal) else { continue };
            for (labels, st) in by_labels.iter().filter(|(_, st)| now_ms - st.last_ts <= STALE_MS) {
                let key = omen_sources::SeriesKey { signal: signal.to_owned(), labels: labels.clone() };
                latest.insert(key.to_string(), st.last_value);
            }
        }
        let tick = model.tick(|s| latest.get(s).copied());
        // A failing model (its worker died, say) must not cost the batch its storage: the
        // score goes away, the failure is logged once, and the next tick tries again.
        let tick = match tick {
            Ok(t) => {
                if self.model_failing {
                    tracing::info!("LSTM-AE scoring works again");
                    self.model_failing = false;
                }
                t
            }
            Err(e) => {
                if !self.model_failing {
                    tracing::error!(
                        "LSTM-AE scoring failed; lstm_ae_score is withdrawn until it works again: {e:#}"
                    );
                    self.model_failing = true;
                }
                self.live.remove_gauge("lstm_ae_score", &Vec::new());
                return;
            }
        };
        match tick {
            crate::lstm_live::Tick::Scored { severity, .. } => {
                self.live.set_gauge("lstm_ae_score", Vec::new(), severity);
                out.push(Sample {
                    ts_ms: now_ms,
                    signal: "lstm_ae_score".into(),
                    labels: BTreeMap::new(),
                    value: severity,
                });
            }
            // A source went silent: an old score must not hold the health score up.
            crate::lstm_live::Tick::Missing => self.live.remove_gauge("lstm_ae_score", &Vec::new()),
            crate::lstm_live::Tick::Filling => {}
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

    /// Event time: the newest timestamp processed.
    pub fn clock_ms(&self) -> i64 {
        self.clock_ms
    }

    /// Scores, stores and publishes a batch; ticks when event time passes the health interval.
    /// Returns after the batch is committed to the store.
    pub fn process(&mut self, samples: Vec<Sample>) -> Result<usize> {
        // (sample, keep raw) for what the engine derives: anomaly scores, VRAM headroom.
        let mut derived: Vec<(Sample, bool)> = Vec::new();
        let mut keep_raw = Vec::with_capacity(samples.len());
        // Store ids known for the samples, so that the store looks up only new series;
        // (derived index, id, index of the scored sample) for the anomaly scores.
        let mut ids: Vec<Option<SeriesId>> = Vec::with_capacity(samples.len());
        let mut anomaly_ids: Vec<(usize, Option<SeriesId>, usize)> = Vec::new();
        let raw_every = self.cfg.store.raw_min_interval.as_millis() as i64;
        let keep = |last: &mut Option<i64>, ts: i64| {
            let k = last.is_none_or(|l| ts - l >= raw_every || ts < l);
            if k {
                *last = Some(ts);
            }
            k
        };
        for (i, s) in samples.iter().enumerate() {
            self.clock_ms = self.clock_ms.max(s.ts_ms);
            self.observe_special(s, &mut derived);
            if DERIVED.contains(&s.signal.as_str()) {
                self.live.set_gauge(&s.signal, to_labels(&s.labels), s.value);
                keep_raw.push(true);
                ids.push(None);
                continue;
            }
            let window = self.cfg.signals.window;
            let state = match self.series.get_mut(&s.signal).and_then(|f| f.get_mut(&s.labels)) {
                Some(state) => state,
                None => {
                    let mut anomaly_labels = s.labels.clone();
                    anomaly_labels.insert("signal".into(), s.signal.clone());
                    let state = SeriesState {
                        scorer: WindowAnomaly::new(window).expect("config validated window >= 3"),
                        onset: None,
                        last_raw_ms: None,
                        last_anomaly_raw_ms: None,
                        last_score: 0.0,
                        last_value: s.value,
                        last_ts: s.ts_ms,
                        value_gauge: self.live.gauge_handle(&s.signal, to_labels(&s.labels), s.value),
                        anomaly_gauge: None,
                        anomaly_labels,
                        store_id: None,
                        anomaly_store_id: None,
                    };
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
            keep_raw.push(keep(&mut state.last_raw_ms, s.ts_ms));
            ids.push(state.store_id);
            // Values were validated as finite by every source; a failure here is a bug upstream.
            if let Some(score) = state.scorer.push(s.value)? {
                state.last_score = score.score;
                track_onset(state, &self.cfg.signals, s.ts_ms, s.value, &score);
                match &state.anomaly_gauge {
                    Some(g) => g.set(score.score),
                    None => {
                        state.anomaly_gauge = self.live.gauge_handle(
                            "anomaly_score",
                            to_labels(&state.anomaly_labels),
                            score.score,
                        )
                    }
                }
                let keep_score = keep(&mut state.last_anomaly_raw_ms, s.ts_ms);
                let anomaly = Sample {
                    ts_ms: s.ts_ms,
                    signal: "anomaly_score".into(),
                    labels: state.anomaly_labels.clone(),
                    value: score.score,
                };
                anomaly_ids.push((derived.len(), state.anomaly_store_id, i));
                derived.push((anomaly, keep_score));
            }
        }
        let n = samples.len();
        let mut all = samples;
        let mut flags = keep_raw;
        for (sample, keep) in derived {
            all.push(sample);
            flags.push(keep);
            ids.push(None);
        }
        for &(k, id, _) in &anomaly_ids {
            ids[n + k] = id;
        }
        let unknown: Vec<usize> = (0..n).filter(|&i| ids[i].is_none()).collect();
        let unknown_anomaly: Vec<(usize, usize)> =
            anomaly_ids.iter().filter(|a| a.1.is_none()).map(|&(k, _, i)| (n + k, i)).collect();
        self.store.insert_with_ids(&all, &flags, &mut ids)?;
        // Committed: remember the ids of series new to the engine (the rare, slow path).
        for i in unknown {
            let s = &all[i];
            if let Some(st) = self.series.get_mut(&s.signal).and_then(|f| f.get_mut(&s.labels)) {
                st.store_id = ids[i];
            }
        }
        for (j, i) in unknown_anomaly {
            let s = &all[i];
            if let Some(st) = self.series.get_mut(&s.signal).and_then(|f| f.get_mut(&s.labels)) {
                st.anomaly_store_id = ids[j];
            }
        }
        self.live.samples_ingested.inc_by(n as u64);
        let due = match self.last_tick_ms {
            None => true,
            Some(t) => self.clock_ms - t >= self.cfg.health.interval.as_millis() as i64,
        };
        if due && self.clock_ms > 0 {
            self.tick(self.clock_ms)?;
        }
        Ok(n)
    }

    /// Canary latencies feed the histograms; GPU used/total pairs give headroom.
    fn observe_special(&mut self, s: &Sample, derived: &mut Vec<(Sample, bool)>) {
        let canary_labels = || to_labels(&s.labels);
        match s.signal.as_str() {
            "canary_ttft_seconds" => self.live.record_latency("ttft_seconds", canary_labels(), s.value),
            "canary_tpot_seconds" => self.live.record_latency("tpot_seconds", canary_labels(), s.value),
            "canary_e2e_seconds" => self.live.record_latency("e2e_seconds", canary_labels(), s.value),
            "gpu_memory_used_bytes" | "gpu_memory_total_bytes" => {
                let gpu = s.labels.get("gpu").cloned().unwrap_or_default();
                let entry = self.gpu_memory.entry(gpu.clone()).or_default();
                if s.signal == "gpu_memory_used_bytes" {
                    entry.0 = Some(s.value);
                } else {
                    entry.1 = Some(s.value);
                }
                if let (Some(used), Some(total)) = *entry {
                    if total > 0.0 {
                        *entry = (None, None);
                        let labels: BTreeMap<String, String> = [("gpu".to_owned(), gpu)].into();
                        let headroom = Sample {
                            ts_ms: s.ts_ms,
                            signal: "gpu_memory_headroom_ratio".into(),
                            labels,
                            value: (1.0 - used / total).clamp(0.0, 1.0),
                        };
                        derived.push((headroom, true));
                    }
                }
            }
            _ => {}
        }
    }

    /// Risk of a series: that of its onset once the change has held for `persistence` samples.
    fn risk_of(&self, state: &SeriesState) -> f64 {
        match state.onset {
            Some(o) if o.held + 1 >= self.cfg.signals.persistence => o.risk,
            _ => 0.0,
        }
    }

    /// Recomputes health, forecasts, day roll-ups and retention at event time `now_ms`.
    pub fn tick(&mut self, now_ms: i64) -> Result<HealthSummary> {
        self.last_tick_ms = Some(now_ms);
        let today = now_ms.div_euclid(DAY_MS) * DAY_MS;
        let from = match self.rolled_until_day_ms {
            Some(d) => d,
            None => self.store.earliest_ts()?.map(|t| t.div_euclid(DAY_MS) * DAY_MS).unwrap_or(today),
        };
        if from < today {
            self.store.roll_up_days(from, today)?;
            self.store.set_meta("rolled_until_day_ms", &today.to_string())?;
        }
        self.rolled_until_day_ms = Some(today.max(from));

        let mut contributors: Vec<Contributor> = self
            .series
            .iter()
            .flat_map(|(signal, family)| family.iter().map(move |(labels, st)| (signal, labels, st)))
            .filter(|(_, _, st)| now_ms - st.last_ts <= STALE_MS)
            .map(|(signal, labels, st)| Contributor {
                signal: signal.clone(),
                labels: labels.clone(),
                risk: self.risk_of(st),
                anomaly_score: st.last_score,
                value: st.last_value,
            })
            .filter(|c| c.risk > 0.0)
            .collect();
        contributors.sort_by(|a, b| b.risk.total_cmp(&a.risk).then_with(|| a.signal.cmp(&b.signal)));
        contributors.truncate(10);
        let mut health = contributors.first().map_or(0.0, |c| c.risk);

        let forecasts = self.forecasts(now_ms)?;
        if forecasts.iter().any(|f| f.early_warning) {
            health = health.max(self.cfg.health.warning);
        }
        let mut out = Vec::new();
        #[cfg(feature = "lstm")]
        self.score_model(now_ms, &mut out);
        if let Some(lstm) = self.live.gauge("lstm_ae_score", &Vec::new()) {
            health = health.max(lstm);
        }
        let level = if health >= self.cfg.health.critical {
            Level::Critical
        } else if health >= self.cfg.health.warning {
            Level::Warning
        } else {
            Level::Ok
        };
        out.push(Sample {
            ts_ms: now_ms,
            signal: "health_score".into(),
            labels: BTreeMap::new(),
            value: health,
        });
        self.live.set_gauge("health_score", Vec::new(), health);
        for f in &forecasts {
            let labels: BTreeMap<String, String> = [("slo".to_owned(), f.slo.clone())].into();
            for (name, value) in [
                ("forecast_days_to_breach", f.days_to_breach),
                ("forecast_days_to_breach_upper", f.days_to_breach_upper),
            ] {
                match value {
                    Some(v) => {
                        self.live.set_gauge(name, to_labels(&labels), v);
                        out.push(Sample {
                            ts_ms: now_ms,
                            signal: name.into(),
                            labels: labels.clone(),
                            value: v,
                        });
                    }
                    None => self.live.remove_gauge(name, &to_labels(&labels)),
                }
            }
            let was = self.warnings.insert(f.slo.clone(), f.early_warning).unwrap_or(false);
            if was != f.early_warning {
                self.events.push(AlertEvent {
                    ts_ms: now_ms,
                    alert: format!("forecast:{}", f.slo),
                    level: if f.early_warning { Level::Warning } else { Level::Ok },
                    reason: match f.days_to_breach {
                        Some(d) => format!("{} forecast to cross {} in {d:.1} days", f.slo, f.threshold),
                        None => format!("{} no longer forecast to breach", f.slo),
                    },
                    days_to_breach: f.days_to_breach,
                });
            }
        }
        if level != self.health_level {
            self.events.push(AlertEvent {
                ts_ms: now_ms,
                alert: "health".into(),
                level,
                reason: contributors.first().map_or_else(
                    || {
                        if forecasts.iter().any(|f| f.early_warning) {
                            "forecast early warning".into()
                        } else {
                            "all signals normal".into()
                        }
                    },
                    |c| format!("{} {:?} anomaly score {:.2}", c.signal, c.labels, c.anomaly_score),
                ),
                days_to_breach: None,
            });
            self.health_level = level;
        }
        self.store.insert(&out)?;
        if now_ms - self.last_retention_ms >= 3_600_000 {
            let st = &self.cfg.store;
            self.store.apply_retention(
                now_ms,
                st.raw_retention_days,
                st.minute_retention_days,
                st.day_retention_days,
            )?;
            self.last_retention_ms = now_ms;
        }
        let summary = HealthSummary { ts_ms: now_ms, health_score: health, level, contributors, forecasts };
        *self.summary.write().unwrap_or_else(|e| e.into_inner()) = Some(summary.clone());
        Ok(summary)
    }

    fn forecasts(&self, now_ms: i64) -> Result<Vec<SloForecast>> {
        let f = &self.cfg.forecast;
        let today = now_ms.div_euclid(DAY_MS) * DAY_MS;
        let worst_of = f.worst_of_days.max(1);
        // Earlier days feed the first trailing windows, so the trend still spans lookback_days.
        let from = today - (f.lookback_days + worst_of - 1) as i64 * DAY_MS;
        let mut out = Vec::new();
        for slo in &f.slos {
            let direction = match slo.direction {
                Direction::Above => BreachDirection::Above,
                Direction::Below => BreachDirection::Below,
            };
            let raw = self.daily_indicator(slo, from, today)?;
            let y_raw: Vec<f64> = raw.iter().map(|d| d.1).collect();
            let daily: Vec<(f64, f64)> = raw[raw.len().min(worst_of - 1)..]
                .iter()
                .map(|d| d.0)
                .zip(trailing_worst(&y_raw, worst_of, direction))
                .collect();
            let scale = slo.trend_scale();
            let mut fc = SloForecast {
                slo: slo.name.clone(),
                threshold: slo.threshold,
                days: daily.len(),
                latest: daily.last().map(|d| d.1),
                slope_per_day: None,
                scale,
                days_to_breach: None,
                days_to_breach_upper: None,
                early_warning: false,
            };
            // On a log or reciprocal scale, non-positive days (a latency of 0 is a broken probe)
            // are left out; 1/x falls as x rises, so on the reciprocal scale the breach
            // direction flips.
            let points: Vec<(f64, f64)> = daily
                .into_iter()
                .filter(|d| scale == TrendScale::Linear || d.1 > 0.0)
                .map(|(x, y)| (x, scale.apply(y)))
                .collect();
            let threshold = scale.apply(slo.threshold);
            let direction = if scale == TrendScale::Reciprocal { direction.flipped() } else { direction };
            if points.len() >= f.min_days {
                let x: Vec<f64> = points.iter().map(|d| d.0).collect();
                let y: Vec<f64> = points.iter().map(|d| d.1).collect();
                if let Ok(fit) = theil_sen(&x, &y, f.confidence) {
                    let b = days_to_breach(&fit, now_ms as f64 / DAY_MS as f64, threshold, direction);
                    fc.slope_per_day = Some(fit.slope);
                    fc.days_to_breach = b.days_to_breach;
                    fc.days_to_breach_upper = b.latest_days;
                    fc.early_warning = b.early_warning(f.horizon_days);
                }
            }
            out.push(fc);
        }
        Ok(out)
    }

    /// (day midpoint in days since the epoch, indicator) for complete days in [from, until).
    fn daily_indicator(&self, slo: &SloConfig, from_ms: i64, until_ms: i64) -> Result<Vec<(f64, f64)>> {
        let def = IndicatorDefinition::of(slo.indicator);
        let mut by_day: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
        for d in self.store.day_aggregates(def.signal, from_ms, until_ms)? {
            by_day.entry(d.day_ms).or_default().push(def.statistic.of_aggregate(&d));
        }
        Ok(by_day
            .into_iter()
            .map(|(day, v)| (day as f64 / DAY_MS as f64 + 0.5, def.combine.apply(&v)))
            .collect())
    }
}

/// How an SLO indicator is computed from stored samples: the one definition that the
/// forecasts and the simulator's breach labels (simulate.rs) share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndicatorDefinition {
    /// The stored series it reads.
    pub signal: &'static str,
    /// Which daily statistic of each series.
    pub statistic: DailyStatistic,
    /// How the series of one day combine (max over layers, mean over canaries).
    pub combine: CombineSeries,
}

impl IndicatorDefinition {
    /// The definition of `indicator` (config.rs documents each).
    pub fn of(indicator: SloIndicator) -> Self {
        use CombineSeries::{Max, Mean, Min};
        let (signal, statistic, combine) = match indicator {
            SloIndicator::TtftP99 => ("canary_ttft_seconds", DailyStatistic::P99, Max),
            SloIndicator::KvUsage => ("kvcache_usage_ratio", DailyStatistic::P95, Max),
            SloIndicator::Kvf => ("kvf_ratio", DailyStatistic::P95, Max),
            SloIndicator::VramHeadroom => ("gpu_memory_headroom_ratio", DailyStatistic::Min, Min),
            SloIndicator::Rci => ("rci", DailyStatistic::Mean, Mean),
        };
        Self { signal, statistic, combine }
    }
}

/// A daily statistic of one series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DailyStatistic {
    /// 99th percentile.
    P99,
    /// 95th percentile.
    P95,
    /// Minimum.
    Min,
    /// Mean.
    Mean,
}

impl DailyStatistic {
    /// The statistic as the store's day aggregate holds it.
    pub fn of_aggregate(self, d: &crate::store::DayAggregate) -> f64 {
        match self {
            Self::P99 => d.p99,
            Self::P95 => d.p95,
            Self::Min => d.min,
            Self::Mean => d.mean,
        }
    }

    /// The statistic of one day's values, sorted ascending and not empty; the quantiles are
    /// numpy's linear ones, as the store's day aggregates compute them.
    pub fn of_sorted(self, sorted: &[f64]) -> f64 {
        match self {
            Self::P99 => omen_signals::quantile_linear(sorted, 0.99),
            Self::P95 => omen_signals::quantile_linear(sorted, 0.95),
            Self::Min => sorted[0],
            Self::Mean => sorted.iter().sum::<f64>() / sorted.len() as f64,
        }
    }
}

/// How the series of one day combine into the day's indicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CombineSeries {
    /// The highest (the worst layer or GPU).
    Max,
    /// The lowest (the least headroom).
    Min,
    /// The mean (over canaries).
    Mean,
}

impl CombineSeries {
    /// Combines one day's per-series statistics (not empty).
    pub fn apply(self, v: &[f64]) -> f64 {
        match self {
            Self::Max => v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Self::Min => v.iter().copied().fold(f64::INFINITY, f64::min),
            Self::Mean => v.iter().sum::<f64>() / v.len() as f64,
        }
    }
}

/// Risk in [0, 1] of one window score.
fn score_risk(signals: &crate::config::SignalsConfig, score: f64) -> f64 {
    ((score - signals.anomaly_normal) / (signals.anomaly_full - signals.anomaly_normal)).clamp(0.0, 1.0)
}

/// Follows a suspected change. A window score alone fades as the window absorbs a
/// level shift, so a change is judged against the window it broke away from: it
/// counts once `persistence` samples in a row stay beyond 3 sigma of that old
/// normal (a lone spike does not), and is released when values return or after `latch`.
fn track_onset(
    state: &mut SeriesState,
    signals: &crate::config::SignalsConfig,
    ts_ms: i64,
    x: f64,
    score: &omen_signals::WindowScore,
) {
    let risk = score_risk(signals, score.score);
    if let Some(o) = state.onset.as_mut() {
        let away = (x - o.mean) * o.direction > HOLD_SIGMAS * (o.std + omen_signals::STD_EPSILON);
        let expired = ts_ms - o.ts_ms > signals.latch.as_millis() as i64;
        if away && !expired {
            o.held += 1;
            o.risk = o.risk.max(risk);
            return;
        }
        state.onset = None;
    }
    if risk > 0.0 {
        state.onset = Some(Onset {
            ts_ms,
            mean: score.mean,
            std: score.std,
            direction: if x >= score.mean { 1.0 } else { -1.0 },
            risk,
            held: 0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(dir: &std::path::Path, yaml: &str) -> Engine {
        let cfg = Arc::new(Config::from_yaml(yaml).unwrap());
        let store = Arc::new(Store::open(&dir.join("omen.db")).unwrap());
        Engine::new(cfg, store, Arc::new(LiveMetrics::new())).unwrap()
    }

    fn kvf(ts_ms: i64, value: f64) -> Sample {
        Sample {
            ts_ms,
            signal: "kvf_ratio".into(),
            labels: [("layer".to_owned(), "0".to_owned())].into(),
            value,
        }
    }

    #[test]
    fn sustained_anomaly_raises_health_and_names_the_signal() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "signals: {window: 20, persistence: 3}\n");
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
        assert_eq!(s.contributors[0].signal, "kvf_ratio");
        assert!(e.events().iter().any(|ev| ev.alert == "health" && ev.level == Level::Critical));
    }

    #[test]
    fn single_spike_is_debounced() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "signals: {window: 20, persistence: 3}\n");
        let t0 = 1_793_577_600_000;
        for i in 0..40 {
            let v = if i == 30 { 50.0 } else { 1.0 + 0.01 * (i % 3) as f64 };
            e.process(vec![kvf(t0 + i * 10_000, v)]).unwrap();
        }
        assert_eq!(e.tick(t0 + 31 * 10_000).unwrap().level, Level::Ok);
    }

    #[test]
    fn rising_kv_usage_gives_an_early_warning() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "forecast: {min_days: 7, worst_of_days: 1}\n");
        let t0 = 1_793_577_600_000;
        // 12 days of KV usage rising 2.5 points a day from 0.55, hourly samples with a daily cycle
        for h in 0..(12 * 24) {
            let day = h as f64 / 24.0;
            let v = 0.55 + 0.025 * day + 0.02 * ((h % 24) as f64 / 24.0 * std::f64::consts::TAU).sin();
            let s = Sample {
                ts_ms: t0 + h * 3_600_000,
                signal: "kvcache_usage_ratio".into(),
                labels: [("layer".to_owned(), "0".to_owned())].into(),
                value: v,
            };
            e.process(vec![s]).unwrap();
        }
        let s = e.tick(t0 + 12 * DAY_MS).unwrap();
        let kv = s.forecasts.iter().find(|f| f.slo == "kv_usage").unwrap();
        assert_eq!(kv.days, 12, "{kv:?}");
        let d = kv.days_to_breach.unwrap();
        // p95 of a day is ~0.02 above its mean; the 0.95 line is crossed in about 3-6 days
        assert!(d > 2.0 && d < 8.0, "{kv:?}");
        assert!(kv.early_warning);
        assert!(s.health_score >= 0.6);
        assert!(e.events().iter().any(|ev| ev.alert == "forecast:kv_usage"));
        let ttft = s.forecasts.iter().find(|f| f.slo == "ttft_p99").unwrap();
        assert!(ttft.days_to_breach.is_none() && !ttft.early_warning);
    }

    /// Daily p95 KV usage rising 0.01/day with a weekend dip of 0.15, over `days` days.
    fn weekly_kv_engine(dir: &std::path::Path, forecast: &str, days: i64) -> Engine {
        let mut e = engine(dir, forecast);
        // 2026-11-02 is a Monday.
        let t0 = 1_793_577_600_000;
        for h in 0..(days * 24) {
            let day = h / 24;
            let weekend = if day % 7 >= 5 { 0.15 } else { 0.0 };
            let v = 0.55 + 0.01 * day as f64 - weekend;
            let labels = [("layer".to_owned(), "0".to_owned())].into();
            let s =
                Sample { ts_ms: t0 + h * 3_600_000, signal: "kvcache_usage_ratio".into(), labels, value: v };
            e.process(vec![s]).unwrap();
        }
        e
    }

    #[test]
    fn worst_of_seven_days_removes_a_weekly_dip_from_the_trend() {
        let t_end = 1_793_577_600_000 + 26 * DAY_MS;
        let dir = tempfile::tempdir().unwrap();
        let mut weekly = weekly_kv_engine(dir.path(), "forecast: {min_days: 7}\n", 26);
        let kv = weekly.tick(t_end).unwrap().forecasts.into_iter().find(|f| f.slo == "kv_usage").unwrap();
        // 26 complete days give 20 trailing weekly maxima: the weekday line, slope 0.01.
        assert_eq!(kv.days, 20, "{kv:?}");
        assert!((kv.slope_per_day.unwrap() - 0.01).abs() < 1e-9, "{kv:?}");
        assert!((kv.latest.unwrap() - (0.55 + 0.01 * 25.0)).abs() < 1e-9, "{kv:?}");
        // 0.95 - 0.80 at 0.01/day: 15 days after the last day's value (at 25.5), tight interval.
        let d = kv.days_to_breach.unwrap();
        assert!((d - 15.0).abs() < 0.6, "{kv:?}");

        let dir = tempfile::tempdir().unwrap();
        let mut daily = weekly_kv_engine(dir.path(), "forecast: {min_days: 7, worst_of_days: 1}\n", 26);
        let kv = daily.tick(t_end).unwrap().forecasts.into_iter().find(|f| f.slo == "kv_usage").unwrap();
        // Day by day, the weekends widen the slope interval: the far end drifts away.
        let far = kv.days_to_breach_upper.unwrap_or(f64::INFINITY);
        assert!(far > d + 1.0, "{kv:?}");
    }

    /// TTFT of a queue whose utilisation rises 1.5 points a day from 0.5: 0.2 s / (1 - rho),
    /// one value per day, hourly samples; `scale` is the TTFT SLO's trend scale.
    fn queueing_ttft_forecast(scale: &str) -> SloForecast {
        let dir = tempfile::tempdir().unwrap();
        let slo = format!("{{name: ttft_p99, indicator: ttft_p99, threshold: 2.0, scale: {scale}}}");
        let mut e = engine(dir.path(), &format!("forecast: {{min_days: 7, slos: [{slo}]}}\n"));
        let t0 = 1_793_577_600_000;
        for h in 0..(18 * 24) {
            let rho = 0.5 + 0.015 * (h / 24) as f64;
            let labels = [("canary".to_owned(), "capital".to_owned())].into();
            let s = Sample {
                ts_ms: t0 + h * 3_600_000,
                signal: "canary_ttft_seconds".into(),
                labels,
                value: 0.2 / (1.0 - rho),
            };
            e.process(vec![s]).unwrap();
        }
        e.tick(t0 + 18 * DAY_MS).unwrap().forecasts.remove(0)
    }

    #[test]
    fn a_queueing_knee_is_a_straight_line_on_the_reciprocal_scale() {
        // 1/TTFT = 5 (1 - rho) falls linearly; it reaches 1/2 s when rho = 0.9, on the day
        // whose value is 0.5 + 0.015 d = 0.9: d = 26.67, its midpoint line crossing at
        // x = 27.17, so 9.17 days after day 18 starts.
        let f = queueing_ttft_forecast("reciprocal");
        assert_eq!(f.scale, TrendScale::Reciprocal);
        let d = f.days_to_breach.unwrap();
        assert!((d - (0.4 / 0.015 + 0.5 - 18.0)).abs() < 1e-6, "{f:?}");
        assert!((f.days_to_breach_upper.unwrap() - d).abs() < 1e-6, "an exact line has no spread: {f:?}");
        assert!(f.early_warning, "{f:?}");
        assert!(f.slope_per_day.unwrap() < 0.0, "1/TTFT falls: {f:?}");
        // A straight line in ln(TTFT) bends below the hyperbola, so it sees the knee later.
        let log = queueing_ttft_forecast("log");
        assert!(log.days_to_breach.unwrap() > d + 3.0, "{log:?}");
        let linear = queueing_ttft_forecast("linear");
        assert!(linear.days_to_breach.unwrap() > log.days_to_breach.unwrap(), "{linear:?}");
    }

    #[test]
    fn latency_trends_are_fitted_on_the_reciprocal_scale() {
        let cfg = crate::config::Config::default();
        let ttft = cfg.forecast.slos.iter().find(|s| s.name == "ttft_p99").unwrap();
        assert_eq!(ttft.trend_scale(), TrendScale::Reciprocal);
        let kv = cfg.forecast.slos.iter().find(|s| s.name == "kv_usage").unwrap();
        assert_eq!(kv.trend_scale(), TrendScale::Linear);
    }
}

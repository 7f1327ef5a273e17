//! `omen simulate SCENARIO.yaml --out DIR`: a seeded degradation scenario simulator.
//!
//! A scenario (YAML) describes one vLLM-like replica over weeks: the same signals and
//! labels as the demo traces (KV usage and KVF per layer, canary TTFT, TLE and RCI,
//! GPU memory used/total), with daily and weekly load seasonality, noise, and at most
//! one labelled fault with a known onset. A run writes `trace.jsonl.gz` (the format
//! `omen replay` reads) and `labels.json`: the fault, its onset, the SLO it threatens,
//! its threshold, and the breach time computed from the generated series with the
//! same daily statistic the forecast uses.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

use omen_agent::config::{Direction, SloIndicator};
use omen_agent::engine::IndicatorDefinition;
use omen_signals::{catalogue, DAY_MS};

/// Errors of reading a scenario or writing its output.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// The scenario file could not be read.
    #[error("cannot read the scenario {path}: {source}")]
    Read {
        /// Scenario path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A field is unknown, mistyped or out of range.
    #[error("scenario {path}: {field}: {message}")]
    Invalid {
        /// Scenario path (or `(text)`).
        path: String,
        /// Dotted field path.
        field: String,
        /// The problem and the fix.
        message: String,
    },
    /// Writing the output failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// Output path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The fault kinds the simulator can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// No fault.
    Healthy,
    /// KV-cache fragmentation (KVF) creeping up linearly; `magnitude` = KVF per day.
    KvFragmentationCreep,
    /// Slow GPU memory leak; `magnitude` = GB leaked per day.
    VramLeak,
    /// Canary TTFT drifting up as contexts grow; `magnitude` = relative TTFT growth per day.
    TtftP99Drift,
    /// Silent model change: TLE and RCI step at the onset; `magnitude` = the RCI step.
    ConsistencyDecay,
    /// Load rising towards the batch saturation knee; `magnitude` = relative load growth per day.
    BatchSaturationKnee,
    /// Load raised by a factor 1 + `magnitude` while the fault lasts (a holiday week: set
    /// `duration_days`); threatens TTFT p99.
    LoadSurge,
    /// KVF steps up by `magnitude` at the onset (a deploy that changes the allocator).
    KvfStep,
}

/// How a drifting fault grows with the days since its onset, s (times `magnitude`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DriftShape {
    /// s: a steady amount a day.
    #[default]
    Linear,
    /// s^2 / 14: as much as linear after two weeks, slower before, faster after.
    Accelerating,
    /// tau (1 - e^(-s / tau)), tau = `saturate_days`: fast at first, then levelling off at
    /// `magnitude * saturate_days`.
    Saturating,
    /// ((1 + magnitude)^s - 1) / magnitude: compounding growth (`magnitude` a day).
    Compounding,
}

impl FaultKind {
    /// The SLO the fault threatens, as named in the default forecast config.
    pub fn slo(self) -> Option<(&'static str, SloIndicator, f64, Direction)> {
        match self {
            FaultKind::Healthy => None,
            FaultKind::KvFragmentationCreep | FaultKind::KvfStep => {
                Some(("kvf", SloIndicator::Kvf, omen_signals::KVF_ALERT_THRESHOLD, Direction::Above))
            }
            FaultKind::VramLeak => {
                Some(("vram_headroom", SloIndicator::VramHeadroom, 0.05, Direction::Below))
            }
            FaultKind::TtftP99Drift | FaultKind::BatchSaturationKnee | FaultKind::LoadSurge => {
                Some(("ttft_p99", SloIndicator::TtftP99, 2.0, Direction::Above))
            }
            FaultKind::ConsistencyDecay => Some(("rci", SloIndicator::Rci, 0.5, Direction::Above)),
        }
    }

    /// Abrupt faults appear at once; the others drift slowly.
    pub fn abrupt(self) -> bool {
        matches!(self, FaultKind::ConsistencyDecay)
    }
}

/// The fault of a scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// Which fault.
    pub kind: FaultKind,
    /// Days after the trace start at which it begins.
    #[serde(default)]
    pub onset_days: f64,
    /// Strength; its unit depends on the kind (see [`FaultKind`]).
    #[serde(default)]
    pub magnitude: f64,
    /// How a drift grows (KVF creep, VRAM leak, TTFT drift, saturation knee).
    #[serde(default)]
    pub shape: DriftShape,
    /// Time constant of a saturating drift, days.
    #[serde(default = "default_saturate_days")]
    pub saturate_days: f64,
    /// The drift grows in steps every this many days (a leak that jumps at each event).
    #[serde(default)]
    pub step_days: Option<f64>,
    /// A restart frees the drift every this many days (it starts again from 0).
    #[serde(default)]
    pub restart_every_days: Option<f64>,
    /// The fault ends after this many days (unset: it lasts to the end of the trace).
    #[serde(default)]
    pub duration_days: Option<f64>,
}

fn default_saturate_days() -> f64 {
    7.0
}

impl FaultSpec {
    /// Whether the fault is on at `day` (days since the trace start).
    fn active(&self, day: f64) -> bool {
        day >= self.onset_days && self.duration_days.is_none_or(|d| day < self.onset_days + d)
    }

    /// The drift at `day`, in units of `magnitude` (0 before the onset and after the end).
    fn drift(&self, day: f64) -> f64 {
        if !self.active(day) {
            return 0.0;
        }
        let mut since = day - self.onset_days;
        if let Some(every) = self.restart_every_days {
            since = since.rem_euclid(every);
        }
        if let Some(step) = self.step_days {
            since = (since / step).floor() * step;
        }
        match self.shape {
            DriftShape::Linear => since,
            DriftShape::Accelerating => since * since / 14.0,
            DriftShape::Saturating => self.saturate_days * (1.0 - (-since / self.saturate_days).exp()),
            DriftShape::Compounding => ((1.0 + self.magnitude).powf(since) - 1.0) / self.magnitude,
        }
    }
}

/// A span without samples (an agent or network outage).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gap {
    /// Days after the trace start at which it begins.
    pub from_days: f64,
    /// Its length, days.
    pub days: f64,
}

/// Load seasonality amplitudes (relative load swing).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Seasonality {
    /// Day/night swing: load is 1 + daily * sin(...), peaking mid-day UTC.
    pub daily: f64,
    /// Weekend dip: load is scaled by 1 - weekly on Saturdays and Sundays.
    pub weekly: f64,
}

impl Default for Seasonality {
    fn default() -> Self {
        Self { daily: 0.3, weekly: 0.15 }
    }
}

/// A degradation scenario (one YAML file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name, used for output folders and reports.
    pub name: String,
    /// Random seed; the same scenario and seed give the same trace, byte for byte.
    #[serde(default)]
    pub seed: u64,
    /// Trace start, RFC 3339 (default 2026-11-02T00:00:00Z, a Monday).
    #[serde(default = "default_start")]
    pub start: String,
    /// Trace length in days.
    pub days: f64,
    /// Sampling step.
    #[serde(default = "default_step", with = "humantime_serde")]
    pub step: Duration,
    /// Noise scale (1 = typical noise).
    #[serde(default = "default_noise")]
    pub noise: f64,
    /// Load seasonality.
    #[serde(default)]
    pub seasonality: Seasonality,
    /// KV-cache layers simulated.
    #[serde(default = "default_layers")]
    pub layers: usize,
    /// The fault (healthy when absent).
    #[serde(default)]
    pub fault: Option<FaultSpec>,
    /// Spans without samples.
    #[serde(default)]
    pub gaps: Vec<Gap>,
}

fn default_start() -> String {
    "2026-11-02T00:00:00Z".into()
}
fn default_step() -> Duration {
    Duration::from_secs(60)
}
fn default_noise() -> f64 {
    1.0
}
fn default_layers() -> usize {
    2
}

/// What a run writes to labels.json.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Labels {
    /// Scenario name.
    pub scenario: String,
    /// Fault kind.
    pub fault: FaultKind,
    /// Abrupt (step) or slow (drift).
    pub abrupt: bool,
    /// Onset, Unix ms (None when healthy).
    pub onset_ts_ms: Option<i64>,
    /// Onset, RFC 3339.
    pub onset: Option<String>,
    /// The SLO the fault threatens.
    pub slo: Option<String>,
    /// Its threshold.
    pub slo_threshold: Option<f64>,
    /// Start of the first UTC day whose daily indicator crosses the threshold, Unix ms.
    pub breach_ts_ms: Option<i64>,
    /// The same, RFC 3339.
    pub breach: Option<String>,
    /// First and last sample time, Unix ms.
    pub first_ts_ms: i64,
    /// Last sample time, Unix ms.
    pub last_ts_ms: i64,
    /// Samples written.
    pub samples: usize,
}

impl Scenario {
    /// Parses a scenario; unknown keys and bad values are reported with their field path.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, SimulateError> {
        let invalid = |field: String, message: String| SimulateError::Invalid {
            path: origin.to_owned(),
            field,
            message,
        };
        let s: Scenario = omen_agent::config::from_yaml_at_path(text)
            .map_err(|(field, message)| invalid(field, message))?;
        if s.name.is_empty() || !s.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(invalid("name".into(), format!("{:?}: use letters, digits, - and _", s.name)));
        }
        if chrono::DateTime::parse_from_rfc3339(&s.start).is_err() {
            return Err(invalid(
                "start".into(),
                format!("{:?} is not RFC 3339, e.g. 2026-11-02T00:00:00Z", s.start),
            ));
        }
        if !(s.days > 0.0 && s.days <= 400.0) {
            return Err(invalid("days".into(), format!("{} must be in (0, 400]", s.days)));
        }
        if s.step < Duration::from_secs(1) || s.step > Duration::from_secs(3600) {
            return Err(invalid("step".into(), "must be between 1s and 1h, e.g. 60s".into()));
        }
        if !(s.noise >= 0.0 && s.noise.is_finite()) {
            return Err(invalid("noise".into(), format!("{} must be >= 0", s.noise)));
        }
        let se = &s.seasonality;
        if !(0.0..1.0).contains(&se.daily) || !(0.0..1.0).contains(&se.weekly) {
            return Err(invalid("seasonality".into(), "daily and weekly must be in [0, 1)".into()));
        }
        if s.layers == 0 || s.layers > 64 {
            return Err(invalid("layers".into(), format!("{} must be in 1..=64", s.layers)));
        }
        if let Some(f) = &s.fault {
            if !(f.onset_days >= 0.0 && f.onset_days < s.days) {
                return Err(invalid(
                    "fault.onset_days".into(),
                    format!("{} must be in [0, days = {})", f.onset_days, s.days),
                ));
            }
            if f.kind != FaultKind::Healthy && !(f.magnitude > 0.0 && f.magnitude.is_finite()) {
                return Err(invalid("fault.magnitude".into(), "must be > 0 for a fault".into()));
            }
            let positive = [
                ("fault.saturate_days", Some(f.saturate_days)),
                ("fault.step_days", f.step_days),
                ("fault.restart_every_days", f.restart_every_days),
                ("fault.duration_days", f.duration_days),
            ];
            for (field, value) in positive {
                if let Some(v) = value.filter(|v| !(*v > 0.0 && v.is_finite())) {
                    return Err(invalid(field.into(), format!("{v} must be > 0 days")));
                }
            }
        }
        for (i, g) in s.gaps.iter().enumerate() {
            if !(g.from_days >= 0.0 && g.from_days < s.days && g.days > 0.0 && g.days.is_finite()) {
                return Err(invalid(
                    format!("gaps[{i}]"),
                    format!(
                        "from_days {} must be in [0, days = {}) and days {} > 0",
                        g.from_days, s.days, g.days
                    ),
                ));
            }
        }
        Ok(s)
    }

    /// Reads a scenario file.
    pub fn load(path: &Path) -> Result<Self, SimulateError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SimulateError::Read { path: path.to_owned(), source })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    fn kind(&self) -> FaultKind {
        self.fault.as_ref().map_or(FaultKind::Healthy, |f| f.kind)
    }

    fn start_ms(&self) -> i64 {
        chrono::DateTime::parse_from_rfc3339(&self.start).expect("validated").timestamp_millis()
    }

    /// The samples of the scenario, in time order (one batch per step).
    pub fn generate(&self) -> Vec<omen_sources::Sample> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let start = self.start_ms();
        let step = self.step.as_millis() as i64;
        let steps = (self.days * DAY_MS as f64 / step as f64).round() as i64;
        let kind = self.kind();
        let mag = self.fault.as_ref().map_or(0.0, |f| f.magnitude);
        let drift = |day: f64| self.fault.as_ref().map_or(0.0, |f| f.drift(day));
        let active = |day: f64| self.fault.as_ref().is_some_and(|f| f.active(day));
        let nz = self.noise;
        let mut out = Vec::with_capacity(steps as usize * (2 * self.layers + 5));
        let mut ttft_noise = 0.0f64;
        for i in 0..steps {
            let ts = start + i * step;
            let mark = out.len();
            let day = (ts - start) as f64 / DAY_MS as f64;
            let faulty = active(day);
            let load = load_at(ts, &self.seasonality)
                * match kind {
                    FaultKind::BatchSaturationKnee => 1.0 + mag * drift(day),
                    FaultKind::LoadSurge if faulty => 1.0 + mag,
                    _ => 1.0,
                };
            // The noise draws happen in a gap too, so that a gap leaves the rest of the trace as it was.
            let gap = self.gaps.iter().any(|g| day >= g.from_days && day < g.from_days + g.days);
            let push =
                |out: &mut Vec<omen_sources::Sample>, signal: &str, labels: &[(&str, String)], v: f64| {
                    out.push(omen_sources::Sample {
                        ts_ms: ts,
                        signal: signal.into(),
                        labels: labels
                            .iter()
                            .map(|(k, v)| ((*k).to_owned(), v.clone()))
                            .collect::<BTreeMap<_, _>>(),
                        value: v,
                    })
                };
            for layer in 0..self.layers {
                let lab = [("gpu", "0".to_owned()), ("layer", layer.to_string())];
                // KV usage follows load (saturating near 1), KVF sits near 1.15 unless it creeps.
                let usage = (0.5 * load + 0.01 * nz * normal(&mut rng)).clamp(0.0, 1.0);
                push(&mut out, catalogue::KVCACHE_USAGE_RATIO.name, &lab, usage);
                let creep = match kind {
                    FaultKind::KvFragmentationCreep => mag * drift(day),
                    FaultKind::KvfStep if faulty => mag,
                    _ => 0.0,
                };
                let kvf = 1.15 + 0.03 * (load - 1.0) + creep + 0.012 * nz * normal(&mut rng).abs();
                push(&mut out, catalogue::KV_FRAGMENTATION.name, &lab, kvf.max(1.0));
            }
            let canary = [("canary", "capital".to_owned())];
            // TTFT: queueing grows with load, sharply past the knee (utilisation 1/1.6 of capacity).
            let rho = (load / 1.6).min(0.98);
            let queue = 1.0 / (1.0 - rho);
            let context = if kind == FaultKind::TtftP99Drift { 1.0 + mag * drift(day) } else { 1.0 };
            // Slowly varying (AR(1)) noise on top of per-request jitter.
            ttft_noise = 0.95 * ttft_noise + 0.05 * normal(&mut rng);
            let jitter = (0.18 * nz * normal(&mut rng) + 0.5 * nz * ttft_noise).exp();
            push(&mut out, catalogue::CANARY_TTFT_SECONDS.name, &canary, 0.12 * queue * context * jitter);
            let step_on = kind == FaultKind::ConsistencyDecay && faulty;
            let tle = if step_on { 1.20 + 0.6 * mag } else { 1.20 } + 0.004 * nz * normal(&mut rng);
            push(&mut out, catalogue::TLE_BITS.name, &canary, tle);
            let rci = if step_on { 0.08 + mag } else { 0.08 } + 0.01 * nz * normal(&mut rng);
            push(&mut out, catalogue::RCI.name, &canary, rci.clamp(0.0, 1.0));
            let gpu = [("gpu", "0".to_owned())];
            let leak = if kind == FaultKind::VramLeak { mag * 1e9 * drift(day) } else { 0.0 };
            let used = 62e9 + 0.5e9 * (load - 1.0) + leak + 0.05e9 * nz * normal(&mut rng);
            push(&mut out, catalogue::GPU_MEMORY_USED_BYTES.name, &gpu, used.min(80e9));
            push(&mut out, catalogue::GPU_MEMORY_TOTAL_BYTES.name, &gpu, 80e9);
            if gap {
                out.truncate(mark);
            }
        }
        out
    }

    /// The labels of generated samples: onset, SLO and the breach day found in the series.
    pub fn labels(&self, samples: &[omen_sources::Sample]) -> Labels {
        let kind = self.kind();
        let start = self.start_ms();
        let onset_ts_ms = self
            .fault
            .as_ref()
            .filter(|_| kind != FaultKind::Healthy)
            .map(|f| start + (f.onset_days * DAY_MS as f64).round() as i64);
        let slo = kind.slo();
        let breach_ts_ms = slo.and_then(|(_, ind, thr, dir)| breach_day(samples, ind, thr, dir));
        let fmt =
            |ms: i64| chrono::DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339()).unwrap_or_default();
        Labels {
            scenario: self.name.clone(),
            fault: kind,
            abrupt: kind.abrupt(),
            onset_ts_ms,
            onset: onset_ts_ms.map(fmt),
            slo: slo.map(|s| s.0.to_owned()),
            slo_threshold: slo.map(|s| s.2),
            breach_ts_ms,
            breach: breach_ts_ms.map(fmt),
            first_ts_ms: samples.first().map_or(start, |s| s.ts_ms),
            last_ts_ms: samples.last().map_or(start, |s| s.ts_ms),
            samples: samples.len(),
        }
    }
}

/// Relative load at `ts`: daily sine peaking at 14:00 UTC, weekend dip.
fn load_at(ts: i64, s: &Seasonality) -> f64 {
    let day_frac = ts.rem_euclid(DAY_MS) as f64 / DAY_MS as f64;
    let daily = (std::f64::consts::TAU * (day_frac - 14.0 / 24.0 + 0.25)).sin();
    // 1970-01-01 was a Thursday: day index 2 and 3 (mod 7) are Saturday and Sunday.
    let weekday = ts.div_euclid(DAY_MS).rem_euclid(7);
    let weekend = if weekday == 2 || weekday == 3 { 1.0 - s.weekly } else { 1.0 };
    (1.0 + s.daily * daily) * weekend
}

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random_range(0.0..1.0);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Start of the first complete UTC day whose daily indicator (the statistic the
/// forecast uses, combined over series as it does) is beyond the threshold.
fn breach_day(
    samples: &[omen_sources::Sample],
    indicator: SloIndicator,
    threshold: f64,
    direction: Direction,
) -> Option<i64> {
    let def = IndicatorDefinition::of(indicator);
    // The trace carries used and total GPU memory; the agent derives the headroom series.
    let headroom = def.signal == catalogue::GPU_MEMORY_HEADROOM_RATIO.name;
    // day -> series -> values
    let mut days: BTreeMap<i64, BTreeMap<String, Vec<f64>>> = BTreeMap::new();
    let mut used: BTreeMap<(i64, String), f64> = BTreeMap::new();
    for s in samples {
        let day = s.ts_ms.div_euclid(DAY_MS) * DAY_MS;
        let key = format!("{:?}", s.labels);
        let value = match s.signal.as_str() {
            signal if signal == def.signal => s.value,
            signal if headroom && signal == catalogue::GPU_MEMORY_USED_BYTES.name => {
                used.insert((s.ts_ms, key), s.value);
                continue;
            }
            signal if headroom && signal == catalogue::GPU_MEMORY_TOTAL_BYTES.name => {
                match used.remove(&(s.ts_ms, key.clone())) {
                    Some(u) if s.value > 0.0 => (1.0 - u / s.value).clamp(0.0, 1.0),
                    _ => continue,
                }
            }
            _ => continue,
        };
        days.entry(day).or_default().entry(key).or_default().push(value);
    }
    let last_day = samples.last()?.ts_ms.div_euclid(DAY_MS) * DAY_MS;
    days.into_iter().filter(|(d, _)| *d < last_day).find_map(|(day, series)| {
        let stats: Vec<f64> = series
            .into_values()
            .map(|mut v| {
                v.sort_by(f64::total_cmp);
                def.statistic.of_sorted(&v)
            })
            .collect();
        let combined = def.combine.apply(&stats);
        let beyond = match direction {
            Direction::Above => combined > threshold,
            Direction::Below => combined < threshold,
        };
        beyond.then_some(day)
    })
}

/// Writes samples as a gzip JSONL trace.
pub fn write_trace(samples: &[omen_sources::Sample], path: &Path) -> Result<(), SimulateError> {
    let werr = |source| SimulateError::Write { path: path.to_owned(), source };
    let file = std::fs::File::create(path).map_err(werr)?;
    let gz = flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::fast());
    // A line is serialised in many small writes; the encoder takes them in whole blocks
    // (each write into it costs a call into deflate: unbuffered, 90% of a simulation).
    let mut out = std::io::BufWriter::with_capacity(1 << 16, gz);
    for s in samples {
        serde_json::to_writer(&mut out, s).map_err(|e| werr(e.into()))?;
        out.write_all(b"\n").map_err(werr)?;
    }
    let gz = out.into_inner().map_err(|e| werr(e.into_error()))?;
    gz.finish().and_then(|mut w| w.flush()).map_err(werr)?;
    Ok(())
}

/// Simulates `scenario` into `out`: trace.jsonl.gz and labels.json. Returns the labels.
pub fn simulate(scenario: &Scenario, out: &Path) -> Result<Labels, SimulateError> {
    std::fs::create_dir_all(out).map_err(|source| SimulateError::Write { path: out.to_owned(), source })?;
    let samples = scenario.generate();
    let labels = scenario.labels(&samples);
    write_trace(&samples, &out.join("trace.jsonl.gz"))?;
    let path = out.join("labels.json");
    let json = serde_json::to_vec_pretty(&labels).expect("labels serialise");
    std::fs::write(&path, json).map_err(|source| SimulateError::Write { path, source })?;
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(extra: &str) -> Scenario {
        Scenario::from_yaml(&format!("name: t\nseed: 7\ndays: 14\nstep: 10m\n{extra}"), "(test)").unwrap()
    }

    fn series(samples: &[omen_sources::Sample], signal: &str) -> Vec<(i64, f64)> {
        samples
            .iter()
            .filter(|s| s.signal == signal && s.labels.get("layer").is_none_or(|l| l == "0"))
            .map(|s| (s.ts_ms, s.value))
            .collect()
    }

    #[test]
    fn same_seed_same_trace_other_seed_other_trace() {
        let a = scenario("").generate();
        let b = scenario("").generate();
        assert_eq!(a.len(), 14 * 144 * 9);
        assert!(a.iter().zip(&b).all(|(x, y)| x.value == y.value && x.ts_ms == y.ts_ms));
        let c = Scenario::from_yaml("name: t\nseed: 8\ndays: 14\nstep: 10m\n", "(test)").unwrap().generate();
        assert!(a.iter().zip(&c).any(|(x, y)| x.value != y.value));
    }

    #[test]
    fn load_has_daily_and_weekly_seasonality() {
        let s = scenario("noise: 0\n");
        let usage = series(&s.generate(), "kvcache_usage_ratio");
        let at = |day: i64, hour: i64| {
            usage.iter().find(|p| p.0 == s.start_ms() + day * DAY_MS + hour * 3_600_000).unwrap().1
        };
        // Monday: 14:00 peak, 02:00 trough; Saturday (day 5) is lower than Monday at the same hour.
        assert!(at(0, 14) > at(0, 2) + 0.2, "{} {}", at(0, 14), at(0, 2));
        assert!(at(5, 14) < at(0, 14) - 0.05);
        assert!((at(7, 14) - at(0, 14)).abs() < 1e-9, "one week later is the same load");
    }

    #[test]
    fn fault_starts_at_its_onset_and_breach_is_found() {
        let s = scenario("fault: {kind: consistency_decay, onset_days: 5.5, magnitude: 0.6}\n");
        let samples = s.generate();
        let rci = series(&samples, "rci");
        let onset = s.start_ms() + 5 * DAY_MS + DAY_MS / 2;
        assert!(rci.iter().filter(|p| p.0 < onset).all(|p| p.1 < 0.2));
        assert!(rci.iter().filter(|p| p.0 >= onset).all(|p| p.1 > 0.5));
        let l = s.labels(&samples);
        assert_eq!(l.onset_ts_ms, Some(onset));
        assert!(l.abrupt);
        assert_eq!(l.slo.as_deref(), Some("rci"));
        // Day 5 mixes half a day of each level (mean 0.38 < 0.5): the first breached day is day 6.
        assert_eq!(l.breach_ts_ms, Some(s.start_ms() + 6 * DAY_MS));

        let leak = scenario("fault: {kind: vram_leak, onset_days: 1, magnitude: 1.5}\n");
        let l = leak.labels(&leak.generate());
        // headroom 0.225 - 1.5/80 per day crosses 0.05 after ~9.3 days of leak.
        let breach_day = (l.breach_ts_ms.unwrap() - leak.start_ms()) / DAY_MS;
        assert!((9..=11).contains(&breach_day), "{l:?}");
        assert!(!l.abrupt);
        let healthy = scenario("").labels(&scenario("").generate());
        assert_eq!((healthy.fault, healthy.breach_ts_ms, healthy.slo), (FaultKind::Healthy, None, None));
    }

    #[test]
    fn drift_shapes_steps_restarts_and_an_end() {
        let spec = |extra: &str| {
            scenario(&format!("fault: {{kind: vram_leak, onset_days: 2, magnitude: 0.5{extra}}}\n"))
                .fault
                .unwrap()
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let linear = spec("");
        assert_eq!((linear.drift(1.0), linear.drift(2.0)), (0.0, 0.0));
        assert!(close(linear.drift(9.0), 7.0));
        let acc = spec(", shape: accelerating");
        assert!(close(acc.drift(16.0), 14.0) && close(acc.drift(9.0), 49.0 / 14.0));
        let sat = spec(", shape: saturating, saturate_days: 4");
        assert!(close(sat.drift(6.0), 4.0 * (1.0 - (-1.0f64).exp())));
        assert!(sat.drift(200.0) <= 4.0 && sat.drift(200.0) > 3.999 && sat.drift(20.0) < sat.drift(30.0));
        let comp = spec(", shape: compounding");
        assert!(close(comp.drift(4.0), (1.5f64.powi(2) - 1.0) / 0.5));
        let steps = spec(", step_days: 3");
        assert_eq!((steps.drift(4.9), steps.drift(5.0), steps.drift(7.9)), (0.0, 3.0, 3.0));
        let restarts = spec(", restart_every_days: 7");
        assert!(close(restarts.drift(8.5), 6.5) && close(restarts.drift(9.5), 0.5));
        let once = spec(", duration_days: 3");
        assert!(
            close(once.drift(4.0), 2.0) && once.drift(5.0) == 0.0 && !once.active(5.0) && once.active(4.9)
        );
    }

    #[test]
    fn a_gap_removes_its_samples_and_leaves_the_rest_as_it_was() {
        let plain = scenario("").generate();
        let gapped = scenario("gaps: [{from_days: 3, days: 1.5}]\n").generate();
        let start = scenario("").start_ms();
        let in_gap = |t: i64| t >= start + 3 * DAY_MS && t < start + 3 * DAY_MS + DAY_MS * 3 / 2;
        let kept: Vec<_> = plain.iter().filter(|s| !in_gap(s.ts_ms)).collect();
        assert_eq!(kept.len(), gapped.len());
        assert!(kept.len() < plain.len());
        assert!(kept.iter().zip(&gapped).all(|(a, b)| a.ts_ms == b.ts_ms && a.value == b.value));
        let e = Scenario::from_yaml("name: x\ndays: 3\ngaps: [{from_days: 4, days: 1}]\n", "s").unwrap_err();
        assert!(e.to_string().contains("gaps[0]"), "{e}");
        let e = Scenario::from_yaml(
            "name: x\ndays: 3\nfault: {kind: vram_leak, onset_days: 1, magnitude: 1, step_days: 0}\n",
            "s",
        )
        .unwrap_err();
        assert!(e.to_string().contains("fault.step_days"), "{e}");
    }

    #[test]
    fn traps_rise_or_step_and_never_breach() {
        for fault in [
            "{kind: kv_fragmentation_creep, onset_days: 2, magnitude: 0.05, shape: saturating, saturate_days: 3}",
            "{kind: kvf_step, onset_days: 5, magnitude: 0.3}",
            "{kind: load_surge, onset_days: 5, magnitude: 0.1, duration_days: 4}",
        ] {
            let s = scenario(&format!("fault: {fault}\n"));
            let samples = s.generate();
            let l = s.labels(&samples);
            assert!(l.onset_ts_ms.is_some() && l.slo.is_some() && l.breach_ts_ms.is_none(), "{fault}: {l:?}");
        }
        // The step is there: KVF after the onset is 0.3 higher.
        let s = scenario("noise: 0\nfault: {kind: kvf_step, onset_days: 5, magnitude: 0.3}\n");
        let kvf = series(&s.generate(), "kv_fragmentation");
        let at = |day: i64| kvf.iter().find(|p| p.0 == s.start_ms() + day * DAY_MS).unwrap().1;
        assert!((at(7) - at(0) - 0.3).abs() < 1e-9);
    }

    #[test]
    fn yaml_errors_name_the_field() {
        let e = Scenario::from_yaml("name: x\ndays: 3\nfault: {kind: vram_leak, onset: 1}\n", "s.yaml")
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("s.yaml") && msg.contains("fault.onset") && msg.contains("unknown field"),
            "{msg}"
        );
        let e = Scenario::from_yaml("name: x\ndays: 3\nseasonality: {dayly: 0.1}\n", "s.yaml").unwrap_err();
        assert!(e.to_string().contains("seasonality.dayly"), "{e}");
        let e = Scenario::from_yaml("name: x\ndays: 3\nfault: {kind: meltdown}\n", "s.yaml").unwrap_err();
        assert!(e.to_string().contains("fault.kind"), "{e}");
        let e = Scenario::from_yaml(
            "name: x\ndays: 3\nfault: {kind: vram_leak, onset_days: 5, magnitude: 1}\n",
            "s",
        )
        .unwrap_err();
        assert!(e.to_string().contains("fault.onset_days"), "{e}");
        let e = Scenario::from_yaml("name: x\ndays: 3\nstep: 0s\n", "s").unwrap_err();
        assert!(e.to_string().contains("step"), "{e}");
    }

    #[test]
    fn written_trace_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let s = Scenario::from_yaml("name: t\ndays: 1\nstep: 1h\n", "(test)").unwrap();
        let labels = simulate(&s, dir.path()).unwrap();
        let back: Vec<_> = omen_sources::trace_file::batches(&dir.path().join("trace.jsonl.gz"))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        assert_eq!(back.len(), 24);
        assert_eq!(back.iter().map(Vec::len).sum::<usize>(), labels.samples);
        let json: Labels =
            serde_json::from_slice(&std::fs::read(dir.path().join("labels.json")).unwrap()).unwrap();
        assert_eq!(json, labels);
    }
}

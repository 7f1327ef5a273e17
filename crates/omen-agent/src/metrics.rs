//! Live metric state shared by the pipeline and the exporters: latest gauge
//! values, canary latency histograms and the agent's own counters. /metrics
//! renders it with prometheus-client (OpenMetrics); OTLP reads `snapshot()`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use omen_signals::catalogue;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Sorted label pairs of one series.
pub type Labels = Vec<(String, String)>;

/// Tap name of a canary's prompt tokens (OTLP only; the server's usage count).
pub const INPUT_TOKENS_TAP: &str = "canary_input_tokens";

/// The label a failed probe's tapped observation carries its OpenTelemetry `error.type` in.
pub const ERROR_TYPE_LABEL: &str = "error.type";

/// Most distinct gauge series kept; beyond it new series are dropped and counted.
pub const MAX_GAUGE_SERIES: usize = 20_000;

/// Latency buckets (seconds) for the canary TTFT / TPOT / e2e histograms.
const LATENCY_BUCKETS: [f64; 16] =
    [0.005, 0.01, 0.02, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0];

/// Help text of an exported gauge: the catalogue's, or a generic one for signals that users
/// push under names of their own.
pub fn help_for(name: &str) -> &'static str {
    catalogue::find(name).map_or("Latest value of a pushed or collected signal", |s| s.help)
}

/// One gauge value for exporters.
#[derive(Debug, Clone, PartialEq)]
pub struct GaugePoint {
    /// Name without the `omen_` prefix.
    pub name: String,
    /// Labels.
    pub labels: Labels,
    /// Value.
    pub value: f64,
}

/// One canary latency observation, kept for exporters that need raw values (OTLP histograms).
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyObservation {
    /// `ttft_seconds`, `tpot_seconds`, `e2e_seconds`, or `canary_tokens` (output tokens).
    pub name: &'static str,
    /// Labels (canary).
    pub labels: Labels,
    /// Seconds (tokens for `canary_tokens`).
    pub seconds: f64,
}

/// The value cell of one gauge series, shared by the map and any [`GaugeHandle`].
#[derive(Debug)]
struct GaugeCell(AtomicU64);

impl GaugeCell {
    fn new(value: f64) -> Arc<Self> {
        Arc::new(Self(AtomicU64::new(value.to_bits())))
    }

    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }
}

/// A handle on one gauge series: setting it takes no lock and copies no labels (the
/// pipeline keeps one per series). A handle of a series that was removed writes nowhere.
#[derive(Debug, Clone)]
pub struct GaugeHandle {
    cell: Arc<GaugeCell>,
    generation: Arc<AtomicU64>,
}

impl GaugeHandle {
    /// Sets the series' latest value.
    pub fn set(&self, value: f64) {
        self.cell.set(value);
        self.generation.fetch_add(1, Ordering::Relaxed);
    }
}

/// Most latency observations held for a slow exporter; older ones are dropped and counted.
const MAX_TAPPED_LATENCIES: usize = 50_000;

/// The agent's metric state.
#[derive(Debug)]
pub struct LiveMetrics {
    gauges: RwLock<BTreeMap<String, BTreeMap<Labels, Arc<GaugeCell>>>>,
    /// Bumped on every gauge change, so that readers can tell whether a cached view is current.
    generation: Arc<AtomicU64>,
    latency_tap: std::sync::atomic::AtomicBool,
    tapped: std::sync::Mutex<Vec<LatencyObservation>>,
    /// The model that last answered each canary (one entry per configured canary).
    response_models: RwLock<BTreeMap<String, String>>,
    series: std::sync::atomic::AtomicUsize,
    /// Canary time to first token, seconds.
    pub ttft: Family<Labels, Histogram>,
    /// Canary time per output token, seconds.
    pub tpot: Family<Labels, Histogram>,
    /// Canary end-to-end latency, seconds.
    pub e2e: Family<Labels, Histogram>,
    /// Samples accepted by the pipeline.
    pub samples_ingested: Counter,
    /// Samples or requests shed, by reason.
    pub shed: Family<Vec<(String, String)>, Counter>,
    /// Rejected pushes, by endpoint.
    pub rejected: Family<Vec<(String, String)>, Counter>,
    /// Batches refused because they would create series past a limit, by limit.
    pub series_rejected: Family<Vec<(String, String)>, Counter>,
    /// Series dropped after `limits.series_idle_timeout` without a sample.
    pub series_evicted: Counter,
    /// Lasting level shifts found, by signal.
    pub level_shifts: Family<Vec<(String, String)>, Counter>,
    /// Input series (pushed and scraped) the engine holds; `limits.max_series` caps them.
    pub series_held: Gauge,
    /// Wall time of each engine tick (health, forecasts, roll-ups, retention), seconds.
    pub tick_seconds: Histogram,
    /// LSTM-AE trainings the agent ran, by outcome (accepted, refused, failed).
    pub model_trainings: Family<Vec<(String, String)>, Counter>,
    /// 1 for the LSTM-AE in use, labelled by origin (file or trained); absent without one.
    pub model_active: Family<Vec<(String, String)>, Gauge>,
    /// Age of the LSTM-AE in use: event time since the end of its training data, seconds.
    pub model_age_seconds: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>,
    /// Share of the held-back validation windows on which the trained LSTM-AE in use alarms.
    pub model_holdout_alarm_ratio: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>,
    /// Most gauge series held (see [`LiveMetrics::set_series_limit`]).
    series_limit: std::sync::atomic::AtomicUsize,
}

/// Bucket bounds of the tick time, seconds: 0.5 ms to 8 s by doubling (a tick of a large
/// node with weeks of history is tens of milliseconds; seconds mean something is wrong).
const TICK_BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

impl Default for LiveMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl LiveMetrics {
    /// Empty state with `build_info` set.
    pub fn new() -> Self {
        let m = Self {
            gauges: RwLock::new(BTreeMap::new()),
            generation: Arc::new(AtomicU64::new(0)),
            series: 0.into(),
            latency_tap: false.into(),
            tapped: std::sync::Mutex::new(Vec::new()),
            response_models: RwLock::default(),
            ttft: Family::new_with_constructor(latency_histogram),
            tpot: Family::new_with_constructor(latency_histogram),
            e2e: Family::new_with_constructor(latency_histogram),
            samples_ingested: Counter::default(),
            shed: Family::default(),
            rejected: Family::default(),
            series_rejected: Family::default(),
            series_evicted: Counter::default(),
            level_shifts: Family::default(),
            series_held: Gauge::default(),
            tick_seconds: Histogram::new(TICK_BUCKETS),
            model_trainings: Family::default(),
            model_active: Family::default(),
            model_age_seconds: Family::default(),
            model_holdout_alarm_ratio: Family::default(),
            series_limit: MAX_GAUGE_SERIES.into(),
        };
        m.set_gauge(
            catalogue::BUILD_INFO.name,
            vec![("version".into(), env!("CARGO_PKG_VERSION").into())],
            1.0,
        );
        m
    }

    /// Sets the latest value of a gauge series.
    pub fn set_gauge(&self, name: &str, labels: Labels, value: f64) {
        {
            let g = self.gauges.read().unwrap_or_else(|e| e.into_inner());
            if let Some(cell) = g.get(name).and_then(|f| f.get(&labels)) {
                cell.set(value);
                self.generation.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let _ = self.insert_gauge(name, labels, value);
    }

    /// A handle on a gauge series, created with `value` if it is new; None (and counted
    /// as shed) when the series limit is reached.
    pub fn gauge_handle(&self, name: &str, labels: Labels, value: f64) -> Option<GaugeHandle> {
        let cell = self.insert_gauge(name, labels, value)?;
        Some(GaugeHandle { cell, generation: self.generation.clone() })
    }

    /// Sets (or creates, within the series limit) a series and returns its cell.
    fn insert_gauge(&self, name: &str, labels: Labels, value: f64) -> Option<Arc<GaugeCell>> {
        let mut g = self.gauges.write().unwrap_or_else(|e| e.into_inner());
        self.generation.fetch_add(1, Ordering::Relaxed);
        // Look up by &str first: the name is copied only for a new family.
        if let Some(cell) = g.get(name).and_then(|f| f.get(&labels)) {
            cell.set(value);
            return Some(cell.clone());
        }
        if self.series.load(Ordering::Relaxed) >= self.series_limit.load(Ordering::Relaxed) {
            self.shed.get_or_create(&vec![("reason".into(), "series_limit".into())]).inc();
            return None;
        }
        let family = match g.get_mut(name) {
            Some(f) => f,
            None => g.entry(name.to_owned()).or_default(),
        };
        let cell = GaugeCell::new(value);
        family.insert(labels, cell.clone());
        self.series.fetch_add(1, Ordering::Relaxed);
        Some(cell)
    }

    /// Sets the most gauge series held (default [`MAX_GAUGE_SERIES`]); the agent sizes it
    /// from `limits` so that every admitted series and its anomaly score fit.
    pub fn set_series_limit(&self, limit: usize) {
        self.series_limit.store(limit, Ordering::Relaxed);
    }

    /// A counter that changes whenever any gauge does (set, created or removed).
    pub fn gauge_generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Removes a gauge series (e.g. a forecast that no longer predicts a breach).
    pub fn remove_gauge(&self, name: &str, labels: &Labels) {
        let mut g = self.gauges.write().unwrap_or_else(|e| e.into_inner());
        if let Some(family) = g.get_mut(name) {
            if family.remove(labels).is_some() {
                self.series.fetch_sub(1, Ordering::Relaxed);
                self.generation.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Latest value of one gauge series.
    pub fn gauge(&self, name: &str, labels: &Labels) -> Option<f64> {
        self.gauges
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .and_then(|f| f.get(labels))
            .map(|c| c.get())
    }

    /// Every series of one gauge.
    pub fn gauge_family(&self, name: &str) -> Vec<(Labels, f64)> {
        self.gauges
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .map(|f| f.iter().map(|(l, v)| (l.clone(), v.get())).collect())
            .unwrap_or_default()
    }

    /// Records a canary latency in its histogram (and in the tap, when an exporter enabled it).
    pub fn record_latency(&self, name: &'static str, labels: Labels, seconds: f64) {
        let family = match name {
            n if n == catalogue::TTFT_SECONDS.name => &self.ttft,
            n if n == catalogue::TPOT_SECONDS.name => &self.tpot,
            _ => &self.e2e,
        };
        family.get_or_create(&labels).observe(seconds);
        self.tap(name, labels, seconds);
    }

    /// Keeps a canary's output token count for the exporters (OTLP token histogram and counter);
    /// /metrics has it as the gauge `omen_canary_tokens`.
    pub fn record_output_tokens(&self, labels: Labels, tokens: f64) {
        self.tap(catalogue::CANARY_TOKENS.name, labels, tokens);
    }

    /// After a successful probe: the model the server says answered (kept per canary for the
    /// OTLP `gen_ai.response.model`) and the prompt's tokens, when the server counted them.
    pub fn note_probe(&self, canary: &str, response_model: Option<&str>, input_tokens: Option<u64>) {
        if let Some(model) = response_model {
            let mut models = self.response_models.write().unwrap_or_else(|e| e.into_inner());
            if models.get(canary).map(String::as_str) != Some(model) {
                models.insert(canary.to_owned(), model.to_owned());
            }
        }
        if let Some(n) = input_tokens {
            self.tap(INPUT_TOKENS_TAP, vec![("canary".to_owned(), canary.to_owned())], n as f64);
        }
    }

    /// The model that last answered canary `canary`, if the server named it.
    pub fn response_model(&self, canary: &str) -> Option<String> {
        self.response_models.read().unwrap_or_else(|e| e.into_inner()).get(canary).cloned()
    }

    /// Keeps a failed canary probe's duration for the exporters (the OTLP duration histogram
    /// with `error.type`); /metrics' latency histograms hold successful probes only.
    pub fn record_failed_probe(&self, mut labels: Labels, error_type: String, seconds: f64) {
        labels.push((ERROR_TYPE_LABEL.to_owned(), error_type));
        self.tap(catalogue::E2E_SECONDS.name, labels, seconds);
    }

    fn tap(&self, name: &'static str, labels: Labels, seconds: f64) {
        if self.latency_tap.load(std::sync::atomic::Ordering::Relaxed) {
            let mut t = self.tapped.lock().unwrap_or_else(|e| e.into_inner());
            if t.len() >= MAX_TAPPED_LATENCIES {
                self.shed.get_or_create(&vec![("reason".into(), "latency_tap_full".into())]).inc();
            } else {
                t.push(LatencyObservation { name, labels, seconds });
            }
        }
    }

    /// Starts keeping latency observations for [`LiveMetrics::drain_latencies`].
    pub fn enable_latency_tap(&self) {
        self.latency_tap.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Takes the latency observations recorded since the last call.
    pub fn drain_latencies(&self) -> Vec<LatencyObservation> {
        std::mem::take(&mut *self.tapped.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// All gauge values (for OTLP and /scores/latest).
    pub fn snapshot(&self) -> Vec<GaugePoint> {
        let g = self.gauges.read().unwrap_or_else(|e| e.into_inner());
        g.iter()
            .flat_map(|(name, family)| {
                family.iter().map(move |(labels, value)| GaugePoint {
                    name: name.clone(),
                    labels: labels.clone(),
                    value: value.get(),
                })
            })
            .collect()
    }
}

/// Renders the gauges at scrape time.
#[derive(Debug)]
struct GaugeCollector(std::sync::Arc<LiveMetrics>);

impl Collector for GaugeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauges = self.0.gauges.read().unwrap_or_else(|e| e.into_inner());
        for (name, family) in gauges.iter() {
            if family.is_empty() {
                continue;
            }
            let mut family_encoder =
                encoder.encode_descriptor(name, help_for(name), None, MetricType::Gauge)?;
            for (labels, value) in family {
                let metric_encoder = family_encoder.encode_family(labels)?;
                ConstGauge::new(value.get()).encode(metric_encoder)?;
            }
        }
        Ok(())
    }
}

/// A prometheus-client registry (prefix `omen`) over the live state.
pub fn registry(live: std::sync::Arc<LiveMetrics>) -> Registry {
    let mut registry = Registry::with_prefix("omen");
    for (signal, family) in [
        (catalogue::TTFT_SECONDS, &live.ttft),
        (catalogue::TPOT_SECONDS, &live.tpot),
        (catalogue::E2E_SECONDS, &live.e2e),
    ] {
        registry.register(signal.name, signal.help, family.clone());
    }
    registry.register("samples_ingested", "Samples accepted by the pipeline", live.samples_ingested.clone());
    registry.register("shed", "Samples or requests shed under load, by reason", live.shed.clone());
    registry.register("ingest_rejected", "Pushes rejected with a 4xx, by endpoint", live.rejected.clone());
    registry.register(
        "series_rejected",
        "Batches refused because they would create series past a limit of the config's limits section, by limit",
        live.series_rejected.clone(),
    );
    registry.register(
        "model_trainings",
        "LSTM-AE trainings the agent ran from its store, by outcome (accepted, refused by validation, failed)",
        live.model_trainings.clone(),
    );
    registry.register(
        "model_active",
        "1 for the LSTM-AE in use, by origin (file: model.path; trained: trained by the agent)",
        live.model_active.clone(),
    );
    registry.register_with_unit(
        "model_age",
        "Age of the LSTM-AE in use: time since the end of its training data",
        prometheus_client::registry::Unit::Seconds,
        live.model_age_seconds.clone(),
    );
    registry.register(
        "model_holdout_alarm_ratio",
        "Share of held-back validation windows on which the trained LSTM-AE in use alarms",
        live.model_holdout_alarm_ratio.clone(),
    );
    registry.register(
        "series_evicted",
        "Series dropped from memory and /metrics after limits.series_idle_timeout without a sample",
        live.series_evicted.clone(),
    );
    registry.register(
        "level_shifts",
        "Lasting level shifts: changes of a series that held for signals.latch, by signal",
        live.level_shifts.clone(),
    );
    registry.register(
        "series",
        "Input series (pushed and scraped) the agent holds in memory; limits.max_series caps them",
        live.series_held.clone(),
    );
    registry.register_with_unit(
        "tick_duration",
        "Time the engine spent on one tick: health, forecasts, day roll-ups, retention",
        prometheus_client::registry::Unit::Seconds,
        live.tick_seconds.clone(),
    );
    registry.register_collector(Box::new(GaugeCollector(live)));
    registry
}

/// OpenMetrics text of the registry.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("writing to a String cannot fail");
    out
}

/// Content type of [`render`]'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Content type of [`render_text_004`]'s output.
pub const TEXT_004_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The exposition format a scraper asked for in its `Accept` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// The Prometheus text format 0.0.4.
    Text004,
}

/// Picks the format by the `Accept` header's quality values: OpenMetrics only when the client
/// names `application/openmetrics-text` and prefers it at least as much as `text/plain` (or
/// anything else it accepts); the 0.0.4 text format otherwise, including when there is no header,
/// since every Prometheus-compatible scraper reads it.
pub fn negotiate(accept: Option<&str>) -> Exposition {
    let Some(accept) = accept else { return Exposition::Text004 };
    let mut openmetrics = 0.0_f64;
    let mut other = 0.0_f64;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")))
            .find_map(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(1.0)
            .clamp(0.0, 1.0);
        if media == "application/openmetrics-text" {
            openmetrics = openmetrics.max(q);
        } else if !media.is_empty() {
            other = other.max(q);
        }
    }
    if openmetrics > 0.0 && openmetrics >= other {
        Exposition::OpenMetrics
    } else {
        Exposition::Text004
    }
}

/// The registry in the Prometheus text format 0.0.4. prometheus-client writes only
/// OpenMetrics, so its output is rewritten line by line: a counter family takes its samples'
/// `_total` name, an info family its `_info` name and the gauge type, `unknown` becomes
/// `untyped`; `# UNIT`, exemplars and `# EOF` have no 0.0.4 form and are dropped.
pub fn render_text_004(registry: &Registry) -> String {
    openmetrics_to_text_004(&render(registry))
}

fn openmetrics_to_text_004(openmetrics: &str) -> String {
    // OpenMetrics puts HELP before TYPE, so the families' types are read first.
    let types: std::collections::HashMap<&str, &str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' ')).collect();
    let name_004 = |family: &str| -> (String, &'static str) {
        match types.get(family).copied().unwrap_or("unknown") {
            "counter" => (format!("{family}_total"), "counter"),
            "info" => (format!("{family}_info"), "gauge"),
            "gauge" | "stateset" => (family.to_owned(), "gauge"),
            "histogram" | "gaugehistogram" => (family.to_owned(), "histogram"),
            "summary" => (family.to_owned(), "summary"),
            _ => (family.to_owned(), "untyped"),
        }
    };
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(family) = line.strip_prefix("# TYPE ").and_then(|rest| rest.split(' ').next()) {
            let (name, kind) = name_004(family);
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (family, help) = rest.split_once(' ').unwrap_or((rest, ""));
            // 0.0.4 escapes only backslash and newline in HELP.
            out.push_str(&format!("# HELP {} {}\n", name_004(family).0, help.replace("\\\"", "\"")));
            continue;
        }
        // A sample: an exemplar (` # {...} value`) has no 0.0.4 form; prometheus-client writes
        // no timestamps, so the rest is already valid 0.0.4.
        let sample = line.find(" # {").map_or(line, |at| &line[..at]);
        out.push_str(sample);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn negotiation_follows_the_accept_header() {
        use Exposition::*;
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiate(Some(prometheus)), OpenMetrics);
        assert_eq!(negotiate(Some("application/openmetrics-text; version=1.0.0")), OpenMetrics);
        assert_eq!(negotiate(None), Text004);
        assert_eq!(negotiate(Some("*/*")), Text004);
        assert_eq!(negotiate(Some("text/plain;version=0.0.4")), Text004);
        assert_eq!(negotiate(Some("text/plain;q=1,application/openmetrics-text;q=0.5")), Text004);
        assert_eq!(negotiate(Some("application/openmetrics-text;q=0")), Text004);
        assert_eq!(negotiate(Some("garbage;;q=x,,")), Text004);
    }

    #[test]
    fn the_004_text_names_counter_and_info_families_by_their_samples() {
        let live = Arc::new(LiveMetrics::new());
        live.set_gauge("kv_fragmentation", vec![("layer".into(), "3".into())], 1.9);
        live.ttft.get_or_create(&vec![("canary".into(), "c1".into())]).observe(0.04);
        live.samples_ingested.inc_by(5);
        let text = render_text_004(&registry(live));
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
        assert!(text.contains("# HELP omen_samples_ingested_total "), "{text}");
        assert!(
            text.contains("# TYPE omen_samples_ingested_total counter\nomen_samples_ingested_total 5\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE omen_build_info gauge\nomen_build_info{"), "{text}");
        assert!(text.contains("# TYPE omen_kv_fragmentation gauge\n"), "{text}");
        assert!(text.contains("# TYPE omen_ttft_seconds histogram\n"), "{text}");
        // Every sample line belongs to the family declared above it (what 0.0.4 parsers require).
        let mut family = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap().to_owned();
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                let base =
                    ["_bucket", "_sum", "_count"].iter().fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
                assert!(name == family || base == family, "{name} under {family}:\n{text}");
            }
        }
    }

    #[test]
    fn the_004_text_drops_exemplars_and_unescapes_quotes_in_help() {
        let om = r#"# HELP a_seconds Time of \"a\".
# TYPE a_seconds histogram
# UNIT a_seconds seconds
a_seconds_bucket{le="1"} 2 # {trace_id="x"} 0.5
# TYPE b unknown
b 1
# EOF
"#;
        let text_004 = r#"# HELP a_seconds Time of "a".
# TYPE a_seconds histogram
a_seconds_bucket{le="1"} 2
# TYPE b untyped
b 1
"#;
        assert_eq!(openmetrics_to_text_004(om), text_004);
    }

    #[test]
    fn renders_gauges_histograms_and_counters() {
        let live = Arc::new(LiveMetrics::new());
        live.set_gauge("kv_fragmentation", vec![("layer".into(), "3".into())], 1.9);
        live.set_gauge("health_score", vec![], 0.25);
        live.ttft.get_or_create(&vec![("canary".into(), "c1".into())]).observe(0.04);
        live.samples_ingested.inc_by(5);
        let text = render(&registry(live.clone()));
        assert!(text.contains("# TYPE omen_kv_fragmentation gauge"), "{text}");
        assert!(text.contains("omen_kv_fragmentation{layer=\"3\"} 1.9"), "{text}");
        assert!(text.contains("omen_health_score 0.25"), "{text}");
        assert!(
            text.contains("omen_ttft_seconds_bucket{le=\"0.05\",canary=\"c1\"} 1")
                || text.contains("omen_ttft_seconds_bucket{canary=\"c1\",le=\"0.05\"} 1"),
            "{text}"
        );
        assert!(text.contains("omen_samples_ingested_total 5"), "{text}");
        assert!(text.contains("omen_build_info{version="), "{text}");
        assert!(text.ends_with("# EOF\n"));
        live.remove_gauge("kv_fragmentation", &vec![("layer".into(), "3".into())]);
        assert!(!render(&registry(live)).contains("omen_kv_fragmentation{"));
    }
}

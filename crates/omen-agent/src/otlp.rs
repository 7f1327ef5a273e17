//! OTLP/gRPC metrics export: the instruments of `/metrics`, pushed to an
//! OpenTelemetry collector every `otlp.interval`.
//!
//! Gauges are observable instruments whose callbacks read [`LiveMetrics`] at
//! collection time (one instrument per gauge name, attributes = the labels).
//! Canary latencies are taken from [`LiveMetrics::drain_latencies`] at the start
//! of every collection and recorded in explicit-bucket histograms, so each
//! export carries every observation made before it (cumulative temporality).
//! Names follow the OpenTelemetry semantic conventions where one exists: the GenAI client
//! conventions (open-telemetry/semantic-conventions-genai, development status, the version
//! linked to semconv 1.44: `gen_ai.client.inference.*`, which replaced
//! `gen_ai.client.operation.*` and `gen_ai.client.token.usage`) for the canary requests, which
//! omen makes as a client, and the hardware conventions for GPU memory:
//!
//! | `/metrics` (Prometheus)          | OTLP instrument                                  | kind          | unit      |
//! |----------------------------------|--------------------------------------------------|---------------|-----------|
//! | `omen_e2e_seconds`               | `gen_ai.client.inference.duration`               | histogram     | `s`       |
//! | `omen_ttft_seconds`              | `gen_ai.client.inference.time_to_first_chunk`    | histogram     | `s`       |
//! | `omen_tpot_seconds`              | `gen_ai.client.inference.time_per_output_chunk`  | histogram     | `s`       |
//! | `omen_canary_tokens`             | `gen_ai.client.inference.operation.output_tokens`| histogram     | `{token}` |
//! | `omen_canary_tokens`             | `gen_ai.client.inference.usage.output_tokens`    | counter       | `{token}` |
//! | (OTLP only: usage.prompt_tokens) | `gen_ai.client.inference.operation.input_tokens` | histogram     | `{token}` |
//! | (OTLP only: usage.prompt_tokens) | `gen_ai.client.inference.usage.input_tokens`     | counter       | `{token}` |
//! | `omen_gpu_memory_used_bytes`     | `hw.gpu.memory.usage` (`hw.id` = UUID)           | updowncounter | `By`      |
//! | `omen_gpu_memory_total_bytes`    | `hw.gpu.memory.limit` (`hw.id` = UUID)           | updowncounter | `By`      |
//! | `omen_kvcache_usage_ratio{layer}`| `omen.kvcache_usage_ratio`                       | gauge         | `1`       |
//! | `omen_kv_fragmentation{layer}`          | `omen.kv_fragmentation`                                 | gauge         | `1`       |
//! | `omen_tle_bits{canary}`          | `omen.tle_bits`                                  | gauge         | `bit`     |
//! | `omen_forecast_time_to_breach_seconds` | `omen.forecast_time_to_breach`             | gauge         | `s`       |
//! | any other gauge `omen_<name>`    | `omen.<name>`                                    | gauge         |           |
//! | (OTLP only)                      | `omen.otlp.export_failures`                      | counter       |           |
//!
//! The canary instruments carry `gen_ai.operation.name` (`chat`, or `text_completion` for a
//! canary with `chat: false`), `gen_ai.provider.name` (`otlp.gen_ai_provider_name`),
//! `gen_ai.request.model`, `server.address`, `server.port` (from the canary target) and
//! `omen.canary` (the canary id), and `gen_ai.response.model` once the server has named the
//! model that answered. The token counters also have `gen_ai.token.modality` = `text`.
//! Time per output chunk is recorded once per probe as its mean gap between tokens (omen
//! keeps no per-chunk gaps). A failed probe records its duration in
//! `gen_ai.client.inference.duration` with `error.type` (the HTTP status code, `timeout`,
//! `transport`, ...: `CanaryError::error_type`), and nothing else.
//!
//! So `rci`, `rci_bleu`, `rci_bertscore_f1`, `rci_repetition_ratio`,
//! `anomaly_score`, `lstm_ae_score`, `health_score`, `source_up`, `build_info`
//! and pushed signals become `omen.rci`, ..., `omen.build_info`. A name's
//! characters outside `[A-Za-z0-9_./-]` become `_` (OTel instrument-name rules).
//! Gauge names first set after [`start`] get their instrument within
//! `min(interval, 5 s)`. The resource carries `service.name=omen` and
//! `service.version`; `OTEL_RESOURCE_ATTRIBUTES` adds to it.
//!
//! Export failures (collector down, wrong endpoint) never stop the agent: each
//! is counted ([`OtlpExporter::stats`], `omen.otlp.export_failures`), the first
//! of a run is logged at warn level and the recovery at info level.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::{
    AsyncInstrument, Counter, Histogram, Meter, MeterProvider as _, ObservableGauge, ObservableUpDownCounter,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{MetricExporter, WithExportConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Stream, Temporality};
use opentelemetry_sdk::Resource;

use omen_signals::catalogue;

use crate::config::OtlpConfig;
use crate::metrics::{help_for, Labels, LiveMetrics, MAX_GAUGE_SERIES};

/// OTLP name of the canary time-to-first-token histogram.
pub const TTFT_NAME: &str = catalogue::TTFT_SECONDS.otlp_name;
/// OTLP name of the canary time-per-output-token histogram.
pub const TPOT_NAME: &str = catalogue::TPOT_SECONDS.otlp_name;
/// OTLP name of the canary end-to-end latency histogram.
pub const E2E_NAME: &str = catalogue::E2E_SECONDS.otlp_name;
/// OTLP name of the exporter's own failure counter.
pub const EXPORT_FAILURES_NAME: &str = "omen.otlp.export_failures";
/// OTLP name of the canary output-token histogram (GenAI client conventions).
pub const OUTPUT_TOKENS_NAME: &str = "gen_ai.client.inference.operation.output_tokens";
/// OTLP name of the canary output-token counter (GenAI client conventions).
pub const OUTPUT_TOKEN_USAGE_NAME: &str = "gen_ai.client.inference.usage.output_tokens";

/// OTLP name of the canary prompt-token histogram (GenAI client conventions).
pub const INPUT_TOKENS_NAME: &str = "gen_ai.client.inference.operation.input_tokens";
/// OTLP name of the canary prompt-token counter (GenAI client conventions).
pub const INPUT_TOKEN_USAGE_NAME: &str = "gen_ai.client.inference.usage.input_tokens";

/// Bucket boundaries the GenAI conventions advise for the duration, time to first chunk and
/// time per output chunk histograms (`model/gen-ai/metrics.yaml`).
pub const DURATION_BUCKETS: [f64; 14] =
    [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];
/// Bucket boundaries the GenAI conventions advise for token-count histograms.
pub const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// The GenAI client attributes of the canary requests: what omen asks, of whom, and how.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenAiClient {
    /// `gen_ai.provider.name`.
    pub provider_name: String,
    /// `gen_ai.request.model`.
    pub request_model: Option<String>,
    /// `server.address` and `server.port` of the target.
    pub server: Option<(String, u16)>,
    /// `gen_ai.operation.name` by canary id.
    pub operations: HashMap<String, &'static str>,
}

impl GenAiClient {
    /// The attributes for the canary source `canary` (none configured: only the provider name).
    pub fn new(provider_name: &str, canary: Option<&omen_sources::CanarySourceConfig>) -> Self {
        let mut client = Self { provider_name: provider_name.to_owned(), ..Self::default() };
        if let Some(c) = canary {
            client.request_model = Some(c.target.model.clone());
            client.server = reqwest::Url::parse(&c.target.base_url)
                .ok()
                .and_then(|u| Some((u.host_str()?.to_owned(), u.port_or_known_default()?)));
            for p in &c.prompts {
                client.operations.insert(p.id.clone(), if p.chat { "chat" } else { "text_completion" });
            }
        }
        client
    }

    /// The attributes of one observation of canary `labels` (its `canary` label becomes
    /// `omen.canary`), answered by `response_model` when the server named it.
    fn attributes(&self, labels: &Labels, response_model: Option<String>) -> Vec<KeyValue> {
        let operation = canary_of(labels).and_then(|c| self.operations.get(c).copied()).unwrap_or("chat");
        let mut out = vec![
            KeyValue::new("gen_ai.operation.name", operation),
            KeyValue::new("gen_ai.provider.name", self.provider_name.clone()),
        ];
        if let Some(model) = &self.request_model {
            out.push(KeyValue::new("gen_ai.request.model", model.clone()));
        }
        if let Some(model) = response_model {
            out.push(KeyValue::new("gen_ai.response.model", model));
        }
        if let Some((address, port)) = &self.server {
            out.push(KeyValue::new("server.address", address.clone()));
            out.push(KeyValue::new("server.port", i64::from(*port)));
        }
        for (k, v) in labels {
            let key = match k.as_str() {
                "canary" => "omen.canary".to_owned(),
                crate::metrics::ERROR_TYPE_LABEL => k.clone(),
                _ => format!("omen.{k}"),
            };
            out.push(KeyValue::new(key, v.clone()));
        }
        out
    }
}

/// Longest instrument name OpenTelemetry accepts.
const MAX_NAME_LEN: usize = 255;
/// Upper bound of one export, retries included; below the SDK's 5 s shutdown wait
/// so the final flush can finish.
const MAX_EXPORT_TIMEOUT: Duration = Duration::from_secs(4);
/// Slowest rescan for gauge names set after start.
const MAX_DISCOVERY_PERIOD: Duration = Duration::from_secs(5);

/// Why the OTLP exporter could not start or stop cleanly.
#[derive(Debug)]
pub enum OtlpError {
    /// `otlp.endpoint` is not usable.
    Endpoint {
        /// The configured value.
        endpoint: String,
        /// What is wrong with it and how to fix it.
        problem: String,
    },
    /// `otlp.interval` is zero.
    ZeroInterval,
    /// The exporter's background thread could not start.
    Runtime(std::io::Error),
    /// The OTLP library rejected the exporter configuration.
    Build {
        /// The configured endpoint.
        endpoint: String,
        /// The library's reason.
        reason: String,
    },
    /// The final flush or the shutdown did not complete.
    Shutdown {
        /// The configured endpoint.
        endpoint: String,
        /// The library's reason.
        reason: String,
    },
}

impl std::fmt::Display for OtlpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Endpoint { endpoint, problem } => {
                write!(f, "otlp.endpoint {endpoint:?}: {problem}")
            }
            Self::ZeroInterval => write!(
                f,
                "otlp.interval is 0: the exporter needs a positive export period; set e.g. `interval: 30s`"
            ),
            Self::Runtime(e) => write!(
                f,
                "cannot start the OTLP exporter's I/O thread: {e}; check the process's thread limit \
                 (ulimit -u) or remove the `otlp` section to run without OTLP export"
            ),
            Self::Build { endpoint, reason } => write!(
                f,
                "cannot build the OTLP gRPC exporter for otlp.endpoint {endpoint:?}: {reason}; \
                 use a URL like http://127.0.0.1:4317"
            ),
            Self::Shutdown { endpoint, reason } => write!(
                f,
                "the final OTLP export to {endpoint} did not complete ({reason}); metrics since the last \
                 successful export were not delivered: check that the collector is running and reachable"
            ),
        }
    }
}

impl std::error::Error for OtlpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Runtime(e) => Some(e),
            _ => None,
        }
    }
}

/// Export counters of a running exporter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OtlpStats {
    /// Exports the collector accepted.
    pub exports: u64,
    /// Exports that failed (after the OTLP library's retries).
    pub failures: u64,
    /// Latency observations dropped because they were negative or not finite.
    pub dropped_latencies: u64,
}

#[derive(Debug, Default)]
struct Counters {
    exports: AtomicU64,
    failures: AtomicU64,
    dropped_latencies: AtomicU64,
    failing: AtomicBool,
}

/// A running OTLP exporter; [`OtlpExporter::shutdown`] flushes and stops it
/// (dropping it does the same, ignoring the result).
pub struct OtlpExporter {
    provider: Option<SdkMeterProvider>,
    io: Option<IoThread>,
    counters: Arc<Counters>,
    endpoint: String,
    _gauges: Arc<Mutex<GaugeSet>>,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExporter")
            .field("endpoint", &self.endpoint)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Starts exporting `live` to `cfg.endpoint` (OTLP/gRPC, plain-text HTTP/2)
/// every `cfg.interval`; callable from sync or async code.
pub fn start(
    cfg: &OtlpConfig,
    live: Arc<LiveMetrics>,
    client: GenAiClient,
) -> Result<OtlpExporter, OtlpError> {
    check_endpoint(&cfg.endpoint)?;
    if cfg.interval.is_zero() {
        return Err(OtlpError::ZeroInterval);
    }
    let io = IoThread::start()?;
    let timeout = cfg.interval.clamp(Duration::from_secs(1), MAX_EXPORT_TIMEOUT);
    let built = {
        // tonic's lazy channel spawns its worker on the runtime current at build time.
        let _entered = io.handle.enter();
        opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(cfg.endpoint.clone())
            .with_timeout(timeout)
            .with_temporality(Temporality::Cumulative)
            .build()
    };
    let inner = match built {
        Ok(inner) => inner,
        Err(e) => {
            io.stop();
            return Err(OtlpError::Build { endpoint: cfg.endpoint.clone(), reason: e.to_string() });
        }
    };
    let counters = Arc::new(Counters::default());
    let exporter = CountingExporter { inner, counters: counters.clone(), endpoint: cfg.endpoint.clone() };
    let reader = PeriodicReader::builder(exporter).with_interval(cfg.interval).build();
    let resource = Resource::builder()
        .with_service_name("omen")
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkMeterProvider::builder()
        .with_resource(resource)
        .with_reader(reader)
        .with_view(|_: &opentelemetry_sdk::metrics::Instrument| {
            // The SDK's default of 2000 series per instrument is below what /metrics allows.
            Stream::builder().with_cardinality_limit(MAX_GAUGE_SERIES).build().ok()
        })
        .build();
    let meter = provider.meter_with_scope(
        InstrumentationScope::builder("omen").with_version(env!("CARGO_PKG_VERSION")).build(),
    );

    live.enable_latency_tap();
    let latency = LatencyHistograms::new(&meter, client);
    {
        let live = live.clone();
        let counters = counters.clone();
        // Registered before any gauge, so the SDK runs it first in each collection.
        let _failures = meter
            .u64_observable_counter(EXPORT_FAILURES_NAME)
            .with_description("OTLP exports that failed after retries.")
            .with_callback(move |observer| {
                latency.record(&live, &counters);
                observer.observe(counters.failures.load(Ordering::Relaxed), &[]);
            })
            .build();
    }

    let gauges = Arc::new(Mutex::new(GaugeSet::new(meter, live)));
    lock(&gauges).discover();
    let period = cfg.interval.min(MAX_DISCOVERY_PERIOD);
    let discovery = gauges.clone();
    io.handle.spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            lock(&discovery).discover();
        }
    });
    tracing::info!(endpoint = %cfg.endpoint, interval = ?cfg.interval, "OTLP metrics export started");
    Ok(OtlpExporter {
        provider: Some(provider),
        io: Some(io),
        counters,
        endpoint: cfg.endpoint.clone(),
        _gauges: gauges,
    })
}

impl OtlpExporter {
    /// Export counters so far.
    pub fn stats(&self) -> OtlpStats {
        OtlpStats {
            exports: self.counters.exports.load(Ordering::Relaxed),
            failures: self.counters.failures.load(Ordering::Relaxed),
            dropped_latencies: self.counters.dropped_latencies.load(Ordering::Relaxed),
        }
    }

    /// Collects and exports once more, then stops; blocks for up to about 5 s
    /// (from async code, call it in `tokio::task::spawn_blocking`).
    pub fn shutdown(mut self) -> Result<(), OtlpError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), OtlpError> {
        let result = match self.provider.take() {
            Some(provider) => provider
                .shutdown()
                .map_err(|e| OtlpError::Shutdown { endpoint: self.endpoint.clone(), reason: e.to_string() }),
            None => Ok(()),
        };
        if let Some(io) = self.io.take() {
            io.stop();
        }
        if result.is_ok() {
            tracing::info!(endpoint = %self.endpoint, stats = ?self.stats(), "OTLP metrics export stopped");
        }
        result
    }
}

impl Drop for OtlpExporter {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!("{e}");
        }
    }
}

/// Rejects endpoints this build cannot reach, with the fix.
fn check_endpoint(endpoint: &str) -> Result<(), OtlpError> {
    let bad =
        |problem: &str| OtlpError::Endpoint { endpoint: endpoint.to_owned(), problem: problem.to_owned() };
    let lower = endpoint.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err(bad("this build exports OTLP without TLS; point it at a plain-text gRPC listener \
             (e.g. a collector sidecar on http://127.0.0.1:4317) and let the collector do TLS"));
    }
    let Some(rest) = lower.strip_prefix("http://") else {
        return Err(bad("expected an http:// URL of an OTLP gRPC receiver, e.g. http://127.0.0.1:4317"));
    };
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() || endpoint.chars().any(char::is_whitespace) {
        return Err(bad("expected host:port after http://, e.g. http://127.0.0.1:4317"));
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn attributes(labels: &Labels) -> Vec<KeyValue> {
    labels.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())).collect()
}

/// OTLP instrument name of a `/metrics` gauge, or `None` when it cannot be one.
pub fn otlp_gauge_name(name: &str) -> Option<String> {
    if let Some(signal) = catalogue::find(name) {
        return Some(signal.otlp_name.to_owned());
    }
    let mut out = String::with_capacity(name.len() + 5);
    out.push_str("omen.");
    out.extend(name.chars().map(|c| if c.is_ascii_alphanumeric() || "_./-".contains(c) { c } else { '_' }));
    (!name.is_empty() && out.len() <= MAX_NAME_LEN).then_some(out)
}

/// UCUM unit of a `/metrics` gauge: the catalogue's, else from its name's suffix.
fn unit_for(name: &str) -> Option<&'static str> {
    if let Some(signal) = catalogue::find(name) {
        return signal.unit();
    }
    if name.ends_with("_bytes") {
        Some("By")
    } else if name.ends_with("_seconds") {
        Some("s")
    } else if name.starts_with("tle_bits") {
        Some("bit")
    } else if name.ends_with("_ratio") {
        Some("1")
    } else {
        None
    }
}

/// The canary instruments of the GenAI client conventions.
struct LatencyHistograms {
    ttft: Histogram<f64>,
    tpot: Histogram<f64>,
    e2e: Histogram<f64>,
    output_tokens: TokenInstruments,
    input_tokens: TokenInstruments,
    client: GenAiClient,
}

/// One direction's tokens: the per-request histogram and the running usage counter.
struct TokenInstruments {
    per_request: Histogram<u64>,
    usage: Counter<u64>,
}

impl TokenInstruments {
    fn new(meter: &Meter, histogram: &'static str, counter: &'static str, what: &str) -> Self {
        Self {
            per_request: meter
                .u64_histogram(histogram)
                .with_description(format!("{what} tokens of a canary request."))
                .with_unit("{token}")
                .with_boundaries(TOKEN_BUCKETS.to_vec())
                .build(),
            usage: meter
                .u64_counter(counter)
                .with_description(format!("{what} tokens of the canary requests."))
                .with_unit("{token}")
                .build(),
        }
    }

    /// Records `tokens` (a whole count carried as f64) in both; the counter also takes
    /// `gen_ai.token.modality`, which the conventions require on it.
    fn record(&self, tokens: f64, mut attributes: Vec<KeyValue>) {
        let tokens = tokens.round() as u64;
        self.per_request.record(tokens, &attributes);
        attributes.push(KeyValue::new("gen_ai.token.modality", "text"));
        self.usage.add(tokens, &attributes);
    }
}

impl LatencyHistograms {
    fn new(meter: &Meter, client: GenAiClient) -> Self {
        let build = |name: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_description(description)
                .with_unit("s")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build()
        };
        Self {
            ttft: build(TTFT_NAME, "Time from a canary request to its first output chunk."),
            tpot: build(TPOT_NAME, "Mean time per output chunk after the first, per canary request."),
            e2e: build(E2E_NAME, "Duration of a canary inference request, end to end."),
            output_tokens: TokenInstruments::new(
                meter,
                OUTPUT_TOKENS_NAME,
                OUTPUT_TOKEN_USAGE_NAME,
                "Output",
            ),
            input_tokens: TokenInstruments::new(meter, INPUT_TOKENS_NAME, INPUT_TOKEN_USAGE_NAME, "Prompt"),
            client,
        }
    }

    /// Moves the observations tapped since the last collection into the instruments.
    fn record(&self, live: &LiveMetrics, counters: &Counters) {
        for obs in live.drain_latencies() {
            if !obs.seconds.is_finite() || obs.seconds < 0.0 {
                counters.dropped_latencies.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let failed = obs.labels.iter().any(|(k, _)| k == crate::metrics::ERROR_TYPE_LABEL);
            let response_model =
                if failed { None } else { canary_of(&obs.labels).and_then(|c| live.response_model(c)) };
            let attributes = self.client.attributes(&obs.labels, response_model);
            match obs.name {
                crate::metrics::INPUT_TOKENS_TAP => self.input_tokens.record(obs.seconds, attributes),
                n if n == catalogue::CANARY_TOKENS.name => self.output_tokens.record(obs.seconds, attributes),
                n if n == catalogue::TTFT_SECONDS.name => self.ttft.record(obs.seconds, &attributes),
                n if n == catalogue::TPOT_SECONDS.name => self.tpot.record(obs.seconds, &attributes),
                _ => self.e2e.record(obs.seconds, &attributes),
            }
        }
    }
}

/// The canary id of an observation's labels.
fn canary_of(labels: &Labels) -> Option<&str> {
    labels.iter().find(|(k, _)| k == "canary").map(|(_, v)| v.as_str())
}

/// The hardware conventions' attributes of a GPU series: `hw.id` is the NVML UUID (stable for
/// the GPU's life) when the series has one, else its `gpu` index; `modelName` is `hw.model`;
/// other labels keep their name under `omen.`.
fn hardware_attributes(labels: &Labels) -> Vec<KeyValue> {
    let has_uuid = labels.iter().any(|(k, _)| k == "UUID");
    labels
        .iter()
        .map(|(k, v)| {
            let key = match k.as_str() {
                "UUID" => "hw.id".to_owned(),
                "gpu" if !has_uuid => "hw.id".to_owned(),
                "modelName" => "hw.model".to_owned(),
                _ => format!("omen.{k}"),
            };
            KeyValue::new(key, v.clone())
        })
        .collect()
}

/// One observable gauge per `/metrics` gauge name seen so far.
struct GaugeSet {
    meter: Meter,
    live: Arc<LiveMetrics>,
    instruments: HashMap<String, ObservableGauge<f64>>,
    /// `hw.gpu.memory.*`, which the hardware conventions make up-down counters.
    hardware: HashMap<String, ObservableUpDownCounter<i64>>,
    otlp_names: HashSet<String>,
    skipped: HashSet<String>,
}

impl GaugeSet {
    fn new(meter: Meter, live: Arc<LiveMetrics>) -> Self {
        let mut otlp_names = HashSet::new();
        for reserved in [
            TTFT_NAME,
            TPOT_NAME,
            E2E_NAME,
            EXPORT_FAILURES_NAME,
            OUTPUT_TOKENS_NAME,
            OUTPUT_TOKEN_USAGE_NAME,
            INPUT_TOKENS_NAME,
            INPUT_TOKEN_USAGE_NAME,
        ] {
            otlp_names.insert(reserved.to_owned());
        }
        Self {
            meter,
            live,
            instruments: HashMap::new(),
            hardware: HashMap::new(),
            otlp_names,
            skipped: HashSet::new(),
        }
    }

    /// GPU memory used and total as the hardware conventions' `hw.gpu.memory.usage` /
    /// `hw.gpu.memory.limit`: integer up-down counters in bytes, attributes by [`hardware_attributes`].
    fn hardware_gpu(&self, name: &str, otlp_name: &str) -> Option<ObservableUpDownCounter<i64>> {
        let gpu_memory = [catalogue::GPU_MEMORY_USED_BYTES.name, catalogue::GPU_MEMORY_TOTAL_BYTES.name];
        if !gpu_memory.contains(&name) {
            return None;
        }
        let live = self.live.clone();
        let source = name.to_owned();
        Some(
            self.meter
                .i64_observable_up_down_counter(otlp_name.to_owned())
                .with_description(help_for(name))
                .with_unit("By")
                .with_callback(move |observer| {
                    for (labels, value) in live.gauge_family(&source) {
                        observer.observe(value as i64, &hardware_attributes(&labels));
                    }
                })
                .build(),
        )
    }

    /// Registers an instrument for every gauge name not seen before.
    fn discover(&mut self) {
        let mut names: Vec<String> = self.live.snapshot().into_iter().map(|p| p.name).collect();
        names.dedup();
        for name in names {
            if self.instruments.contains_key(&name)
                || self.hardware.contains_key(&name)
                || self.skipped.contains(&name)
            {
                continue;
            }
            let Some(otlp_name) = otlp_gauge_name(&name).filter(|n| !self.otlp_names.contains(n)) else {
                tracing::warn!(
                    gauge = %name,
                    "gauge not exported over OTLP: its name is empty, longer than {MAX_NAME_LEN} characters \
                     or maps to an OTLP name already in use; rename the pushed signal to fix it"
                );
                self.skipped.insert(name);
                continue;
            };
            if let Some(instrument) = self.hardware_gpu(&name, &otlp_name) {
                self.hardware.insert(name, instrument);
                self.otlp_names.insert(otlp_name);
                continue;
            }
            let live = self.live.clone();
            let source = name.clone();
            let mut builder = self
                .meter
                .f64_observable_gauge(otlp_name.clone())
                .with_description(help_for(&name))
                .with_callback(move |observer: &dyn AsyncInstrument<f64>| {
                    for (labels, value) in live.gauge_family(&source) {
                        observer.observe(value, &attributes(&labels));
                    }
                });
            if let Some(unit) = unit_for(&name) {
                builder = builder.with_unit(unit);
            }
            self.instruments.insert(name, builder.build());
            self.otlp_names.insert(otlp_name);
        }
    }
}

/// The OTLP exporter, counting and logging failures.
struct CountingExporter {
    inner: MetricExporter,
    counters: Arc<Counters>,
    endpoint: String,
}

impl PushMetricExporter for CountingExporter {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let result = self.inner.export(metrics).await;
        match &result {
            Ok(()) => {
                self.counters.exports.fetch_add(1, Ordering::Relaxed);
                if self.counters.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint = %self.endpoint, "OTLP export recovered");
                }
            }
            Err(e) => {
                let n = self.counters.failures.fetch_add(1, Ordering::Relaxed) + 1;
                if self.counters.failing.swap(true, Ordering::Relaxed) {
                    tracing::debug!(endpoint = %self.endpoint, failures = n, "OTLP export failed again: {e}");
                } else {
                    tracing::warn!(
                        endpoint = %self.endpoint,
                        failures = n,
                        "OTLP export failed: {e}; the agent keeps running and retries every interval: \
                         check that an OTLP gRPC receiver listens at otlp.endpoint"
                    );
                }
            }
        }
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// A current-thread tokio runtime on its own thread, for tonic's channel; it
/// keeps the exporter independent of the caller's runtime (and safe to shut
/// down from a current-thread runtime).
struct IoThread {
    handle: tokio::runtime::Handle,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl IoThread {
    fn start() -> Result<Self, OtlpError> {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("omen-otlp-io".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(rt.handle().clone()));
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
            })
            .map_err(OtlpError::Runtime)?;
        let handle = match handle_rx.recv() {
            Ok(Ok(handle)) => handle,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(OtlpError::Runtime(e));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(OtlpError::Runtime(std::io::Error::other("the I/O thread exited at start")));
            }
        };
        Ok(Self { handle, stop, thread })
    }

    fn stop(self) {
        let _ = self.stop.send(());
        if self.thread.join().is_err() {
            tracing::warn!("the OTLP I/O thread panicked while stopping");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_series_take_the_uuid_as_hw_id_and_the_index_without_one() {
        let keys = |labels: &[(&str, &str)]| -> Vec<(String, String)> {
            let labels: Labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            hardware_attributes(&labels)
                .into_iter()
                .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                .collect()
        };
        assert_eq!(
            keys(&[("UUID", "GPU-aaa"), ("gpu", "0"), ("modelName", "NVIDIA H100")]),
            [("hw.id", "GPU-aaa"), ("omen.gpu", "0"), ("hw.model", "NVIDIA H100")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        assert_eq!(keys(&[("gpu", "1")]), [("hw.id".to_owned(), "1".to_owned())]);
    }

    #[test]
    fn names_follow_the_mapping() {
        assert_eq!(
            otlp_gauge_name("kvcache_usage_ratio").as_deref(),
            Some(catalogue::KVCACHE_USAGE_RATIO.otlp_name)
        );
        assert_eq!(otlp_gauge_name("kv_fragmentation").as_deref(), Some("omen.kv_fragmentation"));
        assert_eq!(
            otlp_gauge_name("forecast_time_to_breach_seconds").as_deref(),
            Some("omen.forecast_time_to_breach")
        );
        assert_eq!(otlp_gauge_name("vllm:queue len").as_deref(), Some("omen.vllm_queue_len"));
        assert_eq!(otlp_gauge_name(""), None);
        assert_eq!(otlp_gauge_name(&"x".repeat(300)), None);
        assert_eq!(unit_for("gpu_memory_used_bytes"), Some("By"));
        assert_eq!(unit_for("health_score"), None);
    }

    #[test]
    fn bad_endpoints_are_rejected_with_the_fix() {
        for bad in ["https://collector:4317", "127.0.0.1:4317", "http://", "grpc://x:1", "http://a b:1"] {
            let e = check_endpoint(bad).unwrap_err().to_string();
            assert!(e.contains("otlp.endpoint") && e.contains("http://"), "{bad}: {e}");
        }
        check_endpoint("http://127.0.0.1:4317").unwrap();
        check_endpoint("HTTP://collector.monitoring.svc:4317/").unwrap();
    }

    #[test]
    fn zero_interval_is_rejected() {
        let cfg = OtlpConfig {
            endpoint: "http://127.0.0.1:4317".into(),
            interval: Duration::ZERO,
            gen_ai_provider_name: "openai".into(),
        };
        let e = start(&cfg, Arc::new(LiveMetrics::new()), GenAiClient::default()).unwrap_err();
        assert!(e.to_string().contains("interval: 30s"), "{e}");
    }
}

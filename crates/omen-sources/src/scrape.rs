//! Scrapes an inference server's Prometheus `/metrics` (text format 0.0.4) and maps the
//! names omen knows (vLLM, SGLang, TGI, llama.cpp) into omen samples.
//!
//! Gauges pass through; latency histograms become p99 values computed from the bucket
//! deltas between two consecutive scrapes (so the p99 is of the requests in that
//! interval, as `histogram_quantile(0.99, rate(...))` would give); hit/query counter
//! pairs become a hit ratio from their deltas. A [`Scraper`] keeps the previous
//! scrape's counts, so the first scrape yields no p99 or ratio.
//!
//! Every sample carries `server` (`vllm`, `sglang`, `tgi`, `llamacpp`) and the
//! source series' labels, with vLLM/SGLang's `model_name` renamed to `model`.
//!
//! Parsing uses `prom_text_format_parser` (a winnow grammar of the text format).
//! `prometheus-parse` was tried first and rejected: its name pattern is `\w+`, so it
//! silently drops every metric with a `:` in its name — all of vLLM's, SGLang's and
//! llama.cpp's — and it splits label values on `,` and `=`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures_util::StreamExt as _;
use omen_signals::catalogue;
use prom_text_format_parser::{Metric, ScrapeParseError, Type, ValueType};
use serde::{Deserialize, Serialize};

use crate::Sample;

/// Largest `/metrics` body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 16 << 20;
/// The quantile reported for latency histograms.
pub const LATENCY_QUANTILE: f64 = 0.99;

/// The inference server a metric name belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerKind {
    /// vLLM (`vllm:` prefix).
    Vllm,
    /// SGLang (`sglang:` prefix).
    Sglang,
    /// Text Generation Inference (`tgi_` prefix).
    Tgi,
    /// llama.cpp's llama-server (`llamacpp:` prefix).
    LlamaCpp,
    /// TensorRT-LLM: Triton's TensorRT-LLM backend (`nv_trt_llm_`) or trtllm-serve (`trtllm_`).
    TensorRtLlm,
}

impl ServerKind {
    /// The `server` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
            Self::Tgi => "tgi",
            Self::LlamaCpp => "llamacpp",
            Self::TensorRtLlm => "tensorrt_llm",
        }
    }
}

/// Why a scrape failed, naming the URL and what to check.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The metrics URL is unusable.
    #[error("metrics URL {url:?}: {reason}")]
    Config {
        /// The configured URL.
        url: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The request could not be sent or the connection broke.
    #[error("scraping {url} failed: {detail}; check that the server is running and the URL is right")]
    Request {
        /// The URL scraped.
        url: String,
        /// The transport error and its causes, e.g. `... tcp connect error: Connection refused`.
        detail: String,
        /// The transport error.
        source: reqwest::Error,
    },
    /// The server did not answer in time.
    #[error("scraping {url} timed out after {timeout:?}; the server may be overloaded, or raise the scrape timeout")]
    Timeout {
        /// The URL scraped.
        url: String,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The server answered with an HTTP error.
    #[error("scraping {url} got HTTP {status}; {hint}")]
    Status {
        /// The URL scraped.
        url: String,
        /// The HTTP status.
        status: u16,
        /// What usually causes this status.
        hint: &'static str,
    },
    /// The body is larger than [`MAX_BODY_BYTES`].
    #[error("scraping {url}: the body exceeds {MAX_BODY_BYTES} bytes; point omen at the inference server's own /metrics, not a federation endpoint")]
    TooLarge {
        /// The URL scraped.
        url: String,
    },
    /// The body is not Prometheus text format.
    #[error("scraping {url}: the body is not Prometheus text format 0.0.4 ({reason}); check that the URL is the server's /metrics")]
    Parse {
        /// The URL scraped.
        url: String,
        /// The parser's complaint.
        reason: String,
    },
}

/// What to do with one known metric.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// Pass a gauge value through under this name.
    Value(&'static str),
    /// p99 of the bucket deltas, under this name.
    P99(&'static str),
    /// Numerator of a delta ratio, under this name.
    RatioHits(&'static str),
    /// Denominator of a delta ratio, under this name.
    RatioQueries(&'static str),
    /// Per-second rate of a counter between two scrapes, under this name.
    Rate(&'static str),
    /// One sample per value of `label`: `(label value, signal)`; the label is dropped.
    ByLabel(&'static str, &'static [(&'static str, &'static str)]),
    /// vLLM's `cache_config_info`: the capacity lives in its labels.
    VllmCacheConfig,
}

use catalogue::{
    KVCACHE_USAGE_RATIO as KV_USAGE, SERVER_ABORTED_REQUESTS_PER_SECOND as ABORTED_RATE,
    SERVER_BUSY_SLOTS_PER_DECODE as BUSY_SLOTS, SERVER_CORRUPTED_REQUESTS_PER_SECOND as CORRUPTED_RATE,
    SERVER_DECODE_P99_SECONDS as DECODE_P99, SERVER_E2E_P99_SECONDS as E2E_P99,
    SERVER_GENERATION_TOKENS_PER_SECOND as GENERATION_RATE, SERVER_INFERENCE_P99_SECONDS as INFERENCE_P99,
    SERVER_ITL_P99_SECONDS as ITL_P99, SERVER_KVCACHE_BLOCK_SIZE_TOKENS as BLOCK_SIZE,
    SERVER_KVCACHE_CAPACITY_BLOCKS as CAPACITY_BLOCKS, SERVER_KVCACHE_CAPACITY_TOKENS as CAPACITY_TOKENS,
    SERVER_KVCACHE_TOKENS as KV_TOKENS, SERVER_KVCACHE_USED_BLOCKS as USED_BLOCKS,
    SERVER_PREEMPTIONS_PER_SECOND as PREEMPTION_RATE, SERVER_PREFILL_P99_SECONDS as PREFILL_P99,
    SERVER_PREFIX_CACHE_HIT_RATIO as PREFIX_HIT, SERVER_PROMPT_TOKENS_PER_SECOND as PROMPT_RATE,
    SERVER_QUEUE_P99_SECONDS as QUEUE_P99, SERVER_REQUESTS_RUNNING as RUNNING,
    SERVER_REQUESTS_WAITING as WAITING, SERVER_REQUEST_MEAN_TPOT_P99_SECONDS as MEAN_TPOT_P99,
    SERVER_TTFT_P99_SECONDS as TTFT_P99,
};

/// Whether a mapped name is what the current upstream server exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameStatus {
    /// Exported by the upstream version the mapping follows.
    Current,
    /// Exported only in some states (e.g. a counter that appears at its first event).
    Conditional,
    /// An older spelling, kept for servers that still export it.
    Alias,
}

/// One mapped upstream name.
struct Mapping {
    name: &'static str,
    server: ServerKind,
    rules: &'static [Rule],
    status: NameStatus,
}

const fn map(name: &'static str, server: ServerKind, rules: &'static [Rule], status: NameStatus) -> Mapping {
    Mapping { name, server, rules, status }
}

/// Every upstream name omen maps and what it becomes. Each server's block cites the
/// upstream source it follows; older spellings map to the same signals as aliases.
const MAPPINGS: &[Mapping] = {
    use NameStatus::{Alias, Conditional, Current};
    use Rule::*;
    use ServerKind::*;
    &[
        // vLLM 0.32: vllm/v1/metrics/loggers.py (PrometheusStatLogger); counters end in _total.
        map("vllm:kv_cache_usage_perc", Vllm, &[Value(KV_USAGE.name)], Current),
        map("vllm:num_requests_waiting", Vllm, &[Value(WAITING.name)], Current),
        map("vllm:num_requests_running", Vllm, &[Value(RUNNING.name)], Current),
        map("vllm:num_preemptions_total", Vllm, &[Rate(PREEMPTION_RATE.name)], Current),
        map("vllm:prompt_tokens_total", Vllm, &[Rate(PROMPT_RATE.name)], Current),
        map("vllm:generation_tokens_total", Vllm, &[Rate(GENERATION_RATE.name)], Current),
        map("vllm:time_to_first_token_seconds", Vllm, &[P99(TTFT_P99.name)], Current),
        map("vllm:inter_token_latency_seconds", Vllm, &[P99(ITL_P99.name)], Current),
        map("vllm:request_time_per_output_token_seconds", Vllm, &[P99(MEAN_TPOT_P99.name)], Current),
        map("vllm:e2e_request_latency_seconds", Vllm, &[P99(E2E_P99.name)], Current),
        map("vllm:request_queue_time_seconds", Vllm, &[P99(QUEUE_P99.name)], Current),
        map("vllm:request_prefill_time_seconds", Vllm, &[P99(PREFILL_P99.name)], Current),
        map("vllm:request_decode_time_seconds", Vllm, &[P99(DECODE_P99.name)], Current),
        map("vllm:request_inference_time_seconds", Vllm, &[P99(INFERENCE_P99.name)], Current),
        map("vllm:prefix_cache_hits_total", Vllm, &[RatioHits(PREFIX_HIT.name)], Current),
        map("vllm:prefix_cache_queries_total", Vllm, &[RatioQueries(PREFIX_HIT.name)], Current),
        map("vllm:cache_config_info", Vllm, &[VllmCacheConfig], Current),
        // Counted only when a request's logits held NaN (with VLLM_COMPUTE_NANS_IN_LOGITS).
        map("vllm:corrupted_requests_total", Vllm, &[Rate(CORRUPTED_RATE.name)], Conditional),
        // vLLM V0 names (gone in 0.32).
        map("vllm:gpu_cache_usage_perc", Vllm, &[Value(KV_USAGE.name)], Alias),
        map("vllm:time_per_output_token_seconds", Vllm, &[P99(ITL_P99.name)], Alias),
        map("vllm:gpu_prefix_cache_hits_total", Vllm, &[RatioHits(PREFIX_HIT.name)], Alias),
        map("vllm:gpu_prefix_cache_queries_total", Vllm, &[RatioQueries(PREFIX_HIT.name)], Alias),
        map("vllm:gpu_prefix_cache_hit_rate", Vllm, &[Value(PREFIX_HIT.name)], Alias),
        // SGLang: python/sglang/srt/metrics/collector.py at 00ae9c15 (2026 main), with
        // --enable-metrics. The prefix-cache ratio and token rates come from the counters
        // (cache_hit_rate and gen_throughput are per-batch gauges of the same quantities).
        map("sglang:token_usage", Sglang, &[Value(KV_USAGE.name)], Current),
        map("sglang:num_used_tokens", Sglang, &[Value(KV_TOKENS.name)], Current),
        map("sglang:max_total_num_tokens", Sglang, &[Value(CAPACITY_TOKENS.name)], Current),
        map("sglang:num_queue_reqs", Sglang, &[Value(WAITING.name)], Current),
        map("sglang:num_running_reqs", Sglang, &[Value(RUNNING.name)], Current),
        map(
            "sglang:prompt_tokens_total",
            Sglang,
            &[Rate(PROMPT_RATE.name), RatioQueries(PREFIX_HIT.name)],
            Current,
        ),
        map("sglang:cached_tokens_total", Sglang, &[RatioHits(PREFIX_HIT.name)], Current),
        map("sglang:generation_tokens_total", Sglang, &[Rate(GENERATION_RATE.name)], Current),
        map("sglang:num_retracted_requests_total", Sglang, &[Rate(PREEMPTION_RATE.name)], Current),
        map("sglang:num_aborted_requests_total", Sglang, &[Rate(ABORTED_RATE.name)], Current),
        map("sglang:time_to_first_token_seconds", Sglang, &[P99(TTFT_P99.name)], Current),
        map("sglang:inter_token_latency_seconds", Sglang, &[P99(ITL_P99.name)], Current),
        map("sglang:e2e_request_latency_seconds", Sglang, &[P99(E2E_P99.name)], Current),
        map("sglang:queue_time_seconds", Sglang, &[P99(QUEUE_P99.name)], Current),
        map("sglang:time_per_output_token_seconds", Sglang, &[P99(ITL_P99.name)], Alias),
        // TGI v3.3.7: router/src/server.rs, router/src/infer/mod.rs (metrics-exporter-prometheus,
        // no _total suffix). mean_time_per_token is each request's inference time / tokens
        // (prefill included), so it has a signal of its own, not the inter-token latency's.
        map("tgi_queue_size", Tgi, &[Value(WAITING.name)], Current),
        map("tgi_batch_current_size", Tgi, &[Value(RUNNING.name)], Current),
        map("tgi_request_queue_duration", Tgi, &[P99(QUEUE_P99.name)], Current),
        map("tgi_request_mean_time_per_token_duration", Tgi, &[P99(MEAN_TPOT_P99.name)], Current),
        map("tgi_request_inference_duration", Tgi, &[P99(INFERENCE_P99.name)], Current),
        map("tgi_request_duration", Tgi, &[P99(E2E_P99.name)], Current),
        // llama.cpp: tools/server/server-task.cpp (to_metrics) at 001d906a, with --metrics.
        // Token rates come from the counters (the _seconds gauges reset at every scrape, so
        // two scrapers steal each other's window). KV use comes from GET /slots
        // ([`slots_samples`]): the kv_cache_usage_ratio and kv_cache_tokens gauges were
        // removed upstream (llama.cpp PR #13660) and are kept for older builds.
        map("llamacpp:requests_processing", LlamaCpp, &[Value(RUNNING.name)], Current),
        map("llamacpp:requests_deferred", LlamaCpp, &[Value(WAITING.name)], Current),
        map("llamacpp:prompt_tokens_total", LlamaCpp, &[Rate(PROMPT_RATE.name)], Current),
        map("llamacpp:tokens_predicted_total", LlamaCpp, &[Rate(GENERATION_RATE.name)], Current),
        map("llamacpp:n_busy_slots_per_decode", LlamaCpp, &[Value(BUSY_SLOTS.name)], Current),
        map("llamacpp:kv_cache_usage_ratio", LlamaCpp, &[Value(KV_USAGE.name)], Alias),
        map("llamacpp:kv_cache_tokens", LlamaCpp, &[Value(KV_TOKENS.name)], Alias),
        // TensorRT-LLM behind Triton: triton_backend/inflight_batcher_llm/src/
        // custom_metrics_reporter/custom_metrics_reporter.cc (NVIDIA/TensorRT-LLM at 0d5352f5;
        // tensorrtllm_backend v0.19.0 before the move). Gauges with a category label.
        map(
            "nv_trt_llm_kv_cache_block_metrics",
            TensorRtLlm,
            &[ByLabel(
                "kv_cache_block_type",
                &[
                    ("max", CAPACITY_BLOCKS.name),
                    ("used", USED_BLOCKS.name),
                    ("tokens_per", BLOCK_SIZE.name),
                    ("fraction", KV_USAGE.name),
                ],
            )],
            Current,
        ),
        map(
            "nv_trt_llm_request_metrics",
            TensorRtLlm,
            &[ByLabel("request_type", &[("active", RUNNING.name), ("waiting", WAITING.name)])],
            Current,
        ),
        // trtllm-serve: tensorrt_llm/metrics/collector.py at 050f80de (2026 main), served on
        // GET /prometheus/metrics (its /metrics is JSON). time_per_output_token is per request.
        map("trtllm_kv_cache_utilization", TensorRtLlm, &[Value(KV_USAGE.name)], Current),
        map("trtllm_kv_cache_max_blocks", TensorRtLlm, &[Value(CAPACITY_BLOCKS.name)], Current),
        map("trtllm_kv_cache_used_blocks", TensorRtLlm, &[Value(USED_BLOCKS.name)], Current),
        map("trtllm_kv_cache_tokens_per_block", TensorRtLlm, &[Value(BLOCK_SIZE.name)], Current),
        map("trtllm_kv_cache_hit_rate", TensorRtLlm, &[Value(PREFIX_HIT.name)], Current),
        map("trtllm_num_requests_running", TensorRtLlm, &[Value(RUNNING.name)], Current),
        map("trtllm_num_requests_waiting", TensorRtLlm, &[Value(WAITING.name)], Current),
        map("trtllm_prompt_tokens_total", TensorRtLlm, &[Rate(PROMPT_RATE.name)], Current),
        map("trtllm_generation_tokens_total", TensorRtLlm, &[Rate(GENERATION_RATE.name)], Current),
        map("trtllm_time_to_first_token_seconds", TensorRtLlm, &[P99(TTFT_P99.name)], Current),
        map("trtllm_time_per_output_token_seconds", TensorRtLlm, &[P99(MEAN_TPOT_P99.name)], Current),
        map("trtllm_e2e_request_latency_seconds", TensorRtLlm, &[P99(E2E_P99.name)], Current),
        map("trtllm_request_queue_time_seconds", TensorRtLlm, &[P99(QUEUE_P99.name)], Current),
        map("trtllm_request_prefill_time_seconds", TensorRtLlm, &[P99(PREFILL_P99.name)], Current),
        map("trtllm_request_decode_time_seconds", TensorRtLlm, &[P99(DECODE_P99.name)], Current),
        map("trtllm_request_inference_time_seconds", TensorRtLlm, &[P99(INFERENCE_P99.name)], Current),
    ]
};

/// The rules for upstream metric `name`, if omen maps it.
fn rules(name: &str) -> Option<(ServerKind, &'static [Rule])> {
    MAPPINGS.iter().find(|m| m.name == name).map(|m| (m.server, m.rules))
}

/// Every upstream name omen maps for `server`, with its status and the signals it feeds.
pub fn mapped_names(server: ServerKind) -> Vec<(&'static str, NameStatus, Vec<&'static str>)> {
    MAPPINGS
        .iter()
        .filter(|m| m.server == server)
        .map(|m| (m.name, m.status, m.rules.iter().flat_map(|r| r.signals()).collect()))
        .collect()
}

impl Rule {
    /// The omen signals this rule writes.
    fn signals(&self) -> Vec<&'static str> {
        match *self {
            Rule::Value(s) | Rule::P99(s) | Rule::RatioHits(s) | Rule::RatioQueries(s) | Rule::Rate(s) => {
                vec![s]
            }
            Rule::ByLabel(_, map) => map.iter().map(|(_, s)| *s).collect(),
            Rule::VllmCacheConfig => vec![CAPACITY_BLOCKS.name, BLOCK_SIZE.name, CAPACITY_TOKENS.name],
        }
    }
}

type Labels = BTreeMap<String, String>;

/// Identity of a source series between scrapes: metric name and labels (without `le`).
/// The scrape source's section of the agent config (`sources.server_metrics` in omen.yaml).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerMetricsConfig {
    /// e.g. http://127.0.0.1:8000/metrics
    pub url: String,
    /// Scrape interval.
    #[serde(default = "default_scrape_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// Request timeout.
    #[serde(default = "default_scrape_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

fn default_scrape_interval() -> Duration {
    Duration::from_secs(15)
}

fn default_scrape_timeout() -> Duration {
    Duration::from_secs(5)
}

impl ServerMetricsConfig {
    /// Every problem of the section as (field path within the section, what to do), in field order.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        if let Err(e) = Scraper::new(&self.url) {
            p.push(("url".to_owned(), e.to_string()));
        }
        if self.interval < Duration::from_secs(1) {
            p.push(("interval".to_owned(), "must be at least 1s".to_owned()));
        }
        p
    }
}

type StateKey = (String, Labels);

/// Scrapes one server's `/metrics` and remembers the counts needed for deltas.
#[derive(Debug, Clone)]
pub struct Scraper {
    url: String,
    timeout: Duration,
    /// Cumulative buckets `(le, count)` of each histogram series at the previous scrape.
    histograms: HashMap<StateKey, Vec<(f64, f64)>>,
    /// `(hits, queries)` of each ratio pair at the previous scrape, keyed by output signal.
    ratios: HashMap<StateKey, (f64, f64)>,
    /// `(ts_ms, value)` of each rate counter at the previous scrape, keyed by output signal.
    counters: HashMap<StateKey, (i64, f64)>,
    server: Option<ServerKind>,
    warnings: Vec<String>,
    /// The warnings last handed out by [`Scraper::changed_warnings`].
    reported_warnings: Vec<String>,
}

impl Scraper {
    /// A scraper for `metrics_url`, e.g. `http://127.0.0.1:8000/metrics` (http only: no TLS in this build).
    pub fn new(metrics_url: &str) -> Result<Self, ScrapeError> {
        let config = |reason: String| ScrapeError::Config { url: metrics_url.to_owned(), reason };
        let url = reqwest::Url::parse(metrics_url)
            .map_err(|e| config(format!("is not a URL ({e}); write e.g. http://127.0.0.1:8000/metrics")))?;
        match url.scheme() {
            "http" => {}
            "https" => {
                return Err(config(
                    "https needs TLS, which this build of omen-sources leaves out; scrape over http".into(),
                ))
            }
            other => return Err(config(format!("scheme {other:?} is not http"))),
        }
        Ok(Self {
            url: metrics_url.to_owned(),
            timeout: Duration::from_secs(10),
            histograms: HashMap::new(),
            ratios: HashMap::new(),
            counters: HashMap::new(),
            server: None,
            warnings: Vec::new(),
            reported_warnings: Vec::new(),
        })
    }

    /// Sets the request timeout (default 10 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The URL scraped.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server kind seen in the last scrape that had a known metric.
    pub fn server(&self) -> Option<ServerKind> {
        self.server
    }

    /// Metrics of the last scrape that were skipped, and why (e.g. a family with no samples).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The last scrape's warnings when they differ from those this returned before (so a
    /// caller logs a skipped family once, not every interval); None when unchanged.
    pub fn changed_warnings(&mut self) -> Option<&[String]> {
        if self.warnings == self.reported_warnings {
            return None;
        }
        self.reported_warnings.clone_from(&self.warnings);
        Some(&self.warnings)
    }

    /// Fetches the metrics page and maps it into samples at `ts_ms`.
    /// For llama.cpp, whose /metrics no longer carries KV use, it also reads `GET /slots` on
    /// the same server; a failure there is a warning, not a failed scrape.
    pub async fn scrape(&mut self, client: &reqwest::Client, ts_ms: i64) -> Result<Vec<Sample>, ScrapeError> {
        let text = self.fetch(client, &self.url).await?;
        let mut samples = self.ingest(&text, ts_ms)?;
        let has_kv = samples.iter().any(|s| s.signal == KV_USAGE.name);
        if self.server == Some(ServerKind::LlamaCpp) && !has_kv {
            let slots_url = self.slots_url();
            let slots = match self.fetch(client, &slots_url).await {
                Ok(body) => slots_samples(&body, ts_ms),
                Err(ScrapeError::Status { status: 501 | 404, .. }) => Err(
                    "the server has no /slots endpoint (started with --no-slots?), so KV-cache use is unknown".into(),
                ),
                Err(e) => Err(e.to_string()),
            };
            match slots {
                Ok(s) => samples.extend(s),
                Err(e) => self.warnings.push(format!("{slots_url}: {e}")),
            }
            samples.sort_by(|a, b| (&a.signal, &a.labels).cmp(&(&b.signal, &b.labels)));
        }
        Ok(samples)
    }

    /// llama.cpp's slots endpoint beside the scraped /metrics.
    fn slots_url(&self) -> String {
        match reqwest::Url::parse(&self.url) {
            Ok(mut url) => {
                url.set_path("/slots");
                url.set_query(None);
                url.to_string()
            }
            Err(_) => self.url.clone(),
        }
    }

    async fn fetch(&self, client: &reqwest::Client, url: &str) -> Result<String, ScrapeError> {
        let transport = |e: reqwest::Error| {
            if e.is_timeout() {
                ScrapeError::Timeout { url: url.to_owned(), timeout: self.timeout }
            } else {
                ScrapeError::Request {
                    url: url.to_owned(),
                    detail: crate::canary::error_chain(&e),
                    source: e,
                }
            }
        };
        let request =
            client.get(url).header(reqwest::header::ACCEPT, "text/plain;version=0.0.4").timeout(self.timeout);
        let (response, _) = crate::http::send_retrying_stale(request).await.map_err(transport)?;
        let status = response.status();
        if !status.is_success() {
            let hint = match status.as_u16() {
                404 => "the server has no /metrics here: llama.cpp needs --metrics, SGLang --enable-metrics; vLLM and TGI serve it on their HTTP port",
                401 | 403 => "the metrics endpoint wants credentials omen does not send; expose it on loopback",
                501 => "llama.cpp answers 501 when started without --metrics",
                _ => "see the server's log",
            };
            return Err(ScrapeError::Status { url: url.to_owned(), status: status.as_u16(), hint });
        }
        if response.content_length().is_some_and(|n| n > MAX_BODY_BYTES as u64) {
            return Err(ScrapeError::TooLarge { url: url.to_owned() });
        }
        let mut body = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(transport)?;
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(ScrapeError::TooLarge { url: url.to_owned() });
            }
            body.extend_from_slice(&chunk);
        }
        String::from_utf8(body)
            .map_err(|e| ScrapeError::Parse { url: url.to_owned(), reason: format!("not UTF-8 ({e})") })
    }

    /// Parses one exposition text and maps the known metrics into samples at `ts_ms`,
    /// updating the delta state.
    pub fn ingest(&mut self, text: &str, ts_ms: i64) -> Result<Vec<Sample>, ScrapeError> {
        self.warnings.clear();
        let normalized;
        let text = if text.contains('\r') {
            normalized = text.replace("\r\n", "\n");
            normalized.as_str()
        } else {
            text
        };
        if text.trim().is_empty() {
            self.warnings.push("the metrics page is empty".into());
            return Ok(Vec::new());
        }
        let (metrics, error) = prom_text_format_parser::parse_scrape(text);
        match error {
            None => {}
            Some(ScrapeParseError::Parse(reason)) => {
                return Err(ScrapeError::Parse { url: self.url.clone(), reason: first_line(&reason) })
            }
            // Families that could not be assembled (e.g. HELP/TYPE without samples) are
            // skipped; the rest of the page is still good.
            Some(ScrapeParseError::Collect(errors)) => {
                self.warnings
                    .extend(errors.into_iter().map(|e| format!("lines {:?}: {}", e.line_no, e.error)));
            }
        }

        let mut out = Vec::new();
        let mut histograms = HashMap::new();
        let mut ratio_now: HashMap<StateKey, (Option<f64>, Option<f64>)> = HashMap::new();
        let mut server = None;
        let mut counters = HashMap::new();
        for metric in &metrics {
            let Some((kind, metric_rules)) = rules(&metric.name) else { continue };
            server.get_or_insert(kind);
            let values = || metric.samples.iter().filter(|s| s.value.value_type == ValueType::Sample);
            for &rule in metric_rules {
                match rule {
                    Rule::Value(signal) => {
                        for s in values() {
                            let value = s.value.value.as_f64();
                            if value.is_finite() {
                                let labels = output_labels(kind, source_labels(s));
                                out.push(Sample { ts_ms, signal: signal.to_owned(), labels, value });
                            }
                        }
                    }
                    Rule::ByLabel(label, map) => {
                        for s in values() {
                            let mut labels = source_labels(s);
                            let which = labels.remove(label).unwrap_or_default();
                            let value = s.value.value.as_f64();
                            if let Some(&(_, signal)) = map.iter().find(|(v, _)| *v == which) {
                                if value.is_finite() {
                                    let labels = output_labels(kind, labels);
                                    out.push(Sample { ts_ms, signal: signal.to_owned(), labels, value });
                                }
                            }
                        }
                    }
                    Rule::VllmCacheConfig => {
                        for s in values() {
                            out.extend(vllm_cache_config(kind, source_labels(s), ts_ms, &mut self.warnings));
                        }
                    }
                    Rule::Rate(signal) => {
                        for s in values() {
                            let value = s.value.value.as_f64();
                            if !value.is_finite() {
                                continue;
                            }
                            let key = (signal.to_owned(), output_labels(kind, source_labels(s)));
                            if let Some(&(prev_ts, prev)) = self.counters.get(&key) {
                                if let Some(rate) = counter_rate(prev_ts, prev, ts_ms, value) {
                                    out.push(Sample {
                                        ts_ms,
                                        signal: key.0.clone(),
                                        labels: key.1.clone(),
                                        value: rate,
                                    });
                                }
                            }
                            counters.insert(key, (ts_ms, value));
                        }
                    }
                    Rule::P99(signal) => {
                        for (labels, buckets) in histogram_series(metric, &mut self.warnings) {
                            let key = (metric.name.clone(), labels);
                            if let Some(prev) = self.histograms.get(&key) {
                                if let Some(value) = interval_quantile(LATENCY_QUANTILE, prev, &buckets) {
                                    let labels = output_labels(kind, key.1.clone());
                                    out.push(Sample { ts_ms, signal: signal.to_owned(), labels, value });
                                }
                            }
                            histograms.insert(key, buckets);
                        }
                    }
                    Rule::RatioHits(signal) | Rule::RatioQueries(signal) => {
                        let hits = matches!(rule, Rule::RatioHits(_));
                        for s in values() {
                            let key = (signal.to_owned(), output_labels(kind, source_labels(s)));
                            let entry = ratio_now.entry(key).or_default();
                            let v = Some(s.value.value.as_f64());
                            if hits {
                                entry.0 = v;
                            } else {
                                entry.1 = v;
                            }
                        }
                    }
                }
            }
        }

        let mut ratios = HashMap::new();
        for (key, pair) in ratio_now {
            let (Some(hits), Some(queries)) = pair else { continue };
            if !(hits.is_finite() && queries.is_finite()) {
                continue;
            }
            if let Some(&(prev_hits, prev_queries)) = self.ratios.get(&key) {
                // A counter that went down was reset: count from zero.
                let reset = hits < prev_hits || queries < prev_queries;
                let (dh, dq) =
                    if reset { (hits, queries) } else { (hits - prev_hits, queries - prev_queries) };
                if dq > 0.0 {
                    let value = (dh / dq).clamp(0.0, 1.0);
                    out.push(Sample { ts_ms, signal: key.0.clone(), labels: key.1.clone(), value });
                }
            }
            ratios.insert(key, (hits, queries));
        }
        derive_kv_capacity(&mut out, ts_ms);
        out.sort_by(|a, b| (&a.signal, &a.labels).cmp(&(&b.signal, &b.labels)));

        self.histograms = histograms;
        self.counters = counters;
        self.ratios = ratios;
        if server.is_some() {
            self.server = server;
        }
        Ok(out)
    }
}

/// KV use of a llama.cpp server from its `GET /slots` answer (a JSON array, one object per
/// slot): tokens held (each slot's `n_prompt_tokens`, which counts the cached prefix, the
/// prompt and the generated tokens, and stays set while an idle slot keeps its cache), the
/// capacity (the slots' `n_ctx`) and their ratio. Errors name what was wrong with the shape.
/// Follows `server_slot::to_json` in tools/server/server-context.cpp at 001d906a.
pub fn slots_samples(body: &str, ts_ms: i64) -> Result<Vec<Sample>, String> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("the answer is not JSON ({e})"))?;
    let slots = value.as_array().ok_or("the answer is not a JSON array of slots")?;
    if slots.is_empty() {
        return Err("the answer lists no slots".into());
    }
    let (mut held, mut capacity) = (0.0f64, 0.0f64);
    for (i, slot) in slots.iter().enumerate() {
        let number = |key: &str| {
            slot.get(key).and_then(serde_json::Value::as_f64).filter(|v| v.is_finite() && *v >= 0.0)
        };
        let n_ctx = number("n_ctx").ok_or_else(|| format!("slot [{i}] has no non-negative number n_ctx"))?;
        capacity += n_ctx;
        match slot.get("n_prompt_tokens") {
            None => {} // a slot that never ran a task holds nothing
            Some(_) => {
                held += number("n_prompt_tokens")
                    .ok_or_else(|| {
                        format!("slot [{i}] has an n_prompt_tokens that is not a non-negative number")
                    })?
                    .min(n_ctx)
            }
        }
    }
    let labels: Labels = [("server".to_owned(), ServerKind::LlamaCpp.as_str().to_owned())].into();
    let sample =
        |signal: &str, value: f64| Sample { ts_ms, signal: signal.to_owned(), labels: labels.clone(), value };
    let mut out = vec![sample(KV_TOKENS.name, held), sample(CAPACITY_TOKENS.name, capacity)];
    if capacity > 0.0 {
        out.push(sample(KV_USAGE.name, held / capacity));
    }
    Ok(out)
}

/// Per-second rate of a counter from `prev` at `prev_ts` to `value` at `ts_ms`; a counter
/// that went down was reset and counts from zero. None when no time passed.
pub fn counter_rate(prev_ts: i64, prev: f64, ts_ms: i64, value: f64) -> Option<f64> {
    let seconds = (ts_ms - prev_ts) as f64 / 1000.0;
    if seconds <= 0.0 {
        return None;
    }
    let delta = if value < prev { value } else { value - prev };
    Some(delta / seconds)
}

/// The labels of an info metric that name the series (the rest describe configuration).
const INFO_IDENTITY_LABELS: [&str; 2] = ["engine", "model_name"];

/// Capacity samples from one `vllm:cache_config_info` series: blocks (`num_gpu_blocks`),
/// tokens per block (`block_size`) and, when vLLM states it, `kv_cache_size_tokens`.
fn vllm_cache_config(
    kind: ServerKind,
    source: Labels,
    ts_ms: i64,
    warnings: &mut Vec<String>,
) -> Vec<Sample> {
    let number =
        |key: &str| source.get(key).and_then(|v| v.trim().parse::<f64>().ok()).filter(|v| v.is_finite());
    let labels: Labels = source
        .iter()
        .filter(|(k, _)| INFO_IDENTITY_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let labels = output_labels(kind, labels);
    let mut out = Vec::new();
    let mut push = |signal: &str, value: f64| {
        out.push(Sample { ts_ms, signal: signal.to_owned(), labels: labels.clone(), value })
    };
    match (number("num_gpu_blocks"), number("block_size")) {
        (Some(blocks), Some(block_size)) => {
            push(CAPACITY_BLOCKS.name, blocks);
            push(BLOCK_SIZE.name, block_size);
        }
        _ => warnings.push(
            "vllm:cache_config_info has no numeric num_gpu_blocks and block_size labels (the engine has not profiled its KV cache yet?); KV capacity skipped".into(),
        ),
    }
    if let Some(tokens) = number("kv_cache_size_tokens") {
        push(CAPACITY_TOKENS.name, tokens);
    }
    out
}

/// Fills in what follows from a block pool's figures when the server did not state it:
/// capacity in tokens (blocks x block size) and usage (used / capacity blocks).
fn derive_kv_capacity(out: &mut Vec<Sample>, ts_ms: i64) {
    let mut by_labels: BTreeMap<Labels, BTreeMap<&'static str, f64>> = BTreeMap::new();
    let wanted =
        [CAPACITY_BLOCKS.name, BLOCK_SIZE.name, CAPACITY_TOKENS.name, USED_BLOCKS.name, KV_USAGE.name];
    for s in out.iter() {
        if let Some(name) = wanted.iter().find(|n| **n == s.signal) {
            by_labels.entry(s.labels.clone()).or_default().insert(name, s.value);
        }
    }
    for (labels, v) in by_labels {
        let blocks = v.get(CAPACITY_BLOCKS.name).copied();
        if let (Some(blocks), Some(size), None) =
            (blocks, v.get(BLOCK_SIZE.name), v.get(CAPACITY_TOKENS.name))
        {
            let value = blocks * size;
            out.push(Sample {
                ts_ms,
                signal: CAPACITY_TOKENS.name.to_owned(),
                labels: labels.clone(),
                value,
            });
        }
        if let (Some(blocks), Some(used), None) = (blocks, v.get(USED_BLOCKS.name), v.get(KV_USAGE.name)) {
            if blocks > 0.0 {
                let value = (used / blocks).clamp(0.0, 1.0);
                out.push(Sample { ts_ms, signal: KV_USAGE.name.to_owned(), labels, value });
            }
        }
    }
}

fn first_line(s: &str) -> String {
    let line = s.lines().find(|l| !l.trim().is_empty()).unwrap_or(s);
    line.chars().take(200).collect()
}

/// Undoes the text format's label-value escapes (`\\`, `\"`, `\n`).
fn unescape(value: &str) -> String {
    if !value.contains('\\') {
        return value.to_owned();
    }
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

fn source_labels(sample: &prom_text_format_parser::Sample) -> Labels {
    sample.labels.iter().map(|l| (l.key.clone(), unescape(&l.value))).collect()
}

/// omen labels of a source series: `server`, then the source labels with `model_name` ->
/// `model`, without `le` and `pid`.
fn output_labels(kind: ServerKind, source: Labels) -> Labels {
    let mut labels: Labels = source
        .into_iter()
        // `pid` (Python multiprocess gauges) changes at every restart: not an identity.
        .filter(|(k, _)| k != "le" && k != "server" && k != "pid")
        .map(|(k, v)| if k == "model_name" { ("model".to_owned(), v) } else { (k, v) })
        .collect();
    labels.insert("server".to_owned(), kind.as_str().to_owned());
    labels
}

/// The bucket series of one histogram family: labels without `le`, buckets sorted by bound.
fn histogram_series(metric: &Metric, warnings: &mut Vec<String>) -> Vec<(Labels, Vec<(f64, f64)>)> {
    if metric.kind != Type::Histogram {
        warnings.push(format!("{} is a {} here, not a histogram; skipped", metric.name, metric.kind));
        return Vec::new();
    }
    let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
    for s in metric.samples.iter().filter(|s| s.value.value_type == ValueType::Sample) {
        let mut labels = source_labels(s);
        let Some(le) = labels.remove("le").and_then(|le| le.trim().parse::<f64>().ok()) else {
            warnings.push(format!("{}: a bucket has no numeric le label; skipped", metric.name));
            continue;
        };
        series.entry(labels).or_default().push((le, s.value.value.as_f64()));
    }
    series
        .into_iter()
        .filter_map(|(labels, mut buckets)| {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let valid = buckets.last().is_some_and(|&(le, _)| le == f64::INFINITY)
                && buckets.iter().all(|&(le, c)| !le.is_nan() && c.is_finite() && c >= 0.0)
                && buckets.windows(2).all(|w| w[0].0 < w[1].0);
            if valid {
                Some((labels, buckets))
            } else {
                warnings
                    .push(format!("{}{labels:?}: buckets lack +Inf or are not valid; skipped", metric.name));
                None
            }
        })
        .collect()
}

/// The `q` quantile of the observations between two cumulative bucket snapshots, or
/// `None` when nothing was observed in between. A changed bucket layout or a count
/// that went down (a restart) counts from zero.
pub fn interval_quantile(q: f64, previous: &[(f64, f64)], current: &[(f64, f64)]) -> Option<f64> {
    let same_layout =
        previous.len() == current.len() && previous.iter().zip(current).all(|(p, c)| p.0 == c.0);
    let reset = !same_layout || previous.iter().zip(current).any(|(p, c)| c.1 < p.1);
    let mut running = 0.0f64;
    let delta: Vec<(f64, f64)> = current
        .iter()
        .zip(previous.iter().map(Some).chain(std::iter::repeat(None)))
        .map(|(&(le, count), prev)| {
            let d = match prev {
                Some(&(_, p)) if !reset => count - p,
                _ => count,
            };
            // Buckets are scraped one by one; keep the deltas cumulative.
            running = running.max(d);
            (le, running)
        })
        .collect();
    bucket_quantile(q, &delta)
}

/// Prometheus' `histogram_quantile` over cumulative `(le, count)` buckets sorted by `le`,
/// the last being `+Inf`: linear interpolation inside the bucket holding rank `q * total`.
pub fn bucket_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let &(last_le, total) = buckets.last()?;
    if !(0.0..=1.0).contains(&q) || total <= 0.0 || last_le != f64::INFINITY || buckets.len() < 2 {
        return None;
    }
    let rank = q * total;
    let i = buckets.iter().position(|&(_, c)| c >= rank)?;
    if i == buckets.len() - 1 {
        // In the +Inf bucket: the best estimate is the largest finite bound.
        return Some(buckets[buckets.len() - 2].0);
    }
    let (upper, count) = buckets[i];
    let (lower, below) = if i == 0 {
        if upper <= 0.0 {
            return Some(upper);
        }
        (0.0, 0.0)
    } else {
        buckets[i - 1]
    };
    if count <= below {
        return Some(upper);
    }
    Some(lower + (upper - lower) * (rank - below) / (count - below))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_handed_out_once_per_change() {
        let mut s = Scraper::new("http://127.0.0.1:1/metrics").unwrap();
        s.ingest("", 0).unwrap();
        assert_eq!(s.changed_warnings(), Some(&["the metrics page is empty".to_owned()][..]));
        s.ingest("", 1).unwrap();
        assert_eq!(s.changed_warnings(), None, "the same warnings again are not news");
        s.ingest("vllm:num_requests_waiting 3\n", 2).unwrap();
        assert_eq!(s.changed_warnings(), Some(&[][..]), "their end is");
        assert_eq!(s.changed_warnings(), None);
    }

    #[test]
    fn quantile_matches_prometheus_interpolation() {
        // 100 observations: 50 in (0, 0.1], 40 in (0.1, 0.5], 10 in (0.5, 1].
        let b = [(0.1, 50.0), (0.5, 90.0), (1.0, 100.0), (f64::INFINITY, 100.0)];
        assert!((bucket_quantile(0.5, &b).unwrap() - 0.1).abs() < 1e-12);
        // rank 99 lies 9/10 into (0.5, 1]
        assert!((bucket_quantile(0.99, &b).unwrap() - 0.95).abs() < 1e-12);
        let inf = [(0.1, 1.0), (f64::INFINITY, 10.0)];
        assert_eq!(bucket_quantile(0.99, &inf), Some(0.1));
        assert_eq!(bucket_quantile(0.99, &[(0.1, 0.0), (f64::INFINITY, 0.0)]), None);
        assert_eq!(bucket_quantile(1.5, &b), None);
    }

    #[test]
    fn interval_uses_deltas_and_handles_resets() {
        let prev = [(0.1, 1000.0), (1.0, 1000.0), (f64::INFINITY, 1000.0)];
        // 10 new observations, all in (0.1, 1]: p99 is near 1 even though the
        // cumulative histogram is dominated by fast requests.
        let cur = [(0.1, 1000.0), (1.0, 1010.0), (f64::INFINITY, 1010.0)];
        let p = interval_quantile(0.99, &prev, &cur).unwrap();
        assert!((p - (0.1 + 0.9 * 0.99)).abs() < 1e-12, "{p}");
        assert_eq!(interval_quantile(0.99, &prev, &prev), None);
        // restart: counts went down, so the current counts are the interval
        let restarted = [(0.1, 2.0), (1.0, 2.0), (f64::INFINITY, 2.0)];
        assert!(interval_quantile(0.99, &prev, &restarted).unwrap() <= 0.1);
    }

    #[test]
    fn label_values_are_unescaped() {
        assert_eq!(unescape(r#"a\"b\\c\nd"#), "a\"b\\c\nd");
        assert_eq!(unescape("plain"), "plain");
    }

    #[test]
    fn bad_urls_are_rejected() {
        assert!(Scraper::new("https://x/metrics")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
            .contains("TLS"));
        assert!(Scraper::new("nope").is_err());
        assert!(Scraper::new("http://127.0.0.1:8000/metrics").is_ok());
    }
}

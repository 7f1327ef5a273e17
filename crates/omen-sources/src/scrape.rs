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
use serde::Deserialize;

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
}

impl ServerKind {
    /// The `server` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
            Self::Tgi => "tgi",
            Self::LlamaCpp => "llamacpp",
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
    /// Pass a gauge (or counter) value through under this name.
    Value(&'static str),
    /// p99 of the bucket deltas, under this name.
    P99(&'static str),
    /// Numerator of a delta ratio, under this name.
    RatioHits(&'static str),
    /// Denominator of a delta ratio, under this name.
    RatioQueries(&'static str),
}

/// The known names. Old and new spellings of one quantity map to the same signal.
fn rule(name: &str) -> Option<(ServerKind, Rule)> {
    use Rule::*;
    use ServerKind::*;
    let r = match name {
        // vLLM (V1 names first, then the V0 names they replaced)
        "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => {
            (Vllm, Value(catalogue::KVCACHE_USAGE_RATIO.name))
        }
        "vllm:num_requests_waiting" => (Vllm, Value(catalogue::SERVER_REQUESTS_WAITING.name)),
        "vllm:num_requests_running" => (Vllm, Value(catalogue::SERVER_REQUESTS_RUNNING.name)),
        "vllm:num_preemptions_total" => (Vllm, Value(catalogue::SERVER_PREEMPTIONS_TOTAL.name)),
        "vllm:time_to_first_token_seconds" => (Vllm, P99(catalogue::SERVER_TTFT_P99_SECONDS.name)),
        "vllm:inter_token_latency_seconds" | "vllm:time_per_output_token_seconds" => {
            (Vllm, P99(catalogue::SERVER_ITL_P99_SECONDS.name))
        }
        "vllm:e2e_request_latency_seconds" => (Vllm, P99(catalogue::SERVER_E2E_P99_SECONDS.name)),
        "vllm:request_queue_time_seconds" => (Vllm, P99(catalogue::SERVER_QUEUE_P99_SECONDS.name)),
        "vllm:prefix_cache_hits_total" | "vllm:gpu_prefix_cache_hits_total" => {
            (Vllm, RatioHits(catalogue::SERVER_PREFIX_CACHE_HIT_RATIO.name))
        }
        "vllm:prefix_cache_queries_total" | "vllm:gpu_prefix_cache_queries_total" => {
            (Vllm, RatioQueries(catalogue::SERVER_PREFIX_CACHE_HIT_RATIO.name))
        }
        "vllm:gpu_prefix_cache_hit_rate" => (Vllm, Value(catalogue::SERVER_PREFIX_CACHE_HIT_RATIO.name)),
        // SGLang
        "sglang:token_usage" => (Sglang, Value(catalogue::KVCACHE_USAGE_RATIO.name)),
        "sglang:num_queue_reqs" => (Sglang, Value(catalogue::SERVER_REQUESTS_WAITING.name)),
        "sglang:num_running_reqs" => (Sglang, Value(catalogue::SERVER_REQUESTS_RUNNING.name)),
        "sglang:cache_hit_rate" => (Sglang, Value(catalogue::SERVER_PREFIX_CACHE_HIT_RATIO.name)),
        "sglang:gen_throughput" => (Sglang, Value(catalogue::SERVER_GENERATION_TOKENS_PER_SECOND.name)),
        "sglang:time_to_first_token_seconds" => (Sglang, P99(catalogue::SERVER_TTFT_P99_SECONDS.name)),
        "sglang:inter_token_latency_seconds" | "sglang:time_per_output_token_seconds" => {
            (Sglang, P99(catalogue::SERVER_ITL_P99_SECONDS.name))
        }
        "sglang:e2e_request_latency_seconds" => (Sglang, P99(catalogue::SERVER_E2E_P99_SECONDS.name)),
        // TGI
        "tgi_queue_size" => (Tgi, Value(catalogue::SERVER_REQUESTS_WAITING.name)),
        "tgi_batch_current_size" => (Tgi, Value(catalogue::SERVER_REQUESTS_RUNNING.name)),
        "tgi_request_queue_duration" => (Tgi, P99(catalogue::SERVER_QUEUE_P99_SECONDS.name)),
        "tgi_request_mean_time_per_token_duration" => (Tgi, P99(catalogue::SERVER_ITL_P99_SECONDS.name)),
        "tgi_request_duration" => (Tgi, P99(catalogue::SERVER_E2E_P99_SECONDS.name)),
        // llama.cpp
        "llamacpp:requests_processing" => (LlamaCpp, Value(catalogue::SERVER_REQUESTS_RUNNING.name)),
        "llamacpp:requests_deferred" => (LlamaCpp, Value(catalogue::SERVER_REQUESTS_WAITING.name)),
        "llamacpp:prompt_tokens_seconds" => {
            (LlamaCpp, Value(catalogue::SERVER_PROMPT_TOKENS_PER_SECOND.name))
        }
        "llamacpp:predicted_tokens_seconds" => {
            (LlamaCpp, Value(catalogue::SERVER_GENERATION_TOKENS_PER_SECOND.name))
        }
        "llamacpp:kv_cache_usage_ratio" => (LlamaCpp, Value(catalogue::KVCACHE_USAGE_RATIO.name)),
        "llamacpp:kv_cache_tokens" => (LlamaCpp, Value(catalogue::SERVER_KVCACHE_TOKENS.name)),
        "llamacpp:n_busy_slots_per_decode" => (LlamaCpp, Value(catalogue::SERVER_BUSY_SLOTS_PER_DECODE.name)),
        _ => return None,
    };
    Some(r)
}

type Labels = BTreeMap<String, String>;

/// Identity of a source series between scrapes: metric name and labels (without `le`).
/// The scrape source's section of the agent config (`sources.server_metrics` in omen.yaml).
#[derive(Debug, Clone, Deserialize)]
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
    pub async fn scrape(&mut self, client: &reqwest::Client, ts_ms: i64) -> Result<Vec<Sample>, ScrapeError> {
        let text = self.fetch(client).await?;
        self.ingest(&text, ts_ms)
    }

    async fn fetch(&self, client: &reqwest::Client) -> Result<String, ScrapeError> {
        let url = &self.url;
        let transport = |e: reqwest::Error| {
            if e.is_timeout() {
                ScrapeError::Timeout { url: url.clone(), timeout: self.timeout }
            } else {
                ScrapeError::Request { url: url.clone(), detail: crate::canary::error_chain(&e), source: e }
            }
        };
        let response = client
            .get(url)
            .header(reqwest::header::ACCEPT, "text/plain;version=0.0.4")
            .timeout(self.timeout)
            .send()
            .await
            .map_err(transport)?;
        let status = response.status();
        if !status.is_success() {
            let hint = match status.as_u16() {
                404 => "the server has no /metrics here: llama.cpp needs --metrics, SGLang --enable-metrics; vLLM and TGI serve it on their HTTP port",
                401 | 403 => "the metrics endpoint wants credentials omen does not send; expose it on loopback",
                501 => "llama.cpp answers 501 when started without --metrics",
                _ => "see the server's log",
            };
            return Err(ScrapeError::Status { url: url.clone(), status: status.as_u16(), hint });
        }
        if response.content_length().is_some_and(|n| n > MAX_BODY_BYTES as u64) {
            return Err(ScrapeError::TooLarge { url: url.clone() });
        }
        let mut body = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(transport)?;
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(ScrapeError::TooLarge { url: url.clone() });
            }
            body.extend_from_slice(&chunk);
        }
        String::from_utf8(body)
            .map_err(|e| ScrapeError::Parse { url: url.clone(), reason: format!("not UTF-8 ({e})") })
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
        for metric in &metrics {
            let Some((kind, rule)) = rule(&metric.name) else { continue };
            server.get_or_insert(kind);
            match rule {
                Rule::Value(signal) => {
                    for s in metric.samples.iter().filter(|s| s.value.value_type == ValueType::Sample) {
                        let value = s.value.value.as_f64();
                        if value.is_finite() {
                            let labels = output_labels(kind, source_labels(s));
                            out.push(Sample { ts_ms, signal: signal.to_owned(), labels, value });
                        }
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
                    for s in metric.samples.iter().filter(|s| s.value.value_type == ValueType::Sample) {
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
        out.sort_by(|a, b| (&a.signal, &a.labels).cmp(&(&b.signal, &b.labels)));

        self.histograms = histograms;
        self.ratios = ratios;
        if server.is_some() {
            self.server = server;
        }
        Ok(out)
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

/// omen labels of a source series: `server`, then the source labels with `model_name` -> `model`.
fn output_labels(kind: ServerKind, source: Labels) -> Labels {
    let mut labels: Labels = source
        .into_iter()
        .filter(|(k, _)| k != "le" && k != "server")
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

//! HTTP API (axum): /metrics, /scores, /scores/latest, /healthz, /readyz and
//! POST /v1/ingest/{kvcache,logits,samples}. Bad requests get a 4xx with the
//! reason as JSON; a full pipeline queue gets 429 and nothing is lost silently.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use omen_sources::ingest::{self, IngestError};
use omen_sources::now_ms;
use prometheus_client::registry::Registry;
use serde_json::json;
use subtle::ConstantTimeEq as _;
use tokio::sync::{mpsc, oneshot};

use crate::engine::HealthSummary;
use crate::metrics::{self, GaugePoint, LiveMetrics};
use crate::pipeline::{IngestJob, PipelineError};
use omen_signals::catalogue;
use omen_store::{Resolution, Store, DAY_MS};

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    /// Live metrics.
    pub live: Arc<LiveMetrics>,
    /// prometheus-client registry over `live`.
    pub registry: Arc<Registry>,
    /// The store (for /scores).
    pub store: Arc<Store>,
    /// Pipeline queue.
    pub ingest: mpsc::Sender<IngestJob>,
    /// Bearer token for ingest, if configured.
    pub token: Option<Arc<str>>,
    /// Latest health summary.
    pub summary: Arc<RwLock<Option<HealthSummary>>>,
    /// Set once the pipeline runs.
    pub ready: Arc<AtomicBool>,
    /// Why the store cannot take writes now (set and cleared by the pipeline).
    pub write_failure: crate::pipeline::WriteFailure,
    /// The /scores/latest body, rebuilt only when the gauges or the summary change.
    pub latest: Arc<LatestCache>,
    /// Store reads in flight at once (one per reader connection); the rest wait here, not on a thread.
    pub store_reads: Arc<tokio::sync::Semaphore>,
    /// /scores bodies by query string, valid for one store generation.
    pub range_cache: Arc<RangeCache>,
}

/// /scores answers by raw query string, each tagged with the store generation it was
/// read at. An answer is a function of the query and the store's content only ("now"
/// is the newest stored sample), so an entry of the current generation is exact.
/// Dashboards refreshing the same panels read SQLite once per write instead of once
/// per request (docs/benchmarks-agent.md).
#[derive(Default)]
pub struct RangeCache {
    entries: Mutex<RangeEntries>,
}

#[derive(Default)]
struct RangeEntries {
    by_query: HashMap<String, (u64, Bytes)>,
    bytes: usize,
}

/// Distinct /scores queries kept; beyond it the cache starts over (it refills in one write interval).
const RANGE_CACHE_ENTRIES: usize = 512;
/// Bytes of queries and answers kept at most, so that the cache never grows the agent's memory much.
const RANGE_CACHE_BYTES: usize = 16 << 20;
/// Answers larger than this (long spans of many series) are not kept: they are rare and big.
const RANGE_CACHE_MAX_ANSWER: usize = 1 << 20;

impl RangeCache {
    fn get(&self, query: &str, generation: u64) -> Option<Bytes> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.by_query.get(query).filter(|(g, _)| *g == generation).map(|(_, b)| b.clone())
    }

    fn put(&self, query: &str, generation: u64, body: Bytes) {
        if body.len() > RANGE_CACHE_MAX_ANSWER {
            return;
        }
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, old)) = e.by_query.remove(query) {
            e.bytes -= query.len() + old.len();
        }
        let need = query.len() + body.len();
        let full =
            |e: &RangeEntries| e.by_query.len() >= RANGE_CACHE_ENTRIES || e.bytes + need > RANGE_CACHE_BYTES;
        if full(&e) {
            // Answers of older generations can never be served again: drop them first.
            e.by_query.retain(|_, (g, _)| *g == generation);
            e.bytes = e.by_query.iter().map(|(q, (_, b))| q.len() + b.len()).sum();
            if full(&e) {
                e.by_query.clear();
                e.bytes = 0;
            }
        }
        e.bytes += need;
        e.by_query.insert(query.to_owned(), (generation, body));
    }
}

/// Store reads one agent runs at once: the store's reader connections.
pub const STORE_READS: usize = 4;

/// What /scores/latest serves between changes: the gauges and summary it was built
/// from, and the serialised unfiltered body (shared, never copied per request).
struct LatestView {
    /// (gauge generation, summary tick) the view was built at.
    key: (u64, Option<i64>),
    summary: Option<HealthSummary>,
    signals: Vec<GaugePoint>,
    body: Bytes,
    /// `body` gzipped, made by the first request that accepts gzip. The full view is
    /// about 260 kB for 8 GPUs x 80 layers; sending ~10x fewer bytes is what lets 200
    /// clients at once be served in milliseconds (docs/benchmarks-agent.md).
    gzip: std::sync::OnceLock<Bytes>,
}

impl LatestView {
    fn gzip_body(&self) -> Bytes {
        self.gzip
            .get_or_init(|| {
                use std::io::Write;
                let mut enc = flate2::write::GzEncoder::new(
                    Vec::with_capacity(self.body.len() / 8),
                    flate2::Compression::fast(),
                );
                enc.write_all(&self.body).expect("writing to a Vec cannot fail");
                Bytes::from(enc.finish().expect("writing to a Vec cannot fail"))
            })
            .clone()
    }
}

/// Whether an `Accept-Encoding` value admits gzip (RFC 9110: `gzip`, `x-gzip` or `*`, q > 0).
pub fn accepts_gzip(accept_encoding: &str) -> bool {
    accept_encoding.split(',').any(|item| {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or("").trim();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q=").or_else(|| p.trim().strip_prefix("Q=")))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        (coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") || coding == "*")
            && q > 0.0
    })
}

/// The cached /scores/latest view; one request rebuilds it after a change, the others wait for that one.
#[derive(Default)]
pub struct LatestCache {
    view: RwLock<Option<Arc<LatestView>>>,
    rebuild: tokio::sync::Mutex<()>,
}

/// The /scores/latest body: keys in this order, as the JSON object they used to come from (sorted).
#[derive(serde::Serialize)]
#[serde(bound = "")]
struct LatestBody<'a, I: Iterator<Item = &'a GaugePoint> + Clone> {
    /// As a value tree, so that its keys come sorted as they always did.
    health: serde_json::Value,
    signals: SignalList<'a, I>,
    ts: Option<String>,
}

/// Gauges serialised as `[{"labels": {...}, "signal": ..., "value": ...}]` without building a value tree.
struct SignalList<'a, I: Iterator<Item = &'a GaugePoint> + Clone>(I);

impl<'a, I: Iterator<Item = &'a GaugePoint> + Clone> serde::Serialize for SignalList<'a, I> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Entry<'b> {
            labels: BTreeMap<&'b str, &'b str>,
            signal: &'b str,
            value: f64,
        }
        ser.collect_seq(self.0.clone().map(|g| Entry {
            labels: g.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
            signal: &g.name,
            value: g.value,
        }))
    }
}

fn latest_body<'a>(
    summary: &'a Option<HealthSummary>,
    signals: impl Iterator<Item = &'a GaugePoint> + Clone,
) -> Bytes {
    let body = LatestBody {
        health: serde_json::to_value(summary).expect("the summary serialises"),
        signals: SignalList(signals),
        ts: summary.as_ref().map(|s| rfc3339(s.ts_ms)),
    };
    Bytes::from(serde_json::to_vec(&body).expect("the latest view serialises"))
}

impl LatestCache {
    /// The current view: the cached one while nothing changed, else a rebuilt one.
    async fn current(&self, st: &AppState) -> Arc<LatestView> {
        let key = || {
            let tick = st.summary.read().unwrap_or_else(|e| e.into_inner()).as_ref().map(|s| s.ts_ms);
            (st.live.gauge_generation(), tick)
        };
        let cached = || self.view.read().unwrap_or_else(|e| e.into_inner()).clone();
        let want = key();
        if let Some(v) = cached().filter(|v| v.key == want) {
            return v;
        }
        let _one_builder = self.rebuild.lock().await;
        // Read the key before the data: a change in between only makes the next request rebuild again.
        let want = key();
        if let Some(v) = cached().filter(|v| v.key == want) {
            return v;
        }
        let summary = st.summary.read().unwrap_or_else(|e| e.into_inner()).clone();
        let signals = st.live.snapshot();
        let body = latest_body(&summary, signals.iter());
        let view = Arc::new(LatestView { key: want, summary, signals, body, gzip: Default::default() });
        *self.view.write().unwrap_or_else(|e| e.into_inner()) = Some(view.clone());
        view
    }
}

/// An error response: status and a JSON body naming the problem (the field, if any, and what to do).
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    field: Option<String>,
    message: String,
}

impl ApiError {
    fn bad(field: &str, message: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, field: Some(field.into()), message: message.into() }
    }

    /// A 503: the store or the pipeline cannot serve the request now.
    fn unavailable(message: impl Into<String>) -> Self {
        Self { status: StatusCode::SERVICE_UNAVAILABLE, field: None, message: message.into() }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{} ({field}): {}", self.status, self.message),
            None => write!(f, "{}: {}", self.status, self.message),
        }
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.message });
        if let Some(f) = self.field {
            body["field"] = json!(f);
        }
        let mut resp = (self.status, Json(body)).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            resp.headers_mut().insert(header::RETRY_AFTER, "1".parse().expect("static header"));
        }
        resp
    }
}

impl From<IngestError> for ApiError {
    fn from(e: IngestError) -> Self {
        Self { status: StatusCode::UNPROCESSABLE_ENTITY, field: Some(e.field), message: e.reason }
    }
}

/// The full API router (API listener).
pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/scores", get(scores))
        .route("/scores/latest", get(scores_latest))
        .route("/scores/forecast", get(scores_forecast))
        .route("/v1/ingest/{kind}", post(ingest_handler))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::middleware::from_fn(move |request, next| {
            refuse_declared_oversize(request, next, max_body_bytes)
        }))
        .with_state(state)
}

/// Answers 413 from the Content-Length alone, before any of an oversized body is read (the
/// body limit itself still bounds bodies without one).
async fn refuse_declared_oversize(
    request: axum::extract::Request,
    next: axum::middleware::Next,
    max_body_bytes: usize,
) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(n) if n > max_body_bytes as u64 => ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            field: None,
            message: format!(
                "the body is {n} bytes, more than http.max_body_bytes = {max_body_bytes}; send smaller batches or raise the limit"
            ),
        }
        .into_response(),
        _ => next.run(request).await,
    }
}

/// Only /metrics, /healthz and /readyz (the scrape and probe listener).
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// /metrics in the format the scraper asks for (`Accept`): OpenMetrics or text 0.0.4.
async fn metrics_handler(State(st): State<AppState>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, text) = match metrics::negotiate(accept) {
        metrics::Exposition::OpenMetrics => {
            (metrics::OPENMETRICS_CONTENT_TYPE, metrics::render(&st.registry))
        }
        metrics::Exposition::Text004 => {
            (metrics::TEXT_004_CONTENT_TYPE, metrics::render_text_004(&st.registry))
        }
    };
    ([(header::CONTENT_TYPE, content_type)], text).into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(st): State<AppState>) -> Response {
    let failure = st.write_failure.read().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(reason) = failure {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: the store cannot take writes: {reason}\n"))
            .into_response()
    } else if st.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting: the pipeline is not running yet\n").into_response()
    }
}

fn check_token(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &st.token else { return Ok(()) };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Constant time: how long a wrong token takes to refuse says nothing about how much of it was right.
    let matches = given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.as_bytes())));
    if matches {
        Ok(())
    } else {
        Err(ApiError {
            status: StatusCode::UNAUTHORIZED,
            field: Some("Authorization".into()),
            message: "missing or wrong bearer token; send `Authorization: Bearer <token>` with the token from http.ingest_token_env".into(),
        })
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        ApiError::bad(
            if path == "." { "body" } else { &path },
            format!("invalid JSON payload: {}", e.into_inner()),
        )
    })
}

async fn ingest_handler(
    State(st): State<AppState>,
    Path(kind): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = ingest_inner(&st, &kind, &headers, &body).await;
    if let Err(e) = &result {
        st.live
            .rejected
            .get_or_create(&vec![
                ("endpoint".into(), kind.clone()),
                ("status".into(), e.status.as_u16().to_string()),
            ])
            .inc();
    }
    match result {
        Ok(n) => (StatusCode::OK, Json(json!({ "accepted": n }))).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The samples of one push to `/v1/ingest/{kind}` (`now_ms` stamps those without a time):
/// everything the agent does to a push before its pipeline sees it. Public so that the
/// benchmark can time this step on its own (`omen-push-load --parse-only`).
pub fn parse_ingest(kind: &str, body: &[u8], now_ms: i64) -> Result<Vec<omen_sources::Sample>, ApiError> {
    Ok(match kind {
        "kvcache" => ingest::kvcache_samples(&parse_json(body)?, now_ms)?,
        "logits" => ingest::logits_samples(&parse_json(body)?, now_ms)?,
        "samples" => ingest::generic_samples(&parse_json(body)?, now_ms)?,
        other => {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                field: None,
                message: format!("no ingest endpoint {other:?}; use /v1/ingest/kvcache, /v1/ingest/logits or /v1/ingest/samples"),
            })
        }
    })
}

async fn ingest_inner(
    st: &AppState,
    kind: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<usize, ApiError> {
    check_token(st, headers)?;
    let samples = parse_ingest(kind, body, now_ms())?;
    let (tx, rx) = oneshot::channel();
    let n = samples.len();
    if st.ingest.try_send(IngestJob { samples, ack: Some(tx) }).is_err() {
        st.live.shed.get_or_create(&vec![("reason".into(), "queue_full".into())]).inc_by(n as u64);
        return Err(ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            field: None,
            message: "the pipeline queue is full; nothing was stored — retry after a second".into(),
        });
    }
    match tokio::time::timeout(Duration::from_secs(30), rx).await {
        Ok(Ok(Ok(n))) => Ok(n),
        Ok(Ok(Err(PipelineError::Refused(message)))) => {
            Err(ApiError { status: StatusCode::UNPROCESSABLE_ENTITY, field: None, message })
        }
        Ok(Ok(Err(PipelineError::Store(e)))) => {
            Err(ApiError::unavailable(format!("the store could not write the batch: {e}")))
        }
        _ => Err(ApiError::unavailable("the pipeline did not acknowledge the batch in 30 s")),
    }
}

/// Parses a time: RFC 3339, Unix seconds, `now`, or `now-<duration>` (e.g. now-6h).
fn parse_time(field: &str, text: &str, now: i64) -> Result<i64, ApiError> {
    omen_sources::clock::parse_time(text, now).map_err(|message| ApiError::bad(field, message))
}

fn rfc3339(ms: i64) -> String {
    omen_sources::clock::rfc3339(ms).unwrap_or_default()
}

/// Runs a blocking store read off the async threads: a failed task is a 500, a store error a 503.
async fn on_store<T: Send + 'static>(
    store: &Arc<Store>,
    permits: &tokio::sync::Semaphore,
    read: impl FnOnce(&Store) -> anyhow::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let store = store.clone();
    let _permit = store_permit(permits).await?;
    tokio::task::spawn_blocking(move || read(&store))
        .await
        .map_err(|e| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            field: None,
            message: e.to_string(),
        })?
        .map_err(store_error)
}

/// One of the store's reader permits; a closed semaphore means the agent is stopping.
async fn store_permit(
    permits: &tokio::sync::Semaphore,
) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
    permits.acquire().await.map_err(|e| ApiError::unavailable(format!("the store is closing: {e}")))
}

/// A store error as the 503 that names it.
fn store_error(e: anyhow::Error) -> ApiError {
    ApiError::unavailable(format!("{e:#}"))
}

/// Raw range queries over at most this span and this many series run on the request's
/// own task (well under a millisecond); larger ones go to a blocking thread.
const INLINE_SPAN_MS: i64 = 15 * 60_000;
/// See [`INLINE_SPAN_MS`].
const INLINE_SERIES: usize = 2;

/// Most points one /scores series may return.
const MAX_POINTS: i64 = 11_000;

async fn scores(
    State(st): State<AppState>,
    RawQuery(raw_query): RawQuery,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    // Read before the store, so a write during the read only makes the entry stale sooner.
    let generation = st.store.generation();
    let raw_query = raw_query.unwrap_or_default();
    if let Some(body) = st.range_cache.get(&raw_query, generation) {
        return Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response());
    }
    // Kept in memory by the store: no read needed.
    let latest = st.store.latest_ts().map_err(store_error)?;
    // Default "now" is the newest stored sample, so that replayed traces are queryable too.
    let now = latest.map_or_else(now_ms, |t| t + 1).max(0);
    let RangeQuery { signal, since, until, step_ms, resolution, matchers } = parse_range_query(q, now)?;
    let store = st.store.clone();
    let series = if resolution == Resolution::Raw
        && until.saturating_sub(since) <= INLINE_SPAN_MS
        && store.series_matching(&signal, &matchers) <= INLINE_SERIES
    {
        // A few hundred rows: cheaper to read here than to hand to a blocking thread and back.
        let _permit = store_permit(&st.store_reads).await?;
        store.range(&signal, &matchers, since, until, step_ms, resolution).map_err(store_error)?
    } else {
        let sig = signal.clone();
        on_store(&store, &st.store_reads, move |s| {
            s.range(&sig, &matchers, since, until, step_ms, resolution)
        })
        .await?
    };
    let body = Bytes::from(
        serde_json::to_vec(&json!({
            "signal": signal,
            "since": rfc3339(since),
            "until": rfc3339(until),
            "step": humantime::format_duration(Duration::from_millis(step_ms as u64)).to_string(),
            "step_ms": step_ms,
            "resolution": format!("{resolution:?}").to_lowercase(),
            "series": series,
        }))
        .expect("the range answer serialises"),
    );
    // An empty store answers relative to the wall clock: not a function of the store alone.
    if latest.is_some() {
        st.range_cache.put(&raw_query, generation, body.clone());
    }
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// A checked `/scores` query.
#[derive(Debug, Clone, PartialEq)]
pub struct RangeQuery {
    /// The signal.
    pub signal: String,
    /// Start, Unix ms.
    pub since: i64,
    /// End (exclusive), Unix ms.
    pub until: i64,
    /// Bucket width, ms.
    pub step_ms: i64,
    /// Which table answers.
    pub resolution: Resolution,
    /// Label matchers: every other parameter.
    pub matchers: BTreeMap<String, String>,
}

/// A `/scores` query's parameters (as the URL decoder gives them) checked against `now`
/// (Unix ms): every problem is a 400 naming the parameter.
pub fn parse_range_query(mut q: HashMap<String, String>, now: i64) -> Result<RangeQuery, ApiError> {
    let signal = q.remove("signal").ok_or_else(|| {
        ApiError::bad("signal", "is required, e.g. /scores?signal=health_score&since=now-6h")
    })?;
    ingest::check_name("signal", &signal).map_err(|e| ApiError::bad("signal", e.reason))?;
    // Dashboards written before a rename keep working.
    let signal = catalogue::current_name(&signal).to_owned();
    let until = match q.remove("until") {
        Some(t) => parse_time("until", &t, now)?,
        None => now,
    };
    let since = match q.remove("since") {
        Some(t) => parse_time("since", &t, now)?,
        None => until.saturating_sub(3_600_000),
    };
    if since >= until {
        return Err(ApiError::bad(
            "since",
            format!("since ({}) must be before until ({})", rfc3339(since), rfc3339(until)),
        ));
    }
    let step_ms = match q.remove("step") {
        Some(s) => {
            let step = humantime::parse_duration(&s)
                .map_err(|e| ApiError::bad("step", format!("{s:?}: {e}; write e.g. 1m, 5m, 1h, 1d")))?;
            i64::try_from(step.as_millis())
                .map_err(|_| ApiError::bad("step", format!("{s:?} is too long")))?
        }
        None => (until.saturating_sub(since) / 300).max(1000),
    };
    if step_ms < 1000 {
        return Err(ApiError::bad("step", "must be at least 1s"));
    }
    let span = until.saturating_sub(since);
    if span / step_ms > MAX_POINTS {
        return Err(ApiError::bad(
            "step",
            format!("gives {} points per series; at most {MAX_POINTS} — use a larger step", span / step_ms),
        ));
    }
    let resolution = if step_ms >= DAY_MS {
        Resolution::Day
    } else if step_ms >= 3_600_000 && span > 6 * 3_600_000 {
        // Hour sums kept beside the minute blocks: a 14-day query reads 336 of them per
        // series instead of decoding 20,160 minutes.
        Resolution::Hour
    } else if step_ms >= 60_000 && span > 6 * 3_600_000 {
        Resolution::Minute
    } else {
        Resolution::Raw
    };
    // Remaining query parameters are label matchers: /scores?signal=kv_fragmentation&layer=3
    let matchers: BTreeMap<String, String> = q.into_iter().collect();
    Ok(RangeQuery { signal, since, until, step_ms, resolution, matchers })
}

/// `/scores/latest[?signal=NAME&LABEL=VALUE...]`: the cached body, or the matching signals only.
async fn scores_latest(
    State(st): State<AppState>,
    headers: HeaderMap,
    Query(mut q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let signal = q.remove("signal");
    if let Some(name) = &signal {
        ingest::check_name("signal", name).map_err(|e| ApiError::bad("signal", e.reason))?;
    }
    let signal = signal.map(|name| catalogue::current_name(&name).to_owned());
    let view = st.latest.current(&st).await;
    let body = if signal.is_none() && q.is_empty() {
        let gzip =
            headers.get_all(header::ACCEPT_ENCODING).iter().any(|v| v.to_str().is_ok_and(accepts_gzip));
        if gzip {
            return Ok((
                [
                    (header::CONTENT_TYPE, "application/json"),
                    (header::CONTENT_ENCODING, "gzip"),
                    (header::VARY, "accept-encoding"),
                ],
                view.gzip_body(),
            )
                .into_response());
        }
        view.body.clone()
    } else {
        let matches = |g: &&GaugePoint| {
            signal.as_ref().is_none_or(|s| *s == g.name)
                && q.iter().all(|(k, v)| g.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        };
        latest_body(&view.summary, view.signals.iter().filter(matches))
    };
    Ok(([(header::CONTENT_TYPE, "application/json"), (header::VARY, "accept-encoding")], body)
        .into_response())
}

/// `GET /scores/forecast?slo=NAME[&format=svg]`: one SLO's latest forecast with the daily
/// indicator it was fitted to, the trend and its interval, and the warning (JSON, or the
/// picture as SVG).
async fn scores_forecast(
    State(st): State<AppState>,
    Query(mut q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let slo = q.remove("slo");
    let format = q.remove("format").unwrap_or_else(|| "json".into());
    if let Some(extra) = q.keys().next() {
        return Err(ApiError::bad(extra, "unknown parameter; /scores/forecast takes slo and format"));
    }
    if !["json", "svg"].contains(&format.as_str()) {
        return Err(ApiError::bad("format", format!("{format:?} is not a format; use json or svg")));
    }
    let summary = st.summary.read().unwrap_or_else(|e| e.into_inner()).clone();
    let Some(summary) = summary else {
        return Err(ApiError::unavailable(
            "no forecast yet: the pipeline has not ticked (it does every health.interval once samples arrive)",
        ));
    };
    let names = || summary.forecasts.iter().map(|f| f.slo.as_str()).collect::<Vec<_>>().join(", ");
    let Some(slo) = slo else {
        return Err(ApiError::bad("slo", format!("missing; name one of the configured SLOs: {}", names())));
    };
    let Some(forecast) = summary.forecasts.iter().find(|f| f.slo == slo) else {
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            field: Some("slo".into()),
            message: format!("no SLO named {slo:?}; the configured SLOs are: {}", names()),
        });
    };
    let view = crate::forecast_view::ForecastView::of(forecast, summary.ts_ms);
    if format == "svg" {
        let svg = view.svg().map_err(|e| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            field: None,
            message: e,
        })?;
        return Ok(([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response());
    }
    Ok(Json(view).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Contributor, Level};

    /// The body as the handler built it before the cache: a serde_json value tree.
    fn value_tree_body(summary: &Option<HealthSummary>, gauges: &[GaugePoint]) -> Vec<u8> {
        let signals: Vec<_> = gauges
            .iter()
            .map(|g| json!({ "signal": g.name, "labels": g.labels.iter().cloned().collect::<BTreeMap<_, _>>(), "value": g.value }))
            .collect();
        serde_json::to_vec(&json!({
            "ts": summary.as_ref().map(|s| rfc3339(s.ts_ms)),
            "health": summary,
            "signals": signals,
        }))
        .unwrap()
    }

    #[test]
    fn range_cache_serves_only_its_generation_and_stays_bounded() {
        let cache = RangeCache::default();
        cache.put("signal=a", 1, Bytes::from_static(b"one"));
        assert_eq!(cache.get("signal=a", 1).as_deref(), Some(&b"one"[..]));
        assert!(cache.get("signal=a", 2).is_none());
        assert!(cache.get("signal=b", 1).is_none());
        cache.put("signal=a", 1, Bytes::from_static(b"uno"));
        assert_eq!(cache.entries.lock().unwrap().bytes, 8 + 3, "a replaced answer is not counted twice");
        for i in 0..RANGE_CACHE_ENTRIES + 10 {
            cache.put(&format!("signal=s{i}"), 3, Bytes::from_static(b"x"));
        }
        let n = cache.entries.lock().unwrap().by_query.len();
        assert!(n <= RANGE_CACHE_ENTRIES, "{n}");
        assert!(cache.get("signal=a", 1).is_none(), "an old generation goes first");
        // by bytes: big answers are not kept, and the total stays under its cap
        cache.put("signal=huge", 3, Bytes::from(vec![b'x'; RANGE_CACHE_MAX_ANSWER + 1]));
        assert!(cache.get("signal=huge", 3).is_none());
        for i in 0..40 {
            cache.put(&format!("signal=big{i}"), 4, Bytes::from(vec![b'x'; RANGE_CACHE_MAX_ANSWER]));
            let e = cache.entries.lock().unwrap();
            assert!(e.bytes <= RANGE_CACHE_BYTES, "{}", e.bytes);
            assert_eq!(e.bytes, e.by_query.iter().map(|(q, (_, b))| q.len() + b.len()).sum::<usize>());
        }
        assert!(cache.get("signal=big39", 4).is_some());
    }

    #[test]
    fn accept_encoding_gzip_is_parsed_per_rfc_9110() {
        for yes in ["gzip", "gzip, deflate, br", "deflate, GZIP;q=0.5", "*", "br;q=1, x-gzip"] {
            assert!(accepts_gzip(yes), "{yes}");
        }
        for no in ["", "identity", "br, deflate", "gzip;q=0", "gzip; q=0.0", "gzipx", "*;q=0"] {
            assert!(!accepts_gzip(no), "{no}");
        }
    }

    #[test]
    fn latest_body_is_byte_for_byte_the_value_tree_body() {
        let gauges = vec![
            GaugePoint {
                name: "build_info".into(),
                labels: vec![("version".into(), "0.1.0".into())],
                value: 1.0,
            },
            GaugePoint {
                name: "kv_fragmentation".into(),
                labels: vec![("gpu".into(), "0".into()), ("layer".into(), "3".into())],
                value: 1.857142857142857,
            },
            GaugePoint { name: "health_score".into(), labels: vec![], value: 0.25 },
            GaugePoint { name: "odd".into(), labels: vec![("z".into(), "\"q\"".into())], value: f64::NAN },
        ];
        let summary = Some(HealthSummary {
            ts_ms: 1_793_613_600_000,
            health_score: 0.7,
            level: Level::Warning,
            contributors: vec![Contributor {
                signal: "kv_fragmentation".into(),
                labels: [("layer".to_owned(), "3".to_owned())].into(),
                risk: 0.7,
                anomaly_score: 4.5,
                value: 3.0,
            }],
            reasons: vec![],
            changes: vec![],
            forecasts: vec![],
            latency_model: None,
            model: None,
        });
        for s in [summary, None] {
            let cached = latest_body(&s, gauges.iter());
            assert_eq!(
                std::str::from_utf8(&cached).unwrap(),
                std::str::from_utf8(&value_tree_body(&s, &gauges)).unwrap()
            );
        }
    }

    #[test]
    fn time_forms() {
        let now = 1_793_613_600_000;
        assert_eq!(parse_time("since", "now", now).unwrap(), now);
        assert_eq!(parse_time("since", "now-1h", now).unwrap(), now - 3_600_000);
        assert_eq!(parse_time("since", "1793613600", now).unwrap(), now);
        assert_eq!(parse_time("since", "2026-11-02T10:00:00Z", now).unwrap(), 1_793_613_600_000);
        let e = parse_time("since", "yesterday", now).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("RFC 3339"));
    }

    #[test]
    fn the_step_and_span_choose_the_resolution() {
        let now = 1_793_613_600_000;
        let resolution = |since: &str, step: &str| {
            let q = [("signal", "kv_fragmentation"), ("since", since), ("step", step)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            parse_range_query(q, now).unwrap().resolution
        };
        assert_eq!(resolution("now-6h", "1h"), Resolution::Raw);
        assert_eq!(resolution("now-7h", "1m"), Resolution::Minute);
        assert_eq!(resolution("now-14d", "59m"), Resolution::Minute);
        assert_eq!(resolution("now-14d", "1h"), Resolution::Hour);
        assert_eq!(resolution("now-14d", "6h"), Resolution::Hour);
        assert_eq!(resolution("now-30d", "1d"), Resolution::Day);
    }
}

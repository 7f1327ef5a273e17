//! `omen bench`: a load generator for OpenAI-compatible endpoints. Sessions
//! arrive as a Poisson process with gamma-distributed rate changes and walk a
//! dialogue workflow (workflow.rs); each turn is one streamed request whose
//! context holds the session's earlier turns. The run backs off when the context
//! would exceed `max_context_tokens` (reset or truncate the session) and when TTFT
//! exceeds `rtt_backoff.ratio` x the baseline (arrivals and QPS caps slow down).
//! The report (report.rs) uses vLLM benchmark_serving's keys where they overlap.

pub mod arrival;
pub mod client;
pub mod report;
pub mod workflow;

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng};
use serde::{Deserialize, Serialize};

use self::arrival::Arrivals;
use self::client::{RequestError, RequestSpec, Turn};
use self::workflow::{ContextPolicy, Workflow, END};

/// Where to send the load and what to override in the workflow.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// API root including `/v1`, e.g. `http://127.0.0.1:18080/v1`.
    pub endpoint: String,
    /// Model name; overrides the workflow's.
    pub model: Option<String>,
    /// Bearer token.
    pub api_key: Option<String>,
    /// Overrides the workflow's `max_requests`.
    pub max_requests: Option<u64>,
    /// Overrides the workflow's `duration`.
    pub duration: Option<Duration>,
    /// Show a progress bar on stderr (only drawn when stderr is a terminal).
    pub progress: bool,
    /// Extension hooks, called at every request, chunk and the end of the run.
    pub hooks: Vec<Arc<crate::hooks::Guarded>>,
    /// Which run of the workload this is (from 1), as hooks are told.
    pub run: u32,
}

impl BenchOptions {
    /// Load for `endpoint` with the workflow's own bounds, a progress bar and no hooks.
    pub fn new(endpoint: String, model: Option<String>, api_key: Option<String>) -> Self {
        Self {
            endpoint,
            model,
            api_key,
            max_requests: None,
            duration: None,
            progress: true,
            hooks: Vec::new(),
            run: 1,
        }
    }
}

/// A bench run could not start.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The endpoint is not a usable API root.
    #[error("--endpoint {endpoint:?}: {reason}")]
    Endpoint {
        /// The value given.
        endpoint: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The workflow is invalid (after overrides).
    #[error(transparent)]
    Workflow(#[from] workflow::WorkflowError),
    /// No model was given and the endpoint could not name one.
    #[error("no model given and discovery failed: {0}")]
    Model(RequestError),
}

/// What the session did to its context before a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextAction {
    /// The history fit.
    Kept,
    /// The history was dropped.
    Reset,
    /// The oldest turns were dropped.
    Truncated,
    /// Even the prompt alone exceeds the bound; sent anyway.
    Overflow,
}

/// One request as measured (a turn of a session; retries are attempts of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Sequence number in start order.
    pub id: u64,
    /// Session number.
    pub session: u64,
    /// Turn within the session, from 0.
    pub turn: u32,
    /// Workflow state.
    pub state: String,
    /// Start of the first attempt, seconds from the start of the run.
    pub start_s: f64,
    /// End of the last attempt, seconds from the start of the run.
    pub end_s: f64,
    /// Whether the request succeeded.
    pub success: bool,
    /// Time to first token, ms (successful requests).
    pub ttft_ms: Option<f64>,
    /// Time per output token after the first, ms (successful requests with 2+ tokens).
    pub tpot_ms: Option<f64>,
    /// Gaps between streamed chunks, ms.
    pub itl_ms: Vec<f64>,
    /// End-to-end latency of the successful attempt, ms.
    pub e2el_ms: Option<f64>,
    /// Prompt tokens (the server's count, else chars/4).
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Attempts made (1 + retries used).
    pub attempts: u32,
    /// History turns carried in the request.
    pub history_turns: usize,
    /// What was done to the context first.
    pub context: ContextAction,
    /// Sentence BLEU (0-100) of the answer against the state's reference, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bleu: Option<f64>,
    /// Error class of the last failed attempt (`timeout`, `http_503`, ...).
    pub error_kind: Option<String>,
    /// Error message of the last failed attempt.
    pub error: Option<String>,
}

#[cfg(test)]
impl RequestRecord {
    /// A successful single-turn request for tests, started at `start_s`: first token after
    /// `ttft_ms`, done after `e2el_ms`, 10 tokens in and 8 out.
    pub(crate) fn for_test(start_s: f64, ttft_ms: f64, e2el_ms: f64) -> Self {
        RequestRecord {
            id: 0,
            session: 0,
            turn: 0,
            state: "s".into(),
            start_s,
            end_s: start_s + e2el_ms / 1e3,
            success: true,
            ttft_ms: Some(ttft_ms),
            tpot_ms: Some((e2el_ms - ttft_ms) / 7.0),
            itl_ms: vec![],
            e2el_ms: Some(e2el_ms),
            input_tokens: 10,
            output_tokens: 8,
            attempts: 1,
            history_turns: 0,
            context: ContextAction::Kept,
            bleu: None,
            error_kind: None,
            error: None,
        }
    }

    /// The same request, failed by a timeout: no latencies and no output.
    pub(crate) fn failed(self) -> Self {
        RequestRecord {
            success: false,
            ttft_ms: None,
            tpot_ms: None,
            itl_ms: vec![],
            e2el_ms: None,
            output_tokens: 0,
            error_kind: Some("timeout".into()),
            ..self
        }
    }
}

/// Round-trip back-off: a baseline TTFT from the first requests, then halve the
/// load on each TTFT above `ratio` x baseline and recover by 1.25x on each one below.
#[derive(Debug, Clone)]
pub struct RttController {
    ratio: f64,
    baseline_n: usize,
    samples: Vec<f64>,
    /// Median TTFT of the first successful requests, seconds.
    pub baseline_s: Option<f64>,
    /// Load multiplier in (0, 1]: 1 is the workflow's load.
    pub throttle: f64,
    /// How many times the load was cut.
    pub backoffs: u64,
}

/// Smallest throttle: the load never drops below 1/64 of the workflow's.
const MIN_THROTTLE: f64 = 1.0 / 64.0;

impl RttController {
    /// A controller cutting the load when TTFT > `ratio` x the median of the first `baseline_n`.
    pub fn new(ratio: f64, baseline_n: usize) -> Self {
        Self { ratio, baseline_n, samples: Vec::new(), baseline_s: None, throttle: 1.0, backoffs: 0 }
    }

    /// Feeds one successful request's TTFT.
    pub fn observe(&mut self, ttft_s: f64) {
        let Some(base) = self.baseline_s else {
            self.samples.push(ttft_s);
            if self.samples.len() >= self.baseline_n {
                self.samples.sort_by(f64::total_cmp);
                self.baseline_s = Some(omen_signals::quantile_linear(&self.samples, 0.5));
            }
            return;
        };
        if ttft_s > self.ratio * base {
            self.throttle = (self.throttle * 0.5).max(MIN_THROTTLE);
            self.backoffs += 1;
        } else {
            self.throttle = (self.throttle * 1.25).min(1.0);
        }
    }
}

struct Shared {
    wf: Workflow,
    base_url: String,
    model: String,
    api_key: Option<String>,
    client: reqwest::Client,
    start: Instant,
    deadline: Option<Instant>,
    max_requests: u64,
    issued: AtomicU64,
    slots: tokio::sync::Semaphore,
    qps_next: HashMap<String, tokio::sync::Mutex<Instant>>,
    rtt: Option<Mutex<RttController>>,
    records: Mutex<Vec<RequestRecord>>,
    progress: ProgressBar,
    hooks: Vec<Arc<crate::hooks::Guarded>>,
    run: u32,
}

impl Shared {
    fn throttle(&self) -> f64 {
        self.rtt.as_ref().map_or(1.0, |r| r.lock().map(|r| r.throttle).unwrap_or(1.0))
    }

    fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Claims one request of the budget; false once max_requests or the duration is spent.
    fn reserve(&self) -> Option<u64> {
        if self.past_deadline() {
            return None;
        }
        let n = self.issued.fetch_add(1, Ordering::SeqCst);
        (n < self.max_requests).then_some(n)
    }

    fn exhausted(&self) -> bool {
        self.past_deadline() || self.issued.load(Ordering::SeqCst) >= self.max_requests
    }

    /// Waits for the state's QPS slot (spacing 1 / (qps x throttle)).
    async fn qps_wait(&self, state: &str, qps: Option<f64>) {
        let (Some(qps), Some(next)) = (qps, self.qps_next.get(state)) else { return };
        let slot = {
            let mut next = next.lock().await;
            let slot = (*next).max(Instant::now());
            *next = slot + Duration::from_secs_f64(1.0 / (qps * self.throttle()));
            slot
        };
        tokio::time::sleep_until(slot.into()).await;
    }
}

/// Outcome of a bench run: per-request records and the run's counters.
#[derive(Debug, Clone)]
pub struct BenchRun {
    /// Every request, in start order.
    pub records: Vec<RequestRecord>,
    /// Wall time from the first arrival to the last answer, seconds.
    pub duration_s: f64,
    /// Sessions started.
    pub sessions: u64,
    /// Model used.
    pub model: String,
    /// Endpoint used.
    pub endpoint: String,
    /// The workflow run (with overrides applied).
    pub workflow: Workflow,
    /// Arrival rate re-draws.
    pub rate_changes: u64,
    /// Round-trip back-off state at the end, if enabled.
    pub rtt: Option<RttController>,
}

fn check_endpoint(endpoint: &str) -> Result<String, BenchError> {
    let bad =
        |reason: &str| BenchError::Endpoint { endpoint: endpoint.to_owned(), reason: reason.to_owned() };
    let url = reqwest::Url::parse(endpoint).map_err(|e| {
        bad(&format!("is not a URL ({e}); give the API root, e.g. http://127.0.0.1:18080/v1"))
    })?;
    if url.scheme() != "http" {
        return Err(bad("only http:// is supported (this build has no TLS); use a loopback or sidecar port"));
    }
    let root = endpoint.trim_end_matches('/');
    if root.ends_with("/completions") {
        return Err(bad(
            "give the API root (ending in /v1), not the completions path; set api in the workflow",
        ));
    }
    Ok(root.to_owned())
}

/// The model a run of `wf` with `opts` will use: `--model`, the workflow's, else the first
/// the endpoint lists (asked without sending any load).
pub async fn resolve_model(wf: &Workflow, opts: &BenchOptions) -> Result<String, BenchError> {
    if let Some(m) = opts.model.clone().or_else(|| wf.model.clone()) {
        return Ok(m);
    }
    let base_url = check_endpoint(&opts.endpoint)?;
    client::first_model(&reqwest::Client::new(), &base_url).await.map_err(BenchError::Model)
}

/// Runs `wf` against `opts.endpoint` until its bounds are reached and returns what it measured.
pub async fn bench(mut wf: Workflow, opts: &BenchOptions) -> Result<BenchRun, BenchError> {
    if opts.max_requests.is_some() {
        wf.max_requests = opts.max_requests;
    }
    if opts.duration.is_some() {
        wf.duration = opts.duration;
    }
    wf.validate(&format!("{} (with command-line overrides)", wf.name))?;
    let base_url = check_endpoint(&opts.endpoint)?;
    // A fresh connection per request: servers such as llama.cpp's close idle keep-alive
    // connections, and a request racing that close fails with "connection closed before
    // message completed", an artefact of the client rather than the server's fault.
    let client =
        reqwest::Client::builder().pool_max_idle_per_host(0).build().map_err(|e| BenchError::Endpoint {
            endpoint: opts.endpoint.clone(),
            reason: format!("cannot build an HTTP client: {e}"),
        })?;
    let model = match opts.model.clone().or_else(|| wf.model.clone()) {
        Some(m) => m,
        None => client::first_model(&client, &base_url).await.map_err(BenchError::Model)?,
    };
    let progress = match wf.max_requests {
        _ if !opts.progress || !std::io::stderr().is_terminal() => ProgressBar::hidden(),
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    progress.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} requests {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let start = Instant::now();
    let shared = Arc::new(Shared {
        qps_next: wf
            .states
            .iter()
            .filter(|(_, s)| s.qps.is_some())
            .map(|(name, _)| (name.clone(), tokio::sync::Mutex::new(start)))
            .collect(),
        rtt: wf.rtt_backoff.as_ref().map(|b| Mutex::new(RttController::new(b.ratio, b.baseline_requests))),
        slots: tokio::sync::Semaphore::new(wf.concurrency),
        deadline: wf.duration.map(|d| start + d),
        max_requests: wf.max_requests.unwrap_or(u64::MAX),
        issued: AtomicU64::new(0),
        records: Mutex::new(Vec::new()),
        base_url,
        model,
        api_key: opts.api_key.clone(),
        client,
        start,
        progress,
        hooks: opts.hooks.clone(),
        run: opts.run,
        wf,
    });

    let mut arrivals = Arrivals::new(&shared.wf.arrival, shared.wf.seed);
    let mut tasks = tokio::task::JoinSet::new();
    let mut sessions = 0u64;
    while !shared.exhausted() {
        // The first session starts at once (as vLLM's benchmark sends its first request), the rest on the process.
        let offset = if sessions == 0 { 0.0 } else { arrivals.next_arrival(shared.throttle()) };
        let at = start + Duration::from_secs_f64(offset);
        if shared.deadline.is_some_and(|d| at >= d) {
            break;
        }
        // Wake early when the sessions already running spend the budget.
        while Instant::now() < at && !shared.exhausted() {
            tokio::time::sleep_until(at.min(Instant::now() + Duration::from_millis(50)).into()).await;
        }
        if shared.exhausted() {
            break;
        }
        let s = shared.clone();
        let id = sessions;
        tasks.spawn(async move { session(s, id).await });
        sessions += 1;
    }
    while tasks.join_next().await.is_some() {}
    let duration_s = start.elapsed().as_secs_f64();
    shared.progress.finish_and_clear();
    let shared = Arc::try_unwrap(shared).unwrap_or_else(|_| unreachable!("every session task has ended"));
    let mut records = shared.records.into_inner().unwrap_or_else(|e| e.into_inner());
    records.sort_by_key(|r| r.id);
    Ok(BenchRun {
        records,
        duration_s,
        sessions,
        model: shared.model,
        endpoint: shared.base_url,
        rate_changes: arrivals.rate_changes,
        rtt: shared.rtt.map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner())),
        workflow: shared.wf,
    })
}

fn history_chars(history: &[Turn]) -> usize {
    history.iter().map(|t| t.user.len() + t.assistant.len()).sum()
}

/// One session: walks the workflow from `start` until `end`, an error or the budget.
async fn session(shared: Arc<Shared>, id: u64) {
    let wf = &shared.wf;
    let mut rng = StdRng::seed_from_u64(wf.seed ^ id.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut state = wf.start.clone();
    let mut history: Vec<Turn> = Vec::new();
    // Tokens per character of prompt, learnt from the server's usage counts.
    let mut tokens_per_char = 0.25;
    let mut turn = 0u32;
    while state != END {
        let Some(s) = wf.states.get(&state) else { break };
        let Some(seq) = shared.reserve() else { break };
        let pick = rng.random_range(0..s.prompts.len());
        let prompt = s.prompts[pick].clone();
        let reference = s.references.get(pick);
        let max_tokens = s.max_tokens.unwrap_or(wf.max_tokens);
        let mut context = ContextAction::Kept;
        if let Some(cap) = wf.max_context_tokens {
            let estimate = |h: &[Turn]| {
                ((history_chars(h) + prompt.len()) as f64 * tokens_per_char).ceil() as u64
                    + u64::from(max_tokens)
            };
            if estimate(&history) > u64::from(cap) {
                match wf.context_policy {
                    ContextPolicy::Reset => {
                        history.clear();
                        context = ContextAction::Reset;
                    }
                    ContextPolicy::Truncate => {
                        while !history.is_empty() && estimate(&history) > u64::from(cap) {
                            history.remove(0);
                        }
                        context = ContextAction::Truncated;
                    }
                }
                if estimate(&history) > u64::from(cap) {
                    context = ContextAction::Overflow;
                }
            }
        }
        shared.qps_wait(&state, s.qps).await;
        let spec = RequestSpec {
            base_url: &shared.base_url,
            api: wf.api,
            model: &shared.model,
            api_key: shared.api_key.as_deref(),
            history: &history,
            prompt: &prompt,
            max_tokens,
            temperature: wf.temperature,
            timeout: s.timeout,
            ignore_eos: wf.ignore_eos,
            extra_body: &wf.extra_body,
        };
        let (url, mut body) = client::body(&spec);
        let hook_ctx = crate::hooks::RequestContext {
            run: shared.run,
            id: seq,
            session: id,
            turn,
            state: state.clone(),
        };
        if !shared.hooks.is_empty() {
            // A command hook may take up to its timeout to answer: off the async workers.
            let (hooks, ctx) = (shared.hooks.clone(), hook_ctx.clone());
            body = tokio::task::spawn_blocking(move || {
                for h in &hooks {
                    h.before_request(&ctx, &mut body);
                }
                body
            })
            .await
            .unwrap_or_else(|_| client::body(&spec).1);
        }
        // The attempt a chunk belongs to: a retry starts its answer again.
        let attempt = AtomicU32::new(1);
        let mut on_chunk = |t_ms: f64, text: &str| {
            for h in &shared.hooks {
                h.on_chunk(&hook_ctx, attempt.load(Ordering::Relaxed), t_ms, text);
            }
        };
        let Ok(permit) = shared.slots.acquire().await else { break };
        let start_s = shared.start.elapsed().as_secs_f64();
        let mut attempts = 0;
        let result = loop {
            attempts += 1;
            attempt.store(attempts, Ordering::Relaxed);
            match client::send_body(&shared.client, &url, &body, spec.timeout, spec.api_key, &mut on_chunk)
                .await
            {
                Ok(m) => break Ok(m),
                Err(e) if attempts > s.retries => break Err(e),
                Err(_) => {
                    let wait = s.retry_backoff.saturating_mul(1 << (attempts - 1).min(16));
                    tokio::time::sleep(wait).await;
                }
            }
        };
        drop(permit);
        let end_s = shared.start.elapsed().as_secs_f64();
        let prompt_chars = match wf.api {
            workflow::Api::Chat => history_chars(&history) + prompt.len(),
            workflow::Api::Completions => client::completion_prompt(&history, &prompt).len(),
        };
        let mut record = RequestRecord {
            id: seq,
            session: id,
            turn,
            state: state.clone(),
            start_s,
            end_s,
            success: result.is_ok(),
            ttft_ms: None,
            tpot_ms: None,
            itl_ms: Vec::new(),
            e2el_ms: None,
            input_tokens: (prompt_chars as u64).div_ceil(4),
            output_tokens: 0,
            attempts,
            history_turns: history.len(),
            context,
            bleu: None,
            error_kind: None,
            error: None,
        };
        let ok = match result {
            Ok(m) => {
                record.ttft_ms = Some(m.ttft_s * 1e3);
                record.e2el_ms = Some(m.e2e_s * 1e3);
                record.tpot_ms = (m.output_tokens > 1)
                    .then(|| (m.e2e_s - m.ttft_s).max(0.0) * 1e3 / (m.output_tokens - 1) as f64);
                record.itl_ms = m.itl_s.iter().map(|x| x * 1e3).collect();
                record.output_tokens = m.output_tokens;
                record.bleu = reference
                    .and_then(|r| omen_signals::sentence_bleu(&m.answer, &[r]).ok())
                    .map(|b| b.score);
                if let Some(p) = m.prompt_tokens.filter(|&p| p > 0) {
                    record.input_tokens = p;
                    tokens_per_char = p as f64 / prompt_chars.max(1) as f64;
                }
                if let Some(rtt) = &shared.rtt {
                    if let Ok(mut r) = rtt.lock() {
                        r.observe(m.ttft_s);
                    }
                }
                history.push(Turn { user: prompt, assistant: m.answer });
                true
            }
            Err(e) => {
                record.error_kind = Some(e.kind());
                record.error = Some(e.to_string());
                false
            }
        };
        if let Ok(mut records) = shared.records.lock() {
            records.push(record);
        }
        shared.progress.inc(1);
        if !ok {
            // Without an answer the dialogue cannot go on.
            break;
        }
        if !s.think_time.is_zero() {
            tokio::time::sleep(s.think_time.div_f64(shared.throttle())).await;
        }
        state = wf.next_state(&state, rng.random::<f64>()).to_owned();
        turn += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_controller_cuts_and_recovers() {
        let mut c = RttController::new(3.0, 3);
        for t in [0.10, 0.12, 0.11] {
            c.observe(t);
        }
        assert_eq!(c.baseline_s, Some(0.11));
        assert_eq!(c.throttle, 1.0);
        c.observe(0.30); // below 3 x 0.11
        assert_eq!((c.throttle, c.backoffs), (1.0, 0));
        c.observe(0.40);
        c.observe(0.50);
        assert_eq!((c.throttle, c.backoffs), (0.25, 2));
        c.observe(0.1);
        assert_eq!(c.throttle, 0.3125);
        for _ in 0..20 {
            c.observe(10.0);
        }
        assert_eq!(c.throttle, MIN_THROTTLE);
    }

    #[test]
    fn endpoint_must_be_an_http_api_root() {
        assert_eq!(check_endpoint("http://127.0.0.1:8/v1/").unwrap(), "http://127.0.0.1:8/v1");
        let e = check_endpoint("http://h/v1/chat/completions").unwrap_err().to_string();
        assert!(e.contains("API root"), "{e}");
        assert!(check_endpoint("https://h/v1").unwrap_err().to_string().contains("TLS"));
        assert!(check_endpoint("h:1").is_err());
    }
}

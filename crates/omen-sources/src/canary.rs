//! Canary prober for OpenAI-compatible servers (vLLM, SGLang, TGI, llama.cpp).
//!
//! One probe sends a fixed prompt with greedy decoding (temperature 0), streams
//! the answer over server-sent events and measures, from the client's side:
//! TTFT (request sent -> first content token), TPOT ((e2e - TTFT) / (tokens - 1)),
//! end-to-end latency and the number of output tokens. The first token's
//! `top_logprobs` give TLE (first-token entropy with residual-mass bounds), and the
//! streamed text is scored token by token against the canary's reference answer
//! for the lexical parts of RCI (BLEU, repetition ratio).
//!
//! The HTTP client is reqwest built without TLS (`default-features = false`):
//! `https://` endpoints are rejected with an error saying so; serving them needs
//! reqwest's `rustls` (or `native-tls`) feature enabled in this crate.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use eventsource_stream::{EventStreamError, Eventsource as _};
use futures_util::StreamExt as _;
use omen_signals::{
    catalogue, consistency_decay_index, first_token_entropy_from_top_logprobs, BleuReference, Rci, RciParts,
    RciWeights, SignalError, StreamingRci, TopKEntropy,
};
use serde::{Deserialize, Serialize};

use crate::openai_stream::{Chunk, Logprobs};
use crate::Sample;

/// How many alternatives the probe asks for at each step (the most vLLM allows by default).
pub const TOP_LOGPROBS: u32 = 20;
/// Largest answer a probe accepts, in bytes; a longer stream is a misbehaving server.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// Most bytes of an error response body quoted in an error message.
const MAX_ERROR_BODY: usize = 2048;

fn default_max_tokens() -> u32 {
    64
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

/// Writes a secret as `<redacted>` (or null when unset), so that printing a config never shows it.
fn serialize_redacted<S: serde::Serializer>(secret: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match secret {
        Some(_) => s.serialize_some("<redacted>"),
        None => s.serialize_none(),
    }
}

fn default_chat() -> bool {
    true
}

/// Where and how to probe: one OpenAI-compatible endpoint and model.
///
/// `base_url` is the API root including `/v1`, e.g. `http://127.0.0.1:18080/v1`.
/// Only `http://` is supported by this build (no TLS).
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryTarget {
    /// API root including `/v1`, e.g. `http://127.0.0.1:18080/v1`.
    pub base_url: String,
    /// Model name sent in each request (`--served-model-name` / llama.cpp `--alias`).
    pub model: String,
    /// Bearer token, if the server wants one (printed as `<redacted>`).
    #[serde(default, serialize_with = "serialize_redacted")]
    pub api_key: Option<String>,
    /// Most output tokens per probe (default 64).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Whole-request timeout including the streamed body (default 30s), e.g. `"10s"`.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// The model's vocabulary size V for the TLE upper bound; discovered from the server when absent.
    #[serde(default)]
    pub vocab_size: Option<usize>,
    /// Vocabulary size discovered from the server, shared by clones of this target.
    #[serde(skip)]
    discovered_vocab: Arc<OnceLock<usize>>,
}

impl std::fmt::Debug for CanaryTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CanaryTarget")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("max_tokens", &self.max_tokens)
            .field("timeout", &self.timeout)
            .field("vocab_size", &self.vocab_size)
            .field("discovered_vocab", &self.discovered_vocab.get())
            .finish()
    }
}

/// One canary prompt.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Canary {
    /// Identifier; becomes the `canary` label of every sample.
    pub id: String,
    /// The prompt (the user message for chat, the raw prompt otherwise).
    pub prompt: String,
    /// Reference answer for RCI; when absent the first answer becomes the reference.
    #[serde(default)]
    pub reference: Option<String>,
    /// Use `/chat/completions` (default true) or `/completions`.
    #[serde(default = "default_chat")]
    pub chat: bool,
}

/// The canary source's section of the agent config (`sources.canary` in omen.yaml).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CanarySourceConfig {
    /// Time between probe rounds (every prompt once per round).
    #[serde(default = "default_canary_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// The OpenAI-compatible endpoint.
    pub target: CanaryTarget,
    /// Environment variable holding the API key, if the server needs one.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The canary prompts.
    pub prompts: Vec<Canary>,
    /// Folder with the BERTScore model (all-MiniLM-L6-v2: config.json, tokenizer.json,
    /// model.safetensors; `make setup` puts it in .models/all-MiniLM-L6-v2). Unset = RCI
    /// without its semantic part, the other weights renormalised.
    #[serde(default)]
    pub bertscore_model_dir: Option<PathBuf>,
}

fn default_canary_interval() -> Duration {
    Duration::from_secs(60)
}

impl CanarySourceConfig {
    /// Every problem of the section as (field path within the section, what to do), in field
    /// order. `bertscore_model_dir` is left to the agent, whose build decides whether BERTScore runs.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        if let Err(e) = self.target.validate() {
            p.push(("target".to_owned(), e.to_string()));
        }
        if self.prompts.is_empty() {
            p.push((
                "prompts".to_owned(),
                "is empty; give at least one {id, prompt} or remove sources.canary".to_owned(),
            ));
        }
        let mut ids = std::collections::HashSet::new();
        for (i, prompt) in self.prompts.iter().enumerate() {
            if let Err(e) = prompt.validate() {
                p.push((format!("prompts[{i}]"), e.to_string()));
            }
            if !ids.insert(prompt.id.clone()) {
                p.push((format!("prompts[{i}].id"), format!("{:?} is used twice", prompt.id)));
            }
        }
        if self.interval < Duration::from_secs(1) {
            p.push(("interval".to_owned(), "must be at least 1s".to_owned()));
        }
        p
    }
}

/// Why a probe failed: what was asked, what went wrong, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum CanaryError {
    /// A configuration value is unusable.
    #[error("canary config {field} = {value:?}: {reason}")]
    Config {
        /// The config field, e.g. `base_url`.
        field: &'static str,
        /// The offending value.
        value: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The request could not be sent or the connection broke.
    #[error(
        "canary request to {url} failed: {detail}; check that the server is running and base_url is right"
    )]
    Request {
        /// The URL requested.
        url: String,
        /// The transport error and its causes, e.g. `... tcp connect error: Connection refused`.
        detail: String,
        /// The transport error.
        source: reqwest::Error,
    },
    /// The server did not finish within the target's timeout.
    #[error(
        "canary request to {url} timed out after {timeout:?}; raise the target's timeout or lower max_tokens"
    )]
    Timeout {
        /// The URL requested.
        url: String,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The server answered with an HTTP error.
    #[error("canary request to {url} got HTTP {status}: {body}; {hint}")]
    Status {
        /// The URL requested.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the response body.
        body: String,
        /// What usually causes this status.
        hint: &'static str,
    },
    /// The event stream or one of its JSON chunks could not be read.
    #[error("canary stream from {url} is malformed: {reason}; the server must speak OpenAI-style SSE (data: {{json}} ... data: [DONE])")]
    Stream {
        /// The URL requested.
        url: String,
        /// What was wrong.
        reason: String,
    },
    /// The server reported an error inside the stream.
    #[error("canary request to {url}: the server reported an error mid-stream: {message}")]
    Server {
        /// The URL requested.
        url: String,
        /// The server's message.
        message: String,
    },
    /// The stream ended without any output token.
    #[error("canary {canary} at {url} returned no tokens; check max_tokens > 0 and that the prompt fits the model's context")]
    NoTokens {
        /// The URL requested.
        url: String,
        /// The canary id.
        canary: String,
    },
    /// The answer carried no logprobs, so TLE cannot be computed.
    #[error("canary {canary} at {url} returned no logprobs for its first token; the server must support logprobs with top_logprobs = {TOP_LOGPROBS} (vLLM: --max-logprobs >= {TOP_LOGPROBS})")]
    NoLogprobs {
        /// The URL requested.
        url: String,
        /// The canary id.
        canary: String,
    },
    /// The vocabulary size is neither configured nor discoverable.
    #[error("vocabulary size of model {model:?} is unknown: {reason}; set vocab_size in the canary target")]
    VocabUnknown {
        /// The model name.
        model: String,
        /// Why discovery failed.
        reason: String,
    },
    /// A signal computation rejected the server's numbers.
    #[error("canary {canary}: {what}: {source}")]
    Signal {
        /// The canary id.
        canary: String,
        /// Which computation, e.g. `TLE from top_logprobs`.
        what: &'static str,
        /// The underlying error.
        source: SignalError,
    },
}

impl CanaryError {
    /// A low-cardinality name of the failure, the OpenTelemetry `error.type` of the probe: the
    /// HTTP status code for an HTTP error, else `timeout`, `transport`, `malformed_stream`,
    /// `server_error`, `no_tokens`, `no_logprobs`, `vocab_unknown`, `config` or `signal`.
    pub fn error_type(&self) -> String {
        match self {
            Self::Status { status, .. } => status.to_string(),
            Self::Timeout { .. } => "timeout".into(),
            Self::Request { .. } => "transport".into(),
            Self::Stream { .. } => "malformed_stream".into(),
            Self::Server { .. } => "server_error".into(),
            Self::NoTokens { .. } => "no_tokens".into(),
            Self::NoLogprobs { .. } => "no_logprobs".into(),
            Self::VocabUnknown { .. } => "vocab_unknown".into(),
            Self::Config { .. } => "config".into(),
            Self::Signal { .. } => "signal".into(),
        }
    }
}

impl CanaryTarget {
    /// A target with the defaults: no API key, 64 tokens, 30 s timeout, vocabulary discovered.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            max_tokens: default_max_tokens(),
            timeout: default_timeout(),
            vocab_size: None,
            discovered_vocab: Arc::default(),
        }
    }

    /// Checks the fields without contacting the server.
    pub fn validate(&self) -> Result<(), CanaryError> {
        let config = |field, value: &dyn std::fmt::Display, reason: &str| CanaryError::Config {
            field,
            value: value.to_string(),
            reason: reason.to_owned(),
        };
        let url = reqwest::Url::parse(&self.base_url).map_err(|e| {
            config(
                "base_url",
                &self.base_url,
                &format!("is not a URL ({e}); write e.g. http://127.0.0.1:8000/v1"),
            )
        })?;
        match url.scheme() {
            "http" => {}
            "https" => {
                return Err(config(
                    "base_url",
                    &self.base_url,
                    "https needs TLS, which this build of omen-sources leaves out; probe over http \
                     (e.g. a loopback sidecar port) or build with a reqwest TLS feature",
                ))
            }
            other => {
                return Err(config("base_url", &self.base_url, &format!("scheme {other:?} is not http")))
            }
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(config(
                "base_url",
                &self.base_url,
                "must not have a query or fragment; give the API root",
            ));
        }
        if self.model.trim().is_empty() {
            return Err(config("model", &self.model, "is empty; give the served model name"));
        }
        if self.max_tokens == 0 {
            return Err(config("max_tokens", &self.max_tokens, "must be at least 1"));
        }
        if self.timeout.is_zero() {
            return Err(config("timeout", &"0s", "must be positive, e.g. 30s"));
        }
        if self.vocab_size == Some(0) {
            return Err(config("vocab_size", &0, "must be the model's vocabulary size (> 0) or left out"));
        }
        Ok(())
    }

    fn endpoint(&self, path: &str) -> String {
        format!("{}/{path}", self.base_url.trim_end_matches('/'))
    }

    fn request(&self, builder: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let builder = builder.timeout(self.timeout);
        match &self.api_key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    /// The vocabulary size: the configured one, else discovered once from `GET {base_url}/models`
    /// (llama.cpp reports `data[].meta.n_vocab`) and cached.
    pub async fn vocab_size(&self, client: &reqwest::Client) -> Result<usize, CanaryError> {
        if let Some(v) = self.vocab_size {
            return Ok(v);
        }
        if let Some(&v) = self.discovered_vocab.get() {
            return Ok(v);
        }
        let url = self.endpoint("models");
        let (response, _) = crate::http::send_retrying_stale(self.request(client.get(&url)))
            .await
            .map_err(|e| transport_error(&url, self.timeout, e))?;
        let response = check_status(&url, response).await?;
        let models: ModelList = response.json().await.map_err(|e| CanaryError::VocabUnknown {
            model: self.model.clone(),
            reason: format!("GET {url} did not return an OpenAI model list ({e})"),
        })?;
        let entry = match models.data.iter().find(|m| m.id == self.model) {
            Some(m) => Some(m),
            None if models.data.len() == 1 => models.data.first(),
            None => None,
        };
        let n_vocab = entry.and_then(|m| m.meta.as_ref()).and_then(|meta| meta.n_vocab).filter(|&v| v > 0);
        let v = n_vocab.ok_or_else(|| CanaryError::VocabUnknown {
            model: self.model.clone(),
            reason: format!("GET {url} lists no meta.n_vocab for it (only llama.cpp reports one)"),
        })?;
        Ok(*self.discovered_vocab.get_or_init(|| v))
    }
}

impl Canary {
    /// Checks the fields.
    pub fn validate(&self) -> Result<(), CanaryError> {
        if self.id.is_empty() || self.id.len() > 128 {
            return Err(CanaryError::Config {
                field: "canary.id",
                value: self.id.clone(),
                reason: "must be 1 to 128 characters".into(),
            });
        }
        if self.prompt.trim().is_empty() {
            return Err(CanaryError::Config {
                field: "canary.prompt",
                value: self.prompt.clone(),
                reason: format!("canary {} has an empty prompt", self.id),
            });
        }
        Ok(())
    }

    /// The configured reference answer, prepared for BLEU (`None` without one).
    pub fn bleu_reference(&self) -> Result<Option<Arc<BleuReference>>, CanaryError> {
        match &self.reference {
            None => Ok(None),
            Some(text) => {
                BleuReference::new(&[text]).map(|r| Some(Arc::new(r))).map_err(|source| CanaryError::Signal {
                    canary: self.id.clone(),
                    what: "preparing the reference answer",
                    source,
                })
            }
        }
    }
}

/// What one probe measured.
#[derive(Debug, Clone)]
pub struct CanaryResult {
    /// Request sent -> first content token, seconds.
    pub ttft_s: f64,
    /// Mean time per output token after the first, seconds; `None` for a one-token answer.
    pub tpot_s: Option<f64>,
    /// Request sent -> end of stream, seconds.
    pub e2e_s: f64,
    /// Output tokens (the server's usage count when it gives one).
    pub tokens: usize,
    /// Prompt tokens, when the server reports usage.
    pub input_tokens: Option<u64>,
    /// The model that answered, as the stream names it.
    pub response_model: Option<String>,
    /// The full answer; store it as the reference when the canary has none.
    pub answer: String,
    /// First-token entropy from the top logprobs, with bounds.
    pub tle: TopKEntropy,
    /// Vocabulary size used for the TLE upper bound.
    pub vocab_size: usize,
    /// RCI against the reference; `None` when there was no reference.
    pub rci: Option<Rci>,
    /// RCI weights as configured (before renormalisation for a missing semantic part).
    pub weights: RciWeights,
}

impl CanaryResult {
    /// Adds a BERTScore F1 for the answer and recomputes RCI with the configured weights.
    pub fn set_semantic_f1(&mut self, canary_id: &str, f1: f64) -> Result<(), CanaryError> {
        let Some(rci) = &self.rci else {
            return Err(CanaryError::Config {
                field: "semantic_f1",
                value: f1.to_string(),
                reason: format!("canary {canary_id} has no reference yet, so there is no RCI to complete"),
            });
        };
        let parts = RciParts { semantic_f1: Some(f1), ..rci.parts };
        let signal = |source| CanaryError::Signal { canary: canary_id.to_owned(), what: "RCI", source };
        self.rci = Some(consistency_decay_index(parts, self.weights).map_err(signal)?);
        Ok(())
    }

    /// The probe's samples, each labelled `canary=<canary_id>`.
    pub fn samples(&self, ts_ms: i64, canary_id: &str) -> Vec<Sample> {
        let labels: BTreeMap<String, String> = [("canary".to_owned(), canary_id.to_owned())].into();
        let sample = |signal: &str, value: f64| Sample {
            ts_ms,
            signal: signal.to_owned(),
            labels: labels.clone(),
            value,
        };
        let mut out = vec![
            sample(catalogue::TLE_BITS.name, self.tle.entropy_bits),
            sample(catalogue::TLE_BITS_UPPER.name, self.tle.upper_bits),
        ];
        if let Some(rci) = &self.rci {
            out.push(sample(catalogue::RCI.name, rci.value));
            out.push(sample(catalogue::RCI_BLEU.name, rci.parts.bleu));
            out.push(sample(catalogue::RCI_REPETITION_RATIO.name, rci.parts.repetition_ratio));
            if let Some(f1) = rci.parts.semantic_f1 {
                out.push(sample(catalogue::RCI_BERTSCORE_F1.name, f1));
            }
        }
        out.push(sample(catalogue::CANARY_TTFT_SECONDS.name, self.ttft_s));
        if let Some(tpot) = self.tpot_s {
            out.push(sample(catalogue::CANARY_TPOT_SECONDS.name, tpot));
        }
        out.push(sample(catalogue::CANARY_E2E_SECONDS.name, self.e2e_s));
        out.push(sample(catalogue::CANARY_TOKENS.name, self.tokens as f64));
        out
    }
}

// ------------------------------------------------------------ wire format

#[derive(Deserialize)]
struct ModelList {
    #[serde(default)]
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    #[serde(default)]
    id: String,
    #[serde(default)]
    meta: Option<ModelMeta>,
}

#[derive(Deserialize)]
struct ModelMeta {
    #[serde(default)]
    n_vocab: Option<usize>,
}

impl Logprobs {
    /// Number of tokens this chunk's logprobs describe.
    fn token_count(&self) -> usize {
        match (&self.content, &self.tokens, &self.top_logprobs) {
            (Some(content), _, _) => content.len(),
            (None, Some(tokens), _) => tokens.len(),
            (None, None, Some(top)) => top.len(),
            (None, None, None) => 0,
        }
    }

    /// The top logprobs of this chunk's first token, if it lists any.
    fn first_top(&self) -> Option<Vec<f64>> {
        let values: Vec<f64> = if let Some(content) = &self.content {
            content.first()?.top_logprobs.iter().filter_map(|t| t.logprob).collect()
        } else {
            self.top_logprobs.as_ref()?.first()?.as_ref()?.values().filter_map(|&v| v).collect()
        };
        (!values.is_empty()).then_some(values)
    }
}

// ------------------------------------------------------------ the probe

/// An error and its causes on one line: reqwest's own message leaves out why (e.g. connection refused).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

fn transport_error(url: &str, timeout: Duration, e: reqwest::Error) -> CanaryError {
    if e.is_timeout() {
        CanaryError::Timeout { url: url.to_owned(), timeout }
    } else {
        CanaryError::Request { url: url.to_owned(), detail: error_chain(&e), source: e }
    }
}

async fn check_status(url: &str, response: reqwest::Response) -> Result<reqwest::Response, CanaryError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let mut body = response.text().await.unwrap_or_default();
    if body.len() > MAX_ERROR_BODY {
        let mut cut = MAX_ERROR_BODY;
        while !body.is_char_boundary(cut) {
            cut -= 1;
        }
        body.truncate(cut);
        body.push('…');
    }
    let hint = match status.as_u16() {
        401 | 403 => "set api_key in the canary target",
        404 => "check that base_url ends in /v1 and the server exposes the OpenAI API",
        400 | 422 => "the server rejected the request; check the model name and that it supports logprobs",
        429 | 503 => "the server is overloaded or still loading; the next probe retries",
        _ => "see the server's log",
    };
    Err(CanaryError::Status { url: url.to_owned(), status: status.as_u16(), body, hint })
}

fn request_body(target: &CanaryTarget, canary: &Canary) -> serde_json::Value {
    let mut body = serde_json::json!({
        "model": target.model,
        "max_tokens": target.max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    if canary.chat {
        body["messages"] = serde_json::json!([{ "role": "user", "content": canary.prompt }]);
        body["logprobs"] = serde_json::json!(true);
        body["top_logprobs"] = serde_json::json!(TOP_LOGPROBS);
    } else {
        body["prompt"] = serde_json::json!(canary.prompt);
        // The completions API takes the number of alternatives in `logprobs` itself.
        body["logprobs"] = serde_json::json!(TOP_LOGPROBS);
    }
    body
}

fn server_message(error: &serde_json::Value) -> String {
    match error {
        serde_json::Value::String(s) => s.clone(),
        other => {
            other.get("message").and_then(|m| m.as_str()).map_or_else(|| other.to_string(), str::to_owned)
        }
    }
}

/// What one SSE `data` payload of a completion stream meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// `[DONE]`: the stream is complete.
    Done,
    /// The first chunk with a token (text or logprobs).
    FirstToken,
    /// Anything else worth reading on.
    More,
}

/// Why a stream cannot be read on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamIssue {
    /// Not an OpenAI-style completion chunk, or too long; the reason says which.
    Malformed(String),
    /// The server sent an error object in the stream.
    ServerError(String),
}

/// The state of a completion stream read so far: the answer, the first token's top
/// logprobs and the token counts. Pure (no clock, no I/O): [`probe`] times the events.
#[derive(Debug, Default)]
pub struct StreamState {
    /// Top logprobs of the first token, once seen.
    pub first_top: Option<Vec<f64>>,
    /// The answer so far.
    pub answer: String,
    /// Tokens counted from logprobs.
    pub logprob_tokens: usize,
    /// Chunks that carried text.
    pub content_chunks: usize,
    /// completion_tokens from a usage chunk.
    pub usage_tokens: Option<u64>,
    /// prompt_tokens from a usage chunk.
    pub usage_prompt_tokens: Option<u64>,
    /// The model the first chunk that names one names.
    pub response_model: Option<String>,
    /// `[DONE]` was seen.
    pub done: bool,
    /// A token was seen.
    seen_token: bool,
}

impl StreamState {
    /// Reads one SSE `data` payload, feeding new text to `rci` when given.
    pub fn on_data(&mut self, data: &str, mut rci: Option<&mut StreamingRci>) -> Result<Event, StreamIssue> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(Event::Done);
        }
        if data.is_empty() {
            return Ok(Event::More);
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| StreamIssue::Malformed(format!("a data line is not a completion chunk ({e})")))?;
        if let Some(error) = &chunk.error {
            return Err(StreamIssue::ServerError(server_message(error)));
        }
        if self.response_model.is_none() {
            self.response_model = chunk.model.clone().filter(|m| !m.is_empty());
        }
        if let Some(usage) = &chunk.usage {
            if let Some(n) = usage.completion_tokens {
                self.usage_tokens = Some(n);
            }
            if let Some(n) = usage.prompt_tokens {
                self.usage_prompt_tokens = Some(n);
            }
        }
        let mut first = false;
        for choice in chunk.choices.iter().filter(|c| c.index == 0) {
            let text = choice.new_text().unwrap_or("");
            let n_logprobs = choice.logprobs.as_ref().map_or(0, Logprobs::token_count);
            if text.is_empty() && n_logprobs == 0 {
                continue;
            }
            if !self.seen_token {
                self.seen_token = true;
                first = true;
            }
            if self.first_top.is_none() {
                self.first_top = choice.logprobs.as_ref().and_then(Logprobs::first_top);
            }
            self.logprob_tokens += n_logprobs;
            if !text.is_empty() {
                self.content_chunks += 1;
                if self.answer.len() + text.len() > MAX_ANSWER_BYTES {
                    return Err(StreamIssue::Malformed(format!(
                        "the answer exceeds {MAX_ANSWER_BYTES} bytes; lower max_tokens"
                    )));
                }
                self.answer.push_str(text);
                if let Some(rci) = rci.as_deref_mut() {
                    rci.push_token(text);
                }
            }
        }
        Ok(if first { Event::FirstToken } else { Event::More })
    }
}

/// Probes `target` with `canary` and measures latency, TLE and RCI.
///
/// `reference` is the prepared reference answer; when `None`, the canary's own
/// `reference` (if any) is prepared and used. Without either, `rci` is `None` and
/// the caller should keep `answer` as the reference for later probes. The
/// vocabulary size is resolved before the timed request, so discovery never
/// inflates TTFT.
pub async fn probe(
    client: &reqwest::Client,
    target: &CanaryTarget,
    canary: &Canary,
    reference: Option<Arc<BleuReference>>,
    weights: RciWeights,
) -> Result<CanaryResult, CanaryError> {
    target.validate()?;
    canary.validate()?;
    let vocab_size = target.vocab_size(client).await?;
    let reference = match reference {
        Some(r) => Some(r),
        None => canary.bleu_reference()?,
    };
    let mut rci = reference.map(|r| StreamingRci::new(r, weights));
    let url = target.endpoint(if canary.chat { "chat/completions" } else { "completions" });
    let body = request_body(target, canary);

    // Timed from the attempt that answered: a retry after a stale connection is not latency.
    let (response, started) = crate::http::send_retrying_stale(target.request(client.post(&url).json(&body)))
        .await
        .map_err(|e| transport_error(&url, target.timeout, e))?;
    let response = check_status(&url, response).await?;
    let mut events = response.bytes_stream().eventsource();

    let mut first_token_at: Option<Instant> = None;
    let mut stream = StreamState::default();
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| match e {
            EventStreamError::Transport(e) => transport_error(&url, target.timeout, e),
            other => CanaryError::Stream { url: url.clone(), reason: other.to_string() },
        })?;
        match stream.on_data(&event.data, rci.as_mut()) {
            Ok(Event::Done) => break,
            Ok(Event::FirstToken) => {
                first_token_at.get_or_insert_with(Instant::now);
            }
            Ok(Event::More) => {}
            Err(StreamIssue::Malformed(reason)) => return Err(CanaryError::Stream { url, reason }),
            Err(StreamIssue::ServerError(message)) => return Err(CanaryError::Server { url, message }),
        }
    }
    let finished = Instant::now();
    let StreamState {
        first_top,
        answer,
        logprob_tokens,
        content_chunks,
        usage_tokens,
        usage_prompt_tokens,
        response_model,
        done,
        ..
    } = stream;
    if !done && first_token_at.is_none() {
        return Err(CanaryError::Stream {
            url,
            reason: "the stream ended before any chunk or [DONE]".into(),
        });
    }

    let tokens = match usage_tokens {
        Some(n) if n > 0 => n as usize,
        _ if logprob_tokens > 0 => logprob_tokens,
        _ => content_chunks,
    };
    let Some(first) = first_token_at.filter(|_| tokens > 0) else {
        return Err(CanaryError::NoTokens { url, canary: canary.id.clone() });
    };
    let top =
        first_top.ok_or_else(|| CanaryError::NoLogprobs { url: url.clone(), canary: canary.id.clone() })?;
    let signal = |what, source| CanaryError::Signal { canary: canary.id.clone(), what, source };
    let tle = first_token_entropy_from_top_logprobs(&top, vocab_size)
        .map_err(|e| signal("TLE from top_logprobs", e))?;
    let rci = match rci.as_mut() {
        Some(r) => Some(r.finish(None).map_err(|e| signal("RCI", e))?),
        None => None,
    };

    let ttft_s = first.duration_since(started).as_secs_f64();
    let e2e_s = finished.duration_since(started).as_secs_f64();
    let tpot_s = (tokens > 1).then(|| (e2e_s - ttft_s).max(0.0) / (tokens - 1) as f64);
    Ok(CanaryResult {
        ttft_s,
        tpot_s,
        e2e_s,
        tokens,
        input_tokens: usage_prompt_tokens,
        response_model,
        answer,
        tle,
        vocab_size,
        rci,
        weights,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_unknown_fields() {
        let t: CanaryTarget = serde_json::from_str(
            r#"{"base_url": "http://127.0.0.1:18080/v1", "model": "m", "timeout": "5s"}"#,
        )
        .unwrap();
        assert_eq!(t.max_tokens, 64);
        assert_eq!(t.timeout, Duration::from_secs(5));
        assert!(t.validate().is_ok());
        let err = serde_json::from_str::<CanaryTarget>(r#"{"base_url": "x", "model": "m", "modle": 1}"#)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("modle"), "{err}");
        let c: Canary = serde_json::from_str(r#"{"id": "a", "prompt": "p"}"#).unwrap();
        assert!(c.chat && c.reference.is_none());
    }

    #[test]
    fn https_and_bad_values_are_rejected_with_a_fix() {
        let mut t = CanaryTarget::new("https://api.example/v1", "m");
        let msg = t.validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("TLS") && msg.contains("base_url"), "{msg}");
        t.base_url = "not a url".into();
        assert!(t.validate().is_err());
        t.base_url = "http://127.0.0.1:1/v1".into();
        t.max_tokens = 0;
        assert!(t.validate().err().map(|e| e.to_string()).unwrap_or_default().contains("max_tokens"));
        let debug = format!("{:?}", CanaryTarget { api_key: Some("sk-secret".into()), ..t });
        assert!(!debug.contains("sk-secret"), "{debug}");
    }

    #[test]
    fn both_logprob_layouts_give_the_first_top() {
        let chat: Chunk = serde_json::from_str(
            r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[
                {"id":1,"token":"Hi","bytes":[72,105],"logprob":-0.1,
                 "top_logprobs":[{"token":"Hi","logprob":-0.1},{"token":"Hello","logprob":-2.5}]}]}}]}"#,
        )
        .unwrap();
        let lp = chat.choices[0].logprobs.as_ref().unwrap();
        assert_eq!(lp.token_count(), 1);
        assert_eq!(lp.first_top().unwrap(), vec![-0.1, -2.5]);
        let legacy: Chunk = serde_json::from_str(
            r#"{"choices":[{"index":0,"text":" Paris","logprobs":{"tokens":[" Paris"],"token_logprobs":[-0.01],
                "top_logprobs":[{" Paris":-0.01," Lyon":-5.0}],"text_offset":[0]}}]}"#,
        )
        .unwrap();
        let lp = legacy.choices[0].logprobs.as_ref().unwrap();
        let mut top = lp.first_top().unwrap();
        top.sort_by(f64::total_cmp);
        assert_eq!(top, vec![-5.0, -0.01]);
    }

    #[test]
    fn samples_are_labelled_and_complete() {
        let tle = first_token_entropy_from_top_logprobs(&[-0.1, -2.5], 1000).unwrap();
        let parts = RciParts { bleu: 0.5, semantic_f1: None, repetition_ratio: 0.0 };
        let rci = consistency_decay_index(parts, RciWeights::default()).unwrap();
        let mut r = CanaryResult {
            ttft_s: 0.02,
            tpot_s: Some(0.005),
            e2e_s: 0.3,
            tokens: 57,
            input_tokens: Some(12),
            response_model: Some("m".into()),
            answer: "x".into(),
            tle,
            vocab_size: 1000,
            rci: Some(rci),
            weights: RciWeights::default(),
        };
        let names: Vec<String> = r.samples(1, "c1").into_iter().map(|s| s.signal).collect();
        assert_eq!(
            names,
            [
                "tle_bits",
                "tle_bits_upper",
                "rci",
                "rci_bleu",
                "rci_repetition_ratio",
                "canary_ttft_seconds",
                "canary_tpot_seconds",
                "canary_e2e_seconds",
                "canary_tokens"
            ]
        );
        assert!(r.samples(1, "c1").iter().all(|s| s.labels.get("canary").map(String::as_str) == Some("c1")));
        r.set_semantic_f1("c1", 0.9).unwrap();
        let rci = r.rci.unwrap();
        assert!((rci.value - (0.4 * 0.5 + 0.4 * 0.1)).abs() < 1e-12, "{rci:?}");
        assert!(r.samples(1, "c1").iter().any(|s| s.signal == "rci_bertscore_f1" && s.value == 0.9));
    }
}

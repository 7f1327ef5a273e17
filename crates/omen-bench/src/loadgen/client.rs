//! One streamed request to an OpenAI-compatible server, timed from the client:
//! TTFT, the gaps between content chunks (ITL), end-to-end latency and the
//! server's token counts. The SSE framing is eventsource-stream's and the chunk
//! format omen_sources::openai_stream's, as in the canary prober; that prober insists
//! on logprobs and scores answers, so the bench keeps its own lighter reader loop.

use std::time::{Duration, Instant};

use eventsource_stream::{EventStreamError, Eventsource as _};
use futures_util::StreamExt as _;
use serde::Deserialize;

use omen_sources::openai_stream::{Choice, Chunk};

use super::workflow::Api;

/// Largest answer accepted, in bytes.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// One conversation turn of a session's history.
#[derive(Debug, Clone)]
pub struct Turn {
    /// What the user said.
    pub user: String,
    /// What the model answered.
    pub assistant: String,
}

/// What one request measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Request sent -> first content, seconds.
    pub ttft_s: f64,
    /// Request sent -> end of stream, seconds.
    pub e2e_s: f64,
    /// Gaps between successive content chunks, seconds.
    pub itl_s: Vec<f64>,
    /// Prompt tokens (server's usage count, else `None`).
    pub prompt_tokens: Option<u64>,
    /// Output tokens (server's usage count, else the number of content chunks).
    pub output_tokens: u64,
    /// The answer text.
    pub answer: String,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Connection or transport failure.
    #[error("request to {url} failed: {detail}; check that the server is running and --endpoint is right")]
    Transport {
        /// The URL.
        url: String,
        /// The error and its causes.
        detail: String,
    },
    /// The state's timeout expired.
    #[error("request to {url} timed out after {timeout:?}; raise the state's timeout or lower max_tokens")]
    Timeout {
        /// The URL.
        url: String,
        /// The timeout.
        timeout: Duration,
    },
    /// HTTP error status.
    #[error("request to {url} got HTTP {status}: {body}; {}", status_hint(*.status))]
    Status {
        /// The URL.
        url: String,
        /// Status code.
        status: u16,
        /// Start of the body.
        body: String,
    },
    /// The stream finished without any content (e.g. the model stopped at once); vLLM's
    /// benchmark counts these as failed too, since they have no TTFT.
    #[error("stream from {url} finished without any content; the model may have stopped at once (set ignore_eos: true for fixed-length answers) or the prompt may not fit the context")]
    Empty {
        /// The URL.
        url: String,
    },
    /// The stream was not OpenAI-style SSE, or reported an error.
    #[error("stream from {url}: {reason}")]
    Stream {
        /// The URL.
        url: String,
        /// What was wrong.
        reason: String,
    },
}

/// What an HTTP error status from an OpenAI-compatible server usually means, and what to do.
fn status_hint(status: u16) -> &'static str {
    match status {
        401 | 403 => "pass --api-key (or set OMEN_BENCH_API_KEY)",
        404 => "check that --endpoint is the API root ending in /v1 (e.g. http://127.0.0.1:8000/v1) and the model name",
        400 | 422 => "the server rejected the request; check the model name, max_tokens and the context length",
        429 | 503 => "the server is overloaded or still loading; lower the rate or wait for it",
        _ => "see the server's log",
    }
}

impl RequestError {
    /// Short class for the report's error counts: `transport`, `timeout`, `http_<code>`, `stream`.
    pub fn kind(&self) -> String {
        match self {
            RequestError::Transport { .. } => "transport".into(),
            RequestError::Timeout { .. } => "timeout".into(),
            RequestError::Status { status, .. } => format!("http_{status}"),
            RequestError::Stream { .. } => "stream".into(),
            RequestError::Empty { .. } => "empty_answer".into(),
        }
    }
}

/// A request to send: endpoint, model, history and the new user message.
#[derive(Debug)]
pub struct RequestSpec<'a> {
    /// API root including `/v1`.
    pub base_url: &'a str,
    /// Chat or completions.
    pub api: Api,
    /// Model name.
    pub model: &'a str,
    /// Bearer token.
    pub api_key: Option<&'a str>,
    /// Earlier turns of the session.
    pub history: &'a [Turn],
    /// The new user message.
    pub prompt: &'a str,
    /// Most output tokens.
    pub max_tokens: u32,
    /// Sampling temperature.
    pub temperature: f64,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// Send `ignore_eos: true`.
    pub ignore_eos: bool,
    /// More body fields (the workflow's `extra_body`).
    pub extra_body: &'a serde_json::Map<String, serde_json::Value>,
}

/// The completions-API prompt for a history and a new message.
pub fn completion_prompt(history: &[Turn], prompt: &str) -> String {
    let mut text = String::new();
    for t in history {
        text.push_str(&format!("User: {}\nAssistant: {}\n", t.user, t.assistant));
    }
    text.push_str(&format!("User: {prompt}\nAssistant:"));
    text
}

/// The URL and JSON body of `spec`'s request.
pub fn body(spec: &RequestSpec<'_>) -> (String, serde_json::Value) {
    let mut body = serde_json::json!({
        "model": spec.model,
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    if spec.ignore_eos {
        body["ignore_eos"] = serde_json::json!(true);
    }
    for (k, v) in spec.extra_body {
        body[k] = v.clone();
    }
    let root = spec.base_url.trim_end_matches('/');
    match spec.api {
        Api::Chat => {
            let mut messages = Vec::new();
            for t in spec.history {
                messages.push(serde_json::json!({"role": "user", "content": t.user}));
                messages.push(serde_json::json!({"role": "assistant", "content": t.assistant}));
            }
            messages.push(serde_json::json!({"role": "user", "content": spec.prompt}));
            body["messages"] = serde_json::Value::Array(messages);
            (format!("{root}/chat/completions"), body)
        }
        Api::Completions => {
            body["prompt"] = serde_json::json!(completion_prompt(spec.history, spec.prompt));
            (format!("{root}/completions"), body)
        }
    }
}

fn transport(url: &str, timeout: Duration, e: reqwest::Error) -> RequestError {
    if e.is_timeout() {
        RequestError::Timeout { url: url.to_owned(), timeout }
    } else {
        RequestError::Transport { url: url.to_owned(), detail: omen_sources::error_chain(&e) }
    }
}

/// POSTs `body` to `url` and reads the whole stream, timing it; `on_chunk` gets each piece
/// of content with its time since the request was sent, in ms.
pub async fn send_body(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
    timeout: Duration,
    api_key: Option<&str>,
    on_chunk: &mut (dyn FnMut(f64, &str) + Send),
) -> Result<Measured, RequestError> {
    let url = url.to_owned();
    let mut builder = client.post(&url).json(body).timeout(timeout);
    if let Some(key) = api_key {
        builder = builder.bearer_auth(key);
    }
    let started = Instant::now();
    let response = builder.send().await.map_err(|e| transport(&url, timeout, e))?;
    let status = response.status();
    if !status.is_success() {
        let mut text = response.text().await.unwrap_or_default();
        if text.len() > 512 {
            let mut cut = 512;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        return Err(RequestError::Status { url, status: status.as_u16(), body: text });
    }
    let mut events = response.bytes_stream().eventsource();
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut itl_s = Vec::new();
    let mut answer = String::new();
    let mut chunks = 0u64;
    let (mut prompt_tokens, mut completion_tokens) = (None, None);
    let stream_err = |reason: String| RequestError::Stream { url: url.clone(), reason };
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| match e {
            EventStreamError::Transport(e) => transport(&url, timeout, e),
            other => stream_err(format!("{other}; the server must speak OpenAI-style SSE")),
        })?;
        let data = event.data.trim();
        if data == "[DONE]" {
            break;
        }
        if data.is_empty() {
            continue;
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| stream_err(format!("a data line is not a completion chunk ({e})")))?;
        if let Some(error) = chunk.error {
            return Err(stream_err(format!("the server reported an error mid-stream: {error}")));
        }
        if let Some(u) = chunk.usage {
            prompt_tokens = u.prompt_tokens.or(prompt_tokens);
            completion_tokens = u.completion_tokens.or(completion_tokens);
        }
        let text: String = chunk.choices.iter().filter_map(Choice::new_text).collect();
        if text.is_empty() {
            continue;
        }
        let now = Instant::now();
        if let Some(prev) = last {
            itl_s.push(now.duration_since(prev).as_secs_f64());
        }
        first.get_or_insert(now);
        last = Some(now);
        chunks += 1;
        on_chunk(now.duration_since(started).as_secs_f64() * 1e3, &text);
        if answer.len() + text.len() > MAX_ANSWER_BYTES {
            return Err(stream_err(format!("the answer exceeds {MAX_ANSWER_BYTES} bytes; lower max_tokens")));
        }
        answer.push_str(&text);
    }
    let finished = Instant::now();
    let Some(first) = first else {
        return Err(RequestError::Empty { url });
    };
    Ok(Measured {
        ttft_s: first.duration_since(started).as_secs_f64(),
        e2e_s: finished.duration_since(started).as_secs_f64(),
        itl_s,
        prompt_tokens,
        output_tokens: completion_tokens.filter(|&n| n > 0).unwrap_or(chunks),
        answer,
    })
}

/// The first model id `GET {base_url}/models` lists.
pub async fn first_model(client: &reqwest::Client, base_url: &str) -> Result<String, RequestError> {
    #[derive(Deserialize)]
    struct List {
        data: Vec<Entry>,
    }
    #[derive(Deserialize)]
    struct Entry {
        id: String,
    }
    let url = format!("{}/models", base_url.trim_end_matches('/'));
    let timeout = Duration::from_secs(10);
    let r = client.get(&url).timeout(timeout).send().await.map_err(|e| transport(&url, timeout, e))?;
    if !r.status().is_success() {
        return Err(RequestError::Status { url, status: r.status().as_u16(), body: String::new() });
    }
    let list: List = r.json().await.map_err(|e| RequestError::Stream {
        url: url.clone(),
        reason: format!("not an OpenAI model list ({e}); pass --model"),
    })?;
    list.data
        .into_iter()
        .next()
        .map(|e| e.id)
        .ok_or(RequestError::Stream { url, reason: "the server lists no models; pass --model".into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_goes_into_both_layouts() {
        let history = [Turn { user: "hi".into(), assistant: "hello".into() }];
        let mut spec = RequestSpec {
            base_url: "http://127.0.0.1:1/v1/",
            api: Api::Chat,
            model: "m",
            api_key: None,
            history: &history,
            prompt: "why?",
            max_tokens: 4,
            temperature: 0.0,
            timeout: Duration::from_secs(1),
            ignore_eos: true,
            extra_body: &serde_json::json!({"top_p": 0.5}).as_object().unwrap().clone(),
        };
        let (url, b) = body(&spec);
        assert_eq!(url, "http://127.0.0.1:1/v1/chat/completions");
        let roles: Vec<&str> =
            b["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "assistant", "user"]);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["top_p"], 0.5);
        spec.api = Api::Completions;
        let (url, b) = body(&spec);
        assert!(url.ends_with("/v1/completions"));
        assert_eq!(b["prompt"], "User: hi\nAssistant: hello\nUser: why?\nAssistant:");
    }
}

//! The dialogue workflow a bench run follows: states with prompts, transitions
//! with probabilities, per-state timeouts, retries and QPS caps, the arrival
//! process and the run's bounds. Loaded from YAML and checked as a whole.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// The reserved terminal state: a transition to it ends the session.
pub const END: &str = "end";

/// Request body fields the bench sets itself, so `extra_body` may not.
pub const RESERVED_BODY_FIELDS: [&str; 8] =
    ["model", "messages", "prompt", "stream", "stream_options", "max_tokens", "temperature", "ignore_eos"];

/// What a workflow file is, for its errors.
const YAML: crate::yaml::Kind = crate::yaml::Kind { name: "workflow", example: "deploy/workflows/chat.yaml" };

/// A workflow file could not be used; names the input, the problem and the fix.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    /// The file could not be read or does not match the schema.
    #[error(transparent)]
    Yaml(#[from] crate::yaml::YamlError),
    /// A value is out of range or inconsistent with the rest.
    #[error("workflow {path}: {field}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// Field path, e.g. `states.greet.transitions`.
        field: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
}

/// Which OpenAI API the requests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `POST /chat/completions` with the session's messages.
    Chat,
    /// `POST /completions` with the session's history as one prompt.
    Completions,
}

/// What to do when a session's context would exceed `max_context_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextPolicy {
    /// Drop the whole history and go on with the new prompt alone.
    Reset,
    /// Drop the oldest turns until the request fits.
    Truncate,
}

fn default_max_tokens() -> u32 {
    64
}
fn default_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_retry_backoff() -> Duration {
    Duration::from_millis(500)
}
fn default_change_every() -> Duration {
    Duration::from_secs(10)
}
fn default_concurrency() -> usize {
    8
}
fn default_ratio() -> f64 {
    3.0
}
fn default_baseline_requests() -> usize {
    5
}

/// Session arrivals: Poisson with a rate re-drawn from a gamma distribution.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArrivalConfig {
    /// Mean rate of new sessions per second.
    pub rate: f64,
    /// Gamma shape k of the rate changes (mean stays `rate`, CV = 1/sqrt(k)); absent: constant rate.
    #[serde(default)]
    pub rate_shape: Option<f64>,
    /// How often the rate is re-drawn (default 10s).
    #[serde(default = "default_change_every", with = "humantime_serde")]
    pub change_every: Duration,
}

/// One weighted edge of the dialogue graph.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transition {
    /// Target state, or `end`.
    pub to: String,
    /// Probability of taking this edge; a state's edges sum to 1.
    pub probability: f64,
}

/// One dialogue state: what the user says and where the dialogue goes next.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// User messages; one is picked at random each visit.
    pub prompts: Vec<String>,
    /// Reference answers, one per prompt in the same order; when given, each answer is
    /// scored by sentence BLEU against its reference (the report's `mean_bleu`).
    #[serde(default)]
    pub references: Vec<String>,
    /// Most output tokens (default: the workflow's `max_tokens`).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Whole-request timeout including the stream (default 60s).
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Extra attempts after a failed one (default 0).
    #[serde(default)]
    pub retries: u32,
    /// Wait before the first retry, doubled on each further one (default 500ms).
    #[serde(default = "default_retry_backoff", with = "humantime_serde")]
    pub retry_backoff: Duration,
    /// Most requests per second from this state across all sessions; absent: no cap.
    #[serde(default)]
    pub qps: Option<f64>,
    /// Pause after the answer before the next turn (default 0s).
    #[serde(default, with = "humantime_serde")]
    pub think_time: Duration,
    /// Outgoing edges; empty means the session ends here.
    #[serde(default)]
    pub transitions: Vec<Transition>,
}

/// Back-off when round trips grow: TTFT above `ratio` x the baseline slows the load.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RttBackoff {
    /// TTFT above this multiple of the baseline halves the load (default 3).
    #[serde(default = "default_ratio")]
    pub ratio: f64,
    /// The baseline is the median TTFT of this many first successful requests (default 5).
    #[serde(default = "default_baseline_requests")]
    pub baseline_requests: usize,
}

/// A whole bench workflow.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workflow {
    /// Name shown in the report.
    pub name: String,
    /// `chat` (default) or `completions`.
    #[serde(default = "default_api")]
    pub api: Api,
    /// Model name sent; absent: `--model`, else the first model the endpoint lists.
    #[serde(default)]
    pub model: Option<String>,
    /// Default most output tokens per request (default 64).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Sampling temperature (default 0: greedy).
    #[serde(default)]
    pub temperature: f64,
    /// Ask the server to ignore end-of-sequence so every answer has max_tokens tokens
    /// (vLLM and llama.cpp honour `ignore_eos`; default false).
    #[serde(default)]
    pub ignore_eos: bool,
    /// Most requests in flight at once (default 8).
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Seed of every random choice (arrivals, prompts, transitions).
    #[serde(default)]
    pub seed: u64,
    /// More fields for every request body, e.g. `{top_p: 0.9, presence_penalty: 0.5}`.
    #[serde(default)]
    pub extra_body: serde_json::Map<String, serde_json::Value>,
    /// Session arrivals.
    pub arrival: ArrivalConfig,
    /// Largest context (history + prompt + max_tokens) a request may carry; absent: unbounded.
    #[serde(default)]
    pub max_context_tokens: Option<u32>,
    /// What to do when the context would exceed `max_context_tokens` (default reset).
    #[serde(default = "default_policy")]
    pub context_policy: ContextPolicy,
    /// Round-trip back-off; absent: none.
    #[serde(default)]
    pub rtt_backoff: Option<RttBackoff>,
    /// Stop after this many requests (turns, not counting retries).
    #[serde(default)]
    pub max_requests: Option<u64>,
    /// Stop starting requests after this long, e.g. `60s`.
    #[serde(default, with = "humantime_serde")]
    pub duration: Option<Duration>,
    /// The state each session starts in.
    pub start: String,
    /// The dialogue states by name (`end` is reserved).
    pub states: BTreeMap<String, State>,
}

fn default_api() -> Api {
    Api::Chat
}
fn default_policy() -> ContextPolicy {
    ContextPolicy::Reset
}

impl Workflow {
    /// Reads and checks a workflow file.
    pub fn load(path: &Path) -> Result<Self, WorkflowError> {
        let (text, name) = crate::yaml::read(path, YAML)?;
        Self::from_yaml(&text, &name)
    }

    /// Parses and checks a workflow; `path` only names the input in errors.
    pub fn from_yaml(text: &str, path: &str) -> Result<Self, WorkflowError> {
        let wf: Workflow = crate::yaml::parse(text, path, YAML)?;
        wf.validate(path)?;
        Ok(wf)
    }

    /// Checks ranges and the graph: known targets, probabilities summing to 1, a bound on the run.
    pub fn validate(&self, path: &str) -> Result<(), WorkflowError> {
        let bad =
            |field: String, reason: String| WorkflowError::Invalid { path: path.to_owned(), field, reason };
        if self.max_requests.is_none() && self.duration.is_none() {
            return Err(bad(
                "max_requests".into(),
                "the run is unbounded; set max_requests and/or duration (or pass --max-requests/--duration)"
                    .into(),
            ));
        }
        if self.max_requests == Some(0) {
            return Err(bad("max_requests".into(), "must be at least 1".into()));
        }
        if self.duration.is_some_and(|d| d.is_zero()) {
            return Err(bad("duration".into(), "must be positive, e.g. 60s".into()));
        }
        if self.max_tokens == 0 {
            return Err(bad("max_tokens".into(), "must be at least 1".into()));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(bad("temperature".into(), format!("{} must be >= 0", self.temperature)));
        }
        if self.concurrency == 0 {
            return Err(bad("concurrency".into(), "must be at least 1".into()));
        }
        for key in self.extra_body.keys() {
            if RESERVED_BODY_FIELDS.contains(&key.as_str()) {
                return Err(bad(
                    format!("extra_body.{key}"),
                    "is set by the bench itself; use the workflow's own field (model, max_tokens, temperature, ignore_eos) instead".into(),
                ));
            }
        }
        let a = &self.arrival;
        if !(a.rate.is_finite() && a.rate > 0.0) {
            return Err(bad("arrival.rate".into(), format!("{} must be a positive sessions/s", a.rate)));
        }
        if let Some(k) = a.rate_shape {
            if !(k.is_finite() && k > 0.0) {
                return Err(bad("arrival.rate_shape".into(), format!("{k} must be > 0 (or left out)")));
            }
        }
        if a.change_every.is_zero() {
            return Err(bad("arrival.change_every".into(), "must be positive, e.g. 10s".into()));
        }
        if let Some(b) = &self.rtt_backoff {
            if !(b.ratio.is_finite() && b.ratio > 1.0) {
                return Err(bad("rtt_backoff.ratio".into(), format!("{} must be > 1, e.g. 3", b.ratio)));
            }
            if b.baseline_requests == 0 {
                return Err(bad("rtt_backoff.baseline_requests".into(), "must be at least 1".into()));
            }
        }
        if self.max_context_tokens == Some(0) {
            return Err(bad("max_context_tokens".into(), "must be positive or left out".into()));
        }
        if self.states.is_empty() {
            return Err(bad("states".into(), "no states; define at least the start state".into()));
        }
        if self.states.contains_key(END) {
            return Err(bad(format!("states.{END}"), format!("`{END}` is reserved for the terminal state")));
        }
        if !self.states.contains_key(&self.start) {
            return Err(bad("start".into(), format!("{:?} is not one of the states", self.start)));
        }
        for (name, s) in &self.states {
            let field = |f: &str| format!("states.{name}.{f}");
            if s.prompts.is_empty() || s.prompts.iter().any(|p| p.trim().is_empty()) {
                return Err(bad(field("prompts"), "give at least one non-empty prompt".into()));
            }
            if !s.references.is_empty() && s.references.len() != s.prompts.len() {
                return Err(bad(
                    field("references"),
                    format!(
                        "{} references for {} prompts; give one reference per prompt, in the same order, or none",
                        s.references.len(),
                        s.prompts.len()
                    ),
                ));
            }
            if s.max_tokens == Some(0) {
                return Err(bad(field("max_tokens"), "must be at least 1".into()));
            }
            if s.timeout.is_zero() {
                return Err(bad(field("timeout"), "must be positive, e.g. 30s".into()));
            }
            if let Some(q) = s.qps {
                if !(q.is_finite() && q > 0.0) {
                    return Err(bad(field("qps"), format!("{q} must be positive (or left out)")));
                }
            }
            if let Some(cap) = self.max_context_tokens {
                let mt = s.max_tokens.unwrap_or(self.max_tokens);
                if mt >= cap {
                    return Err(bad(
                        field("max_tokens"),
                        format!("{mt} leaves no room for the prompt within max_context_tokens = {cap}"),
                    ));
                }
            }
            let mut sum = 0.0;
            for (i, t) in s.transitions.iter().enumerate() {
                if t.to != END && !self.states.contains_key(&t.to) {
                    return Err(bad(
                        format!("states.{name}.transitions[{i}].to"),
                        format!("{:?} is not a state; use one of the states or `{END}`", t.to),
                    ));
                }
                if !(t.probability.is_finite() && (0.0..=1.0).contains(&t.probability)) {
                    return Err(bad(
                        format!("states.{name}.transitions[{i}].probability"),
                        format!("{} must be in [0, 1]", t.probability),
                    ));
                }
                sum += t.probability;
            }
            if !s.transitions.is_empty() && (sum - 1.0).abs() > 1e-6 {
                return Err(bad(
                    field("transitions"),
                    format!("probabilities sum to {sum}, not 1; add a transition to `{END}` for the rest"),
                ));
            }
        }
        self.check_graph(path)
    }

    /// The states reachable from `from` over edges of positive probability, `from` included.
    fn reachable_from<'a>(&'a self, from: &'a str) -> std::collections::BTreeSet<&'a str> {
        let mut seen = std::collections::BTreeSet::new();
        let mut todo = vec![from];
        while let Some(name) = todo.pop() {
            if !seen.insert(name) {
                continue;
            }
            if let Some(s) = self.states.get(name) {
                todo.extend(s.transitions.iter().filter(|t| t.probability > 0.0).map(|t| t.to.as_str()));
            }
        }
        seen
    }

    /// Every state is reachable from `start`, and from every state a session can end: a state
    /// nobody visits is a typo, and a cycle without a way out keeps a session going until the
    /// run's budget, which no real dialogue does.
    fn check_graph(&self, path: &str) -> Result<(), WorkflowError> {
        let reachable = self.reachable_from(&self.start);
        if let Some(name) = self.states.keys().find(|n| !reachable.contains(n.as_str())) {
            return Err(WorkflowError::Invalid {
                path: path.to_owned(),
                field: format!("states.{name}"),
                reason: format!(
                    "is unreachable from start state {:?}; add a transition to it or remove it",
                    self.start
                ),
            });
        }
        let ends = |n: &str| n == END || self.states.get(n).is_some_and(|s| s.transitions.is_empty());
        for (name, state) in &self.states {
            let trap = self.reachable_from(name);
            if trap.iter().any(|n| ends(n)) {
                continue;
            }
            // Name a state of the loop itself (one that leads back to itself), not one on the
            // way in: that is where the missing way out belongs. Every trap has one.
            let in_loop = state
                .transitions
                .iter()
                .filter(|t| t.probability > 0.0)
                .any(|t| self.reachable_from(&t.to).contains(name.as_str()));
            if !in_loop {
                continue;
            }
            let states: Vec<&str> = trap.into_iter().collect();
            return Err(WorkflowError::Invalid {
                path: path.to_owned(),
                field: format!("states.{name}.transitions"),
                reason: format!(
                    "a session that reaches {name} never ends: from there it only visits {}; give one of them a transition to `{END}` (even a small probability)",
                    states.join(", ")
                ),
            });
        }
        Ok(())
    }

    /// The next state after `from` for a uniform draw `u` in [0, 1).
    pub fn next_state(&self, from: &str, u: f64) -> &str {
        let Some(state) = self.states.get(from) else { return END };
        let mut acc = 0.0;
        for t in &state.transitions {
            acc += t.probability;
            if u < acc {
                return &t.to;
            }
        }
        state.transitions.last().map_or(END, |t| t.to.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
name: t
max_requests: 10
arrival: { rate: 2.0, rate_shape: 4, change_every: 5s }
start: greet
states:
  greet:
    prompts: ["hi"]
    timeout: 5s
    retries: 2
    qps: 3
    transitions:
      - { to: ask, probability: 0.75 }
      - { to: end, probability: 0.25 }
  ask:
    prompts: ["why?", "how?"]
    max_tokens: 8
"#;

    fn err(yaml: &str) -> String {
        Workflow::from_yaml(yaml, "w.yaml").err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn parses_with_defaults() {
        let wf = Workflow::from_yaml(OK, "w.yaml").unwrap();
        assert_eq!(wf.api, Api::Chat);
        assert_eq!(wf.max_tokens, 64);
        assert_eq!(wf.context_policy, ContextPolicy::Reset);
        let g = &wf.states["greet"];
        assert_eq!((g.timeout, g.retries, g.qps), (Duration::from_secs(5), 2, Some(3.0)));
        assert_eq!(wf.states["ask"].timeout, Duration::from_secs(60));
        assert_eq!(wf.arrival.change_every, Duration::from_secs(5));
        assert_eq!(wf.next_state("greet", 0.0), "ask");
        assert_eq!(wf.next_state("greet", 0.74), "ask");
        assert_eq!(wf.next_state("greet", 0.8), "end");
        assert_eq!(wf.next_state("ask", 0.1), "end");
    }

    #[test]
    fn the_shipped_example_is_valid() {
        let text = include_str!("../../../../deploy/workflows/chat.yaml");
        let wf = Workflow::from_yaml(text, "deploy/workflows/chat.yaml").unwrap();
        assert_eq!(wf.start, "greet");
        assert!(wf.rtt_backoff.is_some() && wf.max_context_tokens.is_some());
        assert_eq!(wf.states["greet"].references.len(), 2);
        let text = include_str!("../../../../deploy/workflows/gate.yaml");
        let gate = Workflow::from_yaml(text, "deploy/workflows/gate.yaml").unwrap();
        assert!(gate.rtt_backoff.is_none() && gate.arrival.rate_shape.is_none() && gate.ignore_eos);
        assert!(gate.states.values().all(|s| s.references.len() == s.prompts.len()));
    }

    #[test]
    fn schema_errors_name_the_field() {
        let e = err(&OK.replace("retries: 2", "retries: two"));
        assert!(e.contains("states.greet.retries") && e.contains("w.yaml"), "{e}");
        let e = err(&OK.replace("qps: 3", "qsp: 3"));
        assert!(e.contains("qsp"), "{e}");
        let e = err(&OK.replace("timeout: 5s", "timeout: soon"));
        assert!(e.contains("states.greet.timeout"), "{e}");
    }

    #[test]
    fn graph_and_range_errors_say_the_fix() {
        let e = err(&OK.replace("probability: 0.25", "probability: 0.2"));
        assert!(e.contains("states.greet.transitions") && e.contains("sum to 0.95"), "{e}");
        let e = err(&OK.replace("to: ask", "to: asks"));
        assert!(e.contains("transitions[0].to") && e.contains("\"asks\""), "{e}");
        let e = err(&OK.replace("start: greet", "start: hello"));
        assert!(e.contains("start") && e.contains("hello"), "{e}");
        let e = err(&OK.replace("max_requests: 10", ""));
        assert!(e.contains("unbounded"), "{e}");
        let e = err(&OK.replace("rate: 2.0", "rate: 0"));
        assert!(e.contains("arrival.rate"), "{e}");
        let e = err(&OK.replace("qps: 3", "qps: -1"));
        assert!(e.contains("states.greet.qps"), "{e}");
        let e = err(&OK.replace("prompts: [\"hi\"]", "prompts: [\"hi\"]\n    references: [\"a\", \"b\"]"));
        assert!(e.contains("states.greet.references") && e.contains("2 references for 1 prompts"), "{e}");
        let e = err(&format!("{OK}extra_body: {{ stream: false }}\n"));
        assert!(e.contains("extra_body.stream") && e.contains("set by the bench"), "{e}");
        let e = err(&OK.replace("prompts: [\"hi\"]", "prompts: []"));
        assert!(e.contains("states.greet.prompts"), "{e}");
        let e = err(&format!("{OK}max_context_tokens: 8\n"));
        assert!(e.contains("max_tokens") && e.contains("max_context_tokens = 8"), "{e}");
        let e = err(&format!("{OK}rtt_backoff: {{ ratio: 0.5 }}\n"));
        assert!(e.contains("rtt_backoff.ratio"), "{e}");
        let e = err(&OK.replace("  ask:\n", "  end:\n"));
        assert!(e.contains("reserved"), "{e}");
    }

    #[test]
    fn unreachable_states_and_cycles_without_exit_are_rejected() {
        let e = err(&format!("{OK}  lost:\n    prompts: [\"?\"]\n"));
        assert!(e.contains("states.lost") && e.contains("unreachable from start state \"greet\""), "{e}");
        let looping = OK.replace(
            "    max_tokens: 8\n",
            "    max_tokens: 8\n    transitions: [{ to: ask, probability: 1.0 }]\n",
        );
        let e = err(&looping);
        assert!(
            e.contains("states.ask.transitions") && e.contains("never ends") && e.contains("`end`"),
            "{e}"
        );
        // The loop is blamed, not the state that leads into it.
        let into = "name: t\nmax_requests: 3\narrival: { rate: 1.0 }\nstart: a\nstates:\n  a:\n    prompts: [x]\n    transitions: [{ to: b, probability: 1.0 }]\n  b:\n    prompts: [y]\n    transitions: [{ to: b, probability: 1.0 }]\n";
        let e = err(into);
        assert!(e.contains("states.b.transitions") && e.contains("only visits b;"), "{e}");
        // An edge of probability 0 is no way out.
        let zero = OK.replace(
            "    max_tokens: 8\n",
            "    max_tokens: 8\n    transitions: [{ to: ask, probability: 1.0 }, { to: end, probability: 0.0 }]\n",
        );
        assert!(err(&zero).contains("never ends"), "{}", err(&zero));
        // A small chance to leave is enough.
        let leaky = OK.replace(
            "    max_tokens: 8\n",
            "    max_tokens: 8\n    transitions: [{ to: ask, probability: 0.99 }, { to: end, probability: 0.01 }]\n",
        );
        assert_eq!(err(&leaky), "");
    }
}

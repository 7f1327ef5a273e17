//! Extension hooks: user code at the three stages of a bench run, without touching omen.
//!
//! - before a request is sent: the hook sees the request and may replace its JSON body;
//! - after each decoded chunk: the hook sees the text and its time since the request;
//! - when the metrics are final: the hook sees the report's summary (no per-request
//!   records) and returns metrics of its own, which go under `omen.hooks` in the report.
//!
//! Built-ins implement [`Hook`]. An external command ([`CommandHook`]) speaks JSON lines
//! over its stdin and stdout: `{"stage": "before_request", "ask", "run", "id", "session",
//! "turn", "state", "body"}` answered by `{"ask", "body": {...}}` (the body to send) or
//! `{"ask"}` (unchanged); `{"stage": "chunk", "run", "id", "attempt", "t_ms", "text"}` with
//! no answer; `{"stage": "finalise", "ask", "report": {...}}` answered by `{"ask",
//! "metrics": {...}}`. Every answer echoes its question's `ask` number, so a stray line can
//! never be taken for another request's answer. A hook that fails, answers garbage or does
//! not answer within its timeout is reported and switched off; the run goes on.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Map, Value};

/// Which request a hook call is about.
#[derive(Debug, Clone, Serialize)]
pub struct RequestContext {
    /// Run of the workload (from 1; with `--repeat`, only kept runs call hooks).
    pub run: u32,
    /// Request sequence number within the run.
    pub id: u64,
    /// Session number.
    pub session: u64,
    /// Turn within the session.
    pub turn: u32,
    /// Workflow state.
    pub state: String,
}

/// A hook call failed; the hook is switched off after it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

/// User code at the three stages of a run. Calls may come from many sessions at once.
pub trait Hook: Send + Sync {
    /// The name under `omen.hooks` in the report.
    fn name(&self) -> &str;
    /// Before a request is sent: may change its body.
    fn before_request(&self, _ctx: &RequestContext, _body: &mut Value) -> Result<(), HookError> {
        Ok(())
    }
    /// After each decoded chunk of attempt `attempt` (from 1; a retry starts its answer
    /// again); must not block (it runs in the stream's read loop).
    fn on_chunk(
        &self,
        _ctx: &RequestContext,
        _attempt: u32,
        _t_ms: f64,
        _text: &str,
    ) -> Result<(), HookError> {
        Ok(())
    }
    /// When the metrics are final: the hook's own metrics.
    fn finalise(&self, _summary: &Value) -> Result<Map<String, Value>, HookError> {
        Ok(Map::new())
    }
}

/// What a hook did in a run, for the report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HookOutcome {
    /// The hook's name.
    pub name: String,
    /// Calls made, by stage.
    pub calls: BTreeMap<&'static str, u64>,
    /// Whether a failure switched it off.
    pub disabled: bool,
    /// The first failure, with its stage.
    pub error: Option<String>,
    /// Metrics it returned at the end.
    pub metrics: Map<String, Value>,
}

/// A hook with its bookkeeping: counts calls, and switches the hook off at its first failure.
pub struct Guarded {
    hook: Box<dyn Hook>,
    /// One before_request or finalise at a time, so the caller after a failure sees the hook off.
    calls: Mutex<()>,
    disabled: AtomicBool,
    before: AtomicU64,
    chunks: AtomicU64,
    error: Mutex<Option<String>>,
}

impl std::fmt::Debug for Guarded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guarded").field("name", &self.hook.name()).finish_non_exhaustive()
    }
}

impl Guarded {
    /// Wraps `hook`.
    pub fn new(hook: Box<dyn Hook>) -> Arc<Self> {
        Arc::new(Self {
            hook,
            calls: Mutex::new(()),
            disabled: AtomicBool::new(false),
            before: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            error: Mutex::new(None),
        })
    }

    fn fail(&self, stage: &str, e: HookError) {
        self.disabled.store(true, Ordering::SeqCst);
        if let Ok(mut slot) = self.error.lock() {
            slot.get_or_insert_with(|| format!("{stage}: {e}"));
        }
        tracing::warn!(hook = self.hook.name(), stage, error = %e, "bench hook failed and is switched off");
    }

    /// Runs the hook's before_request; on failure the body is left as it was.
    pub fn before_request(&self, ctx: &RequestContext, body: &mut Value) {
        let _turn = self.calls.lock();
        if self.disabled.load(Ordering::SeqCst) {
            return;
        }
        self.before.fetch_add(1, Ordering::Relaxed);
        let mut edited = body.clone();
        match self.hook.before_request(ctx, &mut edited) {
            Ok(()) if edited.is_object() => *body = edited,
            Ok(()) => {
                let why =
                    "the body it returned is not a JSON object; return the whole request body as an object";
                self.fail("before_request", HookError(why.into()))
            }
            Err(e) => self.fail("before_request", e),
        }
    }

    /// Runs the hook's on_chunk.
    pub fn on_chunk(&self, ctx: &RequestContext, attempt: u32, t_ms: f64, text: &str) {
        if self.disabled.load(Ordering::Relaxed) {
            return;
        }
        self.chunks.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.hook.on_chunk(ctx, attempt, t_ms, text) {
            self.fail("chunk", e);
        }
    }

    /// Runs the hook's finalise and says what the hook did.
    pub fn finalise(&self, summary: &Value) -> HookOutcome {
        let _turn = self.calls.lock();
        let mut metrics = Map::new();
        let mut finalised = 0;
        if !self.disabled.load(Ordering::SeqCst) {
            finalised = 1;
            match self.hook.finalise(summary) {
                Ok(m) => metrics = m,
                Err(e) => self.fail("finalise", e),
            }
        }
        let calls = BTreeMap::from([
            ("before_request", self.before.load(Ordering::Relaxed)),
            ("chunk", self.chunks.load(Ordering::Relaxed)),
            ("finalise", finalised),
        ]);
        HookOutcome {
            name: self.hook.name().to_owned(),
            calls,
            disabled: self.disabled.load(Ordering::SeqCst),
            error: self.error.lock().ok().and_then(|e| e.clone()),
            metrics,
        }
    }
}

/// The report without its per-request arrays: what a finalise hook sees.
pub fn summary_of(report: &Value) -> Value {
    let mut s = report.clone();
    if let Some(o) = s.as_object_mut() {
        for key in ["requests", "input_lens", "output_lens", "ttfts", "errors"] {
            o.remove(key);
        }
    }
    s
}

/// Built-in example: chunk sizes and the gaps between them, per run.
#[derive(Debug, Default)]
pub struct ChunkStats {
    seen: Mutex<(u64, u64)>,
}

impl Hook for ChunkStats {
    fn name(&self) -> &str {
        "chunk_stats"
    }

    fn on_chunk(
        &self,
        _ctx: &RequestContext,
        _attempt: u32,
        _t_ms: f64,
        text: &str,
    ) -> Result<(), HookError> {
        let mut seen = self.seen.lock().map_err(|_| HookError("poisoned".into()))?;
        seen.0 += 1;
        seen.1 += text.chars().count() as u64;
        Ok(())
    }

    fn finalise(&self, _summary: &Value) -> Result<Map<String, Value>, HookError> {
        let (chunks, chars) = *self.seen.lock().map_err(|_| HookError("poisoned".into()))?;
        let mut m = Map::new();
        m.insert("chunks".into(), json!(chunks));
        m.insert(
            "mean_chars_per_chunk".into(),
            json!(if chunks == 0 { 0.0 } else { chars as f64 / chunks as f64 }),
        );
        Ok(m)
    }
}

/// An external command speaking JSON lines (see the module docs).
pub struct CommandHook {
    name: String,
    command: String,
    timeout: Duration,
    /// Lines to its stdin, written by a thread so a hook that stops reading never blocks a request.
    to_hook: Mutex<mpsc::Sender<String>>,
    /// Lines from its stdout, read by a thread so a silent hook can be timed out.
    from_hook: Mutex<mpsc::Receiver<String>>,
    child: Mutex<Child>,
    /// Number of the next question.
    asked: AtomicU64,
}

impl CommandHook {
    /// Starts `command` (run by `sh -c`); `timeout` bounds each answer it owes.
    pub fn start(command: &str, timeout: Duration) -> Result<Self, HookError> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(command)
            // Its own process group, so that stopping it also stops what the shell started.
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                HookError(format!("--hook {command:?}: cannot start it ({e}); check the command"))
            })?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            unreachable!("both are piped above")
        };
        let (to_hook, lines_in) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in lines_in {
                if stdin
                    .write_all(line.as_bytes())
                    .and_then(|()| stdin.write_all(b"\n"))
                    .and_then(|()| stdin.flush())
                    .is_err()
                {
                    break;
                }
            }
        });
        let (lines_out, from_hook) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines_out.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            name: hook_name(command),
            command: command.to_owned(),
            timeout,
            to_hook: Mutex::new(to_hook),
            from_hook: Mutex::new(from_hook),
            child: Mutex::new(child),
            asked: AtomicU64::new(0),
        })
    }

    fn exited(&self) -> HookError {
        HookError(format!(
            "{:?} has exited (or closed its stdout); run it by hand to see why: a hook reads JSON lines from stdin until it closes",
            self.command
        ))
    }

    fn send(&self, message: &Value) -> Result<(), HookError> {
        let tx = self.to_hook.lock().map_err(|_| HookError("poisoned".into()))?;
        tx.send(message.to_string()).map_err(|_| self.exited())
    }

    /// Sends `message` with a new `ask` number and waits for the answer that echoes it; other
    /// lines (answers to questions given up on, stray output) are skipped.
    fn ask(&self, mut message: Value) -> Result<Value, HookError> {
        let rx = self.from_hook.lock().map_err(|_| HookError("poisoned".into()))?;
        let ask = self.asked.fetch_add(1, Ordering::Relaxed);
        message["ask"] = json!(ask);
        self.send(&message)?;
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = rx.recv_timeout(left).map_err(|e| match e {
                mpsc::RecvTimeoutError::Timeout => HookError(format!(
                    "no answer within {:?}; raise --hook-timeout or make the hook answer each question at once",
                    self.timeout
                )),
                mpsc::RecvTimeoutError::Disconnected => self.exited(),
            })?;
            let answer: Value = serde_json::from_str(&line).map_err(|e| {
                HookError(format!(
                    "answered {:?}, not JSON ({e}); a hook writes one JSON object per line on stdout and logs to stderr",
                    line.chars().take(120).collect::<String>()
                ))
            })?;
            if answer.get("ask") == Some(&json!(ask)) {
                return Ok(answer);
            }
            tracing::debug!(hook = self.name, line = %line, "skipped a line that does not answer the open question");
        }
    }
}

/// A command hook's name: the stem of the first word that is an existing file (the script),
/// else of the first word, e.g. `answer_words` for `python3 deploy/bench/hooks/answer_words.py`.
fn hook_name(command: &str) -> String {
    let words: Vec<&str> = command.split_whitespace().collect();
    let word = words
        .iter()
        .find(|w| std::path::Path::new(w).is_file())
        .or(words.first())
        .copied()
        .unwrap_or(command);
    std::path::Path::new(word).file_stem().map_or(word.to_owned(), |s| s.to_string_lossy().into_owned())
}

impl Drop for CommandHook {
    fn drop(&mut self) {
        if let Ok(mut child) = self.child.lock() {
            if let Ok(pgid) = i32::try_from(child.id()) {
                // SAFETY: killpg only sends a signal; the group is the one `start` created for
                // this hook (its leader is the child we still hold, so the id is not reused).
                unsafe { libc::killpg(pgid, libc::SIGKILL) };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Hook for CommandHook {
    fn name(&self) -> &str {
        &self.name
    }

    fn before_request(&self, ctx: &RequestContext, body: &mut Value) -> Result<(), HookError> {
        let answer = self.ask(json!({"stage": "before_request", "run": ctx.run, "id": ctx.id,
            "session": ctx.session, "turn": ctx.turn, "state": ctx.state, "body": body}))?;
        if let Some(b) = answer.get("body") {
            *body = b.clone();
        }
        Ok(())
    }

    fn on_chunk(&self, ctx: &RequestContext, attempt: u32, t_ms: f64, text: &str) -> Result<(), HookError> {
        self.send(&json!({"stage": "chunk", "run": ctx.run, "id": ctx.id, "attempt": attempt, "t_ms": t_ms, "text": text}))
    }

    fn finalise(&self, summary: &Value) -> Result<Map<String, Value>, HookError> {
        let answer = self.ask(json!({"stage": "finalise", "report": summary}))?;
        match answer.get("metrics") {
            Some(Value::Object(m)) => Ok(m.clone()),
            None => Ok(Map::new()),
            Some(other) => Err(HookError(format!(
                "`metrics` is {other}, not an object; answer {{\"ask\": N, \"metrics\": {{\"name\": value}}}}"
            ))),
        }
    }
}

/// A `--hook` value: `builtin:NAME` or a command line.
pub fn from_arg(arg: &str, timeout: Duration) -> Result<Box<dyn Hook>, HookError> {
    match arg.strip_prefix("builtin:") {
        Some("chunk_stats") => Ok(Box::<ChunkStats>::default()),
        Some(other) => Err(HookError(format!(
            "--hook builtin:{other}: no such built-in; the built-ins are: chunk_stats"
        ))),
        None => Ok(Box::new(CommandHook::start(arg, timeout)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> RequestContext {
        RequestContext { run: 1, id: 7, session: 1, turn: 0, state: "ask".into() }
    }

    /// A hook written in shell: adds `user` to the body, then reports the chunks it counted.
    /// It first says hello on stdout, which must not be taken for an answer.
    const ECHO_HOOK: &str = r#"echo '{"event": "ready"}'; n=0; while IFS= read -r line; do
      ask=$(printf '%s' "$line" | sed -n 's/.*"ask":\([0-9]*\).*/\1/p')
      case "$line" in
        *'"stage":"before_request"'*) echo "{\"ask\": $ask, \"body\": {\"model\": \"m\", \"user\": \"hooked\"}}" ;;
        *'"stage":"chunk"'*) n=$((n+1)) ;;
        *'"stage":"finalise"'*) echo "{\"ask\": $ask, \"metrics\": {\"chunks_seen\": $n}}" ;;
      esac
    done"#;

    #[test]
    fn an_external_hook_edits_bodies_sees_chunks_and_reports_metrics() {
        let hook = Guarded::new(Box::new(CommandHook::start(ECHO_HOOK, Duration::from_secs(10)).unwrap()));
        let mut body = json!({"model": "m"});
        hook.before_request(&ctx(), &mut body);
        assert_eq!(body["user"], "hooked");
        for t in ["a", "b", "c"] {
            hook.on_chunk(&ctx(), 1, 1.0, t);
        }
        let out = hook.finalise(&json!({"completed": 1}));
        assert!(!out.disabled, "{out:?}");
        assert_eq!(out.metrics["chunks_seen"], 3);
        assert_eq!((out.calls["before_request"], out.calls["chunk"], out.calls["finalise"]), (1, 3, 1));
    }

    #[test]
    fn a_hook_that_hangs_exits_or_babbles_is_switched_off_and_reported() {
        for (command, says) in [
            ("sleep 30", "no answer within"),
            ("true", "exited"),
            ("while read -r l; do echo 'not json'; done", "not JSON"),
            // Valid JSON that never echoes the question is not an answer.
            ("while read -r l; do echo '{\"body\": {}}'; done", "no answer within"),
        ] {
            let hook =
                Guarded::new(Box::new(CommandHook::start(command, Duration::from_millis(300)).unwrap()));
            let mut body = json!({"model": "m"});
            hook.before_request(&ctx(), &mut body);
            assert_eq!(body, json!({"model": "m"}), "{command}: the body is left alone");
            hook.before_request(&ctx(), &mut body);
            let out = hook.finalise(&json!({}));
            assert!(out.disabled, "{command}: {out:?}");
            let error = out.error.unwrap();
            assert!(error.starts_with("before_request: ") && error.contains(says), "{command}: {error}");
            assert_eq!(out.calls["before_request"], 1, "{command}: not called again once off");
        }
    }

    #[test]
    fn builtins_are_named_and_unknown_ones_refused() {
        let hook = Guarded::new(from_arg("builtin:chunk_stats", Duration::from_secs(1)).unwrap());
        hook.on_chunk(&ctx(), 1, 1.0, "héllo");
        hook.on_chunk(&ctx(), 1, 2.0, "!");
        let out = hook.finalise(&json!({}));
        assert_eq!(out.name, "chunk_stats");
        assert_eq!(out.metrics["chunks"], 2);
        assert_eq!(out.metrics["mean_chars_per_chunk"], 3.0);
        let e = from_arg("builtin:nope", Duration::from_secs(1)).err().unwrap().to_string();
        assert!(e.contains("builtin:nope") && e.contains("chunk_stats"), "{e}");
        assert_eq!(summary_of(&json!({"completed": 1, "requests": []})), json!({"completed": 1}));
        assert_eq!(hook_name("python3 Cargo.toml --verbose"), "Cargo");
        assert_eq!(hook_name("sleep 60"), "sleep");
    }
}

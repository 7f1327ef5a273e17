//! Extension hooks: user code at the three stages of a bench run, without touching omen.
//!
//! - before a request is sent: the hook sees the request and may replace its JSON body;
//! - after each decoded chunk: the hook sees the text and its time since the request;
//! - when the metrics are final: the hook sees the report's summary (no per-request
//!   records) and returns metrics of its own, which go under `omen.hooks` in the report.
//!
//! Built-ins implement [`Hook`]. An external command ([`CommandHook`]) speaks JSON lines
//! over its stdin and stdout: `{"stage": "before_request", "id", "session", "turn",
//! "state", "body"}` answered by `{"body": {...}}` (the body to send) or `{}` (unchanged);
//! `{"stage": "chunk", "id", "t_ms", "text"}` with no answer; `{"stage": "finalise",
//! "report": {...}}` answered by `{"metrics": {...}}`. A hook that fails, answers garbage
//! or does not answer within its timeout is reported and switched off; the run goes on.

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
    /// Request sequence number.
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
    /// After each decoded chunk; must not block (it runs in the stream's read loop).
    fn on_chunk(&self, _ctx: &RequestContext, _t_ms: f64, _text: &str) -> Result<(), HookError> {
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
                self.fail("before_request", HookError("the body it returned is not a JSON object".into()))
            }
            Err(e) => self.fail("before_request", e),
        }
    }

    /// Runs the hook's on_chunk.
    pub fn on_chunk(&self, ctx: &RequestContext, t_ms: f64, text: &str) {
        if self.disabled.load(Ordering::Relaxed) {
            return;
        }
        self.chunks.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.hook.on_chunk(ctx, t_ms, text) {
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

    fn on_chunk(&self, _ctx: &RequestContext, _t_ms: f64, text: &str) -> Result<(), HookError> {
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
        let name = command.split_whitespace().last().unwrap_or(command);
        let name = std::path::Path::new(name)
            .file_stem()
            .map_or(name.to_owned(), |s| s.to_string_lossy().into_owned());
        Ok(Self {
            name,
            command: command.to_owned(),
            timeout,
            to_hook: Mutex::new(to_hook),
            from_hook: Mutex::new(from_hook),
            child: Mutex::new(child),
        })
    }

    fn send(&self, message: &Value) -> Result<(), HookError> {
        let tx = self.to_hook.lock().map_err(|_| HookError("poisoned".into()))?;
        tx.send(message.to_string()).map_err(|_| HookError(format!("{:?} has exited", self.command)))
    }

    /// Sends `message` and waits for one answer line; answers are taken in turn.
    fn ask(&self, message: &Value) -> Result<Value, HookError> {
        let rx = self.from_hook.lock().map_err(|_| HookError("poisoned".into()))?;
        self.send(message)?;
        let line = rx.recv_timeout(self.timeout).map_err(|e| match e {
            mpsc::RecvTimeoutError::Timeout => HookError(format!(
                "no answer within {:?}; raise --hook-timeout or fix the hook",
                self.timeout
            )),
            mpsc::RecvTimeoutError::Disconnected => {
                HookError(format!("{:?} exited (or closed its stdout) without answering", self.command))
            }
        })?;
        serde_json::from_str(&line).map_err(|e| {
            HookError(format!(
                "answered {:?}, not a JSON object ({e})",
                line.chars().take(120).collect::<String>()
            ))
        })
    }
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
        let answer = self.ask(&json!({"stage": "before_request", "id": ctx.id, "session": ctx.session,
            "turn": ctx.turn, "state": ctx.state, "body": body}))?;
        match answer.get("body") {
            Some(b) => *body = b.clone(),
            None if answer.is_object() => {}
            None => return Err(HookError(format!("answered {answer}, not an object"))),
        }
        Ok(())
    }

    fn on_chunk(&self, ctx: &RequestContext, t_ms: f64, text: &str) -> Result<(), HookError> {
        self.send(&json!({"stage": "chunk", "id": ctx.id, "t_ms": t_ms, "text": text}))
    }

    fn finalise(&self, summary: &Value) -> Result<Map<String, Value>, HookError> {
        let answer = self.ask(&json!({"stage": "finalise", "report": summary}))?;
        match answer.get("metrics") {
            Some(Value::Object(m)) => Ok(m.clone()),
            None => Ok(Map::new()),
            Some(other) => Err(HookError(format!("`metrics` is {other}, not an object"))),
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
        RequestContext { id: 7, session: 1, turn: 0, state: "ask".into() }
    }

    /// A hook written in shell: adds `user` to the body, then reports the chunks it counted.
    const ECHO_HOOK: &str = r#"n=0; while IFS= read -r line; do
      case "$line" in
        *'"stage":"before_request"'*) echo '{"body": {"model": "m", "user": "hooked"}}' ;;
        *'"stage":"chunk"'*) n=$((n+1)) ;;
        *'"stage":"finalise"'*) echo "{\"metrics\": {\"chunks_seen\": $n}}" ;;
      esac
    done"#;

    #[test]
    fn an_external_hook_edits_bodies_sees_chunks_and_reports_metrics() {
        let hook = Guarded::new(Box::new(CommandHook::start(ECHO_HOOK, Duration::from_secs(10)).unwrap()));
        let mut body = json!({"model": "m"});
        hook.before_request(&ctx(), &mut body);
        assert_eq!(body["user"], "hooked");
        for t in ["a", "b", "c"] {
            hook.on_chunk(&ctx(), 1.0, t);
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
            ("while read -r l; do echo 'not json'; done", "not a JSON object"),
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
        hook.on_chunk(&ctx(), 1.0, "héllo");
        hook.on_chunk(&ctx(), 2.0, "!");
        let out = hook.finalise(&json!({}));
        assert_eq!(out.name, "chunk_stats");
        assert_eq!(out.metrics["chunks"], 2);
        assert_eq!(out.metrics["mean_chars_per_chunk"], 3.0);
        let e = from_arg("builtin:nope", Duration::from_secs(1)).err().unwrap().to_string();
        assert!(e.contains("builtin:nope") && e.contains("chunk_stats"), "{e}");
        assert_eq!(summary_of(&json!({"completed": 1, "requests": []})), json!({"completed": 1}));
    }
}

//! The model worker: the LSTM autoencoder and BERTScore run in a child process,
//! `omen-worker` (crates/omen-worker), so that `omen` itself never links libtorch.
//! Loading libtorch costs about 130 MB of RSS before any model exists (its static
//! initialisers register thousands of operators), which a sidecar without a model must
//! not pay. Requests and replies are JSON lines over the child's stdin and stdout; its
//! stderr is the agent's, so its log lines land in the agent's log.
//!
//! One worker serves both models. A worker that dies or stops answering is killed; the
//! next call starts a new one (at most one start per [`RESTART_AFTER`]) and loads the
//! same models again.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use omen_protocol::worker::{Reply, Request, WORKER_BIN};
use tracing::{info, warn};

/// Environment variable naming the worker binary (after `worker.path`, before the search).
pub const WORKER_ENV: &str = "OMEN_WORKER";

/// A dead worker is started again only after this long, so that a crashing model does
/// not turn into a busy restart loop.
pub const RESTART_AFTER: Duration = Duration::from_secs(10);

/// Loading a model reads and checks its weights: allow more than one call's timeout.
const LOAD_TIMEOUT_FACTOR: u32 = 4;

/// Errors of talking to the worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// No worker binary was found.
    #[error(
        "the model worker `{WORKER_BIN}` was not found (looked at {looked}); build it with \
         `cargo build --release -p omen-worker` (`make build`), or set worker.path or ${WORKER_ENV}"
    )]
    NotFound {
        /// Where it was looked for.
        looked: String,
    },
    /// The worker could not be started.
    #[error("cannot start the model worker {program}: {source}; check worker.path")]
    Spawn {
        /// The binary.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The worker died or stopped answering.
    #[error(
        "the model worker {program} {what}; it is started again on a later call (its stderr is in this log)"
    )]
    Broken {
        /// The binary.
        program: PathBuf,
        /// What happened.
        what: String,
    },
    /// The worker died less than [`RESTART_AFTER`] ago.
    #[error("the model worker {program} was started {ago:?} ago and failed; it is started again {after:?} after its last start")]
    Restarting {
        /// The binary.
        program: PathBuf,
        /// Since its last start.
        ago: Duration,
        /// Shortest time between two starts.
        after: Duration,
    },
    /// The worker answered with an error.
    #[error("{0}")]
    Failed(String),
    /// The worker answered with a reply that does not fit the request.
    #[error("the model worker answered {reply:?} to {request}; the omen and omen-worker binaries must come from the same build")]
    Unexpected {
        /// The request's kind.
        request: &'static str,
        /// The reply.
        reply: Box<Reply>,
    },
}

impl WorkerError {
    /// A reply of the wrong kind to `request`.
    pub fn unexpected(request: &'static str, reply: Reply) -> Self {
        Self::Unexpected { request, reply: Box::new(reply) }
    }
}

/// Finds the worker binary: `configured` (worker.path), then `$OMEN_WORKER`, then next to
/// the running executable (and one folder up from cargo's `deps/`, for tests), then `$PATH`.
pub fn find_program(configured: Option<&Path>) -> Result<PathBuf, WorkerError> {
    if let Some(p) = configured {
        return Ok(p.to_owned());
    }
    if let Some(p) = std::env::var_os(WORKER_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_owned)) {
        candidates.push(dir.join(WORKER_BIN));
        if dir.file_name().is_some_and(|n| n == "deps") {
            if let Some(up) = dir.parent() {
                candidates.push(up.join(WORKER_BIN));
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join(WORKER_BIN)));
    }
    candidates.iter().find(|c| c.is_file()).cloned().ok_or_else(|| WorkerError::NotFound {
        looked: if candidates.is_empty() {
            "nowhere: no executable folder and no $PATH".into()
        } else {
            candidates.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
        },
    })
}

/// Runs the worker's own command line (`omen train ...` is `omen-worker train ...`) and
/// returns its exit code; its output is this process's.
pub fn run_command(args: &[OsString]) -> Result<std::process::ExitStatus, WorkerError> {
    let program = find_program(None)?;
    Command::new(&program).args(args).status().map_err(|source| WorkerError::Spawn { program, source })
}

/// A reply as the caller sees it: the worker's `error` reply is an error. (The worker
/// itself is fine after one; only a failed exchange makes it untrustworthy.)
fn answered(reply: Reply) -> Result<Reply, WorkerError> {
    match reply {
        Reply::Error { message } => Err(WorkerError::Failed(message)),
        r => Ok(r),
    }
}

/// A running worker process.
struct Process {
    child: Child,
    stdin: ChildStdin,
    replies: mpsc::Receiver<std::io::Result<String>>,
}

impl Drop for Process {
    fn drop(&mut self) {
        // The worker keeps nothing worth saving (models are reloaded from their files):
        // kill it rather than wait for it to notice its closed stdin, and reap it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct State {
    process: Option<Process>,
    /// Load requests that succeeded, replayed into a restarted worker.
    loads: Vec<Request>,
    started: Option<Instant>,
}

/// The agent's handle on the worker; calls are serialised (one request in flight).
pub struct Worker {
    program: PathBuf,
    timeout: Duration,
    restart_after: Duration,
    state: Mutex<State>,
}

impl Worker {
    /// A handle that starts `program` on the first call; `timeout` bounds each call.
    pub fn new(program: PathBuf, timeout: Duration) -> Self {
        Self {
            program,
            timeout,
            restart_after: RESTART_AFTER,
            state: Mutex::new(State { process: None, loads: Vec::new(), started: None }),
        }
    }

    /// The worker binary (what `omen-worker train` runs as, too).
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The same handle with another shortest time between two starts (default [`RESTART_AFTER`]).
    pub fn with_restart_after(mut self, restart_after: Duration) -> Self {
        self.restart_after = restart_after;
        self
    }

    /// The running worker's process id, if one runs.
    pub fn pid(&self) -> Option<u32> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).process.as_ref().map(|p| p.child.id())
    }

    /// Loads a model (a `Load*` request); the load is repeated in any later worker.
    pub fn load(&self, request: Request) -> Result<Reply, WorkerError> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let reply = self.call_locked(&mut st, &request, self.timeout * LOAD_TIMEOUT_FACTOR)?;
        st.loads.retain(|r| std::mem::discriminant(r) != std::mem::discriminant(&request));
        st.loads.push(request);
        Ok(reply)
    }

    /// Sends one request and waits for its reply.
    pub fn call(&self, request: &Request) -> Result<Reply, WorkerError> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.call_locked(&mut st, request, self.timeout)
    }

    fn call_locked(
        &self,
        st: &mut State,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, WorkerError> {
        if st.process.is_none() {
            self.restart(st)?;
        }
        let reply = self.exchange(st.process.as_mut().expect("started above"), request, timeout);
        if reply.is_err() {
            // Whatever state it is in, it cannot be trusted with the next request.
            st.process = None;
        }
        answered(reply?)
    }

    /// Starts a worker and loads every model loaded before.
    fn restart(&self, st: &mut State) -> Result<(), WorkerError> {
        if let Some(ago) = st.started.map(|t| t.elapsed()).filter(|ago| *ago < self.restart_after) {
            return Err(WorkerError::Restarting {
                program: self.program.clone(),
                ago,
                after: self.restart_after,
            });
        }
        st.started = Some(Instant::now());
        let mut child = Command::new(&self.program)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| WorkerError::Spawn { program: self.program.clone(), source })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, replies) = mpsc::channel();
        // A reader thread turns the blocking pipe into a channel that can time out.
        std::thread::Builder::new()
            .name("omen-worker-io".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .map_err(|source| WorkerError::Spawn { program: self.program.clone(), source })?;
        let mut process = Process { child, stdin, replies };
        let replayed = !st.loads.is_empty();
        for load in &st.loads {
            answered(self.exchange(&mut process, load, self.timeout * LOAD_TIMEOUT_FACTOR)?)?;
        }
        if replayed {
            warn!(program = %self.program.display(), "model worker restarted; its models are loaded again");
        } else {
            info!(program = %self.program.display(), pid = process.child.id(), "model worker started");
        }
        st.process = Some(process);
        Ok(())
    }

    fn exchange(&self, p: &mut Process, request: &Request, timeout: Duration) -> Result<Reply, WorkerError> {
        let broken = |what: String| WorkerError::Broken { program: self.program.clone(), what };
        let mut line = serde_json::to_string(request).expect("requests serialise");
        line.push('\n');
        p.stdin.write_all(line.as_bytes()).and_then(|()| p.stdin.flush()).map_err(|e| {
            broken(format!(
                "cannot take a request ({e}); exit status {:?}",
                p.child.try_wait().ok().flatten()
            ))
        })?;
        let text = match p.replies.recv_timeout(timeout) {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => return Err(broken(format!("output unreadable: {e}"))),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(broken(format!("did not answer within {timeout:?} (worker.timeout)")))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = p.child.wait().ok();
                return Err(broken(format!(
                    "exited ({})",
                    status.map_or("unknown status".into(), |s| s.to_string())
                )));
            }
        };
        serde_json::from_str(&text)
            .map_err(|e| broken(format!("answered a line that is not a reply ({e}): {text:.200}")))
    }
}

/// `omen train` and `omen evaluate` run in the model worker: `omen-worker` takes the same
/// command line (`args` is it, from the subcommand on), and only it links libtorch.
/// Returns the worker's exit code (it printed its own errors) for the caller to exit with.
#[cfg(feature = "lstm")]
pub fn run_in_worker(args: &[OsString]) -> anyhow::Result<u8> {
    let status = run_command(args)?;
    match status.code() {
        Some(code) => Ok(u8::try_from(code).unwrap_or(1)),
        None => anyhow::bail!("the model worker was killed ({status})"),
    }
}

/// `omen train` / `omen evaluate` without the `lstm` feature: a clear error.
#[cfg(not(feature = "lstm"))]
pub fn run_in_worker(args: &[OsString]) -> anyhow::Result<u8> {
    anyhow::bail!(
        "omen {} needs the LSTM autoencoder, and this omen was built without the `lstm` feature; build it with default features",
        args.first().map(|a| a.to_string_lossy()).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_program_wins() {
        assert_eq!(
            find_program(Some(Path::new("/opt/x/omen-worker"))).unwrap(),
            Path::new("/opt/x/omen-worker")
        );
    }

    #[test]
    fn a_worker_that_does_not_answer_is_killed_after_the_timeout() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let hung = dir.path().join("hung-worker");
        std::fs::write(&hung, "#!/bin/sh\nexec sleep 60\n").unwrap();
        std::fs::set_permissions(&hung, std::fs::Permissions::from_mode(0o755)).unwrap();
        let w = Worker::new(hung, Duration::from_millis(300));
        let e = w.call(&Request::LstmTick { raw: vec![1.0] }).unwrap_err();
        assert!(e.to_string().contains("did not answer within 300ms"), "{e}");
        assert_eq!(w.pid(), None, "the hung worker is killed, not kept");
    }

    #[test]
    fn a_worker_that_is_not_a_worker_is_reported_and_not_restarted_at_once() {
        // `true` exits at once without answering: the call reports it, the next one waits.
        let w = Worker::new(PathBuf::from("true"), Duration::from_secs(5));
        let e = w.call(&Request::LstmTick { raw: vec![] }).unwrap_err();
        assert!(matches!(e, WorkerError::Broken { .. }), "{e}");
        let e = w.call(&Request::LstmTick { raw: vec![] }).unwrap_err();
        assert!(matches!(e, WorkerError::Restarting { .. }), "{e}");
        let w = Worker::new(PathBuf::from("/nonexistent/omen-worker"), Duration::from_secs(5));
        let e = w.call(&Request::LstmTick { raw: vec![] }).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/omen-worker") && e.contains("worker.path"), "{e}");
    }
}

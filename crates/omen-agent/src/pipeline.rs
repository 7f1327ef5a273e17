//! The pipeline's input and its thread: every source and every push hands the pipeline an
//! [`IngestJob`]; one thread owns the engine (SQLite writes block) and processes the jobs
//! in order, acknowledging each push once its samples are committed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Result;
use tokio::sync::{mpsc, oneshot};
use tracing::{error, warn};

use crate::engine::{Engine, SeriesLimitExceeded};
use crate::metrics::LiveMetrics;
use omen_sources::Sample;

/// A batch for the pipeline and the channel that acknowledges its commit.
pub struct IngestJob {
    /// Samples to process.
    pub samples: Vec<Sample>,
    /// Receives the number committed, or why not.
    pub ack: Option<oneshot::Sender<Result<usize, PipelineError>>>,
}

/// Why a batch was not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PipelineError {
    /// The batch was refused as it is (a limit); sending it again will not help.
    Refused(String),
    /// The store failed to write it; the message names the cause.
    Store(String),
}

/// Why the store cannot take writes now (e.g. the disk is full), for /readyz; None while writes succeed.
pub type WriteFailure = Arc<std::sync::RwLock<Option<String>>>;

/// Starts the pipeline thread: it owns `engine`, `ready` is set until it stops taking jobs,
/// `write_failure` holds the last store error until a batch commits again, and it flushes
/// the open minute when every sender has gone.
pub fn spawn(
    mut engine: Engine,
    mut jobs: mpsc::Receiver<IngestJob>,
    ready: Arc<AtomicBool>,
    write_failure: WriteFailure,
) -> std::io::Result<std::thread::JoinHandle<Result<()>>> {
    // Ready from the moment the thread exists: jobs sent before it runs wait in the queue.
    ready.store(true, Ordering::Relaxed);
    // The pipeline owns the engine on its own thread: SQLite writes block.
    std::thread::Builder::new().name("omen-pipeline".into()).spawn(move || -> Result<()> {
        // The last refusal logged, so that a source refused every interval logs once.
        let mut last_refusal: Option<(&'static str, Option<String>)> = None;
        // Store upkeep (compaction) runs in small steps while no batch waits.
        let mut upkeep = Upkeep::default();
        loop {
            let job = match jobs.try_recv() {
                Ok(job) => job,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    if upkeep.pending {
                        upkeep.step(&mut engine);
                        continue;
                    }
                    match jobs.blocking_recv() {
                        Some(job) => job,
                        None => break,
                    }
                }
            };
            upkeep.pending = true;
            let n = job.samples.len();
            let pushed = job.ack.is_some();
            let result = engine.process(job.samples).map_err(|e| match e.downcast::<SeriesLimitExceeded>() {
                Ok(refused) => {
                    let key = (refused.key, refused.signal.clone());
                    if last_refusal.as_ref() != Some(&key) {
                        warn!(
                            "pipeline: batch of {n} samples refused ({}): {refused}",
                            if pushed { "a push" } else { "a source" }
                        );
                        last_refusal = Some(key);
                    }
                    PipelineError::Refused(refused.to_string())
                }
                Err(e) => {
                    let reason = omen_store::explain_write_error(&e, engine.store_path());
                    let mut failure = write_failure.write().unwrap_or_else(|p| p.into_inner());
                    // One line per spell of failures (and per change of cause), not per batch.
                    if failure.as_deref() != Some(reason.as_str()) {
                        error!("pipeline: batch of {n} samples not stored: {reason}");
                    }
                    *failure = Some(reason.clone());
                    PipelineError::Store(reason)
                }
            });
            if result.is_ok() {
                let mut failure = write_failure.write().unwrap_or_else(|p| p.into_inner());
                if let Some(was) = failure.take() {
                    warn!("pipeline: the store takes writes again (it failed with: {was})");
                }
            }
            if let Some(ack) = job.ack {
                let _ = ack.send(result);
            }
        }
        ready.store(false, Ordering::Relaxed);
        // The open minute aggregates; they would be rebuilt from raw samples anyway.
        if let Err(e) = engine.flush() {
            error!("pipeline: open minute aggregates not written at shutdown: {e:#}");
        }
        Ok(())
    })
}

/// The pipeline's store upkeep between batches.
#[derive(Default)]
struct Upkeep {
    /// A step may have work: set after every batch, cleared when a step finds none.
    pending: bool,
    /// The last step failed (logged once per spell of failures).
    failing: bool,
}

impl Upkeep {
    /// One [`Engine::maintain`] step; a failure (e.g. a full disk) waits for the next batch.
    fn step(&mut self, engine: &mut Engine) {
        match engine.maintain() {
            Ok(more) => {
                if self.failing {
                    warn!("pipeline: store compaction works again");
                    self.failing = false;
                }
                self.pending = more;
            }
            Err(e) => {
                if !self.failing {
                    let reason = omen_store::explain_write_error(&e, engine.store_path());
                    error!("pipeline: store compaction failed (retried after the next batch): {reason}");
                    self.failing = true;
                }
                self.pending = false;
            }
        }
    }
}

/// Hands a source's samples to the pipeline; our sources never block on a full
/// queue: they shed the round and count it.
pub fn offer(
    live: &LiveMetrics,
    tx: &mpsc::Sender<IngestJob>,
    samples: Vec<omen_sources::Sample>,
    source: &str,
) {
    let n = samples.len() as u64;
    if !samples.is_empty() && tx.try_send(IngestJob { samples, ack: None }).is_err() {
        live.shed.get_or_create(&vec![("reason".into(), format!("queue_full_{source}"))]).inc_by(n);
    }
}

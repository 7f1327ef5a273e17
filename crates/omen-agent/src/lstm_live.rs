//! The LSTM autoencoder in the live pipeline: each health tick turns the latest value of
//! every source series (in the model's order) into one raw row for the model worker
//! (worker.rs), which normalises it, keeps the window and scores it once full; the
//! severity becomes the `lstm_ae_score` gauge, which joins health.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::worker::{Reply, Request, Worker, WorkerError};

/// A model loaded in the worker, with the agent's view of its sources.
pub struct LiveModel {
    worker: Arc<Worker>,
    path: std::path::PathBuf,
    sources: Vec<String>,
    window: usize,
    /// Source series missing at the last tick (logged when the set changes).
    missing: Vec<String>,
}

/// One tick's outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Tick {
    /// A source series has no value yet: nothing scored.
    Missing,
    /// The window is not full yet.
    Filling,
    /// Reconstruction error and its severity in [0, 1].
    Scored {
        /// Mean squared reconstruction error.
        error: f64,
        /// Severity (0.6 at the POT threshold).
        severity: f64,
        /// Each source series with its share of the error, largest first.
        contributions: Vec<(String, f64)>,
    },
}

impl LiveModel {
    /// Loads the model file into the worker; errors name `field` (the config key the file
    /// comes from), the file and the fix.
    pub fn load(worker: Arc<Worker>, path: &Path, threads: usize, field: &str) -> Result<Self> {
        let reply = worker
            .load(Request::LoadLstm { path: path.to_owned(), threads })
            .with_context(|| format!("{field}: {}", path.display()))?;
        let Reply::LstmLoaded { sources, window } = reply else {
            return Err(WorkerError::unexpected("load_lstm", reply))
                .with_context(|| format!("{field}: {}", path.display()));
        };
        // A model trained before a signal was renamed reads that signal's current series.
        let sources = sources.iter().map(|s| current_source(s)).collect();
        Ok(Self { worker, path: path.to_owned(), sources, window, missing: Vec::new() })
    }

    /// Source series names, e.g. `kv_fragmentation{layer="0"}`, in the model's raw-row order.
    pub fn sources(&self) -> &[String] {
        &self.sources
    }

    /// The model file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The model's window length (ticks).
    pub fn window(&self) -> usize {
        self.window
    }

    /// Feeds one tick: `latest` gives each source's latest value, if any.
    pub fn tick(&mut self, latest: impl Fn(&str) -> Option<f64>) -> Result<Tick> {
        let values: Vec<Option<f64>> = self.sources.iter().map(|s| latest(s)).collect();
        let missing: Vec<String> =
            self.sources.iter().zip(&values).filter(|(_, v)| v.is_none()).map(|(s, _)| s.clone()).collect();
        if missing != self.missing {
            if !missing.is_empty() {
                tracing::warn!(?missing, "LSTM-AE: source series without a value; the model waits for them");
            }
            self.missing = missing;
        }
        if !self.missing.is_empty() {
            return Ok(Tick::Missing);
        }
        let raw: Vec<f64> = values.into_iter().map(|v| v.expect("checked above")).collect();
        match self.worker.call(&Request::LstmTick { raw })? {
            Reply::LstmFilling => Ok(Tick::Filling),
            Reply::LstmScored { error, severity, contributions } => {
                let mut contributions: Vec<(String, f64)> =
                    self.sources.iter().cloned().zip(contributions).collect();
                contributions.sort_by(|a, b| b.1.total_cmp(&a.1));
                Ok(Tick::Scored { error, severity, contributions })
            }
            other => Err(WorkerError::unexpected("lstm_tick", other).into()),
        }
    }
}

/// A source series name (`signal{k="v"}`) with its signal under its current name.
fn current_source(source: &str) -> String {
    let (signal, rest) = source.find('{').map_or((source, ""), |i| source.split_at(i));
    format!("{}{rest}", omen_signals::catalogue::current_name(signal))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sources_of_an_older_model_read_the_renamed_series() {
        assert_eq!(super::current_source("kvf_ratio{layer=\"0\"}"), "kv_fragmentation{layer=\"0\"}");
        assert_eq!(super::current_source("kvf_ratio"), "kv_fragmentation");
        assert_eq!(super::current_source("queue_depth{pool=\"a\"}"), "queue_depth{pool=\"a\"}");
    }
}

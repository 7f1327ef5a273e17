//! The LSTM autoencoder in the live pipeline: each health tick turns the latest value of
//! every source series (in the model's order) into one feature row, and once a window is
//! full scores it; the severity becomes the `lstm_ae_score` gauge, which joins health.

use std::collections::VecDeque;
use std::path::Path;

use anyhow::{Context, Result};
use omen_model::features::FeatureBuilder;
use omen_model::lstm_ae::{self, LstmAutoencoder};

/// A loaded model with its streaming feature state.
pub struct LiveModel {
    model: LstmAutoencoder,
    builder: FeatureBuilder,
    rows: VecDeque<Vec<f64>>,
    /// Source series missing at the last tick (logged when the set changes).
    missing: Vec<String>,
}

/// One tick's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
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
    },
}

impl LiveModel {
    /// Loads the model file; errors name the file and the fix.
    pub fn load(path: &Path, threads: usize) -> Result<Self> {
        lstm_ae::set_threads(threads);
        let model = LstmAutoencoder::load(path).context("model.path")?;
        let builder = model.meta.features.builder();
        Ok(Self { model, builder, rows: VecDeque::new(), missing: Vec::new() })
    }

    /// Source series names, e.g. `kvf_ratio{layer="0"}`, in the model's raw-row order.
    pub fn sources(&self) -> &[String] {
        &self.model.meta.features.sources
    }

    /// The model's window length (ticks).
    pub fn window(&self) -> usize {
        self.model.window()
    }

    /// Feeds one tick: `latest` gives each source's latest value, if any.
    pub fn tick(&mut self, latest: impl Fn(&str) -> Option<f64>) -> Result<Tick> {
        let values: Vec<Option<f64>> = self.sources().iter().map(|s| latest(s)).collect();
        let missing: Vec<String> =
            self.sources().iter().zip(&values).filter(|(_, v)| v.is_none()).map(|(s, _)| s.clone()).collect();
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
        let row = self.builder.push(&raw)?;
        self.rows.push_back(row);
        if self.rows.len() > self.window() {
            self.rows.pop_front();
        }
        if self.rows.len() < self.window() {
            return Ok(Tick::Filling);
        }
        let window: Vec<Vec<f64>> = self.rows.iter().cloned().collect();
        let error = self.model.score_window(&window)?;
        Ok(Tick::Scored { error, severity: self.model.severity(error) })
    }
}

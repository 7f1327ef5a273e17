//! Anomaly-model building blocks: feature normalisation, sliding windows and the
//! peaks-over-threshold (EVT) threshold that maps reconstruction errors to a
//! [0, 1] severity. The LSTM autoencoder on tch builds on these.

#[cfg(feature = "bertscore")]
pub mod bertscore;
pub mod eval;
pub mod features;
#[cfg(feature = "torch")]
pub mod lstm_ae;
pub mod normalize;
pub mod pot;
#[cfg(feature = "torch")]
pub mod prune;

pub use normalize::Normalizer;
pub use pot::{PotThreshold, SeverityMap};

/// Errors of the model building blocks; each names the input and the fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// Not enough data for what was asked.
    #[error("{what}: {have} given, at least {need} needed")]
    TooFew {
        /// Which input.
        what: &'static str,
        /// How many were given.
        have: usize,
        /// How many are needed.
        need: usize,
    },
    /// Rows of different widths, or a width that does not match the fitted one.
    #[error("row {row} has {got} features; expected {expected}")]
    Width {
        /// Row index.
        row: usize,
        /// Its width.
        got: usize,
        /// The expected width.
        expected: usize,
    },
    /// A value that is NaN or infinite.
    #[error("row {row}, feature {feature} is not finite ({value}); drop or fill missing values first")]
    NonFinite {
        /// Row index.
        row: usize,
        /// Feature index.
        feature: usize,
        /// The value.
        value: f64,
    },
    /// A parameter outside its range.
    #[error("{parameter}: {reason}")]
    Parameter {
        /// The parameter.
        parameter: &'static str,
        /// What is wrong.
        reason: String,
    },
}

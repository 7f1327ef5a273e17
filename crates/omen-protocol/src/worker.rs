//! The worker protocol: one [`Request`] per line on the worker's stdin, one [`Reply`] per
//! line on its stdout, in order; both are JSON objects tagged by their snake_case variant.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// File name of the worker binary.
pub const WORKER_BIN: &str = "omen-worker";

/// One request to the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    /// Load an LSTM-AE model file (`omen train` writes it); replaces a loaded one.
    LoadLstm {
        /// Model file.
        path: PathBuf,
        /// libtorch threads.
        threads: usize,
    },
    /// One health tick's raw row (the latest value of each source, in the model's order).
    LstmTick {
        /// Raw values, one per source.
        raw: Vec<f64>,
    },
    /// Load the BERTScore model folder (all-MiniLM-L6-v2).
    LoadBertscore {
        /// Model folder.
        dir: PathBuf,
        /// libtorch threads.
        threads: usize,
    },
    /// BERTScore F1 of an answer against its reference.
    BertscoreF1 {
        /// The canary's answer.
        answer: String,
        /// Its reference.
        reference: String,
    },
}

/// The worker's reply to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// The LSTM-AE model is loaded.
    LstmLoaded {
        /// Source series names in raw-row order, e.g. `kv_fragmentation{layer="0"}`.
        sources: Vec<String>,
        /// Window length, ticks.
        window: usize,
    },
    /// The window is not full yet.
    LstmFilling,
    /// The window was scored.
    LstmScored {
        /// Mean squared reconstruction error.
        error: f64,
        /// Severity in [0, 1] (0.6 at the POT threshold).
        severity: f64,
        /// Each source's share of the error, in the order of `sources` (sums to 1).
        #[serde(default)]
        contributions: Vec<f64>,
    },
    /// The BERTScore model is loaded.
    BertscoreLoaded {
        /// Encoder layers.
        layers: usize,
    },
    /// BERTScore F1 in [0, 1].
    BertscoreF1 {
        /// F1.
        f1: f64,
    },
    /// The request failed; the message names the input and the fix.
    Error {
        /// What went wrong.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_are_one_json_line_each() {
        let r = Request::LstmTick { raw: vec![1.5, 2.0] };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"lstm_tick":{"raw":[1.5,2.0]}}"#);
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
        let text = serde_json::to_string(&Reply::LstmFilling).unwrap();
        assert_eq!(text, r#""lstm_filling""#);
        let e = serde_json::to_string(&Reply::Error { message: "a\nb".into() }).unwrap();
        assert!(!e.contains('\n'), "{e}");
    }
}

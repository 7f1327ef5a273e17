//! Trace files as the agent's trace source, `omen replay` and `omen train` open them:
//! JSONL (plain or gzip-compressed, by the `.gz` suffix) or an Nsight Systems SQLite
//! export (`.sqlite`), read in batches of samples that share a time stamp.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::nsys::{arena_samples, NsysError};
use crate::trace::{read_jsonl_trace, TraceError};
use crate::Sample;

/// The trace source's section of the agent config (`sources.trace` in omen.yaml).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TraceSourceConfig {
    /// JSONL trace file (plain or .gz), or an Nsight Systems `.sqlite` export.
    pub path: PathBuf,
    /// Trace seconds per wall-clock second (0 = as fast as possible).
    #[serde(default)]
    pub speed: f64,
}

/// A trace file that could not be read; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TraceFileError {
    /// The file could not be opened.
    #[error("cannot open the trace {path}: {reason}")]
    Open {
        /// The file.
        path: String,
        /// The operating system's reason.
        reason: String,
    },
    /// The Nsight Systems export could not be read.
    #[error(transparent)]
    Nsys(#[from] NsysError),
    /// A line of a JSONL trace is not a sample.
    #[error("{path}: {error}")]
    Line {
        /// The file.
        path: String,
        /// What is wrong with the line.
        error: TraceError,
    },
}

/// One batch of samples with the same time stamp, in file order.
pub type TraceBatch = Result<Vec<Sample>, TraceFileError>;

/// A buffered reader over the trace's decompressed text.
pub fn open(path: &Path) -> Result<Box<dyn BufRead + Send>, TraceFileError> {
    let file = std::fs::File::open(path)
        .map_err(|e| TraceFileError::Open { path: path.display().to_string(), reason: e.to_string() })?;
    Ok(if path.extension().is_some_and(|e| e == "gz") {
        Box::new(BufReader::new(flate2::read::GzDecoder::new(file)))
    } else {
        Box::new(BufReader::new(file))
    })
}

/// Reads the trace in batches of samples sharing a timestamp, in file order.
/// A `.sqlite` file is an Nsight Systems export: its CUDA memory events become
/// arena KVF samples (one per device per second of trace time).
pub fn batches(path: &Path) -> Result<Box<dyn Iterator<Item = TraceBatch> + Send>, TraceFileError> {
    if path.extension().is_some_and(|e| e == "sqlite") {
        let samples = arena_samples(path, 1000)?;
        let mut groups: Vec<Vec<Sample>> = Vec::new();
        for s in samples {
            match groups.last_mut() {
                Some(g) if g[0].ts_ms == s.ts_ms => g.push(s),
                _ => groups.push(vec![s]),
            }
        }
        return Ok(Box::new(groups.into_iter().map(Ok)));
    }
    Ok(Box::new(jsonl_batches(path)?))
}

fn jsonl_batches(path: &Path) -> Result<impl Iterator<Item = TraceBatch> + Send, TraceFileError> {
    let display = path.display().to_string();
    let mut samples = read_jsonl_trace(open(path)?).peekable();
    Ok(std::iter::from_fn(move || {
        let first = match samples.next()? {
            Ok(s) => s,
            Err(error) => return Some(Err(TraceFileError::Line { path: display.clone(), error })),
        };
        let mut batch = vec![first];
        while let Some(Ok(next)) = samples.peek() {
            if next.ts_ms != batch[0].ts_ms {
                break;
            }
            batch.push(samples.next().expect("peeked").expect("peeked Ok"));
        }
        Some(Ok(batch))
    }))
}

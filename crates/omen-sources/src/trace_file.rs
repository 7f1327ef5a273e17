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

/// Days without samples that a trace may skip before its reader says so.
const GAP_NOTICE_MS: i64 = 86_400_000;

/// What the reader of one JSONL trace put right, logged as it goes and summed up at its end:
/// samples earlier than the trace's latest time (skipped: the pipeline runs in event time
/// and has sealed that time), the same series twice at one time (the last one is kept),
/// and gaps of a day or more (kept: the forecasts see those days as missing).
#[derive(Debug, Default)]
struct TraceAudit {
    path: String,
    /// Samples read so far (1-based index of the current one).
    read: usize,
    latest_ms: Option<i64>,
    out_of_order: usize,
    duplicates: usize,
    gaps: usize,
    longest_gap_ms: i64,
    finished: bool,
}

fn rfc3339(ms: i64) -> String {
    crate::clock::rfc3339(ms).unwrap_or_else(|| ms.to_string())
}

impl TraceAudit {
    /// Whether sample `s` (the `read`-th) comes in time; logs the first late one.
    fn in_time(&mut self, s: &Sample) -> bool {
        match self.latest_ms {
            Some(latest) if s.ts_ms < latest => {
                self.out_of_order += 1;
                if self.out_of_order == 1 {
                    tracing::warn!(
                        "{}: sample {} ({} at {}) is {:.0} s earlier than the trace's latest time {}; \
                         samples out of time order are skipped (sort the trace by ts_ms to keep them)",
                        self.path,
                        self.read,
                        s.signal,
                        rfc3339(s.ts_ms),
                        (latest - s.ts_ms) as f64 / 1000.0,
                        rfc3339(latest)
                    );
                }
                false
            }
            _ => true,
        }
    }

    /// Notes a batch at `ts_ms`: a gap since the last one of a day or more is logged.
    fn batch_at(&mut self, ts_ms: i64) {
        if let Some(latest) = self.latest_ms {
            let gap = ts_ms - latest;
            if gap >= GAP_NOTICE_MS {
                self.gaps += 1;
                self.longest_gap_ms = self.longest_gap_ms.max(gap);
                if self.gaps <= 3 {
                    tracing::warn!(
                        "{}: no samples for {:.1} days, from {} to {}; the forecasts see those days as missing",
                        self.path,
                        gap as f64 / 86_400_000.0,
                        rfc3339(latest),
                        rfc3339(ts_ms)
                    );
                }
            }
        }
        self.latest_ms = Some(self.latest_ms.map_or(ts_ms, |l| l.max(ts_ms)));
    }

    /// Keeps the last of the samples of one series in `batch` (one time stamp).
    fn dedup(&mut self, batch: &mut Vec<Sample>) {
        // Every batch passes here: look for a repeat on borrowed keys first, and copy keys
        // only for a batch that has one.
        let mut keys = std::collections::HashSet::with_capacity(batch.len());
        if batch.iter().all(|s| keys.insert((s.signal.as_str(), &s.labels))) {
            return;
        }
        drop(keys);
        let before = batch.len();
        let mut seen = std::collections::HashSet::new();
        // Walk from the end so that the last sample of a series is the one kept.
        let mut kept: Vec<Sample> =
            batch.drain(..).rev().filter(|s| seen.insert((s.signal.clone(), s.labels.clone()))).collect();
        kept.reverse();
        *batch = kept;
        let dropped = before - batch.len();
        if dropped > 0 {
            self.duplicates += dropped;
            if self.duplicates == dropped {
                tracing::warn!(
                    "{}: {} sample(s) repeat a series at {}; the last value of each series at one time is kept",
                    self.path,
                    dropped,
                    rfc3339(batch[0].ts_ms)
                );
            }
        }
    }

    /// Logs the totals once, at the end of the trace, when something was put right.
    fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        if self.out_of_order + self.duplicates + self.gaps > 0 {
            tracing::warn!(
                "{}: read {} samples; skipped {} out of time order, dropped {} repeated series values, \
                 {} gap(s) of a day or more (longest {:.1} days)",
                self.path,
                self.read,
                self.out_of_order,
                self.duplicates,
                self.gaps,
                self.longest_gap_ms as f64 / 86_400_000.0
            );
        }
    }
}

fn jsonl_batches(path: &Path) -> Result<impl Iterator<Item = TraceBatch> + Send, TraceFileError> {
    let display = path.display().to_string();
    let mut samples = read_jsonl_trace(open(path)?).peekable();
    let mut audit = TraceAudit { path: display.clone(), ..TraceAudit::default() };
    Ok(std::iter::from_fn(move || {
        let first = loop {
            match samples.next() {
                None => {
                    audit.finish();
                    return None;
                }
                Some(Err(error)) => return Some(Err(TraceFileError::Line { path: display.clone(), error })),
                Some(Ok(s)) => {
                    audit.read += 1;
                    if audit.in_time(&s) {
                        break s;
                    }
                }
            }
        };
        audit.batch_at(first.ts_ms);
        let mut batch = vec![first];
        while let Some(Ok(next)) = samples.peek() {
            if next.ts_ms != batch[0].ts_ms {
                break;
            }
            audit.read += 1;
            batch.push(samples.next().expect("peeked").expect("peeked Ok"));
        }
        audit.dedup(&mut batch);
        Some(Ok(batch))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(ts_ms: i64, layer: &str, value: f64) -> String {
        format!("{{\"ts_ms\": {ts_ms}, \"signal\": \"kv_fragmentation\", \"labels\": {{\"layer\": \"{layer}\"}}, \"value\": {value}}}\n")
    }

    #[test]
    fn late_samples_are_skipped_repeats_keep_the_last_value_and_gaps_stay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let day = 86_400_000;
        let text = [
            line(1_000, "0", 1.0),
            line(1_000, "1", 1.1),
            line(61_000, "0", 1.2),
            line(1_000, "0", 9.0), // a minute back: skipped
            line(61_000, "1", 1.3),
            line(121_000, "0", 1.4),
            line(121_000, "0", 1.5), // the same series twice at one time: 1.5 kept
            line(121_000 + 3 * day, "0", 1.6), // a 3-day gap: kept
        ]
        .concat();
        std::fs::write(&path, text).unwrap();
        let got: Vec<Vec<(i64, String, f64)>> = batches(&path)
            .unwrap()
            .map(|b| b.unwrap().into_iter().map(|s| (s.ts_ms, s.labels["layer"].clone(), s.value)).collect())
            .collect();
        let want: Vec<Vec<(i64, String, f64)>> = vec![
            vec![(1_000, "0".into(), 1.0), (1_000, "1".into(), 1.1)],
            vec![(61_000, "0".into(), 1.2)],
            vec![(61_000, "1".into(), 1.3)],
            vec![(121_000, "0".into(), 1.5)],
            vec![(121_000 + 3 * day, "0".into(), 1.6)],
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_bad_line_names_the_file_and_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        std::fs::write(&path, line(1_000, "0", 1.0) + "{not json\n").unwrap();
        let results: Vec<TraceBatch> = batches(&path).unwrap().collect();
        assert!(results[0].is_ok());
        let err = results[1].as_ref().unwrap_err().to_string();
        assert!(err.contains("t.jsonl") && err.contains("trace line 2"), "{err}");
    }
}

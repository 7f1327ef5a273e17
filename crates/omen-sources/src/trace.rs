//! JSONL sample traces: one JSON object per line, as the agent records them and
//! as `omen replay` reads them back.
//!
//! `{"ts": "2026-11-02T10:00:00Z", "signal": "kv_fragmentation", "labels": {"layer": "3"}, "value": 1.42}`
//! `ts` is an RFC 3339 string or Unix seconds (a number); `ts_ms` (Unix ms) is accepted too.

use std::collections::BTreeMap;
use std::io::BufRead;

use serde::Deserialize;

use crate::Sample;

/// A trace line that could not be read, with its 1-based line number.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading the underlying file failed.
    #[error("trace line {line}: read failed: {source}")]
    Io {
        /// Line number.
        line: usize,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The line is not a valid sample.
    #[error("trace line {line}: {reason}; expected {{\"ts\": \"2026-11-02T10:00:00Z\", \"signal\": \"kv_fragmentation\", \"labels\": {{}}, \"value\": 1.0}}")]
    Invalid {
        /// Line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Timestamp {
    Seconds(f64),
    Rfc3339(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceLine {
    ts: Option<Timestamp>,
    ts_ms: Option<i64>,
    signal: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses one trace line (without its newline).
pub fn parse_trace_line(text: &str, line: usize) -> Result<Sample, TraceError> {
    let invalid = |reason: String| TraceError::Invalid { line, reason };
    let raw: TraceLine = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
    let ts_ms = match (raw.ts, raw.ts_ms) {
        (Some(_), Some(_)) => return Err(invalid("both `ts` and `ts_ms` are set; give one".into())),
        (None, None) => return Err(invalid("no timestamp: set `ts` or `ts_ms`".into())),
        (None, Some(ms)) => ms,
        (Some(Timestamp::Seconds(s)), None) if s.is_finite() => (s * 1000.0).round() as i64,
        (Some(Timestamp::Seconds(s)), None) => {
            return Err(invalid(format!("`ts` = {s} is not a finite number")))
        }
        (Some(Timestamp::Rfc3339(s)), None) => chrono::DateTime::parse_from_rfc3339(&s)
            .map_err(|e| invalid(format!("`ts` = {s:?} is not RFC 3339 ({e})")))?
            .timestamp_millis(),
    };
    if raw.signal.is_empty() {
        return Err(invalid("`signal` is empty".into()));
    }
    if !raw.value.is_finite() {
        return Err(invalid(format!("`value` = {} is not finite", raw.value)));
    }
    // Traces recorded before a rename keep replaying under the current name.
    let signal = match omen_signals::catalogue::current_name(&raw.signal) {
        current if current != raw.signal => current.to_owned(),
        _ => raw.signal,
    };
    Ok(Sample { ts_ms, signal, labels: raw.labels, value: raw.value })
}

/// Reads a JSONL trace; blank lines and lines starting with `#` are skipped.
pub fn read_jsonl_trace<R: BufRead>(reader: R) -> impl Iterator<Item = Result<Sample, TraceError>> {
    reader.lines().enumerate().filter_map(|(i, line)| {
        let line_no = i + 1;
        match line {
            Err(source) => Some(Err(TraceError::Io { line: line_no, source })),
            Ok(text) => {
                let trimmed = text.trim();
                if trimmed.is_empty() || trimmed.starts_with('#') {
                    None
                } else {
                    Some(parse_trace_line(trimmed, line_no))
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_all_timestamp_forms() {
        let text = "# comment\n\
            {\"ts\": \"2026-11-02T10:00:00Z\", \"signal\": \"kv_fragmentation\", \"labels\": {\"layer\": \"3\"}, \"value\": 1.5}\n\
            \n\
            {\"ts\": 1793613600.5, \"signal\": \"tle_bits\", \"value\": 2}\n\
            {\"ts_ms\": 1793613600000, \"signal\": \"rci\", \"value\": 0.1}\n";
        let samples: Vec<Sample> = read_jsonl_trace(text.as_bytes()).collect::<Result<_, _>>().unwrap();
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0].ts_ms, 1_793_613_600_000);
        assert_eq!(samples[0].labels["layer"], "3");
        assert_eq!(samples[1].ts_ms, 1_793_613_600_500);
        assert_eq!(samples[2].signal, "rci");
        let old = parse_trace_line("{\"ts_ms\": 1, \"signal\": \"kvf_ratio\", \"value\": 1.5}", 1).unwrap();
        assert_eq!(old.signal, "kv_fragmentation", "an old name replays as the current one");
    }

    #[test]
    fn errors_name_the_line_and_the_problem() {
        let text = "{\"ts\": 1, \"signal\": \"x\", \"value\": 1}\n{\"signal\": \"x\", \"value\": 1}\n";
        let errs: Vec<String> =
            read_jsonl_trace(text.as_bytes()).filter_map(|r| r.err()).map(|e| e.to_string()).collect();
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("trace line 2: no timestamp"), "{}", errs[0]);
        let bad =
            parse_trace_line("{\"ts\": \"yesterday\", \"signal\": \"x\", \"value\": 1}", 7).unwrap_err();
        assert!(bad.to_string().contains("line 7") && bad.to_string().contains("RFC 3339"));
        assert!(parse_trace_line("{\"ts\": 1, \"signal\": \"x\", \"value\": 1, \"extra\": 2}", 1).is_err());
    }
}

//! Opens JSONL traces, plain or gzip-compressed (by the `.gz` suffix).

use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{Context, Result};
use omen_sources::{read_jsonl_trace, Sample};

/// A buffered reader over the trace's decompressed text.
pub fn open(path: &Path) -> Result<Box<dyn BufRead + Send>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open the trace {}", path.display()))?;
    Ok(if path.extension().is_some_and(|e| e == "gz") {
        Box::new(BufReader::new(flate2::read::GzDecoder::new(file)))
    } else {
        Box::new(BufReader::new(file))
    })
}

/// Reads the trace in batches of samples sharing a timestamp, in file order.
/// A `.sqlite` file is an Nsight Systems export: its CUDA memory events become
/// arena KVF samples (one per device per second of trace time).
pub fn batches(path: &Path) -> Result<Box<dyn Iterator<Item = Result<Vec<Sample>>> + Send>> {
    if path.extension().is_some_and(|e| e == "sqlite") {
        let samples = omen_sources::nsys::arena_samples(path, 1000)?;
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

fn jsonl_batches(path: &Path) -> Result<impl Iterator<Item = Result<Vec<Sample>>> + Send> {
    let display = path.display().to_string();
    let mut samples = read_jsonl_trace(open(path)?).peekable();
    Ok(std::iter::from_fn(move || {
        let first = match samples.next()? {
            Ok(s) => s,
            Err(e) => return Some(Err(anyhow::anyhow!("{display}: {e}"))),
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

//! `omen train` and `omen evaluate`: the LSTM autoencoder on a NAB-style CSV
//! (`timestamp,value[,...]`), a JSONL sample trace, or the agent's SQLite store.
//! Traces and stores are resampled to one row per `--step` (last value per series,
//! carried forward), the same rows the agent builds at each health tick.
//!
//! The commands themselves run in the model worker (crates/omen-worker), which links
//! libtorch; `omen` parses the same arguments for its help and errors, then hands the
//! command line to the worker.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use omen_sources::Sample;

use omen_signals::catalogue;
use omen_store::{Resolution, Store};

/// Where the rows come from and which columns to use.
#[derive(Debug, Clone, clap::Args)]
pub struct DataArgs {
    /// NAB-style CSV (timestamp,value[,...]), JSONL trace (plain or .gz), or the agent's store (SQLite).
    #[arg(long)]
    pub data: PathBuf,
    /// Columns to use: CSV column names, or signals / series (e.g. kv_fragmentation or kv_fragmentation{layer="0"}); default all.
    #[arg(long, value_delimiter = ',')]
    pub columns: Vec<String>,
    /// Row spacing for traces and stores; use the agent's health.interval.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub step: Duration,
}

/// The LSTM autoencoder's network and training options, as `omen train` and
/// `omen evaluate-skab` both take them.
#[derive(Debug, Clone, clap::Args)]
pub struct NetworkArgs {
    /// Window length, rows.
    #[arg(long, default_value_t = 32)]
    pub window: usize,
    /// Encoder and decoder hidden units.
    #[arg(long, default_value_t = 32)]
    pub hidden: usize,
    /// Latent size.
    #[arg(long, default_value_t = 8)]
    pub latent: usize,
    /// Most epochs (early stopping on the validation split may end sooner).
    #[arg(long, default_value_t = 60)]
    pub epochs: usize,
    /// Epochs without a better validation loss before stopping.
    #[arg(long, default_value_t = 8)]
    pub patience: usize,
    /// Mini-batch size.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Adam learning rate.
    #[arg(long, default_value_t = 5e-3)]
    pub learning_rate: f64,
    /// Seed of libtorch's generator.
    #[arg(long, default_value_t = 0)]
    pub seed: i64,
}

/// `omen train` options.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainArgs {
    #[command(flatten)]
    /// Input data.
    pub data: DataArgs,
    /// Model file to write.
    #[arg(long, short)]
    pub out: PathBuf,
    /// Derived features per column: raw, diff, mean:N, std:N (comma-separated).
    #[arg(long, default_value = "raw")]
    pub features: String,
    /// Train on the first rows only (NAB's probationary period: min(15%, 750 rows)).
    #[arg(long)]
    pub nab_probation: bool,
    /// Train on this share of the first rows (default all rows; they must be normal).
    #[arg(long, default_value_t = 1.0)]
    pub train_fraction: f64,
    #[command(flatten)]
    /// The network and its training.
    pub network: NetworkArgs,
    /// Prune to this share of hidden units after training (e.g. 0.6) and report before/after.
    #[arg(long)]
    pub prune: Option<f64>,
    /// Most fine-tuning epochs after pruning; stops early as training does (--patience).
    #[arg(long, default_value_t = 60)]
    pub fine_tune: usize,
    /// libtorch threads (1 is fastest for these small LSTMs; more threads only add sync overhead).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// No progress bar (it is only drawn when stderr is a terminal anyway).
    #[arg(long)]
    pub no_progress: bool,
    /// Also write the training figures as JSON here, with the alarm rate on the rows that
    /// `--train-fraction` held back (windows at or above the POT threshold).
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// What `omen train --report` writes (the agent reads it to accept or refuse a model).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainReport {
    /// Rows in the data.
    pub rows: usize,
    /// Rows trained on (the first ones).
    pub train_rows: usize,
    /// The model's source columns, in its order.
    pub columns: Vec<String>,
    /// Epochs run.
    pub epochs_run: usize,
    /// Last training loss.
    pub train_loss: f64,
    /// Best validation loss (early stopping).
    pub val_loss: f64,
    /// Training time, seconds.
    pub seconds: f64,
    /// POT threshold on the reconstruction error.
    pub threshold: f64,
    /// Windows ending in the held-back rows (0 when none were held back).
    pub holdout_windows: usize,
    /// Of those, windows at or above the threshold (severity >= 0.6).
    pub holdout_alarms: usize,
}

impl TrainReport {
    /// Share of held-back windows that alarm (0 without any).
    pub fn holdout_alarm_rate(&self) -> f64 {
        if self.holdout_windows == 0 {
            0.0
        } else {
            self.holdout_alarms as f64 / self.holdout_windows as f64
        }
    }
}

/// `omen evaluate` options.
#[derive(Debug, Clone, clap::Args)]
pub struct EvaluateArgs {
    /// Model file from `omen train`.
    #[arg(long)]
    pub model: PathBuf,
    #[command(flatten)]
    /// Input data.
    pub data: DataArgs,
    /// Anomaly windows: NAB's combined_windows.json (the entry whose key ends the data path) or a JSON list of [start, end] timestamps.
    #[arg(long)]
    pub labels: PathBuf,
    /// Also write timestamp,anomaly_score (severity) as CSV here.
    #[arg(long)]
    pub scores: Option<PathBuf>,
    /// libtorch threads (1 is fastest for these small LSTMs; more threads only add sync overhead).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}

/// `omen evaluate-skab` options: the LSTM autoencoder on SKAB by the leaderboard's
/// protocol (per file: fit on the first 400 rows, predict every later row).
#[derive(Debug, Clone, clap::Args)]
pub struct SkabArgs {
    /// SKAB copy holding data/ (default: $OMEN_SKAB_DIR, else the repository's data/skab).
    #[arg(long)]
    pub skab: Option<PathBuf>,
    #[command(flatten)]
    /// The network and its training.
    pub network: NetworkArgs,
    /// POT risk: the probability that a normal window's error exceeds the threshold.
    #[arg(long, default_value_t = 1e-3)]
    pub pot_risk: f64,
    /// Share of the training rows (the last ones) held out for early stopping and the threshold.
    #[arg(long, default_value_t = 0.25)]
    pub validation_fraction: f64,
    /// Features per column, as `omen train --features` (e.g. raw,diff).
    #[arg(long, default_value = "raw")]
    pub features: String,
    /// Share of hidden units the pruned model keeps (its row beside the full model's).
    #[arg(long, default_value_t = 0.6)]
    pub prune: f64,
    /// Most fine-tuning epochs after pruning; stops early as training does (--patience).
    #[arg(long, default_value_t = 60)]
    pub fine_tune: usize,
    /// libtorch threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Also write the rows, per-file figures and timings as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write each file's test rows (time, error, threshold, prediction, label) as CSV under this folder.
    #[arg(long)]
    pub scores: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// Rows of named columns with their timestamps.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// One per row (CSV text, or `YYYY-MM-DD HH:MM:SS` UTC for traces and stores).
    pub timestamps: Vec<String>,
    /// Column names.
    pub columns: Vec<String>,
    /// Rows.
    pub rows: Vec<Vec<f64>>,
}

impl Table {
    /// The table restricted to `names`, in that order; every name must be a column.
    pub fn select(&self, names: &[String], path: &Path) -> Result<Table> {
        let idx: Vec<usize> = names
            .iter()
            .map(|n| {
                self.columns.iter().position(|c| c == n).with_context(|| {
                    format!(
                        "{}: no column {n:?} (the data has {:?}); give data with the model's columns",
                        path.display(),
                        self.columns
                    )
                })
            })
            .collect::<Result<_>>()?;
        Ok(Table {
            timestamps: self.timestamps.clone(),
            columns: names.to_vec(),
            rows: self.rows.iter().map(|r| idx.iter().map(|&i| r[i]).collect()).collect(),
        })
    }
}

fn is_sqlite(path: &Path) -> Result<bool> {
    let mut head = [0u8; 16];
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot open the data {}", path.display()))?;
    let n = f.read(&mut head)?;
    Ok(n == 16 && &head == b"SQLite format 3\0")
}

/// Reads a CSV, JSONL trace or store into rows (see the module doc).
pub fn load_table(args: &DataArgs) -> Result<Table> {
    let path = &args.data;
    let is_csv = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    let table = if is_csv {
        read_csv(path, &args.columns)?
    } else if is_sqlite(path)? && path.extension().is_none_or(|e| e != "sqlite") {
        pivot(store_samples(path, args.step)?, args.step, &args.columns, path)?
    } else {
        let mut samples = Vec::new();
        for batch in omen_sources::trace_file::batches(path)? {
            samples.extend(batch?);
        }
        pivot(samples, args.step, &args.columns, path)?
    };
    if table.rows.is_empty() {
        bail!("{}: no complete rows (every selected column needs a value); check --columns", path.display());
    }
    Ok(table)
}

/// A NAB-style CSV: a `timestamp` column and numeric columns (no quoting).
fn read_csv(path: &Path, columns: &[String]) -> Result<Table> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read the data {}", path.display()))?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> = lines
        .next()
        .with_context(|| format!("{}: empty file", path.display()))?
        .split(',')
        .map(|h| h.trim().to_string())
        .collect();
    let ts = header.iter().position(|h| h == "timestamp").with_context(|| {
        format!("{}: no `timestamp` column; the header must be timestamp,value[,...]", path.display())
    })?;
    let wanted: Vec<usize> = if columns.is_empty() {
        (0..header.len()).filter(|&i| i != ts).collect()
    } else {
        columns
            .iter()
            .map(|c| {
                header.iter().position(|h| h == c).with_context(|| {
                    format!("{}: no column {c:?} (columns: {:?}); fix --columns", path.display(), header)
                })
            })
            .collect::<Result<_>>()?
    };
    let mut t = Table {
        timestamps: Vec::new(),
        columns: wanted.iter().map(|&i| header[i].clone()).collect(),
        rows: Vec::new(),
    };
    for (n, line) in lines.enumerate() {
        let f: Vec<&str> = line.split(',').collect();
        let row = wanted
            .iter()
            .map(|&i| {
                let v = f.get(i).map(|s| s.trim()).unwrap_or("");
                v.parse::<f64>().ok().filter(|v| v.is_finite()).with_context(|| {
                    format!(
                        "{} line {}: {:?} in column {} is not a finite number; fill or drop the row",
                        path.display(),
                        n + 2,
                        v,
                        header[i]
                    )
                })
            })
            .collect::<Result<Vec<f64>>>()?;
        t.timestamps.push(f.get(ts).unwrap_or(&"").trim().to_string());
        t.rows.push(row);
    }
    Ok(t)
}

/// Samples of the store, as per-step means of raw samples (derived signals left out).
fn store_samples(path: &Path, step: Duration) -> Result<Vec<Sample>> {
    let store = Store::open(path)?;
    let (Some(from), Some(until)) = (store.earliest_ts()?, store.latest_ts()?) else {
        bail!("{}: the store has no raw samples; run the agent longer or give a trace", path.display());
    };
    let step_ms = (step.as_millis() as i64).max(1);
    let mut out = Vec::new();
    for signal in store.signals()? {
        if catalogue::is_derived(&signal) {
            continue;
        }
        let range = store.range(&signal, &BTreeMap::new(), from, until + 1, step_ms, Resolution::Raw)?;
        for series in range {
            for (ts_ms, value) in series.points {
                out.push(Sample { ts_ms, signal: signal.clone(), labels: series.labels.clone(), value });
            }
        }
    }
    out.sort_by_key(|s| s.ts_ms);
    Ok(out)
}

fn format_ts(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or_else(|| ms.to_string(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
}

/// One row per step: each series' last value in the step, carried forward; rows start
/// once every selected series has a value. Derived signals (scores, health) are left out.
pub fn pivot(samples: Vec<Sample>, step: Duration, columns: &[String], path: &Path) -> Result<Table> {
    let step_ms = (step.as_millis() as i64).max(1);
    let mut by_series: BTreeMap<String, BTreeMap<i64, f64>> = BTreeMap::new();
    for s in samples {
        if catalogue::is_derived(&s.signal) {
            continue;
        }
        let key = s.series_key().to_string();
        if !columns.is_empty() && !columns.iter().any(|c| *c == s.signal || *c == key) {
            continue;
        }
        by_series.entry(key).or_default().insert(s.ts_ms.div_euclid(step_ms), s.value);
    }
    if by_series.is_empty() {
        bail!("{}: no samples of the selected signals {columns:?}; check --columns", path.display());
    }
    let names: Vec<String> = by_series.keys().cloned().collect();
    let first = by_series.values().filter_map(|m| m.keys().next()).copied().max().expect("non-empty");
    let last = by_series.values().filter_map(|m| m.keys().next_back()).copied().max().expect("non-empty");
    let mut t = Table { timestamps: Vec::new(), columns: names, rows: Vec::new() };
    let mut current: Vec<Option<f64>> = vec![None; t.columns.len()];
    let mut iters: Vec<_> = by_series.values().map(|m| m.iter().peekable()).collect();
    for bucket in by_series.values().filter_map(|m| m.keys().next()).copied().min().expect("non-empty")..=last
    {
        for (c, it) in current.iter_mut().zip(iters.iter_mut()) {
            while let Some((&b, &v)) = it.peek() {
                if b > bucket {
                    break;
                }
                *c = Some(v);
                it.next();
            }
        }
        if bucket >= first {
            t.timestamps.push(format_ts(bucket * step_ms));
            t.rows.push(current.iter().map(|v| v.expect("every series started by `first`")).collect());
        }
    }
    Ok(t)
}

/// Anomaly windows from `--labels` for the data file.
pub fn load_labels(labels: &Path, data: &Path) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(labels)
        .with_context(|| format!("cannot read the labels {}", labels.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!("{}: not JSON; give NAB's combined_windows.json or a list of [start, end]", labels.display())
    })?;
    let parse = |v: &serde_json::Value| -> Result<Vec<(String, String)>> {
        serde_json::from_value(v.clone())
            .with_context(|| format!("{}: windows must be [start, end] timestamp pairs", labels.display()))
    };
    match &value {
        serde_json::Value::Array(_) => parse(&value),
        serde_json::Value::Object(map) => {
            let data_s = data.to_string_lossy().replace('\\', "/");
            let (_, v) = map.iter().find(|(k, _)| data_s.ends_with(k.as_str())).with_context(|| {
                format!(
                    "{}: no entry whose key ends the data path {data_s} (keys look like {:?}); pass the matching labels",
                    labels.display(),
                    map.keys().next()
                )
            })?;
            parse(v)
        }
        _ => bail!("{}: give NAB's combined_windows.json or a list of [start, end]", labels.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ts_ms: i64, signal: &str, value: f64) -> Sample {
        Sample { ts_ms, signal: signal.into(), labels: BTreeMap::new(), value }
    }

    #[test]
    fn pivot_carries_values_forward_from_the_first_complete_step() {
        let samples = vec![
            s(0, "a", 1.0),
            s(30_000, "a", 2.0),
            s(60_000, "b", 10.0),
            s(120_000, "a", 3.0),
            s(180_000, "b", 11.0),
            s(180_000, "health_score", 0.5),
        ];
        let t = pivot(samples, Duration::from_secs(60), &[], Path::new("x")).unwrap();
        assert_eq!(t.columns, ["a", "b"]);
        assert_eq!(t.rows, vec![vec![2.0, 10.0], vec![3.0, 10.0], vec![3.0, 11.0]]);
        assert_eq!(t.timestamps[0], "1970-01-01 00:01:00");
        let only_b = pivot(
            vec![s(0, "a", 1.0), s(0, "b", 2.0)],
            Duration::from_secs(60),
            &["b".into()],
            Path::new("x"),
        );
        assert_eq!(only_b.unwrap().columns, ["b"]);
    }

    #[test]
    fn labels_come_from_a_list_or_the_matching_nab_entry() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("l.json");
        std::fs::write(&list, r#"[["2014-01-01 00:00:00", "2014-01-02 00:00:00"]]"#).unwrap();
        assert_eq!(load_labels(&list, Path::new("d.csv")).unwrap().len(), 1);
        let nab = dir.path().join("n.json");
        std::fs::write(&nab, r#"{"realKnownCause/x.csv": [["a", "b"], ["c", "d"]], "other/y.csv": []}"#)
            .unwrap();
        assert_eq!(load_labels(&nab, Path::new("/data/realKnownCause/x.csv")).unwrap().len(), 2);
        let e = load_labels(&nab, Path::new("z.csv")).unwrap_err().to_string();
        assert!(e.contains("no entry"), "{e}");
    }
}

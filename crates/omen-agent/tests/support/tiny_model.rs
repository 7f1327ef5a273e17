//! A tiny LSTM-AE trained on a periodic series, shared by the agent's model tests and the
//! worker's (crates/omen-worker/tests includes this file by path).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The periodic `queue_depth` series (period 12, a little deterministic noise).
pub fn value(i: usize) -> f64 {
    10.0 + 3.0 * (i as f64 * std::f64::consts::TAU / 12.0).sin() + ((i * 7919) % 11) as f64 * 0.05
}

/// Writes `rows` one-minute rows of [`value`] as `dir/normal.csv` (timestamp,queue_depth).
pub fn write_normal_csv(dir: &Path, rows: usize) -> PathBuf {
    let csv = dir.join("normal.csv");
    let mut text = String::from("timestamp,queue_depth\n");
    for i in 0..rows {
        text.push_str(&format!("2026-01-01 {:02}:{:02}:00,{}\n", i / 60, i % 60, value(i)));
    }
    std::fs::write(&csv, text).unwrap();
    csv
}

/// Trains `dir/model.ot` (window 6, hidden 6, latent 3) on `rows` rows with `program train`
/// (`omen` or `omen-worker`, which take the same command line); returns the model and stdout.
pub fn train_tiny(program: &str, dir: &Path, rows: usize, epochs: usize) -> (PathBuf, String) {
    let csv = write_normal_csv(dir, rows);
    let model = dir.join("model.ot");
    let out = Command::new(program)
        .args(["train", "--data"])
        .arg(&csv)
        .arg("--out")
        .arg(&model)
        .args(["--window", "6", "--hidden", "6", "--latent", "3", "--threads", "1"])
        .args(["--epochs", &epochs.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (model, String::from_utf8_lossy(&out.stdout).into_owned())
}

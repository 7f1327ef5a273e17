//! `omen-worker evaluate-skab` (what `omen evaluate-skab` runs) on real SKAB files: one
//! file of each folder, the leaderboard's protocol, the same figures on a second run, and
//! clear errors for a missing or cut-short copy.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const WORKER: &str = env!("CARGO_BIN_EXE_omen-worker");

fn skab() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/skab/data")
}

fn run(dir: &Path, json: &Path) -> Output {
    Command::new(WORKER)
        .args(["evaluate-skab", "--no-progress", "--threads", "1", "--skab"])
        .arg(dir)
        .arg("--json")
        .arg(json)
        .output()
        .unwrap()
}

/// Copies `folder/name.csv.gz` of the repository's SKAB into `dir/data`.
fn copy(dir: &Path, folder: &str, name: &str) {
    std::fs::create_dir_all(dir.join("data").join(folder)).unwrap();
    let file = format!("{name}.csv.gz");
    std::fs::copy(skab().join(folder).join(&file), dir.join("data").join(folder).join(&file)).unwrap();
}

#[test]
fn the_lstm_ae_is_fitted_per_file_and_scored_by_skabs_scorer_the_same_each_run() {
    let dir = tempfile::tempdir().unwrap();
    copy(dir.path(), "other", "13");
    copy(dir.path(), "valve1", "0");
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let out = run(dir.path(), &a);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("| omen LSTM-AE | "), "{stdout}");
    assert!(stdout.contains("| omen LSTM-AE pruned (keep 0.6) | "), "{stdout}");
    let report: Value = serde_json::from_slice(&std::fs::read(&a).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        let s = &row["scores"];
        let f1 = s["f1"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&f1), "{row}");
        // FAR and MAR are shares of the normal and of the anomalous test rows.
        for k in ["far_pct", "mar_pct"] {
            assert!((0.0..=100.0).contains(&s[k].as_f64().unwrap()), "{row}");
        }
        let folders: Vec<&str> =
            row["by_folder"].as_array().unwrap().iter().map(|f| f[0].as_str().unwrap()).collect();
        assert_eq!(folders, ["other", "valve1"]);
    }
    let files = report["files"].as_array().unwrap();
    assert_eq!(files.len(), 2);
    for f in files {
        let rel = f["file"].as_str().unwrap();
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(skab().join(format!("{rel}.gz"))).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        // Header, 400 training rows, the rest are test rows.
        assert_eq!(f["test_rows"].as_u64().unwrap() as usize, text.lines().count() - 1 - 400, "{f}");
        assert!(f["predicted_anomalous"].as_u64().unwrap() <= f["test_rows"].as_u64().unwrap());
        assert!(f["pruned_parameters"].as_u64().unwrap() < f["parameters"].as_u64().unwrap(), "{f}");
        assert!(f["train_seconds"].as_f64().unwrap() > 0.0 && f["threshold"].as_f64().unwrap() > 0.0);
    }
    // Seeded training and fine-tuning: a second run gives the same predictions and figures.
    assert!(run(dir.path(), &b).status.success());
    let again: Value = serde_json::from_slice(&std::fs::read(&b).unwrap()).unwrap();
    assert_eq!(again["rows"], report["rows"]);
    let counts = |r: &Value| -> Vec<Value> {
        r["files"].as_array().unwrap().iter().map(|f| f["predicted_anomalous"].clone()).collect()
    };
    assert_eq!(counts(&again), counts(&report));
}

#[test]
fn a_missing_or_cut_short_copy_is_named_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let out = run(&dir.path().join("nowhere"), &json);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("nowhere") && err.contains("SKAB copy"), "{err}");

    // A file with fewer rows than the protocol trains on.
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(skab().join("valve1/0.csv.gz")).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let short: String = text.lines().take(301).map(|l| format!("{l}\n")).collect();
    std::fs::create_dir_all(dir.path().join("data/valve1")).unwrap();
    std::fs::File::create(dir.path().join("data/valve1/0.csv")).unwrap().write_all(short.as_bytes()).unwrap();
    let out = run(dir.path(), &json);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("valve1/0.csv: 300 rows") && err.contains("400 training rows"), "{err}");
    assert!(!json.exists(), "no report from a failed run");
}

//! The LSTM autoencoder end to end: `omen train` (the real binary) writes a tiny model from
//! a CSV, a real agent starts with it, samples pushed over HTTP fill its window, and
//! /metrics shows omen_lstm_ae_score. `omen evaluate` and a bad model file are checked too.
#![cfg(feature = "lstm")]

use std::process::Command;
use std::time::Duration;

use omen_agent::config::Config;
use omen_agent::run::Agent;
use serde_json::json;

#[path = "../../omen-agent/tests/support/tiny_model.rs"]
mod tiny_model;

use tiny_model::value;

/// A tiny model trained by `omen train`; `omen evaluate` on the same CSV is checked too.
fn train_tiny(dir: &std::path::Path) -> std::path::PathBuf {
    let (model, stdout) = tiny_model::train_tiny(env!("CARGO_BIN_EXE_omen"), dir, 400, 4);
    assert!(stdout.contains("POT threshold") && stdout.contains("wrote"), "{stdout}");

    // evaluate on the same CSV with one labelled window
    let labels = dir.join("labels.json");
    std::fs::write(&labels, r#"[["2026-01-01 05:00:00", "2026-01-01 05:20:00"]]"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_omen"))
        .args(["evaluate", "--model"])
        .arg(&model)
        .arg("--data")
        .arg(dir.join("normal.csv"))
        .arg("--labels")
        .arg(&labels)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("precision") && stdout.contains("| standard |"), "{stdout}");
    model
}

/// A running agent with the model, its API root and a client.
async fn start_with_model(
    dir: &std::path::Path,
    model: &std::path::Path,
) -> (Agent, String, reqwest::Client) {
    let yaml = format!(
        "store:\n  path: {}\nhttp:\n  listen: 127.0.0.1:0\nhealth:\n  interval: 1s\nmodel:\n  path: {}\n",
        dir.join("omen.db").display(),
        model.display()
    );
    let agent = omen_agent::run::start(Config::from_yaml(&yaml).unwrap()).await.unwrap();
    let base = format!("http://{}", agent.api_addr);
    let c = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    (agent, base, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_scores_the_model_and_exports_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = train_tiny(dir.path());
    let (agent, base, c) = start_with_model(dir.path(), &model).await;
    // One sample a second of event time: a tick each, 6 ticks fill the window.
    push(&c, &base, T0, 0, 12).await;
    let mut score = None;
    for _ in 0..50 {
        score = lstm_gauge(&c, &base).await;
        if score.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let v = score.expect("omen_lstm_ae_score in /metrics");
    assert!((0.0..=1.0).contains(&v), "{v}");

    // A value far outside the pattern: the model's score passes the warning level, and the
    // health reasons name the series behind its error.
    for i in 12..16 {
        let r = c
            .post(format!("{base}/v1/ingest/samples"))
            .json(&json!({"samples": [{"ts_ms": T0 + i * 1000, "signal": "queue_depth", "value": 400.0}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let latest: serde_json::Value =
        c.get(format!("{base}/scores/latest")).send().await.unwrap().json().await.unwrap();
    // A user's model file is used as is: nothing is trained.
    let status = &latest["health"]["model"];
    assert_eq!((&status["origin"], &status["state"]), (&json!("file"), &json!("active")), "{status}");
    assert_eq!(status["inputs"], json!(["queue_depth"]), "{status}");
    assert!(status["last_training"].is_null(), "{status}");
    let reasons = latest["health"]["reasons"].as_array().expect("reasons");
    let model = reasons.iter().find(|r| r["kind"] == "model").unwrap_or_else(|| panic!("{latest}"));
    assert!(model["score"].as_f64().unwrap() >= 0.6, "{model}");
    assert_eq!(model["contributors"], json!([{"series": "queue_depth", "share": 1.0}]), "{model}");
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_model_file_stops_start_up_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("broken.ot");
    std::fs::write(&model, b"garbage").unwrap();
    let yaml = format!(
        "store:\n  path: {}\nhttp:\n  listen: 127.0.0.1:0\nmodel:\n  path: {}\n",
        dir.path().join("omen.db").display(),
        model.display()
    );
    let e = omen_agent::run::start(Config::from_yaml(&yaml).unwrap()).await.err().unwrap();
    let msg = format!("{e:#}");
    assert!(msg.contains("model.path") && msg.contains("broken.ot") && msg.contains("omen train"), "{msg}");
}

/// The model worker among this process's children (the agent runs in-process here).
fn worker_pid() -> Option<u32> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse::<u32>().ok()).collect::<Vec<_>>())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "omen-worker")
        })
}

/// Event time of the first pushed sample.
const T0: i64 = 1_793_577_600_000;

/// Pushes samples `from..to` of the series, one a second of event time from `t0`.
async fn push(c: &reqwest::Client, base: &str, t0: i64, from: usize, to: usize) {
    for i in from..to {
        let r = c
            .post(format!("{base}/v1/ingest/samples"))
            .json(&json!({"samples": [{"ts_ms": t0 + i as i64 * 1000, "signal": "queue_depth", "value": value(i)}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "push {i}: {}", r.text().await.unwrap());
    }
}

/// The `omen_lstm_ae_score` gauge in /metrics, if exported.
async fn lstm_gauge(c: &reqwest::Client, base: &str) -> Option<f64> {
    let text = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find(|l| l.starts_with("omen_lstm_ae_score "))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_model_worker_costs_the_score_not_the_samples_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let model = train_tiny(dir.path());
    let (agent, base, c) = start_with_model(dir.path(), &model).await;
    let t0 = T0;
    push(&c, &base, t0, 0, 8).await;
    assert!(lstm_gauge(&c, &base).await.is_some(), "no score after the window filled");

    let pid = worker_pid().expect("the agent started an omen-worker child");
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    std::thread::sleep(Duration::from_millis(200));
    // Pushes still get 200, which is sent only once the batch is committed (a failed batch
    // gets a 5xx); the score is withdrawn, not left stale.
    push(&c, &base, t0, 8, 12).await;
    assert_eq!(lstm_gauge(&c, &base).await, None);

    // After the restart delay a new worker loads the model again and the score returns.
    tokio::time::sleep(omen_agent::worker::RESTART_AFTER).await;
    push(&c, &base, t0, 12, 20).await;
    assert!(lstm_gauge(&c, &base).await.is_some(), "no score after the worker was restarted");
    let new_pid = worker_pid().expect("a new worker");
    assert_ne!(new_pid, pid);
    agent.stop().await.unwrap();
}

#[test]
fn omen_train_passes_the_worker_error_and_exit_code_on() {
    let out = Command::new(env!("CARGO_BIN_EXE_omen"))
        .args(["train", "--data", "/nonexistent/normal.csv", "--out", "/nonexistent/model.ot"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("omen: ") && stderr.contains("/nonexistent/normal.csv"), "{stderr}");
}

/// `omen evaluate-detectors --lstm-ae` ranks omen's LSTM autoencoder (fitted per file by the
/// model worker) among the published SKAB rows; a copy of two SKAB files keeps it short.
#[cfg(feature = "lab")]
#[test]
fn evaluate_detectors_ranks_the_lstm_ae_in_the_skab_table() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let skab = dir.path().join("skab");
    for (folder, file) in [("other", "13.csv.gz"), ("valve1", "0.csv.gz")] {
        std::fs::create_dir_all(skab.join("data").join(folder)).unwrap();
        std::fs::copy(
            root.join("data/skab/data").join(folder).join(file),
            skab.join("data").join(folder).join(file),
        )
        .unwrap();
        for algorithm in std::fs::read_dir(root.join("data/skab/published")).unwrap() {
            let algorithm = algorithm.unwrap().file_name();
            let to = skab.join("published").join(&algorithm).join(folder);
            std::fs::create_dir_all(&to).unwrap();
            std::fs::copy(
                root.join("data/skab/published").join(&algorithm).join(folder).join(file),
                to.join(file),
            )
            .unwrap();
        }
    }
    let json = dir.path().join("detectors.json");
    let out = Command::new(env!("CARGO_BIN_EXE_omen"))
        .args(["evaluate-detectors", "--no-progress", "--lstm-ae", "--skab-only", "--skab"])
        .arg(&skab)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("SKAB, 2 files"), "{stdout}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = report["skab"]["detectors"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["algorithm"].as_str().unwrap()).collect();
    assert!(
        names.contains(&"omen LSTM-AE") && names.contains(&"omen LSTM-AE pruned (keep 0.6)"),
        "{names:?}"
    );
    assert!(names.contains(&"Conv_AE") && names.len() == 12, "{names:?}");
    let f1: Vec<f64> = rows.iter().map(|r| r["scores"]["f1"].as_f64().unwrap()).collect();
    assert!(f1.windows(2).all(|w| w[0] >= w[1]), "ranked by F1: {f1:?}");
    assert!(stdout.contains("| omen LSTM-AE | ") && !stdout.contains("NAB, 51 files"), "{stdout}");
    assert!(report.get("nab").is_none(), "--skab-only skips NAB");
}

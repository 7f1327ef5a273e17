//! The LSTM autoencoder end to end: `omen train` (the real binary) writes a tiny model from
//! a CSV, a real agent starts with it, samples pushed over HTTP fill its window, and
//! /metrics shows omen_lstm_ae_score. `omen evaluate` and a bad model file are checked too.
#![cfg(feature = "lstm")]

use std::process::Command;
use std::time::Duration;

use omen_agent::config::Config;
use serde_json::json;

fn value(i: usize) -> f64 {
    10.0 + 3.0 * (i as f64 * std::f64::consts::TAU / 12.0).sin() + ((i * 7919) % 11) as f64 * 0.05
}

fn train_tiny(dir: &std::path::Path) -> std::path::PathBuf {
    let csv = dir.join("normal.csv");
    let mut text = String::from("timestamp,queue_depth\n");
    for i in 0..400 {
        text.push_str(&format!("2026-01-01 {:02}:{:02}:00,{}\n", i / 60, i % 60, value(i)));
    }
    std::fs::write(&csv, text).unwrap();
    let model = dir.join("model.ot");
    let out = Command::new(env!("CARGO_BIN_EXE_omen"))
        .args(["train", "--data"])
        .arg(&csv)
        .arg("--out")
        .arg(&model)
        .args(["--window", "6", "--hidden", "6", "--latent", "3", "--epochs", "4", "--threads", "1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("POT threshold") && stdout.contains("wrote"), "{stdout}");

    // evaluate on the same CSV with one labelled window
    let labels = dir.join("labels.json");
    std::fs::write(&labels, r#"[["2026-01-01 05:00:00", "2026-01-01 05:20:00"]]"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_omen"))
        .args(["evaluate", "--model"])
        .arg(&model)
        .arg("--data")
        .arg(&csv)
        .arg("--labels")
        .arg(&labels)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("precision") && stdout.contains("| standard |"), "{stdout}");
    model
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_scores_the_model_and_exports_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = train_tiny(dir.path());
    let yaml = format!(
        "store:\n  path: {}\nhttp:\n  listen: 127.0.0.1:0\nhealth:\n  interval: 1s\nmodel:\n  path: {}\n",
        dir.path().join("omen.db").display(),
        model.display()
    );
    let cfg = Config::from_yaml(&yaml).unwrap();
    let agent = omen_agent::run::start(cfg).await.unwrap();
    let base = format!("http://{}", agent.api_addr);
    let c = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let t0 = 1_793_577_600_000i64;
    // One sample a second of event time: a tick each, 6 ticks fill the window.
    for i in 0..12 {
        let r = c
            .post(format!("{base}/v1/ingest/samples"))
            .json(&json!({"samples": [{"ts_ms": t0 + i as i64 * 1000, "signal": "queue_depth", "value": value(i)}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let mut text = String::new();
    for _ in 0..50 {
        text = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
        if text.contains("omen_lstm_ae_score ") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let line =
        text.lines().find(|l| l.starts_with("omen_lstm_ae_score ")).unwrap_or_else(|| panic!("{text}"));
    let v: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!((0.0..=1.0).contains(&v), "{line}");
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
    let yaml = format!(
        "store:\n  path: {}\nhttp:\n  listen: 127.0.0.1:0\nhealth:\n  interval: 1s\nmodel:\n  path: {}\n",
        dir.path().join("omen.db").display(),
        model.display()
    );
    let agent = omen_agent::run::start(Config::from_yaml(&yaml).unwrap()).await.unwrap();
    let base = format!("http://{}", agent.api_addr);
    let c = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let t0 = 1_793_577_600_000i64;
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

//! The agent trains its own LSTM-AE (config `model` without `path`) during a recorded
//! trace: the real agent replays a 7-day trace as fast as it can, trains with the real
//! `omen-worker train` at day 2 (refused: the held-back hours hold a disturbance), day 4
//! and day 6 (accepted, the previous file kept), scores with the model, exports its status,
//! and a restart picks the trained model up; a model file it cannot load is moved aside.
#![cfg(feature = "lstm")]

use std::path::Path;
use std::time::Duration;

use omen_agent::config::Config;
use serde_json::Value;

const T0: i64 = 1_793_577_600_000;
const DAY: i64 = 86_400_000;
const MINUTE: i64 = 60_000;

/// Uniform noise in [-0.5, 0.5), a hash of the minute and the series.
fn noise(m: i64, series: u64) -> f64 {
    let mut x = (m as u64).wrapping_mul(2_654_435_761).wrapping_add(series * 40_503) % (1 << 32);
    x ^= x >> 13;
    x = x.wrapping_mul(1_274_126_177) % (1 << 32);
    x ^= x >> 16;
    x as f64 / (1u64 << 32) as f64 - 0.5
}

/// Minute `m`'s samples of the two series: a daily cycle with noise, KVF moved by `off`.
fn samples(m: i64, off: f64) -> [Value; 2] {
    let ts = T0 + m * MINUTE;
    let phase = (m % 1440) as f64 / 1440.0 * std::f64::consts::TAU;
    let kvf = 1.5 + 0.3 * phase.sin() + 0.1 * noise(m, 1) + off;
    let tle = 2.0 + 0.5 * phase.cos() + 0.2 * noise(m, 2);
    [
        serde_json::json!({"ts_ms": ts, "signal": "kv_fragmentation", "labels": {"layer": "0"}, "value": kvf}),
        serde_json::json!({"ts_ms": ts, "signal": "tle_bits", "value": tle}),
    ]
}

/// The two series as a JSONL trace of `days`; `disturbed` minutes are far off.
fn write_trace(path: &Path, days: i64, disturbed: std::ops::Range<i64>) {
    let mut text = String::new();
    for m in 0..days * 1440 {
        let off = if disturbed.contains(&(T0 + m * MINUTE)) { 25.0 } else { 0.0 };
        for sample in samples(m, off) {
            text.push_str(&format!("{sample}\n"));
        }
    }
    std::fs::write(path, text).unwrap();
}

fn config(dir: &Path, trace: Option<&Path>) -> Config {
    let trace = trace.map_or(String::new(), |t| format!("sources:\n  trace:\n    path: {}\n", t.display()));
    let yaml = format!(
        "store:\n  path: {}\nhttp:\n  listen: 127.0.0.1:0\n{trace}\
         model:\n  train_after: 2d\n  retrain_every: 2d\n  train_window: 2d\n  signals: [kv_fragmentation, tle_bits]\n",
        dir.join("omen.db").display()
    );
    Config::from_yaml(&yaml).unwrap()
}

async fn get(c: &reqwest::Client, url: String) -> String {
    c.get(url).send().await.unwrap().text().await.unwrap()
}

fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_trains_validates_and_swaps_its_own_model_during_a_replay() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    // Disturbed during the last 3 hours before day 2: inside the first training's held-back rows.
    write_trace(&trace, 7, T0 + 2 * DAY - 3 * 3_600_000..T0 + 2 * DAY - 60 * MINUTE);
    let c = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();

    let mut agent = omen_agent::run::start(config(dir.path(), Some(&trace))).await.unwrap();
    let base = format!("http://{}", agent.api_addr);
    agent.trace_finished().await;
    let mut latest = Value::Null;
    for _ in 0..600 {
        latest = serde_json::from_str(&get(&c, format!("{base}/scores/latest")).await).unwrap();
        if latest["health"]["ts_ms"].as_i64() >= Some(T0 + 7 * DAY - 2 * MINUTE) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let model = &latest["health"]["model"];
    assert_eq!(model["origin"], "trained", "{latest:#}");
    assert_eq!(model["state"], "active", "{model:#}");
    assert_eq!(model["inputs"].as_array().unwrap().len(), 2, "{model:#}");
    // The last training started at day 6 (the schedule counts from each start).
    assert_eq!(model["last_training"]["started_ms"], T0 + 6 * DAY, "{model:#}");
    assert_eq!(model["last_training"]["outcome"], "accepted", "{model:#}");
    assert_eq!(model["trained_until_ms"], T0 + 6 * DAY, "{model:#}");
    let v = &model["validation"];
    assert!(v["windows"].as_u64().unwrap() > 100, "{v}");
    assert!(v["alarm_rate"].as_f64().unwrap() <= 0.05, "{v}");
    assert!(model["age_seconds"].as_f64().unwrap() >= 86_000.0, "{model:#}");
    // Newest first: day 6 and day 4 accepted, day 2 refused for the disturbed held-back hours.
    let recent = model["recent_trainings"].as_array().unwrap();
    let outcomes: Vec<&str> = recent.iter().map(|o| o["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["accepted", "accepted", "refused"], "{model:#}");
    let refused = recent[2]["detail"].as_str().unwrap();
    assert!(refused.contains("held-back windows") && refused.contains("model.max_alarm_rate"), "{refused}");
    let rate: f64 = refused.split('(').nth(1).unwrap().split('%').next().unwrap().parse().unwrap();
    assert!(rate > 10.0, "the disturbance alarms on far more than the bound: {refused}");

    let metrics = get(&c, format!("{base}/metrics")).await;
    assert_eq!(metric(&metrics, "omen_model_trainings_total{outcome=\"refused\"}"), Some(1.0), "{metrics}");
    assert_eq!(metric(&metrics, "omen_model_trainings_total{outcome=\"accepted\"}"), Some(2.0), "{metrics}");
    assert_eq!(metric(&metrics, "omen_model_active{origin=\"trained\"}"), Some(1.0));
    assert!(metric(&metrics, "omen_model_age_seconds{origin=\"trained\"}").unwrap() >= 86_000.0);
    assert!(metric(&metrics, "omen_lstm_ae_score").is_some(), "the trained model scores: {metrics}");
    agent.stop().await.unwrap();

    let models = dir.path().join("models");
    let mut files: Vec<String> =
        std::fs::read_dir(&models).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    files.sort();
    // No candidate and no training data left behind; the last training's log is kept.
    assert_eq!(
        files,
        [
            "lstm-ae.json",
            "lstm-ae.ot",
            "lstm-ae.previous.json",
            "lstm-ae.previous.ot",
            "schedule.json",
            "training.log"
        ]
    );

    // A restart uses the trained model at once, without training.
    let agent = omen_agent::run::start(config(dir.path(), None)).await.unwrap();
    let metrics = get(&c, format!("http://{}/metrics", agent.api_addr)).await;
    assert_eq!(metric(&metrics, "omen_model_active{origin=\"trained\"}"), Some(1.0), "{metrics}");
    agent.stop().await.unwrap();

    // A model file that cannot be loaded (another version, damage) is moved aside, not fatal.
    std::fs::write(models.join("lstm-ae.ot"), b"not a model").unwrap();
    let agent = omen_agent::run::start(config(dir.path(), None)).await.unwrap();
    let metrics = get(&c, format!("http://{}/metrics", agent.api_addr)).await;
    assert_eq!(metric(&metrics, "omen_model_active{origin=\"trained\"}"), None, "{metrics}");
    agent.stop().await.unwrap();
    let aside: Vec<String> = std::fs::read_dir(&models)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("lstm-ae.bad-"))
        .collect();
    assert_eq!(aside.len(), 2, "the file and its record moved aside: {aside:?}");
}

/// Live: samples pushed over HTTP, the training runs beside the pipeline (no waiting), and
/// the accepted model is swapped in at a later tick while pushes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_the_training_runs_beside_the_pipeline_and_the_model_joins_later() {
    let dir = tempfile::tempdir().unwrap();
    let agent = omen_agent::run::start(config(dir.path(), None)).await.unwrap();
    let base = format!("http://{}", agent.api_addr);
    let c = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let hour = |h: i64| -> Value {
        let pushed: Vec<Value> = (h * 60..(h + 1) * 60).flat_map(|m| samples(m, 0.0)).collect();
        serde_json::json!({ "samples": pushed })
    };
    let push = |h: i64| {
        let (c, base, body) = (c.clone(), base.clone(), hour(h));
        async move {
            let r = c.post(format!("{base}/v1/ingest/samples")).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        }
    };
    for h in 0..=48 {
        push(h).await;
    }
    // Day 2 has passed: the training started and runs while the pipeline goes on.
    let latest: Value = serde_json::from_str(&get(&c, format!("{base}/scores/latest")).await).unwrap();
    assert_eq!(latest["health"]["model"]["state"], "training", "{:#}", latest["health"]["model"]);
    let mut state = Value::Null;
    for h in 49..49 + 24 * 4 {
        push(h).await;
        let latest: Value = serde_json::from_str(&get(&c, format!("{base}/scores/latest")).await).unwrap();
        state = latest["health"]["model"].clone();
        if state["state"] == "active" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(state["state"], "active", "{state:#}");
    assert_eq!(state["last_training"]["outcome"], "accepted", "{state:#}");
    // Trained on the data up to its start (the tick of the push that crossed day 2: a batch
    // ticks at its newest sample), and joined later.
    assert_eq!(state["trained_until_ms"], T0 + 2 * DAY + 59 * MINUTE, "{state:#}");
    assert!(state["age_seconds"].as_f64().unwrap() > 0.0, "{state:#}");
    agent.stop().await.unwrap();
}

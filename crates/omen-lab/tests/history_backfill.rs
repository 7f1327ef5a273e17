//! `history.prometheus_url` against the real Prometheus: a TSDB backfilled by promtool with
//! 20 days of omen's exported gauges, served by `prometheus` on loopback; an agent that starts
//! on an empty store loads the day aggregates from it and forecasts on its first tick.
//! Needs `prometheus` and `promtool` (Debian package prometheus, installed by `make setup`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use omen_agent::config::Config;
use omen_signals::quantile_linear;
use omen_store::{Store, DAY_MS};
use serde_json::{json, Value};

/// Days of history in the TSDB, ending yesterday.
const DAYS: i64 = 20;
/// Sample spacing, seconds (a 5-minute scrape).
const STEP_S: i64 = 300;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Our series: KVF of two layers rising 0.02 a day with a daily wave, VRAM headroom falling;
/// and a decoy in another namespace that the match must leave out. Values as written.
type Series = (String, BTreeMap<&'static str, &'static str>, Vec<(i64, f64)>);

fn generate(today_ms: i64) -> Vec<Series> {
    let mut out = Vec::new();
    let labels = |layer: Option<&'static str>, ns: &'static str| {
        let mut l: BTreeMap<&'static str, &'static str> =
            [("gpu", "0"), ("job", "omen"), ("instance", "10.0.0.7:9464"), ("namespace", ns)].into();
        if let Some(layer) = layer {
            l.insert("layer", layer);
        }
        l
    };
    let points = |f: &dyn Fn(f64) -> f64| -> Vec<(i64, f64)> {
        let start_s = (today_ms - DAYS * DAY_MS) / 1000;
        (0..DAYS * 86_400 / STEP_S)
            .map(|k| {
                let t = start_s + k * STEP_S;
                let day = (t * 1000 - (today_ms - DAYS * DAY_MS)) as f64 / DAY_MS as f64;
                let v: f64 = format!("{:.6}", f(day)).parse().unwrap();
                (t, v)
            })
            .collect()
    };
    let wave = |day: f64| 0.05 * (day * std::f64::consts::TAU).sin();
    out.push((
        "omen_kv_fragmentation".into(),
        labels(Some("0"), "llm"),
        points(&|d| 1.2 + 0.02 * d + wave(d)),
    ));
    // Exported by an omen from before the rename: its days are backfilled under the new name.
    out.push(("omen_kvf_ratio".into(), labels(Some("1"), "llm"), points(&|d| 1.1 + 0.02 * d + wave(d))));
    out.push(("omen_kv_fragmentation".into(), labels(Some("0"), "other"), points(&|_| 9.0)));
    out.push(("omen_gpu_memory_headroom_ratio".into(), labels(None, "llm"), points(&|d| 0.5 - 0.01 * d)));
    out
}

/// The OpenMetrics text promtool reads: one family after another, each series in time order.
fn openmetrics(series: &[Series]) -> String {
    let mut text = String::new();
    let mut family = "";
    for (name, labels, points) in series {
        if name != family {
            text.push_str(&format!("# TYPE {name} gauge\n"));
            family = name;
        }
        let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        for (t, v) in points {
            text.push_str(&format!("{name}{{{}}} {v} {t}\n", l.join(",")));
        }
    }
    text.push_str("# EOF\n");
    text
}

/// promtool creates the blocks, prometheus serves them; returns the server and its URL.
fn start_prometheus(dir: &Path, series: &[Series]) -> (omen_lab::baseline::Killed, String) {
    let input = dir.join("history.om");
    std::fs::write(&input, openmetrics(series)).unwrap();
    let tsdb = dir.join("tsdb");
    let out = Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&input)
        .arg(&tsdb)
        .output()
        .expect("promtool not found: install the Debian package prometheus (make setup does)");
    assert!(out.status.success(), "promtool: {}", String::from_utf8_lossy(&out.stderr));
    // The same starter the predict_linear baseline uses (a blocking client: off the runtime).
    let tools = omen_lab::baseline::PrometheusTools::default();
    tokio::task::block_in_place(|| omen_lab::baseline::start_prometheus(&tools, dir, &tsdb))
        .expect("prometheus")
}

fn config(dir: &Path, url: &str) -> Config {
    let yaml = format!(
        "store:\n  path: {}\nhttp:\n  listen: 127.0.0.1:0\nhistory:\n  prometheus_url: {url}\n  match_labels: {{namespace: llm}}\n  timeout: 10s\n",
        dir.join("omen.db").display()
    );
    Config::from_yaml(&yaml).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_on_an_empty_store_backfills_its_forecast_days_from_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let now_ms = chrono::Utc::now().timestamp_millis();
    let today = now_ms.div_euclid(DAY_MS) * DAY_MS;
    let series = generate(today);
    let (_prometheus, url) = start_prometheus(dir.path(), &series);

    // The backfill itself, on a store of its own: every day of every selected series, with
    // the statistics computed here from the same values.
    let cfg = config(dir.path(), &url);
    let store = Store::open(&dir.path().join("direct.db")).unwrap();
    let done = omen_agent::history::backfill(&cfg, &store, now_ms).await.unwrap().expect("configured");
    assert!(done.problems.is_empty(), "{:?}", done.problems);
    assert_eq!((done.series, done.rows), (3, 3 * DAYS as usize));
    for (name, labels, points) in series.iter().filter(|s| s.1["namespace"] == "llm") {
        let signal = omen_signals::catalogue::current_name(name.strip_prefix("omen_").unwrap());
        let want_labels: BTreeMap<String, String> = labels
            .iter()
            .filter(|(k, _)| !["job", "instance", "namespace"].contains(k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let stored: Vec<_> = store
            .day_aggregates(signal, today - DAYS * DAY_MS, today)
            .unwrap()
            .into_iter()
            .filter(|d| d.key.labels == want_labels)
            .collect();
        assert_eq!(stored.len(), DAYS as usize, "{signal} {want_labels:?}");
        for d in &stored {
            let mut day: Vec<f64> = points
                .iter()
                .filter(|(t, _)| (d.day_ms..d.day_ms + DAY_MS).contains(&(t * 1000)))
                .map(|p| p.1)
                .collect();
            day.sort_by(f64::total_cmp);
            assert_eq!(d.count, day.len() as i64, "{signal} day {}", d.day_ms);
            let mean = day.iter().sum::<f64>() / day.len() as f64;
            for (got, want) in [
                (d.mean, mean),
                (d.min, day[0]),
                (d.max, day[day.len() - 1]),
                (d.p50, quantile_linear(&day, 0.5)),
                (d.p95, quantile_linear(&day, 0.95)),
                (d.p99, quantile_linear(&day, 0.99)),
            ] {
                assert!((got - want).abs() < 1e-9, "{signal} day {}: {got} vs {want}", d.day_ms);
            }
        }
    }
    // A second start finds the day aggregates and leaves them alone.
    assert!(omen_agent::history::backfill(&cfg, &store, now_ms).await.unwrap().is_none());

    // The agent: it backfills at start and its first tick (on the first pushed sample) forecasts.
    let agent = omen_agent::run::start(cfg).await.unwrap();
    let base = format!("http://{}", agent.api_addr);
    let c = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let r = c
        .post(format!("{base}/v1/ingest/samples"))
        .json(&json!({"samples": [{"signal": "kv_fragmentation", "labels": {"gpu": "0", "layer": "0"}, "value": 1.6}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let latest: Value = c.get(format!("{base}/scores/latest")).send().await.unwrap().json().await.unwrap();
    let forecasts = latest["health"]["forecasts"].as_array().expect("forecasts").clone();
    let kvf = forecasts.iter().find(|f| f["slo"] == "kvf").unwrap();
    // Every backfilled day is in the trend.
    assert_eq!(kvf["days"], DAYS, "{kvf}");
    let slope = kvf["slope_per_day"].as_f64().unwrap();
    assert!((slope - 0.02).abs() < 0.002, "{kvf}");
    let headroom = forecasts.iter().find(|f| f["slo"] == "vram_headroom").unwrap();
    assert!((headroom["slope_per_day"].as_f64().unwrap() + 0.01).abs() < 0.001, "{headroom}");
    let ttft = forecasts.iter().find(|f| f["slo"] == "ttft_p99").unwrap();
    assert_eq!(ttft["days"], 0, "no TTFT history in Prometheus: {ttft}");
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_garbled_prometheus_is_reported_and_the_agent_starts() {
    let dir = tempfile::tempdir().unwrap();
    let now_ms = chrono::Utc::now().timestamp_millis();

    // Nothing listens there.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let cfg = config(dir.path(), &closed);
    let store = Arc::new(Store::open(&dir.path().join("a.db")).unwrap());
    let done = omen_agent::history::backfill(&cfg, &store, now_ms).await.unwrap().unwrap();
    assert_eq!(done.rows, 0);
    assert_eq!(done.problems.len(), 1, "one line, not one per query: {:?}", done.problems);
    assert!(done.problems[0].contains("cannot be reached"), "{:?}", done.problems);
    assert!(!store.has_day_aggregates().unwrap());
    let agent = omen_agent::run::start(cfg).await.unwrap();
    agent.stop().await.unwrap();

    // Something that answers, but not Prometheus' API.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let garbled = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 15\r\nconnection: close\r\n\r\n<html>hi</html>");
        }
    });
    let cfg = config(dir.path(), &garbled);
    let store = Store::open(&dir.path().join("b.db")).unwrap();
    let done = omen_agent::history::backfill(&cfg, &store, now_ms).await.unwrap().unwrap();
    assert_eq!(done.rows, 0);
    assert!(!done.problems.is_empty());
    for p in &done.problems {
        assert!(p.contains("not a Prometheus API answer") && p.contains("<html>"), "{p}");
    }
    let agent = omen_agent::run::start(cfg).await.unwrap();
    agent.stop().await.unwrap();
}

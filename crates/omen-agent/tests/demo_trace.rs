//! `make run`'s default: the agent replays the embedded demo trace through the
//! live pipeline and then serves what it concluded.

use std::time::Duration;

use omen_agent::config::Config;
use serde_json::Value;

/// Highest stored health score in [since, until) at `step`, with the /scores reply.
async fn peak_health(c: &reqwest::Client, base: &str, since: &str, until: &str, step: &str) -> (f64, Value) {
    let url = format!("{base}/scores?signal=health_score&since={since}&until={until}&step={step}");
    let r: Value = c.get(url).send().await.unwrap().json().await.unwrap();
    let peak = r["series"][0]["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_f64().unwrap())
        .fold(0.0, f64::max);
    (peak, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_trace_raises_the_early_warning_and_flags_the_model_change() {
    let dir = tempfile::tempdir().unwrap();
    let local = include_str!("../../../deploy/omen.local.yaml");
    let mut cfg = Config::from_yaml(local).unwrap();
    cfg.store.path = dir.path().join("omen.db");
    cfg.http.listen = "127.0.0.1:0".parse().unwrap();
    let trace = cfg.sources.trace.as_mut().unwrap();
    trace.path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(&trace.path);

    let mut agent = omen_agent::run::start(cfg).await.unwrap();
    tokio::time::timeout(Duration::from_secs(300), agent.trace_finished())
        .await
        .expect("trace replayed within 5 minutes");
    let base = format!("http://{}", agent.api_addr);
    let c = reqwest::Client::new();
    // the pipeline drains its queue after the source finished
    let mut latest = Value::Null;
    for _ in 0..100 {
        latest = c.get(format!("{base}/scores/latest")).send().await.unwrap().json().await.unwrap();
        if latest["ts"] == "2026-12-06T23:50:00Z" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let health = &latest["health"];
    assert!(health["health_score"].as_f64().unwrap() >= 0.6, "{health}");
    let forecasts = health["forecasts"].as_array().unwrap();
    let kv = forecasts.iter().find(|f| f["slo"] == "kv_usage").unwrap();
    assert_eq!(kv["early_warning"], true, "{kv}");
    let ttft = forecasts.iter().find(|f| f["slo"] == "ttft_p99").unwrap();
    assert_eq!(ttft["early_warning"], false, "{ttft}");
    // The level above ok says why: the kv_usage early warning, with its days to breach.
    let reasons = health["reasons"].as_array().unwrap();
    let early = reasons.iter().find(|r| r["kind"] == "early_warning" && r["slo"] == "kv_usage");
    let early = early.unwrap_or_else(|| panic!("no kv_usage early warning among the reasons: {health}"));
    assert_eq!(early["days_to_breach"], kv["days_to_breach"], "{early}");

    // The model change on day 20.5 lasts: it is kept as a level shift of TLE or RCI.
    let changes = health["changes"].as_array().unwrap();
    let model_change = changes.iter().find(|c| {
        let since = c["since_ms"].as_i64().unwrap();
        ["tle_bits", "rci"].contains(&c["signal"].as_str().unwrap())
            && (1_795_348_800_000..1_795_392_000_000).contains(&since) // 2026-11-22T12:00 to 2026-11-23T00:00
    });
    assert!(model_change.is_some(), "no lasting TLE/RCI shift after the model change: {changes:?}");

    // the model change on day 20.5 shows in the stored health history as critical (an
    // 8-hour window: older than the raw retention, it reads the minute aggregates)
    let (peak, r) = peak_health(&c, &base, "2026-11-22T08:00:00Z", "2026-11-22T16:00:00Z", "10m").await;
    assert!(peak >= 0.8, "{r}");
    let (calm, before) = peak_health(&c, &base, "2026-11-03T00:00:00Z", "2026-11-08T00:00:00Z", "1h").await;
    assert!(calm < 0.6, "no alert before the drift is forecastable: {before}");

    // The forecast view: the kv_usage warning started about 14 days before the first day
    // the indicator crossed 0.95, and said so.
    let view: Value =
        c.get(format!("{base}/scores/forecast?slo=kv_usage")).send().await.unwrap().json().await.unwrap();
    let day_ms =
        |t: &str| chrono::DateTime::parse_from_rfc3339(t).unwrap().timestamp_millis() as f64 / 86_400_000.0;
    let warning = &view["warning"];
    let since = day_ms(warning["since"].as_str().unwrap_or_else(|| panic!("no warning in {view}")));
    let beyond = view["first_day_beyond"].as_str().unwrap_or_else(|| panic!("no breach in {view}"));
    let lead = day_ms(&format!("{beyond}T12:00:00Z")) - since;
    assert!((14.0..=17.0).contains(&lead), "warned {lead:.1} days before the breach: {view}");
    let said = warning["days_to_breach"].as_f64().unwrap();
    assert!((said - lead).abs() <= 2.0, "said {said:.1} days, was {lead:.1}: {view}");
    assert!(
        !warning["trend"].as_array().unwrap().is_empty() && view["daily"].as_array().unwrap().len() >= 28
    );
    let svg = c.get(format!("{base}/scores/forecast?slo=kv_usage&format=svg")).send().await.unwrap();
    assert_eq!(svg.headers()["content-type"], "image/svg+xml");
    let svg = svg.text().await.unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("threshold 0.95"), "{}", &svg[..svg.len().min(300)]);
    for (query, status, says) in [
        ("", 400, "kv_usage"),
        ("?slo=latency", 404, "ttft_p99"),
        ("?slo=kv_usage&format=png", 400, "json or svg"),
    ] {
        let r = c.get(format!("{base}/scores/forecast{query}")).send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{query}");
        let body = r.text().await.unwrap();
        assert!(body.contains(says), "{query}: {body}");
    }

    let metrics = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("omen_forecast_time_to_breach_seconds{slo=\"kv_usage\"}"), "{metrics}");
    assert!(metrics.contains("omen_anomaly_score{"), "{metrics}");
    agent.stop().await.unwrap();
}

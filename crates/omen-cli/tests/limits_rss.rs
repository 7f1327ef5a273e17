//! The agent's memory stays bounded whatever is pushed: a real `omen run` process on
//! loopback takes 101,000 distinct label sets; pushes past `limits` get a 422 that names the
//! cap and its config key, are counted, and cost no memory; existing series keep working.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

mod common;

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn batch(signal: &str, ids: std::ops::Range<usize>) -> Value {
    let samples: Vec<Value> = ids
        .map(|i| json!({"signal": signal, "labels": {"request_id": format!("r{i}")}, "value": i as f64}))
        .collect();
    json!({ "samples": samples })
}

#[test]
fn a_flood_of_label_sets_is_capped_counted_and_costs_no_memory() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let config = dir.path().join("omen.yaml");
    std::fs::write(
        &config,
        format!(
            "store:\n  path: {}\nhttp:\n  listen: 127.0.0.1:{port}\n  metrics_listen: null\n",
            dir.path().join("omen.db").display()
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_omen"))
        .args(["run", "--config", config.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start omen run");
    let agent = Agent(child);
    let pid = agent.0.id();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    common::wait_until("the agent to become ready", 30, || common::agent_ready(&base));
    let push = |body: &Value| {
        let r = client.post(format!("{base}/v1/ingest/samples")).json(body).send().unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().unwrap())
    };
    assert_eq!(push(&batch("warmup", 0..1)).0, 200);
    let idle_kb = rss_kb(pid);

    // 10 signals x 2,000 label sets fill limits.max_series (20,000, the warm-up series included).
    for s in 0..10 {
        let ids = if s == 9 { 0..1999 } else { 0..2000 };
        let (status, body) = push(&batch(&format!("flood_{s}"), ids));
        assert_eq!(status, 200, "signal {s}: {body}");
    }
    let full_kb = rss_kb(pid);
    // 40 more signals x 2,000: each push refused whole, naming the cap and its key.
    for s in 10..50 {
        let (status, body) = push(&batch(&format!("flood_{s}"), 0..2000));
        assert_eq!(status, 422, "{body}");
        let message = body["error"].as_str().unwrap();
        assert!(
            message.contains("limits.max_series = 20000") && message.contains("nothing was stored"),
            "{message}"
        );
    }
    // 1,000 more label sets of a full signal: the per-signal cap.
    let (status, body) = push(&batch("flood_0", 2000..3000));
    assert_eq!(status, 422);
    assert!(body["error"].as_str().unwrap().contains("limits.max_series_per_signal = 2000"), "{body}");
    let flooded_kb = rss_kb(pid);

    // Existing series keep working.
    assert_eq!(push(&batch("flood_3", 0..2000)).0, 200);
    let metrics = client.get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    let flood_series = metrics.lines().filter(|l| l.starts_with("omen_flood_")).count();
    assert_eq!(flood_series, 19_999, "every admitted series and no other is exported");
    let counted = |limit: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("omen_series_rejected_total{{limit=\"{limit}\"}}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(counted("max_series"), Some(40.0), "{metrics:.2000}");
    assert_eq!(counted("max_series_per_signal"), Some(1.0));

    eprintln!(
        "RSS: idle {idle_kb} kB, with 20,000 series {full_kb} kB, after 81,000 refused label sets {flooded_kb} kB"
    );
    // Refused label sets cost nothing lasting; the admitted ones cost about 2 KB each.
    assert!(flooded_kb < full_kb + 16 * 1024, "refusals grew RSS from {full_kb} to {flooded_kb} kB");
    assert!(flooded_kb < 256 * 1024, "RSS {flooded_kb} kB with 20,000 series");
}

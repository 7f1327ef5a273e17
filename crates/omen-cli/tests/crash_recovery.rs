//! `omen run` as a process: SIGKILL in the middle of acknowledged pushes loses none of them
//! (the store commits before the 200).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap()
}

/// kill -9 right after acknowledged pushes: a restarted agent still has every one.
#[test]
fn kill_9_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("omen.yaml");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut f = std::fs::File::create(&cfg_path).unwrap();
    writeln!(
        f,
        // raw_min_interval 0: keep every raw sample, so that the count below is exact
        "store:\n  path: {}\n  raw_min_interval: 0s\nhttp:\n  listen: 127.0.0.1:{port}",
        dir.path().join("omen.db").display()
    )
    .unwrap();
    let start = || {
        Command::new(env!("CARGO_BIN_EXE_omen"))
            .args(["run", "--config", cfg_path.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let wait = |base: &str| {
        rt.block_on(async {
            let c = client();
            for _ in 0..400 {
                if let Ok(r) = c.get(format!("{base}/readyz")).send().await {
                    if r.status() == 200 {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("agent not ready");
        })
    };
    let mut child = start();
    wait(&base);
    let acked = rt.block_on(async {
        let c = client();
        let mut acked = 0;
        for i in 0..50 {
            let samples: Vec<Value> = (0..20)
                .map(|j| json!({"signal": "acked", "labels": {"batch": i.to_string()}, "value": j}))
                .collect();
            let r = c
                .post(format!("{base}/v1/ingest/samples"))
                .json(&json!({ "samples": samples }))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            acked += r.json::<Value>().await.unwrap()["accepted"].as_u64().unwrap();
        }
        acked
    });
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let mut child = start();
    wait(&base);
    let series: usize = rt.block_on(async {
        let r: Value = client()
            .get(format!("{base}/scores?signal=acked&since=now-1h&step=1h"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["series"].as_array().unwrap().len()
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(series, 50);
    let stored = omen_store::Store::open(&dir.path().join("omen.db")).unwrap().count("acked").unwrap() as u64;
    assert_eq!(acked, 1000);
    assert_eq!(stored, acked);
    // The open minutes were rebuilt from raw samples: minute aggregates equal the raw means.
    let store = omen_store::Store::open(&dir.path().join("omen.db")).unwrap();
    let until = store.latest_ts().unwrap().unwrap() + 1;
    // Minute-aligned, so that each raw bucket is one whole minute.
    let since = (until - 3_600_000).div_euclid(60_000) * 60_000;
    let all = std::collections::BTreeMap::new();
    use omen_store::Resolution;
    let minute = store.range("acked", &all, since, until, 60_000, Resolution::Minute).unwrap();
    let raw = store.range("acked", &all, since, until, 60_000, Resolution::Raw).unwrap();
    assert_eq!(minute.len(), 50);
    assert_eq!(minute, raw);
}

//! SIGTERM during a push flood, with a canary probe hanging on an upstream that never
//! answers: `omen run` exits within 5 s, every acknowledged sample is in the store, and the
//! open minute aggregates are written.

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

mod common;

#[test]
fn sigterm_during_a_push_flood_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    // An upstream that accepts and never answers: the canary probe hangs on it.
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stalled_port = stalled.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in stalled.incoming().take(4).flatten() {
            held.push(conn);
        }
        std::thread::sleep(Duration::from_secs(60));
    });
    let db = dir.path().join("omen.db");
    let config = dir.path().join("omen.yaml");
    std::fs::write(
        &config,
        format!(
            "store:\n  path: {}\n  raw_min_interval: 0s\nhttp:\n  listen: 127.0.0.1:{port}\n  metrics_listen: null\n\
             sources:\n  canary:\n    interval: 1s\n    target: {{base_url: http://127.0.0.1:{stalled_port}/v1, model: m, timeout: 60s, vocab_size: 100}}\n\
             \x20   prompts: [{{id: c, prompt: hello, reference: hello}}]\n",
            db.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_omen"))
        .args(["run", "--config", config.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start omen run");
    let base = format!("http://127.0.0.1:{port}");
    common::wait_until("the agent to become ready", 30, || common::agent_ready(&base));

    // Four pushers, each on its own signal, counting what was acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Vec<Arc<AtomicU64>> = (0..4).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let pushers: Vec<_> = (0..4)
        .map(|t| {
            let (stop, acked, base) = (stop.clone(), acked[t].clone(), base.clone());
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
                let samples: Vec<_> =
                    (0..50).map(|i| json!({"signal": format!("flood_{t}"), "labels": {"i": i.to_string()}, "value": 1.0})).collect();
                let body = json!({ "samples": samples });
                while !stop.load(Ordering::Relaxed) {
                    match client.post(format!("{base}/v1/ingest/samples")).json(&body).send() {
                        Ok(r) if r.status().is_success() => {
                            acked.fetch_add(50, Ordering::Relaxed);
                        }
                        Ok(_) => {}
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(acked.iter().all(|a| a.load(Ordering::Relaxed) > 0), "the flood is flowing");

    let term = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(term.elapsed() < Duration::from_secs(10), "omen did not exit within 10 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = term.elapsed();
    stop.store(true, Ordering::Relaxed);
    for p in pushers {
        p.join().unwrap();
    }
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    assert!(status.success(), "exit status {status}; log:\n{log}");
    assert!(took < Duration::from_secs(5), "exited {took:?} after SIGTERM; log:\n{log}");
    eprintln!("exited {took:?} after SIGTERM");

    // Every acknowledged sample is stored raw, and every minute, the open one included, is written.
    let counts = Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3, sys\n\
             c = sqlite3.connect(sys.argv[1])\n\
             for t in range(4):\n\
             \x20   raw = c.execute(\"SELECT count(*) FROM samples s JOIN series r ON r.id = s.series_id WHERE r.signal = ?\", (f'flood_{t}',)).fetchone()[0]\n\
             \x20   agg = c.execute(\"SELECT coalesce(sum(count), 0) FROM minute_agg m JOIN series r ON r.id = m.series_id WHERE r.signal = ?\", (f'flood_{t}',)).fetchone()[0]\n\
             \x20   print(raw, agg)\n",
        )
        .arg(&db)
        .output()
        .unwrap();
    let text = String::from_utf8(counts.stdout).unwrap();
    assert!(counts.status.success(), "{}", String::from_utf8_lossy(&counts.stderr));
    for (t, line) in text.lines().enumerate() {
        let v: Vec<u64> = line.split_whitespace().map(|x| x.parse().unwrap()).collect();
        let acknowledged = acked[t].load(Ordering::Relaxed);
        assert!(v[0] >= acknowledged, "flood_{t}: {} stored of {acknowledged} acknowledged", v[0]);
        assert_eq!(
            v[1], v[0],
            "flood_{t}: the minute aggregates count every stored sample (open minute flushed)"
        );
        eprintln!("flood_{t}: {acknowledged} acknowledged, {} stored", v[0]);
    }
    drop(held);
}

//! The inference server misbehaving under a running `omen run`: stalled (SIGSTOP), back
//! (SIGCONT), gone, answering garbage, cutting a stream mid-answer. The real llama.cpp
//! server from `make setup` plays the server until it is killed; a hand-written TCP server
//! on its port then plays the broken ones. Each source reports source_up 0 while it fails,
//! logs one line per spell of failures and one at recovery; canary probes are bounded by
//! their timeout; the API keeps answering.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

#[path = "../../omen-agent/tests/support/mod.rs"]
mod support;

fn source_up(base: &str) -> (Option<f64>, Option<f64>) {
    let text = reqwest::blocking::get(format!("{base}/metrics")).and_then(|r| r.text()).unwrap_or_default();
    let read = |source: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("omen_source_up{{source=\"{source}\"}}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    (read("canary"), read("server_metrics"))
}

fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
}

/// Answers every request on `port` as a broken server would: garbage where Prometheus text
/// or SSE belongs, or (with `cut` set) a chat stream that ends after its first chunk.
fn broken_server(port: u16, cut: Arc<AtomicBool>) {
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("take over the server's port");
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let cut = cut.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut request_line = String::new();
                let _ = reader.read_line(&mut request_line);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let mut conn = conn;
                let response = if request_line.contains("/v1/chat/completions") && cut.load(Ordering::Relaxed)
                {
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
                     data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
                } else {
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n{{{ <html> this is not what you asked for"
                };
                let _ = conn.write_all(response.as_bytes());
            });
        }
    });
}

#[test]
fn sources_ride_out_a_stalled_a_dead_and_a_broken_server() {
    let (server, port) = support::start_llama_server(&["--metrics"]);
    common::wait_until("llama-server to be healthy", 120, || {
        reqwest::blocking::get(format!("http://127.0.0.1:{port}/health"))
            .is_ok_and(|r| r.status().is_success())
    });
    let dir = tempfile::tempdir().unwrap();
    let agent_port = common::free_port();
    let config = dir.path().join("omen.yaml");
    std::fs::write(
        &config,
        format!(
            "store:\n  path: {db}\nhttp:\n  listen: 127.0.0.1:{agent_port}\n  metrics_listen: null\n\
             sources:\n  canary:\n    interval: 1s\n    target: {{base_url: http://127.0.0.1:{port}/v1, model: smollm2-135m, max_tokens: 8, timeout: 2s}}\n\
             \x20   prompts: [{{id: capital, prompt: \"What is the capital of France?\", reference: \"Paris.\"}}]\n\
             \x20 server_metrics: {{url: http://127.0.0.1:{port}/metrics, interval: 1s, timeout: 1s}}\n",
            db = dir.path().join("omen.db").display()
        ),
    )
    .unwrap();
    let log_path = dir.path().join("agent.log");
    let mut agent = Command::new(env!("CARGO_BIN_EXE_omen"))
        .args(["run", "--config", config.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("start omen run");
    let base = format!("http://127.0.0.1:{agent_port}");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    common::wait_until("both sources up on the healthy server", 60, || {
        source_up(&base) == (Some(1.0), Some(1.0))
    });

    // Stalled: every probe and scrape runs into its timeout.
    signal(server.pid(), "-STOP");
    let stalled = Instant::now();
    common::wait_until("both sources down on the stalled server", 10, || {
        source_up(&base) == (Some(0.0), Some(0.0))
    });
    assert!(
        stalled.elapsed() < Duration::from_secs(6),
        "a 2 s canary timeout bounds the probe: {:?}",
        stalled.elapsed()
    );
    for _ in 0..3 {
        let asked = Instant::now();
        let r = reqwest::blocking::get(format!("{base}/scores/latest")).unwrap();
        assert!(r.status().is_success());
        assert!(asked.elapsed() < Duration::from_secs(1), "the API answers while the server stalls");
    }
    std::thread::sleep(Duration::from_secs(4));
    signal(server.pid(), "-CONT");
    common::wait_until("both sources back after SIGCONT", 30, || source_up(&base) == (Some(1.0), Some(1.0)));

    // Gone, then garbage on its port, then a stream cut after its first chunk.
    drop(server);
    let cut = Arc::new(AtomicBool::new(false));
    broken_server(port, cut.clone());
    common::wait_until("both sources down on the garbage server", 15, || {
        source_up(&base) == (Some(0.0), Some(0.0))
    });
    std::thread::sleep(Duration::from_secs(2));
    cut.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(source_up(&base).0, Some(0.0), "a cut stream is a failed probe");

    // The agent and its API are unaffected.
    assert!(agent.try_wait().unwrap().is_none(), "the agent is still running; log:\n{}", log());
    let push = reqwest::blocking::Client::new()
        .post(format!("{base}/v1/ingest/samples"))
        .json(&serde_json::json!({"samples": [{"signal": "still_here", "value": 1}]}))
        .send()
        .unwrap();
    assert_eq!(push.status(), 200);

    let text = log();
    let count = |needle: &str| text.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(count("canary capital failing"), 2, "one line per spell (stall, then dead/garbage):\n{text}");
    assert_eq!(count("server metrics failing"), 2, "one line per spell:\n{text}");
    assert_eq!(count("canary capital recovered after"), 1, "{text}");
    assert_eq!(count("server metrics recovered after"), 1, "{text}");
    assert!(text.contains("timed out"), "the stall is named as a timeout:\n{text}");
    let rounds: u64 = text
        .lines()
        .find(|l| l.contains("server metrics recovered after"))
        .and_then(|l| l.split("after ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(rounds >= 3, "several failed rounds, one log line: {rounds}");
    let _ = agent.kill();
    let _ = agent.wait();
}

//! `omen bench` and `omen compare` end to end against a real llama.cpp
//! `llama-server` (SmolLM2-135M-Instruct, installed by `make setup`) on loopback,
//! with a handful of short requests.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../../omen-agent/tests/support/mod.rs"]
mod support;

use support::Server;

fn start_llama_server() -> (Server, u16) {
    let (me, port) = support::start_llama_server(&[]);
    // Generous: on a loaded 2-core machine the model load alone can take tens of seconds.
    let deadline = Instant::now() + Duration::from_secs(120);
    let url = format!("http://127.0.0.1:{port}/health");
    while !Command::new("curl")
        .args(["-fsS", "--max-time", "2", &url])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(Instant::now() < deadline, "llama-server did not become healthy on {url}");
        std::thread::sleep(Duration::from_millis(100));
    }
    (me, port)
}

/// A long user message (~50 tokens) so that a few turns overflow a small context bound.
const LONG: &str = "Please explain, in plain words and without any lists, why the sky looks blue during \
the day and red or orange at sunset, and mention what role the thickness of the atmosphere plays.";

/// One session (the next would arrive after ~100 s) so that the turns, and so the context
/// growth and back-off, do not depend on timing; `cap` lets turn 1 fit and turn 2 overflow.
fn workflow(api: &str, policy: &str, requests: u64, cap: u32) -> String {
    format!(
        "name: test-{api}\napi: {api}\nmax_tokens: 8\nignore_eos: true\nconcurrency: 1\nseed: 1\n\
         arrival: {{ rate: 0.01, rate_shape: 4, change_every: 2s }}\n\
         max_context_tokens: {cap}\ncontext_policy: {policy}\nmax_requests: {requests}\nduration: 120s\n\
         rtt_backoff: {{ ratio: 50, baseline_requests: 3 }}\nstart: ask\nstates:\n\
         \x20 ask:\n    prompts: [\"{LONG}\"]\n    timeout: 60s\n    retries: 1\n    qps: 5\n\
         \x20   transitions: [{{ to: follow, probability: 1.0 }}]\n\
         \x20 follow:\n    prompts: [\"{LONG}\"]\n\
         \x20   transitions: [{{ to: follow, probability: 1.0 }}]\n"
    )
}

fn omen(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_omen")).args(args).output().expect("run omen");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "omen {args:?} failed ({}):\n{stdout}\n{stderr}", out.status);
    (stdout, stderr)
}

fn read(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn check_report(r: &Value, n: u64) {
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("no {k} in report"));
    assert_eq!(r["completed"], n, "{r:#}");
    assert_eq!(r["failed"], 0);
    assert!(f("total_output_tokens") > 0.0 && f("total_output_tokens") <= 8.0 * n as f64);
    assert!(f("total_input_tokens") > 0.0);
    assert!(f("duration") > 0.0 && f("request_throughput") > 0.0 && f("output_throughput") > 0.0);
    assert!(f("total_token_throughput") > f("output_throughput"));
    for m in ["ttft", "tpot", "itl", "e2el"] {
        let (mean, median, p90, p99) = (
            f(&format!("mean_{m}_ms")),
            f(&format!("median_{m}_ms")),
            f(&format!("p90_{m}_ms")),
            f(&format!("p99_{m}_ms")),
        );
        assert!(
            mean > 0.0 && median > 0.0 && median <= p90 && p90 <= p99,
            "{m}: {mean} {median} {p90} {p99}"
        );
    }
    assert!(f("mean_ttft_ms") < f("mean_e2el_ms"));
    let requests = r["requests"].as_array().unwrap();
    assert_eq!(requests.len() as u64, n);
    for q in requests {
        assert_eq!(q["success"], true, "{q}");
        let (ttft, e2el) = (q["ttft_ms"].as_f64().unwrap(), q["e2el_ms"].as_f64().unwrap());
        assert!(ttft > 0.0 && ttft <= e2el, "{q}");
        let out = q["output_tokens"].as_u64().unwrap();
        assert_eq!(out, 8, "ignore_eos gives max_tokens tokens: {q}");
    }
    // Context grows within a session: turn 1 carries turn 0.
    let turn = |q: &Value, t: u64| q["turn"] == t;
    let grown = requests.iter().filter(|q| turn(q, 1)).any(|second| {
        let first = requests.iter().find(|q| q["session"] == second["session"] && turn(q, 0)).unwrap();
        second["history_turns"] == 1 && second["input_tokens"].as_u64() > first["input_tokens"].as_u64()
    });
    assert!(grown, "no session carried its first turn into the second: {requests:#?}");
    assert!(r["omen"]["max_history_turns"].as_u64().unwrap() >= 1);
    assert!(r["omen"]["rtt_backoff"]["baseline_ttft_ms"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_and_compare_against_a_real_llama_server() {
    let (_server, port) = start_llama_server();
    let endpoint = format!("http://127.0.0.1:{port}/v1");
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| -> PathBuf { dir.path().join(name) };

    std::fs::write(path("chat.yaml"), workflow("chat", "reset", 10, 170)).unwrap();
    let (_, stderr) = omen(&[
        "bench",
        "--workflow",
        path("chat.yaml").to_str().unwrap(),
        "--endpoint",
        &endpoint,
        "--out",
        path("a.json").to_str().unwrap(),
    ]);
    eprintln!("{stderr}");
    let a = read(&path("a.json"));
    check_report(&a, 10);
    assert_eq!(a["model_id"], "smollm2-135m", "discovered from GET /v1/models");
    assert!(a["omen"]["context_resets"].as_u64().unwrap() >= 1, "{:#}", a["omen"]);
    let reset = a["requests"].as_array().unwrap().iter().find(|q| q["context"] == "reset").unwrap();
    assert_eq!(reset["history_turns"], 0, "{reset}");

    std::fs::write(path("completions.yaml"), workflow("completions", "truncate", 8, 128)).unwrap();
    let (_, stderr) = omen(&[
        "bench",
        "--workflow",
        path("completions.yaml").to_str().unwrap(),
        "--endpoint",
        &endpoint,
        "--out",
        path("b.json").to_str().unwrap(),
        "--model",
        "smollm2-135m",
    ]);
    eprintln!("{stderr}");
    let b = read(&path("b.json"));
    check_report(&b, 8);
    assert!(b["omen"]["context_truncations"].as_u64().unwrap() >= 1, "{:#}", b["omen"]);

    let (table, _) = omen(&[
        "compare",
        path("a.json").to_str().unwrap(),
        path("b.json").to_str().unwrap(),
        "--json",
        path("cmp.json").to_str().unwrap(),
        "--resamples",
        "500",
    ]);
    println!("{table}");
    for m in ["mean_ttft_ms", "p99_e2el_ms", "request_throughput", "output_throughput", "error_rate"] {
        assert!(table.contains(m), "{m} missing from\n{table}");
    }
    let cmp = read(&path("cmp.json"));
    let rows = cmp["metrics"].as_array().unwrap();
    assert!(rows.len() >= 19, "{cmp:#}");
    for row in rows {
        let v = row["verdict"].as_str().unwrap();
        assert!(["regression", "improvement", "noise"].contains(&v), "{row}");
        assert!(row["delta_lower"].as_f64().unwrap() <= row["delta_upper"].as_f64().unwrap(), "{row}");
    }
    let err = rows.iter().find(|r| r["metric"] == "error_rate").unwrap();
    assert_eq!(err["verdict"], "noise", "no errors in either run");
}

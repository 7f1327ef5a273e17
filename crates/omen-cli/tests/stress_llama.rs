//! `omen stress` end to end against the real llama.cpp `llama-server` (SmolLM2-135M-Instruct,
//! from `make setup`) on loopback: a sweep and an adaptive search on one prompt, the report
//! and its picture, and the boundary pushed into a running agent, where /metrics exports it.
#![cfg(feature = "lab")]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../../omen-agent/tests/support/mod.rs"]
mod support;

fn wait_for(url: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !Command::new("curl")
        .args(["-fsS", "--max-time", "2", url])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(Instant::now() < deadline, "{url} did not answer");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn omen(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_omen")).args(args).output().expect("run omen")
}

fn bertscore_model_dir() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.models/all-MiniLM-L6-v2");
    assert!(
        dir.join("model.safetensors").is_file(),
        "no BERTScore model in {}; run `make setup`",
        dir.display()
    );
    dir
}

const PROMPT: &str = "capital=What is the capital of France? Answer in one sentence.";

#[test]
fn stress_sweeps_searches_and_pushes_the_boundary() {
    let (_server, port) = support::start_llama_server(&[]);
    wait_for(&format!("http://127.0.0.1:{port}/health"), 120);
    let endpoint = format!("http://127.0.0.1:{port}/v1");
    let dir = tempfile::tempdir().unwrap();

    // The agent that receives the boundary.
    let agent_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cfg = dir.path().join("omen.yaml");
    writeln!(
        std::fs::File::create(&cfg).unwrap(),
        "store:\n  path: {}\nhttp:\n  listen: 127.0.0.1:{agent_port}\nsources:\n  nvml:\n    enabled: false",
        dir.path().join("omen.db").display()
    )
    .unwrap();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_omen"))
        .args(["run", "--config", cfg.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let agent_url = format!("http://127.0.0.1:{agent_port}");
    wait_for(&format!("{agent_url}/readyz"), 30);

    let report = dir.path().join("sweep.json");
    let svg = dir.path().join("sweep.svg");
    let out = omen(&[
        "stress",
        "--endpoint",
        &endpoint,
        "--prompt",
        PROMPT,
        "--max-tokens",
        "12",
        "--strengths",
        "0.5,1",
        "--out",
        report.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
        "--push",
        &agent_url,
        "--bertscore-model-dir",
        bertscore_model_dir().to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("text only"), "{stdout}");
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let p = &r["prompts"][0];
    assert_eq!(p["id"], "capital");
    assert!(p["answer"].as_str().unwrap().contains("Paris"), "{p}");
    // Three perturbations at two strengths, each compared with the unperturbed answer.
    let points = p["points"].as_array().unwrap();
    assert_eq!(points.len(), 6);
    for point in points {
        let bleu = point["bleu"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&bleu), "{point}");
        assert!(point["entropy_shift_bits"].as_f64().unwrap().is_finite(), "{point}");
        assert!(point["latency_change_s"].as_f64().unwrap().is_finite(), "{point}");
        let f1 = point["bertscore_f1"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&f1), "{point}");
    }
    // Instruction flips at full strength ("reply only with the word NO") change the answer.
    let flip =
        points.iter().find(|q| q["perturbation"] == "instruction_flip" && q["strength"] == 1.0).unwrap();
    assert!(flip["bleu"].as_f64().unwrap() < 0.9, "{flip}");
    let boundary = p["stability_boundary"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&boundary));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));

    // The pushed boundary is exported by the agent.
    let metrics = Command::new("curl").args(["-fsS", &format!("{agent_url}/metrics")]).output().unwrap();
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("omen_canary_stability_boundary{"))
        .unwrap_or_else(|| panic!("no boundary in /metrics:\n{metrics}"));
    assert!(line.contains("canary=\"capital\""), "{line}");
    let _ = agent.kill();
    let _ = agent.wait();

    // Adaptive: steps of 0.5 until a bound is crossed; the boundary is a step it passed.
    let adaptive = dir.path().join("adaptive.json");
    let out = omen(&[
        "stress",
        "--endpoint",
        &endpoint,
        "--prompt",
        PROMPT,
        "--max-tokens",
        "12",
        "--adaptive",
        "--step",
        "0.5",
        "--max-bleu-drop",
        "0.3",
        "--out",
        adaptive.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&std::fs::read(&adaptive).unwrap()).unwrap();
    assert_eq!(r["mode"], "adaptive");
    for b in r["prompts"][0]["boundary"].as_array().unwrap() {
        assert!([0.0, 0.5, 1.0].contains(&b[1].as_f64().unwrap()), "{b}");
    }
}

#[test]
fn a_prompt_too_short_to_perturb_is_refused_before_any_request() {
    // No server needed: the prompt is checked first; port 9 (discard) is never reached.
    let out =
        omen(&["stress", "--endpoint", "http://127.0.0.1:9/v1", "--model", "m", "--prompt", "hi=Hi there"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least 4") && err.contains("hi"), "{err}");
    let out = omen(&[
        "stress",
        "--endpoint",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        "--prompt",
        "no equals sign",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("ID=TEXT"));
}

//! The benchmark's helper binaries, run as the script runs them.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

/// `omen-push-load --parse-only` times the agent's parser on the payloads a run sends and
/// counts what they carry: 2 samples (usage, KVF) per KV block map, and each canary's
/// first-token entropy plus its four latency and RCI samples per round.
#[test]
fn parse_only_counts_the_payloads_and_times_the_agents_parser() {
    let out = Command::new(env!("CARGO_BIN_EXE_omen-push-load"))
        .args([
            "--parse-only",
            "--gpus",
            "2",
            "--layers",
            "3",
            "--blocks",
            "256",
            "--canaries",
            "2",
            "--seconds",
            "4",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["rounds"], 4);
    assert_eq!(report["kv_maps"], 4 * 2 * 3);
    assert_eq!(
        report["requests"],
        4 * (2 + 2 + 1),
        "per round: one kvcache per GPU, one logits per canary, one samples"
    );
    let kv = report["kv_samples"].as_u64().unwrap();
    assert_eq!(kv % 24, 0, "the same number of samples per block map: {report}");
    assert!(report["samples"].as_u64().unwrap() > kv, "{report}");
    for key in ["parse_us_per_sample", "parse_us_per_kv_map", "json_scan_us_per_sample"] {
        let v = report[key].as_f64().unwrap();
        assert!(v > 0.0 && v.is_finite(), "{key} = {v}");
    }
    // Scanning the JSON is part of parsing it.
    assert!(report["json_scan_us_per_sample"].as_f64() < report["parse_us_per_sample"].as_f64(), "{report}");
}

fn get(addr: &str, accept_encoding: &str) -> (String, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET /scores/latest HTTP/1.1\r\nHost: {addr}\r\nAccept-Encoding: {accept_encoding}\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    (String::from_utf8_lossy(&raw[..split]).to_lowercase(), raw[split + 4..].to_vec())
}

/// The reference server answers any path with the saved bytes, gzip ones only to clients that accept gzip.
#[test]
fn static_serve_answers_the_saved_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let (body, gz) = (dir.path().join("latest.json"), dir.path().join("latest.json.gz"));
    std::fs::write(&body, br#"{"signals":[]}"#).unwrap();
    std::fs::write(&gz, b"\x1f\x8bnot-really-gzip").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_omen-static-serve"))
        .args(["--body".as_ref(), body.as_os_str(), "--gzip-body".as_ref(), gz.as_os_str()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("{line:?}")).to_owned();
    let (head, got) = get(&addr, "identity");
    assert!(head.starts_with("http/1.1 200") && head.contains("content-type: application/json"), "{head}");
    assert_eq!(got, br#"{"signals":[]}"#);
    let (head, got) = get(&addr, "gzip");
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert_eq!(got, b"\x1f\x8bnot-really-gzip");
    child.kill().unwrap();
    child.wait().unwrap();

    // A missing body is named, with what to give instead.
    let out = Command::new(env!("CARGO_BIN_EXE_omen-static-serve"))
        .args(["--body".as_ref(), dir.path().join("absent.json").as_os_str()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("absent.json") && err.contains("--body"), "{err}");
}

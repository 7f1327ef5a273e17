//! What each shipped binary links, read from `cargo tree` (normal dependencies only): the
//! sidecar build (deploy/Dockerfile's `-p omen-cli --no-default-features --features "lstm
//! bertscore"`) carries none of the offline tools' crates (plotters aside: the API draws the
//! forecast picture), and the model worker none of the
//! daemon's HTTP server and exporters.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The crate names in `cargo tree` of `args` (normal edges, every target platform).
fn tree(args: &[&str]) -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&root)
        .args(["tree", "--offline", "--locked", "-e", "normal", "--prefix", "none", "--format", "{p}"])
        .args(args)
        .output()
        .expect("run cargo tree");
    assert!(out.status.success(), "cargo tree {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_sidecar_build_links_no_offline_tool_crates() {
    let sidecar = tree(&["-p", "omen-cli", "--no-default-features", "--features", "lstm bertscore"]);
    assert!(sidecar.contains("omen-agent"), "{sidecar:?}");
    // plotters is the sidecar's too: its API draws /scores/forecast?format=svg (SVG backend
    // and line series only, no font or bitmap dependencies).
    for lab_only in ["indicatif", "rand_distr", "omen-lab", "omen-bench"] {
        assert!(!sidecar.contains(lab_only), "the sidecar build links {lab_only}");
    }
    // The default build still has every subcommand.
    let full = tree(&["-p", "omen-cli"]);
    for tool in ["omen-lab", "omen-bench"] {
        assert!(full.contains(tool), "the default build lacks {tool}");
    }
}

#[test]
fn the_model_worker_links_neither_the_daemon_nor_its_exporters() {
    let worker = tree(&["-p", "omen-worker"]);
    assert!(worker.contains("omen-protocol") && worker.contains("tch"), "{worker:?}");
    for daemon_only in
        ["omen-agent", "axum", "opentelemetry", "opentelemetry-otlp", "prometheus-client", "tonic"]
    {
        assert!(!worker.contains(daemon_only), "omen-worker links {daemon_only}");
    }
    // rusqlite comes only with omen-store, which `omen train --data omen.db` reads (the
    // reason is in crates/omen-protocol/Cargo.toml).
    let protocol = tree(&["-p", "omen-protocol"]);
    assert!(protocol.contains("omen-store") && protocol.contains("rusqlite"), "{protocol:?}");
}

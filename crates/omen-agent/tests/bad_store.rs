//! A store file that is not a usable omen store at start: with the default
//! (`store.on_bad_file: move_aside`) the agent keeps the file aside and starts anew; with
//! `fail` it refuses to start with an error that names the file, the problem and the fixes.

use omen_agent::config::Config;

fn config(path: &std::path::Path, extra: &str) -> Config {
    let yaml = format!(
        "store:\n  path: {}\n{extra}http:\n  listen: 127.0.0.1:0\n  metrics_listen: null\n",
        path.display()
    );
    Config::from_yaml(&yaml).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_store_file_is_moved_aside_or_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("omen.db");
    std::fs::write(&path, b"garbage, not a database".repeat(100)).unwrap();

    let e = omen_agent::run::start(config(&path, "  on_bad_file: fail\n")).await.err().expect("refused");
    let message = format!("{e:#}");
    for part in [
        path.display().to_string().as_str(),
        "not an SQLite database",
        "store.on_bad_file: move_aside",
        "store.path",
    ] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"garbage, not a database".repeat(100),
        "fail leaves the file as it is"
    );

    let agent =
        omen_agent::run::start(config(&path, "")).await.expect("the default moves it aside and starts");
    let client = reqwest::Client::new();
    let r = client.get(format!("http://{}/readyz", agent.api_addr)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("omen.db.bad-"))
        .collect();
    assert_eq!(aside.len(), 1, "the bad file is kept beside the new store");
    assert_eq!(std::fs::read(aside[0].path()).unwrap(), b"garbage, not a database".repeat(100));
    agent.stop().await.unwrap();
}

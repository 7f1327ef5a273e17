//! The real worker process behind the agent's handle (omen_agent::worker): a model
//! trained by `omen-worker train` is loaded, scored tick by tick, survives a kill -9 of
//! its worker (restarted, model loaded again), and BERTScore runs in the same process.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use omen_agent::worker::{Reply, Request, Worker, WorkerError};

const WORKER: &str = env!("CARGO_BIN_EXE_omen-worker");

#[path = "../../omen-agent/tests/support/tiny_model.rs"]
mod tiny_model;

use tiny_model::value;

fn tick(w: &Worker, i: usize) -> Result<Reply, WorkerError> {
    w.call(&Request::LstmTick { raw: vec![value(i)] })
}

#[test]
fn a_killed_worker_is_started_again_with_its_model() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _) = tiny_model::train_tiny(WORKER, dir.path(), 300, 3);
    let w = Worker::new(WORKER.into(), Duration::from_secs(30)).with_restart_after(Duration::ZERO);
    let loaded = w.load(Request::LoadLstm { path: model, threads: 1 }).unwrap();
    assert_eq!(loaded, Reply::LstmLoaded { sources: vec!["queue_depth".into()], window: 6 });
    for i in 0..5 {
        assert_eq!(tick(&w, i).unwrap(), Reply::LstmFilling, "tick {i}");
    }
    let Reply::LstmScored { error, severity, contributions } = tick(&w, 5).unwrap() else {
        panic!("no score at tick 5")
    };
    // One source: it carries the whole error.
    assert_eq!(contributions, [1.0]);
    assert!(error.is_finite() && error >= 0.0 && (0.0..=1.0).contains(&severity), "{error} {severity}");

    let pid = w.pid().expect("a worker runs");
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    std::thread::sleep(Duration::from_millis(200));
    let e = tick(&w, 6).unwrap_err();
    assert!(matches!(e, WorkerError::Broken { .. }), "{e}");
    // A new worker with the model loaded again: its window starts empty.
    assert_eq!(tick(&w, 7).unwrap(), Reply::LstmFilling);
    assert_ne!(w.pid(), Some(pid));
}

#[test]
fn a_bad_request_gets_an_error_and_the_worker_stays_up() {
    let w = Worker::new(WORKER.into(), Duration::from_secs(30));
    let e = tick(&w, 0).unwrap_err().to_string();
    assert!(e.contains("load_lstm"), "{e}");
    let pid = w.pid().expect("still running");
    let e = w
        .load(Request::LoadLstm { path: "/nonexistent/model.ot".into(), threads: 1 })
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/model.ot"), "{e}");
    assert_eq!(w.pid(), Some(pid));
}

/// The BERTScore model folder `make setup` installs (or OMEN_BERTSCORE_MODEL_DIR).
fn bertscore_model_dir() -> PathBuf {
    let dir = omen_model::bertscore::model_dir();
    assert!(
        dir.join("model.safetensors").is_file(),
        "no BERTScore model in {}; run `make setup` (scripts/setup-bertscore-model.sh)",
        dir.display()
    );
    dir
}

#[test]
fn bertscore_runs_in_the_worker() {
    let w = Worker::new(WORKER.into(), Duration::from_secs(30));
    let Reply::BertscoreLoaded { layers } =
        w.load(Request::LoadBertscore { dir: bertscore_model_dir(), threads: 1 }).unwrap()
    else {
        panic!("not loaded")
    };
    assert_eq!(layers, 6);
    let f1 = |a: &str, b: &str| match w
        .call(&Request::BertscoreF1 { answer: a.into(), reference: b.into() })
        .unwrap()
    {
        Reply::BertscoreF1 { f1 } => f1,
        other => panic!("{other:?}"),
    };
    let same = f1("The capital of France is Paris.", "The capital of France is Paris.");
    let paraphrase = f1("Paris is the French capital.", "The capital of France is Paris.");
    let unrelated = f1("Bananas are yellow.", "The capital of France is Paris.");
    assert!((same - 1.0).abs() < 1e-4, "{same}");
    assert!(paraphrase > unrelated && paraphrase < same, "{paraphrase} {unrelated}");
}

#[test]
fn the_agent_checks_the_model_folder_for_the_files_the_model_loads() {
    assert_eq!(omen_agent::config::BERTSCORE_MODEL_FILES, omen_model::bertscore::MODEL_FILES);
}

//! The NAB figure is the agent's: a NAB file replayed as a trace through the agent's
//! pipeline (Engine, store) stores exactly the anomaly scores `omen evaluate-detectors`
//! scores for that file.

use std::io::Write;
use std::sync::Arc;

use omen_agent::config::Config;
use omen_lab::detectors::{Detector, NabData};
use omen_nab as nab;
use omen_store::{Resolution, Store};

const FILE: &str = "artificialWithAnomaly/art_daily_jumpsup.csv";

#[test]
fn a_replayed_nab_file_stores_the_scores_the_evaluation_scores() {
    let data = NabData::load(&nab::data_dir()).expect("data/nab in the repository");
    let file = data.files.iter().find(|f| f.rel == FILE).expect("the NAB file");
    let n = file.values.len();
    let learning = nab::probation_length(n);

    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("nab.jsonl");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&trace).unwrap());
    for (t, v) in file.timestamps.iter().zip(&file.values) {
        let ts = t.replace(' ', "T") + "Z";
        writeln!(out, r#"{{"ts": "{ts}", "signal": "queue_depth", "labels": {{}}, "value": {v}}}"#).unwrap();
    }
    out.flush().unwrap();
    drop(out);

    // The NoveltySurprise detector with its shipped parameters; NAB's probation is the learning period, raw samples
    // are all kept, and the trace's 14 days stay within raw retention (30 days).
    let yaml = format!(
        "store: {{raw_retention_days: 30, raw_min_interval: 0s}}\n\
         signals: {{detector: novelty_surprise, novelty_surprise: {{learning_samples: {learning}}}}}\n"
    );
    let cfg = Config::from_yaml(&yaml).unwrap();
    let signals = cfg.signals.clone();
    let db = dir.path().join("omen.db");
    let report = omen_lab::replay::replay_into(Arc::new(cfg), &trace, &db).unwrap();
    assert_eq!(report.samples, n);

    let evaluated = Detector::Agent(Box::new(signals)).scores(&data.dir, file).unwrap();
    let store = Store::open(&db).unwrap();
    let step = 300_000;
    let stored = store
        .range(
            omen_signals::catalogue::ANOMALY_SCORE.name,
            &Default::default(),
            report.first_ts_ms,
            report.last_ts_ms + 1,
            step,
            Resolution::Raw,
        )
        .unwrap();
    assert_eq!(stored.len(), 1, "one series");
    let points = &stored[0].points;
    // The detector scores every row after the learning rows; the evaluation gives the
    // learning rows 0 (NAB does not score them).
    assert_eq!(points.len(), n - learning, "every scored row is stored");
    // The replay compacts as the agent does: history older than its hour is sealed into
    // blocks that keep 24 significant bits (relative error at most 6e-8, docs/config.md).
    for &(ts, score) in points {
        let row = ((ts - report.first_ts_ms) / step) as usize;
        assert!(row >= learning, "row {row} is a learning row");
        assert!(
            (score - evaluated[row]).abs() <= 6e-8 * evaluated[row].abs() + 1e-12,
            "row {row}: stored {score}, evaluated {}",
            evaluated[row]
        );
    }
    assert!(evaluated[..learning].iter().all(|&s| s == 0.0));
    assert!(points.iter().any(|&(_, s)| s > 0.99), "the jump is flagged");
}

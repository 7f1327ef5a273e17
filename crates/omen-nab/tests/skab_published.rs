//! The SKAB port reproduces SKAB's own scorer: every published leaderboard detector's
//! predictions on the 30 files give exactly the figures in published-scores.jsonl.

use omen_nab::skab::{self, SkabScores};

#[test]
fn every_published_detector_scores_as_skab_scores_it() {
    let dir = skab::data_dir();
    let rels = skab::data_files(&dir).expect("SKAB data (data/skab, or OMEN_SKAB_DIR)");
    assert_eq!(rels.len(), 30);
    let files: Vec<_> = rels.iter().map(|r| skab::read_file(&dir, r).unwrap()).collect();
    let published = std::fs::read_to_string(dir.join("published-scores.jsonl")).unwrap();
    let mut checked = 0;
    for line in published.lines().filter(|l| !l.trim().is_empty()) {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let algorithm = row["algorithm"].as_str().unwrap();
        let predictions: Vec<Vec<Option<bool>>> =
            files.iter().map(|f| skab::read_prediction(&dir, algorithm, f).unwrap()).collect();
        let got = skab::score(&files, &predictions, 60).unwrap().rounded();
        let want = SkabScores {
            f1: row["f1"].as_f64().unwrap(),
            far_pct: row["far_pct"].as_f64().unwrap(),
            mar_pct: row["mar_pct"].as_f64().unwrap(),
            nab_standard: row["nab_standard"].as_f64().unwrap(),
            nab_low_fp: row["nab_low_fp"].as_f64().unwrap(),
            nab_low_fn: row["nab_low_fn"].as_f64().unwrap(),
        };
        eprintln!("{algorithm}: {got:?}");
        assert_eq!(got, want, "{algorithm}");
        checked += 1;
    }
    assert_eq!(checked, 10, "one row per published algorithm");
}

#[test]
fn bad_inputs_name_the_file_and_the_fix() {
    let dir = skab::data_dir();
    let f = skab::read_file(&dir, "valve1/0.csv").unwrap();
    assert_eq!(f.rows.len(), f.times.len() + skab::TRAINING_ROWS);
    assert_eq!(f.columns.len(), 8);
    let e = skab::score(std::slice::from_ref(&f), &[vec![Some(false); 3]], 60).unwrap_err();
    assert!(e.to_string().contains("valve1/0.csv") && e.to_string().contains("predict every row"), "{e}");
    let e = skab::read_file(&dir, "valve1/404.csv").unwrap_err();
    assert!(e.to_string().contains("404.csv") && e.to_string().contains("SKAB"), "{e}");
    let e = skab::read_prediction(&dir, "NoSuchDetector", &f).unwrap_err();
    assert!(e.to_string().contains("NoSuchDetector"), "{e}");
}

//! BERTScore on tch against the reference `bert_score` package: P, R and F1 to 1e-3 and
//! the token ids exactly, on the pairs of scripts/gen_bertscore_fixtures.py (committed
//! output in tests/fixtures/bertscore_minilm.json). Needs the model from `make setup`.

use std::path::Path;

use omen_model::bertscore::{BertScoreError, BertScorer};
use omen_signals::rci::SemanticSimilarity;
use serde::Deserialize;

const TOLERANCE: f64 = 1e-3;

#[derive(Deserialize)]
struct Fixtures {
    num_layers: usize,
    pairs: Vec<Pair>,
}

#[derive(Deserialize)]
struct Pair {
    candidate: String,
    reference: String,
    candidate_ids: Vec<u32>,
    reference_ids: Vec<u32>,
    precision: f64,
    recall: f64,
    f1: f64,
}

fn scorer() -> BertScorer {
    // A missing model is a failure with the fix, never a skip.
    BertScorer::load(&omen_model::bertscore::model_dir()).unwrap_or_else(|e| panic!("{e}"))
}

fn fixtures() -> Fixtures {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bertscore_minilm.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn matches_bert_score_on_every_fixture_pair() {
    let scorer = scorer();
    let fixtures = fixtures();
    assert_eq!(scorer.num_layers(), fixtures.num_layers, "the default layer is bert_score's choice here");
    assert!(fixtures.pairs.len() >= 20);
    let mut worst = 0.0f64;
    let mut failures = Vec::new();
    for p in &fixtures.pairs {
        assert_eq!(scorer.token_ids(&p.candidate).unwrap(), p.candidate_ids, "candidate {:?}", p.candidate);
        assert_eq!(scorer.token_ids(&p.reference).unwrap(), p.reference_ids, "reference {:?}", p.reference);
        let s = scorer.score(&p.candidate, &p.reference).unwrap();
        for (what, ours, theirs) in
            [("P", s.precision, p.precision), ("R", s.recall, p.recall), ("F1", s.f1, p.f1)]
        {
            let diff = (ours - theirs).abs();
            worst = worst.max(diff);
            if diff > TOLERANCE {
                failures.push(format!(
                    "{:?} vs {:?}: {what} {ours} vs bert_score {theirs}",
                    p.candidate, p.reference
                ));
            }
        }
    }
    assert!(failures.is_empty(), "differences over {TOLERANCE}:\n{}", failures.join("\n"));
    eprintln!("{} pairs, largest |difference| to bert_score {worst:.2e}", fixtures.pairs.len());
}

#[test]
fn semantic_similarity_is_the_f1_in_the_unit_interval() {
    let scorer = scorer();
    let same = "Paris is the capital of France.";
    let f1 = scorer.f1(same, same).unwrap();
    assert!((f1 - 1.0).abs() < 1e-6, "{f1}");
    let close = scorer.f1("The capital of France is Paris.", same).unwrap();
    let far = scorer.f1("I don't know.", same).unwrap();
    assert!((0.0..=1.0).contains(&close) && (0.0..=1.0).contains(&far));
    assert!(close > far + 0.5, "paraphrase {close} vs non-answer {far}");
    assert_eq!(scorer.f1("", same).unwrap(), 0.0, "an empty answer scores 0 as in bert_score");
}

#[test]
fn earlier_layers_are_selectable_and_checked() {
    let scorer = scorer().with_num_layers(3).unwrap();
    assert_eq!(scorer.num_layers(), 3);
    let s = scorer.score("The capital of France is Paris.", "Paris is the capital of France.").unwrap();
    assert!(s.f1 > 0.5 && s.f1 < 1.0, "{s:?}");
    assert!(matches!(scorer.with_num_layers(7), Err(BertScoreError::Layers { requested: 7, available: 6 })));
}

#[test]
fn a_missing_model_folder_says_to_run_make_setup() {
    let dir = std::env::temp_dir().join("omen-bertscore-no-such-model");
    let e = BertScorer::load(&dir).unwrap_err();
    assert!(matches!(e, BertScoreError::Missing { .. }), "{e}");
    assert!(e.to_string().contains("make setup"), "{e}");
}

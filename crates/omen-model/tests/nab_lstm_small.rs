//! The LSTM autoencoder on one real NAB file, briefly: trained on nyc_taxi's probationary
//! rows only (5 epochs), its severity must beat the null detector clearly under NAB's
//! standard profile (optimised threshold, normalised), and the pruned model must still score.
//! The full 24-file evaluation is the `nab_lstm` example (docs/nab.md).
#![cfg(feature = "torch")]

use omen_model::features::FeatureSet;
use omen_model::lstm_ae::{self, LstmAeConfig, LstmAutoencoder};
use omen_nab::{self as nab, NabCorpus};

#[test]
fn nyc_taxi_lstm_ae_beats_the_null_detector() {
    let dir = nab::data_dir();
    assert!(
        dir.join("labels/combined_windows.json").is_file(),
        "NAB data not found at {}; set OMEN_NAB_DIR",
        dir.display()
    );
    lstm_ae::set_threads(1);
    let corpus = NabCorpus::load(&dir).unwrap();
    let rel = "realKnownCause/nyc_taxi.csv";
    let (ts, values) = nab::read_csv_column(&dir.join("data").join(rel), "value").unwrap();
    let raw: Vec<Vec<f64>> = values.iter().map(|&v| vec![v]).collect();
    let probation = nab::probation_length(raw.len());
    let cfg = LstmAeConfig { epochs: 5, batch_size: 128, learning_rate: 0.01, ..Default::default() };
    let fs = FeatureSet::raw(vec!["value".into()]);
    let model = LstmAutoencoder::train(fs, &raw[..probation], &cfg, &mut |_| {}).unwrap();
    let severity = |m: &LstmAutoencoder| -> Vec<f64> {
        m.score_series(&raw).unwrap().into_iter().map(|e| e.map_or(0.0, |e| m.severity(e))).collect()
    };
    let cost = corpus.cost("standard").unwrap();
    let score =
        |s: Vec<f64>| nab::optimised_normalised(&corpus, &[(rel.into(), ts.clone(), s)], &cost).unwrap().1;
    let full = score(severity(&model));
    assert!(full > 10.0, "normalised standard score {full}");
    let (pruned, _) = model.prune(0.6, Some(&raw[..probation]), 1).unwrap();
    let small = score(severity(&pruned));
    assert!(small > 10.0, "pruned: normalised standard score {small}");
}

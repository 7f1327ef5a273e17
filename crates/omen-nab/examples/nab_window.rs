//! Scores omen's sliding-window anomaly score on the NAB files at hand and prints its
//! normalised NAB score next to numenta's, both optimised with the same threshold sweep.
//!
//! Usage: `cargo run -p omen-nab --example nab_window [-- WINDOW]` (OMEN_NAB_DIR overrides
//! the data directory, default data/nab in the repository).

use omen_nab::{self as nab, NabCorpus, PROFILES};
use omen_signals::window::WindowAnomaly;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let window: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(64);
    let dir = nab::data_dir();
    let corpus = NabCorpus::load(&dir)?;
    let (mut omen, mut numenta) = (Vec::new(), Vec::new());
    for rel in nab::data_files(&dir)? {
        let (ts, values) = nab::read_csv_column(&dir.join("data").join(&rel), "value")?;
        let mut det = WindowAnomaly::new(window)?;
        // Monotone squash of the unbounded score to [0, 1); 0 until the window is full.
        let scores = values
            .iter()
            .map(|&v| det.push(v).map(|s| s.map_or(0.0, |s| s.score / (1.0 + s.score))))
            .collect::<Result<Vec<_>, _>>()?;
        omen.push((rel.clone(), ts, scores));
        let (nts, nsc) = nab::read_csv_column(&nab::result_path(&dir, "numenta", &rel), "anomaly_score")?;
        numenta.push((rel, nts, nsc));
    }
    println!("NAB on {} files ({}), window {window}", omen.len(), nab::categories(&dir)?.join(" + "));
    println!("| profile | omen window score (threshold) | numenta (threshold) |");
    println!("|---|---|---|");
    for prof in PROFILES {
        let cost = corpus.cost(prof)?;
        let (ob, on) = nab::optimised_normalised(&corpus, &omen, &cost)?;
        let (nb, nn) = nab::optimised_normalised(&corpus, &numenta, &cost)?;
        println!("| {prof} | {on:.2} ({:.4}) | {nn:.2} ({:.4}) |", ob.threshold, nb.threshold);
    }
    Ok(())
}

//! Scores omen's raw anomaly scores alone and post-processed, on the NAB files, beside
//! numenta's, all optimised with the same threshold sweep:
//! - window score (w), squashed s / (1 + s);
//! - the numenta detector's post-processing of it (omen_signals::HtmLikelihood, the exact
//!   port: anomaly likelihood, log scale, spatial rule);
//! - range novelty (omen_signals::RangeNovelty): 1 where a value leaves the range seen so far;
//! - context surprise (omen_signals::ContextSurprise) of each value, over the range of the
//!   file's probationary rows widened by `pad` x that range on each side (0 during those
//!   rows, which NAB does not score);
//! - the numenta post-processing of the surprise;
//! - combined: 1 on novelty, else the surprise;
//! - time-of-day surprise: the same model with the row's time-of-day bucket (`day-buckets`
//!   equal parts of the day) as part of every context
//!   (omen_signals::ContextSurprise::push_tagged);
//! - combined: 1 on novelty, else the larger of the two surprises
//!   (omen_signals::NoveltySurprise, omen's NAB detector);
//!   The novelty and surprise columns are the parts of that one detector (`push_parts`).
//! - the numenta post-processing of numenta's own published raw score: a check that the
//!   port gives numenta's published score (it reproduces the published anomaly_score
//!   column, tests/nab_published.rs).
//!
//! Usage: `cargo run --release -p omen-nab --example nab_likelihood -- [OPTIONS]`
//! Options (defaults in brackets): `--window 16` `--tolerance 0.01` `--refractory 200`
//! `--bins 16` `--order 3` `--alpha 1` `--pad 0.2` `--day-buckets 8`. OMEN_NAB_DIR overrides
//! the data directory.

use omen_nab::{self as nab, NabCorpus, PROFILES};
use omen_signals::{HtmLikelihood, NoveltySurprise, NoveltySurpriseConfig, WindowAnomaly};

type Files = Vec<(String, Vec<String>, Vec<f64>)>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut window, mut tolerance, mut refractory) = (16usize, 0.01f64, 200u64);
    let (mut bins, mut order, mut alpha, mut pad) = (16usize, 3usize, 1.0f64, 0.2f64);
    let mut day_buckets = 8u16;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let v = pair.get(1).ok_or_else(|| format!("{} needs a value", pair[0]))?;
        match pair[0].as_str() {
            "--window" => window = v.parse()?,
            "--tolerance" => tolerance = v.parse()?,
            "--refractory" => refractory = v.parse()?,
            "--bins" => bins = v.parse()?,
            "--order" => order = v.parse()?,
            "--alpha" => alpha = v.parse()?,
            "--pad" => pad = v.parse()?,
            "--day-buckets" => day_buckets = v.parse()?,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    let dir = nab::data_dir();
    let corpus = NabCorpus::load(&dir)?;
    let names = [
        "window score",
        "numenta post-processing of it",
        "range novelty",
        "context surprise",
        "numenta post-processing of it",
        "combined (novelty, surprise)",
        "time-of-day surprise",
        "combined (novelty, both surprises)",
        "numenta post-processing of numenta's raw score",
    ];
    let mut columns: Vec<Files> = vec![Vec::new(); names.len()];
    let mut numenta: Files = Vec::new();
    for rel in nab::data_files(&dir)? {
        let (ts, values) = nab::read_csv_column(&dir.join("data").join(&rel), "value")?;
        let published = nab::result_path(&dir, "numenta", &rel);
        let (_, htm_raw) = nab::read_csv_column(&published, "raw_score")?;
        let probation = nab::probation_length(values.len());
        let mut det = WindowAnomaly::new(window)?;
        let (low, high) = nab::learning_range(&values, pad);
        let config = NoveltySurpriseConfig { bins, order, alpha, day_buckets, tolerance, refractory };
        let mut detector = NoveltySurprise::new(low, high, probation as u64, config)?;
        let mut htm_window = HtmLikelihood::new(probation.max(2))?;
        let mut htm_surprise = HtmLikelihood::new(probation.max(2))?;
        let mut htm_own = HtmLikelihood::new(probation.max(2))?;
        let mut out: Vec<Vec<f64>> = vec![Vec::with_capacity(values.len()); names.len()];
        for ((&v, &raw), t) in values.iter().zip(&htm_raw).zip(&ts) {
            let s = det.push(v)?.map_or(0.0, |s| s.score / (1.0 + s.score));
            let p = detector.push_parts(v, nab::day_fraction(t)?)?;
            let novel = if p.novel { 1.0 } else { 0.0 };
            let reported = |x: f64| if p.learning { 0.0 } else { x };
            let row = [
                s,
                htm_window.push(v, s)?,
                novel,
                reported(p.plain),
                htm_surprise.push(v, p.plain)?,
                reported(p.plain).max(novel),
                reported(p.by_time_of_day),
                p.score(),
                htm_own.push(v, raw)?,
            ];
            for (col, x) in out.iter_mut().zip(row) {
                col.push(x);
            }
        }
        for (col, scores) in columns.iter_mut().zip(out) {
            col.push((rel.clone(), ts.clone(), scores));
        }
        let (nts, nsc) = nab::read_csv_column(&published, "anomaly_score")?;
        numenta.push((rel, nts, nsc));
    }
    println!(
        "NAB on {} files ({}); window {window}, novelty tolerance \
         {tolerance} refractory {refractory}; surprise bins {bins} order {order} alpha {alpha} pad {pad} \
         day buckets {day_buckets}",
        numenta.len(),
        nab::categories(&dir)?.join(" + ")
    );
    println!("| profile | {} | numenta |", names.join(" | "));
    println!("|---|{}", "---|".repeat(names.len() + 1));
    for prof in PROFILES {
        let cost = corpus.cost(prof)?;
        let mut line = format!("| {prof} |");
        for col in columns.iter().chain(std::iter::once(&numenta)) {
            let (best, norm) = nab::optimised_normalised(&corpus, col, &cost)?;
            line += &format!(" {norm:.2} ({:.4}) |", best.threshold);
        }
        println!("{line}");
    }
    Ok(())
}

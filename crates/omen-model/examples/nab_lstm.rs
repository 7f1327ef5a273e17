//! The full NAB evaluation of omen's detectors on the files at hand: the window anomaly
//! score alone, the LSTM autoencoder alone (trained per file on its probationary rows only,
//! NAB's normal period), the combined health score (max of the two severities) and the
//! pruned autoencoder, each optimised by NAB's threshold sweep and normalised, beside the
//! published detectors re-scored by the port.
//!
//! Usage: `cargo run --release -p omen-model --features torch --example nab_lstm -- [OPTIONS]`
//! Options: `--features raw,diff,mean:8,std:8` `--window 32` `--hidden 32` `--latent 8`
//! `--epochs 60` `--batch 32` `--stride 1` `--lr 0.005` `--patience 8` `--threads 1` `--prune 0.6`
//! `--fine-tune 5` `--anomaly-window 64` `--only SUBSTRING` (files whose path contains it) `--new-highs K` (report only scores above
//! every score of the previous K rows; 0 = off).
//! OMEN_NAB_DIR overrides the data directory (default data/nab in the repository).

use std::time::Instant;

use omen_model::eval::{window_f1, window_rows, WindowF1};
use omen_model::features::FeatureSet;
use omen_model::lstm_ae::{LstmAeConfig, LstmAutoencoder};
use omen_model::{PotThreshold, SeverityMap};
use omen_nab::{self as nab, NabCorpus, PROFILES};
use omen_signals::window::WindowAnomaly;

type Files = Vec<(String, Vec<String>, Vec<f64>)>;

struct Opts {
    features: String,
    cfg: LstmAeConfig,
    threads: i32,
    prune: f64,
    fine_tune: usize,
    anomaly_window: usize,
    only: Option<String>,
    new_highs: usize,
}

fn parse() -> Result<Opts, Box<dyn std::error::Error>> {
    let mut o = Opts {
        features: "raw,diff".into(),
        cfg: LstmAeConfig::default(),
        threads: 1,
        prune: omen_model::prune::DEFAULT_KEEP,
        fine_tune: 5,
        anomaly_window: 64,
        only: None,
        new_highs: 0,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let [k, v] = pair else { return Err(format!("{pair:?}: options take a value").into()) };
        match k.as_str() {
            "--features" => o.features = v.clone(),
            "--window" => o.cfg.window = v.parse()?,
            "--hidden" => {
                o.cfg.hidden = v.parse()?;
                o.cfg.decoder_hidden = o.cfg.hidden;
            }
            "--latent" => o.cfg.latent = v.parse()?,
            "--batch" => o.cfg.batch_size = v.parse()?,
            "--stride" => o.cfg.stride = v.parse()?,
            "--lr" => o.cfg.learning_rate = v.parse()?,
            "--patience" => o.cfg.patience = v.parse()?,
            "--only" => o.only = Some(v.clone()),
            "--new-highs" => o.new_highs = v.parse()?,
            "--epochs" => o.cfg.epochs = v.parse()?,
            "--threads" => o.threads = v.parse()?,
            "--prune" => o.prune = v.parse()?,
            "--fine-tune" => o.fine_tune = v.parse()?,
            "--anomaly-window" => o.anomaly_window = v.parse()?,
            _ => return Err(format!("unknown option {k}").into()),
        }
    }
    Ok(o)
}

/// Keeps a score only where it exceeds every score of the previous `k` rows (0 elsewhere):
/// a causal report of new highs, so a lasting excursion is reported once. `k` = 0 keeps all.
fn new_highs(scores: Vec<f64>, k: usize) -> Vec<f64> {
    if k == 0 {
        return scores;
    }
    (0..scores.len())
        .map(|i| {
            let prev = scores[i.saturating_sub(k)..i].iter().copied().fold(0.0, f64::max);
            if scores[i] > prev {
                scores[i]
            } else {
                0.0
            }
        })
        .collect()
}

/// Severity of the window anomaly score, calibrated like the autoencoder's: POT on the probation scores.
fn window_severity(
    values: &[f64],
    window: usize,
    probation: usize,
) -> Result<(Vec<f64>, Vec<f64>), Box<dyn std::error::Error>> {
    let mut det = WindowAnomaly::new(window)?;
    let raw: Vec<Option<f64>> =
        values.iter().map(|&v| det.push(v).map(|s| s.map(|s| s.score))).collect::<Result<_, _>>()?;
    let squashed: Vec<f64> = raw.iter().map(|s| s.map_or(0.0, |s| s / (1.0 + s))).collect();
    let normal: Vec<f64> = raw[..probation].iter().flatten().copied().collect();
    let q = (1.0 - 12.0 / normal.len() as f64).clamp(0.5, 0.98);
    let pot = PotThreshold::fit(&normal, q, 1e-3f64.min(0.5 * (1.0 - q)))?;
    let map = SeverityMap { threshold: pot.threshold };
    Ok((squashed, raw.iter().map(|s| s.map_or(0.0, |s| map.severity(s))).collect()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = parse()?;
    tch::set_num_threads(o.threads);
    let dir = nab::data_dir();
    let corpus = NabCorpus::load(&dir)?;
    let names = [
        "window score",
        "LSTM-AE severity",
        "combined max(window, LSTM-AE) severities",
        "LSTM-AE pruned severity",
        "LSTM-AE error, window score of it",
        "combined max(window, LSTM-AE error window)",
        "LSTM-AE e/(e+threshold)",
    ];
    let mut det: Vec<Files> = vec![Vec::new(); names.len()];
    let mut published: Vec<(&str, Files)> = vec![("numenta", Vec::new()), ("null", Vec::new())];
    let (mut f1_full, mut f1_pruned) = ((0, 0, 0), (0, 0, 0));
    let (mut train_s, mut train_max, mut lat_full, mut lat_pruned) = (0.0, 0.0f64, 0.0, 0.0);
    let (mut params, mut params_pruned) = (0, 0);
    let started = Instant::now();
    let mut count = 0;
    for rel in nab::data_files(&dir)? {
        if o.only.as_ref().is_some_and(|p| !rel.contains(p.as_str())) {
            continue;
        }
        let (ts, values) = nab::read_csv_column(&dir.join("data").join(&rel), "value")?;
        let probation = nab::probation_length(ts.len());
        let raw: Vec<Vec<f64>> = values.iter().map(|&v| vec![v]).collect();
        let fs = FeatureSet::parse(vec!["value".into()], &o.features)?;
        let t0 = Instant::now();
        let model = LstmAutoencoder::train(fs, &raw[..probation], &o.cfg, &mut |_| {})?;
        let secs = t0.elapsed().as_secs_f64();
        train_s += secs;
        train_max = train_max.max(secs);
        let (pruned, report) = model.prune(o.prune, Some(&raw[..probation]), o.fine_tune)?;
        params = report.parameters_before;
        params_pruned = report.parameters_after;
        let sev = |m: &LstmAutoencoder| -> Result<Vec<f64>, Box<dyn std::error::Error>> {
            Ok(m.score_series(&raw)?.into_iter().map(|e| e.map_or(0.0, |e| m.severity(e))).collect())
        };
        let (lstm, lstm_p) = (sev(&model)?, sev(&pruned)?);
        // Per-window latency on one window (batch of 1), the agent's case.
        let feats = model.meta.features.transform_all(&raw[..model.window() + 8])?;
        let w = &feats[8..];
        for (m, acc) in [(&model, &mut lat_full), (&pruned, &mut lat_pruned)] {
            let t = Instant::now();
            for _ in 0..100 {
                m.score_window(w)?;
            }
            *acc += t.elapsed().as_secs_f64() / 100.0;
        }
        let (squashed, wsev) = window_severity(&values, o.anomaly_window, probation)?;
        let combined: Vec<f64> = wsev.iter().zip(&lstm).map(|(a, b)| a.max(*b)).collect();
        // The error judged against its own recent past (as NAB's HTM judges its raw score by
        // its anomaly likelihood): omen's window score over the error series, squashed.
        let errors: Vec<f64> = model.score_series(&raw)?.into_iter().map(|e| e.unwrap_or(0.0)).collect();
        let mut on_errors = WindowAnomaly::new(o.anomaly_window)?;
        let lstm_w: Vec<f64> = errors
            .iter()
            .map(|&e| on_errors.push(e).map(|s| s.map_or(0.0, |s| s.score / (1.0 + s.score))))
            .collect::<Result<_, _>>()?;
        // Unsaturated calibration: 0.5 at the POT threshold, the ranking kept everywhere.
        let t = model.meta.pot.threshold;
        let lstm_ratio: Vec<f64> = errors.iter().map(|&e| if e > 0.0 { e / (e + t) } else { 0.0 }).collect();
        let combined_w: Vec<f64> = squashed.iter().zip(&lstm_w).map(|(a, b)| a.max(*b)).collect();
        let rows = window_rows(&ts, corpus.windows_of(&rel)?)?;
        for (acc, s) in [(&mut f1_full, &lstm), (&mut f1_pruned, &lstm_p)] {
            let d: Vec<bool> = s.iter().map(|&x| x >= 0.6).collect();
            let r = window_f1(&d, &rows, probation);
            *acc = (acc.0 + r.tp, acc.1 + r.fn_, acc.2 + r.fp);
        }
        eprintln!(
            "{rel}: {} rows, trained on {probation} in {secs:.1}s ({} epochs, best {}), threshold {:.4}",
            ts.len(),
            model.meta.training.epochs_run,
            model.meta.training.best_epoch,
            model.meta.pot.threshold
        );
        for (i, s) in
            [squashed, lstm, combined, lstm_p, lstm_w, combined_w, lstm_ratio].into_iter().enumerate()
        {
            det[i].push((rel.clone(), ts.clone(), new_highs(s, o.new_highs)));
        }
        for (pname, files) in &mut published {
            let (nts, nsc) = nab::read_csv_column(&nab::result_path(&dir, pname, &rel), "anomaly_score")?;
            files.push((rel.clone(), nts, nsc));
        }
        count += 1;
    }
    let n = count as f64;
    println!(
        "NAB on {count} files ({}); features {}, window {}, hidden {}, latent {}, {} threads; total {:.0}s",
        nab::categories(&dir)?.join(" + "),
        o.features,
        o.cfg.window,
        o.cfg.hidden,
        o.cfg.latent,
        o.threads,
        started.elapsed().as_secs_f64()
    );
    println!("training per file: mean {:.1}s, max {:.1}s", train_s / n, train_max);
    println!();
    print!("| profile |");
    for name in names.iter().chain(["numenta", "null"].iter()) {
        print!(" {name} |");
    }
    println!();
    println!("|---|{}", "---|".repeat(names.len() + 2));
    for prof in PROFILES {
        let cost = corpus.cost(prof)?;
        print!("| {prof} |");
        for files in det.iter().chain(published.iter().map(|p| &p.1)) {
            let (best, norm) = nab::optimised_normalised(&corpus, files, &cost)?;
            print!(" {norm:.2} ({:.4}) |", best.threshold);
        }
        println!();
    }
    let f = |c: (usize, usize, usize)| WindowF1::from_counts(c.0, c.1, c.2);
    let (a, b) = (f(f1_full), f(f1_pruned));
    println!();
    println!("| LSTM-AE | parameters | latency per window (batch 1) | window F1 at severity 0.6 (P / R) |");
    println!("|---|---|---|---|");
    println!(
        "| full | {params} | {:.3} ms | {:.3} ({:.3} / {:.3}) |",
        lat_full / n * 1e3,
        a.f1,
        a.precision,
        a.recall
    );
    println!(
        "| pruned, keep {} + {} epochs fine-tune | {params_pruned} | {:.3} ms | {:.3} ({:.3} / {:.3}) |",
        o.prune,
        o.fine_tune,
        lat_pruned / n * 1e3,
        b.f1,
        b.precision,
        b.recall
    );
    Ok(())
}

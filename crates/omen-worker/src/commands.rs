//! `omen-worker train` and `omen-worker evaluate` (what `omen train` / `omen evaluate`
//! run): fit and judge the LSTM autoencoder on data that omen_protocol::training loads.

use std::io::IsTerminal;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use omen_model::eval::{nab_profile, window_f1, window_rows};
use omen_model::features::FeatureSet;
use omen_model::lstm_ae::{self, LstmAeConfig, LstmAutoencoder};
use omen_model::pot::ALARM_SEVERITY;
use omen_nab::{self as nab, NabCorpus, PROFILES};

use omen_protocol::training::{load_labels, load_table, EvaluateArgs, NetworkArgs, TrainArgs, TrainReport};

/// Mean seconds to score one window (batch of one), over `n` runs.
fn latency(model: &LstmAutoencoder, rows: &[Vec<f64>], n: usize) -> Result<f64> {
    let feats = model.meta.features.transform_all(&rows[..model.window()])?;
    let t = std::time::Instant::now();
    for _ in 0..n {
        model.score_window(&feats)?;
    }
    Ok(t.elapsed().as_secs_f64() / n as f64)
}

/// The model settings of the network options `n` (the rest at [`LstmAeConfig`]'s defaults).
pub fn network_config(n: &NetworkArgs) -> LstmAeConfig {
    LstmAeConfig {
        window: n.window,
        hidden: n.hidden,
        decoder_hidden: n.hidden,
        latent: n.latent,
        epochs: n.epochs,
        patience: n.patience,
        batch_size: n.batch_size,
        learning_rate: n.learning_rate,
        seed: n.seed,
        ..Default::default()
    }
}

/// `omen train`.
pub fn train(a: &TrainArgs) -> Result<()> {
    lstm_ae::set_threads(a.threads);
    let table = load_table(&a.data)?;
    let n = table.rows.len();
    let take = if a.nab_probation {
        nab::probation_length(n)
    } else {
        if !(a.train_fraction > 0.0 && a.train_fraction <= 1.0) {
            bail!("--train-fraction {} must be in (0, 1]", a.train_fraction);
        }
        (n as f64 * a.train_fraction).round() as usize
    };
    let rows = &table.rows[..take];
    let features = FeatureSet::parse(table.columns.clone(), &a.features).context("--features")?;
    let cfg = network_config(&a.network);
    let bar = if a.no_progress || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(a.network.epochs as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} epoch {pos}/{len} {msg} [{elapsed}]").expect("valid template"),
    );
    let model = LstmAutoencoder::train(features, rows, &cfg, &mut |p| {
        bar.set_position(p.epoch as u64);
        bar.set_message(format!("train {:.4} val {:.4}", p.train_loss, p.val_loss));
    })
    .with_context(|| format!("training on {}", a.data.data.display()))?;
    bar.finish_and_clear();
    let t = &model.meta.training;
    println!(
        "trained on {take} of {n} rows ({} columns x {} features): {} epochs (best {}), train loss {:.5}, val loss {:.5}, {:.1}s",
        model.meta.features.sources.len(),
        model.meta.features.width(),
        t.epochs_run,
        t.best_epoch,
        t.train_loss,
        t.val_loss,
        t.seconds
    );
    println!(
        "POT threshold {:.6} (risk {}, from {} errors); {} parameters",
        model.meta.pot.threshold,
        model.meta.pot.risk,
        if t.threshold_from_validation { "validation" } else { "all window" },
        model.parameter_count()
    );
    let model = match a.prune {
        None => model,
        Some(keep) => {
            let (pruned, r) = model.prune(keep, Some(rows), a.fine_tune)?;
            let (l0, l1) = (latency(&model, rows, 200)?, latency(&pruned, rows, 200)?);
            println!(
                "pruned to {keep}: parameters {} -> {}, encoder {} -> {} units, decoder {} -> {}; latency per window {:.3} ms -> {:.3} ms; POT threshold {:.6}",
                r.parameters_before,
                r.parameters_after,
                model.meta.dims.hidden,
                pruned.meta.dims.hidden,
                model.meta.dims.decoder_hidden,
                pruned.meta.dims.decoder_hidden,
                l0 * 1e3,
                l1 * 1e3,
                pruned.meta.pot.threshold
            );
            pruned
        }
    };
    model.save(&a.out)?;
    println!("wrote {}", a.out.display());
    if let Some(path) = &a.report {
        let report = train_report(&model, &table.rows, take)?;
        if report.holdout_windows > 0 {
            println!(
                "held back {} rows: {} of {} windows at or above the threshold ({:.2}%)",
                n - take,
                report.holdout_alarms,
                report.holdout_windows,
                100.0 * report.holdout_alarm_rate()
            );
        }
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("--report: cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Rows before the held-back ones that the feature builder is given for its history.
const FEATURE_HISTORY: usize = 256;

/// The figures of `model`, trained on the first `take` of `rows`, with its alarms on the
/// windows that end in the rows after them.
fn train_report(model: &LstmAutoencoder, rows: &[Vec<f64>], take: usize) -> Result<TrainReport> {
    let w = model.window();
    let (mut windows, mut alarms) = (0, 0);
    if take < rows.len() {
        // Start early enough that the first held-back window is full and its derived
        // features (diff, mean:N, std:N) have their history; count windows ending after `take`.
        let from = take.saturating_sub(w - 1 + FEATURE_HISTORY);
        for (i, e) in model.score_series(&rows[from..])?.into_iter().enumerate() {
            if let (true, Some(e)) = (from + i >= take, e) {
                windows += 1;
                alarms += usize::from(model.severity(e) >= ALARM_SEVERITY);
            }
        }
    }
    let t = &model.meta.training;
    Ok(TrainReport {
        rows: rows.len(),
        train_rows: take,
        columns: model.meta.features.sources.clone(),
        epochs_run: t.epochs_run,
        train_loss: t.train_loss,
        val_loss: t.val_loss,
        seconds: t.seconds,
        threshold: model.meta.pot.threshold,
        holdout_windows: windows,
        holdout_alarms: alarms,
    })
}

/// `omen evaluate`.
pub fn evaluate(a: &EvaluateArgs) -> Result<()> {
    lstm_ae::set_threads(a.threads);
    let model = LstmAutoencoder::load(&a.model)?;
    let table = load_table(&a.data)?.select(&model.meta.features.sources, &a.data.data)?;
    let windows = load_labels(&a.labels, &a.data.data)?;
    let rows = window_rows(&table.timestamps, &windows).map_err(|e| {
        anyhow::anyhow!("{}: {e}; the labels must use the data's timestamps", a.labels.display())
    })?;
    let severity: Vec<f64> =
        model.score_series(&table.rows)?.into_iter().map(|e| e.map_or(0.0, |e| model.severity(e))).collect();
    let n = table.rows.len();
    let probation = nab::probation_length(n);
    let detected: Vec<bool> = severity.iter().map(|&s| s >= ALARM_SEVERITY).collect();
    let f = window_f1(&detected, &rows, probation);
    println!(
        "{} rows, {} anomaly windows; scored after NAB's probation ({probation} rows); detection = severity >= 0.6 (the POT threshold)",
        n,
        windows.len()
    );
    println!(
        "window-based: TP {} FN {} FP {} (runs outside windows); precision {:.3} recall {:.3} F1 {:.3}",
        f.tp, f.fn_, f.fp, f.precision, f.recall, f.f1
    );
    let key = a.data.data.display().to_string();
    let corpus = NabCorpus {
        windows: [(key.clone(), windows.clone())].into_iter().collect(),
        profiles: PROFILES.iter().map(|p| (p.to_string(), nab_profile(p).expect("NAB profile"))).collect(),
    };
    let files = vec![(key.clone(), table.timestamps.clone(), severity.clone())];
    println!("| NAB profile | score at 0.6 (normalised) | optimised threshold | score there (normalised) |");
    println!("|---|---|---|---|");
    for p in PROFILES {
        let cost = corpus.cost(p)?;
        let at = nab::score_file(&corpus, &key, &table.timestamps, &severity, &cost, 0.6)?;
        let null = -(windows.len() as f64) * cost.fn_;
        let norm_at = nab::normalise(at.row.score, null, windows.len(), &cost);
        let (best, norm) = nab::optimised_normalised(&corpus, &files, &cost)?;
        println!(
            "| {p} | {:.3} ({norm_at:.2}) | {:.4} | {:.3} ({norm:.2}) |",
            at.row.score, best.threshold, best.score
        );
    }
    if let Some(out) = &a.scores {
        let mut text = String::from("timestamp,anomaly_score\n");
        for (t, s) in table.timestamps.iter().zip(&severity) {
            text.push_str(&format!("{t},{s}\n"));
        }
        std::fs::write(out, text).with_context(|| format!("cannot write {}", out.display()))?;
    }
    Ok(())
}

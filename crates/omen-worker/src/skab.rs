//! `omen-worker evaluate-skab` (what `omen evaluate-skab` runs): omen's LSTM autoencoder on
//! SKAB by the leaderboard's protocol. Per file it fits the model (scaler included) on the
//! first 400 rows, scores every later row with the window ending there, and predicts an
//! anomaly where the error exceeds the model's own POT threshold (severity >= 0.6, what the
//! agent alerts on). SKAB's scorer (omen_nab::skab) then judges the predictions of all files
//! together, for the full model and for the pruned one.

use std::io::IsTerminal;
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use omen_model::features::FeatureSet;
use omen_model::lstm_ae::{self, LstmAeConfig, LstmAutoencoder};
use omen_nab::skab::{self, SkabFile, SkabScores, TRAINING_ROWS};
use omen_protocol::training::SkabArgs;
use serde::Serialize;

/// SKAB's changepoint window, seconds to the right of each changepoint.
const WINDOW_S: i64 = 60;

/// One model's figures: over all files and per folder.
#[derive(Debug, Serialize)]
struct ModelRow {
    model: String,
    scores: SkabScores,
    by_folder: Vec<(String, SkabScores)>,
}

/// What one file cost and gave.
#[derive(Debug, Serialize)]
struct FileReport {
    file: String,
    train_seconds: f64,
    prune_seconds: f64,
    epochs_run: usize,
    threshold: f64,
    pruned_threshold: f64,
    parameters: usize,
    pruned_parameters: usize,
    test_rows: usize,
    predicted_anomalous: usize,
    pruned_predicted_anomalous: usize,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    protocol: &'static str,
    settings: &'a LstmAeConfig,
    prune_keep: f64,
    fine_tune_epochs: usize,
    threads: usize,
    rows: Vec<ModelRow>,
    files: Vec<FileReport>,
}

/// The test rows' predictions: error of the window ending at the row above the POT threshold.
/// A row whose window is not yet full (only when the window exceeds the training rows) is not
/// predicted, and SKAB's scorer counts it nowhere.
/// Per test row: the window's error and the prediction (`None` before a window is full).
struct Scored {
    errors: Vec<Option<f64>>,
    predictions: Vec<Option<bool>>,
}

fn predict(model: &LstmAutoencoder, file: &SkabFile) -> Result<Scored> {
    let errors = model.score_series(&file.rows)?.split_off(TRAINING_ROWS);
    let threshold = model.meta.pot.threshold;
    let predictions = errors.iter().map(|e| e.map(|e| e > threshold)).collect();
    Ok(Scored { errors, predictions })
}

/// One file's test rows as CSV: time, error and prediction of both models, and the labels.
fn scores_csv(
    file: &SkabFile,
    full: (&LstmAutoencoder, &[Option<f64>]),
    pruned: (&LstmAutoencoder, &[Option<f64>]),
) -> String {
    let cell = |e: Option<f64>| e.map_or(String::new(), |e| e.to_string());
    let mut out = String::from(
        "time,error,threshold,anomalous,pruned_error,pruned_threshold,pruned_anomalous,anomaly,changepoint\n",
    );
    for i in 0..file.times.len() {
        let (e, p) = (full.1[i], pruned.1[i]);
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{}\n",
            file.times[i],
            cell(e),
            full.0.meta.pot.threshold,
            e.is_some_and(|e| e > full.0.meta.pot.threshold) as u8,
            cell(p),
            pruned.0.meta.pot.threshold,
            p.is_some_and(|p| p > pruned.0.meta.pot.threshold) as u8,
            file.anomaly[i] as u8,
            file.changepoint[i] as u8,
        ));
    }
    out
}

fn folder(rel: &str) -> &str {
    rel.split_once('/').map_or(rel, |(f, _)| f)
}

/// Scores over all files and per folder.
fn row(model: &str, files: &[SkabFile], predictions: &[Vec<Option<bool>>]) -> Result<ModelRow> {
    let scores = skab::score(files, predictions, WINDOW_S)?.rounded();
    let mut folders: Vec<&str> = files.iter().map(|f| folder(&f.rel)).collect();
    folders.dedup();
    let mut by_folder = Vec::new();
    for name in folders {
        let (fs, ps): (Vec<SkabFile>, Vec<Vec<Option<bool>>>) = files
            .iter()
            .zip(predictions)
            .filter(|(f, _)| folder(&f.rel) == name)
            .map(|(f, p)| (f.clone(), p.clone()))
            .unzip();
        by_folder.push((name.to_owned(), skab::score(&fs, &ps, WINDOW_S)?.rounded()));
    }
    Ok(ModelRow { model: model.to_owned(), scores, by_folder })
}

/// The model settings the arguments ask for (validation share and stride as `omen train`).
pub fn config(a: &SkabArgs) -> LstmAeConfig {
    LstmAeConfig {
        pot_risk: a.pot_risk,
        validation_fraction: a.validation_fraction,
        ..crate::commands::network_config(&a.network)
    }
}

/// `omen evaluate-skab`.
pub fn evaluate_skab(a: &SkabArgs) -> Result<()> {
    lstm_ae::set_threads(a.threads);
    let dir = a.skab.clone().unwrap_or_else(skab::data_dir);
    let rels = skab::data_files(&dir)?;
    let files: Vec<SkabFile> = rels.iter().map(|r| skab::read_file(&dir, r)).collect::<Result<_, _>>()?;
    let cfg = config(a);
    let bar = if a.no_progress || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(files.len() as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} file {pos}/{len} {msg} [{elapsed}, eta {eta}]")
            .expect("valid template"),
    );
    let (mut full, mut pruned, mut reports) = (Vec::new(), Vec::new(), Vec::new());
    for f in &files {
        bar.set_message(f.rel.clone());
        let train = &f.rows[..TRAINING_ROWS];
        let started = Instant::now();
        let model = LstmAutoencoder::train(
            FeatureSet::parse(f.columns.clone(), &a.features).context("--features")?,
            train,
            &cfg,
            &mut |_| {},
        )
        .with_context(|| format!("training on the first {TRAINING_ROWS} rows of {}", f.rel))?;
        let train_seconds = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let (small, _) = model
            .prune(a.prune, Some(train), a.fine_tune)
            .with_context(|| format!("pruning the model of {} to {}", f.rel, a.prune))?;
        let prune_seconds = started.elapsed().as_secs_f64();
        let (full_scored, small_scored) = (predict(&model, f)?, predict(&small, f)?);
        let (e_full, p_full) = (full_scored.errors, full_scored.predictions);
        let (e_small, p_small) = (small_scored.errors, small_scored.predictions);
        if let Some(dir) = &a.scores {
            let path = dir.join(f.rel.replace('/', "_"));
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            std::fs::write(&path, scores_csv(f, (&model, &e_full), (&small, &e_small)))
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        let count = |p: &[Option<bool>]| p.iter().filter(|x| **x == Some(true)).count();
        reports.push(FileReport {
            file: f.rel.clone(),
            train_seconds,
            prune_seconds,
            epochs_run: model.meta.training.epochs_run,
            threshold: model.meta.pot.threshold,
            pruned_threshold: small.meta.pot.threshold,
            parameters: model.parameter_count(),
            pruned_parameters: small.parameter_count(),
            test_rows: f.times.len(),
            predicted_anomalous: count(&p_full),
            pruned_predicted_anomalous: count(&p_small),
        });
        full.push(p_full);
        pruned.push(p_small);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let keep = format!("omen LSTM-AE pruned (keep {})", a.prune);
    let rows = vec![row("omen LSTM-AE", &files, &full)?, row(&keep, &files, &pruned)?];
    print!("{}", table(&rows, files.len(), &cfg, &reports));
    if let Some(out) = &a.json {
        let report = Report {
            protocol: "SKAB: per file, fit on the first 400 rows, predict the rest; 60 s changepoint windows",
            settings: &cfg,
            prune_keep: a.prune,
            fine_tune_epochs: a.fine_tune,
            threads: a.threads,
            rows,
            files: reports,
        };
        let text = serde_json::to_string_pretty(&report).expect("report serialises");
        std::fs::write(out, text).with_context(|| format!("cannot write {}", out.display()))?;
    }
    Ok(())
}

/// The rows as Markdown, with the settings and the training cost.
fn table(rows: &[ModelRow], files: usize, cfg: &LstmAeConfig, reports: &[FileReport]) -> String {
    let mut out = format!(
        "SKAB, {files} files, omen's LSTM autoencoder fitted per file on the first {TRAINING_ROWS} rows \
         (window {}, hidden {}, latent {}, POT risk {}); anomaly = error above the POT threshold:\n\n",
        cfg.window, cfg.hidden, cfg.latent, cfg.pot_risk
    );
    out.push_str("| model | F1 | FAR % | MAR % | NAB standard | NAB LowFP | NAB LowFN |\n|---|---|---|---|---|---|---|\n");
    for r in rows {
        let s = &r.scores;
        out.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
            r.model, s.f1, s.far_pct, s.mar_pct, s.nab_standard, s.nab_low_fp, s.nab_low_fn
        ));
    }
    for r in rows {
        for (folder, s) in &r.by_folder {
            out.push_str(&format!(
                "\n{} on {folder}: F1 {:.2}, FAR {:.2} %, MAR {:.2} %, NAB standard {:.2}",
                r.model, s.f1, s.far_pct, s.mar_pct, s.nab_standard
            ));
        }
    }
    let secs: Vec<f64> = reports.iter().map(|r| r.train_seconds).collect();
    let (mean, max) =
        (secs.iter().sum::<f64>() / secs.len().max(1) as f64, secs.iter().cloned().fold(0.0, f64::max));
    out.push_str(&format!("\n\ntraining per file: mean {mean:.1} s, max {max:.1} s\n"));
    out
}

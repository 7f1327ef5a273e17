//! The LSTM autoencoder the agent trains itself (`model` without `path`): once the store
//! holds `model.train_after` of data, and then every `model.retrain_every`, the newest
//! `model.train_window` of the `model.signals` series goes to `omen-worker train` in a
//! process of its own; the candidate is validated on the newest `model.holdout` of that
//! data (held back from training) and refused when its windows there alarm more often than
//! `model.max_alarm_rate`. An accepted candidate replaces the model file by renames (the
//! old one stays as `lstm-ae.previous.ot` to roll back to) and is loaded into the model
//! worker; a candidate the worker cannot load is rolled back.
//!
//! Time is event time, as everywhere in the pipeline. A trace replayed as fast as possible
//! waits for each training, so the model joins at the same point of the trace every run;
//! live, training runs beside the pipeline and the model is swapped in at the next tick.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What /scores/latest says about the LSTM-AE.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelStatus {
    /// `file` (model.path), `trained` (by the agent) or `none` yet.
    pub origin: &'static str,
    /// `active`, `training` (beside an active model or not), `waiting_for_data` (before
    /// `model.train_after`) or `none_accepted` (trainings ran, none passed; see `last_training`).
    pub state: &'static str,
    /// The model file in use.
    pub path: Option<PathBuf>,
    /// End of the data the model in use was trained on, ms (trained models).
    pub trained_until_ms: Option<i64>,
    /// Event time since then, seconds.
    pub age_seconds: Option<f64>,
    /// Its input series.
    pub inputs: Vec<String>,
    /// Its validation on the held-back data (trained models).
    pub validation: Option<Validation>,
    /// The last training the agent ran.
    pub last_training: Option<TrainingOutcome>,
    /// Event time from which the next training may start, ms.
    pub next_training_ms: Option<i64>,
}

/// A trained model's figures on the data held back from its training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Validation {
    /// Windows that end in the held-back rows.
    pub windows: usize,
    /// Of those, windows at or above the model's threshold.
    pub alarms: usize,
    /// alarms / windows.
    pub alarm_rate: f64,
    /// The bound it had to meet (`model.max_alarm_rate`).
    pub max_alarm_rate: f64,
}

/// How a training ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingOutcome {
    /// Event time it started, ms.
    pub started_ms: i64,
    /// `accepted`, `refused` or `failed`.
    pub outcome: String,
    /// What happened, in words.
    pub detail: String,
}

/// Model file names in `model.dir`.
pub const CURRENT: &str = "lstm-ae.ot";
/// The model before the current one, kept to roll back to.
pub const PREVIOUS: &str = "lstm-ae.previous.ot";
#[cfg(feature = "lstm")]
const CANDIDATE: &str = "lstm-ae.candidate.ot";
#[cfg(feature = "lstm")]
const TRAINING_DATA: &str = "training-data.jsonl";
#[cfg(feature = "lstm")]
const TRAINING_LOG: &str = "training.log";

#[cfg(feature = "lstm")]
/// The record kept beside a model file (`<file>.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ModelRecord {
    trained_until_ms: i64,
    started_ms: i64,
    validation: Validation,
    report: omen_protocol::training::TrainReport,
}

#[cfg(feature = "lstm")]
fn record_path(model: &std::path::Path) -> PathBuf {
    model.with_extension("json")
}

#[cfg(feature = "lstm")]
/// Renames `from` (and its record) to `to`, replacing what is there.
fn rename_model(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::rename(from, to)?;
    let record = record_path(from);
    if record.exists() {
        std::fs::rename(record, record_path(to))?;
    }
    Ok(())
}

/// The accept-or-refuse rule: enough held-back windows, and few enough alarms on them.
pub fn judge(
    report: &omen_protocol::training::TrainReport,
    max_alarm_rate: f64,
) -> Result<Validation, String> {
    let v = Validation {
        windows: report.holdout_windows,
        alarms: report.holdout_alarms,
        alarm_rate: report.holdout_alarm_rate(),
        max_alarm_rate,
    };
    if v.windows == 0 {
        return Err(format!(
            "no held-back window to validate on ({} rows, {} trained on): raise model.train_window or model.holdout",
            report.rows, report.train_rows
        ));
    }
    if v.alarm_rate > max_alarm_rate {
        return Err(format!(
            "alarms on {} of {} held-back windows ({:.2}% > model.max_alarm_rate {:.2}%)",
            v.alarms,
            v.windows,
            100.0 * v.alarm_rate,
            100.0 * max_alarm_rate
        ));
    }
    Ok(v)
}

#[cfg(feature = "lstm")]
pub use trainer::AutoTrainer;

#[cfg(feature = "lstm")]
mod trainer {
    use std::collections::BTreeMap;
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use anyhow::{bail, Context, Result};
    use omen_protocol::training::TrainReport;
    use omen_store::{Resolution, Store};

    use super::*;
    use crate::config::ModelConfig;
    use crate::lstm_live::LiveModel;
    use crate::metrics::LiveMetrics;
    use crate::worker::Worker;

    /// A training in flight: its start (event time), the end of its data and its result.
    struct Job {
        started_ms: i64,
        until_ms: i64,
        done: mpsc::Receiver<Result<TrainReport>>,
        child: Arc<std::sync::Mutex<std::process::Child>>,
    }

    impl Drop for AutoTrainer {
        /// A training still running when the agent stops is killed, not left behind.
        fn drop(&mut self) {
            if let Some(job) = &self.job {
                let mut child = job.child.lock().unwrap_or_else(|e| e.into_inner());
                if matches!(child.try_wait(), Ok(None)) {
                    let _ = child.kill();
                    let _ = child.wait();
                    tracing::info!("LSTM-AE: the training in progress was stopped with the agent");
                }
            }
        }
    }

    /// Trains, validates and swaps the agent's own LSTM-AE (see the module doc).
    pub struct AutoTrainer {
        cfg: ModelConfig,
        step: Duration,
        dir: PathBuf,
        program: PathBuf,
        worker: Arc<Worker>,
        live: Arc<LiveMetrics>,
        wait: bool,
        job: Option<Job>,
        /// Event time of the last training start (the schedule counts from it).
        last_start_ms: Option<i64>,
        current: Option<ModelRecord>,
        inputs: Vec<String>,
        last_outcome: Option<TrainingOutcome>,
    }

    impl AutoTrainer {
        /// A trainer writing to `cfg.models_dir(store)`; a model a previous run trained there
        /// is returned to be loaded (one that cannot be loaded is moved aside and retrained).
        pub fn start(
            cfg: &ModelConfig,
            step: Duration,
            store_path: &Path,
            program: PathBuf,
            worker: Arc<Worker>,
            live: Arc<LiveMetrics>,
            wait: bool,
        ) -> Result<(Self, Option<LiveModel>)> {
            let dir = cfg.models_dir(store_path);
            std::fs::create_dir_all(&dir).with_context(|| {
                format!("model.dir: cannot create {}; choose a writable folder", dir.display())
            })?;
            let mut me = Self {
                cfg: cfg.clone(),
                step,
                dir,
                program,
                worker,
                live,
                wait,
                job: None,
                last_start_ms: None,
                current: None,
                inputs: Vec::new(),
                last_outcome: None,
            };
            let path = me.dir.join(CURRENT);
            let mut model = None;
            if path.exists() {
                let record = std::fs::read_to_string(record_path(&path))
                    .ok()
                    .and_then(|t| serde_json::from_str::<ModelRecord>(&t).ok());
                match (record, LiveModel::load(me.worker.clone(), &path, me.cfg.threads)) {
                    (Some(record), Ok(m)) => {
                        tracing::info!(path = %path.display(), "LSTM-AE: the model trained by a previous run is in use");
                        me.last_start_ms = Some(record.started_ms);
                        me.inputs = m.sources().to_vec();
                        me.current = Some(record);
                        model = Some(m);
                    }
                    (record, loaded) => {
                        let why = match loaded {
                            Err(e) => format!("{e:#}"),
                            Ok(_) if record.is_none() => {
                                format!("{} is missing or unreadable", record_path(&path).display())
                            }
                            Ok(_) => unreachable!("both present is the arm above"),
                        };
                        let aside = me.dir.join(format!("lstm-ae.bad-{}.ot", chrono::Utc::now().timestamp()));
                        rename_model(&path, &aside)?;
                        tracing::warn!(
                            "LSTM-AE: the trained model in {} cannot be used ({why}); moved aside to {}, a new one is trained",
                            me.dir.display(),
                            aside.display()
                        );
                    }
                }
            }
            me.publish(None);
            Ok((me, model))
        }

        /// One tick: collects a finished training (accepting or refusing it), or starts one
        /// when due. Returns a newly accepted model for the engine to score with.
        pub fn tick(&mut self, now_ms: i64, store: &Store) -> Option<LiveModel> {
            let swapped = self.collect();
            if self.job.is_none() && self.due(now_ms, store) {
                self.last_start_ms = Some(now_ms);
                match self.spawn(now_ms, store) {
                    Ok(job) => self.job = Some(job),
                    Err(e) => self.finish(now_ms, "failed", format!("{e:#}")),
                }
                if self.wait {
                    let collected = self.collect();
                    self.publish(Some(now_ms));
                    return collected.or(swapped);
                }
            }
            self.publish(Some(now_ms));
            swapped
        }

        /// What /scores/latest shows.
        pub fn status(&self, now_ms: i64) -> ModelStatus {
            let state = match (&self.job, &self.current) {
                (Some(_), _) => "training",
                (None, Some(_)) => "active",
                (None, None) if self.last_outcome.is_none() => "waiting_for_data",
                (None, None) => "none_accepted",
            };
            ModelStatus {
                origin: if self.current.is_some() { "trained" } else { "none" },
                state,
                path: self.current.as_ref().map(|_| self.dir.join(CURRENT)),
                trained_until_ms: self.current.as_ref().map(|r| r.trained_until_ms),
                age_seconds: self.current.as_ref().map(|r| (now_ms - r.trained_until_ms) as f64 / 1e3),
                inputs: self.inputs.clone(),
                validation: self.current.as_ref().map(|r| r.validation.clone()),
                last_training: self.last_outcome.clone(),
                next_training_ms: self.next_ms(),
            }
        }

        fn next_ms(&self) -> Option<i64> {
            self.last_start_ms.map(|t| t + self.cfg.retrain_every.as_millis() as i64)
        }

        fn due(&self, now_ms: i64, store: &Store) -> bool {
            if let Some(next) = self.next_ms() {
                return now_ms >= next;
            }
            match store.earliest_ts() {
                Ok(Some(first)) => now_ms - first >= self.cfg.train_after.as_millis() as i64,
                _ => false,
            }
        }

        fn publish(&self, now_ms: Option<i64>) {
            let live = &self.live;
            live.model_active.clear();
            live.model_holdout_alarm_ratio.clear();
            if let Some(r) = &self.current {
                let origin = vec![("origin".into(), "trained".into())];
                live.model_active.get_or_create(&origin).set(1);
                live.model_holdout_alarm_ratio.get_or_create(&origin).set(r.validation.alarm_rate);
                if let Some(now) = now_ms {
                    live.model_age_seconds
                        .get_or_create(&origin)
                        .set((now - r.trained_until_ms) as f64 / 1e3);
                }
            } else {
                live.model_age_seconds.clear();
            }
        }

        fn finish(&mut self, started_ms: i64, outcome: &str, detail: String) {
            match outcome {
                "accepted" => tracing::info!("LSTM-AE training: {detail}"),
                _ => tracing::warn!("LSTM-AE training {outcome}: {detail}"),
            }
            self.live.model_trainings.get_or_create(&vec![("outcome".into(), outcome.into())]).inc();
            self.last_outcome = Some(TrainingOutcome { started_ms, outcome: outcome.into(), detail });
        }

        /// Writes the training data and starts `omen-worker train` on a thread of its own.
        fn spawn(&self, now_ms: i64, store: &Store) -> Result<Job> {
            let data = self.dir.join(TRAINING_DATA);
            let (series, rows) = self.export(now_ms, store, &data)?;
            tracing::info!(series, rows, "LSTM-AE: training a candidate model on the store's newest data");
            let mut cmd = std::process::Command::new(&self.program);
            cmd.arg("train")
                .arg("--data")
                .arg(&data)
                .args(["--step", &format!("{}ms", self.step.as_millis())])
                .args(["--train-fraction", &format!("{}", 1.0 - self.cfg.holdout)])
                .args(["--epochs", &self.cfg.epochs.to_string(), "--threads", "1", "--no-progress"])
                .arg("--out")
                .arg(self.dir.join(CANDIDATE))
                .arg("--report")
                .arg(record_path(&self.dir.join(CANDIDATE)));
            let program = self.program.clone();
            let report_path = record_path(&self.dir.join(CANDIDATE));
            // No stale candidate may pass for this training's.
            for stale in [self.dir.join(CANDIDATE), report_path.clone()] {
                let _ = std::fs::remove_file(stale);
            }
            // The worker's output goes to a log beside the models (its last lines explain a failure).
            let log_path = self.dir.join(TRAINING_LOG);
            let log = std::fs::File::create(&log_path)
                .with_context(|| format!("model.dir: cannot write {}", log_path.display()))?;
            cmd.stdin(std::process::Stdio::null()).stdout(log.try_clone()?).stderr(log);
            let child =
                cmd.spawn().with_context(|| format!("cannot run {} (worker.path)", program.display()))?;
            let child = Arc::new(std::sync::Mutex::new(child));
            let (tx, done) = mpsc::channel();
            let running = child.clone();
            std::thread::Builder::new().name("omen-model-training".into()).spawn(move || {
                let result = (|| -> Result<TrainReport> {
                    // Polled, so that the trainer can kill the child while this thread waits.
                    let status = loop {
                        if let Some(status) = running.lock().unwrap_or_else(|e| e.into_inner()).try_wait()? {
                            break status;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    };
                    if !status.success() {
                        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                        let tail: Vec<&str> = log.lines().rev().take(3).collect();
                        let tail: Vec<&str> = tail.into_iter().rev().collect();
                        bail!(
                            "{} train exited with {status}: {} (log: {})",
                            program.display(),
                            tail.join(" / "),
                            log_path.display()
                        );
                    }
                    let text = std::fs::read_to_string(&report_path)
                        .with_context(|| format!("the worker wrote no report {}", report_path.display()))?;
                    serde_json::from_str(&text)
                        .with_context(|| format!("{}: not a training report", report_path.display()))
                })();
                let _ = tx.send(result);
            })?;
            Ok(Job { started_ms: now_ms, until_ms: now_ms, done, child })
        }

        /// The newest `train_window` of every `signals` series with data in at least half of
        /// its steps (at most `max_series`, those with the most data), as a JSONL trace.
        fn export(&self, now_ms: i64, store: &Store, path: &Path) -> Result<(usize, usize)> {
            let step_ms = (self.step.as_millis() as i64).max(1);
            let earliest = store.earliest_ts()?.unwrap_or(now_ms);
            let since = (now_ms - self.cfg.train_window.as_millis() as i64).max(earliest);
            // Minute aggregates cover the whole window; raw samples are needed below a minute.
            let resolution = if step_ms < 60_000 { Resolution::Raw } else { Resolution::Minute };
            let steps = ((now_ms - since) / step_ms).max(1) as usize;
            let mut chosen = Vec::new();
            for signal in &self.cfg.signals {
                for s in store.range(signal, &BTreeMap::new(), since, now_ms + 1, step_ms, resolution)? {
                    if s.points.len() * 2 >= steps {
                        chosen.push((signal.clone(), s));
                    }
                }
            }
            if chosen.is_empty() {
                bail!(
                    "the store has no data of model.signals {:?} in the last {}; name signals the agent receives",
                    self.cfg.signals,
                    humantime::format_duration(self.cfg.train_window)
                );
            }
            chosen.sort_by_key(|c| std::cmp::Reverse(c.1.points.len()));
            if chosen.len() > self.cfg.max_series {
                let dropped: Vec<String> = chosen[self.cfg.max_series..]
                    .iter()
                    .map(|(sig, s)| {
                        omen_sources::SeriesKey { signal: sig.clone(), labels: s.labels.clone() }.to_string()
                    })
                    .collect();
                tracing::info!(?dropped, "LSTM-AE: more series than model.max_series; these are left out");
                chosen.truncate(self.cfg.max_series);
            }
            let mut lines: Vec<(i64, String)> = Vec::new();
            for (signal, s) in &chosen {
                for &(ts_ms, value) in &s.points {
                    let sample = omen_sources::Sample {
                        ts_ms,
                        signal: signal.clone(),
                        labels: s.labels.clone(),
                        value,
                    };
                    lines.push((ts_ms, serde_json::to_string(&sample)?));
                }
            }
            lines.sort_by_key(|l| l.0);
            let mut f = std::io::BufWriter::new(
                std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?,
            );
            for (_, l) in &lines {
                writeln!(f, "{l}")?;
            }
            f.flush()?;
            Ok((chosen.len(), steps))
        }

        /// Collects a finished training; an accepted candidate is swapped in and returned.
        fn collect(&mut self) -> Option<LiveModel> {
            let job = self.job.as_ref()?;
            let result = if self.wait {
                job.done.recv().unwrap_or_else(|_| Err(anyhow::anyhow!("the training thread died")))
            } else {
                match job.done.try_recv() {
                    Ok(r) => r,
                    Err(mpsc::TryRecvError::Empty) => return None,
                    Err(mpsc::TryRecvError::Disconnected) => Err(anyhow::anyhow!("the training thread died")),
                }
            };
            let job = self.job.take().expect("checked above");
            let report = match result {
                Ok(r) => r,
                Err(e) => {
                    self.finish(job.started_ms, "failed", format!("{e:#}"));
                    return None;
                }
            };
            let validation = match judge(&report, self.cfg.max_alarm_rate) {
                Ok(v) => v,
                Err(why) => {
                    self.finish(job.started_ms, "refused", format!("candidate refused: {why}"));
                    return None;
                }
            };
            let record = ModelRecord {
                trained_until_ms: job.until_ms,
                started_ms: job.started_ms,
                validation,
                report,
            };
            match self.swap_in(&record) {
                Ok(model) => {
                    let v = &record.validation;
                    self.finish(
                        job.started_ms,
                        "accepted",
                        format!(
                            "candidate accepted and in use: {} inputs, {} training rows, alarms on {} of {} held-back windows ({:.2}%)",
                            record.report.columns.len(),
                            record.report.train_rows,
                            v.alarms,
                            v.windows,
                            100.0 * v.alarm_rate
                        ),
                    );
                    self.inputs = model.sources().to_vec();
                    self.current = Some(record);
                    Some(model)
                }
                Err(e) => {
                    self.finish(
                        job.started_ms,
                        "failed",
                        format!("the candidate passed validation but {e:#}"),
                    );
                    None
                }
            }
        }

        /// Candidate -> current (current -> previous), then loads it; rolls back on failure.
        fn swap_in(&self, record: &ModelRecord) -> Result<LiveModel> {
            let (candidate, current, previous) =
                (self.dir.join(CANDIDATE), self.dir.join(CURRENT), self.dir.join(PREVIOUS));
            std::fs::write(record_path(&candidate), serde_json::to_string_pretty(record)?)?;
            let had_current = current.exists();
            if had_current {
                rename_model(&current, &previous)?;
            }
            rename_model(&candidate, &current)?;
            match LiveModel::load(self.worker.clone(), &current, self.cfg.threads) {
                Ok(m) => Ok(m),
                Err(e) => {
                    rename_model(&current, &candidate)?;
                    if had_current {
                        rename_model(&previous, &current)?;
                        // The worker keeps the model it had; loading it again restores its state.
                        let _ = LiveModel::load(self.worker.clone(), &current, self.cfg.threads);
                    }
                    Err(e.context("the model worker could not load it; the previous model stays in use"))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(windows: usize, alarms: usize) -> omen_protocol::training::TrainReport {
        omen_protocol::training::TrainReport {
            rows: 1000,
            train_rows: 800,
            columns: vec!["a".into()],
            epochs_run: 3,
            train_loss: 0.1,
            val_loss: 0.1,
            seconds: 1.0,
            threshold: 0.5,
            holdout_windows: windows,
            holdout_alarms: alarms,
        }
    }

    /// A trainer on a store holding two days of `a` at one sample a minute.
    #[cfg(feature = "lstm")]
    fn trainer(dir: &std::path::Path, signals: &[&str], program: &str) -> (AutoTrainer, omen_store::Store) {
        let store = omen_store::Store::open(&dir.join("omen.db")).unwrap();
        let samples: Vec<omen_sources::Sample> = (0..2 * 1440)
            .map(|m| omen_sources::Sample {
                ts_ms: m * 60_000,
                signal: "a".into(),
                labels: Default::default(),
                value: (m % 7) as f64,
            })
            .collect();
        store.insert(&samples).unwrap();
        let cfg = crate::config::ModelConfig {
            train_after: std::time::Duration::from_secs(86_400),
            signals: signals.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let live = std::sync::Arc::new(crate::metrics::LiveMetrics::new());
        let worker = std::sync::Arc::new(crate::worker::Worker::new(
            program.into(),
            std::time::Duration::from_secs(1),
        ));
        let (t, model) = AutoTrainer::start(
            &cfg,
            std::time::Duration::from_secs(60),
            &dir.join("omen.db"),
            program.into(),
            worker,
            live,
            true,
        )
        .unwrap();
        assert!(model.is_none());
        (t, store)
    }

    #[cfg(feature = "lstm")]
    #[test]
    fn a_training_that_cannot_run_is_a_failed_outcome_and_waits_for_the_schedule() {
        let dir = tempfile::tempdir().unwrap();
        let (mut t, store) = trainer(dir.path(), &["nothing_here"], "/nonexistent/omen-worker");
        // Before train_after: waiting.
        assert!(t.tick(20 * 3_600_000, &store).is_none());
        assert_eq!(t.status(20 * 3_600_000).state, "waiting_for_data");
        assert!(t.tick(86_400_000, &store).is_none());
        let s = t.status(86_400_000);
        assert_eq!((s.origin, s.state), ("none", "none_accepted"));
        let last = s.last_training.unwrap();
        assert_eq!(last.outcome, "failed");
        assert!(
            last.detail.contains("model.signals") && last.detail.contains("nothing_here"),
            "{}",
            last.detail
        );
        assert_eq!(s.next_training_ms, Some(2 * 86_400_000));
        // Data present, but the worker binary missing: the failure names it.
        let dir = tempfile::tempdir().unwrap();
        let (mut t, store) = trainer(dir.path(), &["a"], "/nonexistent/omen-worker");
        assert!(t.tick(86_400_000, &store).is_none());
        let last = t.status(86_400_000).last_training.unwrap();
        assert!(
            last.detail.contains("/nonexistent/omen-worker") && last.detail.contains("worker.path"),
            "{}",
            last.detail
        );
        assert!(dir.path().join("models").join(TRAINING_DATA).is_file());
        // Nothing is retried before model.retrain_every.
        assert!(t.tick(86_400_000 + 3_600_000, &store).is_none());
        assert_eq!(t.status(0).last_training.unwrap().started_ms, 86_400_000);
    }

    #[test]
    fn a_candidate_is_refused_on_too_many_alarms_or_no_held_back_window() {
        assert_eq!(judge(&report(200, 4), 0.02).unwrap().alarm_rate, 0.02);
        let e = judge(&report(200, 5), 0.02).unwrap_err();
        assert!(e.contains("5 of 200") && e.contains("model.max_alarm_rate"), "{e}");
        let e = judge(&report(0, 0), 0.02).unwrap_err();
        assert!(e.contains("model.holdout"), "{e}");
    }
}
